//! Exact placement: does a problem fit in a given capacity? A depth-first branch and bound in the
//! spirit of MiniMalloc (Moffitt, ASPLOS'23), written from its paper's description:
//!
//! - **canonical solutions**: every buffer sits at its *minimum offset* (the top of the already
//!   placed buffers it overlaps in time), and buffers are placed in non-decreasing
//!   `(offset, preorder rank)`; every feasible problem has a solution of that form, so exploring
//!   only those is complete;
//! - **cross sections**: the maximal sets of buffers live at one time. Each keeps a floor (the
//!   lowest offset any unplaced buffer of it can get) and the total size of its unplaced buffers;
//!   a node is pruned when `max(floor, offset) + total > capacity` for any section;
//! - **dominance**: no buffer is placed at or above the lowest top any unplaced buffer could reach
//!   (that would leave a gap the lower one must fill later anyway);
//! - **dynamic decomposition**: once no unplaced buffer spans the boundary between two sections,
//!   the two sides are solved independently;
//! - a **portfolio of preorders** (by lifetime length, area and section total), one thread each.
//!   The answer is that of the thread that needed the fewest search nodes (ties: the first
//!   preorder), so it does not depend on how fast the threads ran: a thread stops as soon as it
//!   has visited more nodes than an answer already found needed.
//!
//! Invariants: sizes, offsets and the capacity are in units of the problem's alignment (every
//! size rounded up), so aligned offsets come for free. [`Fit::Found`] offsets are a valid
//! placement within the capacity; [`Fit::Infeasible`] is returned only after a whole canonical
//! search tree was exhausted, which proves that no placement fits. The search is bounded by a
//! deadline (checked every 16 nodes) and by a work limit in nodes per thread (checked at every
//! node); within a work limit and without a deadline the answer and the node count are the same
//! on every run.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use super::Problem;

/// What the exact search established for one capacity.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Fit {
    /// A placement within the capacity (offsets in bytes).
    Found(Vec<u64>),
    /// Proven: no placement fits.
    Infeasible,
    /// A limit came first.
    Unknown(Cut),
}

/// The limit that ended a search without an answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Cut {
    /// The wall-clock deadline.
    Deadline,
    /// The work limit (search nodes per portfolio thread).
    Work,
}

/// Why one thread stopped without an answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stop {
    Cut(Cut),
    /// Another thread answered with fewer nodes than this one has visited: it cannot win.
    Lost,
}

/// Above this many buffers, time-overlapping pairs or section memberships the model is not built:
/// the exact search is for hard instances of hundreds to a few thousand buffers (its nodes cost
/// O(n log n)), not for the large graphs that the greedy portfolio places near the bound.
pub(super) const MAX_BUFFERS: usize = 10_000;
pub(super) const MAX_PAIRS: usize = 4_000_000;

const UNSET: u64 = u64::MAX;

/// The immutable part, shared by the search threads.
pub(super) struct Model {
    /// Aligned sizes in alignment units.
    size: Vec<u64>,
    /// Lifetime length in steps, and size x length.
    length: Vec<u64>,
    area: Vec<u128>,
    overlaps: Vec<Vec<u32>>,
    /// Buffers of each cross section.
    sections: Vec<Vec<u32>>,
    /// Each buffer's sections: `span.0..span.1`.
    span: Vec<(u32, u32)>,
    /// Independent groups of buffers (connected in time) and their section ranges.
    partitions: Vec<(Vec<u32>, (u32, u32))>,
    alignment: u64,
}

impl Model {
    /// Builds the sections, overlaps and partitions by one sweep over time; `None` when the
    /// problem is larger than [`MAX_BUFFERS`] or [`MAX_PAIRS`].
    pub(super) fn build(p: &Problem) -> Option<Model> {
        let bs = p.buffers();
        let n = bs.len();
        if n > MAX_BUFFERS {
            return None;
        }
        let mut events: Vec<(u64, bool, u32)> = Vec::with_capacity(2 * n);
        for (i, b) in bs.iter().enumerate() {
            events.push((b.lower, true, i as u32));
            events.push((b.upper, false, i as u32));
        }
        // Ends (false) before starts at one step: lifetimes are half-open.
        events.sort_unstable();
        let mut m = Model {
            size: bs.iter().map(|b| p.aligned(b.size) / p.alignment()).collect(),
            length: bs.iter().map(|b| b.upper - b.lower).collect(),
            area: bs.iter().map(|b| b.size as u128 * (b.upper - b.lower) as u128).collect(),
            overlaps: vec![Vec::new(); n],
            sections: Vec::new(),
            span: vec![(0, 0); n],
            partitions: Vec::new(),
            alignment: p.alignment(),
        };
        let mut live: Vec<u32> = Vec::new();
        let mut pos = vec![0usize; n];
        let (mut dirty, mut pairs, mut members) = (false, 0usize, 0usize);
        let mut part_start = 0u32;
        for (_, start, i) in events {
            let iu = i as usize;
            if start {
                if live.is_empty() {
                    m.partitions.push((Vec::new(), (part_start, part_start)));
                }
                pairs += live.len();
                if pairs > MAX_PAIRS {
                    return None;
                }
                for &j in &live {
                    m.overlaps[iu].push(j);
                    m.overlaps[j as usize].push(i);
                }
                pos[iu] = live.len();
                live.push(i);
                m.partitions.last_mut()?.0.push(i);
                m.span[iu].0 = m.sections.len() as u32;
                dirty = true;
            } else {
                if dirty {
                    members += live.len();
                    if members > MAX_PAIRS {
                        return None;
                    }
                    m.sections.push(live.clone());
                    dirty = false;
                }
                m.span[iu].1 = m.sections.len() as u32;
                let k = pos[iu];
                live.swap_remove(k);
                if let Some(&moved) = live.get(k) {
                    pos[moved as usize] = k;
                }
                if live.is_empty() {
                    part_start = m.sections.len() as u32;
                    m.partitions.last_mut()?.1.1 = part_start;
                }
            }
        }
        Some(m)
    }

    /// Searches for a placement within `capacity` bytes with one thread per preorder, each
    /// visiting at most `work` nodes. Returns the answer and the nodes it took (the answering
    /// thread's count; `work` when every thread ran out of it).
    pub(super) fn fit(&self, capacity: u64, deadline: Instant, work: u64) -> (Fit, u64) {
        let cap = capacity / self.alignment;
        // The fewest nodes an answer has needed so far.
        let best = AtomicU64::new(u64::MAX);
        let results: Vec<(Result<Fit, Stop>, u64)> = std::thread::scope(|scope| {
            let handles: Vec<_> = PREORDERS
                .iter()
                .map(|keys| {
                    let best = &best;
                    std::thread::Builder::new()
                        // Recursion depth is at most the number of buffers.
                        .stack_size(64 << 20)
                        .spawn_scoped(scope, move || {
                            let (answer, nodes) = Search::new(self, cap, keys, deadline, work, best).run();
                            if answer.is_ok() {
                                best.fetch_min(nodes, Ordering::Relaxed);
                            }
                            (answer, nodes)
                        })
                        .expect("spawning an exact-search thread")
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e))).collect()
        });
        // Every answer is a proof (all agree: a problem cannot both fit and not fit); the one
        // of the thread with the fewest nodes, the first preorder on a tie, is the same on every
        // run, however the threads were scheduled.
        let answered = results.iter().filter_map(|(a, n)| a.as_ref().ok().map(|f| (*n, f))).min_by_key(|&(n, _)| n);
        match answered {
            Some((n, Fit::Found(o))) => (Fit::Found(o.iter().map(|u| u * self.alignment).collect()), n),
            Some((n, fit)) => (fit.clone(), n),
            None => {
                let deadline_hit = results.iter().any(|(a, _)| *a == Err(Stop::Cut(Cut::Deadline)));
                let nodes = results.iter().map(|(_, n)| *n).max().unwrap_or(0).min(work);
                (Fit::Unknown(if deadline_hit { Cut::Deadline } else { Cut::Work }), nodes)
            }
        }
    }
}

/// Keys of a static preorder, each descending: lifetime length (width), area, and the largest
/// total of the buffer's sections.
#[derive(Clone, Copy)]
enum Key {
    Width,
    Area,
    Total,
}

/// MiniMalloc's default portfolio: "WAT", "TAW", "TWA".
const PREORDERS: [[Key; 3]; 3] =
    [[Key::Width, Key::Area, Key::Total], [Key::Total, Key::Area, Key::Width], [Key::Total, Key::Width, Key::Area]];

#[derive(Clone, Copy, PartialEq, Eq)]
enum Status {
    Found,
    NotFound,
    Stopped(Stop),
}

/// One search thread's mutable state; every change made while placing a buffer is undone on the
/// way back.
struct Search<'a> {
    m: &'a Model,
    cap: u64,
    keys: &'a [Key; 3],
    deadline: Instant,
    /// Nodes this thread may visit.
    work: u64,
    /// The fewest nodes any thread's answer needed so far.
    best: &'a AtomicU64,
    nodes: u64,
    offset: Vec<u64>,
    min_off: Vec<u64>,
    floor: Vec<u64>,
    total: Vec<u64>,
    /// `cuts[s]`: unplaced buffers spanning the boundary between sections `s` and `s + 1`.
    cuts: Vec<u32>,
    solution: Vec<u64>,
    stamp: Vec<u64>,
    epoch: u64,
}

impl<'a> Search<'a> {
    fn new(m: &'a Model, cap: u64, keys: &'a [Key; 3], deadline: Instant, work: u64, best: &'a AtomicU64) -> Self {
        let ns = m.sections.len();
        let mut total = vec![0u64; ns];
        let mut cuts = vec![0u32; ns.saturating_sub(1)];
        for (i, &(a, b)) in m.span.iter().enumerate() {
            for s in a..b {
                total[s as usize] += m.size[i];
            }
            for c in &mut cuts[a as usize..(b as usize).saturating_sub(1)] {
                *c += 1;
            }
        }
        let n = m.size.len();
        Search {
            m,
            cap,
            keys,
            deadline,
            work,
            best,
            nodes: 0,
            offset: vec![UNSET; n],
            min_off: vec![0; n],
            floor: vec![0; ns],
            total,
            cuts,
            solution: vec![0; n],
            stamp: vec![0; ns],
            epoch: 0,
        }
    }

    /// The answer (or why there is none) and the nodes visited.
    fn run(mut self) -> (Result<Fit, Stop>, u64) {
        let m = self.m;
        for (buffers, range) in &m.partitions {
            match self.sub_solve(buffers, *range) {
                Status::Found => {}
                Status::NotFound => return (Ok(Fit::Infeasible), self.nodes),
                Status::Stopped(why) => return (Err(why), self.nodes),
            }
        }
        (Ok(Fit::Found(self.solution)), self.nodes)
    }

    /// Orders `buffers` by this thread's keys (section totals as they are now) and searches.
    fn sub_solve(&mut self, buffers: &[u32], range: (u32, u32)) -> Status {
        let m = self.m;
        let key = |i: u32| -> [u128; 3] {
            let (a, b) = m.span[i as usize];
            self.keys.map(|k| match k {
                Key::Width => m.length[i as usize] as u128,
                Key::Area => m.area[i as usize],
                Key::Total => self.total[a as usize..b as usize].iter().copied().max().unwrap_or(0) as u128,
            })
        };
        let mut pre: Vec<([u128; 3], u32)> = buffers.iter().map(|&i| (key(i), i)).collect();
        pre.sort_unstable_by(|x, y| y.0.cmp(&x.0).then(x.1.cmp(&y.1)));
        let pre: Vec<u32> = pre.into_iter().map(|(_, i)| i).collect();
        let ordering: Vec<(u64, u32)> = (0..pre.len() as u32).map(|k| (0, k)).collect();
        self.search(&pre, range, &ordering, (0, 0))
    }

    /// One node: `orig` lists the buffers (by preorder rank) not placed when the parent began;
    /// `last` is the `(offset, rank)` of the buffer placed last (canonical order).
    fn search(&mut self, pre: &[u32], range: (u32, u32), orig: &[(u64, u32)], last: (u64, u32)) -> Status {
        self.nodes += 1;
        if self.nodes > self.work {
            return Status::Stopped(Stop::Cut(Cut::Work));
        }
        if self.nodes % 16 == 0 {
            if self.nodes > self.best.load(Ordering::Relaxed) {
                return Status::Stopped(Stop::Lost);
            }
            if Instant::now() >= self.deadline {
                return Status::Stopped(Stop::Cut(Cut::Deadline));
            }
        }
        let mut ordering: Vec<(u64, u32)> = orig
            .iter()
            .filter(|&&(_, k)| self.offset[pre[k as usize] as usize] == UNSET)
            .map(|&(_, k)| (self.min_off[pre[k as usize] as usize], k))
            .collect();
        if ordering.is_empty() {
            return Status::Found;
        }
        ordering.sort_unstable();
        let min_top =
            ordering.iter().map(|&(o, k)| o.saturating_add(self.m.size[pre[k as usize] as usize])).min().unwrap_or(0);
        for &(off, k) in &ordering {
            if off >= min_top {
                break; // dominance: sorted by offset, so every later candidate too
            }
            if (off, k) < last {
                continue; // not canonical
            }
            let b = pre[k as usize] as usize;
            let undo = self.place(b, off);
            let status = if self.check(range, off) {
                self.descend(pre, range, &ordering, (off, k), b)
            } else {
                Status::NotFound
            };
            self.unplace(b, undo);
            if status != Status::NotFound {
                return status;
            }
        }
        Status::NotFound
    }

    /// After placing `b`: continue in this partition, or split it where no unplaced buffer
    /// spans a section boundary any more and solve the parts independently.
    fn descend(
        &mut self,
        pre: &[u32],
        range: (u32, u32),
        ordering: &[(u64, u32)],
        last: (u64, u32),
        b: usize,
    ) -> Status {
        self.solution[b] = last.0;
        let (a, z) = self.m.span[b];
        let mut cutpoints = vec![range.0];
        for s in a..z.saturating_sub(1) {
            self.cuts[s as usize] -= 1;
            if self.cuts[s as usize] == 0 {
                cutpoints.push(s + 1);
            }
        }
        let status = if cutpoints.len() == 1 {
            self.search(pre, range, ordering, last)
        } else {
            cutpoints.push(range.1);
            let mut status = Status::Found;
            for w in cutpoints.windows(2) {
                let part: Vec<u32> = pre
                    .iter()
                    .copied()
                    .filter(|&i| {
                        let (x, y) = self.m.span[i as usize];
                        self.offset[i as usize] == UNSET && x < w[1] && w[0] < y
                    })
                    .collect();
                if part.is_empty() {
                    continue;
                }
                status = self.sub_solve(&part, (w[0], w[1]));
                if status != Status::Found {
                    break;
                }
            }
            status
        };
        for s in a..z.saturating_sub(1) {
            self.cuts[s as usize] += 1;
        }
        status
    }

    /// Whether every section of the partition can still hold its unplaced buffers.
    fn check(&self, range: (u32, u32), off: u64) -> bool {
        let (a, b) = (range.0 as usize, range.1 as usize);
        self.floor[a..b].iter().zip(&self.total[a..b]).all(|(&f, &t)| f.max(off).saturating_add(t) <= self.cap)
    }

    /// Places `b` at `off`: raises the minimum offsets of the unplaced buffers it overlaps and
    /// the floors of its sections. Returns what to undo.
    fn place(&mut self, b: usize, off: u64) -> Undo {
        let m = self.m;
        self.offset[b] = off;
        let top = off.saturating_add(m.size[b]);
        let mut undo = Undo::default();
        self.epoch += 1;
        let mut affected = Vec::new();
        for &o in &m.overlaps[b] {
            let o = o as usize;
            if self.offset[o] == UNSET && self.min_off[o] < top {
                undo.min_off.push((o as u32, self.min_off[o]));
                self.min_off[o] = top;
                let (x, y) = m.span[o];
                for s in x..y {
                    if self.stamp[s as usize] != self.epoch {
                        self.stamp[s as usize] = self.epoch;
                        affected.push(s);
                    }
                }
            }
        }
        let (x, y) = m.span[b];
        for s in x..y {
            undo.floor.push((s, self.floor[s as usize]));
            self.floor[s as usize] = top;
            self.total[s as usize] -= m.size[b];
        }
        // A section's floor is at least the lowest minimum offset of its unplaced buffers.
        for s in affected {
            let lowest = m.sections[s as usize]
                .iter()
                .filter(|&&i| self.offset[i as usize] == UNSET)
                .map(|&i| self.min_off[i as usize])
                .min();
            if let Some(lowest) = lowest
                && self.floor[s as usize] < lowest
            {
                undo.floor.push((s, self.floor[s as usize]));
                self.floor[s as usize] = lowest;
            }
        }
        undo
    }

    fn unplace(&mut self, b: usize, undo: Undo) {
        let m = self.m;
        for &(s, f) in undo.floor.iter().rev() {
            self.floor[s as usize] = f;
        }
        let (x, y) = m.span[b];
        for s in x..y {
            self.total[s as usize] += m.size[b];
        }
        for &(o, v) in undo.min_off.iter().rev() {
            self.min_off[o as usize] = v;
        }
        self.offset[b] = UNSET;
    }
}

#[derive(Default)]
struct Undo {
    min_off: Vec<(u32, u64)>,
    floor: Vec<(u32, u64)>,
}

#[cfg(test)]
mod tests {
    use super::super::{Buffer, ExactOutcome, PlanOptions, Strategy};
    use super::*;
    use std::time::Duration;

    fn fit(p: &Problem, capacity: u64) -> Fit {
        Model::build(p).unwrap().fit(capacity, Instant::now() + Duration::from_secs(20), u64::MAX).0
    }

    /// The smallest peak over every order of first-fit-at-minimum-offset placements: brute force.
    fn brute_force(p: &Problem) -> u64 {
        fn go(p: &Problem, left: &mut Vec<usize>, offs: &mut Vec<Option<u64>>, best: &mut u64) {
            let top = p.buffers().iter().zip(offs.iter()).filter_map(|(b, o)| o.map(|o| o + p.aligned(b.size))).max();
            if top.unwrap_or(0) >= *best {
                return;
            }
            if left.is_empty() {
                let peak = p.buffers().iter().zip(offs.iter()).map(|(b, o)| o.unwrap() + p.aligned(b.size)).max();
                *best = (*best).min(peak.unwrap_or(0));
                return;
            }
            for k in 0..left.len() {
                let i = left.remove(k);
                let b = p.buffers()[i];
                // Every offset where `i` touches something below it (or 0): a superset of the
                // canonical positions.
                let mut cands = vec![0u64];
                for (j, o) in offs.iter().enumerate() {
                    if let Some(o) = o {
                        cands.push(o + p.aligned(p.buffers()[j].size));
                    }
                }
                for c in cands {
                    let clash = offs.iter().enumerate().any(|(j, o)| {
                        o.is_some_and(|o| {
                            let bj = p.buffers()[j];
                            bj.overlaps_in_time(&b) && o < c + p.aligned(b.size) && c < o + p.aligned(bj.size)
                        })
                    });
                    if !clash {
                        offs[i] = Some(c);
                        go(p, left, offs, best);
                        offs[i] = None;
                    }
                }
                left.insert(k, i);
            }
        }
        let mut best = u64::MAX;
        go(p, &mut (0..p.buffers().len()).collect(), &mut vec![None; p.buffers().len()], &mut best);
        best
    }

    /// Small random problems (3-5 buffers, 16-byte alignment) that brute force can solve.
    fn random_problems(count: usize) -> Vec<Problem> {
        let mut seed = 0x5EED_u64;
        let mut next = |n: u64| {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (seed >> 33) % n
        };
        (0..count)
            .map(|_| {
                let n = 3 + next(3) as usize;
                let buffers = (0..n)
                    .map(|_| {
                        let lower = next(6);
                        Buffer::new(lower, lower + 1 + next(4), 1 + next(8) * 16)
                    })
                    .collect();
                Problem::new(buffers, 16).unwrap()
            })
            .collect()
    }

    #[test]
    fn finds_the_optimum_and_proves_nothing_fits_below_it() {
        for (round, p) in random_problems(60).iter().enumerate() {
            let opt = brute_force(p);
            match fit(p, opt) {
                Fit::Found(offsets) => assert!(p.validate(&offsets).unwrap() <= opt, "round {round}"),
                other => panic!("round {round}: optimum {opt} not found: {other:?}"),
            }
            if opt > p.lower_bound() {
                assert_eq!(fit(p, opt - 16), Fit::Infeasible, "round {round}: below the optimum {opt}");
            }
        }
    }

    #[test]
    fn the_npumem_strategy_with_a_time_limit_proves_optimality() {
        let options = PlanOptions { capacity: None, time_limit: 20.0, work_limit: None };
        for (round, p) in random_problems(60).iter().enumerate() {
            let plan = p.plan_with(Strategy::Npumem, options);
            assert_eq!(p.validate(&plan.offsets).unwrap(), plan.peak, "round {round}");
            assert!(plan.optimal, "round {round}: {:?}", plan.exact);
            assert_eq!(plan.peak, brute_force(p), "round {round}");
            assert_eq!(plan.bound, plan.peak, "round {round}");
        }
    }

    #[test]
    fn a_capacity_is_reached_or_proven_infeasible() {
        // Two overlapping 8-byte buffers: 16 bytes fit; below that the bound alone is the proof.
        let p = Problem::new(vec![Buffer::new(0, 2, 8), Buffer::new(1, 3, 8)], 1).unwrap();
        let at = p.plan_with(Strategy::Npumem, PlanOptions { capacity: Some(16), time_limit: 5.0, work_limit: None });
        assert_eq!(at.peak, 16);
        assert_eq!(at.exact, ExactOutcome::NotRun, "the greedy plan already fits");
        let below =
            p.plan_with(Strategy::Npumem, PlanOptions { capacity: Some(15), time_limit: 5.0, work_limit: None });
        assert_eq!(below.exact, ExactOutcome::Infeasible);
        assert_eq!(below.bound, 16);
        assert!(below.optimal);
    }

    /// Random problems of 20-40 buffers (16-byte alignment) whose greedy plan is above the
    /// max-live bound, so that the exact search has work to do.
    fn greedy_misses(count: usize) -> Vec<Problem> {
        let mut seed = 0xD5A_u64;
        let mut next = |n: u64| {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (seed >> 33) % n
        };
        let mut out = Vec::new();
        while out.len() < count {
            let n = 20 + next(21) as usize;
            let buffers = (0..n)
                .map(|_| {
                    let lower = next(20);
                    Buffer::new(lower, lower + 1 + next(8), 16 * (1 + next(16)))
                })
                .collect();
            let p = Problem::new(buffers, 16).unwrap();
            if p.plan(Strategy::Npumem).peak > p.lower_bound() {
                out.push(p);
            }
        }
        out
    }

    #[test]
    fn a_work_limit_gives_the_same_plan_and_node_count_on_every_run() {
        for (round, p) in greedy_misses(3).iter().enumerate() {
            let greedy = p.plan(Strategy::Npumem).peak;
            let options = PlanOptions { capacity: None, time_limit: f64::INFINITY, work_limit: Some(1 << 20) };
            let plan = p.plan_with(Strategy::Npumem, options);
            assert_eq!(plan.exact, ExactOutcome::Optimal, "round {round}");
            assert!(plan.nodes > 0 && plan.peak < greedy, "round {round}");
            for _ in 0..4 {
                let again = p.plan_with(Strategy::Npumem, options);
                assert_eq!((&again.offsets, again.nodes), (&plan.offsets, plan.nodes), "round {round}");
            }
            // Too few nodes to prove anything: the greedy plan stays, and the plan says why.
            let cut = p.plan_with(Strategy::Npumem, PlanOptions { work_limit: Some(2), ..options });
            assert_eq!((cut.exact, cut.peak, cut.optimal), (ExactOutcome::WorkLimit, greedy, false), "round {round}");
            assert!(cut.nodes <= 2);
            // Also the search's own nodes, thread by thread: the same answer and count each time.
            let model = Model::build(p).unwrap();
            let far = Instant::now() + Duration::from_secs(600);
            let first = model.fit(p.lower_bound(), far, u64::MAX);
            assert!(matches!(first.0, Fit::Found(_)), "round {round}");
            for _ in 0..4 {
                assert_eq!(model.fit(p.lower_bound(), far, u64::MAX), first, "round {round}");
            }
            assert_eq!(model.fit(p.lower_bound(), far, 1), (Fit::Unknown(Cut::Work), 1));
        }
    }

    #[test]
    fn a_capacity_out_of_reach_is_reported_with_the_best_plan_found() {
        for (round, p) in greedy_misses(3).iter().enumerate() {
            let bound = p.lower_bound();
            // Below the max-live bound: impossible, and the search still lowers the peak (here
            // to the bound, which it proves optimal).
            let options =
                PlanOptions { capacity: Some(bound - 16), time_limit: f64::INFINITY, work_limit: Some(1 << 20) };
            let plan = p.plan_with(Strategy::Npumem, options);
            assert_eq!(plan.exact, ExactOutcome::Infeasible, "round {round}");
            assert_eq!((plan.peak, plan.bound, plan.optimal), (bound, bound, true), "round {round}");
            assert_eq!(p.validate(&plan.offsets).unwrap(), bound);
            // Without a search, the verdict stands on the bound alone.
            let greedy = p.plan_with(Strategy::Npumem, PlanOptions { time_limit: 0.0, ..options });
            assert_eq!((greedy.exact, greedy.optimal, greedy.nodes), (ExactOutcome::Infeasible, false, 0));
            assert!(greedy.peak > bound);
        }
    }

    #[test]
    fn a_capacity_below_the_bound_is_infeasible() {
        let p = Problem::new(vec![Buffer::new(0, 2, 8), Buffer::new(1, 3, 8)], 1).unwrap();
        assert_eq!(fit(&p, 15), Fit::Infeasible);
        assert!(matches!(fit(&p, 16), Fit::Found(_)));
    }
}
