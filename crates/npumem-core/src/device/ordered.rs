//! Streams on the device: async copies, memsets and kernels on the simulated clock, events,
//! synchronisation and the sanitizer. On a backend whose runtime has a queue of its own (see
//! `runtime.rs`), async copies and memsets run on the runtime's streams; kernels (`launch`) are
//! the simulated clock's on every backend.
//!
//! Rules:
//! - A data effect is applied once, after its operation completes on the host clock (the
//!   simulated clock's effects only: a runtime moves its own bytes).
//! - Every host synchronisation (`synchronize_stream`, `_event`, `_device`) settles (applies
//!   the due effects, reaps the pending frees that are done: `pending.rs`), then applies the
//!   release threshold.

use super::*;

impl Device {
    /// `aclrtMemcpyAsync`: queues the copy on `stream`. Host memory here is pinned (`malloc_host`),
    /// so the call returns at once and the bytes land when the copy completes on the device
    /// clock; the ranges must stay valid until then. Returns (start, end) on the device clock.
    pub fn memcpy_async(
        &mut self,
        dst: u64,
        dst_max: u64,
        src: u64,
        count: u64,
        kind: u32,
        stream: StreamId,
    ) -> Result<(u64, u64)> {
        self.settle();
        self.sched.tail_ns(stream)?;
        let Some((dst_side, src_side)) = self.check_copy(dst, dst_max, src, count, kind)? else {
            return self.sched.enqueue(stream, 0, "memcpy", 0, None);
        };
        let ns = self.sched.cost.copy_ns(count, src_side == Side::Device, dst_side == Side::Device, true);
        let label = match (src_side, dst_side) {
            (Side::Host, Side::Device) => "copy H2D",
            (Side::Device, Side::Host) => "copy D2H",
            (Side::Device, Side::Device) => "copy D2D",
            (Side::Host, Side::Host) => "copy H2H",
        };
        // Checked before the sanitizer records the accesses of an operation that may not run.
        self.sched.plan_enqueue(stream, ns, label)?;
        let clock = self.sched.next_clock(stream);
        self.stream_op(stream, &clock, &[(src, count, false), (dst, count, true)])?;
        // A runtime with a queue runs the copy itself; else the bytes move on the simulated clock.
        let queued = self.rt_queue(stream, |rt, handle| rt.memcpy_async(dst, src, count, handle))?;
        let effect = (!queued).then_some(Effect::Copy { dst, src, count });
        let span = self.sched.enqueue(stream, ns, label, count, effect)?;
        self.note_busy(stream, span.1, &[src, dst]);
        Ok(span)
    }

    /// `aclrtMemsetAsync`: queues a byte fill on `stream`.
    pub fn memset_async(
        &mut self,
        ptr: u64,
        dst_max: u64,
        value: i32,
        count: u64,
        stream: StreamId,
    ) -> Result<(u64, u64)> {
        self.settle();
        if count > dst_max {
            return Err(AclError::rt_param(format!(
                "count {count} is larger than dst_max {dst_max}; the memset would overflow the destination"
            )));
        }
        self.sched.tail_ns(stream)?;
        if count > 0 {
            self.side(ptr, count, "destination")?;
        }
        let ns = self.sched.cost.fill_ns(count);
        self.sched.plan_enqueue(stream, ns, "memset")?;
        let clock = self.sched.next_clock(stream);
        self.stream_op(stream, &clock, &[(ptr, count, true)])?;
        let queued =
            count > 0 && self.rt_queue(stream, |rt, handle| rt.memset_async(ptr, value as u8, count, handle))?;
        let effect = (count > 0 && !queued).then_some(Effect::Fill { dst: ptr, value: value as u8, count });
        let span = self.sched.enqueue(stream, ns, "memset", count, effect)?;
        if count > 0 {
            self.note_busy(stream, span.1, &[ptr]);
        }
        Ok(span)
    }

    /// Queues a kernel that runs for `duration_ns` on `stream`, touching the allocations at
    /// `reads` and `writes` (checked to be live; their bytes are left as they are).
    pub fn launch(&mut self, stream: StreamId, duration_ns: u64, reads: &[u64], writes: &[u64]) -> Result<(u64, u64)> {
        self.settle();
        self.sched.tail_ns(stream)?;
        for &p in reads.iter().chain(writes) {
            self.side(p, 1, "kernel argument")?;
        }
        // A kernel argument stands for the whole allocation it points into; an allocation both
        // read and written counts once, as written.
        let clock = self.sched.next_clock(stream);
        let mut touched: BTreeMap<(u64, u64), bool> = BTreeMap::new();
        for (&p, write) in reads.iter().map(|p| (p, false)).chain(writes.iter().map(|p| (p, true))) {
            let range = self.containing(p).map_or((p, 1), |a| (a.ptr, a.size));
            *touched.entry(range).or_default() |= write;
        }
        let accesses: Vec<(u64, u64, bool)> = touched.into_iter().map(|((base, len), w)| (base, len, w)).collect();
        self.sched.plan_enqueue(stream, duration_ns, "kernel")?;
        self.stream_op(stream, &clock, &accesses)?;
        let span = self.sched.enqueue(stream, duration_ns, "kernel", 0, None)?;
        let bases: Vec<u64> = accesses.iter().map(|&(base, _, _)| base).collect();
        self.note_busy(stream, span.1, &bases);
        Ok(span)
    }

    /// Applies the data effects of async work that has completed on the host clock. An effect
    /// whose memory was freed meanwhile is dropped and counted in `lost_effects`.
    #[inline(always)]
    pub(super) fn settle(&mut self) {
        if self.sched.has_due() {
            self.reap_effects();
        }
        // Only reaping frees memory here; every other call charges its own driver calls.
        if !self.pending.frees.is_empty() {
            self.reap();
            self.charge_driver();
        }
    }

    pub(super) fn reap_effects(&mut self) {
        for effect in self.sched.take_due() {
            let applied = match effect {
                Effect::Copy { dst, src, count } => {
                    match (self.effect_side(dst, count), self.effect_side(src, count)) {
                        (Some(d), Some(s)) => self.move_bytes(dst, d, src, s, count).is_ok(),
                        _ => false,
                    }
                }
                Effect::Fill { dst, value, count } => {
                    self.effect_side(dst, count).is_some_and(|side| self.fill_bytes(dst, side, value, count).is_ok())
                }
            };
            if !applied {
                // The memory is gone without waiting for this work (`free_host` drops the
                // effects on its block itself, and counts them there): the free was the hazard,
                // and reported.
                self.stats.lost_effects += 1;
            }
        }
    }

    /// Where the memory a completing operation touches lives: a live allocation or host block,
    /// or a freed block still waiting for that work.
    fn effect_side(&mut self, addr: u64, len: u64) -> Option<Side> {
        match self.classify(addr, len, "") {
            Ok(side) => Some(side),
            Err(_) => self.in_pending_free(addr, len).then_some(Side::Device),
        }
    }

    /// The scheduler: streams, events and the clocks.
    pub fn scheduler(&mut self) -> &mut Scheduler {
        &mut self.sched
    }

    /// Blocks the host until `stream`'s work is done (on the runtime too), then applies its
    /// effects.
    pub fn synchronize_stream(&mut self, stream: StreamId) -> Result<()> {
        self.sched.tail_ns(stream)?;
        self.rt_synchronize_stream(stream)?;
        self.sched.synchronize_stream(stream)?;
        self.settle();
        self.apply_release_threshold();
        Ok(())
    }

    pub fn synchronize_event(&mut self, event: EventId) -> Result<()> {
        self.sched.event_time(event).or_else(|e| if self.sched.has_event(event) { Ok(0) } else { Err(e) })?;
        let handle = self.rt_event(event);
        if handle != 0 {
            self.backend.streams().synchronize_event(handle)?;
        }
        self.sched.synchronize_event(event)?;
        self.settle();
        self.apply_release_threshold();
        Ok(())
    }

    /// Blocks the host until every stream's work is done (on the runtime too).
    pub fn synchronize_device(&mut self) -> Result<()> {
        self.rt_synchronize_device()?;
        self.sched.synchronize_device();
        self.settle();
        self.apply_release_threshold();
        Ok(())
    }

    /// `aclrtRecordEvent`: the event completes when `stream`'s work queued so far has.
    pub fn record_event(&mut self, event: EventId, stream: StreamId) -> Result<()> {
        self.sched.tail_ns(stream)?;
        if !self.sched.has_event(event) {
            return self.sched.record_event(event, stream); // the error naming the event
        }
        let (e, s) = (self.rt_event(event), self.rt_stream(stream));
        if e != 0 {
            self.backend.streams().record_event(e, s)?;
        }
        self.sched.record_event(event, stream)
    }

    /// `aclrtStreamWaitEvent`: `stream`'s later work starts after `event` completes.
    pub fn stream_wait_event(&mut self, stream: StreamId, event: EventId) -> Result<()> {
        self.sched.tail_ns(stream)?;
        if !self.sched.has_event(event) {
            return self.sched.stream_wait_event(stream, event);
        }
        let e = self.rt_event(event);
        if e != 0 {
            let s = self.rt_stream(stream);
            self.backend.streams().stream_wait_event(s, e)?;
            // Its later work now follows the event's: treat it as busy until synchronised.
            self.rt.dirty.insert(stream);
        }
        self.sched.stream_wait_event(stream, event)
    }

    /// Whether the sanitizer checks accesses (a mode other than off): allocation tags only
    /// matter to its findings.
    pub fn sanitizing(&self) -> bool {
        self.sanitizer.enabled()
    }

    /// The sanitizer's findings so far.
    pub fn sanitizer_reports(&self) -> &[Finding] {
        self.sanitizer.findings()
    }

    /// Every finding since the last clear, by kind (the reports keep the first
    /// `sanitizer::FINDINGS_LIMIT`).
    pub fn sanitizer_counts(&self) -> crate::sanitizer::FindingCounts {
        self.sanitizer.counts()
    }

    pub fn clear_sanitizer_reports(&mut self) {
        self.sanitizer.clear();
    }

    pub fn set_sanitizer(&mut self, mode: SanitizerMode) {
        self.sanitizer.mode = mode;
    }

    /// What is still held: live allocations, live host blocks, streams besides the default one
    /// and events not destroyed.
    pub fn leak_report(&self) -> (Vec<Allocation>, usize, Vec<StreamId>, Vec<EventId>) {
        let streams = self.sched.stream_ids().into_iter().filter(|&s| s != DEFAULT_STREAM).collect();
        (self.live.sorted(), self.host.live_count(), streams, self.sched.event_ids())
    }

    /// Whether the event has completed (on the host clock, and on the runtime).
    pub fn query_event(&mut self, event: EventId) -> Result<bool> {
        self.settle();
        let done = self.sched.query_event(event)?;
        let handle = self.rt_event(event);
        Ok(done && (handle == 0 || self.backend.streams().query_event(handle)?))
    }

    /// `aclrtEventElapsedTime`: milliseconds between two recorded events.
    pub fn event_elapsed_time(&mut self, start: EventId, end: EventId) -> Result<f64> {
        let (a, b) = (self.sched.event_time(start)?, self.sched.event_time(end)?);
        Ok((b as f64 - a as f64) / 1e6)
    }
}
