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
//! Invariants: a page slot holds a handle iff it is mapped; `live` of a slot counts the live
//! and waiting blocks overlapping it, and a mapped slot with `live == 0` is in the pool's idle
//! set (keyed by the clock when it became idle, so trimming takes the coldest first); cached
//! handles are held but unmapped (whole pages only: a tail's handle goes back to the device when
//! it is unmapped); `reserved_bytes` = (mapped + cached pages) × page size − the bytes tails
//! leave unmapped + bypass segments; a tail's page is the last of its run of mapped pages, and
//! no free VA lies over its unmapped part (the fence); every block lies on mapped memory; a
//! pool's `BlockMap` holds exactly its live blocks (not the waiting ones) — unless the owner
//! keeps their records (`owner_tracked`: a `Device`'s live table, see
//! `Allocator::track_blocks_for_owner`), when the maps stay empty and every free and snapshot
//! takes the blocks, as granted, from the owner; bypass blocks are in `bypass` either way; the
//! free space keeps no record of what it handed out (every release passes the length its caller
//! kept); no page is mapped, no frame allocated and no out-of-memory reported by a malloc while
//! a block waits (the miss releases them all before any of those).

use rustc_hash::FxHashMap;
use std::collections::BTreeSet;

use super::block_map::{Block, BlockMap};
use super::config::{bad, boolean, number, tokenize};
use super::recent::{RecentFrees, Waiting};
use super::{
    Action, Allocator, BlockSnapshot, EventLog, Fragmentation, Grant, Granted, PoolKind, PoolStats, Request, Segment,
    SegmentSnapshot, SegmentUse, Tally,
};
use crate::acl::Policy;
use crate::backend::{Backend, PhysHandle};
use crate::error::{AclError, Result};
use crate::units::{MIB, checked_align_up, format_size};
use crate::vm::{PageKind, PageSize, VaSpace};

/// Settings of the npumem pool.
#[derive(Clone, Debug, PartialEq)]
pub struct VmmConfig {
    /// Block sizes are multiples of this.
    pub quantum: u64,
    /// Requests of at least this many bytes are mapped directly, outside the pools.
    pub bypass_threshold: u64,
    /// Fraction of the device this pool may hold.
    pub memory_fraction: f64,
    /// Trim idle pages once held memory passes this fraction of the limit (0 = off).
    pub garbage_collection_threshold: f64,
    pub alloc_conf: String,
}

impl Default for VmmConfig {
    fn default() -> Self {
        VmmConfig {
            quantum: 512,
            bypass_threshold: 512 * MIB,
            memory_fraction: 1.0,
            garbage_collection_threshold: 0.0,
            alloc_conf: String::new(),
        }
    }
}

impl VmmConfig {
    /// Parses `key:value,...` (keys: per_process_memory_fraction, garbage_collection_threshold,
    /// large_threshold_mb; `expandable_segments:True` is accepted, as the pool always is one).
    pub fn parse(alloc_conf: &str) -> Result<Self> {
        let mut c = VmmConfig { alloc_conf: alloc_conf.to_string(), ..Default::default() };
        let tokens = tokenize(alloc_conf);
        let items: Vec<&[String]> = tokens.split(|t| t == ",").filter(|p| !p.is_empty()).collect();
        for item in items {
            let [key, colon, value] = item else {
                return Err(bad(format!("alloc_conf entries look like key:value, got {:?}", item.concat())));
            };
            if colon != ":" {
                return Err(bad(format!("expected ':' in {:?}", item.concat())));
            }
            match key.as_str() {
                "per_process_memory_fraction" => {
                    let f = number(key, value)?;
                    if f > 1.0 {
                        return Err(bad(format!("per_process_memory_fraction must be in [0, 1], got {value}")));
                    }
                    c.memory_fraction = f;
                }
                "garbage_collection_threshold" => {
                    let t = number(key, value)?;
                    if !(t > 0.0 && t < 1.0) {
                        return Err(bad(format!("garbage_collection_threshold must be in (0, 1), got {value}")));
                    }
                    c.garbage_collection_threshold = t;
                }
                "large_threshold_mb" => {
                    let mb = number(key, value)?;
                    if mb < 2.0 {
                        return Err(bad(format!("large_threshold_mb must be at least 2, got {value}")));
                    }
                    c.bypass_threshold = (mb * MIB as f64) as u64;
                }
                "expandable_segments" => {
                    if !boolean(key, value)? {
                        return Err(bad("the npumem pool is always expandable; use the pytorch family for \
                                        expandable_segments:False"
                            .into()));
                    }
                }
                other => {
                    return Err(bad(format!(
                        "unknown alloc_conf key {other:?} for the npumem allocator; known keys: \
                         per_process_memory_fraction, garbage_collection_threshold, large_threshold_mb, \
                         expandable_segments"
                    )));
                }
            }
        }
        Ok(c)
    }
}

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
/// How many blocks ahead the batch paths (`malloc_cached`, `free_cached`) ask for a block's
/// record (`BlockMap::prefetch`, for a pool that keeps its own map): with 10^6 live blocks the
/// records miss the cache.
const LOOK_AHEAD: usize = 16;

/// The page size of `kind`'s pool on a backend whose smallest physical allocation is at most
/// this (a pool takes its backend's granularity where that is larger: a GPU's 2 MiB).
fn page_bytes(kind: PoolKind) -> u64 {
    match kind {
        PoolKind::Small => SMALL_PAGE,
        PoolKind::Large => LARGE_PAGE,
    }
}
const NO_HANDLE: PhysHandle = 0;
/// Each pool reserves this many times the device's capacity of VA, so that live blocks scattered
/// through it do not leave it without a contiguous range for a request that fits in physical
/// memory (page tables grow lazily, so unused VA costs nothing).
const VA_FACTOR: u64 = 4;

#[derive(Clone, Copy, Debug)]
struct Slot {
    handle: PhysHandle,
    /// PTE size of the mapped handle (2 MiB, or normal pages when huge frames ran out).
    page: PageSize,
    /// 0 for a whole page; else a normal-frame tail: only the page's first `tail` ×
    /// [`TAIL_UNIT`] bytes are mapped, and the rest of the page's VA is fenced off (reserved in
    /// the pool's free space) for as long as the slot is mapped.
    tail: u16,
    live: u32,
    idle_since: u64,
}

impl Slot {
    const EMPTY: Slot = Slot { handle: NO_HANDLE, page: PageSize::Size4K, tail: 0, live: 0, idle_since: 0 };
}

/// The unit in which a normal-frame tail's mapped length is kept (the smallest normal page).
const TAIL_UNIT: u64 = 4096;

#[derive(Debug)]
struct VmmPool {
    page: u64,
    base: u64,
    end: u64,
    /// The free extents of the range (`untracked`: the length of every reserved range is in
    /// `blocks`, the waiting stacks, or the fence's tail slot, and is passed back on release).
    space: VaSpace,
    /// The live blocks, by start address.
    blocks: BlockMap,
    slots: Vec<Slot>,
    idle: BTreeSet<(u64, u32)>,
    mapped: u64,
    /// Bytes the normal-frame tails leave unmapped on their pages: the pool holds `mapped`
    /// pages minus these.
    tail_gap: u64,
}

impl VmmPool {
    fn pages_of(&self, ptr: u64, size: u64) -> std::ops::Range<usize> {
        // Pages are powers of two (64 KiB, 2 MiB): shifts, not divisions (placement calls this
        // for many candidates).
        let shift = self.page.trailing_zeros();
        let first = (ptr - self.base) >> shift;
        let last = (ptr + size - 1 - self.base) >> shift;
        first as usize..last as usize + 1
    }

    fn page_va(&self, i: usize) -> u64 {
        self.base + i as u64 * self.page
    }

    /// The slot of page `i`, growing the table on first touch (VA is handed out from the bottom
    /// up, so the table stays as long as the highest address used).
    fn slot_mut(&mut self, i: usize) -> &mut Slot {
        if i >= self.slots.len() {
            self.slots.resize(i + 1, Slot::EMPTY);
        }
        &mut self.slots[i]
    }

    fn slot(&self, i: usize) -> Slot {
        self.slots.get(i).copied().unwrap_or(Slot::EMPTY)
    }

    /// How many of page `i`'s two neighbours its mapping joins: mapping `i` starts a segment (a
    /// run of mapped pages) when none is, joins two when both are; unmapping it does the
    /// reverse. A normal-frame tail ends its run (the VA after its mapped part is not mapped).
    fn mapped_neighbours(&self, i: usize) -> u32 {
        let joins_left = i.checked_sub(1).map(|j| self.slot(j)).is_some_and(|s| s.handle != NO_HANDLE && s.tail == 0);
        let joins_right = self.slot(i).tail == 0 && self.slot(i + 1).handle != NO_HANDLE;
        joins_left as u32 + joins_right as u32
    }

    /// The bytes mapped at page `i`'s start (the page, or a normal-frame tail's part of it).
    fn mapped_len(&self, i: usize) -> u64 {
        match self.slot(i).tail {
            0 => self.page,
            units => u64::from(units) * TAIL_UNIT,
        }
    }

    /// The pages a block at `[ptr, ptr + size)`, inside one free extent, would take from the
    /// free memory: the pages under it that hold no block (an unmapped one needs a new page, an
    /// idle one is a page that could serve elsewhere). Only its first and last page can hold
    /// blocks (the others lie inside the free extent), so this is O(1).
    fn pages_needed(&self, ptr: u64, size: u64) -> usize {
        let pages = self.pages_of(ptr, size);
        let shared = |i: usize| usize::from(self.slot(i).live > 0);
        let (first, last) = (pages.start, pages.end - 1);
        pages.len() - shared(first) - if last > first { shared(last) } else { 0 }
    }

    /// The free bytes of the extent `[start, end)` that a block at `[ptr, ptr + size)` would
    /// leave on held pages: the parts of the two pieces beside it that lie on its own end pages
    /// or on the extent's end pages (which hold the live neighbours when the extent's ends are
    /// not page-aligned). The large pool's blocks are over 1 MiB, so such scraps mostly stay
    /// empty while their pages are held.
    fn stranded(&self, start: u64, end: u64, ptr: u64, size: u64) -> u64 {
        let page = self.page;
        let (s, e, p, q) = (start - self.base, end - self.base, ptr - self.base, ptr + size - self.base);
        let left = {
            let near = if s % page != 0 { s.div_ceil(page) * page } else { s }.min(p);
            let far = (p / page * page).max(s);
            if far <= near { p - s } else { (near - s) + (p - far) }
        };
        let right = {
            let near = if e % page != 0 { e / page * page } else { e }.max(q);
            let far = (q.div_ceil(page) * page).min(e);
            if far >= near { e - q } else { (far - q) + (e - near) }
        };
        left + right
    }

    /// Where a block of `size` bytes (a multiple of `quantum`) needs the fewest pages: in each
    /// free extent that fits it, at its start or end, or with one end on a page boundary; the
    /// fewest pages, then — when `tight` (the pool near its limit) and for a block of at least
    /// two pages — the fewest free bytes stranded on held pages beside it (see `stranded`), then
    /// the shortest extent, then the lowest address. (Far from the limit the shortest extent
    /// comes first, as it reuses mapped holes rather than growing the pool; shorter blocks skip
    /// the second rule: packed against a neighbour, whatever the scrap, they fared better on
    /// the repository's traces; docs/benchmarks.md, issue #17.)
    /// Extents are taken
    /// shortest first and the search stops at a placement that needs as few pages as any
    /// position could (all but the two end pages) or after [`PLACE_SCAN`] extents. Returns the
    /// address and the pages it needs.
    fn economical_place(&self, size: u64, quantum: u64, tight: bool) -> Option<(u64, usize)> {
        let page = self.page;
        // No placement needs fewer: all but its two end pages lie wholly under the block.
        let floor = (size.div_ceil(page) as usize).saturating_sub(2);
        let mut best: Option<(usize, u64, u64, u64)> = None;
        for (start, len) in self.space.free_extents_by_len(size).take(PLACE_SCAN) {
            let end = start + len;
            // The extent that runs to the end of the range (the untouched top) is taken from
            // its start only: a block at the range's far end would start a second front of
            // partly used pages.
            let top = end == self.end;
            let last = (!top).then(|| (end - size) / quantum * quantum);
            let page_start = start.div_ceil(page) * page;
            let page_end = (end / page * page).checked_sub(size).filter(|_| !top);
            for ptr in [Some(start), last, Some(page_start), page_end] {
                let Some(ptr) = ptr.filter(|&p| p >= start && p + size <= end) else { continue };
                let stranded = if tight && size >= 2 * page { self.stranded(start, end, ptr, size) } else { 0 };
                let key = (self.pages_needed(ptr, size), stranded, len, ptr);
                if best.is_none_or(|b| key < b) {
                    best = Some(key);
                }
            }
            if best.is_some_and(|b| b.0 <= floor) {
                break;
            }
        }
        best.map(|(needed, _, _, ptr)| (ptr, needed))
    }

    /// Gives the block `[ptr, ptr + size)` back to the free space; pages it leaves without a
    /// block become idle as of `clock`.
    fn release_block(&mut self, ptr: u64, size: u64, clock: u64) -> Result<()> {
        self.space.release_range(ptr, size)?;
        for i in self.pages_of(ptr, size) {
            let slot = self.slot_mut(i);
            slot.live -= 1;
            if slot.live == 0 {
                slot.idle_since = clock;
                self.idle.insert((clock, i as u32));
            }
        }
        Ok(())
    }
}

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
    stats: PoolStats,
    clock: u64,
    events: EventLog,
    /// The owner keeps the records of the pooled blocks (see `track_blocks_for_owner`): the
    /// pools' `BlockMap`s stay empty, and frees and snapshots take the blocks from the owner.
    owner_tracked: bool,
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
            stats: PoolStats { max_split_size: u64::MAX, ..Default::default() },
            clock: 0,
            events: EventLog::default(),
            owner_tracked: false,
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
        (self.capacity as f64 * self.config.memory_fraction) as u64
    }

    fn reserved(&self) -> u64 {
        self.stats.reserved_bytes.all.current
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
            blocks: BlockMap::new(base, page, self.config.quantum),
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
            (0, true) | (2, false) => self.stats.segment.add(kind, 1),
            (0, false) | (2, true) => self.stats.segment.sub(kind, 1),
            _ => {}
        }
    }

    fn pool(&self, kind: PoolKind) -> &VmmPool {
        self.pools[kind as usize].as_ref().expect("pool exists")
    }

    fn pool_mut(&mut self, kind: PoolKind) -> &mut VmmPool {
        self.pools[kind as usize].as_mut().expect("pool exists")
    }

    /// A physical page for `kind`'s pool: a cached one, else a new one (a 2 MiB frame for the
    /// large pool when one is free, else normal frames), within the limit.
    fn acquire(
        &mut self,
        backend: &mut dyn Backend,
        kind: PoolKind,
        huge_only: bool,
    ) -> Result<(PhysHandle, PageSize)> {
        let cache = &mut self.cache[kind as usize];
        let cached = if huge_only {
            cache.iter().rposition(|&(_, pte)| pte == PageSize::Size2M).map(|i| cache.swap_remove(i))
        } else {
            cache.pop()
        };
        if let Some(cached) = cached {
            return Ok(cached);
        }
        let page = self.page_of(kind);
        self.check_limit(page)?;
        let normal_pte = backend.page_size(PageKind::Normal);
        let (h, pte) = match kind {
            PoolKind::Small => (backend.create_physical(page, PageKind::Normal)?, normal_pte),
            PoolKind::Large => match backend.create_physical(page, PageKind::Huge) {
                Ok(h) => (h, PageSize::Size2M),
                // No free 2 MiB frame: the page is made of normal frames instead (not for HUGE_ONLY).
                Err(e) if e.code.is_out_of_memory() && !huge_only => {
                    (backend.create_physical(page, PageKind::Normal)?, normal_pte)
                }
                Err(e) => return Err(e),
            },
        };
        self.stats.on_page_alloc(kind, page);
        Ok((h, pte))
    }

    /// Out of memory if `bytes` more would pass the pool's limit.
    fn check_limit(&self, bytes: u64) -> Result<()> {
        if self.reserved() + bytes > self.limit() {
            return Err(AclError::oom(format!(
                "the npumem pool's limit of {} (memory fraction {}) is reached",
                format_size(self.limit()),
                self.config.memory_fraction
            )));
        }
        Ok(())
    }

    /// Unmaps the coldest idle page of `kind`'s pool, skipping the pages in `keep` (about to be
    /// used), and caches its handle. Returns false when no such page is left.
    fn unmap_coldest(
        &mut self,
        backend: &mut dyn Backend,
        kind: PoolKind,
        keep: std::ops::Range<usize>,
    ) -> Result<bool> {
        let Some(pool) = self.pools[kind as usize].as_mut() else { return Ok(false) };
        let Some(&(_, i)) = pool.idle.iter().find(|&&(_, i)| !keep.contains(&(i as usize))) else { return Ok(false) };
        self.unmap_page(backend, kind, i as usize)?;
        Ok(true)
    }

    /// Returns one cached page of `kind`'s pool to the device.
    fn free_cached(&mut self, backend: &mut dyn Backend, kind: PoolKind) -> Result<bool> {
        let Some(&(h, _)) = self.cache[kind as usize].last() else { return Ok(false) };
        backend.free_physical(h)?;
        self.cache[kind as usize].pop();
        self.stats.on_page_free(kind, self.page_of(kind));
        Ok(true)
    }

    /// Returns one page of `kind`'s pool to the device: a cached one, else its coldest idle one.
    fn release_one(&mut self, backend: &mut dyn Backend, kind: PoolKind) -> Result<bool> {
        if self.free_cached(backend, kind)? {
            return Ok(true);
        }
        if !self.unmap_coldest(backend, kind, 0..0)? {
            return Ok(false);
        }
        // A whole page went to the (empty) cache; a normal-frame tail went to the device.
        self.free_cached(backend, kind)?;
        Ok(true)
    }

    /// One step of giving memory back so that `kind`'s pool can grow: a page of the other pool
    /// (which has another page size, so it cannot be remapped here).
    fn release_foreign(&mut self, backend: &mut dyn Backend, kind: PoolKind) -> Result<bool> {
        let other = match kind {
            PoolKind::Small => PoolKind::Large,
            PoolKind::Large => PoolKind::Small,
        };
        self.release_one(backend, other)
    }

    /// Returns one page to the device: a cached page if there is one, else the coldest idle page
    /// of either pool.
    fn release_coldest(&mut self, backend: &mut dyn Backend) -> Result<bool> {
        for kind in [PoolKind::Large, PoolKind::Small] {
            if self.free_cached(backend, kind)? {
                return Ok(true);
            }
        }
        let coldest = |k: PoolKind| self.pools[k as usize].as_ref().and_then(|p| p.idle.first()).map(|&(t, _)| t);
        let kind = match (coldest(PoolKind::Small), coldest(PoolKind::Large)) {
            (Some(s), Some(l)) if s < l => PoolKind::Small,
            (Some(_), None) => PoolKind::Small,
            (_, Some(_)) => PoolKind::Large,
            (None, None) => return Ok(false),
        };
        self.release_one(backend, kind)
    }

    /// The normal-frame tail a block that ends at `end` in `kind`'s pool could have: its last
    /// page and the bytes to map at that page's start (the block's part of it, in normal
    /// pages), if the page is unmapped and that part is less than the page.
    fn tail_at(&self, backend: &dyn Backend, kind: PoolKind, end: u64) -> Option<(usize, u64)> {
        let unit = backend.page_size(PageKind::Normal).bytes().max(TAIL_UNIT);
        let pool = self.pool(kind);
        let last = pool.pages_of(end - 1, 1).start;
        let len = checked_align_up(end - pool.page_va(last), unit)?;
        (pool.slot(last).handle == NO_HANDLE && len < pool.page && len % TAIL_UNIT == 0).then_some((last, len))
    }

    /// The tail of `tail_at`, with the rest of its page's VA (free: no block lies on an unmapped
    /// page) fenced off, so that no block is placed over memory the tail does not map.
    fn tail_of(&mut self, backend: &dyn Backend, kind: PoolKind, end: u64) -> Result<Option<(usize, u64)>> {
        let Some((last, len)) = self.tail_at(backend, kind, end) else { return Ok(None) };
        let quantum = self.config.quantum;
        let pool = self.pool_mut(kind);
        pool.space.reserve_at(pool.page_va(last) + len, pool.page - len, quantum)?;
        Ok(Some((last, len)))
    }

    /// Normal frames for a tail of `len` bytes in `kind`'s pool, within the limit.
    fn acquire_tail(&mut self, backend: &mut dyn Backend, kind: PoolKind, len: u64) -> Result<(PhysHandle, PageSize)> {
        self.check_limit(len)?;
        let h = backend.create_physical(len, PageKind::Normal)?;
        self.stats.on_page_alloc(kind, len);
        Ok((h, backend.page_size(PageKind::Normal)))
    }

    /// Maps every unmapped page under `[ptr, ptr + size)` of `kind`'s pool and counts the block
    /// on each page. With `tail`, an unmapped last page that the block covers only in part gets
    /// a normal-frame tail (see `tail_of`). On failure nothing is left changed.
    fn map_range(
        &mut self,
        backend: &mut dyn Backend,
        kind: PoolKind,
        ptr: u64,
        size: u64,
        huge_only: bool,
        tail: bool,
    ) -> Result<PageSize> {
        let range = self.pool(kind).pages_of(ptr, size);
        let tail = if tail { self.tail_of(backend, kind, ptr + size)? } else { None };
        if huge_only {
            // Idle pages of normal frames under a HUGE_ONLY block are unmapped (their handles
            // cached) so that 2 MiB frames take their place; `place_huge_only` kept the block
            // off such pages that hold live blocks.
            for i in range.clone() {
                let slot = self.pool(kind).slot(i);
                if slot.handle != NO_HANDLE && slot.page != PageSize::Size2M {
                    debug_assert_eq!(slot.live, 0, "placement avoids live normal-frame pages");
                    self.unmap_page(backend, kind, i)?;
                }
            }
        }
        let needed: Vec<usize> = range.clone().filter(|&i| self.pool(kind).slot(i).handle == NO_HANDLE).collect();
        let mut done: Vec<usize> = Vec::with_capacity(needed.len());
        for &i in &needed {
            let tail_len = tail.filter(|&(t, _)| t == i).map(|(_, len)| len);
            let got = loop {
                let got = match tail_len {
                    Some(len) => self.acquire_tail(backend, kind, len),
                    None => self.acquire(backend, kind, huge_only),
                };
                match got {
                    Ok(h) => break Ok(h),
                    // HUGE_ONLY cannot use cached normal-frame pages: give them back first, so
                    // that their frames can merge into 2 MiB ones (a tail, which takes no cached
                    // page, gives any back). Then stitching: unmap an idle page of this pool and
                    // map its memory here; else give the other pool's spare memory back to the
                    // device and try again.
                    Err(e) if e.code.is_out_of_memory() => {
                        let reclaimed = (huge_only && self.free_cached_normal(backend, kind)?)
                            || (tail_len.is_some() && self.free_cached(backend, kind)?)
                            || self.unmap_coldest(backend, kind, range.clone())?
                            || self.release_foreign(backend, kind)?;
                        if !reclaimed {
                            break Err(e);
                        }
                    }
                    Err(e) => break Err(e),
                }
            };
            let mapped = got.and_then(|(h, pte)| {
                let va = self.pool(kind).page_va(i);
                backend.map(va, h).map(|()| (h, pte)).inspect_err(|_| match tail_len {
                    // A tail's handle has no page's size: it goes back to the device.
                    Some(len) => {
                        if backend.free_physical(h).is_ok() {
                            self.stats.on_page_free(kind, len);
                        }
                    }
                    None => self.cache[kind as usize].push((h, pte)),
                })
            });
            match mapped {
                Ok((h, pte)) => {
                    let pool = self.pool_mut(kind);
                    let (va, page) = (pool.page_va(i), pool.page);
                    let len = tail_len.unwrap_or(page);
                    let units = if len < page { (len / TAIL_UNIT) as u16 } else { 0 };
                    *pool.slot_mut(i) = Slot { handle: h, page: pte, tail: units, live: 0, idle_since: 0 };
                    pool.mapped += 1;
                    pool.tail_gap += page - len;
                    let neighbours = pool.mapped_neighbours(i);
                    self.count_runs(kind, neighbours, true);
                    self.events.push(Action::SegmentMap, va, len);
                    done.push(i);
                }
                Err(e) => {
                    // The pages mapped for the failed request stay mapped, idle (no driver call
                    // that could fail again); the caller gives back what the pool gained. The
                    // fence of a tail not mapped goes.
                    let clock = self.clock;
                    let pool = self.pool_mut(kind);
                    for &j in &done {
                        pool.slot_mut(j).idle_since = clock;
                        pool.idle.insert((clock, j as u32));
                    }
                    if let Some((t, len)) = tail.filter(|&(t, _)| !done.contains(&t)) {
                        let page = pool.page;
                        pool.space.release_range(pool.page_va(t) + len, page - len)?;
                    }
                    return Err(e);
                }
            }
        }
        let pool = self.pool_mut(kind);
        let mut smallest = PageSize::Size1G;
        for i in range.clone() {
            let slot = pool.slot_mut(i);
            let (live, since) = (slot.live, slot.idle_since);
            slot.live += 1;
            smallest = smallest.min(slot.page);
            if live == 0 {
                pool.idle.remove(&(since, i as u32));
            }
        }
        // A block over pages of both kinds (HUGE_FIRST after 2 MiB frames ran out) reports the
        // smaller: what every byte of it is guaranteed.
        Ok(smallest)
    }

    /// Places a HUGE_ONLY block of `size` bytes in the large pool where every page it covers can
    /// hold a 2 MiB frame: pages mapped with normal frames under live blocks are fenced off
    /// while searching (their free parts reserved, then released again), so best fit moves on
    /// to the next candidate. Terminates: each round fences at least one more page.
    fn place_huge_only(&mut self, size: u64) -> Result<u64> {
        let quantum = self.config.quantum;
        let pool = self.pool_mut(PoolKind::Large);
        let mut fences = Vec::new();
        let mut search = || -> Result<u64> {
            loop {
                let ptr = pool.space.reserve(size, quantum)?;
                let pinned: Vec<usize> = pool
                    .pages_of(ptr, size)
                    .filter(|&i| {
                        let s = pool.slot(i);
                        s.handle != NO_HANDLE && s.page != PageSize::Size2M && s.live > 0
                    })
                    .collect();
                if pinned.is_empty() {
                    return Ok(ptr);
                }
                pool.space.release_range(ptr, size)?;
                for i in pinned {
                    let lo = pool.page_va(i);
                    for (start, len) in pool.space.free_extents_in(lo, lo + pool.page) {
                        fences.push((pool.space.reserve_at(start, len, quantum)?, len));
                    }
                }
            }
        };
        let placed = search();
        for (fence, len) in fences {
            pool.space.release_range(fence, len)?;
        }
        placed
    }

    /// Unmaps the mapped page `i` of `kind`'s pool that holds no block and caches its handle (a
    /// normal-frame tail's goes back to the device, and its fence with it). A driver failure
    /// leaves it mapped and idle, as it was.
    fn unmap_page(&mut self, backend: &mut dyn Backend, kind: PoolKind, i: usize) -> Result<()> {
        let pool = self.pools[kind as usize].as_mut().expect("pool exists");
        let slot = pool.slot(i);
        debug_assert!(slot.handle != NO_HANDLE && slot.live == 0);
        let (va, len) = (pool.page_va(i), pool.mapped_len(i));
        backend.unmap(va)?;
        pool.idle.remove(&(slot.idle_since, i as u32));
        pool.slot_mut(i).handle = NO_HANDLE;
        pool.mapped -= 1;
        let neighbours = pool.mapped_neighbours(i);
        self.events.push(Action::SegmentUnmap, va, len);
        if slot.tail != 0 {
            pool.slot_mut(i).tail = 0;
            pool.tail_gap -= pool.page - len;
            let page = pool.page;
            pool.space.release_range(va + len, page - len)?;
            self.count_runs(kind, neighbours, false);
            backend.free_physical(slot.handle)?;
            self.stats.on_page_free(kind, len);
            return Ok(());
        }
        self.count_runs(kind, neighbours, false);
        self.cache[kind as usize].push((slot.handle, slot.page));
        Ok(())
    }

    /// Returns one cached page of `kind`'s pool made of normal frames to the device.
    fn free_cached_normal(&mut self, backend: &mut dyn Backend, kind: PoolKind) -> Result<bool> {
        let cache = &mut self.cache[kind as usize];
        let Some(at) = cache.iter().rposition(|&(_, pte)| pte != PageSize::Size2M) else { return Ok(false) };
        backend.free_physical(cache[at].0)?;
        cache.swap_remove(at);
        self.stats.on_page_free(kind, self.page_of(kind));
        Ok(true)
    }

    /// A request that bypasses the pools gets its own segment, trying the page kinds of `plan` in
    /// order (for HUGE_FIRST: giant, then huge, then normal), each only if its page-rounded size
    /// fits under the limit; when none can be had, cached and idle pages go back to the device and
    /// the kinds are tried again.
    fn malloc_bypass(
        &mut self,
        backend: &mut dyn Backend,
        request: &Request,
        size: u64,
        plan: &[PageKind],
    ) -> Result<Grant> {
        let segment = 'found: loop {
            let mut last = None;
            for &kind in plan {
                let rounded = checked_align_up(size, backend.page_size(kind).bytes()).unwrap_or(u64::MAX);
                if self.reserved().saturating_add(rounded) > self.limit() {
                    last = Some(AclError::oom(format!(
                        "{} in {} pages would pass the npumem pool's limit of {}",
                        format_size(rounded),
                        backend.page_size(kind).label(),
                        format_size(self.limit())
                    )));
                    continue;
                }
                match Segment::map(backend, size, &[kind]) {
                    Ok(s) => break 'found s,
                    Err(e) if e.code.is_out_of_memory() => last = Some(e),
                    Err(e) => return Err(e),
                }
            }
            if !self.release_coldest(backend)? {
                return Err(last.unwrap_or_else(|| AclError::internal("no page kind tried")));
            }
        };
        self.stats.on_segment_alloc(PoolKind::Large, segment.size);
        self.stats.num_cache_misses += 1;
        self.stats.oversize_segments.add(1);
        self.events.push(Action::SegmentAlloc, segment.ptr, segment.size);
        let grant = Grant { ptr: segment.ptr, granted: segment.size, page: segment.page };
        self.bypass.insert(segment.ptr, Bypass { segment, requested: request.size });
        self.stats.on_alloc(PoolKind::Large, grant.granted, request.size);
        self.stats.oversize_allocations.add(1);
        Ok(grant)
    }

    /// `kind`'s pool as if its waiting blocks were released: its free extents (coalesced, in
    /// address order) and how many of its pages would be idle.
    fn settled_view(&self, kind: PoolKind, pool: &VmmPool) -> (Vec<(u64, u64)>, u64) {
        let waiting: Vec<(u64, u64)> =
            self.recent.iter().filter(|&(k, _, _)| k == kind).map(|(_, ptr, size)| (ptr, size)).collect();
        let mut extents: Vec<(u64, u64)> = pool.space.free_extents().chain(waiting.iter().copied()).collect();
        if waiting.is_empty() {
            return (extents, pool.idle.len() as u64);
        }
        extents.sort_unstable();
        let mut merged: Vec<(u64, u64)> = Vec::with_capacity(extents.len());
        for (start, len) in extents {
            match merged.last_mut() {
                Some((s, l)) if *s + *l == start => *l += len,
                _ => merged.push((start, len)),
            }
        }
        let mut on_page: FxHashMap<usize, u32> = FxHashMap::default();
        for &(ptr, size) in &waiting {
            for i in pool.pages_of(ptr, size) {
                *on_page.entry(i).or_default() += 1;
            }
        }
        let freed = on_page.iter().filter(|&(&i, &n)| pool.slot(i).live == n).count();
        (merged, pool.idle.len() as u64 + freed as u64)
    }

    /// A malloc that the waiting blocks cannot serve: release them, then bypass or search.
    #[cold]
    #[inline(never)]
    fn malloc_slow(&mut self, backend: &mut dyn Backend, request: &Request) -> Result<Grant> {
        let size = checked_align_up(request.size, self.config.quantum)
            .filter(|&s| s <= self.capacity)
            .ok_or_else(|| AclError::oom(format!("{} is larger than the device", format_size(request.size))))?;
        // The policy picks the pages: NORMAL_ONLY uses the normal-page pool at any size,
        // HUGE_ONLY the 2 MiB pool with no normal-frame fallback, HUGE1G_ONLY giant pages only;
        // HUGE_FIRST goes by size. Requests from `bypass_threshold` up get their own segment.
        let policy = request.policy.base();
        let (kind, plan): (PoolKind, &[PageKind]) = match policy {
            Policy::NormalOnly => (PoolKind::Small, &[PageKind::Normal]),
            Policy::HugeOnly => (PoolKind::Large, &[PageKind::Huge]),
            Policy::Huge1gOnly => (PoolKind::Large, &[PageKind::Giant]),
            _ => (pool_kind(size), &[PageKind::Giant, PageKind::Huge, PageKind::Normal]),
        };
        let bypass = size >= self.config.bypass_threshold || policy == Policy::Huge1gOnly;
        let huge_only = policy == Policy::HugeOnly;
        if bypass {
            self.release_recent()?;
            return self.malloc_bypass(backend, request, size, plan).map_err(|e| self.oom(e, request));
        }
        if self.config.garbage_collection_threshold > 0.0 {
            let target = (self.config.garbage_collection_threshold * self.limit() as f64) as u64;
            if self.reserved() > target {
                self.trim_to(backend, target)?;
            }
        }
        // Waiting blocks are coalesced only under pressure (as glibc's malloc consolidates its
        // fastbins only when its other bins cannot serve): while the pool holds at most
        // 1/`CALM_DIVISOR` of its limit and its free space has room for the block on pages
        // already mapped, the block goes there and the waiting blocks keep waiting for their
        // sizes. Otherwise they are all released and coalesced first, and the search sees all
        // free memory (the tightest packing, for a device near full).
        if !huge_only && !self.recent.is_empty() && !self.tight() {
            if let Some((ptr, page)) = self.place_on_mapped(backend, kind, size)? {
                self.note_live(kind, ptr, Block { size, requested: request.size, page });
                self.stats.on_alloc(kind, size, request.size);
                return Ok(Grant { ptr, granted: size, page });
            }
        }
        self.release_recent()?;
        let device_allocs = self.stats.num_device_alloc;
        let (kind, ptr, page) = match self.malloc_in(backend, kind, size, huge_only) {
            Ok((ptr, page)) => (kind, ptr, page),
            // A small block that finds no memory for the small pool's pages may still fit in the
            // free parts of the large pool's pages (the ends of holes between large blocks):
            // where its policy lets it take any page, it goes there. Failing that, the block
            // gets a mapping of its own (see `malloc_alone`).
            Err(e) if e.code.is_out_of_memory() => {
                let huge_first = policy == Policy::HugeFirst;
                let borrowed =
                    (kind == PoolKind::Small && huge_first).then(|| self.place_large(backend, size, false)).flatten();
                let short = borrowed.is_none() && self.short_of_memory(backend, kind, size);
                let tailed =
                    (short && kind == PoolKind::Large && huge_first).then(|| self.place_large(backend, size, true));
                match borrowed.or(tailed.flatten()) {
                    Some((ptr, page)) => (PoolKind::Large, ptr, page),
                    None if short => {
                        return self
                            .malloc_alone(backend, request, size, kind, policy)
                            .map_err(|_| self.oom(e, request));
                    }
                    None => return Err(self.oom(e, request)),
                }
            }
            Err(e) => return Err(e),
        };
        if self.stats.num_device_alloc > device_allocs {
            self.stats.num_cache_misses += 1;
        }
        self.note_live(kind, ptr, Block { size, requested: request.size, page });
        self.stats.on_alloc(kind, size, request.size);
        Ok(Grant { ptr, granted: size, page })
    }

    /// Whether the device, within the pool's limit, has less free memory than any placement of
    /// a block of `size` bytes in `kind`'s pool could need (its pages, plus one where it
    /// straddles a boundary): only then can the pool's failure be for want of memory that a
    /// segment of its own, in smaller pages, might still find. A failure with that much free is
    /// the driver's, and is reported.
    fn short_of_memory(&self, backend: &dyn Backend, kind: PoolKind, size: u64) -> bool {
        let page = self.page_of(kind);
        let most = size.div_ceil(page).saturating_add(1).saturating_mul(page);
        let (free, _) = backend.mem_info(crate::acl::MemScope::All);
        free.min(self.limit().saturating_sub(self.reserved())) < most
    }

    /// The last resort of a pooled request that its pool cannot map for want of memory (see
    /// `short_of_memory`): a segment of its own, as a bypass request gets (idle and cached pages
    /// go back to the device first), in the pages its policy allows: 2 MiB, else normal frames
    /// for exactly its size, as the direct family maps. With 2 MiB pool pages, the partly empty
    /// end pages of the blocks placed around it can be what is missing; a segment of normal
    /// frames needs none of them.
    #[cold]
    fn malloc_alone(
        &mut self,
        backend: &mut dyn Backend,
        request: &Request,
        size: u64,
        kind: PoolKind,
        policy: Policy,
    ) -> Result<Grant> {
        let plan: &[PageKind] = match (policy, kind) {
            (Policy::HugeOnly, _) => &[PageKind::Huge],
            (_, PoolKind::Small) => &[PageKind::Normal],
            (_, PoolKind::Large) => &[PageKind::Huge, PageKind::Normal],
        };
        self.malloc_bypass(backend, request, size, plan)
    }

    /// Places a block of `size` bytes in `kind`'s pool (HUGE_ONLY: off normal-frame pages;
    /// large pool: fewest pages first; small pool: best fit) and maps its pages (see
    /// `place_and_map`).
    fn malloc_in(
        &mut self,
        backend: &mut dyn Backend,
        kind: PoolKind,
        size: u64,
        huge_only: bool,
    ) -> Result<(u64, PageSize)> {
        self.ensure_pool(backend, kind)?;
        let quantum = self.config.quantum;
        let tight = self.tight();
        let pool = self.pool_mut(kind);
        let ptr = if huge_only {
            self.place_huge_only(size)?
        } else if kind == PoolKind::Large {
            // 2 MiB pages: where a block's ends fall decides how much of its end pages lies
            // unused beside a hole, so placement counts pages first (see `economical_place`).
            match pool.economical_place(size, quantum, tight) {
                Some((ptr, _)) => pool.space.reserve_at(ptr, size, quantum)?,
                None => pool.space.reserve(size, quantum)?,
            }
        } else {
            pool.space.reserve(size, quantum)?
        };
        self.place_and_map(backend, kind, ptr, size, huge_only, false)
    }

    /// Places a block of `size` bytes in the small pool's free space with the waiting blocks
    /// left where they are: the best fit, if every page under it is mapped. Counts the block on
    /// its pages; None, with nothing changed, where there is no such place or `kind` is the
    /// large pool. The large pool always coalesces first: with 2 MiB pages, a place taken beside
    /// a waiting block is a hole that coalescing would have made larger, and a later large
    /// request that needed that hole maps a page — a training loop's second pass then maps
    /// pages its first pass did not need (the demo's host-memory trace did, one more per pass).
    fn place_on_mapped(
        &mut self,
        backend: &mut dyn Backend,
        kind: PoolKind,
        size: u64,
    ) -> Result<Option<(u64, PageSize)>> {
        if kind == PoolKind::Large {
            return Ok(None);
        }
        let quantum = self.config.quantum;
        let Some(pool) = self.pools[kind as usize].as_mut() else { return Ok(None) };
        let Ok(ptr) = pool.space.reserve(size, quantum) else { return Ok(None) };
        if pool.pages_of(ptr, size).any(|i| pool.slot(i).handle == NO_HANDLE) {
            pool.space.release_range(ptr, size)?;
            return Ok(None);
        }
        // Every page is mapped: this only counts the block on them.
        self.map_range(backend, kind, ptr, size, false, false).map(|page| Some((ptr, page)))
    }

    /// Places a HUGE_FIRST block in the large pool where it needs the fewest pages, if the large
    /// pool exists and the block can be mapped there: a small block whose pool ran out of
    /// memory, or (`tail`) a large one that no placement could map, its last page in normal
    /// frames as far as it reaches (see `tail_of`).
    fn place_large(&mut self, backend: &mut dyn Backend, size: u64, tail: bool) -> Option<(u64, PageSize)> {
        let quantum = self.config.quantum;
        let tight = self.tight();
        let (ptr, needed) = self.pools[PoolKind::Large as usize].as_ref()?.economical_place(size, quantum, tight)?;
        if tail && self.tail_bytes(backend, ptr, size, needed) > self.obtainable(backend) {
            // Not worth the driver calls of an attempt bound to fail.
            return None;
        }
        let pool = self.pool_mut(PoolKind::Large);
        let ptr = pool.space.reserve_at(ptr, size, quantum).ok()?;
        self.place_and_map(backend, PoolKind::Large, ptr, size, false, tail).ok()
    }

    /// The memory a large block at `ptr` that needs `needed` pages takes with a normal-frame
    /// tail (see `tail_of`): its last page's part in normal pages instead of a whole page.
    fn tail_bytes(&self, backend: &dyn Backend, ptr: u64, size: u64, needed: usize) -> u64 {
        let page = self.page_of(PoolKind::Large);
        let whole = needed as u64 * page;
        match self.tail_at(backend, PoolKind::Large, ptr + size) {
            Some((_, len)) => whole.saturating_sub(page) + len,
            None => whole,
        }
    }

    /// At most how much memory a malloc could get: what the device has free within the limit,
    /// plus every idle and cached page of both pools (stitching and giving back reclaim them).
    fn obtainable(&self, backend: &dyn Backend) -> u64 {
        let (free, _) = backend.mem_info(crate::acl::MemScope::All);
        let spare: u64 = [PoolKind::Small, PoolKind::Large]
            .iter()
            .map(|&k| {
                let idle = self.pools[k as usize].as_ref().map_or(0, |p| p.idle.len() as u64);
                (idle + self.cache[k as usize].len() as u64) * self.page_of(k)
            })
            .sum();
        free.min(self.limit().saturating_sub(self.reserved())) + spare
    }

    /// Maps the pages under the block reserved at `ptr`; when memory runs out, tries once more
    /// where the block needs the fewest pages (its ends on pages that live blocks already hold:
    /// best fit by length ignores them, and near the device's limit they decide whether a
    /// request fits). On failure the reservation is released and the pages obtained for it go
    /// back to the device, as far as the driver lets them: a failure must not grow the pool.
    /// Returns where the block lies and its page size.
    fn place_and_map(
        &mut self,
        backend: &mut dyn Backend,
        kind: PoolKind,
        ptr: u64,
        size: u64,
        huge_only: bool,
        tail: bool,
    ) -> Result<(u64, PageSize)> {
        let reserved_before = self.reserved();
        let mut ptr = ptr;
        let mut retried = huge_only;
        loop {
            let err = match self.map_range(backend, kind, ptr, size, huge_only, tail) {
                Ok(page) => return Ok((ptr, page)),
                Err(e) => e,
            };
            self.pool_mut(kind).space.release_range(ptr, size)?;
            while self.reserved() > reserved_before && matches!(self.release_one(backend, kind), Ok(true)) {}
            if retried || !err.code.is_out_of_memory() {
                return Err(err);
            }
            retried = true;
            let quantum = self.config.quantum;
            let tight = self.tight();
            let pool = self.pool_mut(kind);
            match pool.economical_place(size, quantum, tight) {
                Some((better, needed)) if needed < pool.pages_needed(ptr, size) => {
                    ptr = pool.space.reserve_at(better, size, quantum)?;
                }
                _ => return Err(err),
            }
        }
    }

    /// The fast path of a malloc: a waiting block of exactly the request's rounded size, in the
    /// pool its policy picks (see `route_cached`), recorded as live. Statistics are the caller's.
    #[inline(always)]
    fn take_recent(&mut self, requested: u64, policy: Policy) -> Option<(PoolKind, Grant)> {
        let (kind, size) = self.route_cached(requested, policy)?;
        let w = self.recent.pop(kind, size)?;
        self.note_live(kind, w.ptr, Block { size, requested, page: w.page });
        Some((kind, Grant { ptr: w.ptr, granted: size, page: w.page }))
    }

    /// Records the block just handed out at `ptr` in `kind`'s pool as live (nothing to do when
    /// the owner keeps the records).
    #[inline(always)]
    fn note_live(&mut self, kind: PoolKind, ptr: u64, block: Block) {
        if !self.owner_tracked {
            self.record_live(kind, ptr, block);
        }
    }

    /// `note_live`'s record (out of line, so that an owner-tracked pool's fast path carries
    /// none of the block map's code).
    #[inline(never)]
    fn record_live(&mut self, kind: PoolKind, ptr: u64, block: Block) {
        self.pool_mut(kind).blocks.insert(ptr, block);
    }

    /// The pool and rounded size under which a request may find a waiting block: not for
    /// HUGE_ONLY (a waiting block may sit on normal-frame pages), nor for requests that bypass
    /// the pools.
    #[inline(always)]
    fn route_cached(&self, requested: u64, policy: Policy) -> Option<(PoolKind, u64)> {
        let size = checked_align_up(requested, self.config.quantum)?;
        let kind = match policy.base() {
            Policy::NormalOnly => PoolKind::Small,
            Policy::HugeOnly | Policy::Huge1gOnly => return None,
            _ => pool_kind(size),
        };
        (size < self.config.bypass_threshold).then_some((kind, size))
    }

    /// The pool `ptr` lies in, if any.
    #[inline(always)]
    fn pool_holding(&mut self, ptr: u64) -> Option<(PoolKind, &mut VmmPool)> {
        let [small, large] = &mut self.pools;
        match (small, large) {
            (Some(p), _) if (p.base..p.end).contains(&ptr) => Some((PoolKind::Small, p)),
            (_, Some(p)) if (p.base..p.end).contains(&ptr) => Some((PoolKind::Large, p)),
            _ => None,
        }
    }

    /// `take_pooled` of a block whose record the owner keeps (`block`, live): it goes to the
    /// waiting stacks. None for a block outside the pools (a bypass block).
    #[inline(always)]
    fn take_owned(&mut self, block: &Granted) -> Option<PoolKind> {
        let (kind, _) = self.pool_holding(block.ptr)?;
        self.recent.push(kind, block.granted, Waiting { ptr: block.ptr, page: block.page });
        Some(kind)
    }

    /// Starts loading the record of the pooled block at `ptr` (a hint for a batch's look-ahead).
    #[inline(always)]
    fn prefetch_block(&self, ptr: u64) {
        if let Some(pool) = self.pools.iter().flatten().find(|p| (p.base..p.end).contains(&ptr)) {
            pool.blocks.prefetch(ptr);
        }
    }

    /// The fast path of a free: a live pooled block goes to the waiting stacks. Statistics are
    /// the caller's. None for a pointer outside the pools (or not live).
    #[inline(always)]
    fn take_pooled(&mut self, ptr: u64) -> Option<(PoolKind, Block)> {
        let (kind, pool) = self.pool_holding(ptr)?;
        let block = pool.blocks.remove(ptr)?;
        self.recent.push(kind, block.size, Waiting { ptr, page: block.page });
        Some((kind, block))
    }

    /// `free` (out of line: `free_block`'s path for a pool that keeps its own records).
    #[inline(never)]
    fn free_recorded(&mut self, backend: &mut dyn Backend, ptr: u64) -> Result<()> {
        Allocator::free(self, backend, ptr)
    }

    #[inline(never)]
    fn free_bypass(&mut self, backend: &mut dyn Backend, ptr: u64) -> Result<()> {
        let segment = self
            .bypass
            .get(&ptr)
            .ok_or_else(|| AclError::internal(format!("npumem pool does not own {ptr:#x}")))?
            .segment;
        // A driver failure leaves the block live, as it was.
        segment.unmap(backend)?;
        let Bypass { segment, requested } = self.bypass.remove(&ptr).expect("present");
        self.stats.on_free(PoolKind::Large, segment.size, requested);
        self.stats.oversize_allocations.sub(1);
        self.stats.on_segment_free(PoolKind::Large, segment.size);
        self.stats.oversize_segments.sub(1);
        self.events.push(Action::SegmentFree, segment.ptr, segment.size);
        Ok(())
    }

    fn oom(&mut self, e: AclError, request: &Request) -> AclError {
        self.stats.num_ooms += 1;
        AclError::oom(format!("npumem pool out of memory for {}: {}", format_size(request.size), e.message))
    }
}

impl Allocator for VmmAllocator {
    fn name(&self) -> &'static str {
        "npumem"
    }

    fn malloc(&mut self, backend: &mut dyn Backend, request: &Request) -> Result<Grant> {
        self.clock += 1;
        if let Some((kind, grant)) = self.take_recent(request.size, request.policy) {
            self.stats.on_alloc(kind, grant.granted, request.size);
            return Ok(grant);
        }
        self.malloc_slow(backend, request)
    }

    fn malloc_cached(&mut self, sizes: &[u64], policy: Policy, out: &mut Vec<Grant>) -> usize {
        let mut tally = [Tally::default(); 2];
        let mut served = 0;
        let owner = self.owner_tracked;
        // By runs of equal sizes: the route and the stack are found once per run (a run is
        // measured only as far as blocks wait for it, so a miss costs O(1), not a scan).
        while served < sizes.len() {
            let requested = sizes[served];
            let Some((kind, size)) = self.route_cached(requested, policy) else { break };
            let Some(pool) = self.pools[kind as usize].as_mut() else { break };
            let rest = &sizes[served..];
            if rest.get(1) != Some(&requested) {
                // A run of one (sizes that vary): the stack's top, without measuring a run.
                let Some(w) = self.recent.pop(kind, size) else { break };
                if !owner {
                    pool.blocks.insert(w.ptr, Block { size, requested, page: w.page });
                }
                out.push(Grant { ptr: w.ptr, granted: size, page: w.page });
                tally[kind as usize].add(size, requested);
                served += 1;
                continue;
            }
            let count = |waiting: usize| rest.iter().take(waiting).take_while(|&&s| s == requested).count();
            let Some(mut taken) = self.recent.take(kind, size, count) else { break };
            let got = taken.len();
            if owner {
                // The owner records the blocks: only the grants.
                out.extend(taken.rev().map(|w| Grant { ptr: w.ptr, granted: size, page: w.page }));
            } else {
                while let Some(w) = taken.next_back() {
                    // The record of the block `LOOK_AHEAD` places on is loaded while this one
                    // is written (a large live set's records miss the cache).
                    let ahead = taken.as_slice();
                    if let Some(a) = ahead.len().checked_sub(LOOK_AHEAD + 1).map(|i| ahead[i]) {
                        pool.blocks.prefetch(a.ptr);
                    }
                    pool.blocks.insert(w.ptr, Block { size, requested, page: w.page });
                    out.push(Grant { ptr: w.ptr, granted: size, page: w.page });
                }
            }
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
        self.stats.on_allocs_each(tally);
        served
    }

    fn free(&mut self, backend: &mut dyn Backend, ptr: u64) -> Result<()> {
        if let Some((kind, block)) = self.take_pooled(ptr) {
            self.stats.on_free(kind, block.size, block.requested);
            return Ok(());
        }
        if self.pools.iter().flatten().any(|p| (p.base..p.end).contains(&ptr)) {
            let owner = if self.owner_tracked { " (its owner keeps the blocks' records: free_block)" } else { "" };
            return Err(AclError::internal(format!("npumem pool has no live block at {ptr:#x}{owner}")));
        }
        self.free_bypass(backend, ptr)
    }

    /// The owner keeps the pooled blocks' records (bypass blocks keep their own map: they are
    /// found by pointer, and a pointer inside the pools is pooled).
    fn track_blocks_for_owner(&mut self) -> bool {
        if self.pools.iter().flatten().all(|p| p.blocks.is_empty()) {
            self.owner_tracked = true;
        }
        self.owner_tracked
    }

    fn free_block(&mut self, backend: &mut dyn Backend, block: &Granted) -> Result<()> {
        if !self.owner_tracked {
            return self.free_recorded(backend, block.ptr);
        }
        match self.take_owned(block) {
            Some(kind) => {
                self.stats.on_free(kind, block.granted, block.requested);
                Ok(())
            }
            None => self.free_bypass(backend, block.ptr),
        }
    }

    fn free_cached_blocks(&mut self, blocks: &[Granted]) -> usize {
        if !self.owner_tracked {
            return blocks.iter().take_while(|b| Allocator::free_cached(self, &[b.ptr]) == 1).count();
        }
        let mut tally = [Tally::default(); 2];
        let mut freed = 0;
        for block in blocks {
            let Some(kind) = self.take_owned(block) else { break };
            tally[kind as usize].add(block.granted, block.requested);
            freed += 1;
        }
        self.stats.on_frees_each(tally);
        freed
    }

    fn segments_with(&self, live: &[Granted]) -> Vec<SegmentSnapshot> {
        self.segments_of(self.owner_tracked.then_some(live))
    }

    fn fragmentation_with(&self, live: &[Granted]) -> Fragmentation {
        self.fragmentation_of(self.owner_tracked.then_some(live))
    }

    fn free_cached(&mut self, ptrs: &[u64]) -> usize {
        let mut tally = [Tally::default(); 2];
        let mut freed = 0;
        for (i, &ptr) in ptrs.iter().enumerate() {
            if let Some(&ahead) = ptrs.get(i + LOOK_AHEAD) {
                self.prefetch_block(ahead);
            }
            let Some((kind, block)) = self.take_pooled(ptr) else { break };
            tally[kind as usize].add(block.size, block.requested);
            freed += 1;
        }
        self.stats.on_frees_each(tally);
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

    fn set_memory_fraction(&mut self, fraction: f64) -> Result<()> {
        super::caching::check_fraction(fraction)?;
        self.config.memory_fraction = fraction;
        Ok(())
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
        self.fragmentation_of(None)
    }

    /// One segment per run of mapped pages (as PyTorch reports expandable segments), plus one
    /// per bypass allocation; free space inside a run shows as inactive blocks.
    fn segments(&self) -> Vec<SegmentSnapshot> {
        self.segments_of(None)
    }
}

impl VmmAllocator {
    /// `fragmentation` with the live blocks of `segments_of(owner)`.
    fn fragmentation_of(&self, owner: Option<&[Granted]>) -> Fragmentation {
        let mut f = Fragmentation::of(&self.stats);
        let mut large_idle = 0;
        for kind in [PoolKind::Small, PoolKind::Large] {
            let Some(pool) = self.pools[kind as usize].as_ref() else { continue };
            let (extents, idle) = self.settled_view(kind, pool);
            if kind == PoolKind::Large {
                large_idle = idle;
            }
            // Free memory that is mapped: the parts of free VA extents over mapped pages.
            for (start, len) in extents {
                let mut run = 0;
                for i in pool.pages_of(start, len) {
                    let page_start = pool.page_va(i);
                    let lo = start.max(page_start);
                    let hi = (start + len).min(page_start + pool.page);
                    if pool.slot(i).handle != NO_HANDLE {
                        run += hi - lo;
                    } else if run > 0 {
                        f.add_free(run);
                        run = 0;
                    }
                }
                if run > 0 {
                    f.add_free(run);
                }
            }
        }
        // The segments are the snapshot's: one per run of mapped pages, one per bypass mapping.
        f.segments = self.segments_of(owner).iter().map(SegmentUse::of).collect();
        for kind in [PoolKind::Small, PoolKind::Large] {
            for _ in &self.cache[kind as usize] {
                f.add_free(self.page_of(kind));
            }
        }
        // Idle and cached pages can be remapped under any range of their pool: a request can get
        // all of those of the large pool.
        let movable = large_idle * LARGE_PAGE + self.cache[PoolKind::Large as usize].len() as u64 * LARGE_PAGE;
        f.largest_free_extent = f.largest_free_extent.max(movable.min(f.free));
        f
    }

    /// The segments, with the pooled live blocks from the pools' maps, or (owner tracking) from
    /// `owner`, the owner's live blocks in address order.
    fn segments_of(&self, owner: Option<&[Granted]>) -> Vec<SegmentSnapshot> {
        let mut out = Vec::new();
        for (k, pool) in self.pools.iter().enumerate() {
            let Some(pool) = pool else { continue };
            let kind = if k == 0 { PoolKind::Small } else { PoolKind::Large };
            // Live blocks in address order, walked along with the runs of mapped pages (every
            // live block lies on mapped pages).
            let lives: Box<dyn Iterator<Item = (u64, u64, u64)>> = match owner {
                None => Box::new(pool.blocks.iter().map(|(p, b)| (p, b.size, b.requested))),
                Some(live) => Box::new(
                    live.iter()
                        .filter(|g| (pool.base..pool.end).contains(&g.ptr))
                        .map(|g| (g.ptr, g.granted, g.requested)),
                ),
            };
            let mut lives = lives.peekable();
            let mut i = 0;
            while i < pool.slots.len() {
                if pool.slots[i].handle == NO_HANDLE {
                    i += 1;
                    continue;
                }
                let start = i;
                while i < pool.slots.len() && pool.slots[i].handle != NO_HANDLE {
                    i += 1;
                    if pool.slots[i - 1].tail != 0 {
                        break;
                    }
                }
                let (lo, hi) = (pool.page_va(start), pool.page_va(i - 1) + pool.mapped_len(i - 1));
                let mut blocks = Vec::new();
                let mut at = lo;
                while let Some((p, size, requested)) = lives.next_if(|&(p, _, _)| p < hi) {
                    if p > at {
                        blocks.push(BlockSnapshot { address: at, size: p - at, requested_size: 0, allocated: false });
                    }
                    blocks.push(BlockSnapshot { address: p, size, requested_size: requested, allocated: true });
                    at = p + size;
                }
                if at < hi {
                    blocks.push(BlockSnapshot { address: at, size: hi - at, requested_size: 0, allocated: false });
                }
                out.push(SegmentSnapshot { address: lo, total_size: hi - lo, pool: kind, is_expandable: true, blocks });
            }
        }
        for (&ptr, Bypass { segment, requested }) in &self.bypass {
            let requested = *requested;
            out.push(SegmentSnapshot {
                address: ptr,
                total_size: segment.size,
                pool: PoolKind::Large,
                is_expandable: false,
                blocks: vec![BlockSnapshot {
                    address: ptr,
                    size: segment.size,
                    requested_size: requested,
                    allocated: true,
                }],
            });
        }
        out.sort_unstable_by_key(|s| s.address);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::acl::Policy;
    use crate::backend::{SimBackend, SimConfig};
    use crate::units::GIB;
    use proptest::prelude::*;

    fn setup(capacity: u64, conf: &str) -> (VmmAllocator, SimBackend) {
        let sim = SimBackend::new(SimConfig { capacity, ..Default::default() }).unwrap();
        (VmmAllocator::new(VmmConfig::parse(conf).unwrap(), capacity), sim)
    }

    fn req(size: u64) -> Request {
        Request { size, booked: size, policy: Policy::HugeFirst }
    }

    #[test]
    fn packs_small_blocks_and_reuses_pages_without_driver_calls() {
        let (mut a, mut sim) = setup(64 * MIB, "");
        let x = a.malloc(&mut sim, &req(1000)).unwrap();
        let y = a.malloc(&mut sim, &req(1000)).unwrap();
        assert_eq!(y.ptr, x.ptr + 1024);
        assert_eq!(a.reserved(), SMALL_PAGE);
        a.free(&mut sim, x.ptr).unwrap();
        a.free(&mut sim, y.ptr).unwrap();
        let maps = sim.counters().maps;
        // Far from the limit, a miss takes the free space on the mapped page: the waiting
        // blocks keep waiting for their size.
        let z = a.malloc(&mut sim, &req(4000)).unwrap();
        assert_eq!(z.ptr, y.ptr + 1024);
        assert_eq!(sim.counters().maps, maps);
        a.free(&mut sim, z.ptr).unwrap();
        a.empty_cache(&mut sim).unwrap();
        assert_eq!(a.reserved(), 0);
        assert_eq!(sim.mem_info(crate::acl::MemScope::All).0, 64 * MIB);
    }

    #[test]
    fn freed_blocks_wait_for_their_size_and_a_miss_releases_them() {
        let (mut a, mut sim) = setup(64 * MIB, "");
        let x = a.malloc(&mut sim, &req(4096)).unwrap();
        let y = a.malloc(&mut sim, &req(4096)).unwrap();
        let stats = a.stats.clone();
        a.free(&mut sim, x.ptr).unwrap();
        a.free(&mut sim, y.ptr).unwrap();
        assert_eq!(a.recent.len(), 2);
        assert_eq!(a.stats.allocated_bytes.all.current, 0);
        // The same size comes back from the stack, most recent first, with exact statistics.
        let z = a.malloc(&mut sim, &req(4000)).unwrap();
        assert_eq!((z.ptr, z.granted), (y.ptr, 4096));
        assert_eq!(a.stats.allocated_bytes.all.current, 4096);
        assert_eq!(a.stats.requested_bytes.all.current, 4000);
        a.free(&mut sim, z.ptr).unwrap();
        let z = a.malloc(&mut sim, &req(4096)).unwrap();
        a.free(&mut sim, z.ptr).unwrap();
        assert_eq!(a.stats.allocation.all.allocated, stats.allocation.all.allocated + 2);
        // Another size misses. Far from the limit, it goes to free space on mapped pages and the
        // waiting blocks keep waiting.
        let w = a.malloc(&mut sim, &req(8192)).unwrap();
        assert_eq!((w.ptr, a.recent.len()), (y.ptr + 4096, 2));
        a.free(&mut sim, w.ptr).unwrap();
        // Under pressure (the pool holds more than half its limit) a miss releases every waiting
        // block first, and the best fit finds the three of them coalesced at the bottom.
        a.set_memory_fraction(0.001).unwrap();
        assert!(a.reserved() > a.limit() / CALM_DIVISOR);
        let w = a.malloc(&mut sim, &req(16384)).unwrap();
        assert_eq!(w.ptr, x.ptr);
        assert!(a.recent.is_empty());
        a.free(&mut sim, w.ptr).unwrap();
        a.empty_cache(&mut sim).unwrap();
        assert_eq!(a.reserved(), 0);
    }

    #[test]
    fn large_blocks_go_where_they_need_the_fewest_pages() {
        // 2 MiB pages. Blocks at [0, 1.5), [4.5, 8.5) and [11.5, 13) MiB leave two 3 MiB holes:
        // [1.5, 4.5), holding all of page 1, and [8.5, 11.5), whose pages 4 and 5 both hold live
        // blocks. Best fit (lowest address among equals) would put 2.5 MiB in the first and use
        // page 1; page-economical placement puts it in the second, where it needs no page.
        let (mut a, mut sim) = setup(64 * MIB, "");
        let sizes = [3 * MIB / 2, 3 * MIB, 4 * MIB, 3 * MIB, 3 * MIB / 2];
        let g: Vec<Grant> = sizes.iter().map(|&s| a.malloc(&mut sim, &req(s)).unwrap()).collect();
        let base = g[0].ptr;
        let offsets: Vec<u64> = g.iter().map(|x| (x.ptr - base) * 2 / MIB).collect();
        assert_eq!(offsets, [0, 3, 9, 17, 23], "laid out back to back (half MiB units)");
        a.free(&mut sim, g[1].ptr).unwrap();
        a.free(&mut sim, g[3].ptr).unwrap();
        let pages = a.stats.num_device_alloc;
        let x = a.malloc(&mut sim, &req(5 * MIB / 2)).unwrap();
        assert_eq!(x.ptr, g[3].ptr, "the hole whose pages are held already");
        assert_eq!(a.stats.num_device_alloc, pages);
        let pool = a.pool(PoolKind::Large);
        let page1 = pool.pages_of(base + 2 * MIB, 1).start;
        assert!(pool.slot(page1).live == 0 && pool.slot(page1).handle != NO_HANDLE, "page 1 stays idle");
        for ptr in [g[0].ptr, g[2].ptr, g[4].ptr, x.ptr] {
            a.free(&mut sim, ptr).unwrap();
        }
        a.empty_cache(&mut sim).unwrap();
        assert_eq!(a.reserved(), 0);
    }

    #[test]
    fn a_block_no_placement_can_map_gets_a_normal_frame_tail() {
        // The seed-1 capacity case of `npumem stress` (tests/stress_cases): on 68 MiB the live
        // blocks at the peak (47 + 3.5 + 15.44 MiB and 64 KiB) fit only if 3.5 MiB shares a
        // page with 47 MiB and the last block takes no partly empty pool page. 5 MiB, as few
        // new pages at the hole's end (beside 47 MiB) as past 47 MiB's end, goes where it
        // strands fewer free bytes (past the end), leaving the hole's end to 3.5 MiB; 15.44 MiB,
        // for which the pool has no whole pages, goes past 47 MiB's end with its last page in
        // normal frames as far as it reaches, the rest of that page fenced off.
        let (mut a, mut sim) = setup(68 * MIB, "");
        let frames = sim.frame_stats().unwrap();
        let kib = |k: u64| k * 1024;
        let a0 = a.malloc(&mut sim, &req(kib(13504))).unwrap();
        let a1 = a.malloc(&mut sim, &req(kib(2496))).unwrap();
        let a2 = a.malloc(&mut sim, &req(47 * MIB)).unwrap();
        let a3 = a.malloc(&mut sim, &req(kib(64))).unwrap();
        a.free(&mut sim, a0.ptr).unwrap();
        a.free(&mut sim, a1.ptr).unwrap();
        let a4 = a.malloc(&mut sim, &req(5 * MIB)).unwrap();
        assert_eq!(a4.ptr, a2.ptr + a2.granted);
        let a5 = a.malloc(&mut sim, &req(kib(3584))).unwrap();
        assert_eq!(a5.ptr + a5.granted, a2.ptr);
        a.free(&mut sim, a4.ptr).unwrap();
        let ooms = a.stats.num_ooms;
        let a6 = a.malloc(&mut sim, &req(kib(15808))).unwrap();
        assert_eq!((a6.page, a.stats.num_ooms, a.bypass.len()), (PageSize::Size4K, ooms, 0));
        let end = a6.ptr + a6.granted;
        let pool = a.pool(PoolKind::Large);
        let last = pool.pages_of(end - 1, 1).start;
        let tail = pool.mapped_len(last);
        assert!(end - pool.page_va(last) <= tail && tail < LARGE_PAGE, "a tail of {tail} bytes");
        assert_eq!(sim.translate(end - 1).unwrap().page_size, PageSize::Size4K);
        // The rest of the tail's page is fenced: no block goes there while the tail is mapped.
        assert!(pool.space.free_extents_in(pool.page_va(last) + tail, pool.page_va(last + 1)).is_empty());
        sim.write(end - 1, &[1]).unwrap();
        assert_eq!(a.reserved(), 68 * MIB - sim.mem_info(crate::acl::MemScope::All).0);
        for g in [a6, a2, a5, a3] {
            a.free(&mut sim, g.ptr).unwrap();
        }
        a.empty_cache(&mut sim).unwrap();
        assert_eq!((a.reserved(), a.stats.allocated_bytes.all.current), (0, 0));
        assert_eq!(sim.frame_stats().unwrap(), frames);
    }

    #[test]
    fn a_small_block_borrows_a_large_page_when_memory_runs_out() {
        // 4 MiB device: a 3 MiB block holds both 2 MiB pages; 512 KiB finds no frame for the
        // small pool's pages but fits in the free end of the second large page.
        let (mut a, mut sim) = setup(4 * MIB, "");
        let big = a.malloc(&mut sim, &req(3 * MIB)).unwrap();
        let small = a.malloc(&mut sim, &req(512 * 1024)).unwrap();
        assert_eq!((small.ptr, small.page), (big.ptr + 3 * MIB, PageSize::Size2M));
        assert_eq!(a.stats.allocated_bytes.large_pool().current, 3 * MIB + 512 * 1024);
        // NORMAL_ONLY promises normal pages: it may not borrow.
        let normal = Request { policy: Policy::NormalOnly, ..req(256 * 1024) };
        assert!(a.malloc(&mut sim, &normal).unwrap_err().code.is_out_of_memory());
        a.free(&mut sim, small.ptr).unwrap();
        a.free(&mut sim, big.ptr).unwrap();
        a.empty_cache(&mut sim).unwrap();
        assert_eq!((a.reserved(), a.stats.allocated_bytes.all.current), (0, 0));
    }

    #[test]
    fn stitches_idle_pages_into_a_large_block() {
        // 64 MiB device. Fill it with 2 MiB blocks, free every other one: 32 MiB is free but in
        // 2 MiB holes. A 30 MiB request still succeeds by remapping the idle pages.
        let (mut a, mut sim) = setup(64 * MIB, "");
        let blocks: Vec<Grant> = (0..30).map(|_| a.malloc(&mut sim, &req(2 * MIB)).unwrap()).collect();
        for g in blocks.iter().step_by(2) {
            a.free(&mut sim, g.ptr).unwrap();
        }
        let big = a.malloc(&mut sim, &req(30 * MIB)).unwrap();
        assert_eq!(big.granted, 30 * MIB);
        assert!(a.reserved() <= 64 * MIB);
        // The bytes of the live blocks are untouched and the new block is writable end to end.
        sim.write(big.ptr + 30 * MIB - 8, &[7; 8]).unwrap();
        let f = a.fragmentation();
        assert_eq!(f.allocated, 15 * 2 * MIB + 30 * MIB);
        for g in blocks.iter().skip(1).step_by(2) {
            a.free(&mut sim, g.ptr).unwrap();
        }
        a.free(&mut sim, big.ptr).unwrap();
        a.empty_cache(&mut sim).unwrap();
        assert_eq!(sim.frame_stats().unwrap().largest_free_block, 64 * MIB);
    }

    #[test]
    fn bypass_uses_giant_pages_and_oom_reports() {
        let mut sim = SimBackend::new(SimConfig { capacity: 4 * GIB, giant_frames: 1, ..Default::default() }).unwrap();
        let mut a = VmmAllocator::new(VmmConfig::default(), 4 * GIB);
        let g = a.malloc(&mut sim, &req(GIB)).unwrap();
        assert_eq!(g.page, PageSize::Size1G);
        let h = a.malloc(&mut sim, &req(600 * MIB)).unwrap();
        assert_eq!(h.page, PageSize::Size2M);
        let err = a.malloc(&mut sim, &req(3 * GIB)).unwrap_err();
        assert!(err.message.contains("out of memory"), "{}", err.message);
        a.free(&mut sim, g.ptr).unwrap();
        a.free(&mut sim, h.ptr).unwrap();
        assert_eq!(a.reserved(), 0);
        assert!(VmmConfig::parse("large_threshold_mb:1").is_err());
        assert!(VmmConfig::parse("bogus:1").is_err());
        assert!(VmmConfig::parse("expandable_segments:True,per_process_memory_fraction:0.5").is_ok());
    }

    #[test]
    fn pages_follow_the_malloc_policy() {
        let mut sim = SimBackend::new(SimConfig { capacity: 4 * GIB, giant_frames: 1, ..Default::default() }).unwrap();
        let mut a = VmmAllocator::new(VmmConfig::default(), 4 * GIB);
        let with = |size, policy| Request { size, booked: size, policy };
        // NORMAL_ONLY: normal pages even for a request that HUGE_FIRST would put on 2 MiB pages.
        let n = a.malloc(&mut sim, &with(4 * MIB, Policy::NormalOnly)).unwrap();
        assert!(n.page < PageSize::Size2M, "{:?}", n.page);
        // HUGE_ONLY: 2 MiB pages even for a tiny request.
        let h = a.malloc(&mut sim, &with(1000, Policy::HugeOnly)).unwrap();
        assert_eq!(h.page, PageSize::Size2M);
        // HUGE1G_ONLY: a giant page while one is free, then a clear out-of-memory error.
        let g = a.malloc(&mut sim, &with(100 * MIB, Policy::Huge1gOnly)).unwrap();
        assert_eq!(g.page, PageSize::Size1G);
        let err = a.malloc(&mut sim, &with(100 * MIB, Policy::Huge1gOnly)).unwrap_err();
        assert!(err.code.is_out_of_memory(), "{}", err.message);
        for ptr in [n.ptr, h.ptr, g.ptr] {
            a.free(&mut sim, ptr).unwrap();
        }
        a.empty_cache(&mut sim).unwrap();
        assert_eq!(a.reserved(), 0);
    }

    #[test]
    fn huge_only_never_takes_pages_of_normal_frames() {
        let (mut a, mut sim) = setup(64 * MIB, "");
        let with = |size, policy| Request { size, booked: size, policy };
        let huge_pages = |sim: &SimBackend, g: Grant| {
            (0..g.granted)
                .step_by(2 * MIB as usize)
                .all(|o| sim.translate(g.ptr + o).unwrap().page_size == PageSize::Size2M)
        };
        // Hold every frame, then free those of the first four 2 MiB regions but their first:
        // 4 MiB is free, none of it in 2 MiB frames.
        let frames: Vec<PhysHandle> =
            (0..64 * MIB / 4096).map(|_| sim.create_physical(4096, PageKind::Normal).unwrap()).collect();
        for (i, &h) in frames.iter().enumerate().take(4 * 512) {
            if i % 512 != 0 {
                sim.free_physical(h).unwrap();
            }
        }
        // HUGE_FIRST falls back to normal frames; HUGE_ONLY fails rather than take them.
        let live = a.malloc(&mut sim, &with(3 * MIB, Policy::HugeFirst)).unwrap();
        assert!(live.page < PageSize::Size2M);
        let err = a.malloc(&mut sim, &with(2 * MIB, Policy::HugeOnly)).unwrap_err();
        assert!(err.code.is_out_of_memory(), "{}", err.message);
        // 2 MiB frames come back: HUGE_ONLY is placed off the live block's pages of normal
        // frames (its 3 MiB leave 1 MiB free on its second page) and gets 2 MiB pages.
        for &h in &frames[4 * 512..] {
            sim.free_physical(h).unwrap();
        }
        let beside = a.malloc(&mut sim, &with(8 * MIB, Policy::HugeOnly)).unwrap();
        assert_eq!(beside.page, PageSize::Size2M);
        assert!(huge_pages(&sim, beside));
        assert!(beside.ptr >= live.ptr + 4 * MIB);
        // Once freed, the fallback block's idle pages are replaced under a HUGE_ONLY block.
        a.free(&mut sim, live.ptr).unwrap();
        let over = a.malloc(&mut sim, &with(4 * MIB, Policy::HugeOnly)).unwrap();
        assert_eq!(over.ptr, live.ptr);
        assert!(huge_pages(&sim, over));
        sim.write(beside.ptr, &[1]).unwrap();
        for ptr in [beside.ptr, over.ptr] {
            a.free(&mut sim, ptr).unwrap();
        }
        a.empty_cache(&mut sim).unwrap();
        assert_eq!(a.reserved(), 0);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// On a small device, where requests run out of memory and large ones take normal-frame
        /// tails: every page under a block keeps its policy's promise, blocks never overlap and
        /// keep their bytes, and the pool's statistics agree with the device's own count.
        #[test]
        fn tails_keep_policies_bytes_and_the_books(
            ops in proptest::collection::vec((0u8..4, 1u64..(9 << 20), any::<usize>()), 1..120),
        ) {
            let capacity = 24 * MIB;
            let (mut a, mut sim) = setup(capacity, "");
            let frames = sim.frame_stats().unwrap();
            let mut live: Vec<(Grant, Policy, u8)> = Vec::new();
            for (n, (op, size, pick)) in ops.into_iter().enumerate() {
                if op == 0 && !live.is_empty() {
                    let (g, _, tag) = live.swap_remove(pick % live.len());
                    for at in [g.ptr, g.ptr + g.granted - 1] {
                        let mut byte = [0u8];
                        sim.read(at, &mut byte).unwrap();
                        prop_assert_eq!(byte[0], tag);
                    }
                    a.free(&mut sim, g.ptr).unwrap();
                } else {
                    let policy = [Policy::HugeFirst, Policy::HugeFirst, Policy::HugeOnly, Policy::NormalOnly][pick % 4];
                    let size = if pick % 3 == 0 { size >> 6 } else { size };
                    let Ok(g) = a.malloc(&mut sim, &Request { size, booked: size, policy }) else { continue };
                    prop_assert!(g.granted >= size && g.ptr % 64 == 0);
                    for (o, _, _) in &live {
                        prop_assert!(g.ptr + g.granted <= o.ptr || o.ptr + o.granted <= g.ptr);
                    }
                    let mut at = g.ptr;
                    while at < g.ptr + g.granted {
                        let page = sim.translate(at).unwrap().page_size;
                        prop_assert!(crate::policy::honours(policy, page), "{:?} under {:?}", page, policy);
                        at = (at / 4096 + 1) * 4096;
                        if at < g.ptr + g.granted && page == PageSize::Size2M {
                            at = at.max(at.next_multiple_of(LARGE_PAGE));
                        }
                    }
                    let tag = n as u8;
                    sim.write(g.ptr, &[tag]).unwrap();
                    sim.write(g.ptr + g.granted - 1, &[tag]).unwrap();
                    live.push((g, policy, tag));
                }
                // The books against the device and the live blocks (an independent count).
                let used = capacity - sim.mem_info(crate::acl::MemScope::All).0;
                prop_assert_eq!(a.reserved(), used);
                prop_assert_eq!(a.stats.allocated_bytes.all.current, live.iter().map(|(g, _, _)| g.granted).sum::<u64>());
                let segs = a.segments();
                prop_assert_eq!(a.stats.segment.all.current, segs.len() as u64);
                let cached: u64 = [PoolKind::Small, PoolKind::Large]
                    .iter()
                    .map(|&k| a.cache[k as usize].len() as u64 * a.page_of(k))
                    .sum();
                prop_assert_eq!(segs.iter().map(|s| s.total_size).sum::<u64>(), used - cached);
            }
            for (g, _, _) in live { a.free(&mut sim, g.ptr).unwrap(); }
            a.empty_cache(&mut sim).unwrap();
            prop_assert_eq!(a.reserved(), 0);
            prop_assert_eq!(a.stats.segment.all.current, 0);
            prop_assert_eq!(sim.frame_stats().unwrap(), frames);
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]
        #[test]
        fn no_overlap_and_everything_returns(
            ops in proptest::collection::vec((any::<bool>(), 1u64..(12 << 20), any::<usize>()), 1..150),
        ) {
            let (mut a, mut sim) = setup(96 * MIB, "");
            let frames = sim.frame_stats().unwrap();
            let mut live: Vec<Grant> = Vec::new();
            for (alloc, size, pick) in ops {
                if alloc || live.is_empty() {
                    let size = if pick % 3 == 0 { size >> 10 } else { size };
                    if let Ok(g) = a.malloc(&mut sim, &req(size.max(1))) {
                        for o in &live {
                            prop_assert!(g.ptr + g.granted <= o.ptr || o.ptr + o.granted <= g.ptr);
                        }
                        // Every byte of the block is mapped.
                        sim.write(g.ptr, &[1]).unwrap();
                        sim.write(g.ptr + g.granted - 1, &[1]).unwrap();
                        live.push(g);
                    } else {
                        // Out of memory only when the live blocks really leave no room.
                        let used: u64 = live.iter().map(|g| g.granted.div_ceil(LARGE_PAGE) * LARGE_PAGE + LARGE_PAGE).sum();
                        prop_assert!(used + size.max(1) > 96 * MIB - 4 * LARGE_PAGE, "spurious OOM");
                    }
                } else {
                    let g = live.swap_remove(pick % live.len());
                    a.free(&mut sim, g.ptr).unwrap();
                }
                // Waiting freed blocks are reported exactly as the free memory they become.
                if pick % 5 == 0 {
                    let (frag, segs, stats) = (a.fragmentation(), a.segments(), a.stats.clone());
                    a.release_recent().unwrap();
                    prop_assert!(a.recent.is_empty());
                    prop_assert_eq!(frag, a.fragmentation());
                    prop_assert_eq!(segs, a.segments());
                    prop_assert_eq!(stats, a.stats.clone());
                }
                let held: u64 = [PoolKind::Small, PoolKind::Large]
                    .iter()
                    .map(|&k| {
                        let mapped = a.pools[k as usize].as_ref().map_or(0, |p| p.mapped);
                        let gap = a.pools[k as usize].as_ref().map_or(0, |p| p.tail_gap);
                        (mapped + a.cache[k as usize].len() as u64) * a.page_of(k) - gap
                    })
                    .sum();
                prop_assert_eq!(a.reserved(), held + a.bypass.values().map(|b| b.segment.size).sum::<u64>());
                // A segment is a run of mapped pages (or a bypass mapping): the statistic, the
                // snapshot and the fragmentation report count the same ones.
                let segs = a.segments();
                prop_assert_eq!(a.stats.segment.all.current, segs.len() as u64);
                prop_assert_eq!(a.fragmentation().segments.len(), segs.len());
            }
            for g in live { a.free(&mut sim, g.ptr).unwrap(); }
            a.empty_cache(&mut sim).unwrap();
            prop_assert_eq!(a.reserved(), 0);
            prop_assert_eq!(a.stats.segment.all.current, 0);
            prop_assert_eq!(sim.frame_stats().unwrap(), frames);
        }
    }
}
