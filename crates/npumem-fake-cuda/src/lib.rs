//! A stand-in `libcuda.so`: the CUDA driver API's initialisation, primary-context, virtual
//! memory management, copy, memset, memory-information, stream and event calls with their C
//! signatures (`cuda.h`, CUDA 12; the `_v2` symbol names the header maps the calls to) and
//! their `CUresult` codes, over the host memory of `npumem-fake`. npumem's tests load it in
//! place of the real driver (`NPUMEM_CUDA_LIB`).
//!
//! Rules enforced (from the CUDA Driver API reference, "Virtual Memory Management"):
//! - `cuInit(0)` first (`CUDA_ERROR_NOT_INITIALIZED` otherwise); memory, stream and event calls
//!   need a current context (`cuDevicePrimaryCtxRetain` + `cuCtxSetCurrent`, per thread;
//!   `CUDA_ERROR_INVALID_CONTEXT`);
//! - one allocation granularity (`NPUMEM_FAKE_GRANULARITY`, 2 MiB by default, as on current
//!   GPUs): `cuMemAddressReserve` and `cuMemCreate` sizes must be multiples of it, alignments
//!   powers of two (0: the granularity), `flags` 0; `addr` is a hint;
//! - `cuMemCreate`: a `CUmemAllocationProp` of type PINNED at a DEVICE location with a valid
//!   ordinal (`CUDA_ERROR_INVALID_DEVICE`), no or POSIX-fd handle types;
//!   `CUDA_ERROR_OUT_OF_MEMORY` when the configured capacity runs out;
//! - `cuMemMap`: `offset` 0, `flags` 0, a size that is a multiple of the granularity and at most
//!   the allocation's, inside one reservation and over nothing mapped; the mapping is not
//!   accessible until `cuMemSetAccess` (`CUDA_ERROR_ILLEGAL_ADDRESS` for copies before it), and
//!   then only to the devices it names: a synchronous copy made in another device's context
//!   is `CUDA_ERROR_ILLEGAL_ADDRESS` (as a peer's kernels would fault); `cuDeviceCanAccessPeer`
//!   says yes for every pair of distinct devices;
//! - `cuMemUnmap` takes ranges made of whole mappings; `cuMemRelease` of a mapped handle defers
//!   the release to the last unmap; `cuMemAddressFree` with mappings in the range fails;
//! - copies check their direction (`cuMemcpyHtoD` needs a device destination and a host source,
//!   and so on) and that every device byte is mapped and accessible (`CUDA_ERROR_INVALID_VALUE`);
//!   `cuMemsetD8` and `cuMemcpyDtoD` are queued on the legacy default stream and return before
//!   they run (streams made `CU_STREAM_NON_BLOCKING` do not wait for them); `cuMemcpyHtoD` /
//!   `DtoH` wait for the legacy stream, then copy;
//! - streams and events as `npumem-fake`'s `streams` module runs them (`cuEventQuery` returns
//!   `CUDA_ERROR_NOT_READY` until the record completes, `CUDA_SUCCESS` for an event never
//!   recorded; NULL and `CU_STREAM_LEGACY` are the legacy default stream, `CU_STREAM_PER_THREAD`
//!   each thread's own default stream; a stream, or an event's record, of another context than
//!   the current one is `CUDA_ERROR_INVALID_CONTEXT`); a queued operation that fails is reported by the next
//!   synchronize (`CUDA_ERROR_ILLEGAL_ADDRESS`).
//!
//! Test-only exports as in the AscendCL stand-in (`npumem_fake_fail_next`: a physical
//! allocation fails with `CUDA_ERROR_OUT_OF_MEMORY`, anything else with `CUDA_ERROR_UNKNOWN`;
//! `npumem_fake_live_counts`; `npumem_fake_set_delay_us`).
//!
//! Invariant: no call unwinds into C or dereferences a handle; every failure is a code.

// The exports are the runtime's C API: callers pass pointers under its documented contract (each
// dereference says so in its SAFETY line), as C callers of the real library do.
#![allow(clippy::not_unsafe_ptr_arg_deref)]

use std::ffi::{CStr, c_char, c_int, c_uint, c_void};
use std::sync::LazyLock;
use std::sync::atomic::{AtomicBool, Ordering};

use npumem_fake::{Fail, FaultKind, Flavor, Placement, Runtime, guard, put};
use npumem_ffi::cuda::*;

/// The descriptions `cuGetErrorString` gives (and the codes `cuGetErrorName` names).
const DESCRIPTIONS: &[(CUresult, &CStr)] = &[
    (CUDA_SUCCESS, c"no error"),
    (CUDA_ERROR_INVALID_VALUE, c"invalid argument"),
    (CUDA_ERROR_OUT_OF_MEMORY, c"out of memory"),
    (CUDA_ERROR_NOT_INITIALIZED, c"initialization error"),
    (CUDA_ERROR_INVALID_DEVICE, c"invalid device ordinal"),
    (CUDA_ERROR_INVALID_CONTEXT, c"invalid device context"),
    (CUDA_ERROR_INVALID_HANDLE, c"invalid resource handle"),
    (CUDA_ERROR_NOT_READY, c"device not ready"),
    (CUDA_ERROR_ILLEGAL_ADDRESS, c"an illegal memory access was encountered"),
    (CUDA_ERROR_UNKNOWN, c"unknown error"),
];

static RT: LazyLock<Runtime> = LazyLock::new(|| Runtime::new(Flavor::Cuda));
static INITIALIZED: AtomicBool = AtomicBool::new(false);

/// Primary contexts are these values plus the device ordinal.
const CONTEXT_BASE: usize = 0xC000_0000;

fn code(fail: Fail) -> CUresult {
    match fail {
        Fail::InvalidValue
        | Fail::RtParam
        | Fail::Unaligned
        | Fail::NotReserved
        | Fail::AlreadyMapped
        | Fail::NotMapped
        | Fail::InUse => CUDA_ERROR_INVALID_VALUE,
        Fail::OutOfMemory | Fail::Injected(FaultKind::Physical | FaultKind::Host) => CUDA_ERROR_OUT_OF_MEMORY,
        Fail::InvalidHandle => CUDA_ERROR_INVALID_HANDLE,
        Fail::NoAccess | Fail::Async => CUDA_ERROR_ILLEGAL_ADDRESS,
        Fail::NoContext | Fail::WrongDevice => CUDA_ERROR_INVALID_CONTEXT,
        Fail::NotInitialized => CUDA_ERROR_NOT_INITIALIZED,
        Fail::InvalidDevice => CUDA_ERROR_INVALID_DEVICE,
        Fail::Injected(_) | Fail::Internal => CUDA_ERROR_UNKNOWN,
    }
}

fn initialized() -> Result<(), Fail> {
    if INITIALIZED.load(Ordering::SeqCst) { Ok(()) } else { Err(Fail::NotInitialized) }
}

/// Runs an exported call that needs the driver initialised (and, with `context`, a current
/// context).
fn run(context: bool, body: impl FnOnce(&'static Runtime) -> Result<(), Fail>) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        let rt: &'static Runtime = &RT;
        let ready = initialized().and_then(|()| if context { rt.current().map(|_| ()) } else { Ok(()) });
        match ready.and_then(|()| body(rt)) {
            Ok(()) => CUDA_SUCCESS,
            Err(f) => code(f),
        }
    })
}

fn call(body: impl FnOnce(&'static Runtime) -> Result<(), Fail>) -> CUresult {
    run(true, body)
}

fn require(ok: bool) -> Result<(), Fail> {
    if ok { Ok(()) } else { Err(Fail::InvalidValue) }
}

/// A memory-handle error as the VMM calls report it (`CUDA_ERROR_INVALID_VALUE`).
fn handle_value(fail: Fail) -> Fail {
    if fail == Fail::InvalidHandle { Fail::InvalidValue } else { fail }
}

/// The stream key of a `CUstream`: NULL and `CU_STREAM_LEGACY` are the legacy default stream,
/// `CU_STREAM_PER_THREAD` the calling thread's own default stream, another one of its own.
fn stream_key(stream: *mut c_void) -> u64 {
    match stream.addr() {
        0 | CU_STREAM_LEGACY => LEGACY,
        CU_STREAM_PER_THREAD => npumem_fake::streams::per_thread_key(),
        key => key as u64,
    }
}

/// The legacy default stream's key: the synchronous memset and device-to-device copy run on it
/// (returning before they complete), and the synchronous host copies wait for it first.
const LEGACY: u64 = 0;

fn check_location(location: &CUmemLocation) -> Result<(), Fail> {
    require(location.type_ == CU_MEM_LOCATION_TYPE_DEVICE)?;
    if location.id < 0 || location.id as u32 >= RT.config.devices { Err(Fail::InvalidDevice) } else { Ok(()) }
}

fn granule() -> u64 {
    RT.config.granularity
}

#[unsafe(no_mangle)]
pub extern "C" fn cuInit(flags: c_uint) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        if flags != 0 {
            return CUDA_ERROR_INVALID_VALUE;
        }
        LazyLock::force(&RT);
        INITIALIZED.store(true, Ordering::SeqCst);
        CUDA_SUCCESS
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuDriverGetVersion(version: *mut c_int) -> CUresult {
    // SAFETY: the caller passes NULL or a valid out-pointer.
    guard(CUDA_ERROR_UNKNOWN, || unsafe { put(version, 12040) }.map_or_else(code, |()| CUDA_SUCCESS))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuDeviceGetCount(count: *mut c_int) -> CUresult {
    // SAFETY: as above.
    run(false, |rt| unsafe { put(count, rt.config.devices as c_int) })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuDeviceGet(device: *mut c_int, ordinal: c_int) -> CUresult {
    run(false, |rt| {
        if ordinal < 0 || ordinal as u32 >= rt.config.devices {
            return Err(Fail::InvalidDevice);
        }
        // SAFETY: as above.
        unsafe { put(device, ordinal) }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuDevicePrimaryCtxRetain(context: *mut *mut c_void, device: c_int) -> CUresult {
    run(false, |rt| {
        if device < 0 || device as u32 >= rt.config.devices {
            return Err(Fail::InvalidDevice);
        }
        // SAFETY: as above.
        unsafe { put(context, std::ptr::without_provenance_mut(CONTEXT_BASE + device as usize)) }
    })
}

/// Every pair of distinct devices can access each other's memory (as on an NVLink system).
#[unsafe(no_mangle)]
pub extern "C" fn cuDeviceCanAccessPeer(can: *mut c_int, device: c_int, peer: c_int) -> CUresult {
    run(false, |rt| {
        let valid = |d: c_int| d >= 0 && (d as u32) < rt.config.devices;
        if !valid(device) || !valid(peer) {
            return Err(Fail::InvalidDevice);
        }
        // SAFETY: the caller passes NULL or a valid out-pointer.
        unsafe { put(can, c_int::from(device != peer)) }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuDevicePrimaryCtxRelease_v2(device: c_int) -> CUresult {
    run(false, |rt| if device < 0 || device as u32 >= rt.config.devices { Err(Fail::InvalidDevice) } else { Ok(()) })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuCtxSetCurrent(context: *mut c_void) -> CUresult {
    run(false, |rt| match context.addr() {
        0 => {
            rt.clear_current();
            Ok(())
        }
        c if c >= CONTEXT_BASE => rt.set_current((c - CONTEXT_BASE) as i32).map_err(|_| Fail::NoContext),
        _ => Err(Fail::NoContext),
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuCtxGetCurrent(context: *mut *mut c_void) -> CUresult {
    run(false, |rt| {
        let current = rt.current().map_or(0, |d| CONTEXT_BASE + d as usize);
        // SAFETY: as above.
        unsafe { put(context, std::ptr::without_provenance_mut(current)) }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuCtxSynchronize() -> CUresult {
    call(|rt| rt.streams.synchronize_all())
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemGetAllocationGranularity(
    granularity: *mut usize,
    prop: *const CUmemAllocationProp,
    option: c_uint,
) -> CUresult {
    run(false, |_| {
        // SAFETY: the caller passes NULL or a valid property structure.
        let prop = unsafe { prop.as_ref() }.ok_or(Fail::InvalidValue)?;
        require(prop.type_ == CU_MEM_ALLOCATION_TYPE_PINNED && option <= CU_MEM_ALLOC_GRANULARITY_RECOMMENDED)?;
        check_location(&prop.location)?;
        // SAFETY: as above.
        unsafe { put(granularity, granule() as usize) }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemAddressReserve(
    ptr: *mut CUdeviceptr,
    size: usize,
    alignment: usize,
    addr: CUdeviceptr,
    flags: u64,
) -> CUresult {
    call(|rt| {
        let (size, g) = (size as u64, granule());
        let align = if alignment == 0 { g } else { alignment as u64 };
        require(!ptr.is_null() && flags == 0 && size > 0 && size % g == 0)?;
        require(align.is_power_of_two() && align % g == 0)?;
        rt.fault(FaultKind::Reserve)?;
        let placement = if addr == 0 { Placement::Anywhere } else { Placement::Prefer(addr) };
        let va = rt.memory.lock().reserve(size, align, placement)?;
        // SAFETY: checked non-null.
        unsafe { put(ptr, va) }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemAddressFree(ptr: CUdeviceptr, size: usize) -> CUresult {
    call(|rt| {
        rt.fault(FaultKind::Release)?;
        rt.memory.lock().release(ptr, Some(size as u64))
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemCreate(handle: *mut u64, size: usize, prop: *const CUmemAllocationProp, flags: u64) -> CUresult {
    call(|rt| {
        // SAFETY: the caller passes NULL or a valid property structure.
        let prop = unsafe { prop.as_ref() }.ok_or(Fail::InvalidValue)?;
        require(!handle.is_null() && flags == 0 && prop.type_ == CU_MEM_ALLOCATION_TYPE_PINNED)?;
        require(matches!(
            prop.requestedHandleTypes,
            CU_MEM_HANDLE_TYPE_NONE | CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
        ))?;
        check_location(&prop.location)?;
        require(size > 0 && size as u64 % granule() == 0)?;
        rt.fault(FaultKind::Physical)?;
        let h = rt.memory.lock().create(size as u64, granule())?;
        // SAFETY: checked non-null.
        unsafe { put(handle, h) }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemRelease(handle: u64) -> CUresult {
    call(|rt| {
        rt.fault(FaultKind::FreePhysical)?;
        rt.memory.lock().free(handle).map_err(handle_value)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemMap(ptr: CUdeviceptr, size: usize, offset: usize, handle: u64, flags: u64) -> CUresult {
    call(|rt| {
        require(ptr != 0 && offset == 0 && flags == 0)?;
        let mut m = rt.memory.lock();
        m.physical(handle).map_err(handle_value)?;
        rt.fault(FaultKind::Map)?;
        m.map(ptr, size as u64, handle, false)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemUnmap(ptr: CUdeviceptr, size: usize) -> CUresult {
    call(|rt| {
        rt.fault(FaultKind::Unmap)?;
        rt.memory.lock().unmap(ptr, Some(size as u64))
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemSetAccess(
    ptr: CUdeviceptr,
    size: usize,
    desc: *const CUmemAccessDesc,
    count: usize,
) -> CUresult {
    call(|rt| {
        require(!desc.is_null() && count > 0)?;
        // SAFETY: the caller passes `count` descriptors at `desc`.
        let descs = unsafe { std::slice::from_raw_parts(desc, count) };
        let mut devices = 0u64;
        for d in descs {
            check_location(&d.location)?;
            require(matches!(d.flags, CU_MEM_ACCESS_FLAGS_PROT_READ | CU_MEM_ACCESS_FLAGS_PROT_READWRITE))?;
            devices |= 1u64.checked_shl(d.location.id as u32).unwrap_or(0);
        }
        rt.memory.lock().set_access(ptr, size as u64, devices)
    })
}

/// A synchronous host copy: after the legacy stream's earlier work, complete when it returns.
fn host_copy(rt: &'static Runtime, dst: u64, src: u64, count: usize, want: (bool, bool)) -> Result<(), Fail> {
    if count == 0 {
        return Ok(());
    }
    rt.streams.synchronize(LEGACY)?;
    let device = rt.current()?;
    {
        let m = rt.memory.lock();
        m.check_granted(dst, count as u64, device)?;
        m.check_granted(src, count as u64, device)?;
    }
    rt.copy(dst, src, count as u64, Some(want))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemcpyHtoD_v2(dst: CUdeviceptr, src: *const c_void, count: usize) -> CUresult {
    call(|rt| host_copy(rt, dst, src.addr() as u64, count, (true, false)))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemcpyDtoH_v2(dst: *mut c_void, src: CUdeviceptr, count: usize) -> CUresult {
    call(|rt| host_copy(rt, dst.addr() as u64, src, count, (false, true)))
}

/// Queued on the legacy stream: a device-to-device copy does no host synchronisation.
#[unsafe(no_mangle)]
pub extern "C" fn cuMemcpyDtoD_v2(dst: CUdeviceptr, src: CUdeviceptr, count: usize) -> CUresult {
    call(|rt| if count == 0 { Ok(()) } else { rt.copy_async(dst, src, count as u64, Some((true, true)), LEGACY) })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemcpyHtoDAsync_v2(
    dst: CUdeviceptr,
    src: *const c_void,
    count: usize,
    stream: *mut c_void,
) -> CUresult {
    call(|rt| {
        if count == 0 {
            return Ok(());
        }
        rt.copy_async(dst, src.addr() as u64, count as u64, Some((true, false)), stream_key(stream))
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemcpyDtoHAsync_v2(
    dst: *mut c_void,
    src: CUdeviceptr,
    count: usize,
    stream: *mut c_void,
) -> CUresult {
    call(|rt| {
        if count == 0 {
            return Ok(());
        }
        rt.copy_async(dst.addr() as u64, src, count as u64, Some((false, true)), stream_key(stream))
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemcpyDtoDAsync_v2(
    dst: CUdeviceptr,
    src: CUdeviceptr,
    count: usize,
    stream: *mut c_void,
) -> CUresult {
    call(|rt| {
        if count == 0 {
            return Ok(());
        }
        rt.copy_async(dst, src, count as u64, Some((true, true)), stream_key(stream))
    })
}

/// `cuMemcpyAsync`: unified addressing, the direction from the addresses.
#[unsafe(no_mangle)]
pub extern "C" fn cuMemcpyAsync(dst: CUdeviceptr, src: CUdeviceptr, count: usize, stream: *mut c_void) -> CUresult {
    call(|rt| if count == 0 { Ok(()) } else { rt.copy_async(dst, src, count as u64, None, stream_key(stream)) })
}

/// Queued on the legacy stream: a memset of device memory is asynchronous with respect to the
/// host (`cuda.h`'s `\note_memset`).
#[unsafe(no_mangle)]
pub extern "C" fn cuMemsetD8_v2(dst: CUdeviceptr, value: u8, count: usize) -> CUresult {
    call(|rt| if count == 0 { Ok(()) } else { rt.fill_async(dst, value, count as u64, true, LEGACY) })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemsetD8Async(dst: CUdeviceptr, value: u8, count: usize, stream: *mut c_void) -> CUresult {
    call(|rt| if count == 0 { Ok(()) } else { rt.fill_async(dst, value, count as u64, true, stream_key(stream)) })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CUresult {
    call(|rt| {
        require(!free.is_null() && !total.is_null())?;
        rt.fault(FaultKind::MemInfo)?;
        let (f, t) = rt.memory.lock().mem_info();
        // SAFETY: both checked non-null.
        unsafe { put(free, f as usize).and_then(|()| put(total, t as usize)) }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, size: usize) -> CUresult {
    call(|rt| {
        require(!dptr.is_null() && size > 0)?;
        rt.fault(FaultKind::Physical)?;
        let p = rt.memory.lock().alloc_linear(size as u64, granule())?;
        // SAFETY: checked non-null.
        unsafe { put(dptr, p) }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemFree_v2(dptr: CUdeviceptr) -> CUresult {
    call(|rt| rt.memory.lock().free_linear(dptr))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemAllocHost_v2(pp: *mut *mut c_void, size: usize) -> CUresult {
    call(|rt| {
        require(!pp.is_null() && size > 0)?;
        rt.fault(FaultKind::Host)?;
        let p = rt.memory.lock().malloc_host(size as u64)?;
        // SAFETY: checked non-null.
        unsafe { put(pp, p as *mut c_void) }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemFreeHost(p: *mut c_void) -> CUresult {
    call(|rt| rt.memory.lock().free_host(p.addr() as u64))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuStreamCreate(stream: *mut *mut c_void, flags: c_uint) -> CUresult {
    call(|rt| {
        require(!stream.is_null() && matches!(flags, CU_STREAM_DEFAULT | CU_STREAM_NON_BLOCKING))?;
        rt.fault(FaultKind::Stream)?;
        let key = rt.streams.create_stream()?;
        // SAFETY: checked non-null.
        unsafe { put(stream, key as *mut c_void) }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuStreamDestroy_v2(stream: *mut c_void) -> CUresult {
    call(|rt| rt.streams.destroy_stream(stream.addr() as u64))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuStreamSynchronize(stream: *mut c_void) -> CUresult {
    call(|rt| rt.streams.synchronize(stream_key(stream)))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuStreamQuery(stream: *mut c_void) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        let status = call(|rt| if rt.streams.idle(stream_key(stream))? { Ok(()) } else { Err(Fail::Internal) });
        if status == CUDA_ERROR_UNKNOWN { CUDA_ERROR_NOT_READY } else { status }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuEventCreate(event: *mut *mut c_void, flags: c_uint) -> CUresult {
    call(|rt| {
        require(!event.is_null() && flags <= 0xF)?; // DEFAULT, BLOCKING_SYNC, DISABLE_TIMING, INTERPROCESS
        rt.fault(FaultKind::Event)?;
        let key = rt.streams.create_event();
        // SAFETY: checked non-null.
        unsafe { put(event, key as *mut c_void) }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuEventDestroy_v2(event: *mut c_void) -> CUresult {
    call(|rt| rt.streams.destroy_event(event.addr() as u64))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuEventRecord(event: *mut c_void, stream: *mut c_void) -> CUresult {
    call(|rt| rt.streams.record(event.addr() as u64, stream_key(stream)))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuEventQuery(event: *mut c_void) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        let mut done = false;
        let status = call(|rt| {
            done = rt.streams.query(event.addr() as u64)?;
            Ok(())
        });
        if status == CUDA_SUCCESS && !done { CUDA_ERROR_NOT_READY } else { status }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuEventSynchronize(event: *mut c_void) -> CUresult {
    call(|rt| rt.streams.synchronize_event(event.addr() as u64))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuStreamWaitEvent(stream: *mut c_void, event: *mut c_void, flags: c_uint) -> CUresult {
    call(|rt| {
        require(flags == 0)?;
        rt.streams.wait_event(stream_key(stream), event.addr() as u64)
    })
}

/// Puts `text` (a static string) at the caller's out-pointer; `None` is a code the stand-in
/// does not describe.
fn describe(out: *mut *const c_char, text: Option<&'static CStr>) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || match text {
        // SAFETY: the caller passes NULL or a valid out-pointer; the strings are static.
        Some(text) => unsafe { put(out, text.as_ptr()) }.map_or_else(code, |()| CUDA_SUCCESS),
        None => CUDA_ERROR_INVALID_VALUE,
    })
}

fn description(error: CUresult) -> Option<&'static CStr> {
    DESCRIPTIONS.iter().find(|d| d.0 == error).map(|d| d.1)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuGetErrorName(error: CUresult, name: *mut *const c_char) -> CUresult {
    describe(name, description(error).and(npumem_ffi::name_of(ERRORS, error)))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuGetErrorString(error: CUresult, text: *mut *const c_char) -> CUresult {
    describe(text, description(error))
}

npumem_fake::export_test_hooks!(RT);

// Every export has the C signature `npumem-ffi` declares for it (the one the backend loads).
const _: PFN_cuInit = cuInit;
const _: PFN_cuDriverGetVersion = cuDriverGetVersion;
const _: PFN_cuDeviceGetCount = cuDeviceGetCount;
const _: PFN_cuDeviceGet = cuDeviceGet;
const _: PFN_cuDeviceCanAccessPeer = cuDeviceCanAccessPeer;
const _: PFN_cuDevicePrimaryCtxRetain = cuDevicePrimaryCtxRetain;
const _: PFN_cuDevicePrimaryCtxRelease_v2 = cuDevicePrimaryCtxRelease_v2;
const _: PFN_cuCtxSetCurrent = cuCtxSetCurrent;
const _: PFN_cuCtxGetCurrent = cuCtxGetCurrent;
const _: PFN_cuCtxSynchronize = cuCtxSynchronize;
const _: PFN_cuMemGetAllocationGranularity = cuMemGetAllocationGranularity;
const _: PFN_cuMemAddressReserve = cuMemAddressReserve;
const _: PFN_cuMemAddressFree = cuMemAddressFree;
const _: PFN_cuMemCreate = cuMemCreate;
const _: PFN_cuMemRelease = cuMemRelease;
const _: PFN_cuMemMap = cuMemMap;
const _: PFN_cuMemUnmap = cuMemUnmap;
const _: PFN_cuMemSetAccess = cuMemSetAccess;
const _: PFN_cuMemcpyHtoD_v2 = cuMemcpyHtoD_v2;
const _: PFN_cuMemcpyDtoH_v2 = cuMemcpyDtoH_v2;
const _: PFN_cuMemcpyDtoD_v2 = cuMemcpyDtoD_v2;
const _: PFN_cuMemcpyHtoDAsync_v2 = cuMemcpyHtoDAsync_v2;
const _: PFN_cuMemcpyDtoHAsync_v2 = cuMemcpyDtoHAsync_v2;
const _: PFN_cuMemcpyDtoDAsync_v2 = cuMemcpyDtoDAsync_v2;
const _: PFN_cuMemcpyAsync = cuMemcpyAsync;
const _: PFN_cuMemsetD8_v2 = cuMemsetD8_v2;
const _: PFN_cuMemsetD8Async = cuMemsetD8Async;
const _: PFN_cuMemGetInfo_v2 = cuMemGetInfo_v2;
const _: PFN_cuMemAlloc_v2 = cuMemAlloc_v2;
const _: PFN_cuMemFree_v2 = cuMemFree_v2;
const _: PFN_cuMemAllocHost_v2 = cuMemAllocHost_v2;
const _: PFN_cuMemFreeHost = cuMemFreeHost;
const _: PFN_cuStreamCreate = cuStreamCreate;
const _: PFN_cuStreamDestroy_v2 = cuStreamDestroy_v2;
const _: PFN_cuStreamSynchronize = cuStreamSynchronize;
const _: PFN_cuStreamQuery = cuStreamQuery;
const _: PFN_cuEventCreate = cuEventCreate;
const _: PFN_cuEventDestroy_v2 = cuEventDestroy_v2;
const _: PFN_cuEventRecord = cuEventRecord;
const _: PFN_cuEventQuery = cuEventQuery;
const _: PFN_cuEventSynchronize = cuEventSynchronize;
const _: PFN_cuStreamWaitEvent = cuStreamWaitEvent;
const _: PFN_cuGetErrorName = cuGetErrorName;
const _: PFN_cuGetErrorString = cuGetErrorString;
