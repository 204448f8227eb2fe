use super::*;

impl VmmAllocator {
    /// A physical page for `kind`'s pool: a cached one, else a new one (a 2 MiB frame for the
    /// large pool when one is free, else normal frames), within the limit.
    pub(super) fn acquire(
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
        self.books.stats.on_page_alloc(kind, page);
        Ok((h, pte))
    }

    /// Out of memory if `bytes` more would pass the pool's limit.
    pub(super) fn check_limit(&self, bytes: u64) -> Result<()> {
        if self.reserved() + bytes > self.limit() {
            return Err(AclError::oom(format!(
                "the npumem pool's limit of {} (memory fraction {}) is reached",
                format_size(self.limit()),
                self.books.memory_fraction()
            )));
        }
        Ok(())
    }

    /// Unmaps the coldest idle page of `kind`'s pool, skipping the pages in `keep` (about to be
    /// used), and caches its handle. Returns false when no such page is left.
    pub(super) fn unmap_coldest(
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
    pub(super) fn free_cached(&mut self, backend: &mut dyn Backend, kind: PoolKind) -> Result<bool> {
        let Some(&(h, _)) = self.cache[kind as usize].last() else { return Ok(false) };
        backend.free_physical(h)?;
        self.cache[kind as usize].pop();
        self.books.stats.on_page_free(kind, self.page_of(kind));
        Ok(true)
    }

    /// Returns one page of `kind`'s pool to the device: a cached one, else its coldest idle one.
    pub(super) fn release_one(&mut self, backend: &mut dyn Backend, kind: PoolKind) -> Result<bool> {
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
    pub(super) fn release_foreign(&mut self, backend: &mut dyn Backend, kind: PoolKind) -> Result<bool> {
        let other = match kind {
            PoolKind::Small => PoolKind::Large,
            PoolKind::Large => PoolKind::Small,
        };
        self.release_one(backend, other)
    }

    /// Returns one page to the device: a cached page if there is one, else the coldest idle page
    /// of either pool.
    pub(super) fn release_coldest(&mut self, backend: &mut dyn Backend) -> Result<bool> {
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

    /// Unmaps the mapped page `i` of `kind`'s pool that holds no block and caches its handle (a
    /// normal-frame tail's goes back to the device, and its fence with it). A driver failure
    /// leaves it mapped and idle, as it was.
    pub(super) fn unmap_page(&mut self, backend: &mut dyn Backend, kind: PoolKind, i: usize) -> Result<()> {
        let pool = self.pools[kind as usize].as_mut().expect("pool exists");
        let slot = pool.slot(i);
        debug_assert!(slot.handle != NO_HANDLE && slot.live == 0);
        let (va, len) = (pool.page_va(i), pool.mapped_len(i));
        backend.unmap(va)?;
        pool.idle.remove(&(slot.idle_since, i as u32));
        pool.slot_mut(i).handle = NO_HANDLE;
        pool.mapped -= 1;
        let neighbours = pool.mapped_neighbours(i);
        self.books.events.push(Action::SegmentUnmap, va, len);
        if slot.tail != 0 {
            pool.slot_mut(i).tail = 0;
            pool.tail_gap -= pool.page - len;
            let page = pool.page;
            pool.space.release_range(va + len, page - len)?;
            self.count_runs(kind, neighbours, false);
            backend.free_physical(slot.handle)?;
            self.books.stats.on_page_free(kind, len);
            return Ok(());
        }
        self.count_runs(kind, neighbours, false);
        self.cache[kind as usize].push((slot.handle, slot.page));
        Ok(())
    }

    /// Returns one cached page of `kind`'s pool made of normal frames to the device.
    pub(super) fn free_cached_normal(&mut self, backend: &mut dyn Backend, kind: PoolKind) -> Result<bool> {
        let cache = &mut self.cache[kind as usize];
        let Some(at) = cache.iter().rposition(|&(_, pte)| pte != PageSize::Size2M) else { return Ok(false) };
        backend.free_physical(cache[at].0)?;
        cache.swap_remove(at);
        self.books.stats.on_page_free(kind, self.page_of(kind));
        Ok(true)
    }
}
