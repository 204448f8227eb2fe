//! `Tlb`: a translation lookaside buffer hierarchy over any page-table walk (a function from a
//! virtual address to a [`Translation`]; npumem-core's `vm::PageTable` in the device). It depends
//! on npumem-base (and raw-cpuid, to read the machine's geometry: [`cpuid`]) only, so nothing of
//! the device stack can reach it.
//!
//! A hierarchy has levels (L1, L2, ...); each level holds one or more arrays — one unified array
//! for every page size, or arrays split by page size (as Intel's L1 DTLB). An array is
//! set-associative (`ways` per set; fully associative when `ways == entries`) with LRU,
//! tree-pseudo-LRU, round-robin or random replacement. A lookup that misses every level walks the
//! page table; page-walk caches per table level let a walk skip the upper steps. Entries are
//! tagged with (page size, virtual page number), so what the allocator mapped — 4 KiB, 64 KiB,
//! 2 MiB or 1 GiB pages — is exactly what the TLB caches.
//!
//! With a host ([`TlbConfig::host`]) it is a guest of a virtual machine: an entry maps the smaller
//! of the guest's and the host's page, and a walk is two-dimensional, each guest table read and
//! the data's page translated through the host's nested TLB and page table ([`walk`]). Presets
//! carry their sources; [`cpuid`] reads the geometry of the machine it runs on.
//!
//! Speed: a lookup costs O(1) at any associativity (narrow sets compare fingerprints of all
//! ways at once and keep LRU as a 4-bit-a-way recency order, wide ones are hashed: [`array`];
//! walk caches and the nested TLB of up to 64 entries are a recency ring searched sixteen
//! fingerprints at a time, with no hash or list to maintain on the miss-heavy walk path:
//! [`walk_cache`]); `run` remembers the translations it has asked for ([`memo`]), counts a run
//! of accesses to the page of the previous one in bulk, and simulates the rest along each page
//! size's chain of arrays ([`chain`]: a dedicated loop when every array is narrow LRU, with
//! [`fixed`] loops monomorphised per chain shape for the common two-link chains; access by
//! access otherwise) or, where a level has two arrays for one size, in batches level by level
//! ([`batch`]). [`reference::ReferenceTlb`] is the plain model (linear scans); the two give
//! bit-identical counters and contents on every configuration and address stream (property tests
//! in npumem-core's `tests/tlb_reference.rs`, over the real page table: one of them over
//! hierarchies the chain loop takes, one over the shapes the fixed loops are compiled for).
//!
//! Every size and cycle count of a configuration is checked against the bounds in [`limits`]
//! before anything is allocated: they sit far above every real part, and keep a hierarchy within
//! about 200 MiB of host memory (16 bytes an entry, up to 56 in sets wider than 16 ways, which
//! carry a hash index).
//!
//! Invariants: a set never holds two entries with the same tag nor more than `ways` entries;
//! fills are inclusive (a walk fills every level that holds the page size); per-array counters
//! satisfy hits + misses = lookups; the cycle counter saturates at `u64::MAX`, never wraps; the
//! previous access's entry, when an L1 array holds it, is the most recent of its set in every L1
//! array that holds its page size (so the next access to it changes no replacement state).

mod array;
mod batch;
mod chain;
mod config;
pub mod cpuid;
mod fixed;
mod memo;
pub mod reference;
mod walk;
mod walk_cache;

pub use config::{ArrayConfig, HostConfig, Replacement, SOURCE_KINDS, TlbConfig, field_range, limits, out_of_range};
pub use walk::table_gpa;

use rustc_hash::FxHashMap;

use self::array::{Array, EMPTY, size_bit};
use self::batch::{Access, Batch};
use self::chain::Chains;
use self::memo::{Known, Memo};
use self::walk::Walker;
use npumem_base::error::Result;
use npumem_base::{PageSize, Translation};

/// Counters of one array.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ArrayStats {
    pub lookups: u64,
    pub hits: u64,
    pub misses: u64,
    pub evictions: u64,
}

/// Counters of a run.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TlbStats {
    pub accesses: u64,
    /// Addresses that are not mapped (skipped).
    pub faults: u64,
    /// Per level, per array.
    pub arrays: Vec<Vec<ArrayStats>>,
    pub walks: u64,
    /// Walk steps skipped thanks to the walk caches, and steps taken.
    pub walk_steps_skipped: u64,
    pub walk_steps: u64,
    /// Translation cycles: hit costs beyond L1 plus walk reads of both dimensions (saturating at
    /// `u64::MAX`).
    pub cycles: u64,
    /// With a host: host translations the nested TLB answered and missed, host walks, and the
    /// host table reads taken and skipped by the host walk caches.
    pub nested_tlb_hits: u64,
    pub nested_tlb_misses: u64,
    pub nested_walks: u64,
    pub nested_steps: u64,
    pub nested_steps_skipped: u64,
}

impl TlbStats {
    /// Memory reads of the average walk, both dimensions (0 without walks).
    pub fn reads_per_walk(&self) -> f64 {
        if self.walks == 0 { 0.0 } else { (self.walk_steps + self.nested_steps) as f64 / self.walks as f64 }
    }

    /// Of those, the host dimension's (0 without walks or without a host).
    pub fn nested_reads_per_walk(&self) -> f64 {
        if self.walks == 0 { 0.0 } else { self.nested_steps as f64 / self.walks as f64 }
    }
}

#[derive(Debug)]
pub struct Tlb {
    config: TlbConfig,
    /// Every array, level by level (level 0's first, so an L1 array's index is its bit in a mask).
    arrays: Vec<Array>,
    /// Per array, its counters during a run (copied into `stats` at the end).
    counters: Vec<ArrayStats>,
    /// Per page size (`PageSize as usize`): the arrays holding that size, level by level.
    plans: [Plan; 4],
    /// Per level: the range of its arrays in `arrays`, and whether each page size has at most
    /// one of them (then the arrays take a batch one after the other).
    level_arrays: Vec<std::ops::Range<usize>>,
    split: Vec<bool>,
    /// Page-walk caches of table levels 0, 1, 2 (none where the configuration has 0 entries),
    /// and the host dimension's nested TLB and walk caches.
    walker: Walker,
    stats: TlbStats,
    rng: u64,
    /// The tag of the previous access and the L1 arrays that hold it: another access to the
    /// same page is an L1 hit that changes no replacement state (it is already the most recent
    /// in its set), so it only counts.
    last: Option<(u64, u8)>,
    /// Translations of the current run (allocated by the first run).
    memo: Option<Box<Memo>>,
    /// Per page size, its arrays level by level, and whether that is the whole hierarchy (then
    /// `run` simulates access by access along them: [`chain`]).
    chains: Chains,
    chained: bool,
    /// Whether `run` takes the chained kernel (chained, every array narrow LRU over a power of
    /// two of sets: [`chain`]).
    kernel: bool,
    /// Per page size, the kernel's fixed loop for it, where its chain has a shape one is
    /// compiled for ([`fixed`]; none without the kernel).
    fixed: [Option<fixed::FixedLoop>; 4],
}

/// The arrays that hold one page size, in lookup order.
#[derive(Debug)]
struct Plan {
    /// Indices into `Tlb::arrays`, level by level.
    arrays: Vec<u8>,
    /// Per level, the end of its arrays in `arrays`.
    level_ends: Vec<usize>,
    /// The level-1 arrays among them, as a mask.
    l1_mask: u8,
}

impl Plan {
    fn new(config: &TlbConfig, holds: impl Fn(usize) -> bool) -> Self {
        let (mut arrays, mut level_ends, mut first) = (Vec::new(), Vec::new(), 0);
        for level in &config.levels {
            arrays.extend((first..first + level.len()).filter(|&i| holds(i)).map(|i| i as u8));
            level_ends.push(arrays.len());
            first += level.len();
        }
        let l1_mask = (0..config.levels[0].len()).filter(|&i| holds(i)).fold(0u8, |m, i| m | 1 << i);
        Plan { arrays, level_ends, l1_mask }
    }
}

impl Tlb {
    pub fn new(config: TlbConfig) -> Result<Self> {
        config.validate()?;
        let arrays: Vec<Array> = config.levels.iter().flatten().cloned().map(Array::new).collect();
        let plans = PageSize::ALL.map(|p| Plan::new(&config, |i| arrays[i].sizes_mask & size_bit(p) != 0));
        let walker = Walker::new(config.walk_cache_entries, config.host.as_ref());
        let mut level_arrays = Vec::new();
        for level in &config.levels {
            let start = level_arrays.last().map_or(0, |r: &std::ops::Range<usize>| r.end);
            level_arrays.push(start..start + level.len());
        }
        let split = level_arrays
            .iter()
            .map(|r| {
                arrays[r.clone()]
                    .iter()
                    .try_fold(0u8, |seen, a| (seen & a.sizes_mask == 0).then_some(seen | a.sizes_mask))
                    .is_some()
            })
            .collect();
        let (chains, chained) = Chains::new(&plans);
        let kernel = chained && arrays.iter().all(|a| a.kernel);
        let fixed = if kernel {
            fixed::fixed_loops(&chains.of, &arrays, plans.each_ref().map(|p| p.l1_mask), fixed::wide_isa())
        } else {
            [None; 4]
        };
        let stats = TlbStats {
            arrays: config.levels.iter().map(|l| vec![ArrayStats::default(); l.len()]).collect(),
            ..Default::default()
        };
        Ok(Tlb {
            counters: vec![ArrayStats::default(); arrays.len()],
            config,
            arrays,
            plans,
            level_arrays,
            split,
            walker,
            stats,
            rng: 0x9E37_79B9_7F4A_7C15,
            last: None,
            memo: None,
            kernel,
            fixed,
            chains,
            chained,
        })
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
        self.counters.iter_mut().for_each(|c| *c = ArrayStats::default());
        let mut arrays = std::mem::take(&mut self.stats.arrays);
        arrays.iter_mut().flatten().for_each(|a| *a = ArrayStats::default());
        self.stats = TlbStats { arrays, ..Default::default() };
    }

    /// Copies the per-array counters into `stats`.
    fn publish(&mut self) {
        for (out, c) in self.stats.arrays.iter_mut().flatten().zip(&self.counters) {
            *out = *c;
        }
    }

    /// Simulates one access of the translation `t` of `va` (one page per entry).
    pub fn access(&mut self, va: u64, t: Translation) {
        let t = self.config.host.as_ref().map_or(t, |h| h.splinter(t));
        if let Some(access) = self.admit(va, t.page_size, t.depth, 1) {
            self.simulate(access);
        }
        self.publish();
    }

    /// Counts `n` L1 hits on the arrays of `mask` (accesses to the previous access's entry).
    #[inline]
    fn count_l1_hits(&mut self, mask: u8, n: u64) {
        let mut m = mask;
        while m != 0 {
            let c = &mut self.counters[m.trailing_zeros() as usize];
            c.lookups += n;
            c.hits += n;
            m &= m - 1;
        }
    }

    /// Counts one access whose entry covers `group` contiguous pages (a power of two): another
    /// access to the previous access's entry, held in L1, is counted as an L1 hit at once;
    /// anything else is returned to be simulated.
    #[inline]
    fn admit(&mut self, va: u64, page: PageSize, depth: u32, group: u32) -> Option<Access> {
        self.stats.accesses += 1;
        // The entry's unit: `group` pages; the tag packs the unit number, log2(group) and the size.
        let vpn = va >> (page.bytes().trailing_zeros() + group.trailing_zeros());
        let tag = (vpn << 6) | ((group.trailing_zeros() as u64) << 2) | page as u64;
        if let Some((last, mask)) = self.last {
            if last == tag {
                self.count_l1_hits(mask, 1);
                return None;
            }
        }
        let l1_mask = self.plans[page as usize].l1_mask;
        self.last = (l1_mask != 0).then_some((tag, l1_mask));
        Some(Access { tag, va, page, depth: depth as u8 })
    }

    /// Looks `tag` up in array `ai`, counting the lookup and a hit's cycles; returns whether it hit.
    #[inline(always)]
    fn probe(&mut self, ai: usize, tag: u64, vpn: u64) -> bool {
        let (a, c) = (&mut self.arrays[ai], &mut self.counters[ai]);
        c.lookups += 1;
        let hit = a.lookup(tag, vpn);
        if hit {
            c.hits += 1;
            self.stats.cycles = self.stats.cycles.saturating_add(a.hit_cycles);
        } else {
            c.misses += 1;
        }
        hit
    }

    /// Simulates `access` through every level, then the walk (the order of the reference model).
    fn simulate(&mut self, access: Access) {
        let Access { tag, page, .. } = access;
        let vpn = tag >> 6;
        let p = page as usize;
        let mut start = 0;
        for level in 0..self.plans[p].level_ends.len() {
            let end = self.plans[p].level_ends[level];
            let mut hit = false;
            for j in start..end {
                hit |= self.probe(self.plans[p].arrays[j] as usize, tag, vpn);
            }
            if hit {
                // Fill the closer levels (inclusive hierarchy).
                self.fill(page, start, tag);
                return;
            }
            start = end;
        }
        self.walk(access.va, u32::from(access.depth));
        self.fill(page, start, tag);
    }

    /// Fills `tag` into the first `n` arrays of `page`'s plan.
    #[inline]
    fn fill(&mut self, page: PageSize, n: usize, tag: u64) {
        for &ai in &self.plans[page as usize].arrays[..n] {
            let ai = ai as usize;
            if self.arrays[ai].fill(tag, tag >> 6, &mut self.rng) {
                self.counters[ai].evictions += 1;
            }
        }
    }

    /// A page walk of `depth` guest descriptor reads ([`walk`]).
    #[inline]
    fn walk(&mut self, va: u64, depth: u32) {
        self.walker.walk(&mut self.stats, self.config.walk_step_cycles, va, depth);
    }
}

impl Tlb {
    /// Runs `addresses` through the TLB, translating each through `translate` (the device's page
    /// table, which must not change during the call: every address of a page translates to that
    /// page); unmapped addresses count as faults. Each page is translated once per call (a
    /// direct-mapped memo; a conflict asks again), and consecutive accesses to one page reuse its
    /// translation.
    ///
    /// The accesses that need simulating are collected in batches and run level by level (see
    /// [`batch`]): every array's state depends only on the accesses that reach its level, in
    /// order, so this gives exactly the result of simulating them one by one.
    pub fn run(&mut self, addresses: &[u64], translate: impl Fn(u64) -> Option<Translation>) {
        match self.config.host.clone() {
            Some(host) => self.run_native(addresses, |va| translate(va).map(|t| host.splinter(t))),
            None => self.run_native(addresses, translate),
        }
    }

    /// [`Tlb::run`] over translations as the TLB caches them.
    fn run_native(&mut self, addresses: &[u64], translate: impl Fn(u64) -> Option<Translation>) {
        let mut memo = self.memo.take().unwrap_or_else(|| Box::new(Memo::new()));
        memo.start_run();
        let mut pages =
            Pages { memo: &mut memo, groups: FxHashMap::default(), coalesce: self.config.coalesce, addresses };
        if self.kernel {
            self.run_kernel(addresses, &mut pages, &translate);
        } else {
            self.run_general(addresses, &mut pages, &translate);
        }
        self.memo = Some(memo);
        self.publish();
    }

    /// [`Tlb::run`] for any hierarchy: accesses that need simulating go along their chain
    /// (chained hierarchies) or into batches.
    fn run_general(
        &mut self,
        addresses: &[u64],
        pages: &mut Pages<'_>,
        translate: &impl Fn(u64) -> Option<Translation>,
    ) {
        let mut batch = Batch::default();
        // (page start, page end, page size, depth, pages its entry covers) of the last translation.
        let mut last: Option<(u64, u64, PageSize, u32, u32)> = None;
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
            let (page, depth, group) = match last {
                Some((lo, hi, page, depth, group)) if va >= lo && va < hi => (page, depth, group),
                _ => match pages.resolve(va, translate) {
                    Known::Page { page, depth, group } => {
                        let lo = va & !(page.bytes() - 1);
                        last = Some((lo, lo + page.bytes(), page, depth, group));
                        (page, depth, group)
                    }
                    Known::Fault | Known::Split => {
                        self.stats.faults += 1;
                        continue;
                    }
                },
            };
            if let Some(access) = self.admit(va, page, depth, group) {
                if self.chained {
                    self.simulate_chained(access.tag, va, page, depth);
                } else if batch.push(access) {
                    self.drain(&mut batch);
                }
            }
            // Later accesses to this page may take the fast path when it is held in L1.
            range = match (last, self.last) {
                (Some((lo, hi, ..)), Some(_)) => (lo, hi),
                _ => (1, 0),
            };
        }
        self.flush_streak(&mut streak);
        self.drain(&mut batch);
    }

    /// Counts `streak` fast-path L1 hits on the arrays holding the last entry.
    #[inline]
    fn flush_streak(&mut self, streak: &mut u64) {
        if *streak == 0 {
            return;
        }
        let mask = self.last.map_or(0, |(_, m)| m);
        self.stats.accesses += *streak;
        self.count_l1_hits(mask, *streak);
        *streak = 0;
    }

    /// The arrays of each level.
    fn levels(&self) -> impl Iterator<Item = &[Array]> {
        let mut rest = &self.arrays[..];
        self.config.levels.iter().map(move |l| {
            let (level, tail) = rest.split_at(l.len());
            rest = tail;
            level
        })
    }

    /// Bytes the valid entries of each level map right now (effective reach).
    pub fn effective_reach(&self) -> Vec<u64> {
        let sizes = PageSize::ALL;
        self.levels()
            .map(|l| {
                l.iter()
                    .flat_map(|a| a.tags())
                    .filter(|&tag| tag != EMPTY)
                    .map(|tag| sizes[(tag & 3) as usize].bytes() << ((tag >> 2) & 15))
                    .sum()
            })
            .collect()
    }

    /// The tag of every entry, per level and array in slot order (set by set, way by way; `u64::MAX`
    /// for an empty one), then of every walk cache (the host's nested TLB and walk caches after the
    /// guest's): the whole state two models must share.
    pub fn contents(&self) -> (Vec<Vec<Vec<u64>>>, Vec<Vec<u64>>) {
        let arrays = self.levels().map(|l| l.iter().map(|a| a.tags().collect()).collect()).collect();
        (arrays, self.walker.contents())
    }

    /// The largest footprint the entries of each level could map if every entry held a page of
    /// `page` size (nominal reach).
    pub fn nominal_reach(&self, page: PageSize) -> Vec<u64> {
        self.levels()
            .map(|l| {
                l.iter()
                    .filter(|a| a.sizes_mask & size_bit(page) != 0)
                    .map(|a| a.cfg.entries as u64 * page.bytes())
                    .sum()
            })
            .collect()
    }
}

/// What a run knows of pages: the memo of its translations and, with coalescing, how many pages
/// each entry covers.
struct Pages<'a> {
    memo: &'a mut Memo,
    /// Pages one coalesced entry covers, per (unit, page size), for this call.
    groups: FxHashMap<(u64, PageSize), u32>,
    coalesce: u32,
    /// The run's addresses (for the memo's choice of granule table).
    addresses: &'a [u64],
}

impl Pages<'_> {
    /// What `va`'s page is (`Known::Page` or `Known::Fault`): from the memo, or asked of
    /// `translate` once and remembered.
    #[inline(always)]
    fn resolve(&mut self, va: u64, translate: &impl Fn(u64) -> Option<Translation>) -> Known {
        match self.memo.get(va) {
            Some(known) => known,
            None => self.ask(va, translate),
        }
    }

    /// [`Pages::resolve`], packed ([`Known::pack`]): bits 0-5 are the low bits of the page's
    /// TLB tag, bits 6-7 the kind, 8-31 the depth; `DEEP` for a page whose depth does not fit.
    #[inline(always)]
    fn resolve_packed(&mut self, va: u64, translate: &impl Fn(u64) -> Option<Translation>) -> u32 {
        match self.memo.get_packed(va) {
            Some(bits) => bits,
            None => self.ask(va, translate).pack().unwrap_or(memo::DEEP),
        }
    }

    #[cold]
    #[inline(never)]
    fn ask(&mut self, va: u64, translate: &impl Fn(u64) -> Option<Translation>) -> Known {
        let k = self.coalesce;
        let known = match translate(va) {
            Some(t) => {
                let group = if k > 1 {
                    let unit = va / (t.page_size.bytes() * k as u64);
                    *self
                        .groups
                        .entry((unit, t.page_size))
                        .or_insert_with(|| if coalescible(va, t, k, translate) { k } else { 1 })
                } else {
                    1
                };
                Known::Page { page: t.page_size, depth: t.depth, group }
            }
            None => Known::Fault,
        };
        self.memo.put(va, known, self.addresses);
        known
    }
}

/// Whether the `k` pages of `t`'s size around `va` (aligned to `k` pages) are all mapped with
/// that size onto one physically contiguous, equally aligned run.
pub(crate) fn coalescible(va: u64, t: Translation, k: u32, translate: &impl Fn(u64) -> Option<Translation>) -> bool {
    let size = t.page_size.bytes();
    let span = size * k as u64;
    let base = va - va % span;
    let Some(first) = translate(base) else { return false };
    if first.page_size != t.page_size || first.pa % span != 0 {
        return false;
    }
    (1..k as u64)
        .all(|j| translate(base + j * size).is_some_and(|x| x.page_size == t.page_size && x.pa == first.pa + j * size))
}

#[cfg(test)]
mod tests;
