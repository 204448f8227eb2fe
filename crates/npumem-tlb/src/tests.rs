use super::*;

fn array(name: &str, entries: usize, ways: usize, sizes: &[PageSize], r: Replacement, hit: u64) -> ArrayConfig {
    ArrayConfig::new(name, entries, ways, sizes, r, hit)
}

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
        source_kind: "guess".into(),
        host: None,
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
    assert_eq!(err.code, npumem_base::ErrorCode::InvalidParam);
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
        assert!(msg.contains("0.0.entries") && msg.contains(&n.to_string()) && msg.contains("1 to 1048576"), "{msg}");
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
fn presets_take_the_paths_their_shapes_allow() {
    for name in TlbConfig::PRESETS {
        let tlb = Tlb::new(TlbConfig::preset(name).unwrap()).unwrap();
        assert!(tlb.chained, "{name}: every preset has one array a level per page size");
        assert_eq!(tlb.kernel, ["skylake", "champsim_default"].contains(name), "{name}");
        // The kernel's presets have a fixed loop for every page size (4- and 12-way links).
        assert_eq!(tlb.fixed.iter().all(Option::is_some), tlb.kernel, "{name}");
    }
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

/// A one-entry TLB over `host` (guest walk caches `wc`), walking every access of `addrs`.
fn nested(host: Option<HostConfig>, wc: [usize; 3]) -> Tlb {
    let mut cfg = TlbConfig::preset("zen4").unwrap();
    cfg.levels = vec![vec![array("L1", 1, 1, &[], Replacement::Lru, 0)]];
    cfg.walk_cache_entries = wc;
    cfg.host = host;
    Tlb::new(cfg).unwrap()
}

fn bare_host(page: PageSize) -> HostConfig {
    HostConfig { page_size: page, levels: 4, nested_tlb_entries: 0, walk_cache_entries: [0, 0, 0] }
}

#[test]
fn nested_walks_read_n_m_plus_n_plus_m_with_caches_off() {
    // (guest page, guest depth, host page): 4K-4K 24, 2M-4K 19, 2M-2M 15, 1G-1G 8 (Gandhi et al.).
    let cases = [
        (PageSize::Size4K, 4, PageSize::Size4K, 24),
        (PageSize::Size2M, 3, PageSize::Size4K, 19),
        (PageSize::Size2M, 3, PageSize::Size2M, 15),
        (PageSize::Size1G, 2, PageSize::Size1G, 8),
    ];
    for (guest, depth, host, reads) in cases {
        let mut tlb = nested(Some(bare_host(host)), [0, 0, 0]);
        let addrs: Vec<u64> = (0..8u64).map(|i| i << 30).collect();
        tlb.run(&addrs, |_| Some(Translation { pa: 0, page_size: guest, depth }));
        let s = tlb.stats();
        assert_eq!(s.walks, 8);
        assert_eq!(s.reads_per_walk(), f64::from(reads), "{guest:?} over {host:?}");
        assert_eq!(s.nested_reads_per_walk(), f64::from(reads - depth), "{guest:?} over {host:?}");
        assert_eq!(s.cycles, 8 * reads as u64 * tlb.config().walk_step_cycles);
        assert_eq!(s.nested_walks, 8 * (depth as u64 + 1));
    }
}

#[test]
fn an_entry_maps_the_smaller_of_guest_and_host_page() {
    // A 2 MiB guest page over 4 KiB host pages: 512 entries, not one (splintering).
    let addrs: Vec<u64> = (0..512u64).map(|i| i * 4096).collect();
    let huge = |_| Some(Translation { pa: 0, page_size: PageSize::Size2M, depth: 3 });
    let mut tlb = Tlb::new(TlbConfig::preset("zen4_kvm").unwrap()).unwrap();
    tlb.run(&addrs, huge);
    assert_eq!(tlb.stats().walks, 512);
    assert_eq!(tlb.effective_reach()[0], 72 * 4096);
    let mut native = Tlb::new(TlbConfig::preset("zen4").unwrap()).unwrap();
    native.run(&addrs, huge);
    assert_eq!(native.stats().walks, 1);
    assert_eq!((native.stats().nested_walks, native.stats().nested_steps), (0, 0));
}

#[test]
fn published_walk_caches_give_published_reads_per_walk() {
    // A uniform-random stream over 1 GiB of 4 KiB pages on zen4, native and over 4 KiB host pages:
    // Park et al. (ASPLOS 2022) report about 1.5 reads a native walk and 4.4 a nested one; the
    // bounds are 1.2-2.0 and 3.5-5.5.
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    let addrs: Vec<u64> = (0..200_000)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (1 << 40) + x % (1 << 30)
        })
        .collect();
    let small = |va: u64| Some(Translation { pa: va, page_size: PageSize::Size4K, depth: 4 });
    let mut reads = Vec::new();
    for name in ["zen4", "zen4_kvm"] {
        let mut tlb = Tlb::new(TlbConfig::preset(name).unwrap()).unwrap();
        tlb.run(&addrs, small);
        reads.push(tlb.stats().reads_per_walk());
    }
    assert!((1.2..=2.0).contains(&reads[0]), "native {reads:?}");
    assert!((3.5..=5.5).contains(&reads[1]), "nested {reads:?}");
}

#[test]
fn host_fields_are_checked() {
    let mut cfg = TlbConfig::preset("zen4_kvm").unwrap();
    cfg.host.as_mut().unwrap().levels = 3;
    let msg = Tlb::new(cfg.clone()).unwrap_err().to_string();
    assert!(msg.contains("host.levels = 3") && msg.contains("4 to 5"), "{msg}");
    cfg.host = Some(HostConfig { page_size: PageSize::Size64K, ..bare_host(PageSize::Size4K) });
    assert!(Tlb::new(cfg.clone()).unwrap_err().to_string().contains("host.page_size = 65536"));
    cfg.host = Some(HostConfig { nested_tlb_entries: 5000, ..bare_host(PageSize::Size4K) });
    assert!(Tlb::new(cfg.clone()).unwrap_err().to_string().contains("host.nested_tlb_entries = 5000"));
    cfg.host = None;
    cfg.source_kind = "rumour".into();
    assert!(Tlb::new(cfg).unwrap_err().to_string().contains("source_kind \"rumour\""));
}

/// CPUID leaves of this project's machines (a Firecracker KVM guest on AMD Zen 4).
const ZEN4_GUEST: [(u32, [u32; 4]); 8] = [
    (0x0000_0000, [0x0000_001c, 0x6874_7541, 0x444d_4163, 0x6974_6e65]),
    (0x0000_0001, [0x00a1_0f11, 0x0002_0800, 0xfffa_3203, 0x178b_fbff]),
    (0x4000_0000, [0x4000_0001, 0x4b4d_564b, 0x564b_4d56, 0x0000_004d]),
    (0x8000_0000, [0x8000_0021, 0x6874_7541, 0x444d_4163, 0x6974_6e65]),
    (0x8000_0001, [0x00a1_0f11, 0x4000_0000, 0x0040_03f3, 0x2fd3_fbff]),
    (0x8000_0005, [0xff48_ff40, 0xff48_ff40, 0x2008_0140, 0x2008_0140]),
    (0x8000_0006, [0x5c00_2200, 0x6c00_4200, 0x0400_6140, 0x0a00_9140]),
    (0x8000_0019, [0, 0, 0, 0]),
];

fn recorded(leaf: u32, _sub: u32) -> raw_cpuid::CpuIdResult {
    let r = ZEN4_GUEST.iter().find(|(l, _)| *l == leaf).map_or([0; 4], |(_, r)| *r);
    raw_cpuid::CpuIdResult { eax: r[0], ebx: r[1], ecx: r[2], edx: r[3] }
}

#[test]
fn cpuid_of_the_zen4_guest_gives_the_published_zen4_geometry() {
    let cpuid = raw_cpuid::CpuId::with_cpuid_reader(recorded);
    let c = cpuid::from_reader(&cpuid, Some(PageSize::Size4K)).unwrap();
    assert_eq!(c.source_kind, "CPUID");
    assert!(c.source.contains("AuthenticAMD family 0x19 model 0x11"), "{}", c.source);
    let l1 = &c.levels[0];
    assert_eq!(l1.len(), 1, "4 KiB and 2 MiB share the 72-entry L1");
    assert_eq!((l1[0].entries, l1[0].ways), (72, 72));
    assert_eq!(l1[0].page_sizes, vec![PageSize::Size4K, PageSize::Size64K, PageSize::Size2M]);
    let l2 = &c.levels[1];
    assert_eq!((l2.len(), l2[0].entries, l2[0].ways), (1, 3072, 8));
    assert_eq!((l1[0].replacement, l2[0].replacement), (Replacement::Lru, Replacement::Plru));
    assert_eq!(c.host.as_ref().map(|h| h.page_size), Some(PageSize::Size4K));
    // Without a host page the guest is modelled native, and says so.
    let native = cpuid::from_reader(&cpuid, None).unwrap();
    assert!(native.host.is_none() && native.source.contains("modelled native"));
    Tlb::new(c).unwrap();
}
