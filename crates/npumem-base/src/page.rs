//! Page sizes and translations: what the page table maps and a walk answers, in the terms the
//! TLB model caches.
//!
//! Rules:
//! - a page of size `P` lies at a `P`-aligned address, virtual and physical;
//! - a [`Translation`] names the physical address of the byte asked for (not of its page) and
//!   the page size of the leaf that mapped it.

use crate::units::{GIB, KIB, MIB};

/// The page sizes the page table can map.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PageSize {
    /// A 4 KiB page: one level-3 entry.
    Size4K,
    /// A 64 KiB page: 16 contiguous level-3 entries carrying the contiguous hint.
    Size64K,
    /// A 2 MiB huge page: one level-2 block entry.
    Size2M,
    /// A 1 GiB giant page: one level-1 block entry.
    Size1G,
}

impl PageSize {
    pub const ALL: [PageSize; 4] = [PageSize::Size4K, PageSize::Size64K, PageSize::Size2M, PageSize::Size1G];

    #[inline]
    pub const fn bytes(self) -> u64 {
        match self {
            PageSize::Size4K => 4 * KIB,
            PageSize::Size64K => 64 * KIB,
            PageSize::Size2M => 2 * MIB,
            PageSize::Size1G => GIB,
        }
    }

    pub fn from_bytes(bytes: u64) -> Option<PageSize> {
        PageSize::ALL.into_iter().find(|p| p.bytes() == bytes)
    }

    pub const fn label(self) -> &'static str {
        match self {
            PageSize::Size4K => "4KiB",
            PageSize::Size64K => "64KiB",
            PageSize::Size2M => "2MiB",
            PageSize::Size1G => "1GiB",
        }
    }
}

/// The result of a page-table walk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Translation {
    pub pa: u64,
    pub page_size: PageSize,
    /// Descriptors read by the walk (2 for a 1 GiB block, 3 for 2 MiB, 4 for 4 KiB / 64 KiB).
    pub depth: u32,
}
