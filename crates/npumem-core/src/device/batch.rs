//! Batch operations: many mallocs or frees in one call, and whole alloc/free traces replayed in
//! Rust, so a Python caller crosses the binding once per batch instead of once per block.
//!
//! Invariants: a batch is all or nothing — a failed `malloc_many` frees what it allocated, and
//! `free_many` checks every pointer before freeing any; a replay returns the allocations it still
//! holds (or frees them when it stops on an error). Every block a replay holds unpublished
//! (`Replay::held`, inside one `replay_chunk` call only) is live in its pool, counted and
//! traced, and absent from the device's live table; `publish` moves them there before every
//! return from `replay_chunk` and before any path but the replay's fast ones (the batch runs,
//! the plain runs of `replay_plain_mallocs` / `replay_plain_frees`, and the direct single
//! alloc and free).

use super::id_table::IdTable;
use super::*;
use crate::pool::{Grant, Granted};

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

/// The most requests `malloc_many` hands the allocator's front cache at once.
const CACHED_RUN: usize = 1024;
/// The most blocks `free_blocks` packs for the allocator's batch path at once (8 KiB).
const FREE_RUN: usize = 256;
/// How many blocks ahead a batch asks for the live table's records (`LiveTable::prefetch`).
const LOOK_AHEAD: usize = 16;

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
        let mut grants = Vec::with_capacity(sizes.len().min(CACHED_RUN));
        let failed = self
            .malloc_run(sizes, policy, stream, &mut grants, &mut ptrs, None)
            .map(|(i, e)| AclError::new(e.code, format!("malloc_many: size #{i} ({}): {}", sizes[i], e.message)));
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

    /// Allocates one block per size on `stream` (sizes already checked, the stream checked and
    /// settled), appending the pointers to `ptrs`, until the first failure, which it returns
    /// with its index (the blocks before it stay allocated). While no free is pending
    /// (stream-ordered reuse comes first), the allocator serves what its front cache can, a run
    /// of up to `CACHED_RUN` requests a call; the request it stops at goes through the full
    /// rules (search, release-and-retry on out-of-memory). The caller charges the driver calls.
    fn malloc_run(
        &mut self,
        sizes: &[u64],
        policy: Policy,
        stream: StreamId,
        grants: &mut Vec<Grant>,
        ptrs: &mut Vec<u64>,
        mut held: Option<&mut Vec<Allocation>>,
    ) -> Option<(usize, AclError)> {
        let mut i = 0;
        while i < sizes.len() {
            if self.pending_frees.is_empty() {
                // By runs of at most `CACHED_RUN`, so that `grants` stays small and in cache.
                let end = sizes.len().min(i + CACHED_RUN);
                let served = self.allocator.malloc_cached(&sizes[i..end], policy, grants);
                let mut tally = Tally::default();
                for (k, (&grant, &size)) in grants.iter().zip(&sizes[i..i + served]).enumerate() {
                    if let (None, Some(ahead)) = (&held, grants.get(k + LOOK_AHEAD)) {
                        self.live.prefetch(ahead.ptr);
                    }
                    // Checked by the caller: the booking cannot fail here (and an error would
                    // strand the blocks already recorded).
                    let booked = booked_size(size, policy, true).unwrap_or(size);
                    let a = self.allocation_of(grant, size, booked, policy, stream);
                    // A replay holds its cached blocks itself (`Replay::held`) until it publishes.
                    match held {
                        Some(ref mut h) => h.push(a),
                        None => self.live.insert(a),
                    }
                    self.trace(Action::Alloc, a.ptr, a.granted, a.stream);
                    tally.add(a.granted, a.size);
                    ptrs.push(a.ptr);
                }
                grants.clear();
                self.stats.on_mallocs(tally);
                i += served;
                if i == end {
                    continue;
                }
            }
            match self.malloc_settled(sizes[i], policy, true, stream) {
                Ok(p) => ptrs.push(p),
                Err(e) => return Some((i, e)),
            }
            i += 1;
        }
        None
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
        let mut last: Option<(StreamId, bool)> = None;
        let mut at_once = std::mem::take(&mut self.free_scratch);
        at_once.reserve(ptrs.len());
        let mut ordered = Vec::new();
        let mut tally = Tally::default();
        for (i, &p) in ptrs.iter().enumerate() {
            if let Some(&ahead) = ptrs.get(i + LOOK_AHEAD) {
                self.live.prefetch(ahead);
            }
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
            let idle = self.idle_memo(&mut last, a.stream);
            let plain = (self.stream_uses.is_empty() || !self.stream_uses.contains_key(&p))
                && (self.busy.is_empty() || !self.busy.contains_key(&p))
                && !self.sanitizer.tracks(p);
            if idle && plain {
                tally.add(a.granted, a.size);
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
        let (done, mut result) = self.free_now(immediate, &at_once, tally);
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
        at_once.clear();
        self.free_scratch = at_once;
        self.charge_driver();
        result
    }

    /// Frees `allocs` (already taken out of the live table, each of which completes at once:
    /// its streams idle, no recorded streams, queued work or sanitizer records), whose pointers
    /// are `ptrs` and whose sizes `tally` sums, in order through the allocator's batch path;
    /// returns how many were freed and the driver's error that stopped it (the rest are the
    /// caller's to put back). While no trace is recorded, only the pointers are read again
    /// (with 10^6 blocks, `allocs` is 48 MB that no longer has to come back from memory).
    fn free_now(&mut self, ptrs: &[u64], allocs: &[Allocation], mut tally: Tally) -> (usize, Result<()>) {
        let (done, result) = if self.owner_tracked { self.free_blocks(allocs) } else { self.free_ptrs(ptrs) };
        if done < allocs.len() {
            tally = Tally::default();
            allocs[..done].iter().for_each(|a| tally.add(a.granted, a.size));
        }
        if self.history.is_none() {
            if self.untracks_nothing() {
                // `untrack_ptr` of each block would only note it in the ring.
                self.recently_freed.extend(&ptrs[..done]);
            } else {
                ptrs[..done].iter().for_each(|&p| self.untrack_ptr(p, true));
            }
        } else {
            allocs[..done].iter().for_each(|a| self.untrack(a, true));
        }
        self.stats.on_frees(tally);
        (done, result)
    }

    /// `free_now`'s allocator calls for an allocator that keeps its own records: by pointer.
    fn free_ptrs(&mut self, ptrs: &[u64]) -> (usize, Result<()>) {
        let mut done = 0;
        while done < ptrs.len() {
            done += self.allocator.free_cached(&ptrs[done..]);
            if done < ptrs.len() {
                if let Err(e) = self.allocator.free(self.backend.as_mut(), ptrs[done]) {
                    return (done, Err(e));
                }
                done += 1;
            }
        }
        (done, Ok(()))
    }

    /// `free_now`'s allocator calls for an owner-tracked allocator: the blocks as granted, in
    /// runs of at most `FREE_RUN` packed in `free_run` (kept between calls: small, sequential,
    /// in cache), each through the batch path and, where it stops, `free_block`.
    fn free_blocks(&mut self, allocs: &[Allocation]) -> (usize, Result<()>) {
        let mut run = std::mem::take(&mut self.free_run);
        let mut done = 0;
        let mut result = Ok(());
        while done < allocs.len() {
            let n = (allocs.len() - done).min(FREE_RUN);
            run.clear();
            let chunk = &allocs[done..done + n];
            if self.pool_requested.is_empty() {
                // No revived block: each was granted for its size (`granted_of` less the lookup).
                run.extend(chunk.iter().map(|a| Granted {
                    ptr: a.ptr,
                    granted: a.granted,
                    requested: a.size,
                    page: a.page,
                }));
            } else {
                run.extend(chunk.iter().map(|a| self.granted_of(a)));
            }
            let freed = self.allocator.free_cached_blocks(&run);
            done += freed;
            if freed < n {
                if let Err(e) = self.allocator.free_block(self.backend.as_mut(), &run[freed]) {
                    result = Err(e);
                    break;
                }
                done += 1;
            }
        }
        self.free_run = run;
        (done, result)
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
            if ids.len() - k >= RUN && self.pending_frees.is_empty() {
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

    /// A run of at least `RUN` frees of `replay_frees` (`ids` from the run's next event, the
    /// device quiet and the run's stream idle) through `free_now`, as far as its blocks complete
    /// at once: how many events it replayed (kept out of line: short runs do not come here).
    #[inline(never)]
    fn replay_free_batch(&mut self, replay: &mut Replay, ids: &[u64]) -> Result<usize> {
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
    fn settled_for_frees(&self, stream: Option<StreamId>) -> bool {
        self.quiet()
            && self.sched.pending_effects() == 0
            && self.history.is_none()
            && self.untracks_nothing()
            && stream.is_none_or(|s| self.idle(s))
    }

    /// A run of at least `RUN` allocs of `replay_allocs` (`ids` and `sizes` from the run's
    /// next event) through `malloc_run`: how many it served and the error of the one after them,
    /// if that one failed (kept out of line: short runs do not come here).
    #[inline(never)]
    fn replay_alloc_batch(&mut self, replay: &mut Replay, run: AllocRun<'_>) -> (usize, Option<AclError>) {
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
    fn settled_for_mallocs(&self) -> bool {
        self.pending_frees.is_empty() && self.sched.pending_effects() == 0 && self.history.is_none()
    }

    /// Allocs of `ids` (a run `settled_for_mallocs` allowed, of a replay that holds its blocks)
    /// one by one while each id is free: what `replay_malloc` does there, less the questions
    /// whose answers cannot change within the run. Returns how many it served and the error of
    /// the one after them, if that one failed (it stops before an id already live).
    #[inline(always)]
    fn replay_plain_mallocs(&mut self, replay: &mut Replay, run: AllocRun<'_>) -> (usize, Option<AclError>) {
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
    fn replay_plain_frees(&mut self, replay: &mut Replay, ids: &[u64]) -> Result<usize> {
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
                if let Err(e) = self.allocator.free_block(self.backend.as_mut(), &block) {
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

    /// Whether nothing is pending that a free must wait for or settle first: no deferred frees,
    /// no completed work, no views, recorded streams or queued work on any block.
    #[inline]
    fn quiet(&self) -> bool {
        self.pending_frees.is_empty()
            && !self.sched.has_due()
            && self.pins.is_empty()
            && self.stream_uses.is_empty()
            && self.busy.is_empty()
    }

    /// Whether `stream` exists and has no queued work left: on the simulated clock, and on a
    /// runtime with a queue of its own (no work there that may be incomplete).
    #[inline(always)]
    fn idle(&self, stream: StreamId) -> bool {
        self.sched.is_idle(stream) && (self.rt_dirty.is_empty() || self.rt_idle(stream))
    }

    /// `idle`'s question to the runtime's queue (out of line: rarely asked).
    #[inline(never)]
    fn rt_idle(&self, stream: StreamId) -> bool {
        !self.rt_dirty.contains(&stream)
    }

    /// [`Device::idle`] of `stream`, asked once per run of blocks on one stream: `last` holds the
    /// previous stream and its answer (nothing changes the clock within a batch).
    #[inline]
    fn idle_memo(&self, last: &mut Option<(StreamId, bool)>, stream: StreamId) -> bool {
        match *last {
            Some((s, idle)) if s == stream => idle,
            _ => {
                let idle = self.idle(stream);
                *last = Some((stream, idle));
                idle
            }
        }
    }

    /// Notes the memory in use after event `index` of `replay`.
    fn sample(&self, replay: &mut Replay, index: u64) {
        let stats = self.allocator.stats();
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
        if !self.pending_frees.is_empty() || self.sched.has_due() {
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
        if !self.pending_frees.is_empty() || self.sched.has_due() {
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
            if let Err(e) = self.allocator.free_block(self.backend.as_mut(), &block) {
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
