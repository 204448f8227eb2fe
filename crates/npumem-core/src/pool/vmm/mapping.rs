use super::*;

impl VmmAllocator {
    /// The normal-frame tail a block that ends at `end` in `kind`'s pool could have: its last
    /// page and the bytes to map at that page's start (the block's part of it, in normal
    /// pages), if the page is unmapped and that part is less than the page.
    pub(super) fn tail_at(&self, backend: &dyn Backend, kind: PoolKind, end: u64) -> Option<(usize, u64)> {
        let unit = backend.page_size(PageKind::Normal).bytes().max(TAIL_UNIT);
        let pool = self.pool(kind);
        let last = pool.pages_of(end - 1, 1).start;
        let len = checked_align_up(end - pool.page_va(last), unit)?;
        (pool.slot(last).handle == NO_HANDLE && len < pool.page && len % TAIL_UNIT == 0).then_some((last, len))
    }

    /// The tail of `tail_at`, with the rest of its page's VA (free: no block lies on an unmapped
    /// page) fenced off, so that no block is placed over memory the tail does not map.
    pub(super) fn tail_of(&mut self, backend: &dyn Backend, kind: PoolKind, end: u64) -> Result<Option<(usize, u64)>> {
        let Some((last, len)) = self.tail_at(backend, kind, end) else { return Ok(None) };
        let quantum = self.config.quantum;
        let pool = self.pool_mut(kind);
        pool.space.reserve_at(pool.page_va(last) + len, pool.page - len, quantum)?;
        Ok(Some((last, len)))
    }

    /// Normal frames for a tail of `len` bytes in `kind`'s pool, within the limit.
    pub(super) fn acquire_tail(
        &mut self,
        backend: &mut dyn Backend,
        kind: PoolKind,
        len: u64,
    ) -> Result<(PhysHandle, PageSize)> {
        self.check_limit(len)?;
        let h = backend.create_physical(len, PageKind::Normal)?;
        self.books.stats.on_page_alloc(kind, len);
        Ok((h, backend.page_size(PageKind::Normal)))
    }

    /// Maps every unmapped page under `[ptr, ptr + size)` of `kind`'s pool and counts the block
    /// on each page. With `tail`, an unmapped last page that the block covers only in part gets
    /// a normal-frame tail (see `tail_of`). On failure nothing is left changed.
    pub(super) fn map_range(
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
        let pool = self.pool(kind);
        let needed: Vec<usize> = range.clone().filter(|&i| pool.slot(i).handle == NO_HANDLE).collect();
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
                            self.books.stats.on_page_free(kind, len);
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
                    self.books.events.push(Action::SegmentMap, va, len);
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

    /// The memory a large block at `ptr` that needs `needed` pages takes with a normal-frame
    /// tail (see `tail_of`): its last page's part in normal pages instead of a whole page.
    pub(super) fn tail_bytes(&self, backend: &dyn Backend, ptr: u64, size: u64, needed: usize) -> u64 {
        let page = self.page_of(PoolKind::Large);
        let whole = needed as u64 * page;
        match self.tail_at(backend, PoolKind::Large, ptr + size) {
            Some((_, len)) => whole.saturating_sub(page) + len,
            None => whole,
        }
    }

    /// At most how much memory a malloc could get: what the device has free within the limit,
    /// plus every idle and cached page of both pools (stitching and giving back reclaim them).
    pub(super) fn obtainable(&self, backend: &dyn Backend) -> u64 {
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
}
