//! `Tlb`: a translation lookaside buffer hierarchy that translates through the real `PageTable`.
//!
//! A hierarchy has levels (L1, L2, ...); each level holds one or more arrays — one unified array
//! for every page size, or arrays split by page size (as Intel's L1 DTLB). An array is
//! set-associative (`ways` per set; fully associative when `ways == entries`) with LRU,
//! tree-pseudo-LRU, round-robin or random replacement. A lookup that misses every level walks the
//! page table; page-walk caches per table level let a walk skip the upper steps. Entries are
//! tagged with (page size, virtual page number), so what the allocator mapped — 4 KiB, 64 KiB,
//! 2 MiB or 1 GiB pages — is exactly what the TLB caches.
//!
//! Every size and cycle count of a configuration is checked against the bounds in [`limits`]
//! before anything is allocated: they sit far above every real part, and keep a hierarchy within
//! 64 MiB of host memory and one lookup within a few thousand compares.
//!
//! Invariants: a set never holds two entries with the same tag nor more than `ways` entries;
//! fills are inclusive (a walk fills every level that holds the page size); per-array counters
//! satisfy hits + misses = lookups; the cycle counter saturates at `u64::MAX`, never wraps.

use std::ops::RangeInclusive;

use super::{PageSize, Translation};
use crate::error::{AclError, Result};

/// The accepted range of every size and cycle count of a [`TlbConfig`].
pub mod limits {
    use std::ops::RangeInclusive;

    /// Levels of the hierarchy: one more than any real part (gem5's GPU model has 3).
    pub const LEVELS: RangeInclusive<u64> = 1..=4;
    /// Arrays per level: the level-1 arrays holding a page are tracked in an 8-bit mask
    /// (Skylake's L1 has 3: 4 KiB, 2 MiB and 1 GiB).
    pub const ARRAYS_PER_LEVEL: RangeInclusive<u64> = 1..=8;
    /// Entries of one array: 128 times the largest preset (8,192), 16 MiB of host memory.
    pub const ENTRIES: RangeInclusive<u64> = 1..=1 << 20;
    /// Ways of one array (a lookup compares every way of a set): enough to make any preset array
    /// fully associative.
    pub const WAYS: RangeInclusive<u64> = 1..=8192;
    /// Ways of a tree-pseudo-LRU array: its tree bits live in one 64-bit word per set.
    pub const PLRU_WAYS: RangeInclusive<u64> = 1..=64;
    /// Entries of one page-walk cache (fully associative, searched in full on every walk): 16
    /// times the largest preset (256).
    pub const WALK_CACHE_ENTRIES: RangeInclusive<u64> = 0..=4096;
    /// Entries of the whole hierarchy, walk caches included: 64 MiB of host memory.
    pub const TOTAL_ENTRIES: RangeInclusive<u64> = 1..=1 << 22;
    /// Cycles of one hit or one walk step: a thousand times the slowest preset (gem5's 188-cycle
    /// walk step), low enough that no run of a realistic length saturates the cycle counter.
    pub const CYCLES: RangeInclusive<u64> = 0..=1_000_000;
    /// Pages one coalesced entry may cover (a power of two): a 2 MiB run of 4 KiB pages.
    pub const COALESCE: RangeInclusive<u64> = 1..=512;
}

/// The accepted range of a configuration field, by the last part of its override key
/// (`entries`, `ways`, `hit_cycles`, `walk_step_cycles`, `walk_cache_entries`, `coalesce`).
pub fn field_range(field: &str) -> Option<RangeInclusive<u64>> {
    Some(match field {
        "entries" => limits::ENTRIES,
        "ways" => limits::WAYS,
        "hit_cycles" | "walk_step_cycles" => limits::CYCLES,
        "walk_cache_entries" => limits::WALK_CACHE_ENTRIES,
        "coalesce" => limits::COALESCE,
        _ => return None,
    })
}

/// The error for `field = value` outside `range` (`why` adds a further condition): it names the
/// field, the value and the accepted range.
pub fn out_of_range(field: &str, value: impl std::fmt::Display, range: &RangeInclusive<u64>, why: &str) -> AclError {
    AclError::invalid_param(format!(
        "TLB {field} = {value} is out of range: accepted {} to {}{why}",
        range.start(),
        range.end()
    ))
}

/// Checks `value` of `field` against `range`.
fn check(field: &str, value: u64, range: RangeInclusive<u64>) -> Result<()> {
    if range.contains(&value) { Ok(()) } else { Err(out_of_range(field, value, &range, "")) }
}

/// Replacement policy of a TLB array.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Replacement {
    Lru,
    /// Tree pseudo-LRU (ways must be a power of two).
    Plru,
    RoundRobin,
    Random,
}

impl Replacement {
    pub fn parse(name: &str) -> Result<Self> {
        match name {
            "lru" => Ok(Replacement::Lru),
            "plru" => Ok(Replacement::Plru),
            "round_robin" | "rr" => Ok(Replacement::RoundRobin),
            "random" => Ok(Replacement::Random),
            other => Err(AclError::invalid_param(format!(
                "unknown replacement {other:?}; use \"lru\", \"plru\", \"round_robin\" or \"random\""
            ))),
        }
    }
}

/// One TLB array.
#[derive(Clone, Debug, PartialEq)]
pub struct ArrayConfig {
    pub name: String,
    pub entries: usize,
    /// Ways per set; `entries` for a fully associative array.
    pub ways: usize,
    /// Page sizes this array holds (all when empty).
    pub page_sizes: Vec<PageSize>,
    pub replacement: Replacement,
    /// Extra cycles a hit in this array costs (0 for L1).
    pub hit_cycles: u64,
}

/// A TLB hierarchy.
#[derive(Clone, Debug, PartialEq)]
pub struct TlbConfig {
    pub name: String,
    /// Levels from the closest; each level's arrays are probed together.
    pub levels: Vec<Vec<ArrayConfig>>,
    /// Page-walk-cache entries for table levels 0, 1, 2 (0 = none).
    pub walk_cache_entries: [usize; 3],
    /// Cycles of one page-walk step (one descriptor read that misses the walk caches).
    pub walk_step_cycles: u64,
    /// A label: where the geometry comes from, or that it is a guess.
    pub source: String,
    /// Pages one entry may cover when they are contiguous and aligned in both VA and PA
    /// (CoLT / Arm contiguous bit / AMD PTE coalescing; a power of two, 1 = off). With it the
    /// allocator's physical contiguity shows up as TLB reach.
    pub coalesce: u32,
}

fn array(
    name: &str,
    entries: usize,
    ways: usize,
    sizes: &[PageSize],
    replacement: Replacement,
    hit: u64,
) -> ArrayConfig {
    ArrayConfig { name: name.into(), entries, ways, page_sizes: sizes.to_vec(), replacement, hit_cycles: hit }
}

impl TlbConfig {
    pub const PRESETS: &'static [&'static str] = &[
        "skylake",
        "zen4",
        "zen5",
        "champsim_default",
        "gem5_gpu",
        "mgpusim_mi300a",
        "mosaic_gpu",
        "maxwell_gpu",
        "ascend_like",
    ];

    /// A preset geometry; its `source` names the public documents the figures come from.
    pub fn preset(name: &str) -> Result<Self> {
        use PageSize::*;
        use Replacement::*;
        let c = |levels, walk_cache_entries, walk_step_cycles, source: &str| TlbConfig {
            name: name.to_string(),
            levels,
            walk_cache_entries,
            walk_step_cycles,
            source: source.to_string(),
            coalesce: 1,
        };
        Ok(match name {
            "skylake" => c(
                vec![
                    vec![
                        array("L1 4K", 64, 4, &[Size4K, Size64K], Lru, 0),
                        array("L1 2M", 32, 4, &[Size2M], Lru, 0),
                        array("L1 1G", 4, 4, &[Size1G], Lru, 0),
                    ],
                    vec![
                        array("STLB", 1536, 12, &[Size4K, Size64K, Size2M], Lru, 9),
                        array("STLB 1G", 16, 4, &[Size1G], Lru, 9),
                    ],
                ],
                [2, 4, 32],
                20,
                "Intel Skylake: split L1 DTLB, 1536-entry 12-way STLB (Intel 64 and IA-32 Architectures Optimization Reference Manual)",
            ),
            "zen4" => c(
                vec![vec![array("L1", 72, 72, &[], Lru, 0)], vec![array("L2", 3072, 12, &[], Lru, 7)]],
                [8, 16, 64],
                20,
                "AMD Zen 4: 72-entry fully associative L1, 3072-entry L2 (AMD docs; L2 latency a guess from Zen 2)",
            ),
            "zen5" => c(
                vec![vec![array("L1", 96, 96, &[], Lru, 0)], vec![array("L2", 4096, 16, &[], Lru, 7)]],
                [8, 16, 64],
                20,
                "AMD Zen 5 (the development host): 96-entry L1, 4096-entry L2; L2 ways a guess",
            ),
            "champsim_default" => c(
                vec![vec![array("DTLB", 64, 4, &[], Lru, 0)], vec![array("STLB", 1536, 12, &[], Lru, 8)]],
                [2, 4, 8],
                30,
                "ChampSim default configuration (DTLB 16x4, STLB 128x12, PSCL 2/4/8)",
            ),
            "gem5_gpu" => c(
                vec![
                    vec![array("L1 (per CU)", 32, 32, &[], Lru, 0)],
                    vec![array("L2", 4096, 32, &[], Lru, 69)],
                    vec![array("L3", 8192, 32, &[], Lru, 150)],
                ],
                [0, 0, 0],
                188,
                "gem5 GPU (GCN3) defaults: L1 32 FA 1 cycle, L2 4096x32w 69 cycles, L3 8192x32w 150, walk 750 cycles over 4 steps",
            ),
            "mgpusim_mi300a" => c(
                vec![vec![array("L1 (per CU)", 256, 64, &[], Lru, 0)], vec![array("L2", 4096, 64, &[], Lru, 20)]],
                [0, 0, 0],
                25,
                "MGPUSim MI300A config: L1 4 sets x 64 ways, L2 64x64, walk 100 cycles (4 steps); L2 latency a guess",
            ),
            "mosaic_gpu" => c(
                vec![
                    vec![
                        array("L1 base (per SM)", 64, 64, &[Size4K, Size64K], Lru, 0),
                        array("L1 large", 16, 16, &[Size2M, Size1G], Lru, 0),
                    ],
                    vec![
                        array("L2 base", 1024, 16, &[Size4K, Size64K], Lru, 10),
                        array("L2 large", 256, 8, &[Size2M, Size1G], Lru, 10),
                    ],
                ],
                [64, 64, 64],
                100,
                "Mosaic (MICRO'17) GPU model: 64+16 L1, 1024x16w base + 256x8w large L2, 64-entry PWC; walk step a guess",
            ),
            "maxwell_gpu" => c(
                vec![vec![array("L1 (2M)", 16, 16, &[], Lru, 0)], vec![array("L2", 64, 64, &[], Lru, 20)]],
                [0, 0, 0],
                100,
                "NVIDIA Maxwell per microbenchmarks: 16-entry L1, 65-entry L2 (64 here), 2 MiB pages; walk about 300 extra cycles (a guess)",
            ),
            "ascend_like" => c(
                vec![vec![array("uTLB", 32, 32, &[], Plru, 0)], vec![array("TBU/TCU TLB", 2048, 8, &[], Lru, 20)]],
                [256, 256, 256],
                150,
                "GUESS: Ascend publishes no TLB geometry; an Arm MMU-600-like SMMU (µTLB 32 FA PLRU, 2048x8 shared TLB, 256-entry walk caches)",
            ),
            other => {
                return Err(AclError::invalid_param(format!(
                    "unknown TLB preset {other:?}; available: {}",
                    Self::PRESETS.join(", ")
                )));
            }
        })
    }

    /// Checks every size and cycle count against [`limits`], and the geometry (ways dividing
    /// entries, power-of-two pseudo-LRU ways and coalescing) — before anything is allocated.
    pub fn validate(&self) -> Result<()> {
        use limits::*;
        let count = |n: usize| n as u64;
        check("levels (number of levels)", count(self.levels.len()), LEVELS)?;
        let mut total = 0u64;
        for (l, level) in self.levels.iter().enumerate() {
            check(&format!("level {l} (number of arrays)"), count(level.len()), ARRAYS_PER_LEVEL)?;
            for (i, a) in level.iter().enumerate() {
                let key = |field: &str| format!("{l}.{i}.{field} (array {:?})", a.name);
                check(&key("entries"), count(a.entries), ENTRIES)?;
                check(&key("ways"), count(a.ways), WAYS)?;
                check(&key("hit_cycles"), a.hit_cycles, CYCLES)?;
                if a.entries % a.ways != 0 {
                    return Err(AclError::invalid_param(format!(
                        "TLB {}: entries ({}) must be a multiple of ways ({})",
                        key("ways"),
                        a.entries,
                        a.ways
                    )));
                }
                if a.replacement == Replacement::Plru
                    && (!a.ways.is_power_of_two() || !PLRU_WAYS.contains(&count(a.ways)))
                {
                    return Err(out_of_range(&key("ways"), a.ways, &PLRU_WAYS, " and a power of two for pseudo-LRU"));
                }
                total += count(a.entries);
            }
        }
        for (i, &n) in self.walk_cache_entries.iter().enumerate() {
            check(&format!("walk_cache_entries[{i}]"), count(n), WALK_CACHE_ENTRIES)?;
            total += count(n);
        }
        check("total entries (all arrays and walk caches)", total, TOTAL_ENTRIES)?;
        check("walk_step_cycles", self.walk_step_cycles, CYCLES)?;
        if !self.coalesce.is_power_of_two() || !COALESCE.contains(&u64::from(self.coalesce)) {
            return Err(out_of_range("coalesce", self.coalesce, &COALESCE, " and a power of two"));
        }
        Ok(())
    }
}

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
    /// Translation cycles: hit costs beyond L1 plus walk steps (saturating at `u64::MAX`).
    pub cycles: u64,
}

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

#[derive(Debug)]
pub struct Tlb {
    config: TlbConfig,
    levels: Vec<Vec<Array>>,
    walk_caches: Vec<WalkCache>,
    stats: TlbStats,
    now: u64,
    rng: u64,
    /// The tag of the previous access and the L1 arrays that hold it: another access to the
    /// same page is an L1 hit that changes no replacement state (it is already the most recent
    /// in its set), so it only counts.
    last: Option<(u64, u8)>,
}

impl Tlb {
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
        Ok(Tlb { config, levels, walk_caches, stats, now: 0, rng: 0x9E37_79B9_7F4A_7C15, last: None })
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
        self.stats.cycles = self.stats.cycles.saturating_add(steps * self.config.walk_step_cycles);
    }

    /// Runs `addresses` through the TLB, translating each through `translate` (the device's page
    /// table); unmapped addresses count as faults. Consecutive accesses to one page reuse its
    /// translation.
    pub fn run(&mut self, addresses: &[u64], translate: impl Fn(u64) -> Option<Translation>) {
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

    /// The largest footprint the entries of each level could map if every entry held a page of
    /// `page` size (nominal reach).
    pub fn nominal_reach(&self, page: PageSize) -> Vec<u64> {
        self.levels
            .iter()
            .map(|l| l.iter().filter(|a| a.holds(page)).map(|a| a.cfg.entries as u64 * page.bytes()).sum())
            .collect()
    }
}

/// Whether the `k` pages of `t`'s size around `va` (aligned to `k` pages) are all mapped with
/// that size onto one physically contiguous, equally aligned run.
fn coalescible(va: u64, t: Translation, k: u32, translate: &impl Fn(u64) -> Option<Translation>) -> bool {
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
mod tests {
    use super::*;

    fn t(page: PageSize) -> Translation {
        Translation { pa: 0, page_size: page, depth: if page == PageSize::Size2M { 3 } else { 4 } }
    }

    fn one_level(entries: usize, ways: usize, replacement: Replacement) -> Tlb {
        Tlb::new(TlbConfig {
            name: "test".into(),
            levels: vec![vec![array("L1", entries, ways, &[], replacement, 0)]],
            walk_cache_entries: [0, 0, 0],
            walk_step_cycles: 10,
            source: "test".into(),
            coalesce: 1,
        })
        .unwrap()
    }

    #[test]
    fn sequential_misses_once_per_page() {
        let mut tlb = one_level(64, 4, Replacement::Lru);
        let addrs: Vec<u64> = (0..(1u64 << 20)).step_by(64).map(|o| 0x1000_0000_0000 + o).collect();
        tlb.run(&addrs, |_| Some(t(PageSize::Size4K)));
        assert_eq!(tlb.stats().arrays[0][0].misses, 256);
        assert_eq!(tlb.stats().walks, 256);
        assert_eq!(tlb.stats().cycles, 256 * 4 * 10);
        let mut huge = one_level(64, 4, Replacement::Lru);
        huge.run(&addrs, |_| Some(t(PageSize::Size2M)));
        assert_eq!(huge.stats().arrays[0][0].misses, 1);
    }

    #[test]
    fn within_reach_never_misses_after_warm_up() {
        let mut tlb = one_level(64, 64, Replacement::Lru);
        let pages: Vec<u64> = (0..64u64).map(|p| p * 4096).collect();
        tlb.run(&pages, |_| Some(t(PageSize::Size4K)));
        tlb.reset_stats();
        let mut chase: Vec<u64> = (0..10_000u64).map(|i| (i * 37 % 64) * 4096 + 8).collect();
        chase.reverse();
        tlb.run(&chase, |_| Some(t(PageSize::Size4K)));
        assert_eq!(tlb.stats().arrays[0][0].misses, 0);
        // One page more than the reach, cycled: LRU misses every time.
        let mut over = one_level(64, 64, Replacement::Lru);
        let cyc: Vec<u64> = (0..650u64).map(|i| (i % 65) * 4096).collect();
        over.run(&cyc, |_| Some(t(PageSize::Size4K)));
        assert_eq!(over.stats().arrays[0][0].misses, 650);
    }

    #[test]
    fn lru_set_behaves_exactly() {
        // One set of 2 ways: A B A C → C evicts B (least recent); then B misses, A hits? A was
        // touched at step 3, C at 4, B refills evicting A.
        let mut tlb = one_level(2, 2, Replacement::Lru);
        let (a, b, c) = (0u64, 4096u64, 8192u64);
        tlb.run(&[a, b, a, c], |_| Some(t(PageSize::Size4K)));
        assert_eq!(tlb.stats().arrays[0][0].misses, 3);
        tlb.run(&[a], |_| Some(t(PageSize::Size4K)));
        assert_eq!(tlb.stats().arrays[0][0].misses, 3, "A survived");
        tlb.run(&[b], |_| Some(t(PageSize::Size4K)));
        assert_eq!(tlb.stats().arrays[0][0].misses, 4, "B had been evicted");
        assert_eq!(tlb.stats().arrays[0][0].evictions, 2);
    }

    #[test]
    fn plru_round_robin_random_and_split_arrays() {
        for r in [Replacement::Plru, Replacement::RoundRobin, Replacement::Random] {
            let mut tlb = one_level(8, 4, r);
            let addrs: Vec<u64> = (0..1000u64).map(|i| (i % 8) * 4096).collect();
            tlb.run(&addrs, |_| Some(t(PageSize::Size4K)));
            assert_eq!(tlb.stats().arrays[0][0].misses, 8, "{r:?}: 8 pages fit 8 entries");
        }
        let mut sky = Tlb::new(TlbConfig::preset("skylake").unwrap()).unwrap();
        sky.run(&[0, 2 << 20], |va| Some(t(if va == 0 { PageSize::Size4K } else { PageSize::Size2M })));
        let s = sky.stats();
        assert_eq!((s.arrays[0][0].lookups, s.arrays[0][1].lookups, s.arrays[0][2].lookups), (1, 1, 0));
        assert_eq!(sky.nominal_reach(PageSize::Size2M)[0], 32 * (2 << 20));
        assert!(TlbConfig::preset("nope").is_err());
        let mut bad = TlbConfig::preset("zen4").unwrap();
        bad.levels[0][0].ways = 7;
        assert!(Tlb::new(bad).is_err());
    }

    #[test]
    fn coalescing_multiplies_reach_only_for_contiguous_pages() {
        let mut cfg = TlbConfig::preset("zen4").unwrap();
        cfg.coalesce = 8;
        let base = 0x1000_0000_0000u64;
        let addrs: Vec<u64> = (0..64u64).map(|p| base + p * 4096).collect();
        // Contiguous frames: 64 pages in 8 entries.
        let mut tlb = Tlb::new(cfg.clone()).unwrap();
        tlb.run(&addrs, |va| Some(Translation { pa: va - base, page_size: PageSize::Size4K, depth: 4 }));
        assert_eq!(tlb.stats().walks, 8);
        assert_eq!(tlb.effective_reach()[0], 64 * 4096);
        // Scattered frames: every page its own entry.
        let mut scattered = Tlb::new(cfg).unwrap();
        scattered.run(&addrs, |va| {
            Some(Translation { pa: ((va - base) / 4096 * 7919 % 64) * 4096, page_size: PageSize::Size4K, depth: 4 })
        });
        assert_eq!(scattered.stats().walks, 64);
        let mut bad = TlbConfig::preset("zen4").unwrap();
        bad.coalesce = 3;
        assert!(Tlb::new(bad).is_err());
    }

    /// The message of the error `Tlb::new` gives for `cfg`, which must be refused as an
    /// invalid parameter.
    fn refusal(cfg: TlbConfig) -> String {
        let err = Tlb::new(cfg).unwrap_err();
        assert_eq!(err.code, crate::ErrorCode::InvalidParam);
        err.message
    }

    #[test]
    fn sizes_and_cycles_are_bounded_before_anything_is_allocated() {
        let zen4 = || TlbConfig::preset("zen4").unwrap();
        // Sizes that would ask for terabytes of host memory, or overflow the capacity.
        for n in [1usize << 40, 1 << 62, usize::MAX] {
            let mut cfg = zen4();
            cfg.walk_cache_entries = [n, 1, 1];
            let msg = refusal(cfg);
            assert!(msg.contains("walk_cache_entries[0]") && msg.contains(&n.to_string()), "{msg}");
            assert!(msg.contains("0 to 4096"), "{msg}");
            let mut cfg = zen4();
            cfg.levels[0][0].entries = n;
            cfg.levels[0][0].ways = 1;
            let msg = refusal(cfg);
            assert!(
                msg.contains("0.0.entries") && msg.contains(&n.to_string()) && msg.contains("1 to 1048576"),
                "{msg}"
            );
        }
        let mut cfg = zen4();
        cfg.walk_step_cycles = u64::MAX;
        assert!(refusal(cfg).contains("walk_step_cycles = 18446744073709551615"));
        let mut cfg = zen4();
        cfg.levels[1][0].hit_cycles = 1_000_001;
        assert!(refusal(cfg).contains("1.0.hit_cycles"));
        let mut cfg = zen4();
        cfg.levels[0][0] = array("huge FA", 16384, 16384, &[], Replacement::Lru, 0);
        assert!(refusal(cfg).contains("0.0.ways"));
        let mut cfg = zen4();
        cfg.levels[0][0] = array("wide PLRU", 128, 128, &[], Replacement::Plru, 0);
        assert!(refusal(cfg).contains("power of two for pseudo-LRU"));
        let mut cfg = zen4();
        cfg.levels[0] = (0..9).map(|_| array("x", 4, 4, &[], Replacement::Lru, 0)).collect();
        assert!(refusal(cfg).contains("level 0 (number of arrays) = 9"));
        let mut cfg = zen4();
        cfg.levels = (0..5).map(|_| vec![array("x", 4, 4, &[], Replacement::Lru, 0)]).collect();
        assert!(refusal(cfg).contains("levels (number of levels) = 5"));
        let mut cfg = zen4();
        cfg.levels = vec![vec![array("big", 1 << 20, 8, &[], Replacement::Lru, 0)]; 4];
        cfg.walk_cache_entries = [1, 1, 1];
        assert!(refusal(cfg).contains("total entries (all arrays and walk caches) = 4194307"));
        let mut cfg = zen4();
        cfg.coalesce = 1024;
        assert!(refusal(cfg).contains("coalesce = 1024"));
        // The largest accepted hierarchy builds.
        let mut cfg = zen4();
        cfg.levels = vec![vec![array("big", 1 << 20, 8192, &[], Replacement::Lru, 1_000_000)]; 4];
        cfg.levels[3][0].entries = (1 << 20) - 3 * 4096;
        cfg.levels[3][0].ways = 4096;
        cfg.walk_cache_entries = [4096; 3];
        cfg.walk_step_cycles = 1_000_000;
        Tlb::new(cfg).unwrap();
        for field in ["entries", "ways", "hit_cycles", "walk_step_cycles", "walk_cache_entries", "coalesce"] {
            assert!(field_range(field).is_some(), "{field}");
        }
        assert!(field_range("name").is_none());
    }

    #[test]
    fn the_cycle_counter_saturates_instead_of_wrapping() {
        let mut cfg = TlbConfig::preset("gem5_gpu").unwrap();
        cfg.walk_step_cycles = 1_000_000;
        let mut tlb = Tlb::new(cfg).unwrap();
        tlb.stats.cycles = u64::MAX - 5;
        tlb.run(&[0, 1 << 30, 2 << 30], |_| Some(t(PageSize::Size4K)));
        assert_eq!(tlb.stats().cycles, u64::MAX);
        assert_eq!(tlb.stats().walks, 3);
    }

    #[test]
    fn walk_caches_skip_upper_steps() {
        let mut cfg = TlbConfig::preset("champsim_default").unwrap();
        cfg.levels = vec![vec![array("L1", 1, 1, &[], Replacement::Lru, 0)]];
        let mut tlb = Tlb::new(cfg).unwrap();
        tlb.run(&[0, 4096, 8192], |_| Some(t(PageSize::Size4K)));
        let s = tlb.stats();
        assert_eq!(s.walks, 3);
        // The first walk reads 4 descriptors; the next two hit the level-2 walk cache.
        assert_eq!(s.walk_steps, 4 + 1 + 1);
        assert_eq!(s.walk_steps_skipped, 3 + 3);
    }
}
