//! `Sanitizer`: the device's memory sanitizer, cheap enough to leave on.
//!
//! Ordering comes from the scheduler's vector clocks (advanced by enqueueing, `record_event`,
//! `stream_wait_event` and the `synchronize_*` calls). Each allocation remembers, per stream,
//! its last read and last write (epoch and byte range). An
//! access races with an earlier one by another stream (or the host) when their ranges overlap,
//! one of them writes, and the earlier one's epoch is not covered by the accessor's clock: no
//! event or synchronisation orders them. Host reads of memory with such a write still pending
//! are reported as `pending_write_read`. Findings are also made for the errors the device
//! refuses (use after free, double free, out of bounds) and for copies whose kind contradicts
//! their addresses (a warning: the runtime ignores the kind).
//!
//! Invariants: access records are dropped when their allocation is freed; a refused operation
//! leaves none; with the mode off nothing is tracked.

use rustc_hash::FxHashMap;

use crate::error::{AclError, ErrorCode, Result};
use crate::stream::{Clock, StreamId, covers};

/// The host's pseudo stream id in reports and clocks.
pub use crate::stream::HOST_CLOCK as HOST;

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
    /// The allocation's site tag (given at malloc), when it has one.
    pub tag: Option<String>,
}

#[derive(Clone, Copy, Debug)]
struct Access {
    epoch: u64,
    lo: u64,
    hi: u64,
}

#[derive(Debug, Default)]
struct Accesses {
    reads: FxHashMap<StreamId, Access>,
    writes: FxHashMap<StreamId, Access>,
}

#[derive(Debug)]
pub struct Sanitizer {
    pub mode: SanitizerMode,
    findings: Vec<Finding>,
    access: FxHashMap<u64, Accesses>,
}

impl Sanitizer {
    pub fn new(mode: SanitizerMode) -> Self {
        Sanitizer { mode, findings: Vec::new(), access: FxHashMap::default() }
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

    /// Tags the findings from index `from` on that concern `allocation` and have no tag yet.
    pub fn tag_since(&mut self, from: usize, allocation: u64, tag: &str) {
        for f in self.findings.iter_mut().skip(from) {
            if f.tag.is_none() && f.allocation == Some(allocation) {
                f.tag = Some(tag.to_string());
            }
        }
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

    /// Checks an access to `[lo, hi)` of the allocation starting at `base` by operation `epoch`
    /// of `stream` (or by the host, `HOST`), whose vector clock is `clock`, then records it.
    #[allow(clippy::too_many_arguments)]
    pub fn access(
        &mut self,
        stream: StreamId,
        epoch: u64,
        clock: &Clock,
        base: u64,
        lo: u64,
        hi: u64,
        write: bool,
    ) -> Result<()> {
        if !self.enabled() || lo >= hi {
            return Ok(());
        }
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
        let finding = Finding {
            kind,
            message,
            addr: lo,
            size: hi - lo,
            allocation: Some(base),
            streams: vec![other, stream],
            tag: None,
        };
        self.report(finding, true)
    }

    /// Forgets the accesses of a freed allocation.
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
        if stream == HOST {
            let e = sched.host_tick();
            return san.access(HOST, e, sched.host_clock(), base, lo, hi, write);
        }
        let clock = sched.next_clock(stream);
        let epoch = clock[&stream];
        let result = san.access(stream, epoch, &clock, base, lo, hi, write);
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
}
