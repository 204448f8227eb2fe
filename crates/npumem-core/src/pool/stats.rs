//! `PoolStats`: allocator statistics in PyTorch's scheme, so tools written for
//! `torch.cuda.memory_stats()` read npumem's unchanged.
//!
//! Keys are `<stat>.<all|small_pool|large_pool>.<current|peak|allocated|freed>` for the stat
//! arrays, and plain names for the scalars (`num_alloc_retries`, `num_ooms`, ...).
//!
//! Invariants: `current` = `allocated` − `freed` for every stat; `peak` ≥ `current`; the `all`
//! entry of every array equals the sum of its two pools. `active` and `active_bytes` are
//! `allocation` and `allocated_bytes` (a block stays allocated in its pool until the device hands
//! it back, after its stream-ordered free has completed), so they are kept once and read through
//! `PoolStats::active` / `PoolStats::active_bytes`: each block costs three arrays' updates, not
//! five.

/// A counter with its high-water mark and its accumulated increases and decreases.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stat {
    pub current: u64,
    pub peak: u64,
    pub allocated: u64,
    pub freed: u64,
}

impl Stat {
    #[inline]
    pub fn add(&mut self, n: u64) {
        self.current += n;
        self.allocated += n;
        self.peak = self.peak.max(self.current);
    }

    #[inline]
    pub fn sub(&mut self, n: u64) {
        debug_assert!(self.current >= n, "stat underflow");
        self.current -= n;
        self.freed += n;
    }

    pub fn reset_peak(&mut self) {
        self.peak = self.current;
    }
}

/// Which pool a block belongs to: requests up to 1 MiB are small.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PoolKind {
    Small = 0,
    Large = 1,
}

impl PoolKind {
    pub fn name(self) -> &'static str {
        match self {
            PoolKind::Small => "small_pool",
            PoolKind::Large => "large_pool",
        }
    }
}

/// A stat kept for all memory and for each pool.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StatArray {
    pub all: Stat,
    pub pools: [Stat; 2],
}

impl StatArray {
    #[inline]
    pub fn add(&mut self, pool: PoolKind, n: u64) {
        self.all.add(n);
        self.pools[pool as usize].add(n);
    }

    #[inline]
    pub fn sub(&mut self, pool: PoolKind, n: u64) {
        self.all.sub(n);
        self.pools[pool as usize].sub(n);
    }

    /// `n[p]` added to pool `p`, both at once: `all` is updated once with the sum (the same
    /// counters and peaks as the two `add`s, as the second cannot lower the first's peak).
    #[inline]
    fn add_each(&mut self, n: [u64; 2]) {
        self.all.add(n[0] + n[1]);
        self.pools[0].add(n[0]);
        self.pools[1].add(n[1]);
    }

    /// `n[p]` taken from pool `p`, both at once.
    #[inline]
    fn sub_each(&mut self, n: [u64; 2]) {
        self.all.sub(n[0] + n[1]);
        self.pools[0].sub(n[0]);
        self.pools[1].sub(n[1]);
    }

    pub fn small_pool(&self) -> Stat {
        self.pools[PoolKind::Small as usize]
    }

    pub fn large_pool(&self) -> Stat {
        self.pools[PoolKind::Large as usize]
    }

    fn reset_peak(&mut self) {
        self.all.reset_peak();
        self.pools.iter_mut().for_each(Stat::reset_peak);
    }
}

/// Blocks counted together by a batch: how many, their sizes and requested bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tally {
    pub blocks: u64,
    pub bytes: u64,
    pub requested: u64,
}

impl Tally {
    /// One block of `bytes` (`requested` asked for).
    #[inline]
    pub fn add(&mut self, bytes: u64, requested: u64) {
        self.add_many(1, bytes, requested);
    }

    /// `blocks` blocks of `bytes` in all (`requested` asked for in all).
    #[inline]
    pub fn add_many(&mut self, blocks: u64, bytes: u64, requested: u64) {
        self.blocks += blocks;
        self.bytes += bytes;
        self.requested += requested;
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Live allocations (PyTorch emits this array as `allocation`).
    pub allocation: StatArray,
    /// Segments obtained from the device.
    pub segment: StatArray,
    /// Free blocks inside segments that also hold other blocks (cannot be returned alone).
    pub inactive_split: StatArray,
    pub allocated_bytes: StatArray,
    pub reserved_bytes: StatArray,
    pub inactive_split_bytes: StatArray,
    /// Bytes the callers asked for (allocated_bytes − requested_bytes = rounding waste).
    pub requested_bytes: StatArray,
    pub oversize_allocations: Stat,
    pub oversize_segments: Stat,
    pub num_alloc_retries: u64,
    pub num_ooms: u64,
    pub num_sync_all_streams: u64,
    pub num_device_alloc: u64,
    pub num_device_free: u64,
    /// Mallocs that had to obtain memory from the device (a new segment or new pages); the rest
    /// were served from the cache. Not a PyTorch key.
    pub num_cache_misses: u64,
    pub max_split_size: u64,
}

impl PoolStats {
    /// Blocks in use (allocated, or freed but still awaited by a stream): `allocation`, as a
    /// block's free reaches its pool only once its streams have completed.
    #[inline]
    pub fn active(&self) -> &StatArray {
        &self.allocation
    }

    /// Bytes of the blocks in use: `allocated_bytes` (see `active`).
    #[inline]
    pub fn active_bytes(&self) -> &StatArray {
        &self.allocated_bytes
    }

    /// Records a block of `size` bytes (`requested` asked for) becoming allocated.
    #[inline]
    pub fn on_alloc(&mut self, pool: PoolKind, size: u64, requested: u64) {
        self.on_allocs(pool, Tally { blocks: 1, bytes: size, requested });
    }

    #[inline]
    pub fn on_free(&mut self, pool: PoolKind, size: u64, requested: u64) {
        self.on_frees(pool, Tally { blocks: 1, bytes: size, requested });
    }

    /// Records `t.blocks` blocks becoming allocated at once (the same counters and peaks as
    /// one `on_alloc` per block, as nothing is freed in between).
    #[inline]
    pub fn on_allocs(&mut self, pool: PoolKind, t: Tally) {
        self.allocation.add(pool, t.blocks);
        self.allocated_bytes.add(pool, t.bytes);
        self.requested_bytes.add(pool, t.requested);
    }

    /// Records `t.blocks` blocks being freed at once.
    #[inline]
    pub fn on_frees(&mut self, pool: PoolKind, t: Tally) {
        self.allocation.sub(pool, t.blocks);
        self.allocated_bytes.sub(pool, t.bytes);
        self.requested_bytes.sub(pool, t.requested);
    }

    /// Records the blocks of `t[p]` becoming allocated in pool `p`, all at once (a batch's
    /// blocks of both pools): the same counters and peaks as `on_allocs` per pool, with the
    /// `all` entries updated once when both pools have blocks.
    #[inline]
    pub fn on_allocs_each(&mut self, t: [Tally; 2]) {
        self.on_each(t, Self::on_allocs, StatArray::add_each);
    }

    /// Records the blocks of `t[p]` being freed from pool `p`, all at once.
    #[inline]
    pub fn on_frees_each(&mut self, t: [Tally; 2]) {
        self.on_each(t, Self::on_frees, StatArray::sub_each);
    }

    /// `one` for the pool that has blocks in `t`, or `each` on every array when both have.
    #[inline(always)]
    fn on_each(&mut self, t: [Tally; 2], one: fn(&mut Self, PoolKind, Tally), each: fn(&mut StatArray, [u64; 2])) {
        match (t[0].blocks, t[1].blocks) {
            (0, 0) => {}
            (_, 0) => one(self, PoolKind::Small, t[0]),
            (0, _) => one(self, PoolKind::Large, t[1]),
            _ => {
                let (blocks, bytes) = ([t[0].blocks, t[1].blocks], [t[0].bytes, t[1].bytes]);
                each(&mut self.allocation, blocks);
                each(&mut self.allocated_bytes, bytes);
                each(&mut self.requested_bytes, [t[0].requested, t[1].requested]);
            }
        }
    }

    pub fn on_segment_alloc(&mut self, pool: PoolKind, size: u64) {
        self.segment.add(pool, 1);
        self.on_page_alloc(pool, size);
    }

    pub fn on_segment_free(&mut self, pool: PoolKind, size: u64) {
        self.segment.sub(pool, 1);
        self.on_page_free(pool, size);
    }

    /// Physical memory obtained from the device for a page of an expandable segment: reserved
    /// bytes and a device allocation, but no segment of its own (such a pool counts its
    /// segments as runs of mapped pages, as its snapshot shows them).
    pub fn on_page_alloc(&mut self, pool: PoolKind, size: u64) {
        self.reserved_bytes.add(pool, size);
        self.num_device_alloc += 1;
    }

    pub fn on_page_free(&mut self, pool: PoolKind, size: u64) {
        self.reserved_bytes.sub(pool, size);
        self.num_device_free += 1;
    }

    pub fn reset_peaks(&mut self) {
        for a in self.arrays_mut() {
            a.reset_peak();
        }
        self.oversize_allocations.reset_peak();
        self.oversize_segments.reset_peak();
    }

    fn arrays(&self) -> [(&'static str, &StatArray); 9] {
        [
            ("allocation", &self.allocation),
            ("segment", &self.segment),
            ("active", self.active()),
            ("inactive_split", &self.inactive_split),
            ("allocated_bytes", &self.allocated_bytes),
            ("reserved_bytes", &self.reserved_bytes),
            ("active_bytes", self.active_bytes()),
            ("inactive_split_bytes", &self.inactive_split_bytes),
            ("requested_bytes", &self.requested_bytes),
        ]
    }

    /// The arrays kept (`active` and `active_bytes` read two of them).
    fn arrays_mut(&mut self) -> [&mut StatArray; 7] {
        [
            &mut self.allocation,
            &mut self.segment,
            &mut self.inactive_split,
            &mut self.allocated_bytes,
            &mut self.reserved_bytes,
            &mut self.inactive_split_bytes,
            &mut self.requested_bytes,
        ]
    }

    /// Every statistic under its PyTorch key, in a stable order. Values are signed, as PyTorch's
    /// are: an unlimited `max_split_size` reads -1.
    pub fn pairs(&self) -> Vec<(String, i64)> {
        let mut out = Vec::with_capacity(120);
        let push_stat = |out: &mut Vec<(String, i64)>, prefix: String, s: &Stat| {
            out.push((format!("{prefix}.current"), s.current as i64));
            out.push((format!("{prefix}.peak"), s.peak as i64));
            out.push((format!("{prefix}.allocated"), s.allocated as i64));
            out.push((format!("{prefix}.freed"), s.freed as i64));
        };
        for (name, array) in self.arrays() {
            push_stat(&mut out, format!("{name}.all"), &array.all);
            for pool in [PoolKind::Small, PoolKind::Large] {
                push_stat(&mut out, format!("{name}.{}", pool.name()), &array.pools[pool as usize]);
            }
        }
        push_stat(&mut out, "oversize_allocations".into(), &self.oversize_allocations);
        push_stat(&mut out, "oversize_segments".into(), &self.oversize_segments);
        for (k, v) in [
            ("num_alloc_retries", self.num_alloc_retries),
            ("num_ooms", self.num_ooms),
            ("num_sync_all_streams", self.num_sync_all_streams),
            ("num_device_alloc", self.num_device_alloc),
            ("num_device_free", self.num_device_free),
            ("num_cache_misses", self.num_cache_misses),
        ] {
            out.push((k.to_string(), v as i64));
        }
        let max_split = if self.max_split_size == u64::MAX { -1 } else { self.max_split_size as i64 };
        out.push(("max_split_size".to_string(), max_split));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_peaks() {
        let mut s = PoolStats::default();
        s.on_segment_alloc(PoolKind::Small, 2 << 20);
        s.on_alloc(PoolKind::Small, 512, 100);
        s.on_alloc(PoolKind::Small, 1024, 1000);
        s.on_free(PoolKind::Small, 512, 100);
        let m: std::collections::HashMap<String, i64> = s.pairs().into_iter().collect();
        assert_eq!(m["allocated_bytes.all.current"], 1024);
        assert_eq!(m["allocated_bytes.all.peak"], 1536);
        assert_eq!(m["allocated_bytes.small_pool.freed"], 512);
        assert_eq!(m["allocated_bytes.large_pool.current"], 0);
        assert_eq!(m["requested_bytes.all.current"], 1000);
        // Active blocks are the allocated ones, under their own keys.
        assert_eq!((m["active_bytes.all.current"], m["active_bytes.all.peak"]), (1024, 1536));
        assert_eq!((m["active.small_pool.allocated"], m["active.small_pool.freed"]), (2, 1));
        assert_eq!(m["reserved_bytes.all.current"], 2 << 20);
        assert_eq!(m["num_device_alloc"], 1);
        s.reset_peaks();
        assert_eq!(s.allocated_bytes.all.peak, 1024);
    }

    /// The batched updates of both pools give exactly what one update per pool gives.
    #[test]
    fn batched_updates_of_both_pools_match_one_per_pool() {
        let tallies = [
            [Tally::default(), Tally::default()],
            [Tally { blocks: 2, bytes: 1024, requested: 1000 }, Tally::default()],
            [Tally::default(), Tally { blocks: 1, bytes: 4 << 20, requested: 3 << 20 }],
            [
                Tally { blocks: 3, bytes: 1536, requested: 1400 },
                Tally { blocks: 2, bytes: 6 << 20, requested: 5 << 20 },
            ],
        ];
        let (mut each, mut one) = (PoolStats::default(), PoolStats::default());
        for t in tallies {
            each.on_allocs_each(t);
            one.on_allocs(PoolKind::Small, t[0]);
            one.on_allocs(PoolKind::Large, t[1]);
            assert_eq!(each, one);
        }
        for t in tallies.into_iter().rev() {
            each.on_frees_each(t);
            one.on_frees(PoolKind::Small, t[0]);
            one.on_frees(PoolKind::Large, t[1]);
            assert_eq!(each, one);
        }
        assert_eq!(each.allocated_bytes.all.current, 0);
        assert_eq!(each.allocated_bytes.all.peak, 1024 + 1536 + (10 << 20));
    }
}
