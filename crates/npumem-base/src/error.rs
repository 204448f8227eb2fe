//! AscendCL-style errors.
//!
//! Every fallible operation in npumem returns [`AclError`]: a numeric code taken from the real
//! runtime (`acl_base_rt.h`, `rt_error_codes.h`) and a message that says what went wrong and what
//! to do about it. Invariant: no public operation panics on bad input; it returns one of these.

use std::fmt;

/// The AscendCL error codes npumem reports. Values are the real runtime's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum ErrorCode {
    /// `ACL_ERROR_INVALID_PARAM`: a bad argument (zero size, unknown enum value, null pointer).
    InvalidParam = 100_000,
    /// `ACL_ERROR_RT_PARAM_INVALID`: a runtime-level bad value (count > destMax, out of bounds).
    RtParamInvalid = 107_000,
    /// `ACL_ERROR_RT_ADDR_UNALIGNED`: an address that breaks an alignment rule.
    RtAddrUnaligned = 107_008,
    /// `ACL_ERROR_RT_INVALID_HANDLE`: an unknown physical-memory handle.
    RtInvalidHandle = 107_017,
    /// `ACL_ERROR_FEATURE_UNSUPPORTED`: the backend or configuration cannot do this.
    FeatureUnsupported = 200_006,
    /// `ACL_ERROR_RT_MEMORY_ALLOCATION`: out of device memory.
    RtMemoryAllocation = 207_001,
    /// `ACL_ERROR_RT_MEMORY_FREE`: a free of memory that is not (or no longer) allocated.
    RtMemoryFree = 207_002,
    /// `ACL_ERROR_RT_DRV_INTERNAL_ERROR`: an internal failure (a bug in npumem).
    RtDrvInternal = 507_899,
}

impl ErrorCode {
    /// The numeric value, as `aclError` carries it.
    pub fn value(self) -> u32 {
        self as u32
    }

    /// The AscendCL name of the code.
    pub fn name(self) -> &'static str {
        match self {
            ErrorCode::InvalidParam => "ACL_ERROR_INVALID_PARAM",
            ErrorCode::RtParamInvalid => "ACL_ERROR_RT_PARAM_INVALID",
            ErrorCode::RtAddrUnaligned => "ACL_ERROR_RT_ADDR_UNALIGNED",
            ErrorCode::RtInvalidHandle => "ACL_ERROR_RT_INVALID_HANDLE",
            ErrorCode::FeatureUnsupported => "ACL_ERROR_FEATURE_UNSUPPORTED",
            ErrorCode::RtMemoryAllocation => "ACL_ERROR_RT_MEMORY_ALLOCATION",
            ErrorCode::RtMemoryFree => "ACL_ERROR_RT_MEMORY_FREE",
            ErrorCode::RtDrvInternal => "ACL_ERROR_RT_DRV_INTERNAL_ERROR",
        }
    }

    /// True for the out-of-memory codes.
    pub fn is_out_of_memory(self) -> bool {
        matches!(self, ErrorCode::RtMemoryAllocation)
    }
}

/// An error with an AscendCL code and an actionable message.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct AclError {
    pub code: ErrorCode,
    pub message: String,
    /// For a memory-sanitizer finding raised as an error: the finding's kind.
    pub finding: Option<&'static str>,
}

impl fmt::Display for AclError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({}): {}", self.code.name(), self.code.value(), self.message)
    }
}

impl AclError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        AclError { code, message: message.into(), finding: None }
    }
    pub fn invalid_param(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::InvalidParam, message)
    }
    pub fn rt_param(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::RtParamInvalid, message)
    }
    pub fn oom(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::RtMemoryAllocation, message)
    }
    pub fn bad_free(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::RtMemoryFree, message)
    }
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::RtDrvInternal, message)
    }
}

/// Result alias used throughout npumem.
pub type Result<T> = std::result::Result<T, AclError>;
