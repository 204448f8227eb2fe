//! A replay's unpublished blocks are invisible from outside: inside one `replay_chunk` call the
//! replay's fast paths keep the blocks they make out of the device's live table (its id table
//! holds them), and every return publishes them. So after every chunk — Ok or an error, with
//! out-of-memory allocations, blocks past 4 GiB, stream-ordered frees pending, the sanitizer
//! on, a trace recorded, driver faults, and calls from outside between chunks (frees of the
//! replay's blocks, queued work, accesses) — the device must look exactly as with every block
//! put in the live table at once (`Replay::publishing_at_once`, the reference).

use npumem_core::backend::FaultPlan;
use npumem_core::device::{Replay, ReplayEvents};
use npumem_core::sanitizer::SanitizerMode;
use npumem_core::units::{GIB, MIB};
use npumem_core::{AllocatorKind, Device, Policy};
use proptest::prelude::*;

mod common;
use common::family;

fn device(allocator: AllocatorKind, capacity: u64) -> Device {
    common::device(allocator, capacity, true)
}

/// Events over 40 ids (runs of allocs and of frees, any id: double allocs and frees of ids
/// not live included), each on one of two streams.
fn events() -> impl Strategy<Value = Vec<(u8, u64, u64, u64)>> {
    let size = prop_oneof![
        4 => Just(4096u64),
        2 => Just(6000),
        2 => Just(512 << 10),
        1 => Just(3 * MIB),
        1 => Just(5 * GIB),
        3 => 1u64..200_000,
    ];
    let event = (prop_oneof![3 => Just(1u8), 2 => Just(0u8)], 0u64..40, size, 0u64..2);
    proptest::collection::vec((event, 1usize..13), 0..60).prop_map(|runs| {
        // Runs of one kind, so that the batch paths run too.
        let mut evs = Vec::new();
        for ((kind, id, size, stream), len) in runs {
            for i in 0..len as u64 {
                evs.push((kind, (id + i * 7) % 40, size, stream));
            }
        }
        // A live id is not allocated again (bar id 39: that error path too).
        let mut live = std::collections::HashSet::new();
        for e in &mut evs {
            if e.0 == 1 && !live.insert(e.1) && e.1 != 39 {
                e.0 = 0;
            }
            if e.0 == 0 {
                live.remove(&e.1);
            }
        }
        evs
    })
}

/// What a caller may do between chunks.
#[derive(Clone, Copy, Debug)]
enum Between {
    Nothing,
    /// Frees the `n`th live allocation (the replay's: its later free fails).
    FreeOne(usize),
    /// Queues work on the second stream (later frees there wait).
    Launch,
    /// Writes the `n`th live allocation (sanitizer records, when on).
    Touch(usize),
    /// Queues a write of the `n`th live allocation behind work on the second stream.
    TouchLater(usize),
    /// Makes the `n`th unmap (or physical allocation, with a driver error) fail from now:
    /// driver errors inside the next chunks.
    Fault(u64, bool),
}

fn between() -> impl Strategy<Value = Between> {
    prop_oneof![
        4 => Just(Between::Nothing),
        2 => (0usize..8).prop_map(Between::FreeOne),
        1 => Just(Between::Launch),
        1 => (0usize..8).prop_map(Between::Touch),
        1 => (0usize..8).prop_map(Between::TouchLater),
        2 => (1u64..4, any::<bool>()).prop_map(|(n, alloc)| Between::Fault(n, alloc)),
    ]
}

/// What a device shows from outside (the trace without its wall-clock times).
fn observe(d: &mut Device) -> String {
    let history: Vec<_> = d.history().iter().map(|e| (e.action, e.addr, e.size, e.stream)).collect();
    format!(
        "{:?}\n{:?}\n{:?}\n{:?}\n{:?}\n{:?}\n{:?}",
        d.stats(),
        d.pool_stats(),
        d.allocations(),
        d.segments(),
        history,
        d.sanitizer_reports(),
        d.sanitizer_counts()
    )
}

fn act(d: &mut Device, what: Between, stream: u64) -> String {
    let live = d.allocations();
    let result = match what {
        Between::Nothing => Ok(()),
        Between::FreeOne(n) => live.get(n).map_or(Ok(()), |a| d.free(a.ptr)),
        Between::Launch => d.launch(stream, 20_000_000, &[], &[]).map(|_| ()),
        Between::Touch(n) => live.get(n).map_or(Ok(()), |a| d.memset(a.ptr, a.size, 1, a.size.min(64))),
        Between::TouchLater(n) => live.get(n).map_or(Ok(()), |a| {
            d.launch(stream, 5_000_000, &[], &[])?;
            d.memset_async(a.ptr, a.size, 2, a.size.min(64), stream).map(|_| ())
        }),
        Between::Fault(n, false) => d.inject_faults(FaultPlan { unmap: Some(n), ..Default::default() }),
        Between::Fault(n, true) => {
            d.inject_faults(FaultPlan { physical_alloc: Some(n), driver_error: true, ..Default::default() })
        }
    };
    format!("{result:?}")
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn the_held_blocks_are_published_before_anyone_looks(
        fam in family(),
        evs in events(),
        cuts in proptest::collection::vec((0usize..400, between()), 0..6),
        with_streams in any::<bool>(),
        small in any::<bool>(),
        stop_on_oom in any::<bool>(),
        sanitizer in prop_oneof![Just(SanitizerMode::Off), Just(SanitizerMode::Collect), Just(SanitizerMode::Raise)],
        history in any::<bool>(),
    ) {
        let capacity = if small { 48 * MIB } else { 8 * GIB };
        let (mut a, mut b) = (device(fam, capacity), device(fam, capacity));
        let streams: Vec<u64> = vec![0, a.scheduler().create_stream()];
        prop_assert_eq!(b.scheduler().create_stream(), streams[1]);
        for d in [&mut a, &mut b] {
            d.set_sanitizer(sanitizer);
            d.record_memory_history(history, 100_000);
        }
        let is_alloc: Vec<u8> = evs.iter().map(|e| e.0).collect();
        let ids: Vec<u64> = evs.iter().map(|e| e.1).collect();
        let sizes: Vec<u64> = evs.iter().map(|e| e.2).collect();
        let stream_of: Vec<u64> = evs.iter().map(|e| streams[e.3 as usize]).collect();
        let mut fast = Replay::new(40, evs.len() as u64, 0);
        let mut slow = Replay::new(40, evs.len() as u64, 0).publishing_at_once();
        let mut bounds: Vec<(usize, Between)> = cuts.into_iter().map(|(c, w)| (c.min(evs.len()), w)).collect();
        bounds.push((evs.len(), Between::Nothing));
        bounds.sort_by_key(|b| b.0);
        let mut start = 0;
        for (end, what) in bounds {
            let r = start..end;
            start = end;
            let chunk = ReplayEvents {
                is_alloc: &is_alloc[r.clone()],
                ids: &ids[r.clone()],
                sizes: &sizes[r.clone()],
                streams: with_streams.then(|| &stream_of[r.clone()]),
            };
            let got = a.replay_chunk(&mut fast, chunk, Policy::HugeFirst, stop_on_oom);
            let want = b.replay_chunk(&mut slow, chunk, Policy::HugeFirst, stop_on_oom);
            prop_assert_eq!(format!("{got:?}"), format!("{want:?}"));
            prop_assert_eq!((fast.events(), fast.stopped()), (slow.events(), slow.stopped()));
            prop_assert_eq!(fast.outcome(), slow.outcome());
            prop_assert_eq!(observe(&mut a), observe(&mut b));
            prop_assert_eq!(act(&mut a, what, streams[1]), act(&mut b, what, streams[1]));
            prop_assert_eq!(observe(&mut a), observe(&mut b));
        }
        let (mut got, mut want) = (fast.finish(), slow.finish());
        got.leftover.sort_unstable();
        want.leftover.sort_unstable();
        prop_assert_eq!(&got, &want);
        // The leftover blocks are the device's like any other: they free from outside.
        prop_assert_eq!(format!("{:?}", a.free_many(&got.leftover)), format!("{:?}", b.free_many(&want.leftover)));
        prop_assert_eq!(observe(&mut a), observe(&mut b));
    }
}
