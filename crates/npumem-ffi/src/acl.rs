//! AscendCL: the declarations of `acl_rt.h` (the VMM, copy, memory-information, host-memory,
//! stream and event calls) and the error codes of `acl_base_rt.h` and `rt_error_codes.h`, as in
//! `hicann/runtime` (`include/external/acl/`, CANN 8, `ACL_MINOR_VERSION` 17).
//!
//! Rules:
//! - only what npumem loads or its stand-in exports is declared;
//! - a handle (`aclrtDrvMemHandle`, `aclrtStream`, `aclrtEvent`) is an opaque pointer the
//!   runtime hands out: passed back, never dereferenced.

use std::ffi::{c_char, c_int, c_uint, c_void};

c_enum! {
    /// `aclError` (`ACL_SUCCESS` and the codes npumem knows).
    aclError = c_int, ERRORS {
        ACL_SUCCESS = 0,
        ACL_ERROR_INVALID_PARAM = 100_000,
        ACL_ERROR_UNINITIALIZE = 100_001,
        ACL_ERROR_REPEAT_INITIALIZE = 100_002,
        ACL_ERROR_RT_PARAM_INVALID = 107_000,
        ACL_ERROR_RT_INVALID_DEVICEID = 107_001,
        ACL_ERROR_RT_CONTEXT_NULL = 107_002,
        ACL_ERROR_RT_STREAM_CONTEXT = 107_003,
        ACL_ERROR_RT_ADDR_UNALIGNED = 107_008,
        ACL_ERROR_RT_INVALID_MEMORY_TYPE = 107_016,
        ACL_ERROR_RT_INVALID_HANDLE = 107_017,
        ACL_ERROR_RT_INVALID_MALLOC_TYPE = 107_018,
        ACL_ERROR_BAD_ALLOC = 200_000,
        ACL_ERROR_API_NOT_SUPPORT = 200_001,
        ACL_ERROR_INVALID_DEVICE = 200_002,
        ACL_ERROR_MEMORY_ADDRESS_UNALIGNED = 200_003,
        ACL_ERROR_INVALID_RESOURCE_HANDLE = 200_005,
        ACL_ERROR_FEATURE_UNSUPPORTED = 200_006,
        ACL_ERROR_RT_FEATURE_NOT_SUPPORT = 207_000,
        ACL_ERROR_RT_MEMORY_ALLOCATION = 207_001,
        ACL_ERROR_RT_MEMORY_FREE = 207_002,
        ACL_ERROR_RT_NO_DEVICE = 207_004,
        ACL_ERROR_RT_RESOURCE_ALLOC_FAIL = 207_005,
        ACL_ERROR_RT_NO_EVENT_RESOURCE = 207_007,
        ACL_ERROR_RT_NO_STREAM_RESOURCE = 207_008,
        ACL_ERROR_RT_OVER_LIMIT = 207_012,
        ACL_ERROR_RT_DEVICE_OOM = 207_018,
        ACL_ERROR_INTERNAL_ERROR = 500_000,
        ACL_ERROR_FAILURE = 500_001,
        ACL_ERROR_RT_FAILURE = 500_003,
        ACL_ERROR_DRV_FAILURE = 500_004,
        ACL_ERROR_RT_INTERNAL_ERROR = 507_000,
        ACL_ERROR_RT_SYS_DMA = 507_013,
        ACL_ERROR_RT_DRV_INTERNAL_ERROR = 507_899,
    }
}

c_enum! {
    /// `aclrtMemAttr`: the kind of memory `aclrtGetMemInfo` reports and `aclrtMallocPhysical`
    /// allocates.
    aclrtMemAttr = c_uint, MEM_ATTRS {
        ACL_DDR_MEM = 0,
        ACL_HBM_MEM = 1,
        ACL_DDR_MEM_HUGE = 2,
        ACL_DDR_MEM_NORMAL = 3,
        ACL_HBM_MEM_HUGE = 4,
        ACL_HBM_MEM_NORMAL = 5,
        ACL_DDR_MEM_P2P_HUGE = 6,
        ACL_DDR_MEM_P2P_NORMAL = 7,
        ACL_HBM_MEM_P2P_HUGE = 8,
        ACL_HBM_MEM_P2P_NORMAL = 9,
        ACL_HBM_MEM_HUGE1G = 10,
        ACL_HBM_MEM_P2P_HUGE1G = 11,
        ACL_MEM_NORMAL = 12,
        ACL_MEM_HUGE = 13,
        ACL_MEM_HUGE1G = 14,
        ACL_MEM_P2P_NORMAL = 15,
        ACL_MEM_P2P_HUGE = 16,
        ACL_MEM_P2P_HUGE1G = 17,
    }
}

c_enum! {
    /// `aclrtMemcpyKind` (advisory: the runtime infers the direction from the addresses).
    aclrtMemcpyKind = c_uint, MEMCPY_KINDS {
        ACL_MEMCPY_HOST_TO_HOST = 0,
        ACL_MEMCPY_HOST_TO_DEVICE = 1,
        ACL_MEMCPY_DEVICE_TO_HOST = 2,
        ACL_MEMCPY_DEVICE_TO_DEVICE = 3,
        ACL_MEMCPY_DEFAULT = 4,
        ACL_MEMCPY_HOST_TO_BUF_TO_DEVICE = 5,
        ACL_MEMCPY_INNER_DEVICE_TO_DEVICE = 6,
        ACL_MEMCPY_INTER_DEVICE_TO_DEVICE = 7,
    }
}

c_enum! {
    /// `aclrtMemLocationType`.
    aclrtMemLocationType = c_uint, MEM_LOCATION_TYPES {
        ACL_MEM_LOCATION_TYPE_HOST = 0,
        ACL_MEM_LOCATION_TYPE_DEVICE = 1,
        ACL_MEM_LOCATION_TYPE_UNREGISTERED = 2,
        ACL_MEM_LOCATION_TYPE_MANAGED = 3,
        ACL_MEM_LOCATION_TYPE_HOST_NUMA = 4,
    }
}

c_enum! {
    /// `aclrtMemAllocationType`.
    aclrtMemAllocationType = c_uint, MEM_ALLOCATION_TYPES {
        ACL_MEM_ALLOCATION_TYPE_PINNED = 0,
    }
}

c_enum! {
    /// `aclrtMemHandleType`.
    aclrtMemHandleType = c_uint, MEM_HANDLE_TYPES {
        ACL_MEM_HANDLE_TYPE_NONE = 0,
        ACL_MEM_HANDLE_TYPE_POSIX = 2,
    }
}

c_enum! {
    /// `aclrtMemGranularityOptions`.
    aclrtMemGranularityOptions = c_uint, MEM_GRANULARITY_OPTIONS {
        ACL_RT_MEM_ALLOC_GRANULARITY_MINIMUM = 0,
        ACL_RT_MEM_ALLOC_GRANULARITY_RECOMMENDED = 1,
        ACL_RT_MEM_ALLOC_GRANULARITY_UNDEF = 0xFFFF,
    }
}

c_enum! {
    /// `aclrtEventRecordedStatus`, what `aclrtQueryEventStatus` reports.
    aclrtEventRecordedStatus = c_uint, EVENT_RECORDED_STATUSES {
        ACL_EVENT_RECORDED_STATUS_NOT_READY = 0,
        ACL_EVENT_RECORDED_STATUS_COMPLETE = 1,
    }
}

/// `aclrtDrvMemHandle`: a physical allocation.
pub type aclrtDrvMemHandle = *mut c_void;
/// `aclrtStream` (NULL: the default stream).
pub type aclrtStream = *mut c_void;
/// `aclrtEvent`.
pub type aclrtEvent = *mut c_void;

/// `aclrtMemLocation`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct aclrtMemLocation {
    pub id: u32,
    pub type_: aclrtMemLocationType,
}

/// `aclrtPhysicalMemProp`, the properties of an `aclrtMallocPhysical` allocation.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct aclrtPhysicalMemProp {
    pub handleType: aclrtMemHandleType,
    pub allocationType: aclrtMemAllocationType,
    pub memAttr: aclrtMemAttr,
    pub location: aclrtMemLocation,
    pub reserve: u64,
}

pub type PFN_aclInit = unsafe extern "C" fn(configPath: *const c_char) -> aclError;
pub type PFN_aclFinalize = unsafe extern "C" fn() -> aclError;
pub type PFN_aclrtSetDevice = unsafe extern "C" fn(deviceId: i32) -> aclError;
pub type PFN_aclrtResetDevice = unsafe extern "C" fn(deviceId: i32) -> aclError;
pub type PFN_aclrtGetDevice = unsafe extern "C" fn(deviceId: *mut i32) -> aclError;
pub type PFN_aclrtGetDeviceCount = unsafe extern "C" fn(count: *mut u32) -> aclError;
/// `aclrtContext` is an opaque `void*`.
pub type PFN_aclrtGetCurrentContext = unsafe extern "C" fn(context: *mut *mut c_void) -> aclError;
pub type PFN_aclrtSetCurrentContext = unsafe extern "C" fn(context: *mut c_void) -> aclError;
pub type PFN_aclrtSynchronizeDevice = unsafe extern "C" fn() -> aclError;
pub type PFN_aclrtReserveMemAddress = unsafe extern "C" fn(
    virPtr: *mut *mut c_void,
    size: usize,
    alignment: usize,
    expectPtr: *mut c_void,
    flags: u64,
) -> aclError;
pub type PFN_aclrtReleaseMemAddress = unsafe extern "C" fn(virPtr: *mut c_void) -> aclError;
pub type PFN_aclrtMallocPhysical = unsafe extern "C" fn(
    handle: *mut aclrtDrvMemHandle,
    size: usize,
    prop: *const aclrtPhysicalMemProp,
    flags: u64,
) -> aclError;
pub type PFN_aclrtFreePhysical = unsafe extern "C" fn(handle: aclrtDrvMemHandle) -> aclError;
pub type PFN_aclrtMapMem = unsafe extern "C" fn(
    virPtr: *mut c_void,
    size: usize,
    offset: usize,
    handle: aclrtDrvMemHandle,
    flags: u64,
) -> aclError;
pub type PFN_aclrtUnmapMem = unsafe extern "C" fn(virPtr: *mut c_void) -> aclError;
pub type PFN_aclrtMemGetAllocationGranularity = unsafe extern "C" fn(
    prop: *mut aclrtPhysicalMemProp,
    option: aclrtMemGranularityOptions,
    granularity: *mut usize,
) -> aclError;
pub type PFN_aclrtMemcpy = unsafe extern "C" fn(
    dst: *mut c_void,
    destMax: usize,
    src: *const c_void,
    count: usize,
    kind: aclrtMemcpyKind,
) -> aclError;
pub type PFN_aclrtMemcpyAsync = unsafe extern "C" fn(
    dst: *mut c_void,
    destMax: usize,
    src: *const c_void,
    count: usize,
    kind: aclrtMemcpyKind,
    stream: aclrtStream,
) -> aclError;
pub type PFN_aclrtMemset =
    unsafe extern "C" fn(devPtr: *mut c_void, maxCount: usize, value: i32, count: usize) -> aclError;
pub type PFN_aclrtMemsetAsync = unsafe extern "C" fn(
    devPtr: *mut c_void,
    maxCount: usize,
    value: i32,
    count: usize,
    stream: aclrtStream,
) -> aclError;
pub type PFN_aclrtGetMemInfo =
    unsafe extern "C" fn(attr: aclrtMemAttr, free: *mut usize, total: *mut usize) -> aclError;
pub type PFN_aclrtMallocHost = unsafe extern "C" fn(hostPtr: *mut *mut c_void, size: usize) -> aclError;
pub type PFN_aclrtFreeHost = unsafe extern "C" fn(hostPtr: *mut c_void) -> aclError;
pub type PFN_aclrtCreateStream = unsafe extern "C" fn(stream: *mut aclrtStream) -> aclError;
pub type PFN_aclrtDestroyStream = unsafe extern "C" fn(stream: aclrtStream) -> aclError;
pub type PFN_aclrtSynchronizeStream = unsafe extern "C" fn(stream: aclrtStream) -> aclError;
pub type PFN_aclrtCreateEvent = unsafe extern "C" fn(event: *mut aclrtEvent) -> aclError;
pub type PFN_aclrtDestroyEvent = unsafe extern "C" fn(event: aclrtEvent) -> aclError;
pub type PFN_aclrtRecordEvent = unsafe extern "C" fn(event: aclrtEvent, stream: aclrtStream) -> aclError;
pub type PFN_aclrtQueryEventStatus =
    unsafe extern "C" fn(event: aclrtEvent, status: *mut aclrtEventRecordedStatus) -> aclError;
pub type PFN_aclrtSynchronizeEvent = unsafe extern "C" fn(event: aclrtEvent) -> aclError;
pub type PFN_aclrtStreamWaitEvent = unsafe extern "C" fn(stream: aclrtStream, event: aclrtEvent) -> aclError;

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{align_of, offset_of, size_of};

    /// The layouts `acl_rt.h` gives on LP64 (`aclrtMemLocation` is two 32-bit words; the
    /// 64-bit `reserve` aligns `aclrtPhysicalMemProp` to 8 after 4 bytes of padding).
    #[test]
    fn layouts_match_acl_rt_h() {
        assert_eq!((size_of::<aclrtMemLocation>(), align_of::<aclrtMemLocation>()), (8, 4));
        assert_eq!((offset_of!(aclrtMemLocation, id), offset_of!(aclrtMemLocation, type_)), (0, 4));
        assert_eq!((size_of::<aclrtPhysicalMemProp>(), align_of::<aclrtPhysicalMemProp>()), (32, 8));
        let offsets = [
            offset_of!(aclrtPhysicalMemProp, handleType),
            offset_of!(aclrtPhysicalMemProp, allocationType),
            offset_of!(aclrtPhysicalMemProp, memAttr),
            offset_of!(aclrtPhysicalMemProp, location),
            offset_of!(aclrtPhysicalMemProp, reserve),
        ];
        assert_eq!(offsets, [0, 4, 8, 12, 24]);
    }

    #[test]
    fn tables_name_every_value_once() {
        assert_eq!(crate::name_of(ERRORS, ACL_ERROR_RT_MEMORY_FREE), Some(c"ACL_ERROR_RT_MEMORY_FREE"));
        assert_eq!(crate::name_of(ERRORS, 123), None);
        // aclrtMemAttr counts up from 0 with no gap (the header gives no values).
        for (i, &(value, _)) in MEM_ATTRS.iter().enumerate() {
            assert_eq!(value as usize, i);
        }
        for (i, &(value, _)) in MEMCPY_KINDS.iter().enumerate() {
            assert_eq!(value as usize, i);
        }
        let mut codes: Vec<_> = ERRORS.iter().map(|e| e.0).collect();
        codes.dedup();
        assert_eq!(codes.len(), ERRORS.len(), "codes ascend, none twice");
        assert!(codes.is_sorted());
    }
}
