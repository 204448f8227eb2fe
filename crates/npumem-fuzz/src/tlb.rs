//! The TLB configuration: `vm::tlb::TlbConfig` built from a preset with overrides (the fields
//! the Python API's `overrides` set: `walk_step_cycles`, `walk_cache_entries`, `coalesce`,
//! `"<level>.<array>.<field>"` for entries, ways, hit_cycles, replacement) or from scratch,
//! then `Tlb::new` and a short run over a page table.
//!
//! Checked: any field values give a TLB or an error — never a panic, and never an allocation
//! sized by an unchecked field (run the fuzz target with `-malloc_limit_mb`, so that one shows as
//! a finding); a TLB that is built runs addresses with consistent counters (per array
//! hits + misses = lookups; accesses + faults = addresses; walks ≤ accesses).

use arbitrary::{Arbitrary, Unstructured};
use npumem_core::units::MIB;
use npumem_core::vm::tlb::{ArrayConfig, Replacement};
use npumem_core::vm::{PageSize, PageTable, Tlb, TlbConfig};

const REPLACEMENTS: [Replacement; 4] =
    [Replacement::Lru, Replacement::Plru, Replacement::RoundRobin, Replacement::Random];
const BASE: u64 = 0x1000_0000_0000;

#[derive(Arbitrary, Debug)]
enum Field {
    Entries(u64),
    Ways(u64),
    HitCycles(u64),
    Replacement(u8),
}

#[derive(Arbitrary, Debug)]
enum Override {
    WalkStepCycles(u64),
    Coalesce(u32),
    WalkCacheEntries([u64; 3]),
    Array { level: u8, array: u8, field: Field },
}

#[derive(Arbitrary, Debug)]
struct InArray {
    entries: u64,
    ways: u64,
    page_sizes: Vec<u8>,
    replacement: u8,
    hit_cycles: u64,
}

#[derive(Arbitrary, Debug)]
enum Base {
    Preset(u8),
    Custom { levels: Vec<Vec<InArray>>, walk_cache_entries: [u64; 3], walk_step_cycles: u64, coalesce: u32 },
}

#[derive(Arbitrary, Debug)]
struct Input {
    base: Base,
    overrides: Vec<Override>,
    /// Pages to map: (page number, size).
    pages: Vec<(u16, u8)>,
    /// Accesses, as offsets from the base of the mapped area.
    accesses: Vec<u32>,
}

fn config(input: &Input) -> Option<TlbConfig> {
    let mut c = match &input.base {
        Base::Preset(i) => TlbConfig::preset(TlbConfig::PRESETS[usize::from(*i) % TlbConfig::PRESETS.len()]).ok()?,
        Base::Custom { levels, walk_cache_entries, walk_step_cycles, coalesce } => TlbConfig {
            name: "fuzz".into(),
            levels: levels
                .iter()
                .take(4)
                .map(|l| {
                    l.iter()
                        .take(12)
                        .map(|a| ArrayConfig {
                            name: "a".into(),
                            entries: a.entries as usize,
                            ways: a.ways as usize,
                            page_sizes: a
                                .page_sizes
                                .iter()
                                .take(4)
                                .map(|&p| PageSize::ALL[usize::from(p) % 4])
                                .collect(),
                            replacement: REPLACEMENTS[usize::from(a.replacement) % 4],
                            hit_cycles: a.hit_cycles,
                        })
                        .collect()
                })
                .collect(),
            walk_cache_entries: walk_cache_entries.map(|n| n as usize),
            walk_step_cycles: *walk_step_cycles,
            source: "fuzz".into(),
            coalesce: *coalesce,
            source_kind: "guess".into(),
            host: None,
        },
    };
    for o in input.overrides.iter().take(8) {
        match o {
            Override::WalkStepCycles(n) => c.walk_step_cycles = *n,
            Override::Coalesce(n) => c.coalesce = *n,
            Override::WalkCacheEntries(e) => c.walk_cache_entries = e.map(|n| n as usize),
            Override::Array { level, array, field } => {
                let Some(a) = c.levels.get_mut(usize::from(*level)).and_then(|l| l.get_mut(usize::from(*array))) else {
                    continue;
                };
                match field {
                    Field::Entries(n) => a.entries = *n as usize,
                    Field::Ways(n) => a.ways = *n as usize,
                    Field::HitCycles(n) => a.hit_cycles = *n,
                    Field::Replacement(r) => a.replacement = REPLACEMENTS[usize::from(*r) % 4],
                }
            }
        }
    }
    Some(c)
}

pub fn run(data: &[u8]) {
    let Ok(input) = Input::arbitrary_take_rest(Unstructured::new(data)) else { return };
    let Some(config) = config(&input) else { return };
    let Ok(mut tlb) = Tlb::new(config) else { return };
    let mut pt = PageTable::new();
    for &(page, size) in input.pages.iter().take(64) {
        let size = PageSize::ALL[usize::from(size) % 3]; // 4 KiB, 64 KiB, 2 MiB: within 64 MiB
        let va = BASE + (u64::from(page) * size.bytes()) % (64 * MIB);
        let _ = pt.map(va, va - BASE, size);
    }
    let addresses: Vec<u64> = input.accesses.iter().take(4096).map(|&o| BASE + u64::from(o) % (64 * MIB)).collect();
    tlb.run(&addresses, |va| pt.translate(va));
    let s = tlb.stats();
    assert_eq!(s.accesses + s.faults, addresses.len() as u64, "{s:?}");
    assert!(s.walks <= s.accesses, "{s:?}");
    for (level, arrays) in s.arrays.iter().enumerate() {
        for (i, a) in arrays.iter().enumerate() {
            assert_eq!(a.hits + a.misses, a.lookups, "array {i} of level {level}: {a:?}");
        }
    }
}
