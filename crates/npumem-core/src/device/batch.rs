//! Batch operations: many mallocs or frees in one call, so a Python caller crosses the binding
//! once per batch instead of once per block.
//!
//! Rules:
//! - A batch is all or nothing: a failed `malloc_many` frees what it allocated, and `free_many`
//!   checks every pointer before freeing any.
//! - A free goes straight to the allocator only when it would complete at once (`quiet`, its
//!   streams `idle`); any other takes the stream-ordered path.
use super::*;
use crate::pool::{Grant, Granted};

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
    pub(super) fn malloc_run(
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
            if self.pending.frees.is_empty() {
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
            let plain = (self.uses.recorded.is_empty() || !self.uses.recorded.contains_key(&p))
                && (self.uses.busy.is_empty() || !self.uses.busy.contains_key(&p))
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
    /// caller's to put back). While no trace is recorded, the device's side reads only the
    /// pointers again.
    pub(super) fn free_now(&mut self, ptrs: &[u64], allocs: &[Allocation], mut tally: Tally) -> (usize, Result<()>) {
        let (done, result) = self.free_blocks(allocs);
        if done < allocs.len() {
            tally = Tally::default();
            allocs[..done].iter().for_each(|a| tally.add(a.granted, a.size));
        }
        if self.recording.history.is_none() {
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

    /// `free_now`'s allocator calls: the blocks as granted, in runs of at most `FREE_RUN`
    /// packed in `free_run` (kept between calls: small, sequential, in cache), each through the
    /// batch path and, where it stops, `free`.
    fn free_blocks(&mut self, allocs: &[Allocation]) -> (usize, Result<()>) {
        let mut run = std::mem::take(&mut self.free_run);
        let mut done = 0;
        let mut result = Ok(());
        'runs: while done < allocs.len() {
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
            let mut at = 0;
            while at < n {
                at += self.allocator.free_cached(&run[at..]);
                if at < n {
                    if let Err(e) = self.allocator.free(self.backend.as_mut(), &run[at]) {
                        done += at;
                        result = Err(e);
                        break 'runs;
                    }
                    at += 1;
                }
            }
            done += n;
        }
        self.free_run = run;
        (done, result)
    }

    /// Whether nothing is pending that a free must wait for or settle first: no deferred frees,
    /// no completed work, no views, recorded streams or queued work on any block.
    #[inline]
    pub(super) fn quiet(&self) -> bool {
        self.pending.frees.is_empty()
            && !self.sched.has_due()
            && self.pins.is_empty()
            && self.uses.recorded.is_empty()
            && self.uses.busy.is_empty()
    }

    /// Whether `stream` exists and has no queued work left: on the simulated clock, and on a
    /// runtime with a queue of its own (no work there that may be incomplete).
    #[inline(always)]
    pub(super) fn idle(&self, stream: StreamId) -> bool {
        self.sched.is_idle(stream) && (self.rt.dirty.is_empty() || self.rt_idle(stream))
    }

    /// `idle`'s question to the runtime's queue (out of line: rarely asked).
    #[inline(never)]
    fn rt_idle(&self, stream: StreamId) -> bool {
        !self.rt.dirty.contains(&stream)
    }

    /// [`Device::idle`] of `stream`, asked once per run of blocks on one stream: `last` holds the
    /// previous stream and its answer (nothing changes the clock within a batch).
    #[inline]
    pub(super) fn idle_memo(&self, last: &mut Option<(StreamId, bool)>, stream: StreamId) -> bool {
        match *last {
            Some((s, idle)) if s == stream => idle,
            _ => {
                let idle = self.idle(stream);
                *last = Some((stream, idle));
                idle
            }
        }
    }
}
