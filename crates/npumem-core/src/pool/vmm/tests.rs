use super::*;
use crate::acl::Policy;
use crate::backend::{SimBackend, SimConfig};
use crate::pool::held::Held;
use crate::units::GIB;
use proptest::prelude::*;

fn setup(capacity: u64, conf: &str) -> (VmmAllocator, SimBackend, Held) {
    let sim = SimBackend::new(SimConfig { capacity, ..Default::default() }).unwrap();
    (VmmAllocator::new(VmmConfig::parse(conf).unwrap(), capacity), sim, Held::default())
}

fn req(size: u64) -> Request {
    Request { size, booked: size, policy: Policy::HugeFirst }
}

#[test]
fn packs_small_blocks_and_reuses_pages_without_driver_calls() {
    let (mut a, mut sim, mut h) = setup(64 * MIB, "");
    let x = h.malloc(&mut a, &mut sim, &req(1000)).unwrap();
    let y = h.malloc(&mut a, &mut sim, &req(1000)).unwrap();
    assert_eq!(y.ptr, x.ptr + 1024);
    assert_eq!(a.reserved(), SMALL_PAGE);
    h.free(&mut a, &mut sim, x.ptr).unwrap();
    h.free(&mut a, &mut sim, y.ptr).unwrap();
    let maps = sim.counters().maps;
    // Far from the limit, a miss takes the free space on the mapped page: the waiting
    // blocks keep waiting for their size.
    let z = h.malloc(&mut a, &mut sim, &req(4000)).unwrap();
    assert_eq!(z.ptr, y.ptr + 1024);
    assert_eq!(sim.counters().maps, maps);
    h.free(&mut a, &mut sim, z.ptr).unwrap();
    a.empty_cache(&mut sim).unwrap();
    assert_eq!(a.reserved(), 0);
    assert_eq!(sim.mem_info(crate::acl::MemScope::All).0, 64 * MIB);
}

#[test]
fn freed_blocks_wait_for_their_size_and_a_miss_releases_them() {
    let (mut a, mut sim, mut h) = setup(64 * MIB, "");
    let x = h.malloc(&mut a, &mut sim, &req(4096)).unwrap();
    let y = h.malloc(&mut a, &mut sim, &req(4096)).unwrap();
    let stats = a.books.stats.clone();
    h.free(&mut a, &mut sim, x.ptr).unwrap();
    h.free(&mut a, &mut sim, y.ptr).unwrap();
    assert_eq!(a.recent.len(), 2);
    assert_eq!(a.books.stats.allocated_bytes.all.current, 0);
    // The same size comes back from the stack, most recent first, with exact statistics.
    let z = h.malloc(&mut a, &mut sim, &req(4000)).unwrap();
    assert_eq!((z.ptr, z.granted), (y.ptr, 4096));
    assert_eq!(a.books.stats.allocated_bytes.all.current, 4096);
    assert_eq!(a.books.stats.requested_bytes.all.current, 4000);
    h.free(&mut a, &mut sim, z.ptr).unwrap();
    let z = h.malloc(&mut a, &mut sim, &req(4096)).unwrap();
    h.free(&mut a, &mut sim, z.ptr).unwrap();
    assert_eq!(a.books.stats.allocation.all.allocated, stats.allocation.all.allocated + 2);
    // Another size misses. Far from the limit, it goes to free space on mapped pages and the
    // waiting blocks keep waiting.
    let w = h.malloc(&mut a, &mut sim, &req(8192)).unwrap();
    assert_eq!((w.ptr, a.recent.len()), (y.ptr + 4096, 2));
    h.free(&mut a, &mut sim, w.ptr).unwrap();
    // Under pressure (the pool holds more than half its limit) a miss releases every waiting
    // block first, and the best fit finds the three of them coalesced at the bottom.
    a.books.set_memory_fraction(0.001).unwrap();
    assert!(a.reserved() > a.limit() / CALM_DIVISOR);
    let w = h.malloc(&mut a, &mut sim, &req(16384)).unwrap();
    assert_eq!(w.ptr, x.ptr);
    assert!(a.recent.is_empty());
    h.free(&mut a, &mut sim, w.ptr).unwrap();
    a.empty_cache(&mut sim).unwrap();
    assert_eq!(a.reserved(), 0);
}

#[test]
fn large_blocks_go_where_they_need_the_fewest_pages() {
    // 2 MiB pages. Blocks at [0, 1.5), [4.5, 8.5) and [11.5, 13) MiB leave two 3 MiB holes:
    // [1.5, 4.5), holding all of page 1, and [8.5, 11.5), whose pages 4 and 5 both hold live
    // blocks. Best fit (lowest address among equals) would put 2.5 MiB in the first and use
    // page 1; page-economical placement puts it in the second, where it needs no page.
    let (mut a, mut sim, mut h) = setup(64 * MIB, "");
    let sizes = [3 * MIB / 2, 3 * MIB, 4 * MIB, 3 * MIB, 3 * MIB / 2];
    let g: Vec<Grant> = sizes.iter().map(|&s| h.malloc(&mut a, &mut sim, &req(s)).unwrap()).collect();
    let base = g[0].ptr;
    let offsets: Vec<u64> = g.iter().map(|x| (x.ptr - base) * 2 / MIB).collect();
    assert_eq!(offsets, [0, 3, 9, 17, 23], "laid out back to back (half MiB units)");
    h.free(&mut a, &mut sim, g[1].ptr).unwrap();
    h.free(&mut a, &mut sim, g[3].ptr).unwrap();
    let pages = a.books.stats.num_device_alloc;
    let x = h.malloc(&mut a, &mut sim, &req(5 * MIB / 2)).unwrap();
    assert_eq!(x.ptr, g[3].ptr, "the hole whose pages are held already");
    assert_eq!(a.books.stats.num_device_alloc, pages);
    let pool = a.pool(PoolKind::Large);
    let page1 = pool.pages_of(base + 2 * MIB, 1).start;
    assert!(pool.slot(page1).live == 0 && pool.slot(page1).handle != NO_HANDLE, "page 1 stays idle");
    for ptr in [g[0].ptr, g[2].ptr, g[4].ptr, x.ptr] {
        h.free(&mut a, &mut sim, ptr).unwrap();
    }
    a.empty_cache(&mut sim).unwrap();
    assert_eq!(a.reserved(), 0);
}

#[test]
fn a_block_no_placement_can_map_gets_a_normal_frame_tail() {
    // The seed-1 capacity case of `npumem stress` (tests/stress_cases): on 68 MiB the live
    // blocks at the peak (47 + 3.5 + 15.44 MiB and 64 KiB) fit only if 3.5 MiB shares a
    // page with 47 MiB and the last block takes no partly empty pool page. 5 MiB, as few
    // new pages at the hole's end (beside 47 MiB) as past 47 MiB's end, goes where it
    // strands fewer free bytes (past the end), leaving the hole's end to 3.5 MiB; 15.44 MiB,
    // for which the pool has no whole pages, goes past 47 MiB's end with its last page in
    // normal frames as far as it reaches, the rest of that page fenced off.
    let (mut a, mut sim, mut h) = setup(68 * MIB, "");
    let frames = sim.frame_stats().unwrap();
    let kib = |k: u64| k * 1024;
    let a0 = h.malloc(&mut a, &mut sim, &req(kib(13504))).unwrap();
    let a1 = h.malloc(&mut a, &mut sim, &req(kib(2496))).unwrap();
    let a2 = h.malloc(&mut a, &mut sim, &req(47 * MIB)).unwrap();
    let a3 = h.malloc(&mut a, &mut sim, &req(kib(64))).unwrap();
    h.free(&mut a, &mut sim, a0.ptr).unwrap();
    h.free(&mut a, &mut sim, a1.ptr).unwrap();
    let a4 = h.malloc(&mut a, &mut sim, &req(5 * MIB)).unwrap();
    assert_eq!(a4.ptr, a2.ptr + a2.granted);
    let a5 = h.malloc(&mut a, &mut sim, &req(kib(3584))).unwrap();
    assert_eq!(a5.ptr + a5.granted, a2.ptr);
    h.free(&mut a, &mut sim, a4.ptr).unwrap();
    let ooms = a.books.stats.num_ooms;
    let a6 = h.malloc(&mut a, &mut sim, &req(kib(15808))).unwrap();
    assert_eq!((a6.page, a.books.stats.num_ooms, a.bypass.len()), (PageSize::Size4K, ooms, 0));
    let end = a6.ptr + a6.granted;
    let pool = a.pool(PoolKind::Large);
    let last = pool.pages_of(end - 1, 1).start;
    let tail = pool.mapped_len(last);
    assert!(end - pool.page_va(last) <= tail && tail < LARGE_PAGE, "a tail of {tail} bytes");
    assert_eq!(sim.translate(end - 1).unwrap().page_size, PageSize::Size4K);
    // The rest of the tail's page is fenced: no block goes there while the tail is mapped.
    assert!(pool.space.free_extents_in(pool.page_va(last) + tail, pool.page_va(last + 1)).is_empty());
    sim.write(end - 1, &[1]).unwrap();
    assert_eq!(a.reserved(), 68 * MIB - sim.mem_info(crate::acl::MemScope::All).0);
    for g in [a6, a2, a5, a3] {
        h.free(&mut a, &mut sim, g.ptr).unwrap();
    }
    a.empty_cache(&mut sim).unwrap();
    assert_eq!((a.reserved(), a.books.stats.allocated_bytes.all.current), (0, 0));
    assert_eq!(sim.frame_stats().unwrap(), frames);
}

#[test]
fn a_small_block_borrows_a_large_page_when_memory_runs_out() {
    // 4 MiB device: a 3 MiB block holds both 2 MiB pages; 512 KiB finds no frame for the
    // small pool's pages but fits in the free end of the second large page.
    let (mut a, mut sim, mut h) = setup(4 * MIB, "");
    let big = h.malloc(&mut a, &mut sim, &req(3 * MIB)).unwrap();
    let small = h.malloc(&mut a, &mut sim, &req(512 * 1024)).unwrap();
    assert_eq!((small.ptr, small.page), (big.ptr + 3 * MIB, PageSize::Size2M));
    assert_eq!(a.books.stats.allocated_bytes.large_pool().current, 3 * MIB + 512 * 1024);
    // NORMAL_ONLY promises normal pages: it may not borrow.
    let normal = Request { policy: Policy::NormalOnly, ..req(256 * 1024) };
    assert!(h.malloc(&mut a, &mut sim, &normal).unwrap_err().code.is_out_of_memory());
    h.free(&mut a, &mut sim, small.ptr).unwrap();
    h.free(&mut a, &mut sim, big.ptr).unwrap();
    a.empty_cache(&mut sim).unwrap();
    assert_eq!((a.reserved(), a.books.stats.allocated_bytes.all.current), (0, 0));
}

#[test]
fn stitches_idle_pages_into_a_large_block() {
    // 64 MiB device. Fill it with 2 MiB blocks, free every other one: 32 MiB is free but in
    // 2 MiB holes. A 30 MiB request still succeeds by remapping the idle pages.
    let (mut a, mut sim, mut h) = setup(64 * MIB, "");
    let blocks: Vec<Grant> = (0..30).map(|_| h.malloc(&mut a, &mut sim, &req(2 * MIB)).unwrap()).collect();
    for g in blocks.iter().step_by(2) {
        h.free(&mut a, &mut sim, g.ptr).unwrap();
    }
    let big = h.malloc(&mut a, &mut sim, &req(30 * MIB)).unwrap();
    assert_eq!(big.granted, 30 * MIB);
    assert!(a.reserved() <= 64 * MIB);
    // The bytes of the live blocks are untouched and the new block is writable end to end.
    sim.write(big.ptr + 30 * MIB - 8, &[7; 8]).unwrap();
    let f = a.fragmentation(&h.live());
    assert_eq!(f.allocated, 15 * 2 * MIB + 30 * MIB);
    for g in blocks.iter().skip(1).step_by(2) {
        h.free(&mut a, &mut sim, g.ptr).unwrap();
    }
    h.free(&mut a, &mut sim, big.ptr).unwrap();
    a.empty_cache(&mut sim).unwrap();
    assert_eq!(sim.frame_stats().unwrap().largest_free_block, 64 * MIB);
}

#[test]
fn bypass_uses_giant_pages_and_oom_reports() {
    let mut sim = SimBackend::new(SimConfig { capacity: 4 * GIB, giant_frames: 1, ..Default::default() }).unwrap();
    let mut a = VmmAllocator::new(VmmConfig::default(), 4 * GIB);
    let mut h = Held::default();
    let g = h.malloc(&mut a, &mut sim, &req(GIB)).unwrap();
    assert_eq!(g.page, PageSize::Size1G);
    let k = h.malloc(&mut a, &mut sim, &req(600 * MIB)).unwrap();
    assert_eq!(k.page, PageSize::Size2M);
    let err = h.malloc(&mut a, &mut sim, &req(3 * GIB)).unwrap_err();
    assert!(err.message.contains("out of memory"), "{}", err.message);
    h.free(&mut a, &mut sim, g.ptr).unwrap();
    h.free(&mut a, &mut sim, k.ptr).unwrap();
    assert_eq!(a.reserved(), 0);
    assert!(VmmConfig::parse("large_threshold_mb:1").is_err());
    assert!(VmmConfig::parse("bogus:1").is_err());
    assert!(VmmConfig::parse("expandable_segments:True,per_process_memory_fraction:0.5").is_ok());
}

#[test]
fn pages_follow_the_malloc_policy() {
    let mut sim = SimBackend::new(SimConfig { capacity: 4 * GIB, giant_frames: 1, ..Default::default() }).unwrap();
    let mut a = VmmAllocator::new(VmmConfig::default(), 4 * GIB);
    let mut h = Held::default();
    let with = |size, policy| Request { size, booked: size, policy };
    // NORMAL_ONLY: normal pages even for a request that HUGE_FIRST would put on 2 MiB pages.
    let n = h.malloc(&mut a, &mut sim, &with(4 * MIB, Policy::NormalOnly)).unwrap();
    assert!(n.page < PageSize::Size2M, "{:?}", n.page);
    // HUGE_ONLY: 2 MiB pages even for a tiny request.
    let k = h.malloc(&mut a, &mut sim, &with(1000, Policy::HugeOnly)).unwrap();
    assert_eq!(k.page, PageSize::Size2M);
    // HUGE1G_ONLY: a giant page while one is free, then a clear out-of-memory error.
    let g = h.malloc(&mut a, &mut sim, &with(100 * MIB, Policy::Huge1gOnly)).unwrap();
    assert_eq!(g.page, PageSize::Size1G);
    let err = h.malloc(&mut a, &mut sim, &with(100 * MIB, Policy::Huge1gOnly)).unwrap_err();
    assert!(err.code.is_out_of_memory(), "{}", err.message);
    for ptr in [n.ptr, k.ptr, g.ptr] {
        h.free(&mut a, &mut sim, ptr).unwrap();
    }
    a.empty_cache(&mut sim).unwrap();
    assert_eq!(a.reserved(), 0);
}

#[test]
fn huge_only_never_takes_pages_of_normal_frames() {
    let (mut a, mut sim, mut h) = setup(64 * MIB, "");
    let with = |size, policy| Request { size, booked: size, policy };
    let huge_pages = |sim: &SimBackend, g: Grant| {
        (0..g.granted)
            .step_by(2 * MIB as usize)
            .all(|o| sim.translate(g.ptr + o).unwrap().page_size == PageSize::Size2M)
    };
    // Hold every frame, then free those of the first four 2 MiB regions but their first:
    // 4 MiB is free, none of it in 2 MiB frames.
    let frames: Vec<PhysHandle> =
        (0..64 * MIB / 4096).map(|_| sim.create_physical(4096, PageKind::Normal).unwrap()).collect();
    for (i, &h) in frames.iter().enumerate().take(4 * 512) {
        if i % 512 != 0 {
            sim.free_physical(h).unwrap();
        }
    }
    // HUGE_FIRST falls back to normal frames; HUGE_ONLY fails rather than take them.
    let live = h.malloc(&mut a, &mut sim, &with(3 * MIB, Policy::HugeFirst)).unwrap();
    assert!(live.page < PageSize::Size2M);
    let err = h.malloc(&mut a, &mut sim, &with(2 * MIB, Policy::HugeOnly)).unwrap_err();
    assert!(err.code.is_out_of_memory(), "{}", err.message);
    // 2 MiB frames come back: HUGE_ONLY is placed off the live block's pages of normal
    // frames (its 3 MiB leave 1 MiB free on its second page) and gets 2 MiB pages.
    for &h in &frames[4 * 512..] {
        sim.free_physical(h).unwrap();
    }
    let beside = h.malloc(&mut a, &mut sim, &with(8 * MIB, Policy::HugeOnly)).unwrap();
    assert_eq!(beside.page, PageSize::Size2M);
    assert!(huge_pages(&sim, beside));
    assert!(beside.ptr >= live.ptr + 4 * MIB);
    // Once freed, the fallback block's idle pages are replaced under a HUGE_ONLY block.
    h.free(&mut a, &mut sim, live.ptr).unwrap();
    let over = h.malloc(&mut a, &mut sim, &with(4 * MIB, Policy::HugeOnly)).unwrap();
    assert_eq!(over.ptr, live.ptr);
    assert!(huge_pages(&sim, over));
    sim.write(beside.ptr, &[1]).unwrap();
    for ptr in [beside.ptr, over.ptr] {
        h.free(&mut a, &mut sim, ptr).unwrap();
    }
    a.empty_cache(&mut sim).unwrap();
    assert_eq!(a.reserved(), 0);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    /// On a small device, where requests run out of memory and large ones take normal-frame
    /// tails: every page under a block keeps its policy's promise, blocks never overlap and
    /// keep their bytes, and the pool's statistics agree with the device's own count.
    #[test]
    fn tails_keep_policies_bytes_and_the_books(
        ops in proptest::collection::vec((0u8..4, 1u64..(9 << 20), any::<usize>()), 1..120),
    ) {
        let capacity = 24 * MIB;
        let (mut a, mut sim, mut h) = setup(capacity, "");
        let frames = sim.frame_stats().unwrap();
        let mut live: Vec<(Grant, Policy, u8)> = Vec::new();
        for (n, (op, size, pick)) in ops.into_iter().enumerate() {
            if op == 0 && !live.is_empty() {
                let (g, _, tag) = live.swap_remove(pick % live.len());
                for at in [g.ptr, g.ptr + g.granted - 1] {
                    let mut byte = [0u8];
                    sim.read(at, &mut byte).unwrap();
                    prop_assert_eq!(byte[0], tag);
                }
                h.free(&mut a, &mut sim, g.ptr).unwrap();
            } else {
                let policy = [Policy::HugeFirst, Policy::HugeFirst, Policy::HugeOnly, Policy::NormalOnly][pick % 4];
                let size = if pick % 3 == 0 { size >> 6 } else { size };
                let Ok(g) = h.malloc(&mut a, &mut sim, &Request { size, booked: size, policy }) else { continue };
                prop_assert!(g.granted >= size && g.ptr % 64 == 0);
                for (o, _, _) in &live {
                    prop_assert!(g.ptr + g.granted <= o.ptr || o.ptr + o.granted <= g.ptr);
                }
                let mut at = g.ptr;
                while at < g.ptr + g.granted {
                    let page = sim.translate(at).unwrap().page_size;
                    prop_assert!(crate::policy::honours(policy, page), "{:?} under {:?}", page, policy);
                    at = (at / 4096 + 1) * 4096;
                    if at < g.ptr + g.granted && page == PageSize::Size2M {
                        at = at.max(at.next_multiple_of(LARGE_PAGE));
                    }
                }
                let tag = n as u8;
                sim.write(g.ptr, &[tag]).unwrap();
                sim.write(g.ptr + g.granted - 1, &[tag]).unwrap();
                live.push((g, policy, tag));
            }
            a.check_invariants(&h.live());
            // The books against the device and the live blocks (an independent count).
            let used = capacity - sim.mem_info(crate::acl::MemScope::All).0;
            prop_assert_eq!(a.reserved(), used);
            prop_assert_eq!(a.books.stats.allocated_bytes.all.current, live.iter().map(|(g, _, _)| g.granted).sum::<u64>());
            let segs = a.segments(&h.live());
            prop_assert_eq!(a.books.stats.segment.all.current, segs.len() as u64);
            let cached: u64 = [PoolKind::Small, PoolKind::Large]
                .iter()
                .map(|&k| a.cache[k as usize].len() as u64 * a.page_of(k))
                .sum();
            prop_assert_eq!(segs.iter().map(|s| s.total_size).sum::<u64>(), used - cached);
        }
        for (g, _, _) in live { h.free(&mut a, &mut sim, g.ptr).unwrap(); }
        a.empty_cache(&mut sim).unwrap();
        prop_assert_eq!(a.reserved(), 0);
        prop_assert_eq!(a.books.stats.segment.all.current, 0);
        prop_assert_eq!(sim.frame_stats().unwrap(), frames);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    #[test]
    fn no_overlap_and_everything_returns(
        ops in proptest::collection::vec((any::<bool>(), 1u64..(12 << 20), any::<usize>()), 1..150),
    ) {
        let (mut a, mut sim, mut h) = setup(96 * MIB, "");
        let frames = sim.frame_stats().unwrap();
        let mut live: Vec<Grant> = Vec::new();
        for (alloc, size, pick) in ops {
            if alloc || live.is_empty() {
                let size = if pick % 3 == 0 { size >> 10 } else { size };
                if let Ok(g) = h.malloc(&mut a, &mut sim, &req(size.max(1))) {
                    for o in &live {
                        prop_assert!(g.ptr + g.granted <= o.ptr || o.ptr + o.granted <= g.ptr);
                    }
                    // Every byte of the block is mapped.
                    sim.write(g.ptr, &[1]).unwrap();
                    sim.write(g.ptr + g.granted - 1, &[1]).unwrap();
                    live.push(g);
                } else {
                    // Out of memory only when the live blocks really leave no room.
                    let used: u64 = live.iter().map(|g| g.granted.div_ceil(LARGE_PAGE) * LARGE_PAGE + LARGE_PAGE).sum();
                    prop_assert!(used + size.max(1) > 96 * MIB - 4 * LARGE_PAGE, "spurious OOM");
                }
            } else {
                let g = live.swap_remove(pick % live.len());
                h.free(&mut a, &mut sim, g.ptr).unwrap();
            }
            // Waiting freed blocks are reported exactly as the free memory they become.
            if pick % 5 == 0 {
                let (frag, segs, stats) = (a.fragmentation(&h.live()), a.segments(&h.live()), a.books.stats.clone());
                a.release_recent().unwrap();
                prop_assert!(a.recent.is_empty());
                prop_assert_eq!(frag, a.fragmentation(&h.live()));
                prop_assert_eq!(segs, a.segments(&h.live()));
                prop_assert_eq!(stats, a.books.stats.clone());
            }
            a.check_invariants(&h.live());
            let held: u64 = [PoolKind::Small, PoolKind::Large]
                .iter()
                .map(|&k| {
                    let mapped = a.pools[k as usize].as_ref().map_or(0, |p| p.mapped);
                    let gap = a.pools[k as usize].as_ref().map_or(0, |p| p.tail_gap);
                    (mapped + a.cache[k as usize].len() as u64) * a.page_of(k) - gap
                })
                .sum();
            prop_assert_eq!(a.reserved(), held + a.bypass.values().map(|b| b.segment.size).sum::<u64>());
            // A segment is a run of mapped pages (or a bypass mapping): the statistic, the
            // snapshot and the fragmentation report count the same ones.
            let segs = a.segments(&h.live());
            prop_assert_eq!(a.books.stats.segment.all.current, segs.len() as u64);
            prop_assert_eq!(a.fragmentation(&h.live()).segments.len(), segs.len());
        }
        for g in live { h.free(&mut a, &mut sim, g.ptr).unwrap(); }
        a.empty_cache(&mut sim).unwrap();
        prop_assert_eq!(a.reserved(), 0);
        prop_assert_eq!(a.books.stats.segment.all.current, 0);
        prop_assert_eq!(sim.frame_stats().unwrap(), frames);
    }
}
