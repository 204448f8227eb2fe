//! `ReferenceTlb`: the TLB model as first written, kept as the executable specification of
//! [`super::Tlb`].
//!
//! Every lookup scans its set (fully associative arrays and page-walk caches in full), LRU keeps
//! a stamp per entry and evicts the smallest, and every access of `run` asks `translate` again
//! unless it falls in the previous page. It is slow on random access (a few million accesses a
//! second) and obviously right; `Tlb` must give bit-identical counters and contents on every
//! configuration and address stream, which the property tests in `tests/tlb_reference.rs`
//! check over random hierarchies and streams. Nothing else uses it. Keep it unchanged: a change
//! of the model's semantics goes into both, first here.
//!
//! Invariants: those of [`super::Tlb`] (a set never holds two entries with the same tag nor more
//! than `ways` entries; fills are inclusive; hits + misses = lookups per array; the cycle counter
//! saturates).

use super::{ArrayConfig, ArrayStats, HostConfig, Replacement, TlbConfig, TlbStats, coalescible, table_gpa};
use npumem_base::error::Result;
use npumem_base::{PageSize, Translation};

#[derive(Clone, Copy, Debug)]
struct Entry {
    tag: u64,
    stamp: u64,
}

const EMPTY: u64 = u64::MAX;

#[derive(Debug)]
struct Array {
    cfg: ArrayConfig,
    sets: usize,
    entries: Vec<Entry>,
    /// Pseudo-LRU bits per set, or the round-robin pointer.
    meta: Vec<u64>,
    sizes_mask: u8,
}

fn size_bit(p: PageSize) -> u8 {
    1 << (p as u8)
}

impl Array {
    fn new(cfg: ArrayConfig) -> Self {
        let sets = cfg.entries / cfg.ways;
        let sizes_mask =
            if cfg.page_sizes.is_empty() { 0xFF } else { cfg.page_sizes.iter().fold(0, |m, &p| m | size_bit(p)) };
        Array { entries: vec![Entry { tag: EMPTY, stamp: 0 }; cfg.entries], meta: vec![0; sets], sets, sizes_mask, cfg }
    }

    fn holds(&self, p: PageSize) -> bool {
        self.sizes_mask & size_bit(p) != 0
    }

    fn set_of(&self, vpn: u64) -> usize {
        (vpn % self.sets as u64) as usize
    }

    /// Looks `tag` up; on a hit updates the replacement state.
    fn lookup(&mut self, tag: u64, vpn: u64, now: u64) -> bool {
        let set = self.set_of(vpn);
        let ways = self.cfg.ways;
        let base = set * ways;
        for w in 0..ways {
            if self.entries[base + w].tag == tag {
                self.touch(set, w, now);
                return true;
            }
        }
        false
    }

    fn touch(&mut self, set: usize, way: usize, now: u64) {
        let ways = self.cfg.ways;
        match self.cfg.replacement {
            Replacement::Lru => self.entries[set * ways + way].stamp = now,
            Replacement::Plru => {
                // Walk the tree from the root towards `way`, pointing each node away from it.
                let mut bits = self.meta[set];
                let (mut node, mut lo, mut span) = (1usize, 0usize, ways);
                while span > 1 {
                    span /= 2;
                    let right = way >= lo + span;
                    if right {
                        bits &= !(1 << node);
                        lo += span;
                    } else {
                        bits |= 1 << node;
                    }
                    node = 2 * node + usize::from(right);
                }
                self.meta[set] = bits;
            }
            Replacement::RoundRobin | Replacement::Random => {}
        }
    }

    /// Inserts `tag`, evicting if the set is full; returns whether something was evicted.
    fn fill(&mut self, tag: u64, vpn: u64, now: u64, rng: &mut u64) -> bool {
        let set = self.set_of(vpn);
        let ways = self.cfg.ways;
        let base = set * ways;
        let (way, evicted) = match (0..ways).find(|&w| self.entries[base + w].tag == EMPTY) {
            Some(w) => (w, false),
            None => {
                let victim = match self.cfg.replacement {
                    Replacement::Lru => (0..ways).min_by_key(|&w| self.entries[base + w].stamp).expect("ways > 0"),
                    Replacement::Plru => {
                        let bits = self.meta[set];
                        let (mut node, mut lo, mut span) = (1usize, 0usize, ways);
                        while span > 1 {
                            span /= 2;
                            let right = bits & (1 << node) != 0;
                            if right {
                                lo += span;
                            }
                            node = 2 * node + usize::from(right);
                        }
                        lo
                    }
                    Replacement::RoundRobin => {
                        let w = (self.meta[set] as usize) % ways;
                        self.meta[set] = (w as u64 + 1) % ways as u64;
                        w
                    }
                    Replacement::Random => {
                        // xorshift64: deterministic for a given run.
                        *rng ^= *rng << 13;
                        *rng ^= *rng >> 7;
                        *rng ^= *rng << 17;
                        (*rng % ways as u64) as usize
                    }
                };
                (victim, true)
            }
        };
        self.entries[base + way] = Entry { tag, stamp: now };
        self.touch(set, way, now);
        evicted
    }
}

/// Walk-cache of table pointers for one table level: fully associative LRU over VA prefixes.
#[derive(Debug)]
struct WalkCache {
    shift: u32,
    entries: Vec<Entry>,
}

impl WalkCache {
    fn lookup_fill(&mut self, va: u64, now: u64) -> bool {
        if self.entries.is_empty() {
            return false;
        }
        let tag = va >> self.shift;
        if let Some(e) = self.entries.iter_mut().find(|e| e.tag == tag) {
            e.stamp = now;
            return true;
        }
        let victim =
            self.entries.iter_mut().min_by_key(|e| if e.tag == EMPTY { 0 } else { e.stamp + 1 }).expect("non-empty");
        *victim = Entry { tag, stamp: now };
        false
    }
}

/// The host dimension: a nested TLB over host pages and host walk caches, each probe stamped by
/// its own clock (one access probes a host cache many times).
#[derive(Debug)]
struct Host {
    config: HostConfig,
    tlb: WalkCache,
    caches: Vec<WalkCache>,
    now: u64,
}

impl Host {
    fn new(config: &HostConfig) -> Self {
        let cache = |shift, n| WalkCache { shift, entries: vec![Entry { tag: EMPTY, stamp: 0 }; n] };
        Host {
            tlb: cache(config.page_size.bytes().trailing_zeros(), config.nested_tlb_entries),
            caches: [39u32, 30, 21].iter().zip(config.walk_cache_entries).map(|(&s, n)| cache(s, n)).collect(),
            config: config.clone(),
            now: 0,
        }
    }

    /// Host reads to translate `gpa`: none on a nested-TLB hit, else a host walk whose upper
    /// steps the host walk caches skip.
    fn translate(&mut self, stats: &mut TlbStats, gpa: u64) -> u64 {
        if !self.tlb.entries.is_empty() {
            self.now += 1;
            if self.tlb.lookup_fill(gpa, self.now) {
                stats.nested_tlb_hits += 1;
                return 0;
            }
            stats.nested_tlb_misses += 1;
        }
        stats.nested_walks += 1;
        let depth = self.config.depth();
        let tables = (depth as usize).saturating_sub(1).min(3);
        let mut skipped = 0;
        for level in (0..tables).rev() {
            self.now += 1;
            if self.caches[level].lookup_fill(gpa, self.now) {
                skipped = level as u64 + 1;
                break;
            }
        }
        for level in skipped as usize..tables {
            self.now += 1;
            self.caches[level].lookup_fill(gpa, self.now);
        }
        let steps = u64::from(depth) - skipped;
        stats.nested_steps_skipped += skipped;
        stats.nested_steps += steps;
        steps
    }
}

#[derive(Debug)]
pub struct ReferenceTlb {
    config: TlbConfig,
    levels: Vec<Vec<Array>>,
    walk_caches: Vec<WalkCache>,
    host: Option<Host>,
    stats: TlbStats,
    now: u64,
    rng: u64,
    /// The tag of the previous access and the L1 arrays that hold it: another access to the
    /// same page is an L1 hit that changes no replacement state (it is already the most recent
    /// in its set), so it only counts.
    last: Option<(u64, u8)>,
}

impl ReferenceTlb {
    pub fn new(config: TlbConfig) -> Result<Self> {
        config.validate()?;
        let levels = config.levels.iter().map(|l| l.iter().cloned().map(Array::new).collect()).collect();
        let walk_caches = [39u32, 30, 21]
            .iter()
            .zip(config.walk_cache_entries)
            .map(|(&shift, n)| WalkCache { shift, entries: vec![Entry { tag: EMPTY, stamp: 0 }; n] })
            .collect();
        let stats = TlbStats {
            arrays: config.levels.iter().map(|l| vec![ArrayStats::default(); l.len()]).collect(),
            ..Default::default()
        };
        let host = config.host.as_ref().map(Host::new);
        Ok(ReferenceTlb { config, levels, walk_caches, host, stats, now: 0, rng: 0x9E37_79B9_7F4A_7C15, last: None })
    }

    pub fn config(&self) -> &TlbConfig {
        &self.config
    }

    pub fn stats(&self) -> &TlbStats {
        &self.stats
    }

    /// Clears the counters (the contents stay: a warm TLB).
    pub fn reset_stats(&mut self) {
        self.last = None;
        for l in &mut self.stats.arrays {
            l.iter_mut().for_each(|a| *a = ArrayStats::default());
        }
        let arrays = std::mem::take(&mut self.stats.arrays);
        self.stats = TlbStats { arrays, ..Default::default() };
    }

    /// Simulates one access of the translation `t` of `va` (one page per entry).
    pub fn access(&mut self, va: u64, t: Translation) {
        self.access_group(va, t, 1);
    }

    /// Simulates one access whose entry covers `group` contiguous pages (a power of two).
    fn access_group(&mut self, va: u64, t: Translation, group: u32) {
        self.stats.accesses += 1;
        // The entry maps the smaller of the guest's and the host's page.
        let t = self.config.host.as_ref().map_or(t, |h| h.splinter(t));
        let page = t.page_size;
        // The entry's unit: `group` pages; the tag packs the unit number, log2(group) and the size.
        let vpn = va / page.bytes() / group as u64;
        let tag = (vpn << 6) | ((group.trailing_zeros() as u64) << 2) | page as u64;
        if let Some((last, mask)) = self.last {
            if last == tag {
                for (ai, s) in self.stats.arrays[0].iter_mut().enumerate() {
                    if mask & (1 << ai) != 0 {
                        s.lookups += 1;
                        s.hits += 1;
                    }
                }
                return;
            }
        }
        self.now += 1;
        let l1_mask =
            self.levels[0].iter().enumerate().filter(|(_, a)| a.holds(page)).fold(0u8, |m, (i, _)| m | 1 << i);
        self.last = (l1_mask != 0).then_some((tag, l1_mask));
        for (li, level) in self.levels.iter_mut().enumerate() {
            let mut hit = false;
            for (ai, a) in level.iter_mut().enumerate() {
                if !a.holds(page) {
                    continue;
                }
                let s = &mut self.stats.arrays[li][ai];
                s.lookups += 1;
                if a.lookup(tag, vpn, self.now) {
                    s.hits += 1;
                    self.stats.cycles = self.stats.cycles.saturating_add(a.cfg.hit_cycles);
                    hit = true;
                } else {
                    s.misses += 1;
                }
            }
            if hit {
                // Fill the closer levels (inclusive hierarchy).
                self.fill_up_to(li, tag, vpn, page);
                return;
            }
        }
        self.walk(va, t.depth);
        self.fill_up_to(self.levels.len(), tag, vpn, page);
    }

    fn fill_up_to(&mut self, level: usize, tag: u64, vpn: u64, page: PageSize) {
        for (li, arrays) in self.levels.iter_mut().enumerate().take(level) {
            for (ai, a) in arrays.iter_mut().enumerate() {
                if a.holds(page) && a.fill(tag, vpn, self.now, &mut self.rng) {
                    self.stats.arrays[li][ai].evictions += 1;
                }
            }
        }
    }

    /// A page walk of `depth` descriptor reads; the walk caches skip the upper ones.
    fn walk(&mut self, va: u64, depth: u32) {
        self.stats.walks += 1;
        // Table levels above the leaf: depth 4 → tables 0,1,2; depth 3 → 0,1; depth 2 → 0.
        let tables = (depth as usize).saturating_sub(1).min(3);
        let mut skipped = 0;
        for level in (0..tables).rev() {
            if self.walk_caches[level].lookup_fill(va, self.now) {
                skipped = level as u64 + 1;
                break;
            }
        }
        // Fill the caches of the levels below the hit too (the walk read them).
        for level in skipped as usize..tables {
            self.walk_caches[level].lookup_fill(va, self.now);
        }
        let steps = depth as u64 - skipped;
        self.stats.walk_steps_skipped += skipped;
        self.stats.walk_steps += steps;
        let mut reads = steps;
        if let Some(host) = &mut self.host {
            // Each guest table read taken, then the data's page (its guest-physical address is
            // its VA), through the host dimension.
            for level in skipped as u32..depth {
                reads += host.translate(&mut self.stats, table_gpa(level, va));
            }
            reads += host.translate(&mut self.stats, va);
        }
        self.stats.cycles = self.stats.cycles.saturating_add(reads * self.config.walk_step_cycles);
    }

    /// Runs `addresses` through the TLB, translating each through `translate` (the device's page
    /// table); unmapped addresses count as faults. Consecutive accesses to one page reuse its
    /// translation.
    pub fn run(&mut self, addresses: &[u64], translate: impl Fn(u64) -> Option<Translation>) {
        let host = self.config.host.clone();
        let translate = move |va| translate(va).map(|t| host.as_ref().map_or(t, |h| h.splinter(t)));
        // (page start, page end, translation, pages its entry covers)
        let mut last: Option<(u64, u64, Translation, u32)> = None;
        let mut groups: std::collections::HashMap<(u64, PageSize), u32> = std::collections::HashMap::new();
        let k = self.config.coalesce;
        // Fast path: an access to the same page as the previous one is an L1 hit on the most
        // recent entry; a streak of them is only counted, and added up when it ends.
        let mut streak = 0u64;
        let mut range = (1u64, 0u64);
        for &va in addresses {
            if va >= range.0 && va < range.1 {
                streak += 1;
                continue;
            }
            self.flush_streak(&mut streak);
            let (t, group) = match last {
                Some((lo, hi, t, g)) if va >= lo && va < hi => (t, g),
                _ => match translate(va) {
                    Some(t) => {
                        let size = t.page_size.bytes();
                        let lo = va - va % size;
                        let g = if k > 1 {
                            *groups
                                .entry((va / (size * k as u64), t.page_size))
                                .or_insert_with(|| if coalescible(va, t, k, &translate) { k } else { 1 })
                        } else {
                            1
                        };
                        last = Some((lo, lo + size, t, g));
                        (t, g)
                    }
                    None => {
                        self.stats.faults += 1;
                        continue;
                    }
                },
            };
            self.access_group(va, t, group);
            // Later accesses to this page may take the fast path when it is held in L1.
            range = match (last, self.last) {
                (Some((lo, hi, _, _)), Some(_)) => (lo, hi),
                _ => (1, 0),
            };
        }
        self.flush_streak(&mut streak);
    }

    /// Counts `streak` fast-path L1 hits on the arrays holding the last entry.
    fn flush_streak(&mut self, streak: &mut u64) {
        if *streak == 0 {
            return;
        }
        let mask = self.last.map_or(0, |(_, m)| m);
        self.stats.accesses += *streak;
        for (ai, s) in self.stats.arrays[0].iter_mut().enumerate() {
            if mask & (1 << ai) != 0 {
                s.lookups += *streak;
                s.hits += *streak;
            }
        }
        *streak = 0;
    }

    /// Bytes the valid entries of each level map right now (effective reach).
    pub fn effective_reach(&self) -> Vec<u64> {
        let sizes = PageSize::ALL;
        self.levels
            .iter()
            .map(|l| {
                l.iter()
                    .flat_map(|a| a.entries.iter())
                    .filter(|e| e.tag != EMPTY)
                    .map(|e| sizes[(e.tag & 3) as usize].bytes() << ((e.tag >> 2) & 15))
                    .sum()
            })
            .collect()
    }

    /// The tag of every entry, per level and array in slot order (set by set, way by way; `u64::MAX`
    /// for an empty one), then of every walk cache: the whole state two models must share.
    pub fn contents(&self) -> (Vec<Vec<Vec<u64>>>, Vec<Vec<u64>>) {
        let arrays = self.levels.iter().map(|l| l.iter().map(|a| a.entries.iter().map(|e| e.tag).collect()).collect());
        let mut caches: Vec<Vec<u64>> =
            self.walk_caches.iter().map(|c| c.entries.iter().map(|e| e.tag).collect()).collect();
        if let Some(h) = &self.host {
            caches.extend(std::iter::once(&h.tlb).chain(&h.caches).map(|c| c.entries.iter().map(|e| e.tag).collect()));
        }
        (arrays.collect(), caches)
    }

    /// The largest footprint the entries of each level could map if every entry held a page of
    /// `page` size (nominal reach).
    pub fn nominal_reach(&self, page: PageSize) -> Vec<u64> {
        self.levels
            .iter()
            .map(|l| l.iter().filter(|a| a.holds(page)).map(|a| a.cfg.entries as u64 * page.bytes()).sum())
            .collect()
    }
}
