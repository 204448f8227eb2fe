//! `DirectAllocator`: the no-cache baseline, what plain `aclrtMalloc` / `aclrtFree` cost.
//!
//! Every malloc maps a fresh [`Segment`] of the policy's page kind (HUGE_FIRST falls back from
//! 2 MiB to normal pages when the huge attempt runs out of memory, as the real runtime does);
//! every free unmaps it and returns frames and VA at once.
//!
//! Invariant: `blocks` maps each live pointer to its segment and the bytes requested; each
//! allocation is its own segment, so reserved = allocated in the stats.

use rustc_hash::FxHashMap;

use super::{
    Action, Allocator, BlockSnapshot, EventLog, Fragmentation, Grant, PoolKind, PoolStats, Request, Segment,
    SegmentSnapshot, SegmentUse,
};
use crate::backend::Backend;
use crate::error::{AclError, Result};
use crate::policy::{HUGE_FIRST_NORMAL_LIMIT, page_plan};

#[derive(Debug)]
pub struct DirectAllocator {
    blocks: FxHashMap<u64, (Segment, u64)>,
    stats: PoolStats,
    events: EventLog,
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
            stats: PoolStats { max_split_size: u64::MAX, ..Default::default() },
            events: EventLog::default(),
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
                self.stats.num_ooms += 1;
            }
        })?;
        let pool = pool_of(request.size);
        self.stats.num_cache_misses += 1;
        self.stats.on_segment_alloc(pool, segment.size);
        self.stats.on_alloc(pool, segment.size, request.size);
        self.blocks.insert(segment.ptr, (segment, request.size));
        self.events.push(Action::SegmentAlloc, segment.ptr, segment.size);
        Ok(Grant { ptr: segment.ptr, granted: segment.size, page: segment.page })
    }

    fn free(&mut self, backend: &mut dyn Backend, ptr: u64) -> Result<()> {
        let &(segment, requested) = self
            .blocks
            .get(&ptr)
            .ok_or_else(|| AclError::internal(format!("direct allocator does not own {ptr:#x}")))?;
        // A driver failure leaves the block live, as it was.
        segment.unmap(backend)?;
        self.blocks.remove(&ptr);
        let pool = pool_of(requested);
        self.stats.on_free(pool, segment.size, requested);
        self.stats.on_segment_free(pool, segment.size);
        self.events.push(Action::SegmentFree, segment.ptr, segment.size);
        Ok(())
    }

    fn empty_cache(&mut self, _backend: &mut dyn Backend) -> Result<()> {
        Ok(())
    }

    fn trim_to(&mut self, _backend: &mut dyn Backend, _bytes: u64) -> Result<u64> {
        Ok(self.stats.reserved_bytes.all.current)
    }

    fn set_memory_fraction(&mut self, _fraction: f64) -> Result<()> {
        Err(AclError::new(
            crate::ErrorCode::FeatureUnsupported,
            "the direct allocator has no limit of its own; use a caching allocator (npumem, pytorch, torch_npu)",
        ))
    }

    fn stats(&self) -> &PoolStats {
        &self.stats
    }

    fn stats_mut(&mut self) -> &mut PoolStats {
        &mut self.stats
    }

    fn events(&mut self) -> &mut EventLog {
        &mut self.events
    }

    fn fragmentation(&self) -> Fragmentation {
        let mut f = Fragmentation::of(&self.stats);
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

    fn segments(&self) -> Vec<SegmentSnapshot> {
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
