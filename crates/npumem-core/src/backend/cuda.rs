//! `CudaBackend`: the `Backend` trait over the CUDA driver API (`libcuda.so.1`) loaded at run
//! time.
//!
//! The library is `NPUMEM_CUDA_LIB` (a path; when set, the only place looked), else
//! `libcuda.so.1` on the loader path; a library that is missing or lacks one of the calls below
//! is an `ACL_ERROR_FEATURE_UNSUPPORTED` (200006) error naming what was searched. Resolved up
//! front: `cuInit`, `cuDeviceGet`, `cuDeviceGetCount`, `cuDeviceCanAccessPeer`,
//! `cuDevicePrimaryCtxRetain`, `cuCtxGetCurrent`,
//! `cuCtxSetCurrent`, `cuCtxSynchronize`, the VMM calls (`cuMemAddressReserve`, `cuMemCreate`,
//! `cuMemMap`, `cuMemSetAccess`, `cuMemUnmap`, `cuMemRelease`, `cuMemAddressFree`,
//! `cuMemGetAllocationGranularity`), `cuMemcpyHtoD` / `DtoH` / `DtoD`, `cuMemsetD8`,
//! `cuMemGetInfo`, `cuMemAllocHost` / `cuMemFreeHost` (the device's `malloc_host`),
//! `cuGetErrorName`, and the stream and event calls (the backend's [`RuntimeStreams`]), by the
//! symbol names `cuda.h` maps them to (`cuMemcpyHtoD_v2`, ...).
//!
//! Memory: the driver has one allocation granularity (2 MiB on current GPUs); it is the normal
//! page, huge pages are 2 MiB and giant pages 1 GiB (sizes that are multiples of it). On a GPU
//! whose granularity is 2 MiB, normal pages are 2 MiB: a physical allocation smaller than that
//! is refused (`ACL_ERROR_INVALID_PARAM`), as the driver would. A mapping is made readable and
//! writable with `cuMemSetAccess` right after `cuMemMap` (undone if that fails), for the device
//! and each peer that can access it (`cuDeviceCanAccessPeer`): VMM memory is accessible only to
//! the devices its mapping grants, whatever the contexts' peer access. Each call
//! makes the device's primary context current on the calling thread and the thread's own
//! context (or none) current again after ([`super::current`]).
//!
//! Errors: a `CUresult` becomes the nearest AscendCL code with the driver's name of the error
//! in the message (`CUDA_ERROR_OUT_OF_MEMORY` → 207001, `CUDA_ERROR_INVALID_VALUE` → 107000,
//! `CUDA_ERROR_INVALID_HANDLE` → 107017, `CUDA_ERROR_NOT_SUPPORTED` → 200006, ...; see
//! [`nearest`]).
//!
//! Invariants: every call is made with the backend's context current on the calling thread, and
//! leaves the thread's current context as it found it; a driver error changes nothing in npumem's
//! books (see `DriverBackend`).

use std::ffi::{CStr, c_char, c_void};

use npumem_ffi::cuda::*;

use super::current::{Bound, ThreadCurrent};
use super::driver::{Driver, DriverBackend, RawHandle};
use super::ffi::{self, Candidate, api};
use crate::acl::MemScope;
use crate::error::{AclError, ErrorCode, Result};
use crate::stream::RuntimeStreams;
use crate::stream::runtime::Handle;
use crate::units::{GIB, MIB, format_size};
use crate::vm::{PageKind, VA_WINDOW_START};

api! {
    /// The CUDA driver calls npumem uses, resolved up front.
    pub struct CudaApi {
        cuInit: PFN_cuInit = "cuInit",
        cuDeviceGet: PFN_cuDeviceGet = "cuDeviceGet",
        cuDeviceGetCount: PFN_cuDeviceGetCount = "cuDeviceGetCount",
        cuDeviceCanAccessPeer: PFN_cuDeviceCanAccessPeer = "cuDeviceCanAccessPeer",
        cuDevicePrimaryCtxRetain: PFN_cuDevicePrimaryCtxRetain = "cuDevicePrimaryCtxRetain",
        cuCtxGetCurrent: PFN_cuCtxGetCurrent = "cuCtxGetCurrent",
        cuCtxSetCurrent: PFN_cuCtxSetCurrent = "cuCtxSetCurrent",
        cuCtxSynchronize: PFN_cuCtxSynchronize = "cuCtxSynchronize",
        cuMemAddressReserve: PFN_cuMemAddressReserve = "cuMemAddressReserve",
        cuMemAddressFree: PFN_cuMemAddressFree = "cuMemAddressFree",
        cuMemCreate: PFN_cuMemCreate = "cuMemCreate",
        cuMemRelease: PFN_cuMemRelease = "cuMemRelease",
        cuMemMap: PFN_cuMemMap = "cuMemMap",
        cuMemUnmap: PFN_cuMemUnmap = "cuMemUnmap",
        cuMemSetAccess: PFN_cuMemSetAccess = "cuMemSetAccess",
        cuMemGetAllocationGranularity: PFN_cuMemGetAllocationGranularity = "cuMemGetAllocationGranularity",
        cuMemcpyHtoD: PFN_cuMemcpyHtoD_v2 = "cuMemcpyHtoD_v2",
        cuMemcpyDtoH: PFN_cuMemcpyDtoH_v2 = "cuMemcpyDtoH_v2",
        cuMemcpyDtoD: PFN_cuMemcpyDtoD_v2 = "cuMemcpyDtoD_v2",
        cuMemsetD8: PFN_cuMemsetD8_v2 = "cuMemsetD8_v2",
        cuMemGetInfo: PFN_cuMemGetInfo_v2 = "cuMemGetInfo_v2",
        cuMemAllocHost: PFN_cuMemAllocHost_v2 = "cuMemAllocHost_v2",
        cuMemFreeHost: PFN_cuMemFreeHost = "cuMemFreeHost",
        cuGetErrorName: PFN_cuGetErrorName = "cuGetErrorName",
        cuStreamCreate: PFN_cuStreamCreate = "cuStreamCreate",
        cuStreamDestroy: PFN_cuStreamDestroy_v2 = "cuStreamDestroy_v2",
        cuStreamSynchronize: PFN_cuStreamSynchronize = "cuStreamSynchronize",
        cuEventCreate: PFN_cuEventCreate = "cuEventCreate",
        cuEventDestroy: PFN_cuEventDestroy_v2 = "cuEventDestroy_v2",
        cuEventRecord: PFN_cuEventRecord = "cuEventRecord",
        cuEventQuery: PFN_cuEventQuery = "cuEventQuery",
        cuEventSynchronize: PFN_cuEventSynchronize = "cuEventSynchronize",
        cuStreamWaitEvent: PFN_cuStreamWaitEvent = "cuStreamWaitEvent",
        cuMemcpyAsync: PFN_cuMemcpyAsync = "cuMemcpyAsync",
        cuMemsetD8Async: PFN_cuMemsetD8Async = "cuMemsetD8Async",
    }
}

/// The AscendCL code nearest a `CUresult`.
pub fn nearest(result: CUresult) -> ErrorCode {
    match result {
        CUDA_ERROR_OUT_OF_MEMORY => ErrorCode::RtMemoryAllocation,
        CUDA_ERROR_INVALID_VALUE | CUDA_ERROR_ALREADY_MAPPED | CUDA_ERROR_NOT_MAPPED => ErrorCode::RtParamInvalid,
        CUDA_ERROR_INVALID_DEVICE => ErrorCode::InvalidParam,
        CUDA_ERROR_INVALID_HANDLE => ErrorCode::RtInvalidHandle,
        CUDA_ERROR_NO_DEVICE | CUDA_ERROR_NOT_PERMITTED | CUDA_ERROR_NOT_SUPPORTED => ErrorCode::FeatureUnsupported,
        CUDA_ERROR_MISALIGNED_ADDRESS => ErrorCode::RtAddrUnaligned,
        _ => ErrorCode::RtDrvInternal,
    }
}

fn ptr(addr: u64) -> *mut c_void {
    std::ptr::with_exposed_provenance_mut(addr as usize)
}

/// The CUDA driver, loaded and initialised: safe wrappers of its calls. Each needs the
/// device's context current on the calling thread ([`CudaRuntime::use_context`]).
pub struct CudaRuntime {
    api: CudaApi,
    path: String,
}

static RUNTIMES: std::sync::LazyLock<parking_lot::Mutex<Vec<&'static CudaRuntime>>> =
    std::sync::LazyLock::new(Default::default);

impl CudaRuntime {
    /// The places searched for the driver, in order.
    pub fn candidates() -> Vec<Candidate> {
        match ffi::env("NPUMEM_CUDA_LIB") {
            Some(path) => vec![Candidate::new("NPUMEM_CUDA_LIB", path)],
            None => vec![Candidate::new("the loader path", "libcuda.so.1")],
        }
    }

    /// Loads the driver from where the environment says ([`CudaRuntime::candidates`]).
    pub fn load() -> Result<&'static CudaRuntime> {
        Self::load_from(&Self::candidates())
    }

    /// Loads the driver from the first of `candidates` that opens (once per library path) and
    /// initialises it.
    pub fn load_from(candidates: &[Candidate]) -> Result<&'static CudaRuntime> {
        let opened = ffi::open(
            "the CUDA driver (libcuda.so.1)",
            candidates,
            "Install the NVIDIA driver, or set NPUMEM_CUDA_LIB to libcuda.so.1.",
        )?;
        let mut runtimes = RUNTIMES.lock();
        if let Some(&rt) = runtimes.iter().find(|rt| rt.path == opened.path) {
            return Ok(rt);
        }
        let rt = CudaRuntime { api: CudaApi::resolve(&opened, "the CUDA driver")?, path: opened.path };
        // SAFETY: a plain call; flags must be 0.
        rt.check(unsafe { (rt.api.cuInit)(0) }, || "cuInit(0)".into())?;
        let rt: &'static CudaRuntime = Box::leak(Box::new(rt));
        runtimes.push(rt);
        Ok(rt)
    }

    pub fn path(&self) -> &str {
        &self.path
    }

    /// The driver's name of `result` (`cuGetErrorName`).
    pub fn error_name(&self, result: CUresult) -> String {
        let mut name: *const c_char = std::ptr::null();
        // SAFETY: a valid out-pointer; on success the driver points it at a static string.
        if unsafe { (self.api.cuGetErrorName)(result, &mut name) } == CUDA_SUCCESS && !name.is_null() {
            // SAFETY: a NUL-terminated static string of the driver's.
            return unsafe { CStr::from_ptr(name) }.to_string_lossy().into_owned();
        }
        "an unknown CUresult".into()
    }

    /// `Ok` for `CUDA_SUCCESS`, else the nearest AscendCL error, naming `call` and the result.
    fn check(&self, result: CUresult, call: impl FnOnce() -> String) -> Result<()> {
        if result == CUDA_SUCCESS {
            return Ok(());
        }
        Err(AclError::new(nearest(result), format!("{} returned {} ({result})", call(), self.error_name(result))))
    }

    /// The primary context of `device` (retained; kept for the life of the process).
    pub fn primary_context(&self, device: i32) -> Result<u64> {
        let mut dev = 0;
        // SAFETY: valid out-pointers.
        self.check(unsafe { (self.api.cuDeviceGet)(&mut dev, device) }, || format!("cuDeviceGet({device})"))?;
        let mut ctx = std::ptr::null_mut();
        // SAFETY: as above.
        self.check(unsafe { (self.api.cuDevicePrimaryCtxRetain)(&mut ctx, dev) }, || {
            format!("cuDevicePrimaryCtxRetain({device})")
        })?;
        Ok(ctx.addr() as u64)
    }

    /// The other devices that can access `device`'s memory (`cuDeviceCanAccessPeer`), in order.
    pub fn peers_of(&self, device: i32) -> Result<Vec<i32>> {
        let mut count = 0;
        // SAFETY: a valid out-pointer.
        self.check(unsafe { (self.api.cuDeviceGetCount)(&mut count) }, || "cuDeviceGetCount()".into())?;
        let mut peers = Vec::new();
        for peer in (0..count).filter(|&p| p != device) {
            let mut can = 0;
            // SAFETY: a valid out-pointer; both ordinals are the driver's.
            let r = unsafe { (self.api.cuDeviceCanAccessPeer)(&mut can, peer, device) };
            self.check(r, || format!("cuDeviceCanAccessPeer({peer}, {device})"))?;
            if can == 1 {
                peers.push(peer);
            }
        }
        Ok(peers)
    }

    /// Makes `context` current on the calling thread (unless it is already), and keeps it
    /// current (see [`CudaRuntime::in_context`] for one call).
    pub fn use_context(&self, context: u64) -> Result<()> {
        if self.current_context() == Some(context) {
            return Ok(());
        }
        // SAFETY: a context the driver gave.
        self.check(unsafe { (self.api.cuCtxSetCurrent)(ptr(context)) }, || format!("cuCtxSetCurrent({context:#x})"))
    }

    /// The calling thread's current context (`cuCtxGetCurrent`), `None` when it has none.
    pub fn current_context(&self) -> Option<u64> {
        let mut current = std::ptr::null_mut();
        // SAFETY: a valid out-pointer.
        let r = unsafe { (self.api.cuCtxGetCurrent)(&mut current) };
        (r == CUDA_SUCCESS && !current.is_null()).then(|| current.addr() as u64)
    }

    /// `context` current on the calling thread while the guard lives, the thread's own context
    /// (or none) current again after.
    pub fn in_context(&'static self, context: u64) -> Result<Bound<CudaRuntime>> {
        Bound::new(self, context)
    }

    fn prop(device: i32) -> CUmemAllocationProp {
        CUmemAllocationProp {
            type_: CU_MEM_ALLOCATION_TYPE_PINNED,
            requestedHandleTypes: CU_MEM_HANDLE_TYPE_NONE,
            location: CUmemLocation { type_: CU_MEM_LOCATION_TYPE_DEVICE, id: device },
            win32HandleMetaData: std::ptr::null_mut(),
            allocFlags: CUmemAllocationPropAllocFlags::default(),
        }
    }

    /// `cuMemGetAllocationGranularity` (minimum) of pinned memory on `device`.
    pub fn granularity(&self, device: i32) -> Result<u64> {
        let mut g = 0usize;
        let prop = Self::prop(device);
        // SAFETY: valid pointers.
        let r = unsafe { (self.api.cuMemGetAllocationGranularity)(&mut g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) };
        self.check(r, || format!("cuMemGetAllocationGranularity(device {device})"))?;
        Ok(g as u64)
    }

    pub fn reserve(&self, size: u64, align: u64, hint: Option<u64>) -> Result<u64> {
        let mut va = 0u64;
        // SAFETY: a valid out-pointer; the hint is only a number to the driver.
        let r = unsafe { (self.api.cuMemAddressReserve)(&mut va, size as usize, align as usize, hint.unwrap_or(0), 0) };
        self.check(r, || format!("cuMemAddressReserve({}, align {})", format_size(size), format_size(align)))?;
        Ok(va)
    }

    pub fn release(&self, va: u64, size: u64) -> Result<()> {
        // SAFETY: the driver checks the range.
        self.check(unsafe { (self.api.cuMemAddressFree)(va, size as usize) }, || {
            format!("cuMemAddressFree({va:#x}, {})", format_size(size))
        })
    }

    pub fn create(&self, size: u64, device: i32) -> Result<RawHandle> {
        let mut h = 0u64;
        let prop = Self::prop(device);
        // SAFETY: valid pointers.
        let r = unsafe { (self.api.cuMemCreate)(&mut h, size as usize, &prop, 0) };
        self.check(r, || format!("cuMemCreate({})", format_size(size)))?;
        Ok(h)
    }

    pub fn release_handle(&self, handle: RawHandle) -> Result<()> {
        // SAFETY: the driver checks the handle.
        self.check(unsafe { (self.api.cuMemRelease)(handle) }, || format!("cuMemRelease({handle:#x})"))
    }

    /// `cuMemMap` then `cuMemSetAccess` (read-write for each of `devices`: the owner and the
    /// peers that can access its memory); the map is undone when the access cannot be set.
    pub fn map(&self, va: u64, size: u64, handle: RawHandle, devices: &[i32]) -> Result<()> {
        // SAFETY: the driver checks the range and the handle.
        let r = unsafe { (self.api.cuMemMap)(va, size as usize, 0, handle, 0) };
        self.check(r, || format!("cuMemMap({va:#x}, {}, handle {handle:#x})", format_size(size)))?;
        let descs: Vec<CUmemAccessDesc> = devices
            .iter()
            .map(|&id| CUmemAccessDesc {
                location: CUmemLocation { type_: CU_MEM_LOCATION_TYPE_DEVICE, id },
                flags: CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
            })
            .collect();
        // SAFETY: `descs.len()` valid descriptors.
        let r = unsafe { (self.api.cuMemSetAccess)(va, size as usize, descs.as_ptr(), descs.len()) };
        self.check(r, || format!("cuMemSetAccess({va:#x}, {})", format_size(size))).inspect_err(|_| {
            let _ = self.unmap(va, size);
        })
    }

    pub fn unmap(&self, va: u64, size: u64) -> Result<()> {
        // SAFETY: the driver checks the range.
        self.check(unsafe { (self.api.cuMemUnmap)(va, size as usize) }, || {
            format!("cuMemUnmap({va:#x}, {})", format_size(size))
        })
    }

    pub fn read(&self, va: u64, out: &mut [u8]) -> Result<()> {
        // SAFETY: `out` is valid for its length; the driver checks the device range.
        let r = unsafe { (self.api.cuMemcpyDtoH)(out.as_mut_ptr().cast(), va, out.len()) };
        self.check(r, || format!("cuMemcpyDtoH({va:#x}, {} bytes)", out.len()))
    }

    pub fn write(&self, va: u64, data: &[u8]) -> Result<()> {
        // SAFETY: `data` is valid for its length; the driver checks the device range.
        let r = unsafe { (self.api.cuMemcpyHtoD)(va, data.as_ptr().cast(), data.len()) };
        self.check(r, || format!("cuMemcpyHtoD({va:#x}, {} bytes)", data.len()))
    }

    /// A device-to-device copy, complete when this returns.
    pub fn copy(&self, dst: u64, src: u64, count: u64) -> Result<()> {
        // SAFETY: device addresses, which the driver checks.
        let r = unsafe { (self.api.cuMemcpyDtoD)(dst, src, count as usize) };
        self.check(r, || format!("cuMemcpyDtoD({dst:#x}, {src:#x}, {count} bytes)"))?;
        self.finish_legacy(|| format!("cuMemcpyDtoD({dst:#x}, {src:#x}, {count} bytes)"))
    }

    /// A memset of device memory, complete when this returns.
    pub fn memset(&self, va: u64, value: u8, count: u64) -> Result<()> {
        // SAFETY: a device address, which the driver checks.
        let r = unsafe { (self.api.cuMemsetD8)(va, value, count as usize) };
        self.check(r, || format!("cuMemsetD8({va:#x}, {value}, {count} bytes)"))?;
        self.finish_legacy(|| format!("cuMemsetD8({va:#x}, {value}, {count} bytes)"))
    }

    /// Waits for the legacy default stream: `cuMemsetD8` and `cuMemcpyDtoD` run on it and may
    /// return before they complete (`cuda.h`'s `\note_memset`; device-to-device copies do no
    /// host synchronisation), and non-blocking streams (npumem's) do not wait for it.
    fn finish_legacy(&self, call: impl FnOnce() -> String) -> Result<()> {
        // SAFETY: the legacy default stream's handle, valid in every context.
        let r = unsafe { (self.api.cuStreamSynchronize)(ptr(CU_STREAM_LEGACY as u64)) };
        self.check(r, || format!("cuStreamSynchronize(CU_STREAM_LEGACY) after {}", call()))
    }

    pub fn mem_info(&self) -> Result<(u64, u64)> {
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: valid out-pointers.
        self.check(unsafe { (self.api.cuMemGetInfo)(&mut free, &mut total) }, || "cuMemGetInfo()".into())?;
        Ok((free as u64, total as u64))
    }

    /// `cuMemAllocHost`: `size` bytes of page-locked host memory.
    pub fn malloc_host(&self, size: u64) -> Result<u64> {
        let mut p = std::ptr::null_mut();
        // SAFETY: a valid out-pointer.
        self.check(unsafe { (self.api.cuMemAllocHost)(&mut p, size as usize) }, || {
            format!("cuMemAllocHost({})", format_size(size))
        })?;
        Ok(p.addr() as u64)
    }

    /// `cuMemFreeHost` of a block `malloc_host` returned.
    pub fn free_host(&self, p: u64) -> Result<()> {
        // SAFETY: the driver checks the pointer is its own.
        self.check(unsafe { (self.api.cuMemFreeHost)(ptr(p)) }, || format!("cuMemFreeHost({p:#x})"))
    }

    pub fn synchronize_context(&self) -> Result<()> {
        // SAFETY: a plain call.
        self.check(unsafe { (self.api.cuCtxSynchronize)() }, || "cuCtxSynchronize()".into())
    }
}

impl ThreadCurrent for CudaRuntime {
    fn current(&self) -> Option<u64> {
        self.current_context()
    }

    fn make_current(&self, target: u64) -> Result<()> {
        self.use_context(target)
    }

    fn restore(&self, previous: Option<u64>) {
        // SAFETY: the context the thread had, or NULL (no context), both valid for the call.
        unsafe { (self.api.cuCtxSetCurrent)(ptr(previous.unwrap_or(0))) };
    }
}

/// The runtime's streams and events, handles as integers (0: the default stream); the device
/// must be current on the calling thread.
impl CudaRuntime {
    pub fn create_stream(&self) -> Result<Handle> {
        let mut s = std::ptr::null_mut();
        // SAFETY: a valid out-pointer; non-blocking: no implicit sync with stream 0.
        self.check(unsafe { (self.api.cuStreamCreate)(&mut s, CU_STREAM_NON_BLOCKING) }, || "cuStreamCreate()".into())?;
        Ok(s.addr() as u64)
    }

    pub fn destroy_stream(&self, stream: Handle) -> Result<()> {
        // SAFETY: the driver checks the handle.
        self.check(unsafe { (self.api.cuStreamDestroy)(ptr(stream)) }, || format!("cuStreamDestroy({stream:#x})"))
    }

    pub fn synchronize_stream(&self, stream: Handle) -> Result<()> {
        // SAFETY: the driver checks the handle.
        self.check(unsafe { (self.api.cuStreamSynchronize)(ptr(stream)) }, || {
            format!("cuStreamSynchronize({stream:#x})")
        })
    }

    pub fn create_event(&self) -> Result<Handle> {
        let mut e = std::ptr::null_mut();
        // SAFETY: a valid out-pointer; events for ordering only, untimed.
        self.check(unsafe { (self.api.cuEventCreate)(&mut e, CU_EVENT_DISABLE_TIMING) }, || "cuEventCreate()".into())?;
        Ok(e.addr() as u64)
    }

    pub fn destroy_event(&self, event: Handle) -> Result<()> {
        // SAFETY: the driver checks the handle.
        self.check(unsafe { (self.api.cuEventDestroy)(ptr(event)) }, || format!("cuEventDestroy({event:#x})"))
    }

    pub fn record_event(&self, event: Handle, stream: Handle) -> Result<()> {
        // SAFETY: the driver checks both handles.
        self.check(unsafe { (self.api.cuEventRecord)(ptr(event), ptr(stream)) }, || {
            format!("cuEventRecord({event:#x}, {stream:#x})")
        })
    }

    pub fn query_event(&self, event: Handle) -> Result<bool> {
        // SAFETY: the driver checks the handle.
        match unsafe { (self.api.cuEventQuery)(ptr(event)) } {
            CUDA_ERROR_NOT_READY => Ok(false),
            r => self.check(r, || format!("cuEventQuery({event:#x})")).map(|()| true),
        }
    }

    pub fn synchronize_event(&self, event: Handle) -> Result<()> {
        // SAFETY: the driver checks the handle.
        self.check(unsafe { (self.api.cuEventSynchronize)(ptr(event)) }, || format!("cuEventSynchronize({event:#x})"))
    }

    pub fn stream_wait_event(&self, stream: Handle, event: Handle) -> Result<()> {
        // SAFETY: the driver checks both handles.
        self.check(unsafe { (self.api.cuStreamWaitEvent)(ptr(stream), ptr(event), 0) }, || {
            format!("cuStreamWaitEvent({stream:#x}, {event:#x})")
        })
    }

    /// Queues a copy of `count` bytes on `stream` (device or host addresses, either way).
    ///
    /// # Safety
    /// Host memory among `dst` and `src` must stay valid until the copy has run (synchronize
    /// the stream, or an event recorded after it, before freeing it).
    pub unsafe fn memcpy_async(&self, dst: u64, src: u64, count: u64, stream: Handle) -> Result<()> {
        // SAFETY: the caller's contract for host memory; the driver checks device memory.
        let r = unsafe { (self.api.cuMemcpyAsync)(dst, src, count as usize, ptr(stream)) };
        self.check(r, || format!("cuMemcpyAsync({dst:#x}, {src:#x}, {count} bytes, {stream:#x})"))
    }

    /// `cuMemsetD8Async` of `count` bytes at device address `dst`, queued on `stream`.
    pub fn memset_async(&self, dst: u64, value: u8, count: u64, stream: Handle) -> Result<()> {
        // SAFETY: the driver checks the device address and the stream.
        let r = unsafe { (self.api.cuMemsetD8Async)(dst, value, count as usize, ptr(stream)) };
        self.check(r, || format!("cuMemsetD8Async({dst:#x}, {value}, {count} bytes, {stream:#x})"))
    }
}

/// The CUDA driver on one device (its primary context), for a [`DriverBackend`]. Its device
/// addresses are one VA window it reserves when it opens (`cuMemAddressReserve`, asked for at
/// npumem's 16 TiB, as large as the host backend's window for the same capacity, and halved
/// while the driver cannot give that) and releases when it goes; the backend places every reservation inside it, so an address is the device's exactly
/// when it is in the window (as on AscendCL), freed or not.
pub struct CudaDriver {
    rt: &'static CudaRuntime,
    device: i32,
    context: u64,
    window: (u64, u64),
    /// The devices every mapping is made accessible to: this one, then its peers (peer access
    /// to VMM memory is the mapping's `cuMemSetAccess` grant, not the context's).
    access: Vec<i32>,
}

impl CudaDriver {
    /// The driver (loaded on first use, from where the environment says) on `device`, for a
    /// backend that will hold up to `capacity` bytes (default: the device's memory; it sizes the
    /// address window).
    pub fn open(device: i32, capacity: Option<u64>) -> Result<CudaDriver> {
        Self::new(CudaRuntime::load()?, device, capacity)
    }

    /// `rt` on `device` (its primary context), `capacity` as in [`CudaDriver::open`].
    pub fn new(rt: &'static CudaRuntime, device: i32, capacity: Option<u64>) -> Result<CudaDriver> {
        let context = rt.primary_context(device)?;
        let rt_bound = rt.in_context(context)?;
        let capacity = match capacity {
            Some(c) => c,
            None => rt_bound.mem_info()?.1,
        };
        let access: Vec<i32> = std::iter::once(device).chain(rt.peers_of(device)?).collect();
        let mut size = super::host::window_size(capacity);
        loop {
            match rt_bound.reserve(size, GIB, Some(VA_WINDOW_START)) {
                Ok(start) => {
                    let window = (start, start + size);
                    return Ok(CudaDriver { rt, device, context, window, access });
                }
                // Too large for the driver (out of memory, or an invalid value): a smaller one.
                Err(e)
                    if size > 16 * GIB
                        && matches!(e.code, ErrorCode::RtMemoryAllocation | ErrorCode::RtParamInvalid) =>
                {
                    size /= 2
                }
                Err(e) => {
                    return Err(AclError::new(
                        e.code,
                        format!("cannot reserve the device's address window: {}", e.message),
                    ));
                }
            }
        }
    }

    pub fn runtime(&self) -> &'static CudaRuntime {
        self.rt
    }

    /// The driver with the device's context current for one call.
    fn bound(&self) -> Result<Bound<CudaRuntime>> {
        self.rt.in_context(self.context)
    }
}

impl Driver for CudaDriver {
    fn name(&self) -> &'static str {
        "cuda"
    }

    fn granularity(&self, kind: PageKind) -> Result<u64> {
        let g = self.bound()?.granularity(self.device)?;
        Ok(match kind {
            PageKind::Normal => g,
            PageKind::Huge if g <= 2 * MIB => 2 * MIB,
            PageKind::Giant if g <= GIB => GIB,
            _ => g,
        })
    }

    fn window(&self) -> (u64, u64) {
        self.window
    }

    fn owns_window(&self) -> bool {
        true
    }

    fn holds_window(&self) -> bool {
        true
    }

    fn reserve(&self, size: u64, align: u64, hint: Option<u64>) -> Result<u64> {
        let rt = self.bound()?;
        let va = rt.reserve(size, align, hint)?;
        if hint.is_some_and(|h| h != va) {
            // The driver takes the address as a hint; npumem's contract asks for it exactly.
            let _ = rt.release(va, size);
            return Err(AclError::invalid_param(format!(
                "the range {:#x}+{} is not free; pass no address to let the driver choose",
                hint.unwrap_or(0),
                format_size(size)
            )));
        }
        Ok(va)
    }

    fn release(&self, va: u64, size: u64) -> Result<()> {
        self.bound()?.release(va, size)
    }

    fn create(&self, size: u64, _kind: PageKind) -> Result<RawHandle> {
        self.bound()?.create(size, self.device)
    }

    fn free(&self, handle: RawHandle) -> Result<()> {
        self.bound()?.release_handle(handle)
    }

    fn map(&self, va: u64, size: u64, handle: RawHandle) -> Result<()> {
        self.bound()?.map(va, size, handle, &self.access)
    }

    fn unmap(&self, va: u64, size: u64) -> Result<()> {
        self.bound()?.unmap(va, size)
    }

    fn read(&self, va: u64, out: &mut [u8]) -> Result<()> {
        self.bound()?.read(va, out)
    }

    fn write(&self, va: u64, data: &[u8]) -> Result<()> {
        self.bound()?.write(va, data)
    }

    fn fill(&self, va: u64, value: u8, count: u64) -> Result<()> {
        self.bound()?.memset(va, value, count)
    }

    fn copy(&self, dst: u64, src: u64, count: u64) -> Result<()> {
        self.bound()?.copy(dst, src, count)
    }

    fn mem_info(&self, _scope: MemScope) -> Result<(u64, u64)> {
        self.bound()?.mem_info()
    }

    fn malloc_host(&self, size: u64) -> Result<u64> {
        self.bound()?.malloc_host(size)
    }

    fn free_host(&self, addr: u64) -> Result<()> {
        self.bound()?.free_host(addr)
    }

    fn fresh_event_complete(&self) -> bool {
        true
    }
}

impl Drop for CudaDriver {
    fn drop(&mut self) {
        // The backend has unmapped everything in the window by now (its books go first).
        if let Ok(rt) = self.bound() {
            let _ = rt.release(self.window.0, self.window.1 - self.window.0);
        }
    }
}

// The CUDA driver's own streams and events: what the device orders stream-ordered reuse and
// async copies on.
super::driver::runtime_streams!(CudaDriver, synchronize_context);

/// The `Backend` over the CUDA driver.
pub type CudaBackend = DriverBackend<CudaDriver>;

impl CudaBackend {
    /// A backend on CUDA `device` that may hold `capacity` bytes (default: the device's memory).
    pub fn open(device: i32, capacity: Option<u64>) -> Result<CudaBackend> {
        Self::with_driver(CudaDriver::open(device, capacity)?, capacity)
    }

    /// A backend over `driver` (capacity as in [`CudaBackend::open`]).
    pub fn with_driver(driver: CudaDriver, capacity: Option<u64>) -> Result<CudaBackend> {
        let capacity = match capacity {
            Some(c) => c,
            None => driver.mem_info(MemScope::All)?.1,
        };
        DriverBackend::new(driver, capacity)
    }
}
