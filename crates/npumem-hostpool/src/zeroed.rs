//! Zero-filled blocks (`HostPool::alloc_zeroed`): NumPy's `calloc` through the NEP 49 handler and
//! `HostPool.zeros`.
//!
//! - The requested bytes read as zero when the block is handed out; how is chosen per block,
//!   by cost, from the block's pages and its size class's history, never from a guess about the
//!   caller. Bytes of the block past the request keep whatever they held.
//! - Below `DROP_MIN` bytes the block is written with zeros: measured here, writing 256 KiB
//!   costs what `mincore` and `madvise` over it do, and less below (glibc's calloc writes such
//!   blocks too once its mmap threshold has risen).
//! - From `DROP_MIN`, the whole pages of the range are either dropped (`MADV_DONTNEED`: they
//!   read as zero and fault in cleared by the kernel when touched) or written with zeros, by
//!   residency (`mincore` over the first `WINDOW` pages). Pages that are not resident were not
//!   touched since they were last dropped (or ever): dropping them again costs one system call
//!   and nothing per page, so zeros that are never used stay as cheap as NumPy's fresh `mmap`.
//!   Resident pages were used: writing zeros over them keeps them mapped, so a program that uses
//!   its zeroed memory pays no page fault and no kernel clearing.
//! - Residency is sampled only after a drop: while a class writes (between two probes), the
//!   pages it wrote last are resident by its own doing, so a sample would say nothing and cost a
//!   system call per block. A block that is not resident then is written all the same (its
//!   pages fault in as the program's own touches would have); the next probe looks again.
//! - A resident block is dropped instead (a probe) once its class has written `interval` of them
//!   in a row, so a program that stops touching its zeroed memory is seen to: the next block of
//!   the class is then found not resident. The first resident block is a probe (`PROBE` is 1:
//!   residency left by another kind of use, `empty` or `full`, says nothing of this one). A
//!   probe that finds the memory used again doubles the interval, up to `WRITE_BUDGET` bytes of
//!   blocks (`MIN_MAX_INTERVAL` to `MAX_INTERVAL` blocks): a used program pays one refault per
//!   that many blocks, and a change of habit (a probe that finds the memory unused resets the
//!   interval to `PROBE`) costs at most that many bytes written.
//! - Dropping discards swapped-out pages too (which `mincore` reports as not resident), so a
//!   dropped range reads as zero whatever the sample said. The history is advice under relaxed
//!   atomics: a race changes what a block costs, never what it holds.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

/// Blocks from this size are cleared page-wise (dropped or written, by residency): the size
/// from which a drop of untouched pages beat writing them, measured (`benches/bench_python.py`).
pub const DROP_MIN: usize = 512 << 10;
/// The first probe interval, and the interval after a probe found the memory unused.
pub const PROBE: u32 = 1;
/// Bytes of blocks written between two probes, at most ...
pub const WRITE_BUDGET: usize = 1 << 30;
/// ... in at least this many blocks and at most this many.
pub const MIN_MAX_INTERVAL: u32 = 4;
pub const MAX_INTERVAL: u32 = 1024;
/// Pages sampled for residency (the start of the range, one system call).
const WINDOW: usize = 256;
const PAGE: usize = 4096;

/// A size class's zeroing history.
pub struct History {
    /// Resident blocks written since the last probe.
    written: AtomicU32,
    /// Resident blocks to write before the next probe.
    interval: AtomicU32,
    /// The last block cleared was a probe (the next one shows whether it was used).
    probed: AtomicBool,
    /// The last block cleared was written (no residency sample until the next drop).
    writing: AtomicBool,
}

impl Default for History {
    fn default() -> Self {
        History {
            written: AtomicU32::new(0),
            interval: AtomicU32::new(PROBE),
            probed: AtomicBool::new(false),
            writing: AtomicBool::new(false),
        }
    }
}

/// Makes `len` bytes at `ptr` read as zero, by `history`'s rules.
///
/// # Safety
/// `[ptr, ptr + len)` is memory of one anonymous private mapping that nobody else uses now.
pub unsafe fn clear(ptr: *mut u8, len: usize, history: &History) {
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
    let resident = history.writing.load(Ordering::Relaxed) || mostly_resident(start, end);
    let dropped = drop_pages(resident, len, history);
    history.writing.store(!dropped, Ordering::Relaxed);
    if !dropped
        // SAFETY: whole pages of the caller's anonymous private range; MADV_DONTNEED keeps the
        // mapping and makes the pages read as zero. Should it fail, they are written below.
        || unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_DONTNEED) } != 0
    {
        // SAFETY: the caller's range.
        unsafe { (start as *mut u8).write_bytes(0, end - start) };
    }
}

/// Whether to drop (rather than write) a range of `len` bytes whose pages are `resident` or
/// not, and the history's update.
fn drop_pages(resident: bool, len: usize, h: &History) -> bool {
    let after_probe = h.probed.swap(false, Ordering::Relaxed);
    if !resident {
        if after_probe {
            h.interval.store(PROBE, Ordering::Relaxed);
        }
        h.written.store(0, Ordering::Relaxed);
        return true;
    }
    let mut interval = h.interval.load(Ordering::Relaxed);
    if after_probe {
        let most = (WRITE_BUDGET / len).clamp(MIN_MAX_INTERVAL as usize, MAX_INTERVAL as usize) as u32;
        interval = (interval * 2).min(most);
        h.interval.store(interval, Ordering::Relaxed);
    }
    if h.written.fetch_add(1, Ordering::Relaxed) + 1 >= interval {
        h.written.store(0, Ordering::Relaxed);
        h.probed.store(true, Ordering::Relaxed);
        return true;
    }
    false
}

/// Whether at least half of the first `WINDOW` pages of `[start, end)` (page-aligned) are
/// resident.
fn mostly_resident(start: usize, end: usize) -> bool {
    let pages = ((end - start) / PAGE).min(WINDOW);
    let mut vec = [0u8; WINDOW];
    // SAFETY: `pages` pages of a mapping of this process; the kernel writes one byte per page
    // into `vec`, which has room for `WINDOW`.
    if unsafe { libc::mincore(start as *mut libc::c_void, pages * PAGE, vec.as_mut_ptr()) } != 0 {
        return false; // dropped then: always correct
    }
    vec[..pages].iter().filter(|&&v| v & 1 == 1).count() * 2 >= pages
}

#[cfg(test)]
mod tests {
    use std::ptr;

    use super::*;

    #[test]
    fn probes_back_off_while_memory_is_used_and_reset_when_it_is_not() {
        let h = History::default();
        let len = WRITE_BUDGET / 64; // at most 64 blocks between probes
        // Resident every time: a probe at once (PROBE is 1), then twice as many writes before each next.
        let mut drops = vec![];
        for i in 0..200 {
            if drop_pages(true, len, &h) {
                drops.push(i);
            }
        }
        let gaps: Vec<_> = drops.windows(2).map(|w| w[1] - w[0]).collect();
        assert_eq!(drops[0], PROBE as usize - 1);
        assert_eq!(&gaps[..6], &[2, 4, 8, 16, 32, 64]);
        assert!(gaps[6..].iter().all(|&g| g == 64), "{gaps:?}");
        // After a probe, memory found unused: dropped from then on, the interval back to PROBE.
        while !drop_pages(true, len, &h) {}
        assert!(drop_pages(false, len, &h) && drop_pages(false, len, &h));
        assert_eq!(h.interval.load(Ordering::Relaxed), PROBE);
        // The cap follows the block size: small blocks probe rarely, huge ones often.
        let small = History::default();
        let probes = (0..4000).filter(|_| drop_pages(true, 256 << 10, &small)).count();
        assert!(probes <= 14, "{probes} probes of 256 KiB blocks");
        let huge = History::default();
        let probes = (0..100).filter(|_| drop_pages(true, 1 << 30, &huge)).count();
        assert!(probes >= 100 / MIN_MAX_INTERVAL as usize, "{probes} probes of 1 GiB blocks");
    }

    #[test]
    fn a_writing_class_clears_without_sampling_and_every_block_reads_zero() {
        const LEN: usize = 1 << 20;
        // SAFETY: a fresh anonymous private mapping of two blocks, unmapped below.
        let map = unsafe {
            libc::mmap(
                ptr::null_mut(),
                2 * LEN,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(map, libc::MAP_FAILED);
        let blocks = [map.cast::<u8>(), map.cast::<u8>().wrapping_add(LEN)];
        let h = History::default();
        let mut wrote = 0;
        for round in 0..64 {
            // Mostly the first block, used; every fifth round the second, never touched (not
            // resident while the class writes).
            let block = blocks[usize::from(round % 5 == 4)];
            // SAFETY: a block of the mapping, used by nobody else.
            unsafe { clear(block, LEN, &h) };
            // SAFETY: as above; read and written only here.
            let bytes = unsafe { std::slice::from_raw_parts_mut(block, LEN) };
            assert!(bytes.iter().all(|&b| b == 0), "round {round}: not zero");
            wrote += usize::from(h.writing.load(Ordering::Relaxed));
            if block == blocks[0] {
                bytes.iter_mut().step_by(PAGE).for_each(|b| *b = 0xA5);
                bytes[LEN - 1] = 0x5A;
            }
        }
        // The used class wrote most blocks (a drop is a probe or a block found unused).
        assert!(wrote > 32, "{wrote} of 64 written");
        // SAFETY: `map` is the mapping made above, 2 * LEN bytes, and nothing reads it after this point.
        assert_eq!(unsafe { libc::munmap(map, 2 * LEN) }, 0);
    }
}
