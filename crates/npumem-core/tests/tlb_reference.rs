//! The fast TLB model (`vm::Tlb`: hashed and set-indexed lookups, a translation memo, bulk
//! counting) against the model as first written (`vm::tlb::reference::ReferenceTlb`: linear
//! scans), over random hierarchies and random address streams through a real page table that
//! holds every page size, holes and physically contiguous runs (for coalescing), and changes
//! between runs. After every run the counters, every entry of every array and walk cache (slot by
//! slot) and the effective reach must be identical.

use npumem_core::units::{GIB, KIB, MIB};
use npumem_core::vm::tlb::reference::ReferenceTlb;
use npumem_core::vm::tlb::{ArrayConfig, HostConfig, Replacement};
use npumem_core::vm::{PageSize, PageTable, Tlb, TlbConfig, Translation};
use proptest::prelude::*;

const BASE: u64 = 0x1000_0000_0000;
/// Layout of the test page table: a 1 GiB page, then a GiB of 2 MiB pages, then 4 KiB pages, then
/// 64 KiB pages (with holes wherever the case leaves a page out).
const GIANT: u64 = BASE;
const HUGE: u64 = BASE + GIB;
const SMALL: u64 = BASE + 2 * GIB;
const MEDIUM: u64 = BASE + 2 * GIB + 64 * MIB;

const REPLACEMENTS: [Replacement; 4] =
    [Replacement::Lru, Replacement::Plru, Replacement::RoundRobin, Replacement::Random];

fn array_config() -> impl Strategy<Value = ArrayConfig> {
    // Ways up to 64 (past the 16 that are scanned: wide sets use the hash index; 3, 12 and 17
    // are not powers of two), 1 to 5 sets (3 and 5 are not powers of two), any subset of page
    // sizes, any replacement (pseudo-LRU only over a power of two).
    (0usize..10, 1usize..=5, 0u8..16, 0usize..4, 0u64..20).prop_map(|(w, sets, sizes, r, hit)| {
        let ways = [1, 2, 3, 4, 8, 12, 16, 17, 32, 64][w];
        let r = if REPLACEMENTS[r] == Replacement::Plru && !usize::is_power_of_two(ways) { 0 } else { r };
        let page_sizes: Vec<PageSize> =
            PageSize::ALL.iter().enumerate().filter(|(i, _)| sizes & (1 << i) != 0).map(|(_, &p)| p).collect();
        ArrayConfig::new("a", ways * sets, ways, &page_sizes, REPLACEMENTS[r], hit)
    })
}

fn tlb_config() -> impl Strategy<Value = TlbConfig> {
    (
        prop::collection::vec(prop::collection::vec(array_config(), 1..=3), 1..=3),
        // The last reaches past 64: both kinds of walk cache (scanned, indexed).
        [0usize..40, 0usize..40, 0usize..80],
        0u64..50,
        0u32..4,
    )
        .prop_map(|(levels, walk_cache_entries, walk_step_cycles, c)| TlbConfig {
            name: "random".into(),
            levels,
            walk_cache_entries,
            walk_step_cycles,
            source: "proptest".into(),
            coalesce: 1 << c,
            source_kind: "guess".into(),
            host: None,
        })
}

/// Hierarchies `Tlb::run` simulates with its kernel: chained (each level one unified array, or
/// arrays splitting the page sizes between them) and every array narrow LRU over a power of two
/// of sets. Random hierarchies rarely are all of that.
fn kernel_config() -> impl Strategy<Value = TlbConfig> {
    let level = (0usize..7, 0u32..4, 0u8..16, 0u64..20, 0usize..7, 0u32..4).prop_map(|(w, s, split, hit, w2, s2)| {
        let ways = [1, 2, 3, 4, 8, 12, 16];
        let sizes = |mask: u8| -> Vec<PageSize> {
            PageSize::ALL.iter().enumerate().filter(|(i, _)| mask & (1 << i) != 0).map(|(_, &p)| p).collect()
        };
        let a = |w: usize, s: u32, mask: u8| {
            ArrayConfig::new("k", ways[w] << s, ways[w], &sizes(mask), Replacement::Lru, hit)
        };
        // `split` picks the sizes of the first array; the rest (if any) go to a second one.
        if split == 0 || split == 15 { vec![a(w, s, 15)] } else { vec![a(w, s, split), a(w2, s2, 15 & !split)] }
    });
    (prop::collection::vec(level, 1..=4), [0usize..40, 0usize..40, 0usize..40], 0u64..50, 0u32..4).prop_map(
        |(levels, walk_cache_entries, walk_step_cycles, c)| TlbConfig {
            name: "kernel".into(),
            levels,
            walk_cache_entries,
            walk_step_cycles,
            source: "proptest".into(),
            coalesce: 1 << c,
            source_kind: "guess".into(),
            host: None,
        },
    )
}

/// A host dimension (any host page, 4 or 5 levels, any nested-TLB and host walk-cache sizes).
fn host_config() -> impl Strategy<Value = HostConfig> {
    (0usize..3, 4u32..=5, 0usize..80, [0usize..40, 0usize..40, 0usize..80]).prop_map(
        |(p, levels, nested_tlb_entries, walk_cache_entries)| HostConfig {
            page_size: [PageSize::Size4K, PageSize::Size2M, PageSize::Size1G][p],
            levels,
            nested_tlb_entries,
            walk_cache_entries,
        },
    )
}

/// `configs`, a quarter of them as guests over a host (the rest native: the model without a host
/// is checked exactly as before).
fn with_host(configs: impl Strategy<Value = TlbConfig>) -> impl Strategy<Value = TlbConfig> {
    (configs, prop::option::weighted(0.25, host_config())).prop_map(|(mut c, host)| {
        c.host = host;
        c
    })
}

/// Which pages of each region are mapped, and whether small pages get contiguous frames.
#[derive(Clone, Debug)]
struct Layout {
    giant: bool,
    huge: Vec<bool>,
    small: Vec<bool>,
    medium: Vec<bool>,
    contiguous: bool,
}

fn layout() -> impl Strategy<Value = Layout> {
    (
        any::<bool>(),
        prop::collection::vec(prop::bool::weighted(0.8), 64),
        prop::collection::vec(prop::bool::weighted(0.8), 256),
        prop::collection::vec(prop::bool::weighted(0.8), 32),
        any::<bool>(),
    )
        .prop_map(|(giant, huge, small, medium, contiguous)| Layout { giant, huge, small, medium, contiguous })
}

fn map(pt: &mut PageTable, layout: &Layout) {
    if layout.giant {
        pt.map(GIANT, 4 * GIB, PageSize::Size1G).unwrap();
    }
    for (i, _) in layout.huge.iter().enumerate().filter(|(_, m)| **m) {
        pt.map(HUGE + i as u64 * 2 * MIB, 8 * GIB + i as u64 * 2 * MIB, PageSize::Size2M).unwrap();
    }
    for (i, _) in layout.small.iter().enumerate().filter(|(_, m)| **m) {
        // Contiguous frames in order, or scrambled (odd multiplier: a permutation).
        let frame = if layout.contiguous { i as u64 } else { (i as u64 * 37) % 256 };
        pt.map(SMALL + i as u64 * 4 * KIB, 16 * GIB + frame * 4 * KIB, PageSize::Size4K).unwrap();
    }
    for (i, _) in layout.medium.iter().enumerate().filter(|(_, m)| **m) {
        pt.map(MEDIUM + i as u64 * 64 * KIB, 20 * GIB + i as u64 * 64 * KIB, PageSize::Size64K).unwrap();
    }
}

/// One address: a region (0 giant, 1 huge, 2 small, 3 medium, 4 unmapped), a page in it, an
/// offset, and how often it repeats (streaks of one page take the bulk path).
fn address() -> impl Strategy<Value = (u8, u16, u32, u8)> {
    (0u8..5, any::<u16>(), any::<u32>(), prop_oneof![3 => Just(1u8), 1 => 2u8..20])
}

fn addresses(raw: &[(u8, u16, u32, u8)]) -> Vec<u64> {
    let mut out = Vec::new();
    for &(region, page, offset, repeat) in raw {
        let (base, pages, size) = match region {
            0 => (GIANT, 4, 256 * MIB), // four "pages" of 256 MiB: spread over the 1 GiB page
            1 => (HUGE, 64, 2 * MIB),
            2 => (SMALL, 256, 4 * KIB),
            3 => (MEDIUM, 32, 64 * KIB),
            _ => (BASE + 8 * GIB, 16, 4 * KIB),
        };
        let va = base + (u64::from(page) % pages) * size + u64::from(offset) % size;
        for r in 0..u64::from(repeat) {
            out.push(va + (r * 8) % size);
        }
    }
    out
}

fn same(fast: &Tlb, slow: &ReferenceTlb) -> Result<(), TestCaseError> {
    prop_assert_eq!(fast.stats(), slow.stats());
    prop_assert_eq!(fast.contents(), slow.contents());
    prop_assert_eq!(fast.effective_reach(), slow.effective_reach());
    Ok(())
}

/// Runs `runs` through both models (the page table changing after the first, resets where
/// `resets` says, then single accesses given directly), comparing everything after each step.
fn check_against_reference(
    config: TlbConfig,
    first: &Layout,
    second: &Layout,
    runs: &[Vec<(u8, u16, u32, u8)>],
    resets: &[bool],
    direct: &[(u16, usize)],
) -> Result<(), TestCaseError> {
    let mut fast = Tlb::new(config.clone()).unwrap();
    let mut slow = ReferenceTlb::new(config).unwrap();
    let mut pt = PageTable::new();
    map(&mut pt, first);
    for (i, raw) in runs.iter().enumerate() {
        if i == 1 {
            // The page table changes between runs: what a run remembered must not carry over.
            pt = PageTable::new();
            map(&mut pt, second);
        }
        let addrs = addresses(raw);
        fast.run(&addrs, |va| pt.translate(va));
        slow.run(&addrs, |va| pt.translate(va));
        same(&fast, &slow)?;
        if resets[i] {
            fast.reset_stats();
            slow.reset_stats();
            same(&fast, &slow)?;
        }
    }
    // Single accesses with a translation given directly.
    for &(page, size) in direct {
        let size = PageSize::ALL[size];
        let va = BASE + u64::from(page) * size.bytes();
        let t = Translation { pa: 0, page_size: size, depth: 4 - (size as u32).saturating_sub(1) };
        fast.access(va, t);
        slow.access(va, t);
    }
    same(&fast, &slow)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// Random hierarchies, and as often hierarchies the run kernel takes (chained, narrow LRU),
    /// which random ones rarely are; native, and as guests over a host.
    #[test]
    fn fast_model_is_bit_identical_to_the_reference(
        config in with_host(prop_oneof![tlb_config(), kernel_config()]),
        first in layout(),
        second in layout(),
        runs in prop::collection::vec(prop::collection::vec(address(), 0..400), 1..4),
        resets in prop::collection::vec(any::<bool>(), 4),
        direct in prop::collection::vec((any::<u16>(), 0usize..4), 0..8),
    ) {
        check_against_reference(config, &first, &second, &runs, &resets, &direct)?;
    }
}

/// A translation whose walk depth is too large for the run's memo to pack (no page table gives
/// one, a closure may) is simulated exactly all the same, on every path.
#[test]
fn deep_translations_match_the_reference() {
    let addrs: Vec<u64> = (0..3000u64).map(|i| BASE + (i * 7919 % 300) * 4 * KIB + i % 64).collect();
    // Every 23rd page unmapped (a page translates alike at every address).
    let deep = |va: u64| {
        (va / (4 * KIB) % 23 != 0).then_some(Translation { pa: va, page_size: PageSize::Size4K, depth: 1 << 30 })
    };
    for name in ["skylake", "zen4", "ascend_like"] {
        let config = TlbConfig::preset(name).unwrap();
        let mut fast = Tlb::new(config.clone()).unwrap();
        let mut slow = ReferenceTlb::new(config).unwrap();
        fast.run(&addrs, deep);
        slow.run(&addrs, deep);
        assert_eq!(fast.stats(), slow.stats(), "{name}");
        assert_eq!(fast.contents(), slow.contents(), "{name}");
    }
}

/// Every preset on long streams (streaming, strided, uniform random and a hot set) over 4 KiB
/// and 2 MiB pages, with far more pages than the memo's tables hold without conflicts.
#[test]
fn presets_match_the_reference_on_long_streams() {
    const SPAN: u64 = 256 * MIB;
    let mut small = PageTable::new();
    let mut huge = PageTable::new();
    for i in 0..SPAN / (4 * KIB) {
        small.map(BASE + i * 4 * KIB, ((i * 7919) % (SPAN / (4 * KIB))) * 4 * KIB, PageSize::Size4K).unwrap();
    }
    for i in 0..SPAN / (2 * MIB) {
        huge.map(BASE + i * 2 * MIB, i * 2 * MIB, PageSize::Size2M).unwrap();
    }
    let mut x = 7u64;
    let mut rand = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let n = 6_000u64;
    let streams: Vec<Vec<u64>> = vec![
        (0..n).map(|i| BASE + i * 64 % SPAN).collect(),
        (0..n).map(|i| BASE + i * 4160 % SPAN).collect(),
        (0..n).map(|_| BASE + rand() % SPAN).collect(),
        (0..n).map(|_| BASE + (rand() % 3000) * 4 * KIB + rand() % 4096).collect(),
    ];
    for &name in TlbConfig::PRESETS {
        for coalesce in [1, 16] {
            let mut config = TlbConfig::preset(name).unwrap();
            config.coalesce = coalesce;
            for pt in [&small, &huge] {
                let mut fast = Tlb::new(config.clone()).unwrap();
                let mut slow = ReferenceTlb::new(config.clone()).unwrap();
                for s in &streams {
                    fast.run(s, |va| pt.translate(va));
                    slow.run(s, |va| pt.translate(va));
                    assert_eq!(fast.stats(), slow.stats(), "{name}, coalesce {coalesce}");
                    assert_eq!(fast.contents(), slow.contents(), "{name}, coalesce {coalesce}");
                }
            }
        }
    }
}

/// Runs whose addresses span few granules take the memo's dense granule table: small pages with
/// holes, huge pages beside them, and a page table that changes between runs (the table must
/// forget), on every preset.
#[test]
fn dense_translation_table_matches_the_reference() {
    let tables: Vec<PageTable> = (0..2u64)
        .map(|t| {
            let mut pt = PageTable::new();
            for i in (0..2048u64).filter(|i| (i + t) % 7 != 0) {
                pt.map(SMALL + i * 4 * KIB, 16 * GIB + ((i * 37 + t) % 2048) * 4 * KIB, PageSize::Size4K).unwrap();
            }
            for i in 0..4u64 {
                pt.map(SMALL + 8 * MIB + i * 2 * MIB, 8 * GIB + i * 2 * MIB, PageSize::Size2M).unwrap();
            }
            pt
        })
        .collect();
    let mut x = 11u64;
    let streams: Vec<Vec<u64>> = (0..3)
        .map(|_| {
            (0..20_000)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    SMALL + x % (16 * MIB)
                })
                .collect()
        })
        .collect();
    for &name in TlbConfig::PRESETS {
        let config = TlbConfig::preset(name).unwrap();
        let mut fast = Tlb::new(config.clone()).unwrap();
        let mut slow = ReferenceTlb::new(config).unwrap();
        for (i, s) in streams.iter().enumerate() {
            let pt = &tables[i.min(1)];
            fast.run(s, |va| pt.translate(va));
            slow.run(s, |va| pt.translate(va));
            assert_eq!(fast.stats(), slow.stats(), "{name}, run {i}");
            assert_eq!(fast.contents(), slow.contents(), "{name}, run {i}");
        }
    }
}

/// Two-level hierarchies whose chains the run kernel's fixed loops take (an L1 of 4 or 8 ways,
/// an L2 of 4, 8, 12 or 16, narrow LRU over a power of two of sets), each level one unified
/// array or two splitting the page sizes.
fn fixed_config() -> impl Strategy<Value = TlbConfig> {
    let level = |ways: &'static [usize]| {
        (0..ways.len(), 0u32..5, 0u8..16, 0u64..20, 0..ways.len(), 0u32..5).prop_map(
            move |(w, s, split, hit, w2, s2)| {
                let sizes = |mask: u8| -> Vec<PageSize> {
                    PageSize::ALL.iter().enumerate().filter(|(i, _)| mask & (1 << i) != 0).map(|(_, &p)| p).collect()
                };
                let a = |w: usize, s: u32, mask: u8| {
                    ArrayConfig::new("f", ways[w] << s, ways[w], &sizes(mask), Replacement::Lru, hit)
                };
                if split == 0 || split == 15 { vec![a(w, s, 15)] } else { vec![a(w, s, split), a(w2, s2, 15 & !split)] }
            },
        )
    };
    (level(&[4, 8]), level(&[4, 8, 12, 16]), [0usize..40, 0usize..40, 0usize..40], 0u64..50, 0u32..3).prop_map(
        |(l1, l2, walk_cache_entries, walk_step_cycles, c)| TlbConfig {
            name: "fixed".into(),
            levels: vec![l1, l2],
            walk_cache_entries,
            walk_step_cycles,
            source: "proptest".into(),
            coalesce: 1 << c,
            source_kind: "guess".into(),
            host: None,
        },
    )
}

/// A stream mostly over one region (`home`: giant, huge, small or medium pages), each address
/// elsewhere (any region, unmapped included) with probability `foreign` percent: the fixed
/// loops take the home stretches and hand back at every other address.
fn home_stream() -> impl Strategy<Value = Vec<(u8, u16, u32, u8)>> {
    (0u8..4, prop_oneof![Just(0u32), Just(2u32), Just(20u32)], prop::collection::vec((address(), 0u32..100), 0..1500))
        .prop_map(|(home, foreign, raw)| {
            raw.into_iter()
                .map(|((region, page, offset, repeat), roll)| {
                    (if roll < foreign { region } else { home }, page, offset, repeat)
                })
                .collect()
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// The fixed loops (every shape they are compiled for, every page size, coalescing, holes,
    /// hand-backs at foreign addresses, a page table that changes between runs) against the
    /// reference.
    #[test]
    fn fixed_loops_are_bit_identical_to_the_reference(
        config in with_host(fixed_config()),
        first in layout(),
        second in layout(),
        runs in prop::collection::vec(home_stream(), 1..4),
        resets in prop::collection::vec(any::<bool>(), 4),
    ) {
        check_against_reference(config, &first, &second, &runs, &resets, &[])?;
    }
}
