//! The native replay: whole alloc/free traces replayed in Rust, in chunks, so a Python caller
//! crosses the binding once per chunk instead of once per event.
//!
//! Rules:
//! - A replay returns the allocations it still holds in `leftover`, or frees them all when it
//!   stops on an error other than out-of-memory.
//! - Every block a replay holds unpublished (`Replay::held`, inside one `replay_chunk` call
//!   only) is live in its pool, counted and traced, and absent from the device's live table.
//! - `publish` moves the held blocks to the live table before every return from `replay_chunk`
//!   and before any path but the replay's fast ones (the batch runs, the plain runs of
//!   `replay_plain_mallocs` / `replay_plain_frees`, and the direct single alloc and free).

mod batched;

use super::id_table::IdTable;
use super::*;
use crate::pool::Grant;

/// What a replayed trace did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReplayOutcome {
    pub allocs: u64,
    pub ooms: u64,
    /// The largest sum of live requested bytes reached.
    pub peak_live: u64,
    /// The message of the first out-of-memory error.
    pub first_oom: Option<String>,
    /// Allocations the trace had not freed when it ended, for the caller to inspect and free.
    pub leftover: Vec<u64>,
}

impl Device {
    /// Replays a trace of `(is_alloc, id, size)` events (a free names the id of an earlier
    /// alloc; its size is ignored). Out-of-memory allocations are counted and skipped (their
    /// frees too), or end the replay with `stop_on_oom`. Allocations still live at the end are
    /// returned in `leftover`. Other errors stop the replay, and then everything it allocated is
    /// freed.
    pub fn replay_events(
        &mut self,
        events: &[(bool, u64, u64)],
        policy: Policy,
        stop_on_oom: bool,
    ) -> Result<ReplayOutcome> {
        let is_alloc: Vec<u8> = events.iter().map(|e| e.0 as u8).collect();
        let ids: Vec<u64> = events.iter().map(|e| e.1).collect();
        let sizes: Vec<u64> = events.iter().map(|e| e.2).collect();
        let mut replay = Replay::new(ids.iter().max().map_or(0, |&m| m.saturating_add(1)), events.len() as u64, 0);
        let trace = ReplayEvents { is_alloc: &is_alloc, ids: &ids, sizes: &sizes, streams: None };
        self.replay_chunk(&mut replay, trace, policy, stop_on_oom)?;
        Ok(replay.finish())
    }

    /// Replays the next events of `replay` (a trace may come in chunks, so that a caller can
    /// show progress): what `replay_events` does, with each alloc on its event's stream and
    /// each free ordered on its event's stream when `streams` is given. After an error other
    /// than out-of-memory, everything the replay allocated is freed and the error returned;
    /// once a replay has stopped (an error, or `stop_on_oom`), further chunks do nothing.
    pub fn replay_chunk(
        &mut self,
        replay: &mut Replay,
        trace: ReplayEvents<'_>,
        policy: Policy,
        stop_on_oom: bool,
    ) -> Result<()> {
        let n = trace.is_alloc.len();
        if trace.ids.len() != n || trace.sizes.len() != n || trace.streams.is_some_and(|s| s.len() != n) {
            return Err(AclError::invalid_param(
                "the replay's event arrays (is_alloc, ids, sizes, streams) differ in length",
            ));
        }
        if replay.stopped {
            return Ok(());
        }
        // Every stream the chunk names exists (checked once per run of equal streams).
        if let Some(streams) = trace.streams {
            let mut last = None;
            for &s in streams {
                if last != Some(s) {
                    self.sched.tail_ns(s)?;
                    last = Some(s);
                }
            }
        }
        // Nobody but the replay sees the device until it returns: its fast paths keep the
        // blocks they make out of the live table, and every return publishes them. (Whatever
        // the sanitizer's mode, a block made in this call has no access records: only calls
        // from outside make them, on published blocks, and a free checks them either way.)
        let result = self.replay_runs(replay, trace, policy, stop_on_oom);
        self.publish(replay);
        if let Err(e) = result {
            replay.stopped = true;
            for p in replay.ids.drain() {
                self.free(p)?;
            }
            return Err(e);
        }
        Ok(())
    }

    /// Puts every block `replay` holds unpublished into the live table (their ids then name
    /// their pointers): before any path but the replay's fast ones, and before it returns.
    fn publish(&mut self, replay: &mut Replay) {
        for h in replay.held.drain(..) {
            if h.a.ptr != 0 {
                self.live.insert(h.a);
                replay.ids.set(h.id, h.a.ptr);
            }
        }
        replay.vacant = usize::MAX;
    }

    /// The runs of `replay_chunk` (checked), until the end of the chunk, a stop or an error.
    fn replay_runs(
        &mut self,
        replay: &mut Replay,
        trace: ReplayEvents<'_>,
        policy: Policy,
        stop_on_oom: bool,
    ) -> Result<()> {
        let n = trace.is_alloc.len();
        let mut result = Ok(());
        let mut k = 0;
        while k < n && !replay.stopped {
            // A run: events of one kind on one stream, ending at the next sample.
            let alloc = trace.is_alloc[k] != 0;
            let stream = trace.streams.map(|s| s[k]);
            let mut end = n;
            if replay.sample_every != 0 {
                let to_sample = replay.sample_every - replay.events % replay.sample_every;
                end = end.min(k.saturating_add(usize::try_from(to_sample).unwrap_or(usize::MAX)));
            }
            // The run ends at the first later event of the other kind (or on another stream).
            let kinds = &trace.is_alloc[..end];
            let mut stop = k + 1;
            match trace.streams {
                None => {
                    while stop < kinds.len() && (kinds[stop] != 0) == alloc {
                        stop += 1;
                    }
                }
                Some(s) => {
                    let s = &s[..end];
                    while stop < kinds.len() && (kinds[stop] != 0) == alloc && s[stop] == s[k] {
                        stop += 1;
                    }
                }
            }
            let run = if alloc {
                self.replay_allocs(replay, &trace.ids[k..stop], &trace.sizes[k..stop], stream, policy, stop_on_oom)
            } else {
                self.replay_frees(replay, &trace.ids[k..stop], stream)
            };
            if let Err(e) = run {
                result = Err(e);
                break;
            }
            k = stop;
            if replay.sample_every != 0 && replay.events % replay.sample_every == 0 {
                self.sample(replay, replay.events - 1);
            }
        }
        result
    }

    /// A run of allocs on one stream: runs of at least `RUN` through `malloc_run` (the
    /// allocator's front cache serves them with one statistics update), shorter ones one by one.
    /// Returns early (having counted the events it did) when the replay stops.
    fn replay_allocs(
        &mut self,
        replay: &mut Replay,
        ids: &[u64],
        sizes: &[u64],
        stream: Option<StreamId>,
        policy: Policy,
        stop_on_oom: bool,
    ) -> Result<()> {
        let stream = stream.unwrap_or(DEFAULT_STREAM);
        let run = AllocRun { ids, sizes, policy, stream };
        let mut k = 0;
        while k < ids.len() {
            let index = replay.events;
            let mut served = 0;
            let mut failed = None;
            if ids.len() - k >= RUN && self.pending.frees.is_empty() {
                (served, failed) = self.replay_alloc_batch(replay, run.from(k));
            }
            if served == 0 && failed.is_none() && ids.len() - k < RUN && replay.bypass && self.settled_for_mallocs() {
                (served, failed) = self.replay_plain_mallocs(replay, run.from(k));
            }
            if served == 0 && failed.is_none() {
                // One by one: a short run, or the event that ends a run's valid prefix.
                if replay.ids.get(ids[k]) != 0 {
                    replay.outcome.allocs += 1;
                    replay.events += 1;
                    return Err(AclError::invalid_param(format!("event {index}: id {} allocated twice", ids[k])));
                }
                match self.replay_malloc(replay, ids[k], sizes[k], policy, stream) {
                    Ok(()) => {
                        replay.live_bytes += sizes[k];
                        replay.outcome.peak_live = replay.outcome.peak_live.max(replay.live_bytes);
                        served = 1;
                    }
                    Err(e) => failed = Some(e),
                }
            }
            replay.outcome.allocs += served as u64;
            replay.events += served as u64;
            k += served;
            let Some(e) = failed else { continue };
            replay.outcome.allocs += 1;
            replay.events += 1;
            k += 1;
            if !e.code.is_out_of_memory() {
                return Err(AclError::new(e.code, format!("event {}: {}", replay.events - 1, e.message)));
            }
            replay.outcome.ooms += 1;
            replay.outcome.first_oom.get_or_insert(e.message);
            if stop_on_oom {
                replay.stopped = true;
                return Ok(());
            }
        }
        Ok(())
    }

    /// A run of frees on one stream (None: each block's own): while nothing is pending and the
    /// blocks complete at once, runs of at least `RUN` go through the allocator's batch path;
    /// the rest one by one. A free of an id that is not live (its alloc failed) does nothing.
    fn replay_frees(&mut self, replay: &mut Replay, ids: &[u64], stream: Option<StreamId>) -> Result<()> {
        let mut k = 0;
        while k < ids.len() {
            if ids.len() - k >= RUN && self.quiet() && stream.is_none_or(|s| self.idle(s)) {
                let taken = self.replay_free_batch(replay, &ids[k..])?;
                k += taken;
                if taken > 0 {
                    continue;
                }
            }
            // One by one: a short run while nothing a free asks about can change, without
            // asking per block; otherwise (or where that stops) by the full rules.
            if ids.len() - k < RUN && self.settled_for_frees(stream) {
                let done = self.replay_plain_frees(replay, &ids[k..])?;
                k += done;
                if done > 0 {
                    continue;
                }
            }
            let index = replay.events;
            replay.events += 1;
            k += 1;
            match self.replay_free(replay, ids[k - 1], stream) {
                Ok(size) => replay.live_bytes -= size,
                Err(e) => return Err(AclError::new(e.code, format!("event {index}: {}", e.message))),
            }
        }
        Ok(())
    }

    /// Notes the memory in use after event `index` of `replay`.
    fn sample(&self, replay: &mut Replay, index: u64) {
        let stats = &self.allocator.books().stats;
        replay.samples.push(ReplaySample {
            event: index,
            live: replay.live_bytes,
            allocated: stats.allocated_bytes.all.current,
            reserved: stats.reserved_bytes.all.current,
        });
    }

    /// One alloc of a replay, of `id`: when nothing is pending (no deferred free, no completed
    /// work to settle), straight to the allocator — `malloc_on` less the checks the replay made
    /// once (the stream exists) and the settling there is nothing for — its block held by the
    /// replay while it may; otherwise (published first) `malloc_on`.
    #[inline(never)]
    fn replay_malloc(
        &mut self,
        replay: &mut Replay,
        id: u64,
        size: u64,
        policy: Policy,
        stream: StreamId,
    ) -> Result<()> {
        if !self.pending.frees.is_empty() || self.sched.has_due() {
            self.publish(replay);
            let p = self.malloc_on(size, policy, true, stream)?;
            replay.ids.set(id, p);
            return Ok(());
        }
        let granted = self.allocate(size, policy, true);
        let result = match granted {
            Ok((booked, grant)) if replay.bypass => {
                let a = self.allocation_of(grant, size, booked, policy, stream);
                self.note_malloc(&a);
                replay.hold(id, a);
                Ok(())
            }
            granted => self.finish_malloc(granted, size, policy, stream).map(|p| replay.ids.set(id, p)),
        };
        self.charge_driver();
        result
    }

    /// One free of a replay (of `id`, which names a block the replay allocated or none), on
    /// `stream` when given; returns the allocation's size (0 when `id` holds none). A free
    /// that completes at once (nothing pending, no views, recorded streams, queued work or
    /// sanitizer records on the block, its streams idle) goes straight to the allocator; any
    /// other (published first) takes the full `free_on` path. On an error, `id` still names its
    /// block, which is live.
    #[inline(never)]
    fn replay_free(&mut self, replay: &mut Replay, id: u64, stream: Option<StreamId>) -> Result<u64> {
        if !self.pending.frees.is_empty() || self.sched.has_due() {
            // Settling reads the live table (queued work lands on the blocks it names).
            self.publish(replay);
            self.settle();
        }
        let v = replay.ids.take(id);
        if v == 0 {
            return Ok(0);
        }
        let a = match held_index(v) {
            Some(i) => replay.release(i),
            // Published first: a block freed from outside between chunks has left its id with
            // an address the replay may have been given again (the block now there is freed,
            // as the live table names it).
            None => match self.live.remove(v).or_else(|| {
                self.publish(replay);
                self.live.remove(v)
            }) {
                Some(a) => a,
                None => {
                    // Not live (the replay only frees what it allocated): the error free_on gives.
                    let result = self.free_on(v, stream).map(|()| 0);
                    if result.is_err() {
                        replay.ids.set(id, v);
                    }
                    return result;
                }
            },
        };
        let ptr = a.ptr;
        if self.quiet() && !self.sanitizer.tracks(ptr) && self.idle(a.stream) && stream.is_none_or(|s| self.idle(s)) {
            let block = self.granted_of(&a);
            if let Err(e) = self.allocator.free(self.backend.as_mut(), &block) {
                self.live.insert(a);
                replay.ids.set(id, ptr);
                return Err(e);
            }
            self.forget_freed(&a, true);
        } else {
            self.publish(replay);
            // free_removed puts the allocation back when it fails.
            if let Err(e) = self.free_removed(a, stream) {
                replay.ids.set(id, ptr);
                return Err(e);
            }
        }
        self.charge_driver();
        Ok(a.size)
    }
}

/// Runs of at least this many allocs (or frees) go through the batch paths; shorter ones cost
/// less one by one (the batch paths update the statistics of both pools once per run, but a
/// run's buffers and calls cost more than that saves below about 8 blocks: a training step's
/// runs of 5 allocs and 6 frees took 368.6 instructions an event batched, 349.2 one by one).
const RUN: usize = 8;

/// A run of allocs of a replay: its ids and sizes (from some event on), policy and stream.
#[derive(Clone, Copy)]
struct AllocRun<'a> {
    ids: &'a [u64],
    sizes: &'a [u64],
    policy: Policy,
    stream: StreamId,
}

impl<'a> AllocRun<'a> {
    /// The run from its event `k` on.
    #[inline(always)]
    fn from(self, k: usize) -> AllocRun<'a> {
        AllocRun { ids: &self.ids[k..], sizes: &self.sizes[k..], ..self }
    }
}

/// An id's mark in the table while its alloc is part of a run being served (no allocation
/// starts at address 1).
const PENDING: u64 = 1;

/// The id table's value for the held block at index `i` of `Replay::held`: odd, above
/// `PENDING` (pointers are even: every allocation starts on a 512-byte grain).
#[inline(always)]
fn held_tag(i: usize) -> u64 {
    ((i as u64 + 1) << 1) | 1
}

/// The index in `Replay::held` an id table value names, if it names a held block.
#[inline(always)]
fn held_index(v: u64) -> Option<usize> {
    (v & 1 == 1 && v != PENDING).then(|| ((v >> 1) - 1) as usize)
}

/// A block a replay allocated on a fast path and holds unpublished: live in its pool, absent
/// from the device's live table (`a.ptr` 0: freed since, and `id` names the next vacant entry).
#[derive(Clone, Copy, Debug)]
struct Held {
    id: u64,
    a: Allocation,
}

/// The event arrays of (a chunk of) a trace: `is_alloc` (non-zero for an alloc), the id each
/// event names, the size of each alloc (ignored for frees), and optionally each event's stream.
#[derive(Clone, Copy, Debug)]
pub struct ReplayEvents<'a> {
    pub is_alloc: &'a [u8],
    pub ids: &'a [u64],
    pub sizes: &'a [u64],
    pub streams: Option<&'a [StreamId]>,
}

/// The memory in use after one event of a replay.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReplaySample {
    /// The event's index in the trace.
    pub event: u64,
    /// Live requested bytes (what the program holds).
    pub live: u64,
    /// The allocator's allocated bytes (blocks handed out, with their rounding).
    pub allocated: u64,
    /// The allocator's reserved bytes (memory taken from the device).
    pub reserved: u64,
}

/// A replay in progress: which pointer each live id holds, the counters, and the samples.
#[derive(Debug)]
pub struct Replay {
    ids: IdTable,
    outcome: ReplayOutcome,
    live_bytes: u64,
    events: u64,
    sample_every: u64,
    samples: Vec<ReplaySample>,
    /// Buffers of the runs, kept between them.
    ptrs: Vec<u64>,
    allocs: Vec<Allocation>,
    /// The events (indices in a run) of the blocks in `allocs`.
    at: Vec<usize>,
    grants: Vec<Grant>,
    stopped: bool,
    /// The blocks held unpublished (inside a `replay_chunk` call only: each return publishes
    /// them); the id table names each live one by its index here (`held_tag`).
    held: Vec<Held>,
    /// The first entry of `held` whose block was freed (`a.ptr` 0: its `id` names the next
    /// such entry), for the next block held; `held.len()` or more: none.
    vacant: usize,
    /// Whether the replay may hold blocks unpublished at all (off: every block goes to the
    /// live table at once, the reference the tests compare with).
    bypass: bool,
}

impl Replay {
    /// A replay of a trace whose ids are below `id_bound` (a hint: ids past it work too, and a
    /// sparse trace is kept in a hash map) and that has about `events` events; with
    /// `sample_every` > 0, memory use is sampled after every `sample_every`-th event.
    pub fn new(id_bound: u64, events: u64, sample_every: u64) -> Self {
        Replay {
            ids: IdTable::new(id_bound, events),
            outcome: ReplayOutcome::default(),
            live_bytes: 0,
            events: 0,
            sample_every,
            samples: Vec::new(),
            ptrs: Vec::new(),
            allocs: Vec::new(),
            at: Vec::new(),
            grants: Vec::new(),
            stopped: false,
            held: Vec::new(),
            vacant: usize::MAX,
            bypass: true,
        }
    }

    /// This replay with every block put in the device's live table as it is made (the
    /// reference path; the same observable results, slower).
    #[doc(hidden)]
    pub fn publishing_at_once(mut self) -> Self {
        self.bypass = false;
        self
    }

    /// Holds `a`, just allocated for `id`, unpublished (in the entry of a freed one if any).
    #[inline(always)]
    fn hold(&mut self, id: u64, a: Allocation) {
        let i = if self.vacant < self.held.len() {
            let i = self.vacant;
            self.vacant = self.held[i].id as usize;
            self.held[i] = Held { id, a };
            i
        } else {
            self.held.push(Held { id, a });
            self.held.len() - 1
        };
        self.ids.set(id, held_tag(i));
    }

    /// The held block at `i` (its id already cleared), which is being freed: its entry joins
    /// the vacant ones.
    #[inline(always)]
    fn release(&mut self, i: usize) -> Allocation {
        let h = &mut self.held[i];
        let a = h.a;
        h.a.ptr = 0;
        h.id = self.vacant as u64;
        self.vacant = i;
        a
    }

    /// Events replayed so far.
    pub fn events(&self) -> u64 {
        self.events
    }

    /// Whether the replay has stopped (on out-of-memory with `stop_on_oom`, or an error).
    pub fn stopped(&self) -> bool {
        self.stopped
    }

    /// The counters so far (without `leftover`).
    pub fn outcome(&self) -> &ReplayOutcome {
        &self.outcome
    }

    pub fn samples(&self) -> &[ReplaySample] {
        &self.samples
    }

    /// Ends the replay: the counters, with the pointers still live in `leftover`.
    pub fn finish(mut self) -> ReplayOutcome {
        self.outcome.leftover = self.ids.drain();
        self.outcome
    }
}
