//! `Sanitizer`: the device's memory sanitizer, cheap enough to leave on.
//!
//! Ordering comes from the scheduler's vector clocks (advanced by enqueueing, `record_event`,
//! `stream_wait_event` and the `synchronize_*` calls). Each allocation (device or `malloc_host`)
//! keeps, per stream and for the host, the accesses not yet known to be ordered before
//! everything that can still happen (epoch, byte range, read or write). An operation's access
//! races with an earlier one by another stream (or the host) when their ranges overlap, one of
//! them writes, and the earlier one's epoch is not covered by the operation's clock: no event or
//! synchronisation orders them. Host reads of memory with such a write pending are reported as
//! `pending_write_read`. A free whose memory another stream still uses without being ordered
//! before the free (no event, no synchronisation, not the allocation's own stream, not recorded
//! with `record_stream`, not the stream of a stream-ordered free) is a `use_after_free` hazard:
//! the real runtime would hand that memory out while the work runs. Findings are also made for
//! the errors the device refuses (use after free, double free, out of bounds) and for copies
//! whose kind contradicts their addresses (a warning: the runtime ignores the kind).
//!
//! Invariants: the verdicts are exact with respect to the vector clocks — an access record is
//! dropped only when a later access of the same stream supersedes it (it covers the range, and a
//! write supersedes reads) or when the host clock covers it (every later operation's clock
//! includes the host's), so no race is missed and none is invented; a refused operation (raise
//! mode) leaves no record; access records of an allocation are dropped when its memory goes back
//! to the allocator (a block revived by its own stream keeps them, since its old work is still
//! queued); at most `FINDINGS_LIMIT` findings are kept (the first ones), every finding is
//! counted by kind; with the mode off nothing is tracked.

use rustc_hash::FxHashMap;

use crate::error::{AclError, ErrorCode, Result};
use crate::stream::{Clock, StreamId, covers};

/// The host's pseudo stream id in reports and clocks.
pub use crate::stream::HOST_CLOCK as HOST;

/// Findings kept for `findings()`; later ones are only counted.
pub const FINDINGS_LIMIT: usize = 10_000;

/// Records per allocation and stream past which those the host clock covers are pruned.
const PRUNE_AT: usize = 16;

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
    pub const ALL: [FindingKind; 6] = [
        FindingKind::UseAfterFree,
        FindingKind::DoubleFree,
        FindingKind::OutOfBounds,
        FindingKind::KindMismatch,
        FindingKind::PendingWriteRead,
        FindingKind::Race,
    ];

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
    /// The streams involved (`HOST` for the host): for a race or an unordered free, the earlier
    /// unordered streams in increasing order, then the one acting now.
    pub streams: Vec<StreamId>,
    /// The allocation's site tag (given at malloc), when it has one.
    pub tag: Option<String>,
}

/// One access of an operation: `[lo, hi)` inside the allocation that starts at `base`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Touch {
    pub base: u64,
    pub lo: u64,
    pub hi: u64,
    pub write: bool,
}

#[derive(Clone, Copy, Debug)]
struct Access {
    epoch: u64,
    lo: u64,
    hi: u64,
    write: bool,
}

impl Access {
    /// Whether this later access of the same stream makes `old` redundant: any clock that does
    /// not cover `old` does not cover this one either, so every conflict with `old` is also one
    /// with this (a write conflicts with whatever a read does, not the other way round).
    fn supersedes(&self, old: &Access) -> bool {
        self.lo <= old.lo && old.hi <= self.hi && (self.write || !old.write)
    }
}

/// How many findings of each kind were made (kept or not).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FindingCounts {
    pub by_kind: [u64; 6],
    /// Findings counted but not kept (past `FINDINGS_LIMIT`).
    pub dropped: u64,
}

impl FindingCounts {
    pub fn get(&self, kind: FindingKind) -> u64 {
        self.by_kind[kind as usize]
    }

    pub fn total(&self) -> u64 {
        self.by_kind.iter().sum()
    }
}

#[derive(Debug)]
pub struct Sanitizer {
    pub mode: SanitizerMode,
    findings: Vec<Finding>,
    counts: FindingCounts,
    /// Allocation start → stream (or `HOST`) → its unsuperseded accesses.
    access: FxHashMap<u64, FxHashMap<StreamId, Vec<Access>>>,
}

fn who(s: StreamId) -> String {
    if s == HOST { "the host".to_string() } else { format!("stream {s}") }
}

fn list(streams: &[StreamId]) -> String {
    streams.iter().map(|&s| who(s)).collect::<Vec<_>>().join(", ")
}

impl Sanitizer {
    pub fn new(mode: SanitizerMode) -> Self {
        Sanitizer { mode, findings: Vec::new(), counts: FindingCounts::default(), access: FxHashMap::default() }
    }

    pub fn enabled(&self) -> bool {
        self.mode != SanitizerMode::Off
    }

    /// The findings kept (the first `FINDINGS_LIMIT`).
    pub fn findings(&self) -> &[Finding] {
        &self.findings
    }

    /// Every finding made since the last `clear`, by kind.
    pub fn counts(&self) -> FindingCounts {
        self.counts
    }

    pub fn clear(&mut self) {
        self.findings.clear();
        self.counts = FindingCounts::default();
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
        self.counts.by_kind[finding.kind as usize] += 1;
        if self.findings.len() < FINDINGS_LIMIT {
            self.findings.push(finding);
        } else {
            self.counts.dropped += 1;
        }
        error.map_or(Ok(()), Err)
    }

    /// The streams (or the host) other than `actor` with an access to `[t.lo, t.hi)` of
    /// `t.base` that conflicts with `t` and that `clock` does not cover, in increasing order.
    fn conflicts(&self, actor: StreamId, clock: &Clock, t: &Touch) -> Vec<StreamId> {
        let Some(by_stream) = self.access.get(&t.base) else { return Vec::new() };
        let mut out: Vec<StreamId> = by_stream
            .iter()
            .filter(|&(&o, accesses)| {
                o != actor
                    && accesses
                        .iter()
                        .any(|a| (a.write || t.write) && a.lo < t.hi && t.lo < a.hi && !covers(clock, o, a.epoch))
            })
            .map(|(&o, _)| o)
            .collect();
        out.sort_unstable();
        out
    }

    /// Checks the accesses of one operation by `actor` (a stream, or `HOST`), its `epoch` and
    /// vector clock `clock`; `host` is the host's clock (used to prune records). Every conflict
    /// is a finding (one per touch); in raise mode the first makes the operation fail and
    /// nothing is recorded, otherwise the accesses are recorded.
    pub fn operation(
        &mut self,
        actor: StreamId,
        epoch: u64,
        clock: &Clock,
        host: &Clock,
        touches: &[Touch],
        tags: &FxHashMap<u64, String>,
    ) -> Result<()> {
        if !self.enabled() {
            return Ok(());
        }
        let mut findings = Vec::new();
        for t in touches.iter().filter(|t| t.lo < t.hi) {
            let others = self.conflicts(actor, clock, t);
            if others.is_empty() {
                continue;
            }
            let len = t.hi - t.lo;
            let (kind, message) = if actor == HOST && !t.write {
                (
                    FindingKind::PendingWriteRead,
                    format!(
                        "the host reads {len} bytes at {:#x} while a write by {} to them is not synchronised; \
                         synchronize the stream (or an event recorded after the write) first",
                        t.lo,
                        list(&others)
                    ),
                )
            } else {
                (
                    FindingKind::Race,
                    format!(
                        "{} {} {len} bytes at {:#x} that {} also accesses, at least one writing, with no event \
                         or synchronisation ordering them; record an event after the first and wait on it",
                        who(actor),
                        if t.write { "writes" } else { "reads" },
                        t.lo,
                        list(&others)
                    ),
                )
            };
            let mut streams = others;
            streams.push(actor);
            findings.push(Finding {
                kind,
                message,
                addr: t.lo,
                size: len,
                allocation: Some(t.base),
                streams,
                tag: tags.get(&t.base).cloned(),
            });
        }
        let refused = !findings.is_empty() && self.mode == SanitizerMode::Raise;
        let mut first_error = None;
        for f in findings {
            if let Err(e) = self.report(f, true) {
                first_error.get_or_insert(e);
            }
        }
        if refused {
            return Err(first_error.expect("raise mode turns a hazard into an error"));
        }
        for t in touches.iter().filter(|t| t.lo < t.hi) {
            self.record(actor, epoch, host, t);
        }
        Ok(())
    }

    fn record(&mut self, actor: StreamId, epoch: u64, host: &Clock, t: &Touch) {
        // The host's accesses need no record: every later operation's clock includes the host's,
        // so none can conflict with them.
        if actor == HOST {
            return;
        }
        let new = Access { epoch, lo: t.lo, hi: t.hi, write: t.write };
        let accesses = self.access.entry(t.base).or_default().entry(actor).or_default();
        accesses.retain(|old| !new.supersedes(old));
        accesses.push(new);
        if accesses.len() > PRUNE_AT {
            accesses.retain(|a| !covers(host, actor, a.epoch));
        }
    }

    /// Checks a free of the allocation at `base` (`size` bytes) by `actor` (the host, or the
    /// stream of a stream-ordered free) whose clock is `clock`: the memory goes back once the
    /// streams in `waited` are done, so an access by another stream that `clock` does not cover
    /// is a use-after-free hazard. In raise mode the hazard makes the free fail.
    #[allow(clippy::too_many_arguments)]
    pub fn check_free(
        &mut self,
        base: u64,
        size: u64,
        actor: StreamId,
        clock: &Clock,
        waited: &[StreamId],
        tag: Option<&String>,
    ) -> Result<()> {
        if !self.enabled() {
            return Ok(());
        }
        let Some(by_stream) = self.access.get(&base) else { return Ok(()) };
        let mut others: Vec<StreamId> = by_stream
            .iter()
            .filter(|&(&o, accesses)| {
                o != HOST && o != actor && !waited.contains(&o) && accesses.iter().any(|a| !covers(clock, o, a.epoch))
            })
            .map(|(&o, _)| o)
            .collect();
        if others.is_empty() {
            return Ok(());
        }
        others.sort_unstable();
        let message = format!(
            "{} frees the memory at {base:#x} while {} may still access it (no event or synchronisation \
             orders that work before the free, and the runtime does not wait for it); free it on that \
             stream (free(ptr, stream=...)), call record_stream(ptr, stream) before the free, or synchronize first",
            who(actor),
            list(&others)
        );
        others.push(actor);
        let finding = Finding {
            kind: FindingKind::UseAfterFree,
            message,
            addr: base,
            size,
            allocation: Some(base),
            streams: others,
            tag: tag.cloned(),
        };
        self.report(finding, true)
    }

    /// Whether any access to the allocation at `base` is recorded.
    #[inline]
    pub fn tracks(&self, base: u64) -> bool {
        !self.access.is_empty() && self.access.contains_key(&base)
    }

    /// Whether no allocation has access records (`tracks` and `forget` then do nothing).
    #[inline]
    pub fn tracks_none(&self) -> bool {
        self.access.is_empty()
    }

    /// Forgets the accesses of an allocation whose memory went back to the allocator.
    #[inline]
    pub fn forget(&mut self, base: u64) {
        if !self.access.is_empty() {
            self.access.remove(&base);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stream::{CostModel, Scheduler};

    /// Runs an access of the next operation on `stream` (or of the host).
    fn op(
        san: &mut Sanitizer,
        sched: &mut Scheduler,
        stream: StreamId,
        base: u64,
        lo: u64,
        hi: u64,
        write: bool,
    ) -> Result<()> {
        let touch = [Touch { base, lo, hi, write }];
        let tags = FxHashMap::default();
        if stream == HOST {
            let e = sched.host_tick();
            let host = sched.host_clock().clone();
            return san.operation(HOST, e, &host, &host, &touch, &tags);
        }
        let clock = sched.next_clock(stream);
        let epoch = clock[&stream];
        let result = san.operation(stream, epoch, &clock, &sched.host_clock().clone(), &touch, &tags);
        sched.enqueue(stream, 10, "op", 0, None).unwrap();
        result
    }

    #[test]
    fn events_order_streams_and_races_are_found() {
        let mut sched = Scheduler::new(CostModel::ascend910b());
        let mut s = Sanitizer::new(SanitizerMode::Collect);
        let (a, b) = (sched.create_stream(), sched.create_stream());
        op(&mut s, &mut sched, a, 100, 100, 200, true).unwrap();
        op(&mut s, &mut sched, b, 100, 150, 160, false).unwrap();
        assert_eq!(s.findings().len(), 1);
        assert_eq!(s.findings()[0].kind, FindingKind::Race);
        assert_eq!(s.findings()[0].streams, vec![a, b]);
        let ev = sched.create_event();
        sched.record_event(ev, a).unwrap();
        sched.stream_wait_event(b, ev).unwrap();
        op(&mut s, &mut sched, b, 100, 100, 200, true).unwrap();
        assert_eq!(s.findings().len(), 1, "b's write follows a's write through the event");
        op(&mut s, &mut sched, a, 500, 500, 510, true).unwrap();
        op(&mut s, &mut sched, HOST, 500, 500, 510, false).unwrap();
        assert_eq!(s.findings()[1].kind, FindingKind::PendingWriteRead);
        sched.synchronize_stream(a).unwrap();
        op(&mut s, &mut sched, HOST, 500, 500, 510, false).unwrap();
        assert_eq!(s.findings().len(), 2, "synchronised: no finding");
        let mut r = Sanitizer::new(SanitizerMode::Raise);
        op(&mut r, &mut sched, a, 0, 0, 8, true).unwrap();
        let err = op(&mut r, &mut sched, HOST, 0, 0, 8, true).unwrap_err();
        assert_eq!(err.finding, Some("race"));
        let mut off = Sanitizer::new(SanitizerMode::Off);
        op(&mut off, &mut sched, HOST, 0, 0, 8, true).unwrap();
        assert!(off.findings().is_empty());
    }

    #[test]
    fn an_earlier_access_of_another_range_is_not_forgotten() {
        // Stream a writes [0, 10) then [20, 30): a read of [0, 10) by b still races with the
        // first write (a record per stream and kind would have kept only the second).
        let mut sched = Scheduler::new(CostModel::ascend910b());
        let mut s = Sanitizer::new(SanitizerMode::Collect);
        let (a, b) = (sched.create_stream(), sched.create_stream());
        op(&mut s, &mut sched, a, 0, 0, 10, true).unwrap();
        op(&mut s, &mut sched, a, 0, 20, 30, true).unwrap();
        op(&mut s, &mut sched, b, 0, 0, 10, false).unwrap();
        assert_eq!(s.findings().len(), 1);
        // A later write over the whole range supersedes both (and races with b's read); b,
        // ordered after the first two only, still races with it.
        let ev = sched.create_event();
        sched.record_event(ev, a).unwrap();
        op(&mut s, &mut sched, a, 0, 0, 30, true).unwrap();
        assert_eq!(s.findings().len(), 2);
        sched.stream_wait_event(b, ev).unwrap();
        op(&mut s, &mut sched, b, 0, 5, 6, false).unwrap();
        assert_eq!(s.findings().len(), 3);
        assert_eq!(s.findings()[2].streams, vec![a, b]);
        assert_eq!(s.access[&0][&a].len(), 1, "superseded records are dropped");
    }

    #[test]
    fn findings_are_capped_and_counted() {
        let mut s = Sanitizer::new(SanitizerMode::Collect);
        for i in 0..FINDINGS_LIMIT as u64 + 5 {
            let f = Finding {
                kind: FindingKind::DoubleFree,
                message: String::new(),
                addr: i,
                size: 0,
                allocation: None,
                streams: vec![],
                tag: None,
            };
            s.report(f, false).unwrap();
        }
        assert_eq!(s.findings().len(), FINDINGS_LIMIT);
        assert_eq!(s.counts().get(FindingKind::DoubleFree), FINDINGS_LIMIT as u64 + 5);
        assert_eq!(s.counts().dropped, 5);
        s.clear();
        assert_eq!(s.counts().total(), 0);
    }
}
