//! Stream-ordered frees and their reuse rules (`aclrtMemPoolAttr` / cudaMallocAsync's pool
//! attributes): same stream, event dependencies, opportunistic, internal dependencies, release
//! threshold. On a backend whose runtime has a queue of its own (see `runtime.rs`), a freed block
//! also waits for the runtime's events.
//!
//! Rules:
//! - A freed block goes back to the allocator exactly once: reaped when its streams are done on
//!   the simulated clock and on the runtime (and, without opportunistic reuse, the host has
//!   synchronised with them), or revived by a malloc that follows its free point.
//! - `PendingFrees` keeps each pending free three ways (`frees`, `by_addr`, `same_stream`), all
//!   naming the same blocks.

use super::*;

/// The stream-ordered frees waiting for their streams, kept three ways.
#[derive(Debug, Default)]
pub(super) struct PendingFrees {
    /// The pending frees by start address (for operations completing on their memory).
    pub(super) by_addr: BTreeMap<u64, PendingKey>,
    /// Freed blocks waiting for their streams, by `PendingKey` (ready time, sequence).
    pub(super) frees: BTreeMap<PendingKey, PendingFree>,
    /// Pending frees that their own stream may reuse at once (stream order already puts the
    /// new user after the old one): stream → (granted, ptr) → key in `frees`.
    pub(super) same_stream: FxHashMap<StreamId, BTreeMap<(u64, u64), PendingKey>>,
    /// The sequence number of the next pending free.
    pub(super) seq: u64,
}

/// Who else uses a block beside its own stream.
#[derive(Debug, Default)]
pub(super) struct BlockUses {
    /// Streams besides its own that used a live allocation (`record_stream`).
    pub(super) recorded: FxHashMap<u64, Vec<StreamId>>,
    /// Queued work touching a block (launch arguments, async copies and memsets), by the
    /// block's start: (stream, end of its last such operation). Kept until the block's memory
    /// goes back to the allocator, through a free and a revival.
    pub(super) busy: FxHashMap<u64, Vec<Busy>>,
}

/// A pending free's key: (the time its streams complete, a sequence number).
pub(super) type PendingKey = (u64, u64);

/// A freed block waiting for its streams, and the point (vector clock) its free sits at: work
/// that follows that point may reuse it; `marks` are the runtime events (if any) its streams'
/// work must reach first.
#[derive(Clone, Debug)]
pub(super) struct PendingFree {
    pub(super) allocation: Allocation,
    pub(super) point: Clock,
    pub(super) marks: Vec<crate::stream::runtime::Handle>,
}

/// Queued work touching a block: its stream, when the operation ends on the simulated clock, and
/// the runtime's mark after it (0 without runtime work).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Busy {
    pub(super) stream: StreamId,
    pub(super) end_ns: u64,
    pub(super) mark: crate::stream::runtime::Handle,
}

impl Device {
    /// Serves a malloc on `stream` from a pending free it may safely take without waiting: one
    /// freed on the same stream (stream order runs the new work after the old, as PyTorch's
    /// per-stream pools rely on), or — following event dependencies — one whose free point the
    /// stream already follows through events. The block must be of the same policy, hold the
    /// request and be at most twice its size.
    pub(super) fn reuse_on_stream(
        &mut self,
        size: u64,
        policy: Policy,
        padded: bool,
        stream: StreamId,
    ) -> Result<Option<u64>> {
        if self.pending.frees.is_empty() {
            return Ok(None);
        }
        let booked = booked_size(size, policy, padded)?;
        let fits = |p: &PendingFree| {
            let a = &p.allocation;
            a.granted >= size && a.granted <= size.saturating_mul(2) && a.policy.base() == policy.base()
        };
        let same = self.pending.same_stream.get(&stream).and_then(|index| {
            index.range((size, 0)..).take(8).map(|(_, &key)| key).find(|key| fits(&self.pending.frees[key]))
        });
        let key = match same {
            Some(key) => {
                self.stats.same_stream_reuses += 1;
                key
            }
            None if self.reuse.follow_event_dependencies && !self.pending.frees.is_empty() => {
                let clock = self.sched.next_clock(stream);
                let mut followed = self
                    .pending
                    .frees
                    .iter()
                    .take(64)
                    .filter(|(_, p)| fits(p) && p.point.iter().all(|(&s, &t)| crate::stream::covers(&clock, s, t)))
                    .map(|(&key, p)| (key, (!p.marks.is_empty()).then(|| p.marks.clone()), p.allocation.ptr));
                // The simulated clock orders the stream after the free; on a runtime with a queue
                // the runtime's marks must say the work is done too.
                let key = if self.rt_any_dirty() {
                    let candidates: Vec<_> = followed.collect();
                    candidates
                        .into_iter()
                        .find(|(_, marks, ptr)| self.rt_done(marks.as_deref().unwrap_or(&[])) && self.busy_done(*ptr))
                } else {
                    followed.next()
                };
                let Some((key, _, _)) = key else { return Ok(None) };
                self.stats.event_dependency_reuses += 1;
                key
            }
            None => return Ok(None),
        };
        Ok(Some(self.revive(key, size, booked, policy, stream)))
    }

    /// On out-of-memory: takes the earliest pending block that fits and makes `stream` wait
    /// for its free (an internal dependency).
    pub(super) fn reuse_with_dependency(
        &mut self,
        size: u64,
        policy: Policy,
        padded: bool,
        stream: StreamId,
    ) -> Result<Option<u64>> {
        let booked = booked_size(size, policy, padded)?;
        let found = self
            .pending
            .frees
            .iter()
            .find(|(_, p)| p.allocation.granted >= size && p.allocation.policy.base() == policy.base())
            .map(|(&key, p)| (key, p.point.clone(), p.marks.clone(), p.allocation.ptr));
        let Some((key, point, mut marks, ptr)) = found else { return Ok(None) };
        marks.extend(self.uses.busy.get(&ptr).into_iter().flatten().map(|b| b.mark));
        self.rt_wait_marks(stream, &marks)?;
        self.sched.stream_wait_point(stream, key.0, &point)?;
        self.stats.internal_dependency_reuses += 1;
        Ok(Some(self.revive(key, size, booked, policy, stream)))
    }

    /// Turns the pending free at `key` back into a live allocation of `size` bytes.
    pub(super) fn revive(&mut self, key: PendingKey, size: u64, booked: u64, policy: Policy, stream: StreamId) -> u64 {
        let old = self.take_pending(key);
        // The pool still books the block at the size of the malloc that made it.
        if size != old.size && !self.pool_requested.contains_key(&old.ptr) {
            self.pool_requested.insert(old.ptr, old.size);
        }
        // The block's old work may still be queued: its busy streams and sanitizer records stay
        // with the memory. The new allocation belongs to the stream that asked for it.
        self.record_live(Allocation { size, booked, policy, stream, ..old });
        old.ptr
    }

    /// A free ordered on `stream` when given (as `aclrtMemPoolFreeAsync`: the memory is reusable
    /// once that stream reaches this point, e.g. after it waited on an event recorded behind
    /// the last use), else after the block's own stream and recorded streams.
    pub fn free_on(&mut self, ptr: u64, stream: Option<StreamId>) -> Result<()> {
        // Work that completed lands before its memory can go back.
        self.settle();
        let result = self.free_uncharged(ptr, stream);
        self.charge_driver();
        result
    }

    /// `free_on` without charging the driver calls to the host clock (a batch charges once).
    pub(super) fn free_uncharged(&mut self, ptr: u64, stream: Option<StreamId>) -> Result<()> {
        if ptr == 0 {
            return Err(AclError::invalid_param("free(NULL): pass a pointer returned by malloc"));
        }
        let Some(allocation) = self.live.remove(ptr) else {
            let error = self.bad_pointer(ptr);
            if self.recently_freed.contains(&ptr) {
                let finding = Finding {
                    kind: FindingKind::DoubleFree,
                    message: error.message.clone(),
                    addr: ptr,
                    size: 0,
                    allocation: Some(ptr),
                    streams: vec![],
                    tag: None,
                };
                let _ = self.sanitizer.report(finding, false);
            }
            return Err(error);
        };
        self.free_removed(allocation, stream)
    }

    /// Frees `allocation`, already taken out of the live table (it goes back in on failure).
    ///
    /// The memory goes back to the allocator once the work it waits for is done: the given
    /// stream's (a stream-ordered free), else the block's own stream's and every recorded
    /// stream's — and in any case every queued operation that touches the block (a launch
    /// argument, an async copy or memset), so no queued work ever sees its memory reused.
    #[inline]
    pub(super) fn free_removed(&mut self, allocation: Allocation, stream: Option<StreamId>) -> Result<()> {
        let ptr = allocation.ptr;
        if !self.pins.is_empty() {
            if let Some(e) = self.pinned(ptr) {
                self.live.insert(allocation);
                return Err(e);
            }
        }
        if let Some(Err(e)) = stream.map(|s| self.sched.tail_ns(s)) {
            self.live.insert(allocation);
            return Err(e);
        }
        if self.sanitizer.tracks(ptr) {
            if let Err(e) = self.check_free(&allocation, stream) {
                self.live.insert(allocation);
                return Err(e);
            }
        }
        let now = self.sched.now_ns();
        let uses = if self.uses.recorded.is_empty() {
            &[][..]
        } else {
            self.uses.recorded.get(&ptr).map_or(&[][..], Vec::as_slice)
        };
        let busy =
            if self.uses.busy.is_empty() { &[][..] } else { self.uses.busy.get(&ptr).map_or(&[][..], Vec::as_slice) };
        let busy_until = busy.iter().map(|b| b.end_ns).max().unwrap_or(0);
        let own_stream_only = uses.is_empty()
            && stream.is_none_or(|s| s == allocation.stream)
            && busy.iter().all(|b| b.stream == allocation.stream || b.end_ns <= now);
        // The free's point: after the given stream's work so far, or after the block's own
        // stream's and every recorded stream's; never before the work that touches it.
        let ready = match stream {
            Some(s) => self.sched.tail_or_now(s),
            None => uses
                .iter()
                .map(|&s| self.sched.tail_or_now(s))
                .fold(self.sched.tail_or_now(allocation.stream), u64::max),
        }
        .max(busy_until);
        // The free's point (a vector clock) matters only to a deferred free.
        let point = (ready > now).then(|| {
            let mut point = match stream {
                Some(s) => self.sched.clock(s).clone(),
                None => {
                    let mut point = self.sched.clock(allocation.stream).clone();
                    for &s in uses {
                        crate::stream::join(&mut point, self.sched.clock(s));
                    }
                    point
                }
            };
            for b in busy {
                if b.end_ns > now {
                    crate::stream::join(&mut point, self.sched.clock(b.stream));
                }
            }
            point
        });
        // On a runtime with a queue of its own, the work the free waits for is also marked there:
        // the block comes back once the runtime's events say so (and the simulated clock agrees).
        let marks = if self.rt_any_dirty() { self.free_marks(&allocation, stream) } else { Ok(Vec::new()) };
        let marks = match marks {
            Ok(m) => m,
            Err(e) => {
                self.live.insert(allocation);
                return Err(e);
            }
        };
        let completed = ready <= now && self.rt_done(&marks) && self.busy_done(ptr);
        if completed {
            let block = self.granted_of(&allocation);
            if let Err(e) = self.allocator.free(self.backend.as_mut(), &block) {
                self.rt_release(&marks);
                self.live.insert(allocation);
                return Err(e);
            }
            self.rt_release(&marks);
        }
        self.forget_freed(&allocation, completed);
        if !completed {
            self.pending.seq += 1;
            let key = (ready, self.pending.seq);
            let point = point.unwrap_or_else(|| self.sched.clock(allocation.stream).clone());
            self.pending.frees.insert(key, PendingFree { allocation, point, marks });
            self.pending.by_addr.insert(ptr, key);
            if own_stream_only {
                self.pending.same_stream.entry(allocation.stream).or_default().insert((allocation.granted, ptr), key);
            }
            self.stats.deferred_frees += 1;
            self.stats.pending_frees += 1;
        }
        Ok(())
    }

    /// The sanitizer's check of a free: another stream's access that the free is not ordered
    /// after (and does not wait for) is a use-after-free hazard.
    #[cold]
    pub(super) fn check_free(&mut self, allocation: &Allocation, stream: Option<StreamId>) -> Result<()> {
        let (actor, clock, waited) = match stream {
            Some(s) => (s, self.sched.next_clock(s), vec![s]),
            None => {
                let mut waited = vec![allocation.stream];
                waited.extend(self.uses.recorded.get(&allocation.ptr).into_iter().flatten().copied());
                (HOST, self.sched.host_clock().clone(), waited)
            }
        };
        let tag = self.tags.get(&allocation.ptr);
        self.sanitizer.check_free(allocation.ptr, allocation.size, actor, &clock, &waited, tag)
    }

    /// The runtime marks a free waits for: the given stream's, or the block's own and recorded
    /// streams' (each only while it has runtime work that may be incomplete).
    fn free_marks(
        &mut self,
        allocation: &Allocation,
        stream: Option<StreamId>,
    ) -> Result<Vec<crate::stream::runtime::Handle>> {
        let waited: Vec<StreamId> = match stream {
            Some(s) => vec![s],
            None => std::iter::once(allocation.stream)
                .chain(self.uses.recorded.get(&allocation.ptr).into_iter().flatten().copied())
                .collect(),
        };
        let mut marks = Vec::with_capacity(waited.len());
        for s in waited {
            match self.rt_mark(s) {
                Ok(0) => {}
                Ok(m) => marks.push(m),
                Err(e) => {
                    self.rt_release(&marks);
                    return Err(e);
                }
            }
        }
        Ok(marks)
    }

    /// Whether the runtime work that touches the block at `ptr` is complete.
    #[inline]
    fn busy_done(&mut self, ptr: u64) -> bool {
        if self.uses.busy.is_empty() {
            return true;
        }
        let marks: Vec<_> =
            self.uses.busy.get(&ptr).into_iter().flatten().map(|b| b.mark).filter(|&m| m != 0).collect();
        self.rt_done(&marks)
    }

    /// The device's side of a free whose memory went back to the allocator (`completed`) or is
    /// queued: drop the pointer's recorded streams and tag (and, once the memory is back, its
    /// busy streams and sanitizer records), trace the request (and completion), remember the
    /// pointer for double-free reports and count it.
    #[inline(always)]
    pub(super) fn forget_freed(&mut self, allocation: &Allocation, completed: bool) {
        self.untrack(allocation, completed);
        self.stats.on_frees(Tally { blocks: 1, bytes: allocation.granted, requested: allocation.size });
    }

    /// `forget_freed` less the counters (a batch counts once).
    #[inline(always)]
    pub(super) fn untrack(&mut self, allocation: &Allocation, completed: bool) {
        let ptr = allocation.ptr;
        self.untrack_ptr(ptr, completed);
        self.trace(Action::FreeRequested, ptr, allocation.granted, allocation.stream);
        if completed {
            self.trace(Action::FreeCompleted, ptr, allocation.granted, allocation.stream);
        }
    }

    /// `untrack` less the trace entries (what needs only the pointer): a batch calls it alone
    /// while no trace is recorded.
    #[inline(always)]
    pub(super) fn untrack_ptr(&mut self, ptr: u64, completed: bool) {
        if !self.uses.recorded.is_empty() {
            self.uses.recorded.remove(&ptr);
        }
        if !self.tags.is_empty() {
            self.tags.remove(&ptr);
        }
        if completed {
            self.forget_memory(ptr);
        }
        self.recently_freed.push(ptr);
    }

    /// Whether `untrack_ptr` of a completed free only notes the pointer in the ring: no
    /// recorded streams, tags, queued work or sanitizer records on any block.
    #[inline(always)]
    pub(super) fn untracks_nothing(&self) -> bool {
        self.uses.recorded.is_empty()
            && self.tags.is_empty()
            && self.uses.busy.is_empty()
            && self.pool_requested.is_empty()
            && self.sanitizer.tracks_none()
    }

    /// Drops what the device knows of the memory at `ptr` once it is back with the allocator:
    /// the streams that kept it busy, the sanitizer's access records and the pool's request of
    /// a revived block.
    #[inline(always)]
    fn forget_memory(&mut self, ptr: u64) {
        if !self.pool_requested.is_empty() {
            self.pool_requested.remove(&ptr);
        }
        if !self.uses.busy.is_empty() {
            if let Some(entries) = self.uses.busy.remove(&ptr) {
                let marks: Vec<_> = entries.iter().map(|b| b.mark).collect();
                self.rt_release(&marks);
            }
        }
        self.sanitizer.forget(ptr);
    }

    /// Takes the pending free at `key` out of the pending tables (its marks released).
    fn take_pending(&mut self, key: PendingKey) -> Allocation {
        let PendingFree { allocation: a, marks, .. } = self.pending.frees.remove(&key).expect("pending free");
        self.rt_release(&marks);
        self.pending.by_addr.remove(&a.ptr);
        if let Some(index) = self.pending.same_stream.get_mut(&a.stream) {
            index.remove(&(a.granted, a.ptr));
        }
        self.stats.pending_frees -= 1;
        a
    }

    /// Notes that the operation on `stream` ending at `end_ns` touches the device allocations
    /// holding `addrs`: their memory stays busy until then, whatever frees them.
    pub(super) fn note_busy(&mut self, stream: StreamId, end_ns: u64, addrs: &[u64]) {
        for &addr in addrs {
            let Some(base) = self.containing(addr).map(|a| a.ptr) else { continue };
            // After runtime work, a mark of its own (the latest op of a stream replaces the mark of
            // the one before, whose work it follows).
            let mark = self.rt_op_mark(stream);
            let entries = self.uses.busy.entry(base).or_default();
            let old = match entries.iter_mut().find(|b| b.stream == stream) {
                Some(b) => {
                    b.end_ns = b.end_ns.max(end_ns);
                    std::mem::replace(&mut b.mark, mark)
                }
                None => {
                    entries.push(Busy { stream, end_ns, mark });
                    0
                }
            };
            self.rt_release(&[old]);
        }
    }

    /// Whether `[addr, addr + len)` lies in a freed block still waiting for its work: that work
    /// (ordered before the free) may still read and write it.
    pub(super) fn in_pending_free(&self, addr: u64, len: u64) -> bool {
        self.pending.by_addr.range(..=addr).next_back().is_some_and(|(_, key)| {
            let a = &self.pending.frees[key].allocation;
            addr.checked_add(len).is_some_and(|end| end <= a.ptr + a.size)
        })
    }

    /// `record_stream`: `stream` also uses the allocation at `ptr`; its free waits for that
    /// stream's work too.
    pub fn record_stream(&mut self, ptr: u64, stream: StreamId) -> Result<()> {
        self.sched.tail_ns(stream)?;
        let Some(allocation) = self.live.get(ptr) else {
            return Err(AclError::rt_param(format!("{ptr:#x} is not a live allocation; record_stream needs one")));
        };
        let uses = self.uses.recorded.entry(ptr).or_default();
        if stream != allocation.stream && !uses.contains(&stream) {
            uses.push(stream);
        }
        Ok(())
    }

    /// Returns to the allocator the freed blocks whose streams have completed, in order of
    /// completion (a stream that is still busy holds back only its own frees). Without
    /// opportunistic reuse a completed free also waits until the host has synchronised with it.
    pub(super) fn reap(&mut self) {
        if self.pending.frees.is_empty() {
            return;
        }
        let now = self.sched.now_ns();
        let opportunistic = self.reuse.allow_opportunistic;
        let host = self.sched.host_clock();
        let mut due: Vec<PendingKey> = self
            .pending
            .frees
            .range(..=(now, u64::MAX))
            .filter(|(_, p)| opportunistic || p.point.iter().all(|(&s, &t)| crate::stream::covers(host, s, t)))
            .map(|(&k, _)| k)
            .collect();
        // And, on a runtime with a queue, once the runtime says the work is done.
        if self.rt_any_dirty() || self.pending.frees.values().any(|p| !p.marks.is_empty()) {
            due.retain(|k| {
                let (marks, ptr) = (self.pending.frees[k].marks.clone(), self.pending.frees[k].allocation.ptr);
                self.rt_done(&marks) && self.busy_done(ptr)
            });
        }
        for key in due {
            let block = self.granted_of(&self.pending.frees[&key].allocation);
            if self.allocator.free(self.backend.as_mut(), &block).is_err() {
                // The driver failed: the block stays pending (the next settle tries again).
                continue;
            }
            let a = self.take_pending(key);
            self.forget_memory(a.ptr);
            self.trace(Action::FreeCompleted, a.ptr, a.granted, a.stream);
        }
    }

    /// The stream-ordered reuse rules in force.
    pub fn reuse_policy(&self) -> ReusePolicy {
        self.reuse
    }

    pub fn set_reuse_policy(&mut self, policy: ReusePolicy) {
        self.reuse = policy;
    }

    /// After the host synchronises: give back cached memory above the release threshold.
    pub(super) fn apply_release_threshold(&mut self) {
        let threshold = self.reuse.release_threshold;
        if threshold != u64::MAX && self.allocator.books().reserved() > threshold {
            let _ = self.allocator.trim_to(self.backend.as_mut(), threshold);
            self.flush_events(DEFAULT_STREAM);
        }
    }
}
