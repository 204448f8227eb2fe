//! `VmmAllocator`: npumem's own pool (the "npumem" family), built on the driver's VMM API.
//!
//! Each pool (small ≤ 1 MiB, large above) owns one VA reservation several times the device's size
//! (address space is cheap; contiguous VA for any request that fits physically is not). Blocks are
//! placed in that range (512-byte quantum) so that freed blocks coalesce by address: in the small
//! pool best fit (lowest address among equals); in the large pool where the block needs the
//! fewest pages that hold no block yet (its end pages shared with live neighbours), then, near
//! the limit and for a block of two pages or more, where it strands the fewest free bytes on
//! held pages, then best fit — with 2 MiB pages, where a block's ends fall decides how much of
//! its end pages lies unused beside a hole. A small HUGE_FIRST block for which no memory is left in the small pool
//! borrows the free part of a large-pool page; a mapping that runs out of memory is retried
//! once where the block needs the fewest pages; a HUGE_FIRST large request that still cannot
//! be mapped, the device being short of free memory, is placed once more with a normal-frame
//! tail: its last page, if unmapped and only partly under it, gets normal frames for just that
//! part (as `direct` maps a block in normal frames when 2 MiB frames run out), and the rest of
//! that page's VA is fenced off while the tail is mapped; failing that, it gets a segment of its
//! own (2 MiB pages, else normal frames for exactly its size, as a bypass request), which needs
//! none of the partly empty end pages around the holes. Physical memory is mapped under blocks
//! on demand, page by page (64 KiB pages in the small pool, 2 MiB in the large one), and stays
//! mapped while idle so that reuse costs no driver call. Physical pages are not tied to
//! addresses: when a request needs pages and the device has no free frames, idle pages (mapped
//! but holding no live block) are unmapped and their physical handles remapped under the new
//! range — stitching scattered free memory into one contiguous block instead of failing. Requests
//! of at least `bypass_threshold` bypass the pools and are mapped directly, preferring giant, then
//! huge pages. Every reclamation step is followed by a new attempt before out-of-memory is
//! reported, with the fragmentation diagnostics in the error.
//!
//! Freed pooled blocks first wait in `RecentFrees` (exact-size stacks): a malloc of a size
//! that waits takes one back in O(1). A miss coalesces them lazily, under pressure only (as
//! glibc's malloc consolidates its fastbins only when its other bins cannot serve): while the
//! pool holds at most 1/`CALM_DIVISOR` of its limit, a small-pool miss takes the best fit in
//! the free space if every page under it is mapped, and the waiting blocks keep waiting.
//! Otherwise — no such place, the large pool, the pool near its limit, HUGE_ONLY, a bypass
//! request — and on
//! every trim, all of them are released into the free space first, so that reclamation and
//! out-of-memory decisions, and placement near the limit, see all free memory. Statistics,
//! snapshots and fragmentation count waiting blocks as the free memory they are.
//!
//! Invariants (asserted by `check_invariants` in test builds):
//! - a page slot holds a handle iff it is mapped; `live` of a slot counts the live and waiting
//!   blocks overlapping it;
//! - a mapped slot with `live == 0` is in the pool's idle set, keyed by the clock when it became
//!   idle (trimming takes the coldest first);
//! - cached handles are held but unmapped, whole pages only (a tail's handle goes back to the
//!   device when it is unmapped);
//! - `reserved_bytes` = (mapped + cached pages) × page size − the bytes tails leave unmapped +
//!   bypass segments;
//! - no free VA lies over a tail's unmapped part (the fence); every block lies on mapped memory;
//! - the pool keeps no record of a live pooled block: every free and snapshot takes the blocks,
//!   as granted, from the owner (a pointer inside a pool's range is pooled); bypass blocks are
//!   in `bypass` (a free unmaps their segment);
//! - the free space keeps no record of what it handed out: every release passes the length its
//!   caller kept;
//! - no page is mapped, no frame allocated and no out-of-memory reported by a malloc while a
//!   block waits (the miss releases them all first).

mod bypass;
mod config;
#[cfg(test)]
mod invariants;
mod mapping;
mod placement;
mod reclaim;
mod records;
mod slots;
mod snapshot;
#[cfg(test)]
mod tests;

pub use config::VmmConfig;
use slots::*;

use rustc_hash::FxHashMap;
use std::collections::BTreeSet;

use super::config::{bad, boolean, number, tokenize};
use super::recent::{RecentFrees, Waiting};
use super::{
    Action, Allocator, BlockSnapshot, Books, Fragmentation, Grant, Granted, PoolKind, PoolStats, Request, Segment,
    SegmentSnapshot, SegmentUse, Tally,
};
use crate::acl::Policy;
use crate::backend::{Backend, PhysHandle};
use crate::error::{AclError, Result};
use crate::units::{MIB, checked_align_up, format_size};
use crate::vm::{PageKind, PageSize, VaSpace};

/// The physical page of the large pool: one 2 MiB frame (or 512 normal frames when no 2 MiB
/// frame is free).
const LARGE_PAGE: u64 = 2 * MIB;
/// Free extents `economical_place` weighs at most (shortest first): past them, the pages a
/// block would save are not worth the time of a slow-path malloc.
const PLACE_SCAN: usize = 64;
/// A miss leaves the waiting blocks waiting (see `malloc_slow`) only while the pool holds at
/// most 1/`CALM_DIVISOR` of its limit: near the limit, every miss coalesces all free memory
/// first, so that a device near full packs as tightly as it can.
const CALM_DIVISOR: u64 = 2;
/// The physical page of the small pool: small enough that scattered small blocks pin little
/// memory, large enough to keep map calls few.
const SMALL_PAGE: u64 = 64 * 1024;

/// A request that bypassed the pools: its own segment.
#[derive(Debug)]
struct Bypass {
    segment: Segment,
    requested: u64,
}

#[derive(Debug)]
pub struct VmmAllocator {
    config: VmmConfig,
    capacity: u64,
    pools: [Option<VmmPool>; 2],
    /// Unmapped physical pages held for remapping, per pool (they have that pool's page size).
    cache: [Vec<(PhysHandle, PageSize)>; 2],
    /// Freed pooled blocks whose release into the free space is deferred.
    recent: RecentFrees,
    bypass: FxHashMap<u64, Bypass>,
    books: Books,
    clock: u64,
}

fn pool_kind(size: u64) -> PoolKind {
    if size <= MIB { PoolKind::Small } else { PoolKind::Large }
}

impl VmmAllocator {
    pub fn new(config: VmmConfig, capacity: u64) -> Self {
        VmmAllocator {
            capacity,
            pools: [None, None],
            cache: [Vec::new(), Vec::new()],
            recent: RecentFrees::new(config.quantum),
            bypass: FxHashMap::default(),
            books: Books::capped(
                PoolStats { max_split_size: u64::MAX, ..Default::default() },
                capacity,
                config.memory_fraction,
            ),
            clock: 0,
            config,
        }
    }

    /// Releases every waiting freed block into its pool's free space.
    fn release_recent(&mut self) -> Result<()> {
        if self.recent.is_empty() {
            return Ok(());
        }
        let clock = self.clock;
        let VmmAllocator { recent, pools, .. } = self;
        let released = recent.iter().try_for_each(|(kind, ptr, size)| {
            pools[kind as usize].as_mut().expect("pool exists").release_block(ptr, size, clock)
        });
        recent.clear();
        released
    }

    pub fn limit(&self) -> u64 {
        self.books.limit()
    }

    fn reserved(&self) -> u64 {
        self.books.reserved()
    }

    /// Whether the pool holds more than 1/`CALM_DIVISOR` of its limit: then waiting blocks are
    /// coalesced on every miss and large blocks are placed to strand the fewest free bytes.
    fn tight(&self) -> bool {
        self.reserved() > self.limit() / CALM_DIVISOR
    }

    /// The page size of `kind`'s pool (set when the pool is made).
    fn page_of(&self, kind: PoolKind) -> u64 {
        self.pools[kind as usize].as_ref().map_or(page_bytes(kind), |p| p.page)
    }

    fn ensure_pool(&mut self, backend: &mut dyn Backend, kind: PoolKind) -> Result<()> {
        if self.pools[kind as usize].is_some() {
            return Ok(());
        }
        let granularity = backend.page_size(PageKind::Normal).bytes();
        let page = page_bytes(kind).max(granularity);
        let len = checked_align_up(self.capacity * VA_FACTOR, LARGE_PAGE).unwrap_or(LARGE_PAGE);
        let base = backend.reserve(len, LARGE_PAGE, None)?;
        self.pools[kind as usize] = Some(VmmPool {
            page,
            base,
            end: base + len,
            space: VaSpace::with_granule(base, base + len, self.config.quantum, "pool's address range").untracked(),
            slots: Vec::new(),
            idle: BTreeSet::new(),
            mapped: 0,
            tail_gap: 0,
        });
        Ok(())
    }

    /// Counts the `segment` statistic as runs of mapped pages: a page with `neighbours` mapped
    /// neighbours was just mapped (`mapped`) or unmapped.
    fn count_runs(&mut self, kind: PoolKind, neighbours: u32, mapped: bool) {
        match (neighbours, mapped) {
            (0, true) | (2, false) => self.books.stats.segment.add(kind, 1),
            (0, false) | (2, true) => self.books.stats.segment.sub(kind, 1),
            _ => {}
        }
    }

    fn pool(&self, kind: PoolKind) -> &VmmPool {
        self.pools[kind as usize].as_ref().expect("pool exists")
    }

    fn pool_mut(&mut self, kind: PoolKind) -> &mut VmmPool {
        self.pools[kind as usize].as_mut().expect("pool exists")
    }
}

impl Allocator for VmmAllocator {
    fn name(&self) -> &'static str {
        "npumem"
    }

    fn malloc(&mut self, backend: &mut dyn Backend, request: &Request) -> Result<Grant> {
        self.clock += 1;
        if let Some((kind, grant)) = self.take_recent(request.size, request.policy) {
            self.books.stats.on_alloc(kind, grant.granted, request.size);
            return Ok(grant);
        }
        self.malloc_slow(backend, request)
    }

    fn malloc_cached(&mut self, sizes: &[u64], policy: Policy, out: &mut Vec<Grant>) -> usize {
        let mut tally = [Tally::default(); 2];
        let mut served = 0;
        // By runs of equal sizes: the route and the stack are found once per run (a run is
        // measured only as far as blocks wait for it, so a miss costs O(1), not a scan).
        while served < sizes.len() {
            let requested = sizes[served];
            let Some((kind, size)) = self.route_cached(requested, policy) else { break };
            if self.pools[kind as usize].is_none() {
                break;
            }
            let rest = &sizes[served..];
            if rest.get(1) != Some(&requested) {
                // A run of one (sizes that vary): the stack's top, without measuring a run.
                let Some(w) = self.recent.pop(kind, size) else { break };
                out.push(Grant { ptr: w.ptr, granted: size, page: w.page });
                tally[kind as usize].add(size, requested);
                served += 1;
                continue;
            }
            let count = |waiting: usize| rest.iter().take(waiting).take_while(|&&s| s == requested).count();
            let Some(taken) = self.recent.take(kind, size, count) else { break };
            let got = taken.len();
            out.extend(taken.rev().map(|w| Grant { ptr: w.ptr, granted: size, page: w.page }));
            if got == 0 {
                break;
            }
            tally[kind as usize].add_many(got as u64, got as u64 * size, got as u64 * requested);
            served += got;
            if got < rest.len() && rest[got] == requested {
                // The stack ran out before the run did.
                break;
            }
        }
        self.clock += served as u64;
        self.books.stats.on_allocs_each(tally);
        served
    }

    fn free(&mut self, backend: &mut dyn Backend, block: &Granted) -> Result<()> {
        match self.take_pooled(block) {
            Some(kind) => {
                self.books.stats.on_free(kind, block.granted, block.requested);
                Ok(())
            }
            None => self.free_bypass(backend, block.ptr),
        }
    }

    fn free_cached(&mut self, blocks: &[Granted]) -> usize {
        let mut tally = [Tally::default(); 2];
        let mut freed = 0;
        for block in blocks {
            let Some(kind) = self.take_pooled(block) else { break };
            tally[kind as usize].add(block.granted, block.requested);
            freed += 1;
        }
        self.books.stats.on_frees_each(tally);
        freed
    }

    fn empty_cache(&mut self, backend: &mut dyn Backend) -> Result<()> {
        self.trim_to(backend, 0).map(|_| ())
    }

    /// Frees cached pages, then unmaps and frees the coldest idle pages, until at most `bytes`
    /// are held.
    fn trim_to(&mut self, backend: &mut dyn Backend, bytes: u64) -> Result<u64> {
        self.release_recent()?;
        while self.reserved() > bytes && self.release_coldest(backend)? {}
        Ok(self.reserved())
    }

    fn books(&self) -> &Books {
        &self.books
    }

    fn books_mut(&mut self) -> &mut Books {
        &mut self.books
    }

    fn fragmentation(&self, live: &[Granted]) -> Fragmentation {
        self.fragmentation_of(live)
    }

    /// One segment per run of mapped pages (as PyTorch reports expandable segments), plus one
    /// per bypass allocation; free space inside a run shows as inactive blocks.
    fn segments(&self, live: &[Granted]) -> Vec<SegmentSnapshot> {
        self.segments_of(live)
    }
}
