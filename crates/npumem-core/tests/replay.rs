//! The replay engine against the plain calls: `Device::replay_chunk` (runs through the batch
//! paths, singles straight to the allocator, chunked, with streams and samples) leaves a device
//! exactly as the same events made one by one with `malloc_on` / `free_on` do, and reports the
//! same counts — on every allocator family, with queued work on a stream (deferred frees), and
//! on devices small enough to run out of memory.

use npumem_core::backend::SimConfig;
use npumem_core::device::{Replay, ReplayEvents};
use npumem_core::units::MIB;
use npumem_core::vm::PageSize;
use npumem_core::{AllocatorKind, Device, DeviceConfig, Policy};
use proptest::prelude::*;

mod common;
use common::family;

fn device(allocator: AllocatorKind, capacity: u64) -> Device {
    common::device(allocator, capacity, false)
}

/// The model: each event by itself, as a program would make it.
fn one_by_one(
    dev: &mut Device,
    events: &[(u8, u64, u64, u64)],
    streams: Option<&[u64]>,
    stop_on_oom: bool,
) -> (u64, u64, u64, Vec<u64>) {
    let mut live = std::collections::HashMap::new();
    let (mut allocs, mut ooms, mut bytes, mut peak) = (0, 0, 0u64, 0);
    for &(is_alloc, id, size, s) in events {
        let stream = streams.map(|ids| ids[s as usize]);
        if is_alloc != 0 {
            allocs += 1;
            match dev.malloc_on(size, Policy::HugeFirst, true, stream.unwrap_or(0)) {
                Ok(p) => {
                    live.insert(id, (p, size));
                    bytes += size;
                    peak = peak.max(bytes);
                }
                Err(e) => {
                    assert!(e.code.is_out_of_memory(), "{e}");
                    ooms += 1;
                    if stop_on_oom {
                        break;
                    }
                }
            }
        } else if let Some((p, size)) = live.remove(&id) {
            dev.free_on(p, stream).unwrap();
            bytes -= size;
        }
    }
    let mut left: Vec<u64> = live.values().map(|&(p, _)| p).collect();
    left.sort_unstable();
    (allocs, ooms, peak, left)
}

/// Events over 24 ids: allocs of a few repeating sizes (runs of them), frees of any id (live
/// or not), each on one of two streams.
fn events() -> impl Strategy<Value = Vec<(u8, u64, u64, u64)>> {
    let size = prop_oneof![Just(4096u64), Just(6000), Just(512 << 10), Just(3 * MIB), Just(40 * MIB), 1u64..200_000];
    proptest::collection::vec((0u8..2, 0u64..24, size, 0u64..2), 0..160).prop_map(|mut evs| {
        // A live id is not allocated again: turn such an alloc into its free.
        let mut live = std::collections::HashSet::new();
        for e in &mut evs {
            if e.0 == 1 && !live.insert(e.1) {
                e.0 = 0;
            }
            if e.0 == 0 {
                live.remove(&e.1);
            }
        }
        evs
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 160, ..ProptestConfig::default() })]

    #[test]
    fn replay_equals_the_calls_one_by_one(
        fam in family(),
        evs in events(),
        cuts in proptest::collection::vec(0usize..160, 0..4),
        with_streams in any::<bool>(),
        busy in any::<bool>(),
        small in any::<bool>(),
        stop_on_oom in any::<bool>(),
        sample_every in 0u64..7,
    ) {
        let capacity = if small { 48 * MIB } else { 1 << 32 };
        let (mut a, mut b) = (device(fam, capacity), device(fam, capacity));
        let streams: Vec<u64> = vec![0, a.scheduler().create_stream()];
        prop_assert_eq!(b.scheduler().create_stream(), streams[1]);
        if busy {
            // Queued work on the second stream: its frees wait (the slow paths).
            for d in [&mut a, &mut b] {
                d.launch(streams[1], 50_000_000, &[], &[]).unwrap();
            }
        }
        let want = one_by_one(&mut b, &evs, with_streams.then_some(&streams[..]), stop_on_oom);

        let is_alloc: Vec<u8> = evs.iter().map(|e| e.0).collect();
        let ids: Vec<u64> = evs.iter().map(|e| e.1).collect();
        let sizes: Vec<u64> = evs.iter().map(|e| e.2).collect();
        let stream_of: Vec<u64> = evs.iter().map(|e| streams[e.3 as usize]).collect();
        let mut replay = Replay::new(24, evs.len() as u64, sample_every);
        let mut bounds: Vec<usize> = cuts.into_iter().map(|c| c.min(evs.len())).collect();
        bounds.extend([0, evs.len()]);
        bounds.sort_unstable();
        for w in bounds.windows(2) {
            let r = w[0]..w[1];
            let chunk = ReplayEvents {
                is_alloc: &is_alloc[r.clone()],
                ids: &ids[r.clone()],
                sizes: &sizes[r.clone()],
                streams: with_streams.then(|| &stream_of[r.clone()]),
            };
            a.replay_chunk(&mut replay, chunk, Policy::HugeFirst, stop_on_oom).unwrap();
        }
        let samples = replay.samples().to_vec();
        let events_done = replay.events();
        let mut out = replay.finish();
        out.leftover.sort_unstable();
        prop_assert_eq!((out.allocs, out.ooms, out.peak_live, out.leftover), want);
        prop_assert_eq!(a.stats(), b.stats());
        prop_assert_eq!(a.pool_stats(), b.pool_stats());
        prop_assert_eq!(a.allocations(), b.allocations());
        prop_assert_eq!(a.segments(), b.segments());
        if !stop_on_oom {
            prop_assert_eq!(events_done, evs.len() as u64);
        }
        if let Some(want) = events_done.checked_div(sample_every) {
            prop_assert_eq!(samples.len() as u64, want);
            prop_assert!(samples.iter().all(|s| (s.event + 1) % sample_every == 0 && s.allocated <= s.reserved));
        }
    }
}

#[test]
fn a_replay_error_frees_what_it_allocated() {
    let mut d = device(AllocatorKind::Npumem, 1 << 30);
    let events = [(true, 1, 1000), (true, 2, 5000), (true, 1, 64)];
    let err = d.replay_events(&events, Policy::HugeFirst, false).unwrap_err();
    assert!(err.message.contains("event 2: id 1 allocated twice"), "{}", err.message);
    assert_eq!(d.stats().live_count, 0);
    // Runs of allocs catch an id repeated inside the run too.
    let events: Vec<(bool, u64, u64)> = (0..10).map(|i| (true, i % 9, 4096)).collect();
    let err = d.replay_events(&events, Policy::HugeFirst, false).unwrap_err();
    assert!(err.message.contains("event 9: id 0 allocated twice"), "{}", err.message);
    assert_eq!(d.stats().live_count, 0);
    // A size the runtime refuses stops the replay with its event.
    let events = [(true, 1, 1000), (true, 2, 1000), (true, 3, 1000), (true, 4, 1000), (true, 5, 0)];
    let err = d.replay_events(&events, Policy::HugeFirst, false).unwrap_err();
    assert!(err.message.starts_with("event 4:"), "{}", err.message);
    assert_eq!(d.stats().live_count, 0);
}

#[test]
fn sparse_and_dense_ids_replay_alike() {
    let ids = [7u64, 1 << 40, u64::MAX, 3];
    let events: Vec<(bool, u64, u64)> =
        ids.iter().map(|&i| (true, i, 4096)).chain(ids.iter().take(3).map(|&i| (false, i, 0))).collect();
    let mut d = device(AllocatorKind::PyTorch, 1 << 30);
    let out = d.replay_events(&events, Policy::HugeFirst, false).unwrap();
    assert_eq!((out.allocs, out.leftover.len()), (4, 1));
    d.free_many(&out.leftover).unwrap();
}

#[test]
fn a_driver_error_in_a_run_of_frees_names_its_event_and_frees_the_rest_after() {
    // A run of ten frees (long enough for the batch path) whose third (a block past the bypass
    // threshold) fails to unmap: the error names that event, the blocks after it in the run
    // are still the replay's (its error path frees them), and nothing stays live.
    let sim = SimConfig { capacity: 4 << 30, normal_page: PageSize::Size4K, giant_frames: 0 };
    let config = DeviceConfig { sim, allocator: AllocatorKind::Npumem, faults: true, ..Default::default() };
    let mut d = Device::new(config).unwrap();
    let sizes = [4096u64, 8192, 600 * MIB, 4096, 3 * MIB, 4096, 8192, 4096, 3 * MIB, 4096];
    let ids: Vec<u64> = (0..10).collect();
    let mut replay = Replay::new(10, 20, 0);
    let allocs = ReplayEvents { is_alloc: &[1; 10], ids: &ids, sizes: &sizes, streams: None };
    d.replay_chunk(&mut replay, allocs, Policy::HugeFirst, false).unwrap();
    assert_eq!(d.stats().live_count, 10);
    d.inject_faults(npumem_core::backend::FaultPlan { unmap: Some(1), ..Default::default() }).unwrap();
    let frees = ReplayEvents { is_alloc: &[0; 10], ids: &ids, sizes: &[0; 10], streams: None };
    let err = d.replay_chunk(&mut replay, frees, Policy::HugeFirst, false).unwrap_err();
    assert!(err.message.starts_with("event 12:"), "{}", err.message);
    assert_eq!(replay.events(), 13);
    assert!(replay.stopped());
    assert_eq!(d.stats().live_count, 0);
    assert_eq!(d.pool_stats().allocated_bytes.all.current, 0);
    assert_eq!(d.allocations().len(), 0);
}
