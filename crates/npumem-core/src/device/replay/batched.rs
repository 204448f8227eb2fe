//! The replay's runs of allocs and frees through the batch paths (`malloc_run`, `free_now`),
//! and the plain runs that hold blocks unpublished one by one.
//!
//! Rules:
//! - A plain run comes here only when the device is settled for it (`settled_for_mallocs`,
//!   `settled_for_frees`), and a batch run only when it holds at least `RUN` events.
//! - Each returns how many events it served; the caller replays the rest one by one.

use super::*;

impl Device {
    /// A run of at least `RUN` frees of `replay_frees` (`ids` from the run's next event, the
    /// device quiet and the run's stream idle) through `free_now`, as far as its blocks complete
    /// at once: how many events it replayed (kept out of line: short runs do not come here).
    #[inline(never)]
    pub(super) fn replay_free_batch(&mut self, replay: &mut Replay, ids: &[u64]) -> Result<usize> {
        let mut ptrs = std::mem::take(&mut replay.ptrs);
        let mut allocs = std::mem::take(&mut replay.allocs);
        let mut at = std::mem::take(&mut replay.at);
        ptrs.clear();
        allocs.clear();
        at.clear();
        let mut last = None;
        let mut tally = Tally::default();
        let mut taken = 0;
        // One pass: each id is cleared as it is read (and put back if its block stays
        // live: here, or below if its free does not happen); `at` keeps its event.
        while taken < ids.len() {
            let v = replay.ids.take(ids[taken]);
            if v != 0 {
                let held = held_index(v);
                let taken_a = match held {
                    Some(i) => Some(replay.held[i].a),
                    None => self.live.remove(v),
                };
                let Some(a) = taken_a else {
                    replay.ids.set(ids[taken], v);
                    break;
                };
                let p = a.ptr;
                let idle = self.idle_memo(&mut last, a.stream);
                if !idle || self.sanitizer.tracks(p) {
                    if held.is_none() {
                        self.live.insert(a);
                    }
                    replay.ids.set(ids[taken], v);
                    break;
                }
                if let Some(i) = held {
                    replay.release(i);
                }
                replay.live_bytes -= a.size;
                tally.add(a.granted, a.size);
                ptrs.push(p);
                allocs.push(a);
                at.push(taken);
            }
            taken += 1;
        }
        let (done, result) = self.free_now(&ptrs, &allocs, tally);
        // The blocks not freed (after a driver error) are live again, with their ids.
        for (a, &j) in allocs[done..].iter().zip(&at[done..]) {
            self.live.insert(*a);
            replay.ids.set(ids[j], a.ptr);
            replay.live_bytes += a.size;
        }
        self.charge_driver();
        let failed_at = at.get(done).copied();
        replay.ptrs = ptrs;
        replay.allocs = allocs;
        replay.at = at;
        if let Err(e) = result {
            // The failing free is the first block not freed.
            let j = failed_at.unwrap_or(0);
            replay.events += (j + 1) as u64;
            return Err(AclError::new(e.code, format!("event {}: {}", replay.events - 1, e.message)));
        }
        replay.events += taken as u64;
        Ok(taken)
    }

    /// Whether a run of frees (on `stream`, None: each block's own) can go through
    /// `replay_plain_frees`: `quiet`, nothing queued at all (so that the driver's charges, the
    /// only thing such frees change in the device, make nothing due), `stream` idle (it stays so:
    /// nothing is queued), no trace recorded and nothing `untrack` would drop.
    #[inline(always)]
    pub(super) fn settled_for_frees(&self, stream: Option<StreamId>) -> bool {
        self.quiet()
            && self.sched.pending_effects() == 0
            && self.recording.history.is_none()
            && self.untracks_nothing()
            && stream.is_none_or(|s| self.idle(s))
    }

    /// A run of at least `RUN` allocs of `replay_allocs` (`ids` and `sizes` from the run's
    /// next event) through `malloc_run`: how many it served and the error of the one after them,
    /// if that one failed (kept out of line: short runs do not come here).
    #[inline(never)]
    pub(super) fn replay_alloc_batch(&mut self, replay: &mut Replay, run: AllocRun<'_>) -> (usize, Option<AclError>) {
        let AllocRun { ids, sizes, policy, stream } = run;
        // The run's valid prefix: sizes that book, ids not live (marked as they are
        // seen, so that an id repeated within the run ends the prefix there).
        let mut valid = 0;
        while valid < ids.len()
            && booked_size(sizes[valid], policy, true).is_ok()
            && replay.ids.claim(ids[valid], PENDING)
        {
            valid += 1;
        }
        if self.sched.has_due() {
            // Settling reads the live table (queued work lands on the blocks it names).
            self.publish(replay);
            self.settle();
        }
        let mut ptrs = std::mem::take(&mut replay.ptrs);
        ptrs.clear();
        let mut grants = std::mem::take(&mut replay.grants);
        let mut fresh = std::mem::take(&mut replay.allocs);
        fresh.clear();
        let sink = replay.bypass.then_some(&mut fresh);
        let failed = self.malloc_run(&sizes[..valid], policy, stream, &mut grants, &mut ptrs, sink).map(|(_, e)| e);
        replay.grants = grants;
        self.charge_driver();
        let served = ptrs.len();
        // `fresh` holds the cached blocks, in order; the others are in the live table.
        let mut h = 0;
        for (j, &p) in ptrs.iter().enumerate() {
            if fresh.get(h).is_some_and(|a| a.ptr == p) {
                replay.hold(ids[j], fresh[h]);
                h += 1;
            } else {
                replay.ids.set(ids[j], p);
            }
            replay.live_bytes += sizes[j];
            replay.outcome.peak_live = replay.outcome.peak_live.max(replay.live_bytes);
        }
        replay.allocs = fresh;
        replay.ptrs = ptrs;
        for &id in &ids[served..valid] {
            replay.ids.set(id, 0);
        }
        (served, failed)
    }

    /// Whether a run of allocs can go through `replay_plain_mallocs`: no deferred frees (a
    /// malloc would look at them first), nothing queued at all (so that the driver's charges
    /// make nothing due) and no trace recorded.
    #[inline(always)]
    pub(super) fn settled_for_mallocs(&self) -> bool {
        self.pending.frees.is_empty() && self.sched.pending_effects() == 0 && self.recording.history.is_none()
    }

    /// Allocs of `ids` (a run `settled_for_mallocs` allowed, of a replay that holds its blocks)
    /// one by one while each id is free: what `replay_malloc` does there, less the questions
    /// whose answers cannot change within the run. Returns how many it served and the error of
    /// the one after them, if that one failed (it stops before an id already live).
    #[inline(always)]
    pub(super) fn replay_plain_mallocs(&mut self, replay: &mut Replay, run: AllocRun<'_>) -> (usize, Option<AclError>) {
        let AllocRun { ids, sizes, policy, stream } = run;
        let mut served = 0;
        let mut failed = None;
        for (&id, &size) in ids.iter().zip(sizes) {
            if replay.ids.get(id) != 0 {
                break;
            }
            match self.allocate(size, policy, true) {
                Ok((booked, grant)) => {
                    let a = self.allocation_of(grant, size, booked, policy, stream);
                    // `note_malloc` with no trace recorded.
                    self.stats.on_mallocs(Tally { blocks: 1, bytes: a.granted, requested: a.size });
                    replay.hold(id, a);
                    self.charge_driver();
                    replay.live_bytes += size;
                    served += 1;
                }
                Err(e) => {
                    failed = Some(self.failed_malloc(e, size, policy, stream));
                    self.charge_driver();
                    break;
                }
            }
        }
        // Live bytes only grew: their largest value is the last.
        replay.outcome.peak_live = replay.outcome.peak_live.max(replay.live_bytes);
        (served, failed)
    }

    /// Frees of `ids` (a run `settled_for_frees` allowed) one by one while each names a block
    /// the replay holds unpublished on an idle stream (or none): what `replay_free` does there,
    /// less the questions whose answers cannot change within the run (a free there makes no
    /// deferred free, queued work, trace entry or record, and `pool_requested` is empty).
    /// Returns how many events it replayed; it stops before the first other id.
    #[inline(always)]
    pub(super) fn replay_plain_frees(&mut self, replay: &mut Replay, ids: &[u64]) -> Result<usize> {
        for (j, &id) in ids.iter().enumerate() {
            let v = replay.ids.take(id);
            if v != 0 {
                let Some(i) = held_index(v).filter(|&i| self.idle(replay.held[i].a.stream)) else {
                    // Left to the full rules, its id as it was.
                    replay.ids.set(id, v);
                    return Ok(j);
                };
                // Only the fields the free needs are read (the entry is released once it is
                // freed, or published whole when the free fails).
                let h = &replay.held[i].a;
                let block = Granted { ptr: h.ptr, granted: h.granted, requested: h.size, page: h.page };
                if let Err(e) = self.allocator.free(self.backend.as_mut(), &block) {
                    // As `replay_free`: the block stays live, published, with its id.
                    let a = replay.release(i);
                    self.live.insert(a);
                    replay.ids.set(id, a.ptr);
                    let index = replay.events;
                    replay.events += 1;
                    return Err(AclError::new(e.code, format!("event {index}: {}", e.message)));
                }
                replay.release(i);
                // `forget_freed` where `untracks_nothing` and no trace is recorded.
                self.recently_freed.push(block.ptr);
                self.stats.on_frees(Tally { blocks: 1, bytes: block.granted, requested: block.requested });
                self.charge_driver();
                replay.live_bytes -= block.requested;
            }
            replay.events += 1;
        }
        Ok(ids.len())
    }
}
