//! Choosing the order of a graph's ops to lower its memory, before offsets are planned.
//!
//! Rules:
//! - an order is valid when it respects [`Dag`]'s edges (data, and alias classes' writes in
//!   program order); every strategy returns a valid order ([`Dag::is_order`], checked in tests);
//! - an order is judged by its max-live bound ([`Dag::peak`], the arena's bound for that order);
//!   [`Graph::plan`](crate::Graph) then places offsets for the candidates and keeps the lowest
//!   arena, so fragmentation decides between orders of equal bound;
//! - `npumem` takes the best of the given order, the XLA and Inductor portfolios and the exact
//!   search ([`search`]) seeded with their best as the bound to beat, so it is never above any
//!   of them; `bound` is proven for every order: the must-live floor ([`bound`]) or, when the
//!   search finished exactly, the optimum itself;
//! - everything is bounded by work, not time: the same graph and limits give the same order.

mod anchors;
mod bound;
mod dag;
mod search;

use super::graph::Graph;
use npumem_base::error::{AclError, Result};

pub(crate) use dag::Dag;

/// Who chooses the order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Scheduler {
    /// The order the graph lists its ops in.
    Given,
    /// XLA's `DefaultMemoryScheduler` portfolio (list, DFS, post-order).
    Xla,
    /// PyTorch Inductor's `reorder_for_peak_memory` portfolio (baseline, LPMF, BFS, DFS).
    Inductor,
    /// The best of the above and npumem's exact (or, past its width, beam) search.
    Npumem,
}

impl Scheduler {
    pub const ALL: [Scheduler; 4] = [Scheduler::Given, Scheduler::Xla, Scheduler::Inductor, Scheduler::Npumem];

    pub fn name(self) -> &'static str {
        match self {
            Scheduler::Given => "given",
            Scheduler::Xla => "xla",
            Scheduler::Inductor => "inductor",
            Scheduler::Npumem => "npumem",
        }
    }

    pub fn parse(name: &str) -> Result<Scheduler> {
        Scheduler::ALL.into_iter().find(|s| s.name() == name).ok_or_else(|| {
            AclError::invalid_param(format!("unknown scheduler {name:?}; use one of given, xla, inductor, npumem"))
        })
    }
}

/// Transitions the npumem search may evaluate by default: each graph we hold schedules in well
/// under a second on one core.
pub const DEFAULT_SCHEDULE_WORK: u64 = 2_000_000;

/// Options of [`Graph::schedule`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScheduleOptions {
    pub scheduler: Scheduler,
    /// Transitions (one op tried from one state) the exact search may evaluate.
    pub work_limit: u64,
}

/// One strategy's order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate {
    pub scheduler: Scheduler,
    /// Which member of the portfolio won ("list", "lpmf", ...; "search" for npumem's own).
    pub detail: &'static str,
    /// Op indices in execution order.
    pub order: Vec<usize>,
    /// The order's max-live bound (arena bytes, aligned).
    pub bound: u64,
}

/// The orders considered and what is proven.
#[derive(Clone, Debug)]
pub struct Schedule {
    /// Given, XLA, Inductor and (for npumem) the search's order, when it found one at most as
    /// high as theirs; only the requested one otherwise.
    pub candidates: Vec<Candidate>,
    /// The given order's max-live bound.
    pub given_bound: u64,
    /// A lower bound on the arena of every valid order.
    pub bound: u64,
    /// Whether the search finished exactly: the least max-live bound is then `bound`.
    pub exact: bool,
    /// Transitions the search evaluated.
    pub work: u64,
}

impl Graph {
    /// The candidate orders of `options.scheduler` with arena sizes rounded to `alignment`.
    pub fn schedule(&self, alignment: u64, options: ScheduleOptions) -> Schedule {
        let d = Dag::new(self, alignment);
        let given: Vec<usize> = (0..d.n).collect();
        let given_bound = d.peak(&given);
        let cand = |scheduler, (order, detail): (Vec<usize>, &'static str)| Candidate {
            scheduler,
            detail,
            bound: d.peak(&order),
            order,
        };
        let mut candidates = Vec::new();
        if matches!(options.scheduler, Scheduler::Given | Scheduler::Npumem) {
            candidates.push(cand(Scheduler::Given, (given, "given")));
        }
        if matches!(options.scheduler, Scheduler::Xla | Scheduler::Npumem) {
            candidates.push(cand(Scheduler::Xla, anchors::xla(&d)));
        }
        if matches!(options.scheduler, Scheduler::Inductor | Scheduler::Npumem) {
            candidates.push(cand(Scheduler::Inductor, anchors::inductor(&d)));
        }
        let floor = bound::floors(&d);
        let mut bound = bound::any_order_bound(&floor, &d);
        let (mut exact, mut work) = (false, 0);
        if options.scheduler == Scheduler::Npumem && options.work_limit > 0 {
            let upper = candidates.iter().map(|c| c.bound).min().unwrap_or(0);
            if upper > bound {
                let width = width(options.work_limit, d.n);
                let found = search::search(&d, upper, &floor, width, options.work_limit);
                work = found.work;
                exact = found.exact;
                bound = bound.max(found.bound);
                if let Some(order) = found.order {
                    candidates.push(Candidate {
                        scheduler: Scheduler::Npumem,
                        detail: "search",
                        order,
                        bound: found.peak,
                    });
                }
            } else {
                exact = true; // a heuristic reached the floor
            }
        }
        Schedule { candidates, given_bound, bound, exact, work }
    }

    /// The same graph with its ops in `order` (a permutation that respects the data edges).
    pub fn reordered(&self, order: &[usize]) -> Result<Graph> {
        let n = self.ops().len();
        let mut seen = vec![false; n];
        for &o in order {
            if o >= n || std::mem::replace(&mut seen[o], true) {
                return Err(AclError::invalid_param(format!(
                    "order lists op {o} twice or out of range; give each of the {n} ops once"
                )));
            }
        }
        if order.len() != n {
            return Err(AclError::invalid_param(format!("order lists {} ops; the graph has {n}", order.len())));
        }
        Graph::new(self.tensors().to_vec(), order.iter().map(|&o| self.ops()[o].clone()).collect())
    }
}

/// States per level: the work limit spread over the levels, a few transitions per state.
fn width(work: u64, n: usize) -> usize {
    (work / (4 * n.max(1) as u64)).clamp(16, 1 << 16) as usize
}

#[cfg(test)]
mod tests;
