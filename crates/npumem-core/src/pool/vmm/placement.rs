use super::*;

impl VmmAllocator {
    /// A malloc that the waiting blocks cannot serve: release them, then bypass or search.
    #[cold]
    #[inline(never)]
    pub(super) fn malloc_slow(&mut self, backend: &mut dyn Backend, request: &Request) -> Result<Grant> {
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
                self.books.stats.on_alloc(kind, size, request.size);
                return Ok(Grant { ptr, granted: size, page });
            }
        }
        self.release_recent()?;
        let device_allocs = self.books.stats.num_device_alloc;
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
        if self.books.stats.num_device_alloc > device_allocs {
            self.books.stats.num_cache_misses += 1;
        }
        self.books.stats.on_alloc(kind, size, request.size);
        Ok(Grant { ptr, granted: size, page })
    }

    /// Places a block of `size` bytes in `kind`'s pool (HUGE_ONLY: off normal-frame pages;
    /// large pool: fewest pages first; small pool: best fit) and maps its pages (see
    /// `place_and_map`).
    pub(super) fn malloc_in(
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
    pub(super) fn place_on_mapped(
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
    pub(super) fn place_large(&mut self, backend: &mut dyn Backend, size: u64, tail: bool) -> Option<(u64, PageSize)> {
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

    /// Maps the pages under the block reserved at `ptr`; when memory runs out, tries once more
    /// where the block needs the fewest pages (its ends on pages that live blocks already hold:
    /// best fit by length ignores them, and near the device's limit they decide whether a
    /// request fits). On failure the reservation is released and the pages obtained for it go
    /// back to the device, as far as the driver lets them: a failure must not grow the pool.
    /// Returns where the block lies and its page size.
    pub(super) fn place_and_map(
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

    /// Places a HUGE_ONLY block of `size` bytes in the large pool where every page it covers can
    /// hold a 2 MiB frame: pages mapped with normal frames under live blocks are fenced off
    /// while searching (their free parts reserved, then released again), so best fit moves on
    /// to the next candidate. Terminates: each round fences at least one more page.
    pub(super) fn place_huge_only(&mut self, size: u64) -> Result<u64> {
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
}
