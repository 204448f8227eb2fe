//! `FrameAllocator`: the device's physical memory (HBM) as a binary buddy allocator.
//!
//! Orders run from the normal page size (order 0; 4 KiB or 64 KiB) up to 1 GiB. A block of order
//! `k` is `frame_size << k` bytes and starts at a multiple of its own size, so a 2 MiB or 1 GiB
//! frame exists only where that much physical memory is free, contiguous and aligned:
//! fragmentation really makes huge frames unavailable.
//!
//! Invariants: free blocks of one order never overlap one another or an allocated block; two free
//! buddies of the same order never coexist (they are merged at once); `free_bytes` equals the sum
//! of the free lists. Allocation takes the lowest-addressed block of the smallest order that fits
//! (deterministic, and it keeps the high addresses unfragmented as long as it can). A number of
//! 1 GiB frames can be set aside at start for giant pages; they are served from their own list.

use std::collections::BTreeSet;

use crate::error::{AclError, Result};
use crate::units::{GIB, format_size};

/// Free memory by order, like `/proc/buddyinfo`, plus totals.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FrameStats {
    /// Bytes in one order-0 frame (the normal page size).
    pub frame_size: u64,
    /// Physical bytes managed by the buddy allocator (capacity less the giant reserve).
    pub buddy_bytes: u64,
    pub free_bytes: u64,
    /// Number of free blocks per order; order `k` blocks hold `frame_size << k` bytes.
    pub free_blocks: Vec<u64>,
    /// Size of the largest free block (the largest contiguous, aligned free run the buddy
    /// allocator can hand out at once).
    pub largest_free_block: u64,
    /// 1 GiB frames set aside for giant pages, in all and still free.
    pub giant_total: u64,
    pub giant_free: u64,
}

impl FrameStats {
    /// Bytes held in free blocks of at least `block` bytes: what pages of that size could still use.
    pub fn free_bytes_in_blocks_of(&self, block: u64) -> u64 {
        self.free_blocks
            .iter()
            .enumerate()
            .filter(|&(order, _)| self.frame_size << order >= block)
            .map(|(order, &n)| n * (self.frame_size << order))
            .sum()
    }
}

#[derive(Debug)]
pub struct FrameAllocator {
    frame_size: u64,
    frame_shift: u32,
    max_order: u32,
    buddy_frames: u64,
    /// Free blocks per order, by start frame number.
    free: Vec<BTreeSet<u64>>,
    free_frames: u64,
    /// Per frame: 0, or 1 + the order of the allocated block that starts there. One byte per
    /// frame, zero-filled lazily by the OS, so the check costs no hashing.
    allocated: Vec<u8>,
    /// Giant (1 GiB) frames set aside at start: all of them, and the free ones.
    giant_all: BTreeSet<u64>,
    giant_free: BTreeSet<u64>,
}

impl FrameAllocator {
    /// Manages `capacity` bytes (rounded down to whole frames) of frames of `frame_size` bytes (a
    /// power of two from 4 KiB to 1 GiB), with `giant_frames` 1 GiB frames set aside at the top.
    pub fn new(capacity: u64, frame_size: u64, giant_frames: u64) -> Result<Self> {
        if !frame_size.is_power_of_two() || !(4096..=GIB).contains(&frame_size) {
            return Err(AclError::invalid_param(format!(
                "normal page size {} is not a power of two between 4 KiB and 1 GiB",
                format_size(frame_size)
            )));
        }
        let frame_shift = frame_size.trailing_zeros();
        let max_order = GIB.trailing_zeros() - frame_shift;
        let total_frames = capacity >> frame_shift;
        if total_frames == 0 {
            return Err(AclError::invalid_param(format!(
                "device capacity {} is smaller than one page of {}",
                format_size(capacity),
                format_size(frame_size)
            )));
        }
        let giant_span = 1u64 << max_order;
        let whole_giants = total_frames / giant_span;
        if giant_frames > whole_giants {
            return Err(AclError::invalid_param(format!(
                "cannot set aside {giant_frames} giant (1 GiB) frames on a device of {}: at most \
                 {whole_giants} fit; lower giant_frames or raise the capacity",
                format_size(capacity)
            )));
        }
        // The giant reserve takes the highest whole 1 GiB frames; the buddy allocator the rest.
        let buddy_frames = total_frames - giant_frames * giant_span;
        let first_giant = (whole_giants - giant_frames) * giant_span;
        let giant_all: BTreeSet<u64> = (0..giant_frames).map(|i| first_giant + i * giant_span).collect();
        let mut fa = FrameAllocator {
            frame_size,
            frame_shift,
            max_order,
            buddy_frames,
            free: vec![BTreeSet::new(); max_order as usize + 1],
            free_frames: 0,
            allocated: vec![0; total_frames as usize],
            giant_free: giant_all.clone(),
            giant_all,
        };
        // Seed the free lists with maximal aligned blocks covering the buddy range. With a giant
        // reserve the buddy range is [0, first_giant) plus the tail after the last whole giant.
        let tail_start = whole_giants * giant_span;
        fa.seed_range(0, first_giant);
        fa.seed_range(tail_start, total_frames);
        Ok(fa)
    }

    fn seed_range(&mut self, mut frame: u64, end: u64) {
        while frame < end {
            let mut order = self.max_order;
            while order > 0 && (frame % (1 << order) != 0 || frame + (1 << order) > end) {
                order -= 1;
            }
            self.free[order as usize].insert(frame);
            self.free_frames += 1 << order;
            frame += 1 << order;
        }
    }

    pub fn frame_size(&self) -> u64 {
        self.frame_size
    }

    /// The order whose blocks hold exactly `bytes`, if `bytes` is a power-of-two multiple of the
    /// frame size no larger than 1 GiB.
    pub fn order_of(&self, bytes: u64) -> Option<u32> {
        (bytes.is_power_of_two() && bytes >= self.frame_size && bytes <= GIB)
            .then(|| bytes.trailing_zeros() - self.frame_shift)
    }

    pub fn free_bytes(&self) -> u64 {
        (self.free_frames << self.frame_shift) + self.giant_free.len() as u64 * GIB
    }

    pub fn buddy_free_bytes(&self) -> u64 {
        self.free_frames << self.frame_shift
    }

    pub fn buddy_bytes(&self) -> u64 {
        self.buddy_frames << self.frame_shift
    }

    pub fn giant_counts(&self) -> (u64, u64) {
        (self.giant_all.len() as u64, self.giant_free.len() as u64)
    }

    /// Allocates one block of `bytes` (a power-of-two multiple of the frame size, ≤ 1 GiB) from the
    /// buddy allocator and returns its physical address.
    pub fn alloc(&mut self, bytes: u64) -> Result<u64> {
        let order = self.order_of(bytes).ok_or_else(|| {
            AclError::invalid_param(format!(
                "cannot allocate a physical block of {}: blocks are power-of-two multiples of {} up to 1 GiB",
                format_size(bytes),
                format_size(self.frame_size)
            ))
        })?;
        let Some(from) = (order..=self.max_order).find(|&k| !self.free[k as usize].is_empty()) else {
            return Err(AclError::oom(format!(
                "no free physical block of {} (free {}, largest free block {})",
                format_size(bytes),
                format_size(self.buddy_free_bytes()),
                format_size(self.largest_free_block())
            )));
        };
        let frame = self.free[from as usize].pop_first().expect("non-empty free list");
        // Split down, returning the upper halves to the free lists.
        for k in (order..from).rev() {
            self.free[k as usize].insert(frame + (1 << k));
        }
        self.free_frames -= 1 << order;
        self.allocated[frame as usize] = order as u8 + 1;
        Ok(frame << self.frame_shift)
    }

    /// Frees the block at `pa` previously returned by [`alloc`](Self::alloc), merging buddies.
    pub fn free(&mut self, pa: u64) -> Result<()> {
        let mut frame = pa >> self.frame_shift;
        let tag = self.allocated.get(frame as usize).copied().filter(|_| pa % self.frame_size == 0).unwrap_or(0);
        let Some(mut order) = tag.checked_sub(1).map(u32::from) else {
            return Err(AclError::bad_free(format!(
                "physical address {pa:#x} is not an allocated block; it was freed already or never allocated"
            )));
        };
        self.allocated[frame as usize] = 0;
        self.free_frames += 1 << order;
        while order < self.max_order {
            let buddy = frame ^ (1 << order);
            if !self.free[order as usize].remove(&buddy) {
                break;
            }
            frame = frame.min(buddy);
            order += 1;
        }
        self.free[order as usize].insert(frame);
        Ok(())
    }

    /// Takes a 1 GiB frame from the giant reserve.
    pub fn alloc_giant(&mut self) -> Result<u64> {
        let (total, _) = self.giant_counts();
        self.giant_free.pop_first().map(|f| f << self.frame_shift).ok_or_else(|| {
            AclError::oom(if total == 0 {
                "no 1 GiB giant frames were set aside; create the device with giant_frames > 0 \
                 (the driver must pre-allocate 1 GiB pages) or use a 2 MiB policy"
                    .to_string()
            } else {
                format!("all {total} giant (1 GiB) frames are in use; free some or set aside more")
            })
        })
    }

    /// Returns a 1 GiB frame to the giant reserve.
    pub fn free_giant(&mut self, pa: u64) -> Result<()> {
        let frame = pa >> self.frame_shift;
        if !self.giant_all.contains(&frame) || !self.giant_free.insert(frame) {
            return Err(AclError::bad_free(format!("physical address {pa:#x} is not an allocated giant frame")));
        }
        Ok(())
    }

    pub fn largest_free_block(&self) -> u64 {
        self.free.iter().rposition(|list| !list.is_empty()).map_or(0, |order| self.frame_size << order)
    }

    pub fn stats(&self) -> FrameStats {
        let (giant_total, giant_free) = self.giant_counts();
        FrameStats {
            frame_size: self.frame_size,
            buddy_bytes: self.buddy_bytes(),
            free_bytes: self.buddy_free_bytes(),
            free_blocks: self.free.iter().map(|l| l.len() as u64).collect(),
            largest_free_block: self.largest_free_block(),
            giant_total,
            giant_free,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::units::{KIB, MIB};
    use proptest::prelude::*;

    #[test]
    fn splits_and_merges() {
        let mut fa = FrameAllocator::new(GIB, 4 * KIB, 0).unwrap();
        assert_eq!(fa.stats().free_blocks[18], 1);
        let a = fa.alloc(4 * KIB).unwrap();
        assert_eq!(a, 0);
        let s = fa.stats();
        assert_eq!(s.free_bytes, GIB - 4 * KIB);
        assert_eq!(s.free_blocks[..18].iter().sum::<u64>(), 18);
        assert_eq!(s.largest_free_block, GIB / 2);
        let h = fa.alloc(2 * MIB).unwrap();
        assert_eq!(h % (2 * MIB), 0);
        fa.free(a).unwrap();
        fa.free(h).unwrap();
        assert_eq!(fa.stats().free_blocks[18], 1);
        assert!(fa.free(a).is_err());
    }

    #[test]
    fn fragmentation_blocks_huge_frames() {
        // 64 MiB; allocate every 4 KiB frame, free all but one frame in each 2 MiB block.
        let mut fa = FrameAllocator::new(64 * MIB, 4 * KIB, 0).unwrap();
        let frames: Vec<u64> = (0..64 * MIB / (4 * KIB)).map(|_| fa.alloc(4 * KIB).unwrap()).collect();
        for &f in &frames {
            if f % (2 * MIB) != 0 {
                fa.free(f).unwrap();
            }
        }
        let s = fa.stats();
        assert!(s.free_bytes > 60 * MIB);
        assert_eq!(s.largest_free_block, MIB);
        assert_eq!(s.free_bytes_in_blocks_of(2 * MIB), 0);
        assert_eq!(fa.alloc(2 * MIB).unwrap_err().code, crate::ErrorCode::RtMemoryAllocation);
    }

    #[test]
    fn giant_reserve_and_odd_capacity() {
        let mut fa = FrameAllocator::new(3 * GIB + 5 * MIB, 64 * KIB, 2).unwrap();
        assert_eq!(fa.giant_counts(), (2, 2));
        assert_eq!(fa.buddy_bytes(), GIB + 5 * MIB);
        let g = fa.alloc_giant().unwrap();
        assert_eq!(g % GIB, 0);
        assert!(g >= GIB);
        assert!(fa.alloc(4 * KIB).is_err(), "4 KiB is below the 64 KiB frame size");
        fa.free_giant(g).unwrap();
        assert!(fa.free_giant(g).is_err());
        assert!(FrameAllocator::new(GIB, 4 * KIB, 2).is_err());
        assert!(FrameAllocator::new(100, 4 * KIB, 0).is_err());
        assert!(FrameAllocator::new(GIB, 3000, 0).is_err());
        let mut none = FrameAllocator::new(GIB, 4 * KIB, 0).unwrap();
        assert!(none.alloc_giant().unwrap_err().message.contains("giant_frames"));
    }

    proptest! {
        #[test]
        fn buddy_model(ops in proptest::collection::vec((any::<bool>(), 0u32..10, any::<u16>()), 1..300)) {
            let cap = 64 * MIB + 12 * KIB;
            let mut fa = FrameAllocator::new(cap, 4 * KIB, 0).unwrap();
            let initial = fa.stats();
            let mut live: Vec<(u64, u64)> = Vec::new();
            for (alloc, order, pick) in ops {
                if alloc || live.is_empty() {
                    let bytes = (4 * KIB) << order;
                    if let Ok(pa) = fa.alloc(bytes) {
                        prop_assert_eq!(pa % bytes, 0);
                        prop_assert!(pa + bytes <= cap);
                        for &(s, l) in &live {
                            prop_assert!(pa + bytes <= s || s + l <= pa, "overlap");
                        }
                        live.push((pa, bytes));
                    } else {
                        prop_assert!(fa.largest_free_block() < bytes);
                    }
                } else {
                    let (pa, _) = live.swap_remove(pick as usize % live.len());
                    fa.free(pa).unwrap();
                }
                let used: u64 = live.iter().map(|&(_, l)| l).sum();
                prop_assert_eq!(fa.buddy_free_bytes() + used, cap);
                let s = fa.stats();
                let listed: u64 = s.free_blocks.iter().enumerate().map(|(k, &n)| n * ((4 * KIB) << k)).sum();
                prop_assert_eq!(listed, s.free_bytes);
            }
            for (pa, _) in live { fa.free(pa).unwrap(); }
            prop_assert_eq!(fa.stats(), initial);
        }
    }
}
