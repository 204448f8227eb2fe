//! Offset-assignment strategies: the published baselines, reproduced as named strategies so that
//! comparisons are honest, and npumem's default portfolio.
//!
//! Invariant: every strategy returns a placement that [`Problem::validate`] accepts; its `peak`
//! is the validated peak.

use std::time::{Duration, Instant};

use super::exact::{Cut, Fit, Model};
use super::{Buffer, Problem};
use npumem_base::error::{AclError, Result};

/// From this many buffers the portfolio runs its orders on threads.
const PARALLEL_FROM: usize = 2_000;

/// From this many buffers the portfolio keeps two orders.
const LARGE: usize = 20_000;

/// Re-placements the improvement phase may spend: about 4 * 10^8 placement comparisons in all,
/// so a few-hundred-buffer problem gets thousands of tries; from `PARALLEL_FROM` buffers none.
fn improve_iterations(n: usize) -> usize {
    if n >= PARALLEL_FROM { 0 } else { (400_000_000 / (n * n).max(1)).min(4_000) }
}

/// How offsets are assigned.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Strategy {
    /// Every buffer its own range: offsets are prefix sums (no reuse at all).
    Naive,
    /// TFLite's `GreedyBySizeAssignment`: largest first, each into the smallest gap between
    /// already placed, time-overlapping buffers that fits (best fit), else above them.
    TfliteGreedyBySize,
    /// TVM USMP `greedy_by_size`: largest first (ties: more conflicts), each at the top of the
    /// already placed, time-overlapping buffers, with no gap filling.
    TvmGreedyBySize,
    /// TVM USMP `greedy_by_conflicts`: most conflicts first (ties: larger), placed as above.
    TvmGreedyByConflicts,
    /// Best fit in execution order (first use), as a dynamic best-fit allocator such as ONNX
    /// Runtime's arena would place them.
    BestFitInOrder,
    /// TFLite GPU's `GreedyByBreadthAssignment`: shared objects (each as large as its largest
    /// tensor) filled from the widest step down, objects side by side.
    TfliteGreedyByBreadth,
    /// npumem's default: best-fit placement under several orders (size, area, lifetime,
    /// conflicts, first use), keeping the lowest peak, then improvement around the peak (and
    /// the shared-object plan when it is lower); then, with a time limit, the exact search.
    Npumem,
}

impl Strategy {
    pub const ALL: [Strategy; 7] = [
        Strategy::Naive,
        Strategy::TfliteGreedyBySize,
        Strategy::TvmGreedyBySize,
        Strategy::TvmGreedyByConflicts,
        Strategy::BestFitInOrder,
        Strategy::TfliteGreedyByBreadth,
        Strategy::Npumem,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Strategy::Naive => "naive",
            Strategy::TfliteGreedyBySize => "tflite_greedy_by_size",
            Strategy::TvmGreedyBySize => "tvm_greedy_by_size",
            Strategy::TvmGreedyByConflicts => "tvm_greedy_by_conflicts",
            Strategy::BestFitInOrder => "best_fit_in_order",
            Strategy::TfliteGreedyByBreadth => "tflite_greedy_by_breadth",
            Strategy::Npumem => "npumem",
        }
    }

    pub fn parse(name: &str) -> Result<Strategy> {
        Strategy::ALL.into_iter().find(|s| s.name() == name).ok_or_else(|| {
            let names: Vec<&str> = Strategy::ALL.iter().map(|s| s.name()).collect();
            AclError::invalid_param(format!("unknown planning strategy {name:?}; use one of {}", names.join(", ")))
        })
    }
}

/// The orders the strategies place buffers in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Order {
    Size,
    SizeThenConflicts,
    ConflictsThenSize,
    Area,
    Lifetime,
    FirstUse,
}

impl Order {
    fn name(self) -> &'static str {
        match self {
            Order::Size => "size",
            Order::SizeThenConflicts => "size, conflicts",
            Order::ConflictsThenSize => "conflicts, size",
            Order::Area => "area",
            Order::Lifetime => "lifetime",
            Order::FirstUse => "first use",
        }
    }
}

/// How a buffer's offset is chosen among the already placed buffers it overlaps in time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Placement {
    /// The smallest gap that fits, else above the highest (TFLite).
    BestFit,
    /// Above the highest, no gap filling (TVM).
    Top,
}

/// A placement and how it was found.
#[derive(Clone, Debug)]
pub struct Plan {
    pub offsets: Vec<u64>,
    /// The largest `offset + size` with sizes rounded up to the alignment: the arena the plan
    /// needs.
    pub peak: u64,
    pub strategy: Strategy,
    /// The greedy order the plan started from ("size", "area", ...; npumem then improves on
    /// it), or "none" for naive.
    pub order: &'static str,
    pub solve_seconds: f64,
    /// The max-live lower bound of the problem.
    pub lower_bound: u64,
    /// The best proven lower bound on any placement's peak: `lower_bound`, raised by the
    /// exact search when it proves a capacity infeasible.
    pub bound: u64,
    /// Whether `peak` is proven optimal (`peak == bound`).
    pub optimal: bool,
    /// What the exact search did.
    pub exact: ExactOutcome,
    /// Search nodes the exact search visited, counted per portfolio thread over all its tries
    /// (the count of the thread that answered each try): what [`PlanOptions::work_limit`]
    /// bounds. The same on every run when no time limit cut the search.
    pub nodes: u64,
}

/// Options of [`Problem::plan_with`].
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PlanOptions {
    /// Stop as soon as a placement within this many bytes is found (MiniMalloc's decision
    /// problem); without it the exact search minimises the peak.
    pub capacity: Option<u64>,
    /// Seconds the exact search may run, counted from its start after the greedy portfolio
    /// (npumem strategy only); 0 disables it, infinity means no time limit.
    pub time_limit: f64,
    /// Search nodes the exact search may visit per portfolio thread, over all its tries; `None`
    /// for no limit, 0 disables it. Unlike the time limit it gives the same plan on a busy
    /// machine as on a quiet one.
    pub work_limit: Option<u64>,
}

/// The exact search's result for a plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExactOutcome {
    /// Not needed (the greedy plan already met the bound or the capacity), disabled, or not a
    /// strategy that has one.
    NotRun,
    /// The problem is larger than the exact model takes.
    TooLarge,
    /// The peak is proven optimal.
    Optimal,
    /// A placement within the requested capacity was found.
    ReachedCapacity,
    /// Proven, by the lower bound or by the search: nothing fits within the requested capacity
    /// (the search then went on lowering the peak: `optimal` says whether it reached the bound).
    Infeasible,
    /// The time limit ended the search before it proved optimality (the plan is the best found).
    TimedOut,
    /// The work limit ended the search before it proved optimality (the plan is the best found).
    WorkLimit,
}

impl ExactOutcome {
    pub fn name(self) -> &'static str {
        match self {
            ExactOutcome::NotRun => "not run",
            ExactOutcome::TooLarge => "too large",
            ExactOutcome::Optimal => "optimal",
            ExactOutcome::ReachedCapacity => "reached capacity",
            ExactOutcome::Infeasible => "infeasible",
            ExactOutcome::TimedOut => "timed out",
            ExactOutcome::WorkLimit => "work limit reached",
        }
    }
}

/// The outcome of a search that a limit ended before it proved optimality.
fn outcome(cut: Cut) -> ExactOutcome {
    match cut {
        Cut::Deadline => ExactOutcome::TimedOut,
        Cut::Work => ExactOutcome::WorkLimit,
    }
}

impl Problem {
    /// Assigns offsets with `strategy` (no exact search).
    pub fn plan(&self, strategy: Strategy) -> Plan {
        self.plan_with(strategy, PlanOptions::default())
    }

    /// Assigns offsets with `strategy`; for npumem, then runs the exact search within
    /// `options.time_limit` and `options.work_limit` when the greedy plan is above the bound (or
    /// above the capacity). A capacity proven infeasible (below the max-live bound, or by the
    /// search) is reported as such, and the search goes on to lower the peak, so the plan says
    /// how close one can get.
    pub fn plan_with(&self, strategy: Strategy, options: PlanOptions) -> Plan {
        let started = Instant::now();
        let lower_bound = self.lower_bound();
        let (offsets, order) = self.greedy(strategy, lower_bound);
        let peak = self.peak_of(&offsets);
        let mut plan = Plan {
            offsets,
            peak,
            strategy,
            order,
            solve_seconds: 0.0,
            lower_bound,
            bound: lower_bound,
            optimal: peak == lower_bound,
            exact: ExactOutcome::NotRun,
            nodes: 0,
        };
        let fits = options.capacity.is_some_and(|c| plan.peak <= c);
        if options.capacity.is_some_and(|c| c < plan.bound) {
            plan.exact = ExactOutcome::Infeasible; // the bound is the proof
        }
        let enabled = options.time_limit > 0.0 && options.work_limit != Some(0);
        if strategy == Strategy::Npumem && enabled && !plan.optimal && !fits {
            // The time limit is the search's own: the greedy portfolio before it does not use it up.
            let deadline = Instant::now() + Duration::from_secs_f64(options.time_limit.min(1e9));
            self.search_exact(&mut plan, options.capacity, deadline, options.work_limit.unwrap_or(u64::MAX));
        }
        plan.solve_seconds = started.elapsed().as_secs_f64();
        plan
    }

    /// Improves `plan` with the exact search: first the decision problem at the capacity (when
    /// the bound does not already rule it out), then, without a capacity or when it is proven
    /// infeasible, a search for the optimum from the bound upwards (the bound first, then
    /// bisection; each try gets half the time and half the work left). `work` is in nodes per
    /// portfolio thread.
    fn search_exact(&self, plan: &mut Plan, capacity: Option<u64>, deadline: Instant, work: u64) {
        let Some(model) = Model::build(self) else {
            if plan.exact == ExactOutcome::NotRun {
                plan.exact = ExactOutcome::TooLarge;
            }
            return;
        };
        let align = self.alignment();
        let take = |plan: &mut Plan, offsets: Vec<u64>| {
            plan.peak = self.peak_of(&offsets);
            plan.offsets = offsets;
        };
        let mut left = work; // nodes per thread still to spend
        if let Some(c) = capacity.filter(|&c| c >= plan.bound) {
            let (fit, nodes) = model.fit(c, deadline, left);
            plan.nodes += nodes;
            left -= nodes;
            match fit {
                Fit::Found(o) => {
                    take(plan, o);
                    plan.exact = ExactOutcome::ReachedCapacity;
                    plan.optimal = plan.peak == plan.bound;
                    return;
                }
                Fit::Infeasible => plan.bound = plan.bound.max(c / align * align + align),
                Fit::Unknown(cut) => {
                    plan.exact = outcome(cut);
                    return;
                }
            }
            plan.exact = ExactOutcome::Infeasible;
        }
        // Invariants: `plan.bound` is proven; `plan.peak` is achieved; capacities from `lo`
        // up are still to try (those below it were cut short or are infeasible).
        let mut lo = plan.bound;
        let mut cut = None;
        while lo < plan.peak {
            let now = Instant::now();
            if now >= deadline {
                cut = Some(Cut::Deadline);
                break;
            }
            if left == 0 {
                cut = Some(Cut::Work);
                break;
            }
            let mid = if lo == plan.bound { lo } else { (lo + (plan.peak - lo) / 2) / align * align };
            let (fit, nodes) = model.fit(mid, now + (deadline - now) / 2, left.div_ceil(2));
            plan.nodes += nodes;
            left -= nodes;
            match fit {
                Fit::Found(o) => take(plan, o),
                Fit::Infeasible => {
                    plan.bound = plan.bound.max(mid + align);
                    lo = mid + align;
                }
                Fit::Unknown(why) => {
                    cut = Some(why);
                    lo = mid + align;
                }
            }
        }
        plan.optimal = plan.peak == plan.bound;
        if plan.exact != ExactOutcome::Infeasible {
            plan.exact = match cut {
                _ if plan.optimal => ExactOutcome::Optimal,
                Some(cut) => outcome(cut),
                None => ExactOutcome::TimedOut,
            };
        }
    }

    /// The greedy (and improved) placement of `strategy` and the order it started from;
    /// `bound` (the max-live bound) lets the improvement phase stop early.
    fn greedy(&self, strategy: Strategy, bound: u64) -> (Vec<u64>, &'static str) {
        match strategy {
            Strategy::Naive => (self.naive(), "none"),
            Strategy::TfliteGreedyBySize => self.place(Order::Size, Placement::BestFit),
            Strategy::TvmGreedyBySize => self.place(Order::SizeThenConflicts, Placement::Top),
            Strategy::TvmGreedyByConflicts => self.place(Order::ConflictsThenSize, Placement::Top),
            Strategy::BestFitInOrder => self.place(Order::FirstUse, Placement::BestFit),
            Strategy::TfliteGreedyByBreadth => (self.greedy_by_breadth(), "breadth"),
            Strategy::Npumem => {
                // From LARGE buffers the two orders that win on large graphs (size for SOMAS
                // pangu, conflicts for iopddl S_1/Y_1; area and first use never did), one
                // thread each, to stay within about a second.
                let all = [Order::Size, Order::Area, Order::Lifetime, Order::ConflictsThenSize, Order::FirstUse];
                let orders: &[Order] =
                    if self.buffers().len() >= LARGE { &[Order::Size, Order::ConflictsThenSize] } else { &all };
                let run = |o: Order| {
                    let seq = self.order(o);
                    let offsets = self.place_seq(&seq, Placement::BestFit);
                    (seq, offsets, o.name())
                };
                // The orders are independent: on large problems, one thread each.
                let tried: Vec<(Vec<usize>, Vec<u64>, &'static str)> = if self.buffers().len() >= PARALLEL_FROM {
                    std::thread::scope(|scope| {
                        let runs: Vec<_> = orders.iter().map(|&o| scope.spawn(move || run(o))).collect();
                        runs.into_iter().map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p))).collect()
                    })
                } else {
                    orders.iter().map(|&o| run(o)).collect()
                };
                // The first order wins ties, so the result does not depend on thread timing.
                let (seq, offsets, name) =
                    tried.into_iter().min_by_key(|(_, offsets, _)| self.peak_of(offsets)).unwrap_or_default();
                let iterations = improve_iterations(seq.len());
                let improved = self.improve(seq, offsets, iterations, bound);
                // Shared objects occasionally win on small problems; under LARGE it is cheap.
                if self.buffers().len() < LARGE {
                    let shared = self.greedy_by_breadth();
                    if self.peak_of(&shared) < self.peak_of(&improved) {
                        return (shared, "breadth");
                    }
                }
                (improved, name)
            }
        }
    }

    pub(super) fn peak_of(&self, offsets: &[u64]) -> u64 {
        self.buffers().iter().zip(offsets).map(|(b, o)| o + self.aligned(b.size)).max().unwrap_or(0)
    }

    fn naive(&self) -> Vec<u64> {
        let mut next = 0;
        self.buffers()
            .iter()
            .map(|b| {
                let o = next;
                next += self.aligned(b.size);
                o
            })
            .collect()
    }

    /// For each buffer, how many others it overlaps in time: O(n log n) from the sorted bounds.
    fn conflicts(&self) -> Vec<u64> {
        let mut lowers: Vec<u64> = self.buffers().iter().map(|b| b.lower).collect();
        let mut uppers: Vec<u64> = self.buffers().iter().map(|b| b.upper).collect();
        lowers.sort_unstable();
        uppers.sort_unstable();
        self.buffers()
            .iter()
            .map(|b| {
                let started_before_end = lowers.partition_point(|&l| l < b.upper);
                let ended_before_start = uppers.partition_point(|&u| u <= b.lower);
                (started_before_end - ended_before_start - 1) as u64
            })
            .collect()
    }

    fn order(&self, order: Order) -> Vec<usize> {
        let bs = self.buffers();
        let mut idx: Vec<usize> = (0..bs.len()).collect();
        let life = |b: &Buffer| b.upper - b.lower;
        match order {
            Order::Size => idx.sort_by_key(|&i| std::cmp::Reverse(bs[i].size)),
            Order::SizeThenConflicts | Order::ConflictsThenSize => {
                let c = self.conflicts();
                if order == Order::SizeThenConflicts {
                    idx.sort_by_key(|&i| std::cmp::Reverse((bs[i].size, c[i])));
                } else {
                    idx.sort_by_key(|&i| std::cmp::Reverse((c[i], bs[i].size)));
                }
            }
            Order::Area => {
                idx.sort_by_key(|&i| std::cmp::Reverse((bs[i].size as u128 * life(&bs[i]) as u128, bs[i].size)))
            }
            Order::Lifetime => idx.sort_by_key(|&i| std::cmp::Reverse((life(&bs[i]), bs[i].size))),
            Order::FirstUse => idx.sort_by_key(|&i| (bs[i].lower, std::cmp::Reverse(bs[i].size))),
        }
        idx
    }

    fn place(&self, order: Order, placement: Placement) -> (Vec<u64>, &'static str) {
        (self.place_seq(&self.order(order), placement), order.name())
    }

    /// Places buffers one by one in the sequence `seq`. The placed ones are kept sorted by
    /// offset in columns (lifetimes as `u32` ranks of the distinct steps, offsets, ends), cut
    /// into chunks of at most [`CHUNK`] so an insertion moves one chunk: per chunk a vectorised
    /// pass marks those that overlap the new buffer in time, then one scan over the marked ones
    /// finds the gaps. O(n^2) comparisons, most of them SIMD.
    pub(super) fn place_seq(&self, seq: &[usize], placement: Placement) -> Vec<u64> {
        let bs = self.buffers();
        let (lower, upper) = self.time_ranks();
        let mut offsets = vec![0u64; bs.len()];
        let mut chunks: Vec<Columns> = vec![Columns::default()];
        let mut mask: Vec<u8> = Vec::with_capacity(CHUNK);
        for &i in seq {
            let (bl, bu, size) = (lower[i], upper[i], bs[i].size);
            let mut top = 0u64;
            let mut best: Option<(u64, u64)> = None;
            // A gap of exactly the aligned size cannot be beaten: stop scanning there.
            let perfect = self.aligned(size);
            'scan: for ch in &chunks {
                mask.clear();
                mask.extend(ch.lo.iter().zip(&ch.hi).map(|(&l, &h)| ((l < bu) & (bl < h)) as u8));
                // Returns true at a perfect fit.
                let mut visit = |k: usize| {
                    if placement == Placement::BestFit {
                        let at = self.aligned(top);
                        let o = ch.off[k];
                        if o >= at && o - at >= size && best.is_none_or(|(gap, _)| o - at < gap) {
                            best = Some((o - at, at));
                            if o - at == perfect {
                                return true;
                            }
                        }
                    }
                    top = top.max(ch.end[k]);
                    false
                };
                // Eight marks at a time: most words are all zero.
                let words = mask.chunks_exact(8);
                let rest = words.remainder().len();
                for (w, word) in words.enumerate() {
                    let mut bits = u64::from_le_bytes(word.try_into().unwrap_or_default());
                    while bits != 0 {
                        if visit(w * 8 + bits.trailing_zeros() as usize / 8) {
                            break 'scan;
                        }
                        bits &= bits - 1; // each mark is bit 0 of its byte
                    }
                }
                let tail = mask.len() - rest;
                for (k, &m) in mask.iter().enumerate().skip(tail) {
                    if m != 0 && visit(k) {
                        break 'scan;
                    }
                }
            }
            let offset = best.map_or_else(|| self.aligned(top), |(_, at)| at);
            offsets[i] = offset;
            // The last chunk that starts at or below `offset` (or the first one).
            let c = chunks.partition_point(|ch| ch.off.first().is_some_and(|&o| o <= offset)).saturating_sub(1);
            chunks[c].insert(bl, bu, offset, offset + size);
            if chunks[c].off.len() >= CHUNK {
                let tail = chunks[c].split_off(CHUNK / 2);
                chunks.insert(c + 1, tail);
            }
        }
        offsets
    }

    /// Each buffer's lower and upper step as ranks among all distinct steps: order (and so
    /// overlap) is preserved, and a `u32` column packs twice as many lanes as `u64`.
    fn time_ranks(&self) -> (Vec<u32>, Vec<u32>) {
        let bs = self.buffers();
        let mut steps: Vec<u64> = bs.iter().flat_map(|b| [b.lower, b.upper]).collect();
        steps.sort_unstable();
        steps.dedup();
        let rank = |t: u64| steps.partition_point(|&s| s < t) as u32;
        (bs.iter().map(|b| rank(b.lower)).collect(), bs.iter().map(|b| rank(b.upper)).collect())
    }
}

/// Placed buffers in offset order, one column per field (see [`Problem::place_seq`]).
const CHUNK: usize = 1024;

#[derive(Default)]
struct Columns {
    lo: Vec<u32>,
    hi: Vec<u32>,
    off: Vec<u64>,
    end: Vec<u64>,
}

impl Columns {
    fn insert(&mut self, lo: u32, hi: u32, off: u64, end: u64) {
        let pos = self.off.partition_point(|&o| o <= off);
        self.lo.insert(pos, lo);
        self.hi.insert(pos, hi);
        self.off.insert(pos, off);
        self.end.insert(pos, end);
    }

    fn split_off(&mut self, at: usize) -> Columns {
        Columns {
            lo: self.lo.split_off(at),
            hi: self.hi.split_off(at),
            off: self.off.split_off(at),
            end: self.end.split_off(at),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Strategy;
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn names_round_trip_and_unknown_names_fail() {
        for s in Strategy::ALL {
            assert_eq!(Strategy::parse(s.name()).unwrap(), s);
        }
        let err = Strategy::parse("magic").unwrap_err();
        assert!(err.message.contains("tflite_greedy_by_size"), "{}", err.message);
    }

    #[test]
    fn a_chain_reuses_memory_and_naive_does_not() {
        // a -> b -> c: each buffer dies when the next is born, so one slot of 100 is enough.
        let p = Problem::new(vec![Buffer::new(0, 1, 100), Buffer::new(1, 2, 100), Buffer::new(2, 3, 100)], 1).unwrap();
        assert_eq!(p.plan(Strategy::Naive).peak, 300);
        for s in &Strategy::ALL[1..] {
            assert_eq!(p.plan(*s).peak, 100, "{s:?}");
        }
    }

    #[test]
    fn best_fit_fills_a_gap_that_top_placement_skips() {
        // Two long buffers with a short-lived one between them in address; a later small buffer
        // fits in the hole the short one leaves.
        let p = Problem::new(
            vec![Buffer::new(0, 10, 64), Buffer::new(0, 2, 32), Buffer::new(0, 10, 64), Buffer::new(5, 10, 32)],
            1,
        )
        .unwrap();
        let best = p.plan(Strategy::BestFitInOrder);
        assert_eq!(best.peak, 160);
        assert_eq!(p.validate(&best.offsets).unwrap(), 160);
        assert_eq!(p.lower_bound(), 160);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        #[test]
        fn every_strategy_is_valid_and_above_the_bound(
            raw in proptest::collection::vec((0u64..40, 1u64..15, 1u64..5000), 1..80),
            align_pow in 0u32..7,
        ) {
            let buffers = raw.into_iter().map(|(l, d, s)| Buffer::new(l, l + d, s)).collect();
            let p = Problem::new(buffers, 1 << align_pow).unwrap();
            let bound = p.lower_bound();
            let mut peaks = Vec::new();
            for s in Strategy::ALL {
                let plan = p.plan(s);
                prop_assert_eq!(p.validate(&plan.offsets).unwrap(), plan.peak);
                prop_assert!(plan.peak >= bound, "{:?}: {} < {}", s, plan.peak, bound);
                peaks.push(plan.peak);
            }
            // The portfolio includes the TFLite order, the first-use order and shared objects.
            prop_assert!(peaks[6] <= peaks[1] && peaks[6] <= peaks[4] && peaks[6] <= peaks[5]);
        }
    }
}
