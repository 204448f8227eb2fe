//! The CUDA driver API: the declarations of `cuda.h` (CUDA 12.x) for initialisation, primary
//! contexts, virtual memory management, copies, memsets, memory information, streams, events and
//! error names.
//!
//! Rules:
//! - only what npumem loads or its stand-in exports is declared;
//! - a `PFN_` is named for the symbol `cuda.h` maps the call to (`cuMemcpyHtoD` is
//!   `cuMemcpyHtoD_v2`), which is what a library exports and what the loader resolves;
//! - handles (`CUcontext`, `CUstream`, `CUevent`) are opaque pointers the driver hands out;
//!   `CUdeviceptr` and `CUmemGenericAllocationHandle` are 64-bit integers.

use std::ffi::{c_char, c_int, c_uint, c_ulonglong, c_void};

c_enum! {
    /// `CUresult` (`cudaError_enum`: `CUDA_SUCCESS` and the codes npumem knows).
    CUresult = c_int, ERRORS {
        CUDA_SUCCESS = 0,
        CUDA_ERROR_INVALID_VALUE = 1,
        CUDA_ERROR_OUT_OF_MEMORY = 2,
        CUDA_ERROR_NOT_INITIALIZED = 3,
        CUDA_ERROR_NO_DEVICE = 100,
        CUDA_ERROR_INVALID_DEVICE = 101,
        CUDA_ERROR_INVALID_CONTEXT = 201,
        CUDA_ERROR_ALREADY_MAPPED = 208,
        CUDA_ERROR_NOT_MAPPED = 211,
        CUDA_ERROR_INVALID_HANDLE = 400,
        CUDA_ERROR_NOT_READY = 600,
        CUDA_ERROR_ILLEGAL_ADDRESS = 700,
        CUDA_ERROR_MISALIGNED_ADDRESS = 716,
        CUDA_ERROR_NOT_PERMITTED = 800,
        CUDA_ERROR_NOT_SUPPORTED = 801,
        CUDA_ERROR_UNKNOWN = 999,
    }
}

c_enum! {
    /// `CUmemAllocationType`.
    CUmemAllocationType = c_uint, MEM_ALLOCATION_TYPES {
        CU_MEM_ALLOCATION_TYPE_INVALID = 0,
        CU_MEM_ALLOCATION_TYPE_PINNED = 1,
    }
}

c_enum! {
    /// `CUmemAllocationHandleType` (flags).
    CUmemAllocationHandleType = c_uint, MEM_HANDLE_TYPES {
        CU_MEM_HANDLE_TYPE_NONE = 0,
        CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR = 1,
        CU_MEM_HANDLE_TYPE_WIN32 = 2,
        CU_MEM_HANDLE_TYPE_WIN32_KMT = 4,
        CU_MEM_HANDLE_TYPE_FABRIC = 8,
    }
}

c_enum! {
    /// `CUmemLocationType`.
    CUmemLocationType = c_uint, MEM_LOCATION_TYPES {
        CU_MEM_LOCATION_TYPE_INVALID = 0,
        CU_MEM_LOCATION_TYPE_DEVICE = 1,
        CU_MEM_LOCATION_TYPE_HOST = 2,
        CU_MEM_LOCATION_TYPE_HOST_NUMA = 3,
        CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT = 4,
    }
}

c_enum! {
    /// `CUmemAccess_flags`.
    CUmemAccess_flags = c_uint, MEM_ACCESS_FLAGS {
        CU_MEM_ACCESS_FLAGS_PROT_NONE = 0,
        CU_MEM_ACCESS_FLAGS_PROT_READ = 1,
        CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3,
    }
}

c_enum! {
    /// `CUmemAllocationGranularity_flags`.
    CUmemAllocationGranularity_flags = c_uint, MEM_GRANULARITY_FLAGS {
        CU_MEM_ALLOC_GRANULARITY_MINIMUM = 0,
        CU_MEM_ALLOC_GRANULARITY_RECOMMENDED = 1,
    }
}

c_enum! {
    /// `CUstream_flags`.
    CUstream_flags = c_uint, STREAM_FLAGS {
        CU_STREAM_DEFAULT = 0,
        CU_STREAM_NON_BLOCKING = 1,
    }
}

c_enum! {
    /// `CUevent_flags`.
    CUevent_flags = c_uint, EVENT_FLAGS {
        CU_EVENT_DEFAULT = 0,
        CU_EVENT_BLOCKING_SYNC = 1,
        CU_EVENT_DISABLE_TIMING = 2,
        CU_EVENT_INTERPROCESS = 4,
    }
}

/// `CU_STREAM_LEGACY` (`((CUstream)0x1)`): the legacy default stream.
pub const CU_STREAM_LEGACY: usize = 0x1;
/// `CU_STREAM_PER_THREAD` (`((CUstream)0x2)`): the per-thread default stream.
pub const CU_STREAM_PER_THREAD: usize = 0x2;

/// `CUdevice`: a device ordinal.
pub type CUdevice = c_int;
/// `CUdeviceptr`: a device address.
pub type CUdeviceptr = c_ulonglong;
/// `CUmemGenericAllocationHandle`: a physical allocation.
pub type CUmemGenericAllocationHandle = c_ulonglong;
/// `CUcontext`.
pub type CUcontext = *mut c_void;
/// `CUstream` (NULL, `CU_STREAM_LEGACY`, `CU_STREAM_PER_THREAD`: a default stream).
pub type CUstream = *mut c_void;
/// `CUevent`.
pub type CUevent = *mut c_void;

/// `CUmemLocation`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CUmemLocation {
    pub type_: CUmemLocationType,
    pub id: c_int,
}

/// The `allocFlags` member of `CUmemAllocationProp` (an anonymous struct in `cuda.h`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CUmemAllocationPropAllocFlags {
    pub compressionType: u8,
    pub gpuDirectRDMACapable: u8,
    pub usage: u16,
    pub reserved: [u8; 4],
}

/// `CUmemAllocationProp`, the properties of a `cuMemCreate` allocation.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CUmemAllocationProp {
    pub type_: CUmemAllocationType,
    pub requestedHandleTypes: CUmemAllocationHandleType,
    pub location: CUmemLocation,
    pub win32HandleMetaData: *mut c_void,
    pub allocFlags: CUmemAllocationPropAllocFlags,
}

/// `CUmemAccessDesc`, one location's access to a mapped range.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CUmemAccessDesc {
    pub location: CUmemLocation,
    pub flags: CUmemAccess_flags,
}

pub type PFN_cuInit = unsafe extern "C" fn(Flags: c_uint) -> CUresult;
pub type PFN_cuDriverGetVersion = unsafe extern "C" fn(driverVersion: *mut c_int) -> CUresult;
pub type PFN_cuDeviceGetCount = unsafe extern "C" fn(count: *mut c_int) -> CUresult;
pub type PFN_cuDeviceGet = unsafe extern "C" fn(device: *mut CUdevice, ordinal: c_int) -> CUresult;
pub type PFN_cuDeviceCanAccessPeer =
    unsafe extern "C" fn(canAccessPeer: *mut c_int, dev: CUdevice, peerDev: CUdevice) -> CUresult;
pub type PFN_cuDevicePrimaryCtxRetain = unsafe extern "C" fn(pctx: *mut CUcontext, dev: CUdevice) -> CUresult;
pub type PFN_cuDevicePrimaryCtxRelease_v2 = unsafe extern "C" fn(dev: CUdevice) -> CUresult;
pub type PFN_cuCtxGetCurrent = unsafe extern "C" fn(pctx: *mut CUcontext) -> CUresult;
pub type PFN_cuCtxSetCurrent = unsafe extern "C" fn(ctx: CUcontext) -> CUresult;
pub type PFN_cuCtxSynchronize = unsafe extern "C" fn() -> CUresult;
pub type PFN_cuMemAddressReserve = unsafe extern "C" fn(
    ptr: *mut CUdeviceptr,
    size: usize,
    alignment: usize,
    addr: CUdeviceptr,
    flags: c_ulonglong,
) -> CUresult;
pub type PFN_cuMemAddressFree = unsafe extern "C" fn(ptr: CUdeviceptr, size: usize) -> CUresult;
pub type PFN_cuMemCreate = unsafe extern "C" fn(
    handle: *mut CUmemGenericAllocationHandle,
    size: usize,
    prop: *const CUmemAllocationProp,
    flags: c_ulonglong,
) -> CUresult;
pub type PFN_cuMemRelease = unsafe extern "C" fn(handle: CUmemGenericAllocationHandle) -> CUresult;
pub type PFN_cuMemMap = unsafe extern "C" fn(
    ptr: CUdeviceptr,
    size: usize,
    offset: usize,
    handle: CUmemGenericAllocationHandle,
    flags: c_ulonglong,
) -> CUresult;
pub type PFN_cuMemUnmap = unsafe extern "C" fn(ptr: CUdeviceptr, size: usize) -> CUresult;
pub type PFN_cuMemSetAccess =
    unsafe extern "C" fn(ptr: CUdeviceptr, size: usize, desc: *const CUmemAccessDesc, count: usize) -> CUresult;
pub type PFN_cuMemGetAllocationGranularity = unsafe extern "C" fn(
    granularity: *mut usize,
    prop: *const CUmemAllocationProp,
    option: CUmemAllocationGranularity_flags,
) -> CUresult;
pub type PFN_cuMemcpyHtoD_v2 =
    unsafe extern "C" fn(dstDevice: CUdeviceptr, srcHost: *const c_void, ByteCount: usize) -> CUresult;
pub type PFN_cuMemcpyDtoH_v2 =
    unsafe extern "C" fn(dstHost: *mut c_void, srcDevice: CUdeviceptr, ByteCount: usize) -> CUresult;
pub type PFN_cuMemcpyDtoD_v2 =
    unsafe extern "C" fn(dstDevice: CUdeviceptr, srcDevice: CUdeviceptr, ByteCount: usize) -> CUresult;
pub type PFN_cuMemcpyHtoDAsync_v2 = unsafe extern "C" fn(
    dstDevice: CUdeviceptr,
    srcHost: *const c_void,
    ByteCount: usize,
    hStream: CUstream,
) -> CUresult;
pub type PFN_cuMemcpyDtoHAsync_v2 =
    unsafe extern "C" fn(dstHost: *mut c_void, srcDevice: CUdeviceptr, ByteCount: usize, hStream: CUstream) -> CUresult;
pub type PFN_cuMemcpyDtoDAsync_v2 = unsafe extern "C" fn(
    dstDevice: CUdeviceptr,
    srcDevice: CUdeviceptr,
    ByteCount: usize,
    hStream: CUstream,
) -> CUresult;
pub type PFN_cuMemcpyAsync =
    unsafe extern "C" fn(dst: CUdeviceptr, src: CUdeviceptr, ByteCount: usize, hStream: CUstream) -> CUresult;
pub type PFN_cuMemsetD8_v2 = unsafe extern "C" fn(dstDevice: CUdeviceptr, uc: u8, N: usize) -> CUresult;
pub type PFN_cuMemsetD8Async =
    unsafe extern "C" fn(dstDevice: CUdeviceptr, uc: u8, N: usize, hStream: CUstream) -> CUresult;
pub type PFN_cuMemGetInfo_v2 = unsafe extern "C" fn(free: *mut usize, total: *mut usize) -> CUresult;
pub type PFN_cuMemAlloc_v2 = unsafe extern "C" fn(dptr: *mut CUdeviceptr, bytesize: usize) -> CUresult;
pub type PFN_cuMemFree_v2 = unsafe extern "C" fn(dptr: CUdeviceptr) -> CUresult;
pub type PFN_cuMemAllocHost_v2 = unsafe extern "C" fn(pp: *mut *mut c_void, bytesize: usize) -> CUresult;
pub type PFN_cuMemFreeHost = unsafe extern "C" fn(p: *mut c_void) -> CUresult;
pub type PFN_cuStreamCreate = unsafe extern "C" fn(phStream: *mut CUstream, Flags: c_uint) -> CUresult;
pub type PFN_cuStreamDestroy_v2 = unsafe extern "C" fn(hStream: CUstream) -> CUresult;
pub type PFN_cuStreamSynchronize = unsafe extern "C" fn(hStream: CUstream) -> CUresult;
pub type PFN_cuStreamQuery = unsafe extern "C" fn(hStream: CUstream) -> CUresult;
pub type PFN_cuStreamWaitEvent = unsafe extern "C" fn(hStream: CUstream, hEvent: CUevent, Flags: c_uint) -> CUresult;
pub type PFN_cuEventCreate = unsafe extern "C" fn(phEvent: *mut CUevent, Flags: c_uint) -> CUresult;
pub type PFN_cuEventDestroy_v2 = unsafe extern "C" fn(hEvent: CUevent) -> CUresult;
pub type PFN_cuEventRecord = unsafe extern "C" fn(hEvent: CUevent, hStream: CUstream) -> CUresult;
pub type PFN_cuEventQuery = unsafe extern "C" fn(hEvent: CUevent) -> CUresult;
pub type PFN_cuEventSynchronize = unsafe extern "C" fn(hEvent: CUevent) -> CUresult;
pub type PFN_cuGetErrorName = unsafe extern "C" fn(error: CUresult, pStr: *mut *const c_char) -> CUresult;
pub type PFN_cuGetErrorString = unsafe extern "C" fn(error: CUresult, pStr: *mut *const c_char) -> CUresult;

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{align_of, offset_of, size_of};

    /// The layouts `cuda.h` (12.x) gives on LP64.
    #[test]
    fn layouts_match_cuda_h() {
        assert_eq!((size_of::<CUmemLocation>(), align_of::<CUmemLocation>()), (8, 4));
        assert_eq!((offset_of!(CUmemLocation, type_), offset_of!(CUmemLocation, id)), (0, 4));
        assert_eq!((size_of::<CUmemAccessDesc>(), align_of::<CUmemAccessDesc>()), (12, 4));
        assert_eq!((offset_of!(CUmemAccessDesc, location), offset_of!(CUmemAccessDesc, flags)), (0, 8));
        assert_eq!((size_of::<CUmemAllocationPropAllocFlags>(), align_of::<CUmemAllocationPropAllocFlags>()), (8, 2));
        assert_eq!((size_of::<CUmemAllocationProp>(), align_of::<CUmemAllocationProp>()), (32, 8));
        let offsets = [
            offset_of!(CUmemAllocationProp, type_),
            offset_of!(CUmemAllocationProp, requestedHandleTypes),
            offset_of!(CUmemAllocationProp, location),
            offset_of!(CUmemAllocationProp, win32HandleMetaData),
            offset_of!(CUmemAllocationProp, allocFlags),
        ];
        assert_eq!(offsets, [0, 4, 8, 16, 24]);
        let flags = [
            offset_of!(CUmemAllocationPropAllocFlags, compressionType),
            offset_of!(CUmemAllocationPropAllocFlags, gpuDirectRDMACapable),
            offset_of!(CUmemAllocationPropAllocFlags, usage),
            offset_of!(CUmemAllocationPropAllocFlags, reserved),
        ];
        assert_eq!(flags, [0, 1, 2, 4]);
    }

    #[test]
    fn error_names_are_the_constants() {
        assert_eq!(crate::name_of(ERRORS, CUDA_ERROR_NOT_READY), Some(c"CUDA_ERROR_NOT_READY"));
        assert_eq!(crate::name_of(ERRORS, 12345), None);
        let codes: Vec<_> = ERRORS.iter().map(|e| e.0).collect();
        assert!(codes.is_sorted() && codes.windows(2).all(|w| w[0] != w[1]), "codes ascend, none twice");
    }
}
