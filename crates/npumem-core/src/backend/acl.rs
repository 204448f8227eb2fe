//! `AclBackend`: the `Backend` trait over AscendCL (`libascendcl.so`) loaded at run time.
//!
//! The library is found through `NPUMEM_ACL_LIB` (a path; when set, the only place looked),
//! else `$ASCEND_HOME_PATH/lib64/libascendcl.so`, else `libascendcl.so` on the loader path; a
//! library that is missing or lacks one of the calls below is an `ACL_ERROR_FEATURE_UNSUPPORTED`
//! (200006) error naming what was searched. All calls are resolved when the library is first
//! loaded: `aclInit` (a repeat's `ACL_ERROR_REPEAT_INITIALIZE` is fine), `aclrtSetDevice`,
//! `aclrtGetDevice`, the VMM calls (`aclrtReserveMemAddress`, `aclrtReleaseMemAddress`,
//! `aclrtMallocPhysical`, `aclrtFreePhysical`, `aclrtMapMem`, `aclrtUnmapMem`,
//! `aclrtMemGetAllocationGranularity`), `aclrtMemcpy`, `aclrtMemset`, `aclrtGetMemInfo`,
//! `aclrtMallocHost` / `aclrtFreeHost` (the device's `malloc_host`), and the stream and event calls (`aclrtCreateStream`, `aclrtRecordEvent`, `aclrtQueryEventStatus`,
//! `aclrtSynchronizeEvent`, `aclrtStreamWaitEvent`, `aclrtMemcpyAsync`, `aclrtMemsetAsync`, ...), which
//! are the backend's [`RuntimeStreams`].
//!
//! Memory: physical allocations of normal, huge and giant pages are `ACL_MEM_NORMAL`,
//! `ACL_MEM_HUGE` and `ACL_MEM_HUGE1G` on the device, their page sizes the runtime's minimum
//! granularity; VA comes from `aclrtReserveMemAddress` (alignment 0, as the runtime requires;
//! see `DriverBackend` for alignment the runtime did not give); bytes move with `aclrtMemcpy`
//! and `aclrtMemset`. The device is `aclrtSetDevice(device)` on each thread that calls.
//!
//! Errors: every non-zero `aclError` becomes an `AclError` with that code when npumem's
//! [`ErrorCode`] has it, else with the nearest one, the runtime's number and name kept in the
//! message (`aclrtCreateStream returned 207008 (ACL_ERROR_RT_NO_STREAM_RESOURCE)`).
//!
//! Invariants: every call is made with the backend's device current on the calling thread; a
//! runtime error changes nothing in npumem's books (see `DriverBackend`).

use std::ffi::{c_char, c_int, c_void};

use super::driver::{Driver, DriverBackend, RawHandle};
use super::ffi::{self, Candidate, api};
use crate::acl::{MemAttr, MemScope, MemcpyKind};
use crate::error::{AclError, ErrorCode, Result};
use crate::stream::RuntimeStreams;
use crate::stream::runtime::Handle;
use crate::units::format_size;
use crate::vm::{PageKind, VA_WINDOW_END, VA_WINDOW_START};

/// `aclrtPhysicalMemProp`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct PhysicalMemProp {
    pub handle_type: u32,
    pub allocation_type: u32,
    pub mem_attr: u32,
    pub location_id: u32,
    pub location_type: u32,
    pub reserve: u64,
}

const ACL_MEM_LOCATION_TYPE_DEVICE: u32 = 1;
const ACL_RT_MEM_ALLOC_GRANULARITY_MINIMUM: u32 = 0;
const ACL_ERROR_REPEAT_INITIALIZE: c_int = 100_002;
/// `aclrtEventRecordedStatus`: `ACL_EVENT_RECORDED_STATUS_COMPLETE`.
const ACL_EVENT_RECORDED_STATUS_COMPLETE: u32 = 1;

api! {
    /// The AscendCL calls npumem uses, resolved up front.
    pub struct AclApi {
        aclInit: fn(*const c_char) -> c_int = "aclInit",
        aclrtSetDevice: fn(i32) -> c_int = "aclrtSetDevice",
        aclrtGetDevice: fn(*mut i32) -> c_int = "aclrtGetDevice",
        aclrtSynchronizeDevice: fn() -> c_int = "aclrtSynchronizeDevice",
        aclrtReserveMemAddress: fn(*mut *mut c_void, usize, usize, *mut c_void, u64) -> c_int = "aclrtReserveMemAddress",
        aclrtReleaseMemAddress: fn(*mut c_void) -> c_int = "aclrtReleaseMemAddress",
        aclrtMallocPhysical: fn(*mut *mut c_void, usize, *const PhysicalMemProp, u64) -> c_int = "aclrtMallocPhysical",
        aclrtFreePhysical: fn(*mut c_void) -> c_int = "aclrtFreePhysical",
        aclrtMapMem: fn(*mut c_void, usize, usize, *mut c_void, u64) -> c_int = "aclrtMapMem",
        aclrtUnmapMem: fn(*mut c_void) -> c_int = "aclrtUnmapMem",
        aclrtMemGetAllocationGranularity: fn(*mut PhysicalMemProp, u32, *mut usize) -> c_int = "aclrtMemGetAllocationGranularity",
        aclrtMemcpy: fn(*mut c_void, usize, *const c_void, usize, u32) -> c_int = "aclrtMemcpy",
        aclrtMemset: fn(*mut c_void, usize, i32, usize) -> c_int = "aclrtMemset",
        aclrtGetMemInfo: fn(u32, *mut usize, *mut usize) -> c_int = "aclrtGetMemInfo",
        aclrtMallocHost: fn(*mut *mut c_void, usize) -> c_int = "aclrtMallocHost",
        aclrtFreeHost: fn(*mut c_void) -> c_int = "aclrtFreeHost",
        aclrtCreateStream: fn(*mut *mut c_void) -> c_int = "aclrtCreateStream",
        aclrtDestroyStream: fn(*mut c_void) -> c_int = "aclrtDestroyStream",
        aclrtSynchronizeStream: fn(*mut c_void) -> c_int = "aclrtSynchronizeStream",
        aclrtCreateEvent: fn(*mut *mut c_void) -> c_int = "aclrtCreateEvent",
        aclrtDestroyEvent: fn(*mut c_void) -> c_int = "aclrtDestroyEvent",
        aclrtRecordEvent: fn(*mut c_void, *mut c_void) -> c_int = "aclrtRecordEvent",
        aclrtQueryEventStatus: fn(*mut c_void, *mut u32) -> c_int = "aclrtQueryEventStatus",
        aclrtSynchronizeEvent: fn(*mut c_void) -> c_int = "aclrtSynchronizeEvent",
        aclrtStreamWaitEvent: fn(*mut c_void, *mut c_void) -> c_int = "aclrtStreamWaitEvent",
        aclrtMemcpyAsync: fn(*mut c_void, usize, *const c_void, usize, u32, *mut c_void) -> c_int = "aclrtMemcpyAsync",
        aclrtMemsetAsync: fn(*mut c_void, usize, i32, usize, *mut c_void) -> c_int = "aclrtMemsetAsync",
    }
}

/// The AscendCL error names npumem knows, for messages (`acl_base_rt.h`, `rt_error_codes.h`).
const ACL_NAMES: &[(c_int, &str)] = &[
    (100_000, "ACL_ERROR_INVALID_PARAM"),
    (100_001, "ACL_ERROR_UNINITIALIZE"),
    (100_002, "ACL_ERROR_REPEAT_INITIALIZE"),
    (107_000, "ACL_ERROR_RT_PARAM_INVALID"),
    (107_001, "ACL_ERROR_RT_INVALID_DEVICEID"),
    (107_002, "ACL_ERROR_RT_CONTEXT_NULL"),
    (107_003, "ACL_ERROR_RT_STREAM_CONTEXT"),
    (107_008, "ACL_ERROR_RT_ADDR_UNALIGNED"),
    (107_016, "ACL_ERROR_RT_INVALID_MEMORY_TYPE"),
    (107_017, "ACL_ERROR_RT_INVALID_HANDLE"),
    (107_018, "ACL_ERROR_RT_INVALID_MALLOC_TYPE"),
    (200_000, "ACL_ERROR_BAD_ALLOC"),
    (200_001, "ACL_ERROR_API_NOT_SUPPORT"),
    (200_002, "ACL_ERROR_INVALID_DEVICE"),
    (200_003, "ACL_ERROR_MEMORY_ADDRESS_UNALIGNED"),
    (200_005, "ACL_ERROR_INVALID_RESOURCE_HANDLE"),
    (200_006, "ACL_ERROR_FEATURE_UNSUPPORTED"),
    (207_000, "ACL_ERROR_RT_FEATURE_NOT_SUPPORT"),
    (207_001, "ACL_ERROR_RT_MEMORY_ALLOCATION"),
    (207_002, "ACL_ERROR_RT_MEMORY_FREE"),
    (207_004, "ACL_ERROR_RT_NO_DEVICE"),
    (207_005, "ACL_ERROR_RT_RESOURCE_ALLOC_FAIL"),
    (207_007, "ACL_ERROR_RT_NO_EVENT_RESOURCE"),
    (207_008, "ACL_ERROR_RT_NO_STREAM_RESOURCE"),
    (207_012, "ACL_ERROR_RT_OVER_LIMIT"),
    (207_018, "ACL_ERROR_RT_DEVICE_OOM"),
    (500_000, "ACL_ERROR_INTERNAL_ERROR"),
    (500_001, "ACL_ERROR_FAILURE"),
    (500_003, "ACL_ERROR_RT_FAILURE"),
    (500_004, "ACL_ERROR_DRV_FAILURE"),
    (507_000, "ACL_ERROR_RT_INTERNAL_ERROR"),
    (507_013, "ACL_ERROR_RT_SYS_DMA"),
    (507_899, "ACL_ERROR_RT_DRV_INTERNAL_ERROR"),
];

/// npumem's code for an `aclError`: the same where npumem has it, else the nearest.
pub fn nearest(code: c_int) -> ErrorCode {
    match code {
        100_000 | 107_001 | 200_002 => ErrorCode::InvalidParam,
        107_000 | 107_003 | 107_016 | 107_018 => ErrorCode::RtParamInvalid,
        107_008 | 200_003 => ErrorCode::RtAddrUnaligned,
        107_017 | 200_005 => ErrorCode::RtInvalidHandle,
        200_001 | 200_006 | 207_000 | 207_004 => ErrorCode::FeatureUnsupported,
        200_000 | 207_001 | 207_005 | 207_007 | 207_008 | 207_012 | 207_018 => ErrorCode::RtMemoryAllocation,
        207_002 => ErrorCode::RtMemoryFree,
        _ => ErrorCode::RtDrvInternal,
    }
}

/// The error for `call` returning `ret` (non-zero).
fn acl_error(ret: c_int, call: &str) -> AclError {
    let code = nearest(ret);
    let name = ACL_NAMES.iter().find(|(c, _)| *c == ret).map_or("an AscendCL error", |(_, n)| n);
    AclError::new(code, format!("{call} returned {ret} ({name})"))
}

/// `Ok` for `ACL_SUCCESS`, else the error naming `call`.
fn check(ret: c_int, call: impl FnOnce() -> String) -> Result<()> {
    if ret == 0 { Ok(()) } else { Err(acl_error(ret, &call())) }
}

fn ptr(addr: u64) -> *mut c_void {
    std::ptr::with_exposed_provenance_mut(addr as usize)
}

/// AscendCL, loaded and initialised: safe wrappers of its calls. Each needs a current device on
/// the calling thread ([`AclRuntime::use_device`]).
pub struct AclRuntime {
    api: AclApi,
    path: String,
}

static RUNTIMES: std::sync::LazyLock<parking_lot::Mutex<Vec<&'static AclRuntime>>> =
    std::sync::LazyLock::new(Default::default);

impl AclRuntime {
    /// The places searched for `libascendcl.so`, in order.
    pub fn candidates() -> Vec<Candidate> {
        if let Some(path) = ffi::env("NPUMEM_ACL_LIB") {
            return vec![Candidate::new("NPUMEM_ACL_LIB", path)];
        }
        let mut out = Vec::new();
        if let Some(home) = ffi::env("ASCEND_HOME_PATH") {
            out.push(Candidate::new("$ASCEND_HOME_PATH/lib64", format!("{home}/lib64/libascendcl.so")));
        }
        out.push(Candidate::new("the loader path", "libascendcl.so"));
        out
    }

    /// Loads AscendCL from where the environment says ([`AclRuntime::candidates`]).
    pub fn load() -> Result<&'static AclRuntime> {
        Self::load_from(&Self::candidates())
    }

    /// Loads AscendCL from the first of `candidates` that opens (once per library path) and
    /// initialises it.
    pub fn load_from(candidates: &[Candidate]) -> Result<&'static AclRuntime> {
        let opened = ffi::open(
            "AscendCL (libascendcl.so)",
            candidates,
            "Install the CANN toolkit and source its set_env.sh (ASCEND_HOME_PATH), or set NPUMEM_ACL_LIB to the library.",
        )?;
        let mut runtimes = RUNTIMES.lock();
        if let Some(&rt) = runtimes.iter().find(|rt| rt.path == opened.path) {
            return Ok(rt);
        }
        let api = AclApi::resolve(&opened, "AscendCL")?;
        // SAFETY: aclInit takes a NULL configuration path.
        let ret = unsafe { (api.aclInit)(std::ptr::null()) };
        if ret != ACL_ERROR_REPEAT_INITIALIZE {
            check(ret, || "aclInit(NULL)".into())?;
        }
        let rt: &'static AclRuntime = Box::leak(Box::new(AclRuntime { api, path: opened.path }));
        runtimes.push(rt);
        Ok(rt)
    }

    /// The library this runtime was loaded from.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// Makes `device` current on the calling thread (unless it is already).
    pub fn use_device(&self, device: i32) -> Result<()> {
        let mut current = -1;
        // SAFETY: a valid out-pointer; without a current device the call fails and `current`
        // stays -1.
        if unsafe { (self.api.aclrtGetDevice)(&mut current) } == 0 && current == device {
            return Ok(());
        }
        // SAFETY: a plain call with a device id.
        check(unsafe { (self.api.aclrtSetDevice)(device) }, || format!("aclrtSetDevice({device})"))
    }

    fn prop(attr: MemAttr, device: i32) -> PhysicalMemProp {
        PhysicalMemProp {
            handle_type: 0,     // ACL_MEM_HANDLE_TYPE_NONE
            allocation_type: 0, // ACL_MEM_ALLOCATION_TYPE_PINNED
            mem_attr: attr as u32,
            location_id: device as u32,
            location_type: ACL_MEM_LOCATION_TYPE_DEVICE,
            reserve: 0,
        }
    }

    /// `aclrtMemGetAllocationGranularity` (minimum) of device memory of `attr`.
    pub fn granularity(&self, attr: MemAttr, device: i32) -> Result<u64> {
        let mut prop = Self::prop(attr, device);
        let mut g = 0usize;
        // SAFETY: valid pointers to a property structure and an out-value.
        let ret = unsafe {
            (self.api.aclrtMemGetAllocationGranularity)(&mut prop, ACL_RT_MEM_ALLOC_GRANULARITY_MINIMUM, &mut g)
        };
        check(ret, || format!("aclrtMemGetAllocationGranularity({})", attr.name()))?;
        Ok(g as u64)
    }

    /// `aclrtReserveMemAddress(size, alignment 0, expectPtr, flags 0)`.
    pub fn reserve(&self, size: u64, expect: Option<u64>) -> Result<u64> {
        let mut va = std::ptr::null_mut();
        // SAFETY: a valid out-pointer; the expected address is only a number to the runtime.
        let ret = unsafe { (self.api.aclrtReserveMemAddress)(&mut va, size as usize, 0, ptr(expect.unwrap_or(0)), 0) };
        check(ret, || format!("aclrtReserveMemAddress({}, expectPtr={:#x})", format_size(size), expect.unwrap_or(0)))?;
        Ok(va.addr() as u64)
    }

    pub fn release(&self, va: u64) -> Result<()> {
        // SAFETY: the runtime checks the address.
        check(unsafe { (self.api.aclrtReleaseMemAddress)(ptr(va)) }, || format!("aclrtReleaseMemAddress({va:#x})"))
    }

    /// `aclrtMallocPhysical` of `size` bytes of `attr` on `device`.
    pub fn malloc_physical(&self, size: u64, attr: MemAttr, device: i32) -> Result<RawHandle> {
        let prop = Self::prop(attr, device);
        let mut handle = std::ptr::null_mut();
        // SAFETY: valid pointers to an out-handle and a property structure.
        let ret = unsafe { (self.api.aclrtMallocPhysical)(&mut handle, size as usize, &prop, 0) };
        check(ret, || format!("aclrtMallocPhysical({}, {})", format_size(size), attr.name()))?;
        Ok(handle.addr() as u64)
    }

    pub fn free_physical(&self, handle: RawHandle) -> Result<()> {
        // SAFETY: the handle is only a number to the runtime, which checks it.
        check(unsafe { (self.api.aclrtFreePhysical)(ptr(handle)) }, || format!("aclrtFreePhysical({handle:#x})"))
    }

    pub fn map(&self, va: u64, size: u64, handle: RawHandle) -> Result<()> {
        // SAFETY: the runtime checks the address and the handle.
        let ret = unsafe { (self.api.aclrtMapMem)(ptr(va), size as usize, 0, ptr(handle), 0) };
        check(ret, || format!("aclrtMapMem({va:#x}, {}, handle {handle:#x})", format_size(size)))
    }

    pub fn unmap(&self, va: u64) -> Result<()> {
        // SAFETY: the runtime checks the address.
        check(unsafe { (self.api.aclrtUnmapMem)(ptr(va)) }, || format!("aclrtUnmapMem({va:#x})"))
    }

    /// `aclrtMemcpy` of `count` bytes (`dst_max` available at `dst`).
    ///
    /// # Safety
    /// Host addresses among `dst` and `src` must be valid for `count` bytes (the runtime checks
    /// device addresses only).
    pub unsafe fn memcpy(&self, dst: u64, dst_max: u64, src: u64, count: u64, kind: MemcpyKind) -> Result<()> {
        // SAFETY: the caller's contract for host memory; the runtime checks device memory.
        let ret = unsafe { (self.api.aclrtMemcpy)(ptr(dst), dst_max as usize, ptr(src), count as usize, kind as u32) };
        check(ret, || format!("aclrtMemcpy({dst:#x}, {src:#x}, {count} bytes, {})", kind.name()))
    }

    /// `aclrtMemset` of `count` bytes at device address `dst`.
    pub fn memset(&self, dst: u64, max: u64, value: u8, count: u64) -> Result<()> {
        // SAFETY: the runtime checks the device address.
        let ret = unsafe { (self.api.aclrtMemset)(ptr(dst), max as usize, i32::from(value), count as usize) };
        check(ret, || format!("aclrtMemset({dst:#x}, {value}, {count} bytes)"))
    }

    /// `aclrtGetMemInfo(attr)`: (free, total).
    pub fn mem_info(&self, attr: MemAttr) -> Result<(u64, u64)> {
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: valid out-pointers.
        let ret = unsafe { (self.api.aclrtGetMemInfo)(attr as u32, &mut free, &mut total) };
        check(ret, || format!("aclrtGetMemInfo({})", attr.name()))?;
        Ok((free as u64, total as u64))
    }

    /// `aclrtMallocHost`: page-locked host memory.
    pub fn malloc_host(&self, size: u64) -> Result<u64> {
        let mut p = std::ptr::null_mut();
        // SAFETY: a valid out-pointer.
        check(unsafe { (self.api.aclrtMallocHost)(&mut p, size as usize) }, || {
            format!("aclrtMallocHost({})", format_size(size))
        })?;
        Ok(p.addr() as u64)
    }

    pub fn free_host(&self, p: u64) -> Result<()> {
        // SAFETY: the runtime checks the pointer is its own.
        check(unsafe { (self.api.aclrtFreeHost)(ptr(p)) }, || format!("aclrtFreeHost({p:#x})"))
    }

    pub fn synchronize_device(&self) -> Result<()> {
        // SAFETY: a plain call.
        check(unsafe { (self.api.aclrtSynchronizeDevice)() }, || "aclrtSynchronizeDevice()".into())
    }
}

/// The runtime's streams and events, handles as integers (0: the default stream); the device
/// must be current on the calling thread.
impl AclRuntime {
    pub fn create_stream(&self) -> Result<Handle> {
        let mut s = std::ptr::null_mut();
        // SAFETY: a valid out-pointer.
        check(unsafe { (self.api.aclrtCreateStream)(&mut s) }, || "aclrtCreateStream()".into())?;
        Ok(s.addr() as u64)
    }

    pub fn destroy_stream(&self, stream: Handle) -> Result<()> {
        // SAFETY: the runtime checks the handle.
        check(unsafe { (self.api.aclrtDestroyStream)(ptr(stream)) }, || format!("aclrtDestroyStream({stream:#x})"))
    }

    pub fn synchronize_stream(&self, stream: Handle) -> Result<()> {
        // SAFETY: the runtime checks the handle (NULL: the default stream).
        check(unsafe { (self.api.aclrtSynchronizeStream)(ptr(stream)) }, || {
            format!("aclrtSynchronizeStream({stream:#x})")
        })
    }

    pub fn create_event(&self) -> Result<Handle> {
        let mut e = std::ptr::null_mut();
        // SAFETY: a valid out-pointer.
        check(unsafe { (self.api.aclrtCreateEvent)(&mut e) }, || "aclrtCreateEvent()".into())?;
        Ok(e.addr() as u64)
    }

    pub fn destroy_event(&self, event: Handle) -> Result<()> {
        // SAFETY: the runtime checks the handle.
        check(unsafe { (self.api.aclrtDestroyEvent)(ptr(event)) }, || format!("aclrtDestroyEvent({event:#x})"))
    }

    pub fn record_event(&self, event: Handle, stream: Handle) -> Result<()> {
        // SAFETY: the runtime checks both handles.
        check(unsafe { (self.api.aclrtRecordEvent)(ptr(event), ptr(stream)) }, || {
            format!("aclrtRecordEvent({event:#x}, {stream:#x})")
        })
    }

    pub fn query_event(&self, event: Handle) -> Result<bool> {
        let mut status = 0u32;
        // SAFETY: the runtime checks the handle; a valid out-pointer.
        check(unsafe { (self.api.aclrtQueryEventStatus)(ptr(event), &mut status) }, || {
            format!("aclrtQueryEventStatus({event:#x})")
        })?;
        Ok(status == ACL_EVENT_RECORDED_STATUS_COMPLETE)
    }

    pub fn synchronize_event(&self, event: Handle) -> Result<()> {
        // SAFETY: the runtime checks the handle.
        check(unsafe { (self.api.aclrtSynchronizeEvent)(ptr(event)) }, || format!("aclrtSynchronizeEvent({event:#x})"))
    }

    pub fn stream_wait_event(&self, stream: Handle, event: Handle) -> Result<()> {
        // SAFETY: the runtime checks both handles.
        check(unsafe { (self.api.aclrtStreamWaitEvent)(ptr(stream), ptr(event)) }, || {
            format!("aclrtStreamWaitEvent({stream:#x}, {event:#x})")
        })
    }

    /// Queues a copy of `count` bytes on `stream` (device or host addresses, either way).
    ///
    /// # Safety
    /// Host memory among `dst` and `src` must stay valid until the copy has run (synchronize
    /// the stream, or an event recorded after it, before freeing it).
    pub unsafe fn memcpy_async(&self, dst: u64, src: u64, count: u64, stream: Handle) -> Result<()> {
        // SAFETY: the caller's contract for host memory; the runtime checks device memory.
        let ret = unsafe {
            (self.api.aclrtMemcpyAsync)(
                ptr(dst),
                count as usize,
                ptr(src),
                count as usize,
                MemcpyKind::Default as u32,
                ptr(stream),
            )
        };
        check(ret, || format!("aclrtMemcpyAsync({dst:#x}, {src:#x}, {count} bytes, {stream:#x})"))
    }

    /// `aclrtMemsetAsync` of `count` bytes at device address `dst`, queued on `stream`.
    pub fn memset_async(&self, dst: u64, value: u8, count: u64, stream: Handle) -> Result<()> {
        // SAFETY: the runtime checks the device address and the stream.
        let ret = unsafe {
            (self.api.aclrtMemsetAsync)(ptr(dst), count as usize, i32::from(value), count as usize, ptr(stream))
        };
        check(ret, || format!("aclrtMemsetAsync({dst:#x}, {value}, {count} bytes, {stream:#x})"))
    }
}

/// The AscendCL attribute of physical memory of `kind`.
fn attr(kind: PageKind) -> MemAttr {
    match kind {
        PageKind::Normal => MemAttr::MemNormal,
        PageKind::Huge => MemAttr::MemHuge,
        PageKind::Giant => MemAttr::MemHuge1g,
    }
}

/// AscendCL on one device, for a [`DriverBackend`].
pub struct AclDriver {
    rt: &'static AclRuntime,
    device: i32,
}

impl AclDriver {
    /// AscendCL (loaded on first use, from where the environment says) on `device`.
    pub fn open(device: i32) -> Result<AclDriver> {
        Self::new(AclRuntime::load()?, device)
    }

    /// `rt` on `device`.
    pub fn new(rt: &'static AclRuntime, device: i32) -> Result<AclDriver> {
        rt.use_device(device)?;
        Ok(AclDriver { rt, device })
    }

    pub fn runtime(&self) -> &'static AclRuntime {
        self.rt
    }

    pub fn device(&self) -> i32 {
        self.device
    }

    fn bound(&self) -> Result<&'static AclRuntime> {
        self.rt.use_device(self.device)?;
        Ok(self.rt)
    }
}

impl Driver for AclDriver {
    fn name(&self) -> &'static str {
        "acl"
    }

    fn granularity(&self, kind: PageKind) -> Result<u64> {
        self.bound()?.granularity(attr(kind), self.device)
    }

    fn window(&self) -> (u64, u64) {
        (VA_WINDOW_START, VA_WINDOW_END)
    }

    fn owns_window(&self) -> bool {
        true
    }

    fn reserve(&self, size: u64, _align: u64, hint: Option<u64>) -> Result<u64> {
        self.bound()?.reserve(size, hint)
    }

    fn release(&self, va: u64, _size: u64) -> Result<()> {
        self.bound()?.release(va)
    }

    fn create(&self, size: u64, kind: PageKind) -> Result<RawHandle> {
        self.bound()?.malloc_physical(size, attr(kind), self.device)
    }

    fn free(&self, handle: RawHandle) -> Result<()> {
        self.bound()?.free_physical(handle)
    }

    fn map(&self, va: u64, size: u64, handle: RawHandle) -> Result<()> {
        self.bound()?.map(va, size, handle)
    }

    fn unmap(&self, va: u64, _size: u64) -> Result<()> {
        self.bound()?.unmap(va)
    }

    fn read(&self, va: u64, out: &mut [u8]) -> Result<()> {
        let n = out.len() as u64;
        // SAFETY: `out` is valid for `n` bytes.
        unsafe { self.bound()?.memcpy(out.as_mut_ptr().addr() as u64, n, va, n, MemcpyKind::DeviceToHost) }
    }

    fn write(&self, va: u64, data: &[u8]) -> Result<()> {
        let n = data.len() as u64;
        // SAFETY: `data` is valid for `n` bytes.
        unsafe { self.bound()?.memcpy(va, n, data.as_ptr().addr() as u64, n, MemcpyKind::HostToDevice) }
    }

    fn fill(&self, va: u64, value: u8, count: u64) -> Result<()> {
        self.bound()?.memset(va, count, value, count)
    }

    fn copy(&self, dst: u64, src: u64, count: u64) -> Result<()> {
        // SAFETY: both are device addresses, which the runtime checks.
        unsafe { self.bound()?.memcpy(dst, count, src, count, MemcpyKind::DeviceToDevice) }
    }

    fn mem_info(&self, scope: MemScope) -> Result<(u64, u64)> {
        let attr = match scope {
            MemScope::Ddr => MemAttr::Ddr,
            MemScope::All => MemAttr::Hbm,
            MemScope::Normal => MemAttr::HbmNormal,
            MemScope::Huge => MemAttr::HbmHuge,
            MemScope::Giant => MemAttr::HbmHuge1g,
        };
        self.bound()?.mem_info(attr)
    }

    fn malloc_host(&self, size: u64) -> Result<u64> {
        self.bound()?.malloc_host(size)
    }

    fn free_host(&self, addr: u64) -> Result<()> {
        self.bound()?.free_host(addr)
    }
}

// AscendCL's own streams and events: what the device orders stream-ordered reuse and async
// copies on.
super::driver::runtime_streams!(AclDriver, synchronize_device);

/// The `Backend` over AscendCL.
pub type AclBackend = DriverBackend<AclDriver>;

impl AclBackend {
    /// A backend on AscendCL's `device` that may hold `capacity` bytes (default: the device's
    /// memory).
    pub fn open(device: i32, capacity: Option<u64>) -> Result<AclBackend> {
        Self::with_driver(AclDriver::open(device)?, capacity)
    }

    /// A backend over `driver` (capacity as in [`AclBackend::open`]).
    pub fn with_driver(driver: AclDriver, capacity: Option<u64>) -> Result<AclBackend> {
        let capacity = match capacity {
            Some(c) => c,
            None => driver.mem_info(MemScope::All)?.1,
        };
        DriverBackend::new(driver, capacity)
    }
}
