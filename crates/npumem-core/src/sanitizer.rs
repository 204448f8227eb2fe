//! `Sanitizer`: the device's memory sanitizer, cheap enough to leave on.
//!
//! It keeps a vector clock per stream, per recorded event and for the host, advanced by the
//! operations that order work in AscendCL: enqueueing (a stream's op follows what the host has
//! synchronised with), `record_event`, `stream_wait_event` and the `synchronize_*` calls. Each
//! allocation remembers, per stream, its last read and last write (epoch and byte range). An
//! access races with an earlier one by another stream (or the host) when their ranges overlap,
//! one of them writes, and the earlier one's epoch is not covered by the accessor's clock: no
//! event or synchronisation orders them. Host reads of memory with such a write still pending
//! are reported as `pending_write_read`. Findings are also made for the errors the device
//! refuses (use after free, double free, out of bounds) and for copies whose kind contradicts
//! their addresses (a warning: the runtime ignores the kind).
//!
//! Invariants: clocks only grow; a stream's own entry counts its enqueued operations; access
//! records are dropped when their allocation is freed; with the mode off nothing is tracked.

use std::collections::{BTreeMap, HashMap};

use crate::error::{AclError, ErrorCode, Result};
use crate::stream::{EventId, StreamId};

/// The host's pseudo stream id in reports.
pub const HOST: StreamId = u64::MAX;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SanitizerMode {
    Off,
    /// Record findings; operations proceed (or fail as they would anyway).
    Collect,
    /// Record findings and raise the hazards as errors before the operation runs.
    Raise,
}

impl SanitizerMode {
    pub fn parse(name: &str) -> Result<Self> {
        match name {
            "off" => Ok(SanitizerMode::Off),
            "collect" => Ok(SanitizerMode::Collect),
            "raise" => Ok(SanitizerMode::Raise),
            other => Err(AclError::invalid_param(format!(
                "unknown sanitizer mode {other:?}; use \"raise\", \"collect\" or \"off\""
            ))),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FindingKind {
    UseAfterFree,
    DoubleFree,
    OutOfBounds,
    KindMismatch,
    PendingWriteRead,
    Race,
}

impl FindingKind {
    pub fn name(self) -> &'static str {
        match self {
            FindingKind::UseAfterFree => "use_after_free",
            FindingKind::DoubleFree => "double_free",
            FindingKind::OutOfBounds => "out_of_bounds",
            FindingKind::KindMismatch => "kind_mismatch",
            FindingKind::PendingWriteRead => "pending_write_read",
            FindingKind::Race => "race",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finding {
    pub kind: FindingKind,
    pub message: String,
    /// The address accessed and the byte count.
    pub addr: u64,
    pub size: u64,
    /// The allocation involved (its start), when there is one.
    pub allocation: Option<u64>,
    /// The streams involved (`HOST` for the host).
    pub streams: Vec<StreamId>,
}

type Clock = BTreeMap<StreamId, u64>;

fn join(into: &mut Clock, other: &Clock) {
    for (&s, &t) in other {
        let e = into.entry(s).or_insert(0);
        *e = (*e).max(t);
    }
}

fn covers(clock: &Clock, stream: StreamId, epoch: u64) -> bool {
    clock.get(&stream).is_some_and(|&t| t >= epoch)
}

#[derive(Clone, Copy, Debug)]
struct Access {
    epoch: u64,
    lo: u64,
    hi: u64,
}

#[derive(Debug, Default)]
struct Accesses {
    reads: HashMap<StreamId, Access>,
    writes: HashMap<StreamId, Access>,
}

#[derive(Debug)]
pub struct Sanitizer {
    pub mode: SanitizerMode,
    findings: Vec<Finding>,
    streams: HashMap<StreamId, Clock>,
    events: HashMap<EventId, Clock>,
    host: Clock,
    host_epoch: u64,
    access: HashMap<u64, Accesses>,
}

impl Sanitizer {
    pub fn new(mode: SanitizerMode) -> Self {
        Sanitizer {
            mode,
            findings: Vec::new(),
            streams: HashMap::new(),
            events: HashMap::new(),
            host: Clock::new(),
            host_epoch: 0,
            access: HashMap::new(),
        }
    }

    pub fn enabled(&self) -> bool {
        self.mode != SanitizerMode::Off
    }

    pub fn findings(&self) -> &[Finding] {
        &self.findings
    }

    pub fn clear(&mut self) {
        self.findings.clear();
    }

    /// Records a finding; in raise mode returns it as an error for hazards the operation would
    /// otherwise run into.
    pub fn report(&mut self, finding: Finding, raise: bool) -> Result<()> {
        if !self.enabled() {
            return Ok(());
        }
        let error = (raise && self.mode == SanitizerMode::Raise).then(|| AclError {
            code: ErrorCode::RtParamInvalid,
            message: format!("sanitizer: {}", finding.message),
            finding: Some(finding.kind.name()),
        });
        self.findings.push(finding);
        error.map_or(Ok(()), Err)
    }

    /// A new operation on `stream`: it follows whatever the host had synchronised with.
    /// Returns the operation's epoch.
    pub fn on_enqueue(&mut self, stream: StreamId) -> u64 {
        if !self.enabled() {
            return 0;
        }
        let clock = self.streams.entry(stream).or_default();
        join(clock, &self.host);
        let t = clock.entry(stream).or_insert(0);
        *t += 1;
        *t
    }

    pub fn on_record(&mut self, event: EventId, stream: StreamId) {
        if self.enabled() {
            let clock = self.streams.get(&stream).cloned().unwrap_or_default();
            self.events.insert(event, clock);
        }
    }

    pub fn on_wait(&mut self, stream: StreamId, event: EventId) {
        if let Some(clock) = self.events.get(&event).cloned() {
            join(self.streams.entry(stream).or_default(), &clock);
        }
    }

    pub fn on_sync_stream(&mut self, stream: StreamId) {
        if let Some(clock) = self.streams.get(&stream).cloned() {
            join(&mut self.host, &clock);
        }
    }

    pub fn on_sync_event(&mut self, event: EventId) {
        if let Some(clock) = self.events.get(&event).cloned() {
            join(&mut self.host, &clock);
        }
    }

    pub fn on_sync_device(&mut self) {
        let clocks: Vec<Clock> = self.streams.values().cloned().collect();
        for c in clocks {
            join(&mut self.host, &c);
        }
    }

    /// Checks an access by an operation of `stream` (or by the host, `HOST`) to
    /// `[lo, hi)` of the allocation starting at `base`, then records it.
    pub fn access(&mut self, stream: StreamId, epoch: u64, base: u64, lo: u64, hi: u64, write: bool) -> Result<()> {
        if !self.enabled() || lo >= hi {
            return Ok(());
        }
        static EMPTY: Clock = Clock::new();
        let epoch = if stream == HOST {
            self.host_epoch += 1;
            self.host.insert(HOST, self.host_epoch);
            self.host_epoch
        } else {
            epoch
        };
        let clock = if stream == HOST { &self.host } else { self.streams.get(&stream).unwrap_or(&EMPTY) };
        let entry = self.access.entry(base).or_default();
        let overlaps = |a: &Access| a.lo < hi && lo < a.hi;
        // A read conflicts with unordered writes; a write with unordered reads and writes.
        let conflict = entry
            .writes
            .iter()
            .chain(entry.reads.iter().filter(|_| write))
            .find(|&(&o, a)| o != stream && overlaps(a) && !covers(clock, o, a.epoch))
            .map(|(&o, _)| o);
        // A refused operation (raise mode) does not run, so it leaves no access behind.
        if conflict.is_none() || self.mode != SanitizerMode::Raise {
            let record = Access { epoch, lo, hi };
            if write {
                entry.writes.insert(stream, record);
            } else {
                entry.reads.insert(stream, record);
            }
        }
        let Some(other) = conflict else { return Ok(()) };
        let who = |s: StreamId| if s == HOST { "the host".to_string() } else { format!("stream {s}") };
        let (kind, message) = if stream == HOST && !write {
            (
                FindingKind::PendingWriteRead,
                format!(
                    "the host reads {} bytes at {lo:#x} while a write by {} to them is not synchronised; \
                     synchronize the stream (or an event recorded after the write) first",
                    hi - lo,
                    who(other)
                ),
            )
        } else {
            (
                FindingKind::Race,
                format!(
                    "{} {} {} bytes at {lo:#x} that {} also accesses, at least one writing, with no event or \
                     synchronisation ordering them; record an event after the first and wait on it",
                    who(stream),
                    if write { "writes" } else { "reads" },
                    hi - lo,
                    who(other)
                ),
            )
        };
        let finding =
            Finding { kind, message, addr: lo, size: hi - lo, allocation: Some(base), streams: vec![other, stream] };
        self.report(finding, true)
    }

    /// Forgets the accesses of a freed allocation.
    pub fn forget(&mut self, base: u64) {
        self.access.remove(&base);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_order_streams_and_races_are_found() {
        let mut s = Sanitizer::new(SanitizerMode::Collect);
        let (a, b) = (1, 2);
        let e = s.on_enqueue(a);
        s.access(a, e, 100, 100, 200, true).unwrap();
        // b reads without ordering: a race.
        let e2 = s.on_enqueue(b);
        s.access(b, e2, 100, 150, 160, false).unwrap();
        assert_eq!(s.findings().len(), 1);
        assert_eq!(s.findings()[0].kind, FindingKind::Race);
        // Ordered by an event: no finding.
        s.on_record(7, a);
        s.on_wait(b, 7);
        let e3 = s.on_enqueue(b);
        s.access(b, e3, 100, 100, 200, true).unwrap();
        assert_eq!(s.findings().len(), 1, "b's write follows a's write through the event");
        // The host reading a's range before synchronising: a pending write.
        let e4 = s.on_enqueue(a);
        s.access(a, e4, 500, 500, 510, true).unwrap();
        s.access(HOST, 0, 500, 500, 510, false).unwrap();
        assert_eq!(s.findings()[1].kind, FindingKind::PendingWriteRead);
        s.on_sync_stream(a);
        s.access(HOST, 0, 500, 500, 510, false).unwrap();
        assert_eq!(s.findings().len(), 2, "synchronised: no finding");
        let mut r = Sanitizer::new(SanitizerMode::Raise);
        let e = r.on_enqueue(a);
        r.access(a, e, 0, 0, 8, true).unwrap();
        let err = r.access(HOST, 0, 0, 0, 8, true).unwrap_err();
        assert_eq!(err.finding, Some("race"));
        let mut off = Sanitizer::new(SanitizerMode::Off);
        off.access(HOST, 0, 0, 0, 8, true).unwrap();
        assert!(off.findings().is_empty());
    }
}
