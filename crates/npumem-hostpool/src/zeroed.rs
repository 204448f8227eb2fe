//! Zero-filled blocks (`HostPool::alloc_zeroed`): NumPy's `calloc` through the NEP 49 handler and
//! `HostPool.zeros`.
//!
//! - The requested bytes read as zero when the block is handed out; how is chosen per block,
//!   by cost: the block's history decides, not a guess about the caller.
//! - Below `DROP_MIN` bytes the block is written with zeros (cheaper than a system call).
//! - From `DROP_MIN`, the whole pages of the range are either dropped (`MADV_DONTNEED`: they
//!   read as zero, and fault in cleared by the kernel when touched) or written with zeros,
//!   depending on whether they are resident (sampled with `mincore`). Pages that are not
//!   resident were not touched since they were last dropped (or ever): dropping them again costs
//!   a system call and nothing per page, so zeros that are never used stay as cheap as NumPy's
//!   fresh `mmap`. Resident pages were used: writing zeros over them keeps them mapped, and a
//!   program that uses its zeroed memory pays no page fault and no kernel clearing.
//! - A resident block is dropped instead every `PROBE`th time in a row for its size class, so a
//!   program that stops touching its zeroed memory is seen to (the next block of the class is
//!   then found not resident): a change of habit costs at most `PROBE` writes of the block.
//! - Dropping also discards swapped-out pages (which `mincore` reports as not resident), so a
//!   dropped range reads as zero whatever the sample said.
//! - Partial pages at the ends of the range are written; bytes of the block past `size` keep
//!   whatever they held.

use std::sync::atomic::{AtomicU32, Ordering};

/// Blocks from this size are cleared page-wise (dropped or written, by residency).
pub const DROP_MIN: usize = 256 << 10;
/// Of this many resident blocks of a class in a row, the last is dropped rather than written.
pub const PROBE: u32 = 4;
/// Pages of the range sampled for residency.
const SAMPLES: usize = 8;
const PAGE: usize = 4096;

/// Makes `len` bytes at `ptr` read as zero. `streak` counts the resident blocks of this size
/// class written in a row.
///
/// # Safety
/// `[ptr, ptr + len)` is memory of one anonymous private mapping that nobody else uses now.
pub unsafe fn clear(ptr: *mut u8, len: usize, streak: &AtomicU32) {
    let start = (ptr as usize).next_multiple_of(PAGE);
    let end = (ptr as usize + len) & !(PAGE - 1);
    if len < DROP_MIN || cfg!(miri) || end <= start {
        // SAFETY: the caller's range.
        unsafe { ptr.write_bytes(0, len) };
        return;
    }
    // SAFETY (both edges): inside the caller's range.
    unsafe {
        ptr.write_bytes(0, start - ptr as usize);
        (end as *mut u8).write_bytes(0, ptr as usize + len - end);
    }
    let resident = resident_samples(start, end);
    let write = resident * 2 > SAMPLES && streak.fetch_add(1, Ordering::Relaxed) % PROBE != PROBE - 1;
    if !write {
        if resident * 2 <= SAMPLES {
            streak.store(0, Ordering::Relaxed);
        }
        // SAFETY: whole pages of the caller's anonymous private range; MADV_DONTNEED keeps the
        // mapping and makes the pages read as zero.
        if unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_DONTNEED) } == 0 {
            return;
        }
    }
    // SAFETY: the caller's range (also the fallback should madvise fail).
    unsafe { (start as *mut u8).write_bytes(0, end - start) };
}

/// How many of `SAMPLES` pages spread over `[start, end)` (page-aligned) are resident.
fn resident_samples(start: usize, end: usize) -> usize {
    let pages = (end - start) / PAGE;
    (0..SAMPLES)
        .filter(|&i| {
            let page = start + (i * pages / SAMPLES) * PAGE;
            let mut vec = 0u8;
            // SAFETY: one page of a mapping of this process; the kernel writes one byte to `vec`.
            let ok = unsafe { libc::mincore(page as *mut libc::c_void, PAGE, &mut vec) } == 0;
            ok && vec & 1 == 1
        })
        .count()
}
