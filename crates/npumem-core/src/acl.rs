//! AscendCL enumerations with their real numeric values (`acl_rt.h`, CANN 1.17).
//!
//! Invariant: `from_raw` accepts exactly the values the real header defines and rejects every
//! other with `ACL_ERROR_INVALID_PARAM`, naming the valid values.

use crate::error::{AclError, Result};

macro_rules! acl_enum {
    ($(#[$meta:meta])* $name:ident : $what:literal { $($(#[$vmeta:meta])* $variant:ident = $value:literal => $cname:literal,)+ }) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[repr(u32)]
        pub enum $name { $($(#[$vmeta])* $variant = $value,)+ }

        impl $name {
            pub const ALL: &'static [$name] = &[$($name::$variant,)+];

            pub fn from_raw(value: u32) -> Result<Self> {
                match value {
                    $($value => Ok($name::$variant),)+
                    _ => Err(AclError::invalid_param(format!(
                        "{} is not a valid {}; use one of {}",
                        value, $what, [$(concat!($cname, "=", $value)),+].join(", ")
                    ))),
                }
            }

            /// The AscendCL constant's name.
            pub fn name(self) -> &'static str {
                match self { $($name::$variant => $cname,)+ }
            }
        }
    };
}

acl_enum! {
    /// `aclrtMemMallocPolicy`.
    Policy: "memory malloc policy" {
        HugeFirst = 0 => "ACL_MEM_MALLOC_HUGE_FIRST",
        HugeOnly = 1 => "ACL_MEM_MALLOC_HUGE_ONLY",
        NormalOnly = 2 => "ACL_MEM_MALLOC_NORMAL_ONLY",
        HugeFirstP2p = 3 => "ACL_MEM_MALLOC_HUGE_FIRST_P2P",
        HugeOnlyP2p = 4 => "ACL_MEM_MALLOC_HUGE_ONLY_P2P",
        NormalOnlyP2p = 5 => "ACL_MEM_MALLOC_NORMAL_ONLY_P2P",
        Huge1gOnly = 6 => "ACL_MEM_MALLOC_HUGE1G_ONLY",
        Huge1gOnlyP2p = 7 => "ACL_MEM_MALLOC_HUGE1G_ONLY_P2P",
    }
}

impl Policy {
    /// Whether the policy asks for memory usable by peer-to-peer copies.
    pub fn is_p2p(self) -> bool {
        matches!(self, Policy::HugeFirstP2p | Policy::HugeOnlyP2p | Policy::NormalOnlyP2p | Policy::Huge1gOnlyP2p)
    }

    /// The policy with the P2P flag dropped.
    pub fn base(self) -> Policy {
        match self {
            Policy::HugeFirstP2p => Policy::HugeFirst,
            Policy::HugeOnlyP2p => Policy::HugeOnly,
            Policy::NormalOnlyP2p => Policy::NormalOnly,
            Policy::Huge1gOnlyP2p => Policy::Huge1gOnly,
            other => other,
        }
    }
}

acl_enum! {
    /// `aclrtMemAttr`, the argument of `aclrtGetMemInfo`.
    MemAttr: "memory attribute" {
        Ddr = 0 => "ACL_DDR_MEM",
        Hbm = 1 => "ACL_HBM_MEM",
        DdrHuge = 2 => "ACL_DDR_MEM_HUGE",
        DdrNormal = 3 => "ACL_DDR_MEM_NORMAL",
        HbmHuge = 4 => "ACL_HBM_MEM_HUGE",
        HbmNormal = 5 => "ACL_HBM_MEM_NORMAL",
        DdrP2pHuge = 6 => "ACL_DDR_MEM_P2P_HUGE",
        DdrP2pNormal = 7 => "ACL_DDR_MEM_P2P_NORMAL",
        HbmP2pHuge = 8 => "ACL_HBM_MEM_P2P_HUGE",
        HbmP2pNormal = 9 => "ACL_HBM_MEM_P2P_NORMAL",
        HbmHuge1g = 10 => "ACL_HBM_MEM_HUGE1G",
        HbmP2pHuge1g = 11 => "ACL_HBM_MEM_P2P_HUGE1G",
        MemNormal = 12 => "ACL_MEM_NORMAL",
        MemHuge = 13 => "ACL_MEM_HUGE",
        MemHuge1g = 14 => "ACL_MEM_HUGE1G",
        MemP2pNormal = 15 => "ACL_MEM_P2P_NORMAL",
        MemP2pHuge = 16 => "ACL_MEM_P2P_HUGE",
        MemP2pHuge1g = 17 => "ACL_MEM_P2P_HUGE1G",
    }
}

/// What part of device memory a [`MemAttr`] asks about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemScope {
    /// DDR memory, which an HBM device does not have.
    Ddr,
    /// All of HBM (normal, huge and giant).
    All,
    /// Memory that normal pages can use.
    Normal,
    /// Memory that 2 MiB pages can use.
    Huge,
    /// The 1 GiB giant-page reserve.
    Giant,
}

impl MemAttr {
    pub fn scope(self) -> MemScope {
        use MemAttr::*;
        match self {
            Ddr | DdrHuge | DdrNormal | DdrP2pHuge | DdrP2pNormal => MemScope::Ddr,
            Hbm => MemScope::All,
            HbmNormal | HbmP2pNormal | MemNormal | MemP2pNormal => MemScope::Normal,
            HbmHuge | HbmP2pHuge | MemHuge | MemP2pHuge => MemScope::Huge,
            HbmHuge1g | HbmP2pHuge1g | MemHuge1g | MemP2pHuge1g => MemScope::Giant,
        }
    }
}

acl_enum! {
    /// `aclrtMemcpyKind`. The runtime infers the direction from the addresses; the kind is advisory.
    MemcpyKind: "memcpy kind" {
        HostToHost = 0 => "ACL_MEMCPY_HOST_TO_HOST",
        HostToDevice = 1 => "ACL_MEMCPY_HOST_TO_DEVICE",
        DeviceToHost = 2 => "ACL_MEMCPY_DEVICE_TO_HOST",
        DeviceToDevice = 3 => "ACL_MEMCPY_DEVICE_TO_DEVICE",
        Default = 4 => "ACL_MEMCPY_DEFAULT",
        HostToBufToDevice = 5 => "ACL_MEMCPY_HOST_TO_BUF_TO_DEVICE",
        InnerDeviceToDevice = 6 => "ACL_MEMCPY_INNER_DEVICE_TO_DEVICE",
        InterDeviceToDevice = 7 => "ACL_MEMCPY_INTER_DEVICE_TO_DEVICE",
    }
}

impl MemcpyKind {
    /// The direction this kind names, as (source is device, destination is device), if it names one.
    pub fn direction(self) -> Option<(bool, bool)> {
        use MemcpyKind::*;
        match self {
            HostToHost => Some((false, false)),
            HostToDevice | HostToBufToDevice => Some((false, true)),
            DeviceToHost => Some((true, false)),
            DeviceToDevice | InnerDeviceToDevice | InterDeviceToDevice => Some((true, true)),
            Default => None,
        }
    }
}

acl_enum! {
    /// `aclrtMemPoolAttr`: the stream-ordered pool's attributes (SOMA, `acl_rt_memory_soma.h`).
    MemPoolAttr: "memory pool attribute" {
        ReuseFollowEventDependencies = 1 => "ACL_RT_MEM_POOL_REUSE_FOLLOW_EVENT_DEPENDENCIES",
        ReuseAllowOpportunistic = 2 => "ACL_RT_MEM_POOL_REUSE_ALLOW_OPPORTUNISTIC",
        ReuseAllowInternalDependencies = 3 => "ACL_RT_MEM_POOL_REUSE_ALLOW_INTERNAL_DEPENDENCIES",
        ReleaseThreshold = 4 => "ACL_RT_MEM_POOL_ATTR_RELEASE_THRESHOLD",
        ReservedMemCurrent = 5 => "ACL_RT_MEM_POOL_ATTR_RESERVED_MEM_CURRENT",
        ReservedMemHigh = 6 => "ACL_RT_MEM_POOL_ATTR_RESERVED_MEM_HIGH",
        UsedMemCurrent = 7 => "ACL_RT_MEM_POOL_ATTR_USED_MEM_CURRENT",
        UsedMemHigh = 8 => "ACL_RT_MEM_POOL_ATTR_USED_MEM_HIGH",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_values_round_trip() {
        for &p in Policy::ALL {
            assert_eq!(Policy::from_raw(p as u32).unwrap(), p);
        }
        assert_eq!(Policy::Huge1gOnlyP2p as u32, 7);
        assert_eq!(MemAttr::MemP2pHuge1g as u32, 17);
        assert_eq!(MemcpyKind::Default as u32, 4);
        let err = Policy::from_raw(9).unwrap_err();
        assert_eq!(err.code, crate::ErrorCode::InvalidParam);
        assert!(err.message.contains("ACL_MEM_MALLOC_HUGE_FIRST=0"));
        assert_eq!(Policy::HugeOnlyP2p.base(), Policy::HugeOnly);
        assert!(Policy::NormalOnlyP2p.is_p2p());
    }
}
