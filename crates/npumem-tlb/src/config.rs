//! The configuration of a TLB hierarchy: levels of arrays, page-walk caches, cycle costs, the
//! presets (each citing where its geometry comes from) and the bounds every field is checked
//! against.
//!
//! Invariants: `TlbConfig::validate` accepts only configurations within [`limits`] (a hierarchy
//! within 64 MiB of host memory), with ways dividing entries and power-of-two pseudo-LRU ways
//! and coalescing, and a host page of 4 KiB, 2 MiB or 1 GiB over 4 or 5 host table levels;
//! nothing is allocated for a configuration before it passes. Every preset names the kind of
//! its source ([`SOURCE_KINDS`]).

use std::ops::RangeInclusive;

use npumem_base::error::{AclError, Result};
use npumem_base::{PageSize, Translation};

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
    /// Levels of a host page table for 4 KiB pages: 4 (x86-64, Arm 48-bit) or 5 (LA57, Arm LPA2).
    pub const HOST_LEVELS: RangeInclusive<u64> = 4..=5;
}

/// What a preset's figures rest on, from the firmest: the vendor's manual, the CPUID leaves of
/// the machine it runs on, a simulator's published configuration, a microbenchmark paper, a guess.
pub const SOURCE_KINDS: [&str; 5] = ["vendor manual", "CPUID", "simulator config", "microbenchmark paper", "guess"];

/// The host dimension of a nested (two-dimensional) translation: a guest's page tables and data
/// live at guest-physical addresses that the host's page table translates again (Bhargava et al.,
/// ASPLOS 2008).
#[derive(Clone, Debug, PartialEq)]
pub struct HostConfig {
    /// The host's leaf page: a TLB entry maps at most this much, whatever the guest mapped
    /// (splintering, Pham et al., MICRO 2015).
    pub page_size: PageSize,
    /// Host page-table levels for a 4 KiB page (4 or 5); a 2 MiB leaf ends one level higher,
    /// a 1 GiB leaf two.
    pub levels: u32,
    /// Entries of the nested TLB (guest-physical to host-physical, one host page an entry, fully
    /// associative LRU), asked before every host walk; 0 = none.
    pub nested_tlb_entries: usize,
    /// Host page-walk-cache entries for host table levels 0, 1, 2 (0 = none).
    pub walk_cache_entries: [usize; 3],
}

impl HostConfig {
    /// A host of `page_size` pages over 4 levels, with the nested TLB and walk caches of
    /// [`HostConfig::published`].
    pub fn with_page(page_size: PageSize) -> Self {
        let (nested_tlb_entries, walk_cache_entries) = Self::published();
        HostConfig { page_size, levels: 4, nested_tlb_entries, walk_cache_entries }
    }

    /// A 16-entry nested TLB and host walk caches as large as the `zen4` preset's guest ones (8,
    /// 16, 64): a guess after the nested MMU of Bhargava et al. (ASPLOS 2008); no vendor
    /// publishes these sizes.
    pub fn published() -> (usize, [usize; 3]) {
        (16, [8, 16, 64])
    }

    /// `t` as the TLB caches it: an entry maps the smaller of the guest's and the host's page
    /// (the physical address stays `va`'s, inside both).
    #[inline]
    pub fn splinter(&self, t: Translation) -> Translation {
        if t.page_size.bytes() > self.page_size.bytes() { Translation { page_size: self.page_size, ..t } } else { t }
    }

    /// Host table reads of one host walk: `levels` for a 4 KiB or 64 KiB leaf, one fewer per
    /// level a larger leaf ends above.
    pub fn depth(&self) -> u32 {
        match self.page_size {
            PageSize::Size4K | PageSize::Size64K => self.levels,
            PageSize::Size2M => self.levels - 1,
            PageSize::Size1G => self.levels - 2,
        }
    }
}

/// The accepted range of a configuration field, by the last part of its override key
/// (`entries`, `ways`, `hit_cycles`, `walk_step_cycles`, `walk_cache_entries`, `coalesce`, and
/// the host's `levels` and `nested_tlb_entries`).
pub fn field_range(field: &str) -> Option<RangeInclusive<u64>> {
    Some(match field {
        "entries" => limits::ENTRIES,
        "ways" => limits::WAYS,
        "hit_cycles" | "walk_step_cycles" => limits::CYCLES,
        "walk_cache_entries" | "nested_tlb_entries" => limits::WALK_CACHE_ENTRIES,
        "levels" => limits::HOST_LEVELS,
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
    /// What `source` is ([`SOURCE_KINDS`]).
    pub source_kind: String,
    /// The host dimension, for a guest of a virtual machine (none: native translation).
    pub host: Option<HostConfig>,
}

impl ArrayConfig {
    /// An array of `entries` in sets of `ways`, holding the page sizes `sizes` (all when empty).
    pub fn new(
        name: &str,
        entries: usize,
        ways: usize,
        sizes: &[PageSize],
        replacement: Replacement,
        hit_cycles: u64,
    ) -> Self {
        ArrayConfig { name: name.into(), entries, ways, page_sizes: sizes.to_vec(), replacement, hit_cycles }
    }
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
        "zen4_kvm",
    ];

    /// A preset geometry; its `source` names the public documents the figures come from.
    pub fn preset(name: &str) -> Result<Self> {
        use PageSize::*;
        use Replacement::*;
        let array = ArrayConfig::new;
        let c = |levels, walk_cache_entries, walk_step_cycles, source: &str, kind: &str| TlbConfig {
            name: name.to_string(),
            levels,
            walk_cache_entries,
            walk_step_cycles,
            source: source.to_string(),
            coalesce: 1,
            source_kind: kind.to_string(),
            host: None,
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
                "vendor manual",
            ),
            "zen4" => c(
                vec![vec![array("L1", 72, 72, &[], Lru, 0)], vec![array("L2", 3072, 12, &[], Lru, 7)]],
                [8, 16, 64],
                20,
                "AMD Zen 4: 72-entry fully associative L1, 3072-entry L2 (AMD Zen 4 Software Optimization Guide; CPUID 0x80000005/6 give the same entry counts, the L2 as 8-way); L2 latency a guess from Zen 2",
                "vendor manual",
            ),
            "zen5" => c(
                vec![vec![array("L1", 96, 96, &[], Lru, 0)], vec![array("L2", 4096, 16, &[], Lru, 7)]],
                [8, 16, 64],
                20,
                "AMD Zen 5: 96-entry L1, 4096-entry L2 (AMD Zen 5 Software Optimization Guide); L2 ways a guess",
                "vendor manual",
            ),
            "champsim_default" => c(
                vec![vec![array("DTLB", 64, 4, &[], Lru, 0)], vec![array("STLB", 1536, 12, &[], Lru, 8)]],
                [2, 4, 8],
                30,
                "ChampSim default configuration (DTLB 16x4, STLB 128x12, PSCL 2/4/8)",
                "simulator config",
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
                "simulator config",
            ),
            "mgpusim_mi300a" => c(
                vec![vec![array("L1 (per CU)", 256, 64, &[], Lru, 0)], vec![array("L2", 4096, 64, &[], Lru, 20)]],
                [0, 0, 0],
                25,
                "MGPUSim MI300A config: L1 4 sets x 64 ways, L2 64x64, walk 100 cycles (4 steps); L2 latency a guess",
                "simulator config",
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
                "simulator config",
            ),
            "maxwell_gpu" => c(
                vec![vec![array("L1 (2M)", 16, 16, &[], Lru, 0)], vec![array("L2", 64, 64, &[], Lru, 20)]],
                [0, 0, 0],
                100,
                "NVIDIA Maxwell per microbenchmarks: 16-entry L1, 65-entry L2 (64 here), 2 MiB pages; walk about 300 extra cycles (a guess)",
                "microbenchmark paper",
            ),
            "ascend_like" => c(
                vec![vec![array("uTLB", 32, 32, &[], Plru, 0)], vec![array("TBU/TCU TLB", 2048, 8, &[], Lru, 20)]],
                [256, 256, 256],
                150,
                "GUESS: Ascend publishes no TLB geometry; an Arm MMU-600-like SMMU (µTLB 32 FA PLRU, 2048x8 shared TLB, 256-entry walk caches)",
                "guess",
            ),
            "zen4_kvm" => {
                let mut guest = Self::preset("zen4")?;
                guest.name = name.to_string();
                guest.source = format!(
                    "{}; as a KVM guest over 4 KiB host pages (this project's Firecracker machines); nested TLB and host walk caches a guess after Bhargava et al. (ASPLOS 2008)",
                    guest.source
                );
                guest.host = Some(HostConfig::with_page(Size4K));
                guest
            }
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
        if !SOURCE_KINDS.contains(&self.source_kind.as_str()) {
            return Err(AclError::invalid_param(format!(
                "TLB source_kind {:?} is unknown; accepted: {}",
                self.source_kind,
                SOURCE_KINDS.join(", ")
            )));
        }
        if let Some(h) = &self.host {
            if h.page_size == PageSize::Size64K {
                return Err(AclError::invalid_param(
                    "TLB host.page_size = 65536 is not a host leaf: accepted 4096, 2097152 or 1073741824".to_string(),
                ));
            }
            check("host.levels", u64::from(h.levels), HOST_LEVELS)?;
            check("host.nested_tlb_entries", count(h.nested_tlb_entries), WALK_CACHE_ENTRIES)?;
            total += count(h.nested_tlb_entries);
            for (i, &n) in h.walk_cache_entries.iter().enumerate() {
                check(&format!("host.walk_cache_entries[{i}]"), count(n), WALK_CACHE_ENTRIES)?;
                total += count(n);
            }
            check("total entries (all arrays and walk caches)", total, TOTAL_ENTRIES)?;
        }
        Ok(())
    }
}
