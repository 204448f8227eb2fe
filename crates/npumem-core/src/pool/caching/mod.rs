//! `CachingAllocator`: PyTorch's and torch_npu's caching allocator, rule for rule.
//!
//! Requests are rounded (`CachingConfig::round_size`), served best-fit from the free blocks of
//! their pool (small ≤ 1 MiB, large above), split when the remainder is worth keeping, and merged
//! with free neighbours on free. When no cached block fits, a new segment is obtained from the
//! backend (2 MiB for small requests, `large_segment_size` for 1–10 MiB, the request rounded to
//! 2 MiB above); if the device is out of memory, the release ladder frees oversize cached blocks,
//! then every whole cached segment, and retries before reporting out-of-memory with diagnostics.
//!
//! Rules (asserted by `check_invariants` in test builds):
//! - the blocks of a segment tile it exactly, linked by `prev`/`next` in address order;
//! - no two adjacent blocks are both free;
//! - a free block is in exactly one free set, keyed (size, ptr), and an allocated block in none;
//! - `by_ptr` indexes every block (the split blocks are this family's own records: a free
//!   merges by them); the allocated blocks are exactly the owner's live blocks;
//! - the stats equal a recount of the blocks.

use rustc_hash::FxHashMap;
use std::collections::BTreeMap;

use super::config::{MIN_BLOCK, SMALL_SIZE};
use super::{
    Action, Allocator, BlockSnapshot, Books, CachingConfig, Fragmentation, Grant, Granted, PoolKind, PoolStats,
    Request, Segment, SegmentSnapshot, SegmentUse,
};
use crate::acl::Policy;
use crate::backend::Backend;
use crate::error::{AclError, ErrorCode, Result};
use crate::policy::page_plan;
use crate::units::format_size;
use crate::vm::{PageKind, PageSize};

const NIL: u32 = u32::MAX;
/// Requests this large are refused at once (PyTorch's `one_exa_bytes`).
const ABSURD: u64 = 1 << 60;

#[derive(Clone, Copy, Debug)]
struct Block {
    ptr: u64,
    size: u64,
    requested: u64,
    segment: u64,
    prev: u32,
    next: u32,
    allocated: bool,
    pool: PoolKind,
    /// The allocator clock (one tick per malloc, as PyTorch counts free-block searches) when the
    /// block became free; its age is `clock - gc_stamp`.
    gc_stamp: u64,
    /// Order in which blocks became free (for `trim_to`, which releases the coldest first).
    freed_seq: u64,
}

#[derive(Debug)]
struct SegmentInfo {
    segment: Segment,
    pool: PoolKind,
    head: u32,
}

#[derive(Debug)]
pub struct CachingAllocator {
    config: CachingConfig,
    blocks: Vec<Block>,
    vacant: Vec<u32>,
    by_ptr: FxHashMap<u64, u32>,
    free: [BTreeMap<(u64, u64), u32>; 2],
    segments: BTreeMap<u64, SegmentInfo>,
    books: Books,
    clock: u64,
    free_seq: u64,
}

impl CachingAllocator {
    /// An allocator for a device of `capacity` bytes (the base of `per_process_memory_fraction`).
    pub fn new(config: CachingConfig, capacity: u64) -> Self {
        let stats = PoolStats { max_split_size: config.max_split_size, ..Default::default() };
        let books = Books::capped(stats, capacity, config.memory_fraction);
        CachingAllocator {
            config,
            blocks: Vec::new(),
            vacant: Vec::new(),
            by_ptr: FxHashMap::default(),
            free: [BTreeMap::new(), BTreeMap::new()],
            segments: BTreeMap::new(),
            books,
            clock: 0,
            free_seq: 0,
        }
    }

    /// The most this allocator may reserve.
    pub fn limit(&self) -> u64 {
        self.books.limit()
    }

    fn new_block(&mut self, block: Block) -> u32 {
        let idx = match self.vacant.pop() {
            Some(i) => {
                self.blocks[i as usize] = block;
                i
            }
            None => {
                self.blocks.push(block);
                (self.blocks.len() - 1) as u32
            }
        };
        self.by_ptr.insert(block.ptr, idx);
        idx
    }

    #[inline(always)]
    fn drop_block(&mut self, idx: u32) {
        let ptr = self.blocks[idx as usize].ptr;
        self.by_ptr.remove(&ptr);
        self.vacant.push(idx);
    }

    fn b(&self, idx: u32) -> &Block {
        &self.blocks[idx as usize]
    }

    fn bm(&mut self, idx: u32) -> &mut Block {
        &mut self.blocks[idx as usize]
    }

    fn is_split(&self, idx: u32) -> bool {
        let b = self.b(idx);
        b.prev != NIL || b.next != NIL
    }

    fn insert_free(&mut self, idx: u32) {
        let clock = self.clock;
        self.free_seq += 1;
        let seq = self.free_seq;
        let split = self.is_split(idx);
        let b = self.bm(idx);
        b.gc_stamp = clock;
        b.freed_seq = seq;
        let (pool, size, ptr) = (b.pool, b.size, b.ptr);
        self.free[pool as usize].insert((size, ptr), idx);
        if split {
            self.books.stats.inactive_split.add(pool, 1);
            self.books.stats.inactive_split_bytes.add(pool, size);
        }
    }

    fn remove_free(&mut self, idx: u32) {
        let split = self.is_split(idx);
        let b = *self.b(idx);
        self.free[b.pool as usize].remove(&(b.size, b.ptr));
        if split {
            self.books.stats.inactive_split.sub(b.pool, 1);
            self.books.stats.inactive_split_bytes.sub(b.pool, b.size);
        }
    }

    /// `get_free_block`: the smallest cached block that fits, under the oversize rules.
    fn find_free(&mut self, pool: PoolKind, size: u64) -> Option<u32> {
        let (&(bsize, _), &idx) = self.free[pool as usize].range((size, 0)..).next()?;
        let max_split = self.config.max_split_size;
        if size < max_split && bsize >= max_split {
            return None; // do not hand a huge unsplittable block to a small request
        }
        if size >= max_split && bsize >= size.saturating_add(self.config.max_non_split_rounding) {
            return None; // too much waste in an oversize block
        }
        self.remove_free(idx);
        Some(idx)
    }

    fn should_split(&self, pool: PoolKind, size: u64, remaining: u64) -> bool {
        match pool {
            PoolKind::Small => remaining >= MIN_BLOCK,
            PoolKind::Large => size < self.config.max_split_size && remaining > SMALL_SIZE,
        }
    }

    fn page_plan(&self, pool: PoolKind, alloc_size: u64) -> &'static [PageKind] {
        if self.config.page_size_1g && pool == PoolKind::Large {
            // torch_npu asks for HUGE1G_ONLY and retries with HUGE_FIRST when it fails.
            &[PageKind::Giant, PageKind::Huge, PageKind::Normal]
        } else {
            page_plan(Policy::HugeFirst, alloc_size)
        }
    }

    /// `alloc_block`: a new segment, as one free-standing block (not in a free set).
    fn alloc_segment(&mut self, backend: &mut dyn Backend, pool: PoolKind, alloc_size: u64) -> Result<u32> {
        let reserved = self.books.reserved();
        if reserved.saturating_add(alloc_size) > self.limit() {
            return Err(AclError::oom(format!(
                "the allocator's limit of {} (memory fraction {}) would be exceeded",
                format_size(self.limit()),
                self.books.memory_fraction()
            )));
        }
        let segment = Segment::map(backend, alloc_size, self.page_plan(pool, alloc_size))?;
        self.books.stats.on_segment_alloc(pool, segment.size);
        if segment.size >= self.config.max_split_size {
            self.books.stats.oversize_segments.add(1);
        }
        let idx = self.new_block(Block {
            ptr: segment.ptr,
            size: segment.size,
            requested: 0,
            segment: segment.ptr,
            prev: NIL,
            next: NIL,
            allocated: false,
            pool,
            gc_stamp: self.clock,
            freed_seq: 0,
        });
        self.segments.insert(segment.ptr, SegmentInfo { segment, pool, head: idx });
        self.books.events.push(Action::SegmentAlloc, segment.ptr, segment.size);
        Ok(idx)
    }

    /// Returns a whole cached segment (a free block with no neighbours) to the backend. A driver
    /// failure leaves it cached, as it was.
    fn release_segment(&mut self, backend: &mut dyn Backend, idx: u32) -> Result<()> {
        let b = *self.b(idx);
        self.segments.get(&b.segment).expect("segment of a live block").segment.unmap(backend)?;
        self.remove_free(idx);
        self.drop_block(idx);
        let info = self.segments.remove(&b.segment).expect("segment of a live block");
        self.books.stats.on_segment_free(info.pool, info.segment.size);
        if info.segment.size >= self.config.max_split_size {
            self.books.stats.oversize_segments.sub(1);
        }
        self.books.events.push(Action::SegmentFree, info.segment.ptr, info.segment.size);
        Ok(())
    }

    fn whole_free_segments(&self, pool: Option<PoolKind>) -> Vec<u32> {
        let pools: &[PoolKind] = match pool {
            Some(PoolKind::Small) => &[PoolKind::Small],
            Some(PoolKind::Large) => &[PoolKind::Large],
            None => &[PoolKind::Small, PoolKind::Large],
        };
        pools.iter().flat_map(|&p| self.free[p as usize].values().copied()).filter(|&i| !self.is_split(i)).collect()
    }

    /// `release_cached_blocks`: every whole cached segment goes back to the device.
    fn release_cached_blocks(&mut self, backend: &mut dyn Backend) -> Result<()> {
        for idx in self.whole_free_segments(None) {
            self.release_segment(backend, idx)?;
        }
        Ok(())
    }

    /// `release_available_cached_blocks`: frees cached oversize segments of `pool` to make room
    /// for `size` bytes. Does nothing while max_split_size is unlimited.
    fn release_available_cached_blocks(
        &mut self,
        backend: &mut dyn Backend,
        pool: PoolKind,
        size: u64,
    ) -> Result<bool> {
        let max_split = self.config.max_split_size;
        if max_split == u64::MAX {
            return Ok(false);
        }
        let mut candidates: Vec<(u64, u32)> = self
            .whole_free_segments(Some(pool))
            .into_iter()
            .map(|i| (self.b(i).size, i))
            .filter(|&(s, _)| s >= max_split)
            .collect();
        candidates.sort_unstable();
        if let Some(&(_, idx)) = candidates.iter().find(|&&(s, _)| s >= size) {
            self.release_segment(backend, idx)?;
            return Ok(true);
        }
        let mut released = 0;
        while released < size {
            let Some((s, idx)) = candidates.pop() else { break };
            self.release_segment(backend, idx)?;
            released += s;
        }
        Ok(released >= size)
    }

    /// `garbage_collect_cached_blocks`: while less than the excess over the threshold has been
    /// reclaimed, frees every whole cached large segment at least as old as the mean age (not
    /// stopping at the target, so that GC does not run again at once), as PyTorch does.
    fn garbage_collect(&mut self, backend: &mut dyn Backend) -> Result<()> {
        let threshold = (self.config.garbage_collection_threshold * self.limit() as f64) as u64;
        let reserved = self.books.reserved();
        if reserved <= threshold {
            return Ok(());
        }
        let target = reserved - threshold;
        let mut reclaimed = 0;
        loop {
            let candidates = self.whole_free_segments(Some(PoolKind::Large));
            if candidates.is_empty() {
                break;
            }
            let ages: Vec<u64> = candidates.iter().map(|&i| self.clock - self.b(i).gc_stamp).collect();
            let mean = ages.iter().sum::<u64>() as f64 / ages.len() as f64;
            let mut freed_any = false;
            for (&idx, &age) in candidates.iter().zip(&ages) {
                if age as f64 >= mean {
                    reclaimed += self.b(idx).size;
                    self.release_segment(backend, idx)?;
                    freed_any = true;
                }
            }
            if reclaimed >= target || !freed_any {
                break;
            }
        }
        Ok(())
    }

    /// Gets a new segment for a request that found no cached block, climbing the release ladder
    /// on out-of-memory.
    fn grow(&mut self, backend: &mut dyn Backend, pool: PoolKind, size: u64, request: &Request) -> Result<u32> {
        let alloc_size = self.config.allocation_size(size);
        if self.config.garbage_collection_threshold > 0.0 && self.books.memory_fraction() < 1.0 {
            self.garbage_collect(backend)?;
        }
        let first = match self.alloc_segment(backend, pool, alloc_size) {
            Err(e) if e.code.is_out_of_memory() => e,
            other => return other,
        };
        if self.release_available_cached_blocks(backend, pool, size)? {
            if let Ok(idx) = self.alloc_segment(backend, pool, alloc_size) {
                return Ok(idx);
            }
        }
        self.release_cached_blocks(backend)?;
        self.books.stats.num_alloc_retries += 1;
        match self.alloc_segment(backend, pool, alloc_size) {
            Err(e) if e.code.is_out_of_memory() => {
                self.books.stats.num_ooms += 1;
                let (free, total) = backend.mem_info(crate::acl::MemScope::All);
                let hint = if self.books.reserved() > self.books.stats.allocated_bytes.all.current + alloc_size {
                    " Reserved but unallocated memory is large: it is split among live blocks; try \
                     max_split_size_mb or a VMM (expandable) pool."
                } else {
                    ""
                };
                Err(AclError::oom(format!(
                    "{} out of memory. Tried to allocate {} (a {} segment for a request of {}; {} total \
                     capacity; {} free; allocator limit {}); first failure: {}.{hint}",
                    self.config.family.name(),
                    format_size(size),
                    format_size(alloc_size),
                    format_size(request.size),
                    format_size(total),
                    format_size(free),
                    format_size(self.limit()),
                    first.message,
                )))
            }
            other => {
                let _ = first;
                other
            }
        }
    }

    /// Asserts the module's rules against an independent recount; `live` is the owner's record
    /// of the live blocks, in address order.
    #[cfg(test)]
    fn check_invariants(&self, live: &[Granted]) {
        let mut held = Vec::new();
        let mut allocated = 0;
        let mut requested = 0;
        let mut reserved = 0;
        let mut free_count = 0;
        for info in self.segments.values() {
            reserved += info.segment.size;
            let mut at = info.segment.ptr;
            let mut idx = info.head;
            let mut prev = NIL;
            let mut prev_free = false;
            while idx != NIL {
                let b = self.b(idx);
                assert_eq!(b.ptr, at, "blocks tile the segment");
                assert_eq!(b.prev, prev);
                assert_eq!(b.segment, info.segment.ptr);
                assert_eq!(self.by_ptr[&b.ptr], idx);
                if b.allocated {
                    allocated += b.size;
                    requested += b.requested;
                    held.push((b.ptr, b.size, b.requested));
                    assert!(!self.free[b.pool as usize].contains_key(&(b.size, b.ptr)));
                } else {
                    assert!(!prev_free, "two adjacent free blocks");
                    assert_eq!(self.free[b.pool as usize].get(&(b.size, b.ptr)), Some(&idx));
                    free_count += 1;
                }
                prev_free = !b.allocated;
                at += b.size;
                prev = idx;
                idx = b.next;
            }
            assert_eq!(at, info.segment.ptr + info.segment.size);
        }
        assert_eq!(free_count, self.free[0].len() + self.free[1].len());
        assert_eq!(self.books.stats.allocated_bytes.all.current, allocated);
        assert_eq!(self.books.stats.requested_bytes.all.current, requested);
        assert_eq!(self.books.reserved(), reserved);
        assert_eq!(self.by_ptr.len(), self.blocks.len() - self.vacant.len());
        let owner: Vec<(u64, u64, u64)> = live.iter().map(|g| (g.ptr, g.granted, g.requested)).collect();
        assert_eq!(held, owner, "the allocated blocks are the owner's live blocks");
    }
}

impl Allocator for CachingAllocator {
    fn name(&self) -> &'static str {
        self.config.family.name()
    }

    fn malloc(&mut self, backend: &mut dyn Backend, request: &Request) -> Result<Grant> {
        if request.policy.base() != Policy::HugeFirst {
            // Segments are shared by every request carved from them, so a page promise cannot be
            // kept per request: refuse it rather than hand out pages the policy rules out.
            return Err(AclError::new(
                ErrorCode::FeatureUnsupported,
                format!(
                    "policy {} needs pages the {} allocator cannot promise: it maps every segment with \
                     ACL_MEM_MALLOC_HUGE_FIRST (as torch_npu does) and carves requests from shared segments; \
                     use ACL_MEM_MALLOC_HUGE_FIRST, or allocator=\"npumem\" or \"direct\", which honour every \
                     policy",
                    request.policy.name(),
                    self.name(),
                ),
            ));
        }
        if request.size >= ABSURD {
            self.books.stats.num_ooms += 1;
            return Err(AclError::oom(format!("a request of {} can never be satisfied", format_size(request.size))));
        }
        self.clock += 1;
        let size = self.config.round_size(request.size);
        let pool = if size <= SMALL_SIZE { PoolKind::Small } else { PoolKind::Large };
        let idx = match self.find_free(pool, size) {
            Some(idx) => idx,
            None => {
                let idx = self.grow(backend, pool, size, request)?;
                self.books.stats.num_cache_misses += 1;
                idx
            }
        };
        let b = *self.b(idx);
        let remaining = b.size - size;
        if self.should_split(pool, size, remaining) {
            let rest = self.new_block(Block {
                ptr: b.ptr + size,
                size: remaining,
                requested: 0,
                segment: b.segment,
                prev: idx,
                next: b.next,
                allocated: false,
                pool,
                gc_stamp: self.clock,
                freed_seq: 0,
            });
            if b.next != NIL {
                self.bm(b.next).prev = rest;
            }
            let block = self.bm(idx);
            block.next = rest;
            block.size = size;
            self.insert_free(rest);
        }
        let block = self.bm(idx);
        block.allocated = true;
        block.requested = request.size;
        let (ptr, granted) = (block.ptr, block.size);
        self.books.stats.on_alloc(pool, granted, request.size);
        if granted >= self.config.max_split_size {
            self.books.stats.oversize_allocations.add(1);
        }
        let page = self.segments.get(&b.segment).map_or(PageSize::Size2M, |s| s.segment.page);
        Ok(Grant { ptr, granted, page })
    }

    fn free(&mut self, _backend: &mut dyn Backend, block: &Granted) -> Result<()> {
        let ptr = block.ptr;
        let mut idx = *self
            .by_ptr
            .get(&ptr)
            .filter(|&&i| self.b(i).allocated)
            .ok_or_else(|| AclError::internal(format!("{} allocator does not own {ptr:#x}", self.name())))?;
        let b = *self.b(idx);
        self.books.stats.on_free(b.pool, b.size, b.requested);
        if b.size >= self.config.max_split_size {
            self.books.stats.oversize_allocations.sub(1);
        }
        let block = self.bm(idx);
        block.allocated = false;
        block.requested = 0;
        // Merge with a free previous neighbour (it absorbs this block) ...
        let prev = b.prev;
        if prev != NIL && !self.b(prev).allocated {
            self.remove_free(prev);
            let next = self.b(idx).next;
            let size = self.b(idx).size;
            self.drop_block(idx);
            let p = self.bm(prev);
            p.size += size;
            p.next = next;
            if next != NIL {
                self.bm(next).prev = prev;
            }
            idx = prev;
        }
        // ... and absorb a free next neighbour.
        let next = self.b(idx).next;
        if next != NIL && !self.b(next).allocated {
            self.remove_free(next);
            let n = *self.b(next);
            self.drop_block(next);
            let block = self.bm(idx);
            block.size += n.size;
            block.next = n.next;
            if n.next != NIL {
                self.bm(n.next).prev = idx;
            }
        }
        self.insert_free(idx);
        Ok(())
    }

    fn empty_cache(&mut self, backend: &mut dyn Backend) -> Result<()> {
        self.release_cached_blocks(backend)
    }

    fn trim_to(&mut self, backend: &mut dyn Backend, bytes: u64) -> Result<u64> {
        let mut whole: Vec<(u64, u32)> =
            self.whole_free_segments(None).into_iter().map(|i| (self.b(i).freed_seq, i)).collect();
        whole.sort_unstable();
        for (_, idx) in whole {
            if self.books.reserved() <= bytes {
                break;
            }
            self.release_segment(backend, idx)?;
        }
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
        for info in self.segments.values() {
            let mut used =
                SegmentUse { ptr: info.segment.ptr, size: info.segment.size, allocated: 0, blocks: 0, free_blocks: 0 };
            let mut idx = info.head;
            while idx != NIL {
                let b = self.b(idx);
                used.blocks += 1;
                if b.allocated {
                    used.allocated += b.size;
                } else {
                    used.free_blocks += 1;
                    f.add_free(b.size);
                }
                idx = b.next;
            }
            f.segments.push(used);
        }
        f
    }

    fn segments(&self, _live: &[Granted]) -> Vec<SegmentSnapshot> {
        self.segments
            .values()
            .map(|info| {
                let mut blocks = Vec::new();
                let mut idx = info.head;
                while idx != NIL {
                    let b = self.b(idx);
                    blocks.push(BlockSnapshot {
                        address: b.ptr,
                        size: b.size,
                        requested_size: b.requested,
                        allocated: b.allocated,
                    });
                    idx = b.next;
                }
                SegmentSnapshot {
                    address: info.segment.ptr,
                    total_size: info.segment.size,
                    pool: info.pool,
                    is_expandable: false,
                    blocks,
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests;
