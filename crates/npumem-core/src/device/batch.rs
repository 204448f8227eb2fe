//! Batch operations: many mallocs or frees in one call, and whole alloc/free traces replayed in
//! Rust, so a Python caller crosses the binding once per batch instead of once per block.
//!
//! Invariants: a batch is all or nothing — a failed `malloc_many` frees what it allocated, and
//! `free_many` checks every pointer before freeing any; a replay returns the allocations it still
//! holds (or frees them when it stops on an error).

use super::*;

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
    /// Allocates one block per size on `stream`; on any failure, frees the blocks this call made
    /// and returns the error (naming the failing index).
    pub fn malloc_many(&mut self, sizes: &[u64], policy: Policy, stream: StreamId) -> Result<Vec<u64>> {
        self.sched.tail_ns(stream)?;
        // Every size is checked before anything is allocated: a bad one changes nothing.
        if let Some((i, e)) =
            sizes.iter().enumerate().find_map(|(i, &s)| booked_size(s, policy, true).err().map(|e| (i, e)))
        {
            return Err(AclError::new(e.code, format!("malloc_many: size #{i} ({}): {}", sizes[i], e.message)));
        }
        self.settle();
        let mut ptrs = Vec::with_capacity(sizes.len());
        let mut grants = Vec::with_capacity(sizes.len());
        let mut failed = None;
        let mut i = 0;
        while i < sizes.len() {
            // While no free is pending (stream-ordered reuse comes first), the allocator serves
            // what its front cache can in one call; the request it stops at goes through the
            // full rules (search, release-and-retry on out-of-memory).
            if self.pending_frees.is_empty() {
                let served = self.allocator.malloc_cached(&sizes[i..], policy, &mut grants);
                let mut tally = Tally::default();
                for (grant, &size) in grants.drain(..).zip(&sizes[i..i + served]) {
                    // Checked above: the booking cannot fail here (and an error would strand
                    // the blocks already recorded).
                    let booked = booked_size(size, policy, true).unwrap_or(size);
                    let a = self.allocation_of(grant, size, booked, policy, stream);
                    self.live.insert(a);
                    self.trace(Action::Alloc, a.ptr, a.granted);
                    tally.add(a.granted, a.size);
                    ptrs.push(a.ptr);
                }
                self.stats.on_mallocs(tally);
                i += served;
                if i == sizes.len() {
                    break;
                }
            }
            let size = sizes[i];
            match self.malloc_settled(size, policy, true, stream) {
                Ok(p) => ptrs.push(p),
                Err(e) => {
                    failed = Some(AclError::new(e.code, format!("malloc_many: size #{i} ({size}): {}", e.message)));
                    break;
                }
            }
            i += 1;
        }
        let undone = match failed {
            Some(mut e) => {
                // Undo: every block this call made is freed (a free the driver fails is tried
                // once more); one that still cannot be freed stays live, and the error says so.
                let stuck: Vec<u64> = ptrs
                    .drain(..)
                    .filter(|&p| self.free_uncharged(p, None).is_err() && self.free_uncharged(p, None).is_err())
                    .collect();
                if !stuck.is_empty() {
                    let list: Vec<String> = stuck.iter().map(|p| format!("{p:#x}")).collect();
                    e.message += &format!(
                        "; undoing the batch, the driver failed to free {}, which stay live: free them later",
                        list.join(", ")
                    );
                }
                Err(e)
            }
            None => Ok(()),
        };
        self.charge_driver();
        undone.map(|()| ptrs)
    }

    /// Frees every pointer, after checking that all are live and distinct (nothing is freed when
    /// one is not): the pointers are taken out of the live table first (a pointer that is not
    /// live, or appears twice, puts the ones taken back), then freed. Should the driver fail part
    /// way (nothing else can), the pointers not yet freed stay live.
    pub fn free_many(&mut self, ptrs: &[u64]) -> Result<()> {
        self.settle();
        // Taken out of the live table and sorted on the way: frees that complete now (no
        // recorded stream, the block's stream idle) go to the allocator's batch path; the
        // others follow the stream rules one by one.
        let now = self.sched.now_ns();
        let mut last: Option<(StreamId, bool)> = None;
        let (mut at_once, mut ordered) = (Vec::with_capacity(ptrs.len()), Vec::new());
        for (i, &p) in ptrs.iter().enumerate() {
            let pinned = if self.pins.is_empty() { None } else { self.pinned(p) };
            let taken = if pinned.is_some() { None } else { self.live.remove(p) };
            let Some(a) = taken else {
                let twice = at_once.iter().chain(&ordered).any(|a: &Allocation| a.ptr == p);
                at_once.drain(..).chain(ordered).for_each(|a| self.live.insert(a));
                let why = match pinned {
                    Some(e) => e.message,
                    None if twice => "appears twice in the batch".to_string(),
                    None => self.bad_pointer(p).message,
                };
                return Err(AclError::bad_free(format!("free_many: pointer #{i} ({p:#x}): {why}; nothing was freed")));
            };
            let idle = match last {
                Some((s, idle)) if s == a.stream => idle,
                _ => {
                    let idle = self.sched.tail_ns(a.stream).is_ok_and(|t| t <= now);
                    last = Some((a.stream, idle));
                    idle
                }
            };
            let plain = (self.stream_uses.is_empty() || !self.stream_uses.contains_key(&p))
                && (self.busy.is_empty() || !self.busy.contains_key(&p))
                && !self.sanitizer.tracks(p);
            if idle && plain {
                at_once.push(a);
            } else {
                ordered.push(a);
            }
        }
        // Raise mode refuses the whole batch if one of its frees is a hazard.
        if self.sanitizer.mode == SanitizerMode::Raise {
            let hazard = ordered.iter().find_map(|a| self.check_free(a, None).err());
            if let Some(e) = hazard {
                at_once.into_iter().chain(ordered).for_each(|a| self.live.insert(a));
                return Err(e);
            }
        }
        // In the common case every pointer frees at once, in the caller's order.
        let own: Vec<u64>;
        let immediate = if ordered.is_empty() {
            ptrs
        } else {
            own = at_once.iter().map(|a| a.ptr).collect();
            &own
        };
        let mut done = 0;
        let mut result = Ok(());
        while done < immediate.len() {
            done += self.allocator.free_cached(&immediate[done..]);
            if done < immediate.len() {
                if let Err(e) = self.allocator.free(self.backend.as_mut(), immediate[done]) {
                    result = Err(e);
                    break;
                }
                done += 1;
            }
        }
        let mut tally = Tally::default();
        for a in &at_once[..done] {
            self.untrack(a, true);
            tally.add(a.granted, a.size);
        }
        self.stats.on_frees(tally);
        let mut ordered = ordered.into_iter();
        if result.is_ok() {
            for a in ordered.by_ref() {
                result = self.free_removed(a, None);
                if result.is_err() {
                    break;
                }
            }
        }
        // After an internal error, what was not freed stays live.
        at_once.drain(done..).chain(ordered).for_each(|a| self.live.insert(a));
        self.charge_driver();
        result
    }

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
        let mut live: FxHashMap<u64, (u64, u64)> = FxHashMap::default();
        let mut out = ReplayOutcome::default();
        let mut live_bytes = 0u64;
        let mut result = Ok(());
        for (n, &(is_alloc, id, size)) in events.iter().enumerate() {
            if is_alloc {
                out.allocs += 1;
                match self.malloc(size, policy) {
                    Ok(p) => {
                        if live.insert(id, (p, size)).is_some() {
                            result = Err(AclError::invalid_param(format!("event {n}: id {id} allocated twice")));
                            break;
                        }
                        live_bytes += size;
                        out.peak_live = out.peak_live.max(live_bytes);
                    }
                    Err(e) if e.code.is_out_of_memory() => {
                        out.ooms += 1;
                        out.first_oom.get_or_insert(e.message);
                        if stop_on_oom {
                            break;
                        }
                    }
                    Err(e) => {
                        result = Err(e);
                        break;
                    }
                }
            } else if let Some((p, size)) = live.remove(&id) {
                live_bytes -= size;
                if let Err(e) = self.free(p) {
                    result = Err(e);
                    break;
                }
            }
        }
        match result {
            Ok(()) => {
                out.leftover = live.into_values().map(|(p, _)| p).collect();
                Ok(out)
            }
            Err(e) => {
                for (p, _) in live.into_values() {
                    self.free(p)?;
                }
                Err(e)
            }
        }
    }
}
