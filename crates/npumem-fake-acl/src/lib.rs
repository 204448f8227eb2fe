//! A stand-in `libascendcl.so`: AscendCL's device, VMM, copy, memset, memory-information,
//! host-memory, stream and event calls with their C signatures (`acl_rt.h`, CANN 8), their
//! argument rules and their `aclError` codes, over the host memory of `npumem-fake`. npumem's
//! tests load it in place of the real runtime (`NPUMEM_ACL_LIB`).
//!
//! Rules enforced (from the AscendCL API reference, "Virtual memory management" and "Memory
//! copy and set"):
//! - `aclInit` first (a repeat returns `ACL_ERROR_REPEAT_INITIALIZE` 100002); every device call
//!   needs a device made current on the calling thread by `aclrtSetDevice`
//!   (`ACL_ERROR_RT_CONTEXT_NULL` 107002); device ids past the count are 107001; each device has
//!   one (default) context, which `aclrtGetCurrentContext` / `aclrtSetCurrentContext` read and
//!   make current with its device;
//! - `aclrtReserveMemAddress`: size > 0 and a multiple of the normal granularity, `alignment` 0,
//!   `flags` 0 or 1, `expectPtr` NULL or a free, aligned address in the 16–24 TiB window
//!   (`ACL_ERROR_INVALID_PARAM` 100000 otherwise); reservations land in that window, aligned to
//!   the size's power of two (at least the granularity, at most 1 GiB);
//! - `aclrtMallocPhysical`: `flags` 0, `handleType` NONE, `allocationType` PINNED, a location of
//!   type HOST or DEVICE, a supported `memAttr` (HBM/MEM normal, huge and huge-1G kinds; DDR kinds
//!   only for HOST), size a non-zero multiple of the granularity (100000); 207001 when the
//!   configured capacity runs out; `ACL_HBM_MEM_NORMAL` is allocated as huge pages; as a release
//!   before CANN 8.5 (`NPUMEM_FAKE_CANN`), it and `aclrtMemGetAllocationGranularity` take only
//!   `ACL_HBM_MEM_HUGE`, `ACL_HBM_MEM_NORMAL` and `ACL_HBM_MEM_HUGE1G` (100000 otherwise);
//! - `aclrtMapMem`: size equal to the physical size, `offset` 0, `flags` 0 (100000); inside one
//!   reservation, over nothing mapped (107000); an unknown or freed handle 107017; a VA not
//!   aligned to the granularity 107008;
//! - `aclrtFreePhysical` of a mapped handle fails (107000: unmapping first is its precondition);
//!   `aclrtReleaseMemAddress` with live mappings fails (107000);
//! - `aclrtMemcpy(Async)`: `count` 0 (and, synchronous, `destMax` 0) is 107000; NULL pointers
//!   and kinds outside 0–5 are 100000;
//!   `count > destMax` is 107000; device bytes must be mapped (107000); `aclrtMemset(Async)`
//!   likewise with `maxCount`;
//! - streams and events as `npumem-fake`'s `streams` module runs them (NULL is the default
//!   stream; a stream, or an event's record, of another device than the current one is 107003
//!   `ACL_ERROR_RT_STREAM_CONTEXT`; an event never recorded is `ACL_EVENT_RECORDED_STATUS_NOT_READY`, as an event
//!   `aclrtCreateEvent` makes starts in its initial state); a queued operation that fails is
//!   reported by the next synchronize (507899).
//!
//! Test-only exports (`npumem_fake::export_test_hooks`): `npumem_fake_fail_next(kind, n)` (the
//! fault switch: a physical allocation
//! fails with 207001, a stream or event creation with 207008 / 207007, anything else with
//! 507899), `npumem_fake_live_counts(out)` and `npumem_fake_set_delay_us(us)`.
//!
//! Invariant: no call unwinds into C or dereferences a handle; every failure is a code.

// The exports are the runtime's C API: callers pass pointers under its documented contract (each
// dereference says so in its SAFETY line), as C callers of the real library do.
#![allow(clippy::not_unsafe_ptr_arg_deref)]

use std::ffi::{c_char, c_void};
use std::sync::LazyLock;
use std::sync::atomic::{AtomicBool, Ordering};

use npumem_fake::{Fail, FaultKind, Flavor, Placement, Runtime, guard, put};
use npumem_ffi::acl::*;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

static RT: LazyLock<Runtime> = LazyLock::new(|| Runtime::new(Flavor::Acl));
static INITIALIZED: AtomicBool = AtomicBool::new(false);

fn code(fail: Fail) -> aclError {
    match fail {
        Fail::InvalidValue => ACL_ERROR_INVALID_PARAM,
        Fail::RtParam | Fail::NotReserved | Fail::AlreadyMapped | Fail::NotMapped | Fail::NoAccess | Fail::InUse => {
            ACL_ERROR_RT_PARAM_INVALID
        }
        Fail::OutOfMemory | Fail::Injected(FaultKind::Physical | FaultKind::Host) => ACL_ERROR_RT_MEMORY_ALLOCATION,
        Fail::InvalidHandle => ACL_ERROR_RT_INVALID_HANDLE,
        Fail::Unaligned => ACL_ERROR_RT_ADDR_UNALIGNED,
        Fail::NoContext => ACL_ERROR_RT_CONTEXT_NULL,
        Fail::WrongDevice => ACL_ERROR_RT_STREAM_CONTEXT,
        Fail::NotInitialized => ACL_ERROR_UNINITIALIZE,
        Fail::InvalidDevice => ACL_ERROR_RT_INVALID_DEVICEID,
        Fail::Injected(FaultKind::Stream) => ACL_ERROR_RT_NO_STREAM_RESOURCE,
        Fail::Injected(FaultKind::Event) => ACL_ERROR_RT_NO_EVENT_RESOURCE,
        Fail::Async | Fail::Injected(_) | Fail::Internal => ACL_ERROR_RT_DRV_INTERNAL_ERROR,
    }
}

/// Runs an exported call that needs a current device.
fn call(body: impl FnOnce(&'static Runtime) -> Result<(), Fail>) -> aclError {
    guard(ACL_ERROR_RT_DRV_INTERNAL_ERROR, || {
        let rt: &'static Runtime = &RT;
        match rt.current().and_then(|_| body(rt)) {
            Ok(()) => ACL_SUCCESS,
            Err(f) => code(f),
        }
    })
}

fn require(ok: bool) -> Result<(), Fail> {
    if ok { Ok(()) } else { Err(Fail::InvalidValue) }
}

/// Whether the imitated release knows `attr` for physical memory: before CANN 8.5
/// (v8.5.0-beta.1's `memory.cpp`) only `ACL_HBM_MEM_HUGE`, `ACL_HBM_MEM_NORMAL` and
/// `ACL_HBM_MEM_HUGE1G`, any other value `ACL_ERROR_INVALID_PARAM`.
fn known_attr(attr: aclrtMemAttr) -> bool {
    RT.config.cann >= (8, 5) || matches!(attr, ACL_HBM_MEM_HUGE | ACL_HBM_MEM_NORMAL | ACL_HBM_MEM_HUGE1G)
}

/// The granularity of physical memory with `prop`'s attribute and location.
fn granularity(prop: &aclrtPhysicalMemProp) -> Result<u64, Fail> {
    require(known_attr(prop.memAttr))?;
    let normal = RT.config.granularity;
    // (granule, host-only DDR kind)
    let (granule, ddr) = match prop.memAttr {
        ACL_MEM_NORMAL | ACL_MEM_P2P_NORMAL => (normal, false),
        // ACL_HBM_MEM_NORMAL is allocated as huge pages.
        ACL_MEM_HUGE | ACL_MEM_P2P_HUGE | ACL_HBM_MEM_HUGE | ACL_HBM_MEM_NORMAL => (2 * MIB, false),
        ACL_MEM_HUGE1G | ACL_MEM_P2P_HUGE1G | ACL_HBM_MEM_HUGE1G => (GIB, false),
        ACL_DDR_MEM_NORMAL | ACL_DDR_MEM_P2P_NORMAL => (normal, true),
        ACL_DDR_MEM_HUGE | ACL_DDR_MEM_P2P_HUGE => (2 * MIB, true),
        _ => return Err(Fail::InvalidValue), // whole-memory and HBM P2P kinds are not physical types
    };
    match prop.location.type_ {
        ACL_MEM_LOCATION_TYPE_DEVICE if ddr => Err(Fail::InvalidValue),
        ACL_MEM_LOCATION_TYPE_DEVICE if prop.location.id >= RT.config.devices => Err(Fail::InvalidDevice),
        ACL_MEM_LOCATION_TYPE_DEVICE | ACL_MEM_LOCATION_TYPE_HOST => Ok(granule),
        _ => Err(Fail::InvalidValue), // UNREGISTERED, MANAGED, HOST_NUMA
    }
}

fn prop_ref<'a>(prop: *const aclrtPhysicalMemProp) -> Result<&'a aclrtPhysicalMemProp, Fail> {
    // SAFETY: the caller passes NULL or a valid `aclrtPhysicalMemProp`.
    unsafe { prop.as_ref() }.ok_or(Fail::InvalidValue)
}

#[unsafe(no_mangle)]
pub extern "C" fn aclInit(_config_path: *const c_char) -> aclError {
    guard(ACL_ERROR_RT_DRV_INTERNAL_ERROR, || {
        LazyLock::force(&RT);
        if INITIALIZED.swap(true, Ordering::SeqCst) { ACL_ERROR_REPEAT_INITIALIZE } else { ACL_SUCCESS }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn aclFinalize() -> aclError {
    INITIALIZED.store(false, Ordering::SeqCst);
    ACL_SUCCESS
}

#[unsafe(no_mangle)]
pub extern "C" fn aclrtSetDevice(device_id: i32) -> aclError {
    guard(ACL_ERROR_RT_DRV_INTERNAL_ERROR, || {
        if !INITIALIZED.load(Ordering::SeqCst) {
            return ACL_ERROR_UNINITIALIZE;
        }
        RT.set_current(device_id).map_or_else(code, |()| ACL_SUCCESS)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn aclrtResetDevice(device_id: i32) -> aclError {
    guard(ACL_ERROR_RT_DRV_INTERNAL_ERROR, || {
        if device_id < 0 || device_id as u32 >= RT.config.devices {
            return ACL_ERROR_RT_INVALID_DEVICEID;
        }
        if RT.current() == Ok(device_id) {
            RT.clear_current();
        }
        ACL_SUCCESS
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn aclrtGetDevice(device_id: *mut i32) -> aclError {
    // SAFETY: the caller passes NULL or a valid out-pointer.
    call(|rt| unsafe { put(device_id, rt.current()?) })
}

/// The default context of each device: this base plus the device id.
const CONTEXT_BASE: usize = 0xAC00_0000;

/// The default context of the current device.
#[unsafe(no_mangle)]
pub extern "C" fn aclrtGetCurrentContext(context: *mut *mut c_void) -> aclError {
    // SAFETY: the caller passes NULL or a valid out-pointer.
    call(|rt| unsafe { put(context, std::ptr::without_provenance_mut(CONTEXT_BASE + rt.current()? as usize)) })
}

/// Makes a device's default context (and so the device) current on the calling thread.
#[unsafe(no_mangle)]
pub extern "C" fn aclrtSetCurrentContext(context: *mut c_void) -> aclError {
    guard(ACL_ERROR_RT_DRV_INTERNAL_ERROR, || {
        if !INITIALIZED.load(Ordering::SeqCst) {
            return ACL_ERROR_UNINITIALIZE;
        }
        let device = context.addr().checked_sub(CONTEXT_BASE).and_then(|d| i32::try_from(d).ok());
        match device {
            Some(d) if (d as u32) < RT.config.devices => RT.set_current(d).map_or_else(code, |()| ACL_SUCCESS),
            _ => ACL_ERROR_INVALID_PARAM,
        }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn aclrtGetDeviceCount(count: *mut u32) -> aclError {
    // SAFETY: as above.
    guard(ACL_ERROR_RT_DRV_INTERNAL_ERROR, || unsafe { put(count, RT.config.devices) }.map_or_else(code, |()| 0))
}

#[unsafe(no_mangle)]
pub extern "C" fn aclrtSynchronizeDevice() -> aclError {
    call(|rt| rt.streams.synchronize_all())
}

/// The alignment of a reservation of `size` bytes: its power of two, from the granularity to 1 GiB.
fn reservation_align(size: u64) -> u64 {
    size.checked_next_power_of_two().unwrap_or(GIB).clamp(RT.config.granularity, GIB)
}

#[unsafe(no_mangle)]
pub extern "C" fn aclrtReserveMemAddress(
    vir_ptr: *mut *mut c_void,
    size: usize,
    alignment: usize,
    expect_ptr: *mut c_void,
    flags: u64,
) -> aclError {
    call(|rt| {
        let size = size as u64;
        require(!vir_ptr.is_null() && size > 0 && size % rt.config.granularity == 0)?;
        require(alignment == 0 && flags <= 1)?;
        rt.fault(FaultKind::Reserve)?;
        let placement = match expect_ptr.addr() as u64 {
            0 => Placement::Anywhere,
            at => Placement::Exactly(at),
        };
        let va = rt.memory.lock().reserve(size, reservation_align(size), placement)?;
        // SAFETY: checked non-null; the caller's out-pointer.
        unsafe { put(vir_ptr, va as *mut c_void) }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn aclrtReleaseMemAddress(vir_ptr: *mut c_void) -> aclError {
    call(|rt| {
        require(!vir_ptr.is_null())?;
        rt.fault(FaultKind::Release)?;
        rt.memory.lock().release(vir_ptr.addr() as u64, None)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn aclrtMallocPhysical(
    handle: *mut *mut c_void,
    size: usize,
    prop: *const aclrtPhysicalMemProp,
    flags: u64,
) -> aclError {
    call(|rt| {
        let prop = prop_ref(prop)?;
        require(!handle.is_null() && flags == 0 && prop.handleType == ACL_MEM_HANDLE_TYPE_NONE)?;
        require(prop.allocationType == ACL_MEM_ALLOCATION_TYPE_PINNED)?;
        let granule = granularity(prop)?;
        require(size > 0 && size as u64 % granule == 0)?;
        rt.fault(FaultKind::Physical)?;
        let h = rt.memory.lock().create(size as u64, granule)?;
        // SAFETY: checked non-null.
        unsafe { put(handle, h as *mut c_void) }
    })
}

/// A mapped handle is refused: the documentation makes `aclrtUnmapMem` first a precondition.
#[unsafe(no_mangle)]
pub extern "C" fn aclrtFreePhysical(handle: *mut c_void) -> aclError {
    call(|rt| {
        require(!handle.is_null())?;
        rt.fault(FaultKind::FreePhysical)?;
        let mut m = rt.memory.lock();
        if m.physical(handle.addr() as u64)?.mapped() > 0 {
            return Err(Fail::InUse);
        }
        m.free(handle.addr() as u64)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn aclrtMapMem(
    vir_ptr: *mut c_void,
    size: usize,
    offset: usize,
    handle: *mut c_void,
    flags: u64,
) -> aclError {
    call(|rt| {
        require(!vir_ptr.is_null() && !handle.is_null() && offset == 0 && flags == 0)?;
        let mut m = rt.memory.lock();
        let physical_size = m.physical(handle.addr() as u64)?.size;
        require(size as u64 == physical_size)?;
        rt.fault(FaultKind::Map)?;
        m.map(vir_ptr.addr() as u64, physical_size, handle.addr() as u64, true)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn aclrtUnmapMem(vir_ptr: *mut c_void) -> aclError {
    call(|rt| {
        require(!vir_ptr.is_null())?;
        rt.fault(FaultKind::Unmap)?;
        rt.memory.lock().unmap(vir_ptr.addr() as u64, None)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn aclrtMemGetAllocationGranularity(
    prop: *mut aclrtPhysicalMemProp,
    option: aclrtMemGranularityOptions,
    granularity_out: *mut usize,
) -> aclError {
    call(|_| {
        let prop = prop_ref(prop)?;
        require(option <= ACL_RT_MEM_ALLOC_GRANULARITY_RECOMMENDED)?;
        // SAFETY: the caller's out-pointer (NULL is refused).
        unsafe { put(granularity_out, granularity(prop)? as usize) }
    })
}

/// A copy of nothing is refused as the runtime's checks refuse it (`RT_ERROR_INVALID_VALUE`,
/// 107000).
fn refuse_empty(ok: bool) -> Result<(), Fail> {
    if ok { Ok(()) } else { Err(Fail::RtParam) }
}

fn check_copy(
    dst: *mut c_void,
    src: *const c_void,
    kind: aclrtMemcpyKind,
    count: usize,
    dest_max: usize,
) -> Result<(), Fail> {
    require(!dst.is_null() && !src.is_null() && kind <= ACL_MEMCPY_HOST_TO_BUF_TO_DEVICE)?;
    if count > dest_max { Err(Fail::RtParam) } else { Ok(()) }
}

#[unsafe(no_mangle)]
pub extern "C" fn aclrtMemcpy(
    dst: *mut c_void,
    dest_max: usize,
    src: *const c_void,
    count: usize,
    kind: aclrtMemcpyKind,
) -> aclError {
    call(|rt| {
        refuse_empty(count > 0 && dest_max > 0)?;
        check_copy(dst, src, kind, count, dest_max)?;
        // The kind is advisory: the runtime decides the direction from the addresses.
        rt.copy(dst.addr() as u64, src.addr() as u64, count as u64, None)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn aclrtMemcpyAsync(
    dst: *mut c_void,
    dest_max: usize,
    src: *const c_void,
    count: usize,
    kind: aclrtMemcpyKind,
    stream: *mut c_void,
) -> aclError {
    call(|rt| {
        refuse_empty(count > 0)?;
        check_copy(dst, src, kind, count, dest_max)?;
        rt.copy_async(dst.addr() as u64, src.addr() as u64, count as u64, None, stream.addr() as u64)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn aclrtMemset(dev_ptr: *mut c_void, max_count: usize, value: i32, count: usize) -> aclError {
    call(|rt| {
        if count == 0 {
            return Ok(());
        }
        require(!dev_ptr.is_null())?;
        if count > max_count {
            return Err(Fail::RtParam);
        }
        rt.fill(dev_ptr.addr() as u64, value as u8, count as u64, false)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn aclrtMemsetAsync(
    dev_ptr: *mut c_void,
    max_count: usize,
    value: i32,
    count: usize,
    stream: *mut c_void,
) -> aclError {
    call(|rt| {
        if count == 0 {
            return Ok(());
        }
        require(!dev_ptr.is_null())?;
        if count > max_count {
            return Err(Fail::RtParam);
        }
        rt.fill_async(dev_ptr.addr() as u64, value as u8, count as u64, false, stream.addr() as u64)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn aclrtGetMemInfo(attr: aclrtMemAttr, free: *mut usize, total: *mut usize) -> aclError {
    call(|rt| {
        require(npumem_ffi::name_of(MEM_ATTRS, attr).is_some() && !free.is_null() && !total.is_null())?;
        rt.fault(FaultKind::MemInfo)?;
        // An HBM device has no DDR: those attributes report nothing.
        let ddr = matches!(
            attr,
            ACL_DDR_MEM | ACL_DDR_MEM_HUGE | ACL_DDR_MEM_NORMAL | ACL_DDR_MEM_P2P_HUGE | ACL_DDR_MEM_P2P_NORMAL
        );
        let (f, t) = if ddr { (0, 0) } else { rt.memory.lock().mem_info() };
        // SAFETY: both checked non-null.
        unsafe { put(free, f as usize).and_then(|()| put(total, t as usize)) }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn aclrtMallocHost(host_ptr: *mut *mut c_void, size: usize) -> aclError {
    call(|rt| {
        require(!host_ptr.is_null() && size > 0)?;
        rt.fault(FaultKind::Host)?;
        let p = rt.memory.lock().malloc_host(size as u64)?;
        // SAFETY: checked non-null.
        unsafe { put(host_ptr, p as *mut c_void) }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn aclrtFreeHost(host_ptr: *mut c_void) -> aclError {
    call(|rt| {
        require(!host_ptr.is_null())?;
        rt.memory.lock().free_host(host_ptr.addr() as u64).map_err(|_| Fail::RtParam)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn aclrtCreateStream(stream: *mut *mut c_void) -> aclError {
    call(|rt| {
        require(!stream.is_null())?;
        rt.fault(FaultKind::Stream)?;
        let key = rt.streams.create_stream()?;
        // SAFETY: checked non-null.
        unsafe { put(stream, key as *mut c_void) }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn aclrtDestroyStream(stream: *mut c_void) -> aclError {
    call(|rt| {
        require(!stream.is_null())?;
        rt.streams.destroy_stream(stream.addr() as u64)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn aclrtSynchronizeStream(stream: *mut c_void) -> aclError {
    call(|rt| rt.streams.synchronize(stream.addr() as u64))
}

#[unsafe(no_mangle)]
pub extern "C" fn aclrtCreateEvent(event: *mut *mut c_void) -> aclError {
    call(|rt| {
        require(!event.is_null())?;
        rt.fault(FaultKind::Event)?;
        let key = rt.streams.create_event();
        // SAFETY: checked non-null.
        unsafe { put(event, key as *mut c_void) }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn aclrtDestroyEvent(event: *mut c_void) -> aclError {
    call(|rt| {
        require(!event.is_null())?;
        rt.streams.destroy_event(event.addr() as u64)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn aclrtRecordEvent(event: *mut c_void, stream: *mut c_void) -> aclError {
    call(|rt| {
        require(!event.is_null())?;
        rt.streams.record(event.addr() as u64, stream.addr() as u64)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn aclrtQueryEventStatus(event: *mut c_void, status: *mut aclrtEventRecordedStatus) -> aclError {
    call(|rt| {
        require(!event.is_null())?;
        let done = rt.streams.query(event.addr() as u64)?;
        let value = if done { ACL_EVENT_RECORDED_STATUS_COMPLETE } else { ACL_EVENT_RECORDED_STATUS_NOT_READY };
        // SAFETY: the caller's out-pointer (NULL is refused).
        unsafe { put(status, value) }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn aclrtSynchronizeEvent(event: *mut c_void) -> aclError {
    call(|rt| {
        require(!event.is_null())?;
        rt.streams.synchronize_event(event.addr() as u64)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn aclrtStreamWaitEvent(stream: *mut c_void, event: *mut c_void) -> aclError {
    call(|rt| {
        require(!event.is_null())?;
        rt.streams.wait_event(stream.addr() as u64, event.addr() as u64)
    })
}

npumem_fake::export_test_hooks!(RT);

// Every export has the C signature `npumem-ffi` declares for it (the one the backend loads).
const _: PFN_aclInit = aclInit;
const _: PFN_aclFinalize = aclFinalize;
const _: PFN_aclrtSetDevice = aclrtSetDevice;
const _: PFN_aclrtResetDevice = aclrtResetDevice;
const _: PFN_aclrtGetDevice = aclrtGetDevice;
const _: PFN_aclrtGetDeviceCount = aclrtGetDeviceCount;
const _: PFN_aclrtGetCurrentContext = aclrtGetCurrentContext;
const _: PFN_aclrtSetCurrentContext = aclrtSetCurrentContext;
const _: PFN_aclrtSynchronizeDevice = aclrtSynchronizeDevice;
const _: PFN_aclrtReserveMemAddress = aclrtReserveMemAddress;
const _: PFN_aclrtReleaseMemAddress = aclrtReleaseMemAddress;
const _: PFN_aclrtMallocPhysical = aclrtMallocPhysical;
const _: PFN_aclrtFreePhysical = aclrtFreePhysical;
const _: PFN_aclrtMapMem = aclrtMapMem;
const _: PFN_aclrtUnmapMem = aclrtUnmapMem;
const _: PFN_aclrtMemGetAllocationGranularity = aclrtMemGetAllocationGranularity;
const _: PFN_aclrtMemcpy = aclrtMemcpy;
const _: PFN_aclrtMemcpyAsync = aclrtMemcpyAsync;
const _: PFN_aclrtMemset = aclrtMemset;
const _: PFN_aclrtMemsetAsync = aclrtMemsetAsync;
const _: PFN_aclrtGetMemInfo = aclrtGetMemInfo;
const _: PFN_aclrtMallocHost = aclrtMallocHost;
const _: PFN_aclrtFreeHost = aclrtFreeHost;
const _: PFN_aclrtCreateStream = aclrtCreateStream;
const _: PFN_aclrtDestroyStream = aclrtDestroyStream;
const _: PFN_aclrtSynchronizeStream = aclrtSynchronizeStream;
const _: PFN_aclrtCreateEvent = aclrtCreateEvent;
const _: PFN_aclrtDestroyEvent = aclrtDestroyEvent;
const _: PFN_aclrtRecordEvent = aclrtRecordEvent;
const _: PFN_aclrtQueryEventStatus = aclrtQueryEventStatus;
const _: PFN_aclrtSynchronizeEvent = aclrtSynchronizeEvent;
const _: PFN_aclrtStreamWaitEvent = aclrtStreamWaitEvent;
