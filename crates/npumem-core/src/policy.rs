//! The real runtime's size and page rules for `aclrtMalloc` and its variants.
//!
//! - `aclrtMalloc` books `ALIGN_UP(size, 32) + 32` bytes; `aclrtMallocAlign32` and the HUGE1G
//!   policies book `ALIGN_UP(size, 32)` (no pad).
//! - HUGE_FIRST: requests of at most 1 MiB get normal pages; larger ones get 2 MiB pages and fall
//!   back to normal pages when no 2 MiB frame is free. HUGE_ONLY: 2 MiB pages or
//!   ACL_ERROR_RT_MEMORY_ALLOCATION. NORMAL_ONLY: normal pages. HUGE1G_ONLY: 1 GiB pages from the
//!   giant reserve. P2P variants follow their base policy.
//!
//! Invariant (kept by every allocator that accepts a policy, through every path: front caches,
//! pool reuse, stitching, bypass, stream-ordered reuse): every page under a live block satisfies
//! [`honours`] for the policy it was allocated with. An allocator that cannot keep a policy's
//! promise refuses the request with ACL_ERROR_FEATURE_UNSUPPORTED.

use crate::acl::Policy;
use crate::error::{AclError, Result};
use crate::units::{MIB, checked_align_up};
use crate::vm::{PageKind, PageSize};

/// Bytes `aclrtMalloc` appends after aligning the size to 32.
pub const MALLOC_PAD: u64 = 32;
/// Size alignment of every device allocation.
pub const MALLOC_ALIGN: u64 = 32;
/// Start-address alignment the runtime guarantees.
pub const START_ALIGN: u64 = 64;
/// HUGE_FIRST requests up to this size get normal pages.
pub const HUGE_FIRST_NORMAL_LIMIT: u64 = MIB;

/// The bytes the runtime books for a request of `size` under `policy`; `padded` is true for
/// `aclrtMalloc` / `aclrtMallocCached` and false for `aclrtMallocAlign32`.
pub fn booked_size(size: u64, policy: Policy, padded: bool) -> Result<u64> {
    if size == 0 {
        return Err(AclError::invalid_param("malloc size must be greater than 0"));
    }
    let pad = if padded && policy.base() != Policy::Huge1gOnly { MALLOC_PAD } else { 0 };
    checked_align_up(size, MALLOC_ALIGN).and_then(|s| s.checked_add(pad)).ok_or_else(|| {
        AclError::invalid_param(format!("malloc size {size} overflows when aligned and padded; ask for less"))
    })
}

/// The page kinds to try, in order, for a request of `size` bytes under `policy`.
pub fn page_plan(policy: Policy, size: u64) -> &'static [PageKind] {
    match policy.base() {
        Policy::HugeFirst if size <= HUGE_FIRST_NORMAL_LIMIT => &[PageKind::Normal],
        Policy::HugeFirst => &[PageKind::Huge, PageKind::Normal],
        Policy::HugeOnly => &[PageKind::Huge],
        Policy::NormalOnly => &[PageKind::Normal],
        _ => &[PageKind::Giant],
    }
}

/// Whether a page of `page` bytes keeps `policy`'s promise: HUGE_ONLY gets only 2 MiB pages,
/// HUGE1G_ONLY only 1 GiB pages, NORMAL_ONLY only normal (4 KiB / 64 KiB) pages; HUGE_FIRST
/// promises nothing (it takes huge pages when it can).
pub fn honours(policy: Policy, page: PageSize) -> bool {
    match policy.base() {
        Policy::HugeOnly => page == PageSize::Size2M,
        Policy::Huge1gOnly => page == PageSize::Size1G,
        Policy::NormalOnly => page < PageSize::Size2M,
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn booking_rules() {
        assert_eq!(booked_size(1, Policy::HugeFirst, true).unwrap(), 64);
        assert_eq!(booked_size(32, Policy::HugeFirst, true).unwrap(), 64);
        assert_eq!(booked_size(33, Policy::NormalOnlyP2p, true).unwrap(), 96);
        assert_eq!(booked_size(33, Policy::HugeFirst, false).unwrap(), 64);
        assert_eq!(booked_size(1000, Policy::Huge1gOnly, true).unwrap(), 1024);
        assert!(booked_size(0, Policy::HugeFirst, true).is_err());
        assert!(booked_size(u64::MAX - 40, Policy::HugeFirst, true).is_err());
    }

    #[test]
    fn page_plans() {
        assert_eq!(page_plan(Policy::HugeFirst, MIB), &[PageKind::Normal]);
        assert_eq!(page_plan(Policy::HugeFirst, MIB + 1), &[PageKind::Huge, PageKind::Normal]);
        assert_eq!(page_plan(Policy::HugeOnlyP2p, 1), &[PageKind::Huge]);
        assert_eq!(page_plan(Policy::NormalOnly, 1 << 40), &[PageKind::Normal]);
        assert_eq!(page_plan(Policy::Huge1gOnlyP2p, 1), &[PageKind::Giant]);
    }
}
