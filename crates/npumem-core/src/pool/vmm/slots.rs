use super::*;

/// The page size of `kind`'s pool on a backend whose smallest physical allocation is at most
/// this (a pool takes its backend's granularity where that is larger: a GPU's 2 MiB).
pub(super) fn page_bytes(kind: PoolKind) -> u64 {
    match kind {
        PoolKind::Small => SMALL_PAGE,
        PoolKind::Large => LARGE_PAGE,
    }
}
pub(super) const NO_HANDLE: PhysHandle = 0;
/// Each pool reserves this many times the device's capacity of VA, so that live blocks scattered
/// through it do not leave it without a contiguous range for a request that fits in physical
/// memory (page tables grow lazily, so unused VA costs nothing).
pub(super) const VA_FACTOR: u64 = 4;

#[derive(Clone, Copy, Debug)]
pub(super) struct Slot {
    pub(super) handle: PhysHandle,
    /// PTE size of the mapped handle (2 MiB, or normal pages when huge frames ran out).
    pub(super) page: PageSize,
    /// 0 for a whole page; else a normal-frame tail: only the page's first `tail` ×
    /// [`TAIL_UNIT`] bytes are mapped, and the rest of the page's VA is fenced off (reserved in
    /// the pool's free space) for as long as the slot is mapped.
    pub(super) tail: u16,
    pub(super) live: u32,
    pub(super) idle_since: u64,
}

impl Slot {
    pub(super) const EMPTY: Slot = Slot { handle: NO_HANDLE, page: PageSize::Size4K, tail: 0, live: 0, idle_since: 0 };
}

/// The unit in which a normal-frame tail's mapped length is kept (the smallest normal page).
pub(super) const TAIL_UNIT: u64 = 4096;

#[derive(Debug)]
pub(super) struct VmmPool {
    pub(super) page: u64,
    pub(super) base: u64,
    pub(super) end: u64,
    /// The free extents of the range (`untracked`: the length of every reserved range is in
    /// the owner's `Granted`, the waiting stacks, or the fence's tail slot, and is passed back
    /// on release).
    pub(super) space: VaSpace,
    pub(super) slots: Vec<Slot>,
    pub(super) idle: BTreeSet<(u64, u32)>,
    pub(super) mapped: u64,
    /// Bytes the normal-frame tails leave unmapped on their pages: the pool holds `mapped`
    /// pages minus these.
    pub(super) tail_gap: u64,
}

impl VmmPool {
    pub(super) fn pages_of(&self, ptr: u64, size: u64) -> std::ops::Range<usize> {
        // Pages are powers of two (64 KiB, 2 MiB): shifts, not divisions (placement calls this
        // for many candidates).
        let shift = self.page.trailing_zeros();
        let first = (ptr - self.base) >> shift;
        let last = (ptr + size - 1 - self.base) >> shift;
        first as usize..last as usize + 1
    }

    pub(super) fn page_va(&self, i: usize) -> u64 {
        self.base + i as u64 * self.page
    }

    /// The slot of page `i`, growing the table on first touch (VA is handed out from the bottom
    /// up, so the table stays as long as the highest address used).
    pub(super) fn slot_mut(&mut self, i: usize) -> &mut Slot {
        if i >= self.slots.len() {
            self.slots.resize(i + 1, Slot::EMPTY);
        }
        &mut self.slots[i]
    }

    pub(super) fn slot(&self, i: usize) -> Slot {
        self.slots.get(i).copied().unwrap_or(Slot::EMPTY)
    }

    /// How many of page `i`'s two neighbours its mapping joins: mapping `i` starts a segment (a
    /// run of mapped pages) when none is, joins two when both are; unmapping it does the
    /// reverse. A normal-frame tail ends its run (the VA after its mapped part is not mapped).
    pub(super) fn mapped_neighbours(&self, i: usize) -> u32 {
        let joins_left = i.checked_sub(1).map(|j| self.slot(j)).is_some_and(|s| s.handle != NO_HANDLE && s.tail == 0);
        let joins_right = self.slot(i).tail == 0 && self.slot(i + 1).handle != NO_HANDLE;
        joins_left as u32 + joins_right as u32
    }

    /// The bytes mapped at page `i`'s start (the page, or a normal-frame tail's part of it).
    pub(super) fn mapped_len(&self, i: usize) -> u64 {
        match self.slot(i).tail {
            0 => self.page,
            units => u64::from(units) * TAIL_UNIT,
        }
    }

    /// The pages a block at `[ptr, ptr + size)`, inside one free extent, would take from the
    /// free memory: the pages under it that hold no block (an unmapped one needs a new page, an
    /// idle one is a page that could serve elsewhere). Only its first and last page can hold
    /// blocks (the others lie inside the free extent), so this is O(1).
    pub(super) fn pages_needed(&self, ptr: u64, size: u64) -> usize {
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
    pub(super) fn stranded(&self, start: u64, end: u64, ptr: u64, size: u64) -> u64 {
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
    /// the repository's traces; docs/benchmarks.md.)
    /// Extents are taken
    /// shortest first and the search stops at a placement that needs as few pages as any
    /// position could (all but the two end pages) or after [`PLACE_SCAN`] extents. Returns the
    /// address and the pages it needs.
    pub(super) fn economical_place(&self, size: u64, quantum: u64, tight: bool) -> Option<(u64, usize)> {
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
    pub(super) fn release_block(&mut self, ptr: u64, size: u64, clock: u64) -> Result<()> {
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
