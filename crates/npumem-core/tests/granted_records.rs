//! One record per live block: the device's live table is the one record of each block live in
//! its pool, and every free and snapshot hands the pool the `Granted` it holds. A device over a
//! plain pool (npumem's, PyTorch's) must behave exactly as the same device over that pool behind
//! a record of its own of every block it granted (`OwnRecords`, the reference: it checks what the device
//! hands back against its record, then passes the pool its record instead). Random programs of
//! mallocs and frees, batches, stream-ordered frees (some revived by a malloc of another size),
//! queued work, recorded streams, synchronisation, `empty_cache`, replays (in chunks, on
//! streams) and driver failures run on both; after every step the results, the pool's and the
//! device's statistics, the segments and the fragmentation report must be identical. A free
//! path that handed the pool a wrong `granted` (or `requested`), or a snapshot that left the
//! pending frees out, shows up as a difference.

use std::collections::BTreeMap;

use npumem_core::backend::{Backend, FaultPlan, FaultyBackend, SimBackend, SimConfig};
use npumem_core::device::{Replay, ReplayEvents};
use npumem_core::pool::{
    Allocator, Books, CachingAllocator, CachingConfig, Family, Fragmentation, Grant, Granted, Request, SegmentSnapshot,
    VmmAllocator, VmmConfig,
};
use npumem_core::stream::StreamId;
use npumem_core::units::MIB;
use npumem_core::vm::PageSize;
use npumem_core::{Device, Policy};

type AclResult<T> = npumem_core::Result<T>;
use proptest::prelude::*;

const CAPACITY: u64 = 48 * MIB;

/// The reference: a pool behind its own record of every block it granted and has not freed.
struct OwnRecords {
    pool: Box<dyn Allocator>,
    live: BTreeMap<u64, Granted>,
}

impl OwnRecords {
    /// The record of the live `block` the device hands back, which must be the same.
    fn own(&self, block: &Granted) -> Granted {
        let own = *self.live.get(&block.ptr).unwrap_or_else(|| panic!("{:#x} is not live in the pool", block.ptr));
        assert_eq!(*block, own, "the device hands back the block as granted");
        own
    }

    fn records(&self) -> Vec<Granted> {
        self.live.values().copied().collect()
    }
}

impl Allocator for OwnRecords {
    fn name(&self) -> &'static str {
        self.pool.name()
    }

    fn malloc(&mut self, backend: &mut dyn Backend, request: &Request) -> AclResult<Grant> {
        let grant = self.pool.malloc(backend, request)?;
        self.live.insert(grant.ptr, grant.held(request.size));
        Ok(grant)
    }

    fn malloc_cached(&mut self, sizes: &[u64], policy: Policy, out: &mut Vec<Grant>) -> usize {
        let start = out.len();
        let served = self.pool.malloc_cached(sizes, policy, out);
        for (grant, &size) in out[start..].iter().zip(sizes) {
            self.live.insert(grant.ptr, grant.held(size));
        }
        served
    }

    fn free(&mut self, backend: &mut dyn Backend, block: &Granted) -> AclResult<()> {
        let own = self.own(block);
        self.pool.free(backend, &own)?;
        self.live.remove(&own.ptr);
        Ok(())
    }

    fn free_cached(&mut self, blocks: &[Granted]) -> usize {
        let own: Vec<Granted> = blocks.iter().map(|b| self.own(b)).collect();
        let freed = self.pool.free_cached(&own);
        own[..freed].iter().for_each(|b| {
            self.live.remove(&b.ptr);
        });
        freed
    }

    fn empty_cache(&mut self, backend: &mut dyn Backend) -> AclResult<()> {
        self.pool.empty_cache(backend)
    }

    fn trim_to(&mut self, backend: &mut dyn Backend, bytes: u64) -> AclResult<u64> {
        self.pool.trim_to(backend, bytes)
    }

    fn books(&self) -> &Books {
        self.pool.books()
    }

    fn books_mut(&mut self) -> &mut Books {
        self.pool.books_mut()
    }

    fn segments(&self, live: &[Granted]) -> Vec<SegmentSnapshot> {
        assert_eq!(live, self.records(), "a snapshot is given every block live in the pool");
        self.pool.segments(&self.records())
    }

    /// The device's report passes its live blocks, an out-of-memory message none (its summary
    /// does not read them): the reference reads its own, and the reports are compared.
    fn fragmentation(&self, _live: &[Granted]) -> Fragmentation {
        self.pool.fragmentation(&self.records())
    }
}

/// A pool of `family`: the npumem pool (requests from 4 MiB bypass it) or PyTorch's.
fn pool(family: &str) -> Box<dyn Allocator> {
    match family {
        "npumem" => Box::new(VmmAllocator::new(VmmConfig::parse("large_threshold_mb:4").unwrap(), CAPACITY)),
        _ => Box::new(CachingAllocator::new(CachingConfig::parse(Family::PyTorch, "").unwrap(), CAPACITY)),
    }
}

/// A device over a pool of `family`, plain or behind its own records (the reference).
fn device(family: &str, reference: bool) -> Device {
    let sim = SimConfig { capacity: CAPACITY, normal_page: PageSize::Size4K, giant_frames: 0 };
    let backend = Box::new(FaultyBackend::new(Box::new(SimBackend::new(sim).unwrap())));
    let injector = backend.injector();
    let pool = pool(family);
    let pool: Box<dyn Allocator> = if reference { Box::new(OwnRecords { pool, live: BTreeMap::new() }) } else { pool };
    Device::with_parts(backend, pool).with_fault_injector(injector)
}

#[derive(Clone, Debug)]
enum Op {
    Malloc {
        size: u64,
        policy: usize,
        padded: bool,
        stream: usize,
    },
    Free(usize),
    FreeOn(usize, usize),
    MallocMany(Vec<u64>),
    FreeMany(Vec<usize>),
    Launch(usize, usize),
    RecordStream(usize, usize),
    SyncStream(usize),
    Sync,
    EmptyCache,
    Replay(Vec<(bool, u64, u64)>),
    /// A replay in two chunks, each event on one of the streams (its frees stream-ordered).
    ReplayOnStreams(Vec<(bool, u64, u64, usize)>, usize),
    FailNextUnmap,
}

fn size() -> impl Strategy<Value = u64> {
    prop_oneof![
        4 => Just(4096u64),
        2 => Just(6000),
        2 => Just(7000),
        3 => 1u64..200_000,
        2 => Just(512 << 10),
        1 => Just(3 * MIB),
        1 => 1u64..(3 * MIB),
        1 => Just(5 * MIB),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    let stream = 0usize..3;
    prop_oneof![
        6 => (size(), 0usize..3, any::<bool>(), stream.clone())
            .prop_map(|(size, policy, padded, stream)| Op::Malloc { size, policy, padded, stream }),
        3 => any::<usize>().prop_map(Op::Free),
        3 => (any::<usize>(), stream.clone()).prop_map(|(i, s)| Op::FreeOn(i, s)),
        2 => proptest::collection::vec(size(), 1..12).prop_map(Op::MallocMany),
        2 => proptest::collection::vec(any::<usize>(), 1..12).prop_map(Op::FreeMany),
        2 => (stream.clone(), any::<usize>()).prop_map(|(s, i)| Op::Launch(s, i)),
        1 => (any::<usize>(), stream.clone()).prop_map(|(i, s)| Op::RecordStream(i, s)),
        1 => stream.prop_map(Op::SyncStream),
        1 => Just(Op::Sync),
        1 => Just(Op::EmptyCache),
        1 => proptest::collection::vec((any::<bool>(), 0u64..12, size()), 1..40).prop_map(Op::Replay),
        1 => (proptest::collection::vec((any::<bool>(), 0u64..12, size(), 0usize..3), 1..40), any::<usize>())
            .prop_map(|(events, cut)| Op::ReplayOnStreams(events, cut)),
        1 => Just(Op::FailNextUnmap),
    ]
}

/// Everything observable that the pool's records feed: results, statistics, snapshots.
fn same(a: &Device, b: &Device, step: usize) -> Result<(), TestCaseError> {
    prop_assert_eq!(a.pool_stats(), b.pool_stats(), "pool stats after step {}", step);
    prop_assert_eq!(a.stats(), b.stats(), "device stats after step {}", step);
    prop_assert_eq!(a.segments(), b.segments(), "segments after step {}", step);
    prop_assert_eq!(a.fragmentation(), b.fragmentation(), "fragmentation after step {}", step);
    prop_assert_eq!(a.allocations(), b.allocations(), "allocations after step {}", step);
    Ok(())
}

/// Runs `ops` on a device over a pool of `family` and on the reference; see the module docs.
fn hands_back_what_was_granted(family: &str, ops: Vec<Op>) -> Result<(), TestCaseError> {
    let (mut a, mut b) = (device(family, false), device(family, true));
    let mut streams: Vec<StreamId> = vec![0];
    for _ in 0..2 {
        let (sa, sb) = (a.create_stream().unwrap(), b.create_stream().unwrap());
        prop_assert_eq!(sa, sb);
        streams.push(sa);
    }
    // The pointers the program holds (the same on both devices: checked as they come).
    let mut live: Vec<u64> = Vec::new();
    let pick = |live: &Vec<u64>, i: usize| live.get(i % live.len().max(1)).copied();
    for (step, op) in ops.into_iter().enumerate() {
        match op {
            Op::Malloc { size, policy, padded, stream } => {
                let policy = [Policy::HugeFirst, Policy::HugeOnly, Policy::NormalOnly][policy];
                let (ra, rb) = (
                    a.malloc_on(size, policy, padded, streams[stream]),
                    b.malloc_on(size, policy, padded, streams[stream]),
                );
                prop_assert_eq!(format!("{ra:?}"), format!("{rb:?}"));
                live.extend(ra.ok());
            }
            Op::Free(i) | Op::FreeOn(i, _) if live.is_empty() => {
                let _ = i;
            }
            Op::Free(i) => {
                let p = live[i % live.len()];
                let (ra, rb) = (a.free(p), b.free(p));
                prop_assert_eq!(format!("{ra:?}"), format!("{rb:?}"));
                if ra.is_ok() {
                    live.retain(|&q| q != p);
                }
            }
            Op::FreeOn(i, s) => {
                let p = live[i % live.len()];
                let (ra, rb) = (a.free_on(p, Some(streams[s])), b.free_on(p, Some(streams[s])));
                prop_assert_eq!(format!("{ra:?}"), format!("{rb:?}"));
                if ra.is_ok() {
                    live.retain(|&q| q != p);
                }
            }
            Op::MallocMany(sizes) => {
                let stream = streams[sizes.len() % 3];
                let (ra, rb) = (
                    a.malloc_many(&sizes, Policy::HugeFirst, stream),
                    b.malloc_many(&sizes, Policy::HugeFirst, stream),
                );
                prop_assert_eq!(format!("{ra:?}"), format!("{rb:?}"));
                live.extend(ra.unwrap_or_default());
            }
            Op::FreeMany(picks) => {
                let mut ptrs: Vec<u64> = picks.iter().filter_map(|&i| pick(&live, i)).collect();
                ptrs.dedup();
                let (ra, rb) = (a.free_many(&ptrs), b.free_many(&ptrs));
                prop_assert_eq!(format!("{ra:?}"), format!("{rb:?}"));
                if ra.is_ok() {
                    live.retain(|q| !ptrs.contains(q));
                }
            }
            Op::Launch(s, i) => {
                let reads: Vec<u64> = pick(&live, i).into_iter().collect();
                let (ra, rb) = (a.launch(streams[s], 50_000, &reads, &[]), b.launch(streams[s], 50_000, &reads, &[]));
                prop_assert_eq!(format!("{ra:?}"), format!("{rb:?}"));
            }
            Op::RecordStream(i, s) => {
                if let Some(p) = pick(&live, i) {
                    let (ra, rb) = (a.record_stream(p, streams[s]), b.record_stream(p, streams[s]));
                    prop_assert_eq!(format!("{ra:?}"), format!("{rb:?}"));
                }
            }
            Op::SyncStream(s) => {
                let (ra, rb) = (a.synchronize_stream(streams[s]), b.synchronize_stream(streams[s]));
                prop_assert_eq!(format!("{ra:?}"), format!("{rb:?}"));
            }
            Op::Sync => {
                let (ra, rb) = (a.synchronize_device(), b.synchronize_device());
                prop_assert_eq!(format!("{ra:?}"), format!("{rb:?}"));
            }
            Op::EmptyCache => {
                let (ra, rb) = (a.empty_cache(), b.empty_cache());
                prop_assert_eq!(format!("{ra:?}"), format!("{rb:?}"));
            }
            Op::Replay(events) => {
                let (ra, rb) = (
                    a.replay_events(&events, Policy::HugeFirst, false),
                    b.replay_events(&events, Policy::HugeFirst, false),
                );
                prop_assert_eq!(format!("{ra:?}"), format!("{rb:?}"));
                if let Ok(outcome) = ra {
                    live.extend(outcome.leftover);
                }
            }
            Op::ReplayOnStreams(events, cut) => {
                let is_alloc: Vec<u8> = events.iter().map(|e| e.0 as u8).collect();
                let ids: Vec<u64> = events.iter().map(|e| e.1).collect();
                let sizes: Vec<u64> = events.iter().map(|e| e.2).collect();
                let on: Vec<StreamId> = events.iter().map(|e| streams[e.3]).collect();
                let cut = cut % (events.len() + 1);
                let mut outcomes = Vec::new();
                for d in [&mut a, &mut b] {
                    let mut replay = Replay::new(12, events.len() as u64, 3);
                    let mut results = Vec::new();
                    for range in [0..cut, cut..events.len()] {
                        let chunk = ReplayEvents {
                            is_alloc: &is_alloc[range.clone()],
                            ids: &ids[range.clone()],
                            sizes: &sizes[range.clone()],
                            streams: Some(&on[range]),
                        };
                        results.push(format!("{:?}", d.replay_chunk(&mut replay, chunk, Policy::HugeFirst, false)));
                    }
                    let samples = replay.samples().to_vec();
                    outcomes.push((results, samples, replay.finish()));
                }
                prop_assert_eq!(&outcomes[0], &outcomes[1]);
                live.extend(outcomes.pop().unwrap().2.leftover);
            }
            Op::FailNextUnmap => {
                let plan = FaultPlan { unmap: Some(1), ..Default::default() };
                a.inject_faults(plan).unwrap();
                b.inject_faults(plan).unwrap();
            }
        }
        same(&a, &b, step)?;
    }
    // Everything back: the same empty pools.
    for p in live {
        let (ra, rb) = (a.free(p), b.free(p));
        prop_assert_eq!(format!("{ra:?}"), format!("{rb:?}"));
    }
    a.inject_faults(FaultPlan::default()).unwrap();
    b.inject_faults(FaultPlan::default()).unwrap();
    prop_assert_eq!(format!("{:?}", a.synchronize_device()), format!("{:?}", b.synchronize_device()));
    prop_assert_eq!(format!("{:?}", a.empty_cache()), format!("{:?}", b.empty_cache()));
    same(&a, &b, usize::MAX)?;
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]
    #[test]
    fn the_device_hands_back_what_the_npumem_pool_granted(ops in proptest::collection::vec(op(), 1..50)) {
        hands_back_what_was_granted("npumem", ops)?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]
    #[test]
    fn the_device_hands_back_what_a_caching_pool_granted(ops in proptest::collection::vec(op(), 1..50)) {
        hands_back_what_was_granted("pytorch", ops)?;
    }
}

/// A block revived by a malloc of another size on its stream, freed again while its work is
/// queued and reaped later: the pool gets back the request of the malloc that made it.
#[test]
fn a_revived_block_goes_back_as_its_pool_booked_it() {
    let (mut a, mut b) = (device("npumem", false), device("npumem", true));
    for d in [&mut a, &mut b] {
        let s = d.create_stream().unwrap();
        let p = d.malloc_on(7000, Policy::HugeFirst, true, s).unwrap();
        d.launch(s, 50_000, &[p], &[]).unwrap();
        d.free(p).unwrap();
        assert_eq!(d.stats().pending_frees, 1);
        let q = d.malloc_on(6000, Policy::HugeFirst, true, s).unwrap();
        assert_eq!((q, d.stats().same_stream_reuses), (p, 1));
        d.launch(s, 50_000, &[q], &[]).unwrap();
        d.free(q).unwrap();
        assert_eq!(d.stats().pending_frees, 1);
    }
    same(&a, &b, 0).unwrap();
    a.synchronize_device().unwrap();
    b.synchronize_device().unwrap();
    assert_eq!(a.stats().pending_frees, 0);
    same(&a, &b, 1).unwrap();
    assert_eq!(a.pool_stats().requested_bytes.all.current, 0);
}
