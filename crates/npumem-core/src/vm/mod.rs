//! The device's virtual memory system: the VA window ([`VaSpace`]), physical frames
//! ([`FrameAllocator`]), the radix page table ([`PageTable`]) and the byte store behind physical
//! addresses ([`PhysMemory`]). [`PageSize`] and [`Translation`] (npumem-base) and the TLB model
//! ([`tlb`], the crate npumem-tlb, which translates through any walk) are re-exported here.
//!
//! Invariants shared by the whole module: device virtual addresses lie in
//! [`VA_WINDOW_START`]..[`VA_WINDOW_END`] and never alias host pointers; a page of size `P` is
//! mapped at a `P`-aligned VA onto a `P`-aligned physical frame.

pub mod frames;
pub mod page_table;
pub mod phys;
pub mod va;

pub use npumem_base::PageSize;
pub use npumem_tlb as tlb;

pub use frames::{FrameAllocator, FrameStats};
pub use page_table::{PageTable, PageTableStats, Translation};
pub use phys::PhysMemory;
pub use tlb::{Tlb, TlbConfig, TlbStats};
pub use va::VaSpace;

/// First device virtual address: 16 TiB, the start of the real driver's SVM window.
pub const VA_WINDOW_START: u64 = 0x1000_0000_0000;
/// One past the last device virtual address: 24 TiB (an 8 TiB window).
pub const VA_WINDOW_END: u64 = 0x1800_0000_0000;

/// The most devices that may share the window ([`va_slice`]): 64 slices of 128 GiB.
pub const MAX_VA_SLICES: u32 = 64;

/// Slice `index` of the device VA window cut into `count` equal, 1 GiB-aligned parts, as
/// `[start, end)`: the addresses of one of `count` devices sharing one address space, so that a
/// pointer names its device.
pub fn va_slice(index: u32, count: u32) -> crate::error::Result<(u64, u64)> {
    if count == 0 || count > MAX_VA_SLICES || index >= count {
        return Err(crate::error::AclError::invalid_param(format!(
            "va_slice=({index}, {count}): the slice index must be below the count, and the count from 1 to \
             {MAX_VA_SLICES}"
        )));
    }
    let len = (VA_WINDOW_END - VA_WINDOW_START) / u64::from(count) / (1 << 30) * (1 << 30);
    let start = VA_WINDOW_START + u64::from(index) * len;
    Ok((start, start + len))
}

/// Whether `addr` lies in the device VA window (says nothing about whether it is mapped).
#[inline]
pub fn is_device_address(addr: u64) -> bool {
    (VA_WINDOW_START..VA_WINDOW_END).contains(&addr)
}

/// The kinds of physical page the driver hands out (`aclrtMemPgType`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PageKind {
    /// Normal pages (4 KiB, or 64 KiB where configured).
    Normal,
    /// 2 MiB huge pages.
    Huge,
    /// 1 GiB giant pages, served only from frames set aside at start.
    Giant,
}

impl PageKind {
    pub const ALL: [PageKind; 3] = [PageKind::Normal, PageKind::Huge, PageKind::Giant];

    pub const fn label(self) -> &'static str {
        match self {
            PageKind::Normal => "normal",
            PageKind::Huge => "huge",
            PageKind::Giant => "giant",
        }
    }
}
