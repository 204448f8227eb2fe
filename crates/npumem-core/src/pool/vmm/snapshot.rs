use super::*;

impl VmmAllocator {
    /// `kind`'s pool as if its waiting blocks were released: its free extents (coalesced, in
    /// address order) and how many of its pages would be idle.
    pub(super) fn settled_view(&self, kind: PoolKind, pool: &VmmPool) -> (Vec<(u64, u64)>, u64) {
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

    /// `fragmentation`, given the owner's `live` blocks (in address order).
    pub(super) fn fragmentation_of(&self, live: &[Granted]) -> Fragmentation {
        let mut f = Fragmentation::of(&self.books.stats);
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
        f.segments = self.segments_of(live).iter().map(SegmentUse::of).collect();
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

    /// The segments, with the pooled blocks of the owner's `live` blocks (in address order).
    pub(super) fn segments_of(&self, live: &[Granted]) -> Vec<SegmentSnapshot> {
        let mut out = Vec::new();
        for (k, pool) in self.pools.iter().enumerate() {
            let Some(pool) = pool else { continue };
            let kind = if k == 0 { PoolKind::Small } else { PoolKind::Large };
            // Live blocks in address order, walked along with the runs of mapped pages (every
            // live block lies on mapped pages).
            let mut lives = live
                .iter()
                .filter(|g| (pool.base..pool.end).contains(&g.ptr))
                .map(|g| (g.ptr, g.granted, g.requested))
                .peekable();
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
