//! `DirectAllocator`: the no-cache baseline, what plain `aclrtMalloc` / `aclrtFree` cost.
//!
//! Every malloc maps a fresh [`Segment`] of the policy's page kind (HUGE_FIRST falls back from
//! 2 MiB to normal pages when the huge attempt runs out of memory, as the real runtime does);
//! every free unmaps it and returns frames and VA at once.
//!
//! Rules:
//! - `blocks` maps each live pointer to its segment and the bytes requested (the segment is
//!   what a free unmaps);
//! - each allocation is its own segment, so reserved = allocated in the stats;
//! - it has no limit of its own: its books are uncapped.

use rustc_hash::FxHashMap;

use super::{
    Action, Allocator, BlockSnapshot, Books, Fragmentation, Grant, Granted, PoolKind, PoolStats, Request, Segment,
    SegmentSnapshot, SegmentUse,
};
use crate::backend::Backend;
use crate::error::{AclError, Result};
use crate::policy::{HUGE_FIRST_NORMAL_LIMIT, page_plan};

#[derive(Debug)]
pub struct DirectAllocator {
    blocks: FxHashMap<u64, (Segment, u64)>,
    books: Books,
}

impl Default for DirectAllocator {
    fn default() -> Self {
        Self::new()
    }
}

impl DirectAllocator {
    pub fn new() -> Self {
        DirectAllocator {
            blocks: FxHashMap::default(),
            books: Books::uncapped(PoolStats { max_split_size: u64::MAX, ..Default::default() }, "direct"),
        }
    }
}

fn pool_of(size: u64) -> PoolKind {
    if size <= HUGE_FIRST_NORMAL_LIMIT { PoolKind::Small } else { PoolKind::Large }
}

impl Allocator for DirectAllocator {
    fn name(&self) -> &'static str {
        "direct"
    }

    fn malloc(&mut self, backend: &mut dyn Backend, request: &Request) -> Result<Grant> {
        let plan = page_plan(request.policy, request.size);
        let segment = Segment::map(backend, request.booked, plan).inspect_err(|e| {
            if e.code.is_out_of_memory() {
                self.books.stats.num_ooms += 1;
            }
        })?;
        let pool = pool_of(request.size);
        self.books.stats.num_cache_misses += 1;
        self.books.stats.on_segment_alloc(pool, segment.size);
        self.books.stats.on_alloc(pool, segment.size, request.size);
        self.blocks.insert(segment.ptr, (segment, request.size));
        self.books.events.push(Action::SegmentAlloc, segment.ptr, segment.size);
        Ok(Grant { ptr: segment.ptr, granted: segment.size, page: segment.page })
    }

    fn free(&mut self, backend: &mut dyn Backend, block: &Granted) -> Result<()> {
        let ptr = block.ptr;
        let &(segment, requested) = self
            .blocks
            .get(&ptr)
            .ok_or_else(|| AclError::internal(format!("direct allocator does not own {ptr:#x}")))?;
        // A driver failure leaves the block live, as it was.
        segment.unmap(backend)?;
        self.blocks.remove(&ptr);
        let pool = pool_of(requested);
        self.books.stats.on_free(pool, segment.size, requested);
        self.books.stats.on_segment_free(pool, segment.size);
        self.books.events.push(Action::SegmentFree, segment.ptr, segment.size);
        Ok(())
    }

    fn empty_cache(&mut self, _backend: &mut dyn Backend) -> Result<()> {
        Ok(())
    }

    fn trim_to(&mut self, _backend: &mut dyn Backend, _bytes: u64) -> Result<u64> {
        Ok(self.books.reserved())
    }

    fn books(&self) -> &Books {
        &self.books
    }

    fn books_mut(&mut self) -> &mut Books {
        &mut self.books
    }

    fn fragmentation(&self, _live: &[Granted]) -> Fragmentation {
        let mut f = Fragmentation::of(&self.books.stats);
        for (segment, _) in self.blocks.values() {
            f.segments.push(SegmentUse {
                ptr: segment.ptr,
                size: segment.size,
                allocated: segment.size,
                blocks: 1,
                free_blocks: 0,
            });
        }
        f.segments.sort_unstable_by_key(|s| s.ptr);
        f
    }

    fn segments(&self, _live: &[Granted]) -> Vec<SegmentSnapshot> {
        let mut out: Vec<SegmentSnapshot> = self
            .blocks
            .values()
            .map(|(segment, requested)| SegmentSnapshot {
                address: segment.ptr,
                total_size: segment.size,
                pool: pool_of(*requested),
                is_expandable: false,
                blocks: vec![BlockSnapshot {
                    address: segment.ptr,
                    size: segment.size,
                    requested_size: *requested,
                    allocated: true,
                }],
            })
            .collect();
        out.sort_unstable_by_key(|s| s.address);
        out
    }
}
