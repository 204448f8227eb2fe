//! `Fragmentation`: where an allocator's memory goes, measured rather than guessed.
//!
//! internal waste = granted − requested (rounding and padding inside live blocks);
//! reserved-but-unallocated = reserved − allocated (cached free memory);
//! external fragmentation = 1 − largest free extent / total free (0 when nothing is free).

use super::PoolStats;
use super::snapshot::SegmentSnapshot;
use crate::units::format_size;

/// One segment's occupancy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegmentUse {
    pub ptr: u64,
    pub size: u64,
    pub allocated: u64,
    pub blocks: u32,
    pub free_blocks: u32,
}

impl SegmentUse {
    /// The occupancy of a segment as the snapshot shows it.
    pub fn of(s: &SegmentSnapshot) -> Self {
        let (mut allocated, mut blocks, mut free_blocks) = (0, 0, 0);
        for b in &s.blocks {
            if b.allocated {
                allocated += b.size;
                blocks += 1;
            } else {
                free_blocks += 1;
            }
        }
        SegmentUse { ptr: s.address, size: s.total_size, allocated, blocks, free_blocks }
    }
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Fragmentation {
    pub requested: u64,
    pub allocated: u64,
    pub reserved: u64,
    /// Free bytes inside reserved segments.
    pub free: u64,
    pub largest_free_extent: u64,
    pub segments: Vec<SegmentUse>,
    /// Free blocks by size class: (class upper bound in bytes, blocks, bytes); classes are powers
    /// of two from 512 B.
    pub free_by_bucket: Vec<(u64, u64, u64)>,
}

impl Fragmentation {
    /// Totals from an allocator's stats; free extents and segments are added by the caller.
    pub fn of(stats: &PoolStats) -> Self {
        Fragmentation {
            requested: stats.requested_bytes.all.current,
            allocated: stats.allocated_bytes.all.current,
            reserved: stats.reserved_bytes.all.current,
            ..Default::default()
        }
    }

    pub fn internal_waste(&self) -> u64 {
        self.allocated - self.requested
    }

    pub fn reserved_unallocated(&self) -> u64 {
        self.reserved - self.allocated
    }

    pub fn external(&self) -> f64 {
        if self.free == 0 { 0.0 } else { 1.0 - self.largest_free_extent as f64 / self.free as f64 }
    }

    /// Adds a free extent to the totals and the bucket histogram.
    pub fn add_free(&mut self, size: u64) {
        self.free += size;
        self.largest_free_extent = self.largest_free_extent.max(size);
        let class = size.next_power_of_two().max(512);
        match self.free_by_bucket.iter_mut().find(|b| b.0 == class) {
            Some(b) => {
                b.1 += 1;
                b.2 += size;
            }
            None => {
                self.free_by_bucket.push((class, 1, size));
                self.free_by_bucket.sort_unstable();
            }
        }
    }

    /// One line for error messages.
    pub fn summary(&self) -> String {
        format!(
            "{} allocated ({} requested, {} internal waste), {} reserved, {} reserved but unallocated \
             in {} segments, largest free extent {}, external fragmentation of the free reserved memory \
             {:.1}%",
            format_size(self.allocated),
            format_size(self.requested),
            format_size(self.internal_waste()),
            format_size(self.reserved),
            format_size(self.reserved_unallocated()),
            self.segments.len(),
            format_size(self.largest_free_extent),
            100.0 * self.external()
        )
    }
}
