//! Streams, events and the simulated clock.
//!
//! Work queued on a stream runs in stream order on a simulated device clock: an operation starts
//! when the stream's previous work is done (and any event the stream waits on has completed) but
//! not before the host enqueued it, and takes the time the [`CostModel`] gives it. The host has
//! its own clock, which moves by the host-side cost of each call and jumps forward when it
//! synchronises. Data effects (the bytes an async copy or memset moves) are held until the host
//! clock passes their completion time, so a host read before synchronisation sees what the real
//! device would have let it see.
//!
//! Happens-before is tracked apart from time, as vector clocks: each stream's operation follows
//! what its stream did before, what the host had synchronised with when it enqueued it, and any
//! event the stream waited on. The sanitizer and the pools' reuse rules read these clocks.
//!
//! Invariants: clocks only grow, and a stream's own entry counts its operations; a stream's `tail_ns` never decreases; an operation ends no earlier than it starts
//! and starts no earlier than its stream's previous operation ended; pending effects are applied
//! in (completion time, enqueue order), each exactly once; an event's time is the completion
//! time of all the work its stream had when it was recorded.
//!
//! No time wraps: the host clock, stream tails and event times are `u64` nanoseconds (584
//! years). Queuing work whose end would pass `u64::MAX` is refused with an error naming the
//! operation, before anything changes; host-side charges ([`Scheduler::advance`]) saturate there
//! instead (the cost model's bounds put that beyond 10^10 calls). Counters that move by one per
//! call (operation epochs, ids) cannot reach 2^64.

pub mod cost;
pub mod runtime;

pub use cost::{CostModel, duration_from_us};
pub use runtime::{NoRuntime, RuntimeStreams};

use std::collections::BTreeMap;

use rustc_hash::FxHashMap as HashMap;

use crate::error::{AclError, ErrorCode, Result};

pub type StreamId = u64;
pub type EventId = u64;

/// A vector clock: for each stream (and `HOST_CLOCK` for the host), the last of its operations
/// known to have happened before.
pub type Clock = BTreeMap<StreamId, u64>;

/// The host's entry in vector clocks.
pub const HOST_CLOCK: StreamId = u64::MAX;

/// Merges `other` into `into`.
pub fn join(into: &mut Clock, other: &Clock) {
    for (&s, &t) in other {
        let e = into.entry(s).or_insert(0);
        *e = (*e).max(t);
    }
}

/// Whether `clock` knows operation `epoch` of `stream`.
pub fn covers(clock: &Clock, stream: StreamId, epoch: u64) -> bool {
    clock.get(&stream).is_some_and(|&t| t >= epoch)
}

/// The default stream (`NULL` in AscendCL).
pub const DEFAULT_STREAM: StreamId = 0;

/// A data effect held until its operation completes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Effect {
    Copy { dst: u64, src: u64, count: u64 },
    Fill { dst: u64, value: u8, count: u64 },
}

/// One operation on the timeline, for reports and plots.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Span {
    pub stream: StreamId,
    pub label: String,
    pub start_ns: u64,
    pub end_ns: u64,
    pub bytes: u64,
}

#[derive(Clone, Copy, Debug, Default)]
struct StreamState {
    tail_ns: u64,
}

#[derive(Clone, Copy, Debug, Default)]
struct EventState {
    /// Completion time of the work recorded, once recorded.
    time_ns: Option<u64>,
}

/// Most spans kept for the timeline (the oldest are dropped first).
const TIMELINE_LIMIT: usize = 100_000;

#[derive(Debug)]
pub struct Scheduler {
    pub cost: CostModel,
    now_ns: u64,
    streams: HashMap<StreamId, StreamState>,
    next_stream: StreamId,
    events: HashMap<EventId, EventState>,
    next_event: EventId,
    pending: BTreeMap<(u64, u64), Effect>,
    seq: u64,
    timeline: std::collections::VecDeque<Span>,
    clocks: HashMap<StreamId, Clock>,
    event_clocks: HashMap<EventId, Clock>,
    host_clock: Clock,
    /// When the work of destroyed streams completes (it still runs; `synchronize_device` waits
    /// for it). Their clocks stay in `clocks`, so synchronising learns their work too.
    retired_tail_ns: u64,
    /// The latest tail a stream was given: no stream's work runs past it (or past `now_ns`).
    latest_tail_ns: u64,
}

impl Scheduler {
    pub fn new(cost: CostModel) -> Self {
        let mut streams = HashMap::default();
        streams.insert(DEFAULT_STREAM, StreamState::default());
        Scheduler {
            cost,
            now_ns: 0,
            streams,
            next_stream: 1,
            events: HashMap::default(),
            next_event: 1,
            pending: BTreeMap::new(),
            seq: 0,
            timeline: std::collections::VecDeque::new(),
            clocks: HashMap::default(),
            event_clocks: HashMap::default(),
            host_clock: Clock::new(),
            retired_tail_ns: 0,
            latest_tail_ns: 0,
        }
    }

    /// The host clock.
    pub fn now_ns(&self) -> u64 {
        self.now_ns
    }

    /// Moves the host clock forward by `ns` (host-side work), saturating at `u64::MAX`: the clock
    /// never wraps back, and work queued once it is there is refused.
    pub fn advance(&mut self, ns: u64) {
        self.now_ns = self.now_ns.saturating_add(ns);
    }

    fn stream(&mut self, id: StreamId) -> Result<&mut StreamState> {
        self.streams.get_mut(&id).ok_or_else(|| {
            AclError::new(
                ErrorCode::RtParamInvalid,
                format!("stream {id} does not exist (destroyed, or never created); use create_stream()"),
            )
        })
    }

    fn event(&mut self, id: EventId) -> Result<&mut EventState> {
        self.events.get_mut(&id).ok_or_else(|| {
            AclError::new(ErrorCode::RtParamInvalid, format!("event {id} does not exist; use create_event()"))
        })
    }

    pub fn create_stream(&mut self) -> StreamId {
        let id = self.next_stream;
        self.next_stream += 1;
        self.streams.insert(id, StreamState { tail_ns: self.now_ns });
        id
    }

    /// Destroys a stream; its queued work still completes, and `synchronize_device` waits for it
    /// (frees and copies ordered on it complete then).
    pub fn destroy_stream(&mut self, id: StreamId) -> Result<()> {
        if id == DEFAULT_STREAM {
            return Err(AclError::invalid_param("the default stream cannot be destroyed"));
        }
        let gone = self.streams.remove(&id).ok_or_else(|| AclError::rt_param(format!("stream {id} does not exist")))?;
        self.retired_tail_ns = self.retired_tail_ns.max(gone.tail_ns);
        Ok(())
    }

    pub fn stream_ids(&self) -> Vec<StreamId> {
        let mut ids: Vec<_> = self.streams.keys().copied().collect();
        ids.sort_unstable();
        ids
    }

    pub fn create_event(&mut self) -> EventId {
        let id = self.next_event;
        self.next_event += 1;
        self.events.insert(id, EventState::default());
        id
    }

    pub fn destroy_event(&mut self, id: EventId) -> Result<()> {
        self.events.remove(&id).ok_or_else(|| AclError::rt_param(format!("event {id} does not exist")))?;
        self.event_clocks.remove(&id);
        Ok(())
    }

    pub fn has_event(&self, id: EventId) -> bool {
        self.events.contains_key(&id)
    }

    pub fn event_ids(&self) -> Vec<EventId> {
        let mut ids: Vec<_> = self.events.keys().copied().collect();
        ids.sort_unstable();
        ids
    }

    /// Where `duration_ns` of work queued on `stream` now would land: (host clock after the
    /// launch cost, start, end), or the error [`enqueue`](Self::enqueue) would give (an unknown
    /// stream, or an end past the clock's limit). Changes nothing: a caller that records
    /// something about the operation before queuing it (the sanitizer) checks here first.
    pub fn plan_enqueue(&self, stream: StreamId, duration_ns: u64, label: &str) -> Result<(u64, u64, u64)> {
        let tail = self.tail_ns(stream)?;
        let overflow = |what: &str, at: u64, by: u64| {
            AclError::invalid_param(format!(
                "{label} on stream {stream}: {what} would pass the simulated clock's limit of 2^64-1 ns \
                 (584 years) ({at} ns + {by} ns); use shorter durations or smaller costs"
            ))
        };
        // The launch cost is within the cost model's bounds; `as` saturates (and maps NaN to 0)
        // for a field set directly.
        let launch = self.cost.launch_ns as u64;
        let now = self.now_ns.checked_add(launch).ok_or_else(|| overflow("the host clock", self.now_ns, launch))?;
        let start = tail.max(now);
        let end = start.checked_add(duration_ns).ok_or_else(|| overflow("its end", start, duration_ns))?;
        Ok((now, start, end))
    }

    /// Queues `duration_ns` of work on `stream` (after the host-side launch cost); returns
    /// (start, end) on the device clock. Refused, with nothing changed, where a clock would pass
    /// `u64::MAX` ([`plan_enqueue`](Self::plan_enqueue)).
    pub fn enqueue(
        &mut self,
        stream: StreamId,
        duration_ns: u64,
        label: &str,
        bytes: u64,
        effect: Option<Effect>,
    ) -> Result<(u64, u64)> {
        let (now, start, end) = self.plan_enqueue(stream, duration_ns, label)?;
        self.now_ns = now;
        self.stream(stream)?.tail_ns = end;
        self.latest_tail_ns = self.latest_tail_ns.max(end);
        self.clocks.insert(stream, self.next_clock(stream));
        if let Some(effect) = effect {
            self.seq += 1;
            self.pending.insert((end, self.seq), effect);
        }
        if self.timeline.len() == TIMELINE_LIMIT {
            self.timeline.pop_front();
        }
        self.timeline.push_back(Span { stream, label: label.to_string(), start_ns: start, end_ns: end, bytes });
        Ok((start, end))
    }

    /// `aclrtRecordEvent`: the event completes when the stream's work so far has.
    pub fn record_event(&mut self, event: EventId, stream: StreamId) -> Result<()> {
        let tail = self.stream(stream)?.tail_ns.max(self.now_ns);
        self.event(event)?.time_ns = Some(tail);
        let clock = self.clock(stream).clone();
        self.event_clocks.insert(event, clock);
        Ok(())
    }

    /// `aclrtStreamWaitEvent`: later work on `stream` starts after the event completes.
    pub fn stream_wait_event(&mut self, stream: StreamId, event: EventId) -> Result<()> {
        let time = self.event(event)?.time_ns.unwrap_or(0);
        let s = self.stream(stream)?;
        s.tail_ns = s.tail_ns.max(time);
        self.latest_tail_ns = self.latest_tail_ns.max(time);
        if let Some(clock) = self.event_clocks.get(&event).cloned() {
            join(self.clocks.entry(stream).or_default(), &clock);
        }
        Ok(())
    }

    /// Makes `stream`'s later work follow the point `clock` of other streams, finishing no
    /// earlier than `time_ns` (a dependency the pool inserts to reuse memory).
    pub fn stream_wait_point(&mut self, stream: StreamId, time_ns: u64, clock: &Clock) -> Result<()> {
        let s = self.stream(stream)?;
        s.tail_ns = s.tail_ns.max(time_ns);
        self.latest_tail_ns = self.latest_tail_ns.max(time_ns);
        join(self.clocks.entry(stream).or_default(), clock);
        Ok(())
    }

    /// The vector clock of `stream` (what its operations so far follow).
    pub fn clock(&self, stream: StreamId) -> &Clock {
        static EMPTY: Clock = Clock::new();
        self.clocks.get(&stream).unwrap_or(&EMPTY)
    }

    /// The clock the next operation on `stream` will have: its own, joined with what the host
    /// has synchronised with, one tick further.
    pub fn next_clock(&self, stream: StreamId) -> Clock {
        let mut clock = self.clock(stream).clone();
        join(&mut clock, &self.host_clock);
        *clock.entry(stream).or_insert(0) += 1;
        clock
    }

    /// The host's clock.
    pub fn host_clock(&self) -> &Clock {
        &self.host_clock
    }

    /// Counts one host access and returns its epoch.
    pub fn host_tick(&mut self) -> u64 {
        let t = self.host_clock.entry(HOST_CLOCK).or_insert(0);
        *t += 1;
        *t
    }

    /// Whether the event has completed on the host clock (an unrecorded event counts as complete,
    /// as in AscendCL).
    pub fn query_event(&mut self, event: EventId) -> Result<bool> {
        let now = self.now_ns;
        Ok(self.event(event)?.time_ns.is_none_or(|t| t <= now))
    }

    /// The completion time of a recorded event.
    pub fn event_time(&mut self, event: EventId) -> Result<u64> {
        self.event(event)?.time_ns.ok_or_else(|| {
            AclError::new(
                ErrorCode::RtParamInvalid,
                format!("event {event} was never recorded; call record_event first"),
            )
        })
    }

    /// Blocks the host until `stream`'s work is done.
    pub fn synchronize_stream(&mut self, stream: StreamId) -> Result<()> {
        let tail = self.stream(stream)?.tail_ns;
        self.now_ns = self.now_ns.max(tail);
        let clock = self.clock(stream).clone();
        join(&mut self.host_clock, &clock);
        Ok(())
    }

    pub fn synchronize_event(&mut self, event: EventId) -> Result<()> {
        if let Some(t) = self.event(event)?.time_ns {
            self.now_ns = self.now_ns.max(t);
        }
        if let Some(clock) = self.event_clocks.get(&event).cloned() {
            join(&mut self.host_clock, &clock);
        }
        Ok(())
    }

    pub fn synchronize_device(&mut self) {
        let last = self.streams.values().map(|s| s.tail_ns).fold(self.retired_tail_ns, u64::max);
        self.now_ns = self.now_ns.max(last);
        let clocks: Vec<Clock> = self.clocks.values().cloned().collect();
        for c in clocks {
            join(&mut self.host_clock, &c);
        }
    }

    /// Blocks the host until `stream`'s operation ending at `time_ns` is done (the host then
    /// knows that operation).
    pub fn wait_for(&mut self, stream: StreamId, time_ns: u64) {
        self.now_ns = self.now_ns.max(time_ns);
        let clock = self.clock(stream).clone();
        join(&mut self.host_clock, &clock);
    }

    /// When the work queued on `stream` so far completes (never earlier than the host clock).
    #[inline]
    pub fn tail_ns(&self, stream: StreamId) -> Result<u64> {
        self.streams.get(&stream).map(|s| s.tail_ns.max(self.now_ns)).ok_or_else(|| {
            AclError::new(
                ErrorCode::RtParamInvalid,
                format!("stream {stream} does not exist (destroyed, or never created); use create_stream()"),
            )
        })
    }

    /// `tail_ns(stream)`, or the host clock where `stream` does not exist; without a lookup
    /// while no stream has work past the host clock (the common case of a free).
    #[inline]
    pub fn tail_or_now(&self, stream: StreamId) -> u64 {
        if self.latest_tail_ns <= self.now_ns {
            return self.now_ns;
        }
        self.tail_ns(stream).unwrap_or(self.now_ns)
    }

    /// Whether `stream` exists and has no work past the host clock: without a lookup for the
    /// default stream (which always exists) while no stream has work past the clock.
    #[inline(always)]
    pub fn is_idle(&self, stream: StreamId) -> bool {
        if stream == DEFAULT_STREAM && self.latest_tail_ns <= self.now_ns {
            return true;
        }
        self.tail_idle(stream)
    }

    /// `is_idle` past its fast check (kept out of line: the fast check is inlined on every
    /// free's path).
    #[inline(never)]
    fn tail_idle(&self, stream: StreamId) -> bool {
        self.tail_ns(stream).is_ok_and(|t| t <= self.now_ns)
    }

    /// Whether `stream` still has work running on the host clock.
    pub fn stream_busy(&self, stream: StreamId) -> bool {
        self.streams.get(&stream).is_some_and(|s| s.tail_ns > self.now_ns)
    }

    /// Whether an effect's operation has completed by the host clock (one comparison when
    /// nothing is queued: the common case on the malloc/free path).
    #[inline(always)]
    pub fn has_due(&self) -> bool {
        self.pending.first_key_value().is_some_and(|(&(t, _), _)| t <= self.now_ns)
    }

    /// The effects whose operations have completed by the host clock, in completion order.
    pub fn take_due(&mut self) -> Vec<Effect> {
        if !self.has_due() {
            return Vec::new();
        }
        let rest = match self.now_ns.checked_add(1) {
            Some(after) => self.pending.split_off(&(after, 0)),
            None => BTreeMap::new(), // the clock is at its limit: everything is due
        };
        let due = std::mem::replace(&mut self.pending, rest);
        due.into_values().collect()
    }

    pub fn pending_effects(&self) -> usize {
        self.pending.len()
    }

    /// Drops the queued copies and fills (not landed yet) that read or write `[start, end)`:
    /// their memory is going away. Returns how many were dropped.
    pub fn drop_effects_touching(&mut self, start: u64, end: u64) -> u64 {
        if self.pending.is_empty() {
            return 0;
        }
        let hits = |at: u64, count: u64| at < end && start < at.saturating_add(count);
        let before = self.pending.len();
        self.pending.retain(|_, e| match *e {
            Effect::Copy { dst, src, count } => !(hits(dst, count) || hits(src, count)),
            Effect::Fill { dst, count, .. } => !hits(dst, count),
        });
        (before - self.pending.len()) as u64
    }

    pub fn timeline(&self) -> impl Iterator<Item = &Span> {
        self.timeline.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sched() -> Scheduler {
        let mut c = CostModel::ascend910b();
        c.launch_ns = 1.0;
        Scheduler::new(c)
    }

    proptest::proptest! {
        /// `tail_or_now` answers as `tail_ns` (the host clock for a stream that does not exist)
        /// after any mix of streams made and destroyed, work queued, waits and host time.
        #[test]
        fn tail_or_now_is_tail_ns(ops in proptest::collection::vec((0u8..6, 0u64..4, 1u64..5_000), 1..60)) {
            let mut s = sched();
            let event = s.create_event();
            for (op, id, ns) in ops {
                match op {
                    0 => { s.create_stream(); }
                    1 => { let _ = s.destroy_stream(id); }
                    2 => { let _ = s.enqueue(id, ns, "kernel", 0, None); }
                    3 => { let _ = s.record_event(event, id); let _ = s.stream_wait_event((id + 1) % 4, event); }
                    4 => { let _ = s.stream_wait_point(id, s.now_ns() + ns, &Clock::new()); }
                    _ => s.advance(ns),
                }
                for id in 0..5 {
                    proptest::prop_assert_eq!(s.tail_or_now(id), s.tail_ns(id).unwrap_or(s.now_ns()));
                }
            }
        }
    }

    #[test]
    fn streams_run_in_order_and_overlap_each_other() {
        let mut s = sched();
        let (a, b) = (s.create_stream(), s.create_stream());
        let (s1, e1) = s.enqueue(a, 100, "k1", 0, None).unwrap();
        let (s2, e2) = s.enqueue(a, 50, "k2", 0, None).unwrap();
        let (s3, _) = s.enqueue(b, 70, "k3", 0, None).unwrap();
        assert_eq!((s1, e1), (1, 101));
        assert_eq!((s2, e2), (101, 151), "stream order");
        assert_eq!(s3, 3, "another stream overlaps");
        let ev = s.create_event();
        s.record_event(ev, a).unwrap();
        assert!(!s.query_event(ev).unwrap());
        s.stream_wait_event(b, ev).unwrap();
        let (s4, _) = s.enqueue(b, 10, "k4", 0, None).unwrap();
        assert_eq!(s4, 151, "waits for the event");
        s.synchronize_event(ev).unwrap();
        assert_eq!(s.now_ns(), 151);
        assert!(s.query_event(ev).unwrap());
        assert!(s.stream_busy(b));
        s.synchronize_device();
        assert_eq!(s.now_ns(), 161);
        assert!(s.destroy_stream(DEFAULT_STREAM).is_err());
        s.destroy_stream(a).unwrap();
        assert!(s.enqueue(a, 1, "x", 0, None).is_err());
        let fresh = s.create_event();
        assert!(s.event_time(fresh).is_err());
    }

    #[test]
    fn clocks_never_wrap() {
        let mut s = sched();
        let st = s.create_stream();
        let limit = cost::MAX_DURATION_NS;
        // Back-to-back maximal kernels fill the stream's timeline up to the 64-bit limit ...
        let mut last = (0, 0);
        while let Ok(span) = s.enqueue(st, limit, "kernel", 0, None) {
            assert!(span.1 > last.1, "the stream's tail only grows");
            last = span;
        }
        // ... and the one that would pass it is refused, naming it, with nothing changed.
        let now = s.now_ns();
        let err = s.enqueue(st, limit, "kernel", 0, Some(Effect::Fill { dst: 1, value: 1, count: 1 })).unwrap_err();
        assert_eq!(err.code, ErrorCode::InvalidParam);
        assert!(err.message.contains("kernel on stream") && err.message.contains("2^64-1 ns"), "{}", err.message);
        assert_eq!((s.now_ns(), s.tail_ns(st).unwrap(), s.pending_effects()), (now, last.1, 0));
        assert_eq!(s.plan_enqueue(st, limit, "kernel"), Err(err), "the check a caller can make first");
        let (_, start, end) = s.plan_enqueue(DEFAULT_STREAM, 7, "kernel").unwrap();
        assert_eq!(s.enqueue(DEFAULT_STREAM, 7, "kernel", 0, None), Ok((start, end)));
        // Host-side charges saturate: the clock stops at the limit, never runs backwards.
        s.advance(u64::MAX);
        s.advance(u64::MAX);
        assert_eq!(s.now_ns(), u64::MAX);
        let err = s.enqueue(DEFAULT_STREAM, 0, "memset", 0, None).unwrap_err();
        assert!(err.message.contains("the host clock would pass"), "{}", err.message);
        // Effects that complete at the last nanosecond are still applied.
        let mut s = sched();
        s.enqueue(DEFAULT_STREAM, u64::MAX - 1, "copy", 8, Some(Effect::Fill { dst: 1, value: 7, count: 8 })).unwrap();
        s.synchronize_device();
        assert_eq!(s.now_ns(), u64::MAX);
        assert_eq!(s.take_due().len(), 1);
    }

    #[test]
    fn effects_wait_for_the_host_clock() {
        let mut s = sched();
        let st = s.create_stream();
        s.enqueue(st, 1000, "copy", 8, Some(Effect::Fill { dst: 1, value: 7, count: 8 })).unwrap();
        assert!(s.take_due().is_empty());
        s.advance(2000);
        assert_eq!(s.take_due(), vec![Effect::Fill { dst: 1, value: 7, count: 8 }]);
        assert!(s.take_due().is_empty());
    }
}
