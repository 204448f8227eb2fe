//! `AclBackend`: the `Backend` trait over AscendCL (`libascendcl.so`) loaded at run time.
//!
//! The library is found through `NPUMEM_ACL_LIB` (a path; when set, the only place looked),
//! else `$ASCEND_HOME_PATH/lib64/libascendcl.so`, else `libascendcl.so` on the loader path; a
//! library that is missing or lacks one of the calls below is an `ACL_ERROR_FEATURE_UNSUPPORTED`
//! (200006) error naming what was searched. All calls are resolved when the library is first
//! loaded: `aclInit` (a repeat's `ACL_ERROR_REPEAT_INITIALIZE` is fine), `aclrtSetDevice`,
//! `aclrtGetDevice`, `aclrtGetCurrentContext`, `aclrtSetCurrentContext`, the VMM calls
//! (`aclrtReserveMemAddress`, `aclrtReleaseMemAddress`, `aclrtMallocPhysical`,
//! `aclrtFreePhysical`, `aclrtMapMem`, `aclrtUnmapMem`, `aclrtMemGetAllocationGranularity`),
//! `aclrtMemcpy`, `aclrtMemset`, `aclrtGetMemInfo`,
//! `aclrtMallocHost` / `aclrtFreeHost` (the device's `malloc_host`), and the stream and event calls (`aclrtCreateStream`, `aclrtRecordEvent`, `aclrtQueryEventStatus`,
//! `aclrtSynchronizeEvent`, `aclrtStreamWaitEvent`, `aclrtMemcpyAsync`, `aclrtMemsetAsync`, ...), which
//! are the backend's [`RuntimeStreams`].
//!
//! Memory: physical allocations of normal, huge and giant pages are `ACL_MEM_NORMAL`,
//! `ACL_MEM_HUGE` and `ACL_MEM_HUGE1G` on the device (CANN 8.5 on), or `ACL_HBM_MEM_NORMAL`,
//! `ACL_HBM_MEM_HUGE` and `ACL_HBM_MEM_HUGE1G` on a release that refuses the first as an invalid
//! parameter (before 8.5), their page sizes the runtime's minimum granularity; VA comes from
//! `aclrtReserveMemAddress` (alignment 0, as the runtime requires; see `DriverBackend` for
//! alignment the runtime did not give); bytes move with `aclrtMemcpy`
//! and `aclrtMemset`. The device's default context is taken once (`aclrtSetDevice`, whose
//! reference the driver holds); each call makes it current on the calling thread
//! (`aclrtSetCurrentContext`, which takes no reference) and the thread's own context current
//! again after ([`super::current`]).
//!
//! Errors: every non-zero `aclError` becomes an `AclError` with that code when npumem's
//! [`ErrorCode`] has it, else with the nearest one, the runtime's number and name kept in the
//! message (`aclrtCreateStream returned 207008 (ACL_ERROR_RT_NO_STREAM_RESOURCE)`).
//!
//! Invariants: every call is made with the backend's device current on the calling thread, and
//! leaves the thread's current device as it found it; a runtime error changes nothing in npumem's
//! books (see `DriverBackend`).

use std::ffi::c_void;

use npumem_ffi::acl::*;

use super::current::{Bound, ThreadCurrent};
use super::driver::{Driver, DriverBackend, RawHandle};
use super::ffi::{self, Candidate, api};
use crate::acl::{MemAttr, MemScope, MemcpyKind};
use crate::error::{AclError, ErrorCode, Result};
use crate::stream::RuntimeStreams;
use crate::stream::runtime::Handle;
use crate::units::format_size;
use crate::vm::{PageKind, VA_WINDOW_END, VA_WINDOW_START};

api! {
    /// The AscendCL calls npumem uses, resolved up front.
    pub struct AclApi {
        aclInit: PFN_aclInit = "aclInit",
        aclrtSetDevice: PFN_aclrtSetDevice = "aclrtSetDevice",
        aclrtGetDevice: PFN_aclrtGetDevice = "aclrtGetDevice",
        aclrtGetCurrentContext: PFN_aclrtGetCurrentContext = "aclrtGetCurrentContext",
        aclrtSetCurrentContext: PFN_aclrtSetCurrentContext = "aclrtSetCurrentContext",
        aclrtSynchronizeDevice: PFN_aclrtSynchronizeDevice = "aclrtSynchronizeDevice",
        aclrtReserveMemAddress: PFN_aclrtReserveMemAddress = "aclrtReserveMemAddress",
        aclrtReleaseMemAddress: PFN_aclrtReleaseMemAddress = "aclrtReleaseMemAddress",
        aclrtMallocPhysical: PFN_aclrtMallocPhysical = "aclrtMallocPhysical",
        aclrtFreePhysical: PFN_aclrtFreePhysical = "aclrtFreePhysical",
        aclrtMapMem: PFN_aclrtMapMem = "aclrtMapMem",
        aclrtUnmapMem: PFN_aclrtUnmapMem = "aclrtUnmapMem",
        aclrtMemGetAllocationGranularity: PFN_aclrtMemGetAllocationGranularity = "aclrtMemGetAllocationGranularity",
        aclrtMemcpy: PFN_aclrtMemcpy = "aclrtMemcpy",
        aclrtMemset: PFN_aclrtMemset = "aclrtMemset",
        aclrtGetMemInfo: PFN_aclrtGetMemInfo = "aclrtGetMemInfo",
        aclrtMallocHost: PFN_aclrtMallocHost = "aclrtMallocHost",
        aclrtFreeHost: PFN_aclrtFreeHost = "aclrtFreeHost",
        aclrtCreateStream: PFN_aclrtCreateStream = "aclrtCreateStream",
        aclrtDestroyStream: PFN_aclrtDestroyStream = "aclrtDestroyStream",
        aclrtSynchronizeStream: PFN_aclrtSynchronizeStream = "aclrtSynchronizeStream",
        aclrtCreateEvent: PFN_aclrtCreateEvent = "aclrtCreateEvent",
        aclrtDestroyEvent: PFN_aclrtDestroyEvent = "aclrtDestroyEvent",
        aclrtRecordEvent: PFN_aclrtRecordEvent = "aclrtRecordEvent",
        aclrtQueryEventStatus: PFN_aclrtQueryEventStatus = "aclrtQueryEventStatus",
        aclrtSynchronizeEvent: PFN_aclrtSynchronizeEvent = "aclrtSynchronizeEvent",
        aclrtStreamWaitEvent: PFN_aclrtStreamWaitEvent = "aclrtStreamWaitEvent",
        aclrtMemcpyAsync: PFN_aclrtMemcpyAsync = "aclrtMemcpyAsync",
        aclrtMemsetAsync: PFN_aclrtMemsetAsync = "aclrtMemsetAsync",
    }
}

/// npumem's code for an `aclError`: the same where npumem has it, else the nearest.
pub fn nearest(code: aclError) -> ErrorCode {
    match code {
        ACL_ERROR_INVALID_PARAM | ACL_ERROR_RT_INVALID_DEVICEID | ACL_ERROR_INVALID_DEVICE => ErrorCode::InvalidParam,
        ACL_ERROR_RT_PARAM_INVALID
        | ACL_ERROR_RT_STREAM_CONTEXT
        | ACL_ERROR_RT_INVALID_MEMORY_TYPE
        | ACL_ERROR_RT_INVALID_MALLOC_TYPE => ErrorCode::RtParamInvalid,
        ACL_ERROR_RT_ADDR_UNALIGNED | ACL_ERROR_MEMORY_ADDRESS_UNALIGNED => ErrorCode::RtAddrUnaligned,
        ACL_ERROR_RT_INVALID_HANDLE | ACL_ERROR_INVALID_RESOURCE_HANDLE => ErrorCode::RtInvalidHandle,
        ACL_ERROR_API_NOT_SUPPORT
        | ACL_ERROR_FEATURE_UNSUPPORTED
        | ACL_ERROR_RT_FEATURE_NOT_SUPPORT
        | ACL_ERROR_RT_NO_DEVICE => ErrorCode::FeatureUnsupported,
        ACL_ERROR_BAD_ALLOC
        | ACL_ERROR_RT_MEMORY_ALLOCATION
        | ACL_ERROR_RT_RESOURCE_ALLOC_FAIL
        | ACL_ERROR_RT_NO_EVENT_RESOURCE
        | ACL_ERROR_RT_NO_STREAM_RESOURCE
        | ACL_ERROR_RT_OVER_LIMIT
        | ACL_ERROR_RT_DEVICE_OOM => ErrorCode::RtMemoryAllocation,
        ACL_ERROR_RT_MEMORY_FREE => ErrorCode::RtMemoryFree,
        _ => ErrorCode::RtDrvInternal,
    }
}

/// The error for `call` returning `ret` (non-zero).
fn acl_error(ret: aclError, call: &str) -> AclError {
    let name = npumem_ffi::name_of(ERRORS, ret).and_then(|n| n.to_str().ok()).unwrap_or("an AscendCL error");
    AclError::new(nearest(ret), format!("{call} returned {ret} ({name})"))
}

/// `Ok` for `ACL_SUCCESS`, else the error naming `call`.
fn check(ret: aclError, call: impl FnOnce() -> String) -> Result<()> {
    if ret == ACL_SUCCESS { Ok(()) } else { Err(acl_error(ret, &call())) }
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

    /// Makes `device` current on the calling thread (unless it is already), and keeps it
    /// current (see [`AclRuntime::in_context`] for one call).
    pub fn use_device(&self, device: i32) -> Result<()> {
        if self.current_device() == Some(device) {
            return Ok(());
        }
        // SAFETY: a plain call with a device id.
        check(unsafe { (self.api.aclrtSetDevice)(device) }, || format!("aclrtSetDevice({device})"))
    }

    /// The calling thread's current device (`aclrtGetDevice`), `None` when it has none.
    pub fn current_device(&self) -> Option<i32> {
        let mut current = -1;
        // SAFETY: a valid out-pointer; without a current device the call fails.
        (unsafe { (self.api.aclrtGetDevice)(&mut current) } == ACL_SUCCESS && current >= 0).then_some(current)
    }

    /// The calling thread's current context (`aclrtGetCurrentContext`), `None` when it has none.
    pub fn current_context(&self) -> Option<u64> {
        let mut context = std::ptr::null_mut();
        // SAFETY: a valid out-pointer; without a current context the call fails.
        let ret = unsafe { (self.api.aclrtGetCurrentContext)(&mut context) };
        (ret == ACL_SUCCESS && !context.is_null()).then(|| context.addr() as u64)
    }

    /// Makes `context` (and its device) current on the calling thread.
    pub fn set_context(&self, context: u64) -> Result<()> {
        // SAFETY: a context the runtime gave.
        check(unsafe { (self.api.aclrtSetCurrentContext)(ptr(context)) }, || {
            format!("aclrtSetCurrentContext({context:#x})")
        })
    }

    /// The default context of `device` (`aclrtSetDevice`, one reference the caller keeps: the
    /// device's resources stay while it is held), the calling thread's context left as it was.
    pub fn default_context(&self, device: i32) -> Result<u64> {
        let previous = self.current_context();
        // SAFETY: a plain call with a device id.
        check(unsafe { (self.api.aclrtSetDevice)(device) }, || format!("aclrtSetDevice({device})"))?;
        let context = self.current_context();
        if let Some(p) = previous {
            self.set_context(p)?;
        }
        context.ok_or_else(|| {
            AclError::internal(format!("aclrtSetDevice({device}) left no current context on the thread"))
        })
    }

    /// `context` current on the calling thread while the guard lives, the thread's own context
    /// current again after. Switching contexts, unlike `aclrtSetDevice`, takes no reference.
    pub fn in_context(&'static self, context: u64) -> Result<Bound<AclRuntime>> {
        Bound::new(self, context)
    }

    fn prop(attr: MemAttr, device: i32) -> aclrtPhysicalMemProp {
        aclrtPhysicalMemProp {
            handleType: ACL_MEM_HANDLE_TYPE_NONE,
            allocationType: ACL_MEM_ALLOCATION_TYPE_PINNED,
            memAttr: attr as aclrtMemAttr,
            location: aclrtMemLocation { id: device as u32, type_: ACL_MEM_LOCATION_TYPE_DEVICE },
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
        let ret = unsafe {
            (self.api.aclrtMemcpy)(ptr(dst), dst_max as usize, ptr(src), count as usize, kind as aclrtMemcpyKind)
        };
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
        let ret = unsafe { (self.api.aclrtGetMemInfo)(attr as aclrtMemAttr, &mut free, &mut total) };
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

impl ThreadCurrent for AclRuntime {
    fn current(&self) -> Option<u64> {
        self.current_context()
    }

    fn make_current(&self, target: u64) -> Result<()> {
        self.set_context(target)
    }

    fn restore(&self, previous: Option<u64>) {
        // (No call clears a thread's context without releasing its device: see `current`.)
        if let Some(context) = previous {
            // SAFETY: the context the thread had.
            unsafe { (self.api.aclrtSetCurrentContext)(ptr(context)) };
        }
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
        let mut status = ACL_EVENT_RECORDED_STATUS_NOT_READY;
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
                MemcpyKind::Default as aclrtMemcpyKind,
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

/// The attributes of physical memory of each `PageKind` (normal, huge, giant) from CANN 8.5
/// (ACL 1.16) on.
const MEM_ATTRS_8_5: [MemAttr; 3] = [MemAttr::MemNormal, MemAttr::MemHuge, MemAttr::MemHuge1g];

/// The same before CANN 8.5, whose `aclrtMallocPhysical` and `aclrtMemGetAllocationGranularity`
/// take only these (and return `ACL_ERROR_INVALID_PARAM` for the others).
const MEM_ATTRS_HBM: [MemAttr; 3] = [MemAttr::HbmNormal, MemAttr::HbmHuge, MemAttr::HbmHuge1g];

/// AscendCL on one device, for a [`DriverBackend`].
pub struct AclDriver {
    rt: &'static AclRuntime,
    device: i32,
    /// The device's default context (its reference held for the driver's life).
    context: u64,
    /// The runtime's attribute of physical memory of each `PageKind`.
    attrs: [MemAttr; 3],
}

impl AclDriver {
    /// AscendCL (loaded on first use, from where the environment says) on `device`.
    pub fn open(device: i32) -> Result<AclDriver> {
        Self::new(AclRuntime::load()?, device)
    }

    /// `rt` on `device`.
    /// `rt` on `device`, with the memory attributes of the runtime's release: those of CANN 8.5
    /// where the runtime knows them, else the `ACL_HBM_MEM_*` set of earlier releases.
    pub fn new(rt: &'static AclRuntime, device: i32) -> Result<AclDriver> {
        let context = rt.default_context(device)?;
        let bound = rt.in_context(context)?;
        let attrs = match bound.granularity(MEM_ATTRS_8_5[0], device) {
            Ok(_) => MEM_ATTRS_8_5,
            Err(e) if e.code == ErrorCode::InvalidParam => MEM_ATTRS_HBM,
            Err(e) => return Err(e),
        };
        Ok(AclDriver { rt, device, context, attrs })
    }

    /// The attribute physical memory of `kind` is allocated with.
    pub fn attr(&self, kind: PageKind) -> MemAttr {
        self.attrs[kind as usize]
    }

    pub fn runtime(&self) -> &'static AclRuntime {
        self.rt
    }

    pub fn device(&self) -> i32 {
        self.device
    }

    /// The runtime with the driver's device (its default context) current for one call.
    fn bound(&self) -> Result<Bound<AclRuntime>> {
        self.rt.in_context(self.context)
    }
}

impl Driver for AclDriver {
    fn name(&self) -> &'static str {
        "acl"
    }

    fn granularity(&self, kind: PageKind) -> Result<u64> {
        self.bound()?.granularity(self.attr(kind), self.device)
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
        self.bound()?.malloc_physical(size, self.attr(kind), self.device)
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

    fn fresh_event_complete(&self) -> bool {
        false
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CStr;

    /// Every value of npumem's AscendCL enumerations is the header's value of that name, and
    /// the enumerations are complete.
    fn same_as_the_header(ours: &[(u32, &str)], header: &[(u32, &CStr)]) {
        let header: Vec<_> = header.iter().map(|&(v, n)| (v, n.to_str().unwrap())).collect();
        assert_eq!(ours, header.as_slice());
    }

    #[test]
    fn enumerations_are_the_headers() {
        same_as_the_header(&MemAttr::ALL.iter().map(|&a| (a as u32, a.name())).collect::<Vec<_>>(), MEM_ATTRS);
        same_as_the_header(&MemcpyKind::ALL.iter().map(|&k| (k as u32, k.name())).collect::<Vec<_>>(), MEMCPY_KINDS);
    }

    #[test]
    fn errors_name_the_runtime_code() {
        let e = acl_error(ACL_ERROR_RT_NO_STREAM_RESOURCE, "aclrtCreateStream()");
        assert_eq!(e.code, ErrorCode::RtMemoryAllocation);
        assert_eq!(e.message, "aclrtCreateStream() returned 207008 (ACL_ERROR_RT_NO_STREAM_RESOURCE)");
        let e = acl_error(123_456, "aclrtMemcpy()");
        assert_eq!(
            (e.code, e.message.as_str()),
            (ErrorCode::RtDrvInternal, "aclrtMemcpy() returned 123456 (an AscendCL error)")
        );
        use ErrorCode::*;
        let ours = [InvalidParam, RtParamInvalid, RtAddrUnaligned, RtInvalidHandle, FeatureUnsupported];
        for code in ours.into_iter().chain([RtMemoryAllocation, RtMemoryFree, RtDrvInternal]) {
            let value = code.value() as aclError;
            assert_eq!(npumem_ffi::name_of(ERRORS, value).unwrap().to_str(), Ok(code.name()));
            assert_eq!(nearest(value), code, "a code npumem has maps to itself");
        }
    }
}
