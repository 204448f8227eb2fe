use super::*;
use crate::backend::{SimBackend, SimConfig};
use crate::pool::Family;
use crate::pool::held::Held;
use crate::units::{GIB, MIB};
use proptest::prelude::*;

fn setup(family: Family, conf: &str, capacity: u64) -> (CachingAllocator, SimBackend, Held) {
    let config = CachingConfig::parse(family, conf).unwrap();
    let sim = SimBackend::new(SimConfig { capacity, ..Default::default() }).unwrap();
    (CachingAllocator::new(config, capacity), sim, Held::default())
}

fn req(size: u64) -> Request {
    Request { size, booked: size, policy: Policy::HugeFirst }
}

#[test]
fn small_requests_share_a_2mib_segment_and_merge_back() {
    let (mut a, mut sim, mut h) = setup(Family::PyTorch, "", 256 * MIB);
    let x = h.malloc(&mut a, &mut sim, &req(1000)).unwrap();
    let y = h.malloc(&mut a, &mut sim, &req(3000)).unwrap();
    assert_eq!((x.granted, y.granted), (1024, 3072));
    assert_eq!(y.ptr, x.ptr + 1024);
    assert_eq!(a.books.stats.reserved_bytes.all.current, 2 * MIB);
    assert_eq!(a.books.stats.segment.small_pool().current, 1);
    a.check_invariants(&h.live());
    h.free(&mut a, &mut sim, x.ptr).unwrap();
    assert_eq!(a.books.stats.inactive_split.all.current, 2);
    h.free(&mut a, &mut sim, y.ptr).unwrap();
    a.check_invariants(&h.live());
    assert_eq!(a.free[0].len(), 1, "all three blocks merged");
    // Reuse without touching the device.
    let maps = sim.counters().maps;
    let z = h.malloc(&mut a, &mut sim, &req(500)).unwrap();
    assert_eq!(z.ptr, x.ptr);
    assert_eq!(sim.counters().maps, maps);
    h.free(&mut a, &mut sim, z.ptr).unwrap();
    a.empty_cache(&mut sim).unwrap();
    assert_eq!(a.books.stats.reserved_bytes.all.current, 0);
    assert_eq!(sim.counters().unmaps, 1);
}

#[test]
fn large_rules() {
    let (mut a, mut sim, mut h) = setup(Family::PyTorch, "", 512 * MIB);
    // 1-10 MiB requests carve a 20 MiB segment; the 17 MiB remainder is split off.
    let x = h.malloc(&mut a, &mut sim, &req(3 * MIB)).unwrap();
    assert_eq!(a.books.stats.reserved_bytes.all.current, 20 * MIB);
    assert_eq!(x.granted, 3 * MIB);
    // A request whose remainder would be <= 1 MiB is not split: internal waste.
    let y = h.malloc(&mut a, &mut sim, &req(16 * MIB + 512 * 1024)).unwrap();
    assert_eq!((y.ptr, y.granted), (x.ptr + 3 * MIB, 17 * MIB), "served whole from the 17 MiB remainder");
    // >= 10 MiB gets its own segment rounded to 2 MiB; again too little is left to split.
    let z = h.malloc(&mut a, &mut sim, &req(17 * MIB + 512)).unwrap();
    assert_eq!(z.granted, 18 * MIB);
    assert_eq!(a.books.stats.reserved_bytes.all.current, 38 * MIB);
    a.check_invariants(&h.live());
    let f = a.fragmentation(&h.live());
    assert_eq!(f.internal_waste(), (17 * MIB - (16 * MIB + 512 * 1024)) + (18 * MIB - (17 * MIB + 512)));
    assert_eq!(f.segments.len(), 2);
}

#[test]
fn torch_npu_pads_and_uses_giant_pages() {
    let (mut a, mut sim, mut h) = setup(Family::TorchNpu, "", 128 * MIB);
    let x = h.malloc(&mut a, &mut sim, &req(480)).unwrap();
    let y = h.malloc(&mut a, &mut sim, &req(481)).unwrap();
    assert_eq!((x.granted, y.granted), (512, 1024));
    let config = CachingConfig::parse(Family::TorchNpu, "page_size:1g").unwrap();
    let mut sim = SimBackend::new(SimConfig { capacity: 4 * GIB, giant_frames: 1, ..Default::default() }).unwrap();
    let mut a = CachingAllocator::new(config, 4 * GIB);
    let mut h = Held::default();
    let g = h.malloc(&mut a, &mut sim, &req(3 * MIB)).unwrap();
    assert_eq!(g.page, PageSize::Size1G);
    assert_eq!(a.books.stats.reserved_bytes.all.current, GIB);
    // No giant frame left: torch_npu falls back to HUGE_FIRST.
    let k = h.malloc(&mut a, &mut sim, &req(GIB)).unwrap();
    assert_eq!(k.page, PageSize::Size2M);
}

#[test]
fn release_ladder_frees_cached_segments_before_oom() {
    let (mut a, mut sim, mut h) = setup(Family::PyTorch, "", 64 * MIB);
    let x = h.malloc(&mut a, &mut sim, &req(40 * MIB)).unwrap();
    h.free(&mut a, &mut sim, x.ptr).unwrap();
    // 40 MiB are cached; 50 MiB does not fit beside it, so the ladder releases the cache.
    let y = h.malloc(&mut a, &mut sim, &req(50 * MIB)).unwrap();
    assert_eq!(a.books.stats.num_alloc_retries, 1);
    assert_eq!(a.books.stats.reserved_bytes.all.current, 50 * MIB);
    let err = h.malloc(&mut a, &mut sim, &req(30 * MIB)).unwrap_err();
    assert!(err.code.is_out_of_memory());
    assert!(err.message.contains("out of memory"), "{}", err.message);
    assert_eq!(a.books.stats.num_ooms, 1);
    h.free(&mut a, &mut sim, y.ptr).unwrap();
    a.check_invariants(&h.live());
}

#[test]
fn max_split_size_keeps_oversize_blocks_whole() {
    let (mut a, mut sim, mut h) = setup(Family::PyTorch, "max_split_size_mb:64", 512 * MIB);
    let x = h.malloc(&mut a, &mut sim, &req(100 * MIB)).unwrap();
    h.free(&mut a, &mut sim, x.ptr).unwrap();
    // A small large-pool request may not take the oversize block.
    let y = h.malloc(&mut a, &mut sim, &req(30 * MIB)).unwrap();
    assert_ne!(y.ptr, x.ptr);
    // An oversize request may take it if the waste is under max_non_split_rounding.
    let z = h.malloc(&mut a, &mut sim, &req(90 * MIB)).unwrap();
    assert_eq!((z.ptr, z.granted), (x.ptr, 100 * MIB));
    assert_eq!(a.books.stats.oversize_allocations.current, 1);
    a.check_invariants(&h.live());
}

#[test]
fn memory_fraction_limits_reservations() {
    let (mut a, mut sim, mut h) = setup(Family::PyTorch, "per_process_memory_fraction:0.5", 128 * MIB);
    assert!(h.malloc(&mut a, &mut sim, &req(60 * MIB)).is_ok());
    let err = h.malloc(&mut a, &mut sim, &req(10 * MIB)).unwrap_err();
    assert!(err.message.contains("limit"), "{}", err.message);
    a.books.set_memory_fraction(1.0).unwrap();
    assert!(h.malloc(&mut a, &mut sim, &req(10 * MIB)).is_ok());
    assert!(a.books.set_memory_fraction(1.5).is_err());
}

#[test]
fn trim_to_releases_oldest_whole_segments() {
    let (mut a, mut sim, mut h) = setup(Family::PyTorch, "", 256 * MIB);
    let x = h.malloc(&mut a, &mut sim, &req(12 * MIB)).unwrap();
    let y = h.malloc(&mut a, &mut sim, &req(14 * MIB)).unwrap();
    let z = h.malloc(&mut a, &mut sim, &req(16 * MIB)).unwrap();
    h.free(&mut a, &mut sim, y.ptr).unwrap();
    h.free(&mut a, &mut sim, x.ptr).unwrap();
    assert_eq!(a.books.stats.reserved_bytes.all.current, 42 * MIB);
    // y was freed first, so it is the coldest and goes first.
    assert_eq!(a.trim_to(&mut sim, 30 * MIB).unwrap(), 28 * MIB);
    assert!(a.by_ptr.contains_key(&x.ptr) && !a.by_ptr.contains_key(&y.ptr));
    assert_eq!(a.trim_to(&mut sim, 0).unwrap(), 16 * MIB, "live segments stay");
    h.free(&mut a, &mut sim, z.ptr).unwrap();
    a.check_invariants(&h.live());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn blocks_never_overlap_and_stats_recount(
        ops in proptest::collection::vec((any::<bool>(), 1u64..(24 << 20), any::<usize>()), 1..120),
        conf in prop_oneof![Just(""), Just("max_split_size_mb:32"), Just("roundup_power2_divisions:4"),
                            Just("garbage_collection_threshold:0.5,per_process_memory_fraction:0.8")],
    ) {
        let (mut a, mut sim, mut h) = setup(Family::TorchNpu, conf, 256 * MIB);
        let frames = sim.frame_stats().unwrap();
        let mut live: Vec<Grant> = Vec::new();
        for (alloc, size, pick) in ops {
            if alloc || live.is_empty() {
                let size = if pick % 3 == 0 { size >> 12 } else { size };
                if let Ok(g) = h.malloc(&mut a, &mut sim, &req(size.max(1))) {
                    for o in &live {
                        prop_assert!(g.ptr + g.granted <= o.ptr || o.ptr + o.granted <= g.ptr);
                    }
                    live.push(g);
                }
            } else {
                let g = live.swap_remove(pick % live.len());
                h.free(&mut a, &mut sim, g.ptr).unwrap();
            }
            a.check_invariants(&h.live());
        }
        for g in live { h.free(&mut a, &mut sim, g.ptr).unwrap(); }
        a.empty_cache(&mut sim).unwrap();
        a.check_invariants(&h.live());
        prop_assert_eq!(a.books.stats.reserved_bytes.all.current, 0);
        prop_assert_eq!(sim.frame_stats().unwrap(), frames);
    }
}
