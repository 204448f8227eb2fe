//! Planning a whole graph: optionally an order of its ops first, then liveness, then (under a
//! memory limit) offload and recompute moves, then offsets for the activation arena with any
//! strategy.
//!
//! Invariants: every arena buffer gets an offset that `Problem::validate` accepts; `resident`
//! counts weights that stay on the device, graph inputs and outputs (aligned); with a limit,
//! `fits` is `resident + plan.peak <= limit`. With a schedule, the order comes before the moves
//! (a better order may need none), each candidate order is planned in full and the one that fits
//! with the fewest bytes moved wins, then the lowest total, the lower order bound, the earlier
//! candidate; steps and op indices in
//! `liveness` and `reduced` are then those of the reordered graph (`order[k]` ran at step `k`).

use super::graph::{Graph, Liveness, Role};
use super::limit::{MoveOptions, Reduced, reduce};
use super::{Plan, PlanOptions, Problem, Schedule, ScheduleOptions, Strategy};
use npumem_base::error::{AclError, Result};

/// Options of [`Graph::plan`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GraphOptions {
    pub alignment: u64,
    pub strategy: Strategy,
    /// Seconds for the exact search (npumem strategy).
    pub time_limit: f64,
    /// Search nodes for the exact search, per portfolio thread (see [`PlanOptions::work_limit`]).
    pub work_limit: Option<u64>,
    /// Device bytes for weights + graph I/O + arena; moves are chosen when over it.
    pub mem_limit: Option<u64>,
    pub allow: MoveOptions,
    /// Choose the order of the ops first (None: the given order, as listed).
    pub schedule: Option<ScheduleOptions>,
}

/// The order a scheduled plan runs its ops in, and the candidates it was chosen from.
#[derive(Clone, Debug)]
pub struct ScheduledOrder {
    /// Original op indices in execution order.
    pub order: Vec<usize>,
    /// Index of the chosen candidate in `schedule.candidates`.
    pub chosen: usize,
    pub schedule: Schedule,
    /// The planned arena of each candidate (same index).
    pub arenas: Vec<u64>,
}

/// A planned graph.
#[derive(Clone, Debug)]
pub struct GraphPlan {
    pub liveness: Liveness,
    /// The arena's buffers (after moves), their owners and the moves.
    pub reduced: Reduced,
    /// Offsets of `reduced.arena` (`plan.lower_bound` is the arena's max-live bound).
    pub plan: Plan,
    /// Resident bytes by role after the moves (aligned): weights, inputs, outputs.
    pub weights: u64,
    pub inputs: u64,
    pub outputs: u64,
    /// Whether `resident + arena` is within the limit (true without one).
    pub fits: bool,
    /// With `GraphOptions::schedule`: the order chosen.
    pub schedule: Option<ScheduledOrder>,
}

/// How scheduled candidates compare: misses the limit, bytes moved, total, order bound, index.
type Rank = (bool, u64, u64, u64, usize);

/// Rounds of "plan, then tighten the target by the fragmentation" under a limit.
const ROUNDS: usize = 8;

impl Graph {
    pub fn plan(&self, options: GraphOptions) -> Result<GraphPlan> {
        let Some(sched) = options.schedule else {
            return self.plan_in_order(options);
        };
        Problem::new(Vec::new(), options.alignment)?;
        let schedule = self.schedule(options.alignment, sched);
        let mut best: Option<(Rank, GraphPlan)> = None;
        let mut arenas = Vec::with_capacity(schedule.candidates.len());
        for (i, c) in schedule.candidates.iter().enumerate() {
            // Portfolios often agree: an order already planned is not planned again.
            if let Some(j) = schedule.candidates[..i].iter().position(|p| p.order == c.order) {
                arenas.push(arenas[j]);
                continue;
            }
            let gp = self.reordered(&c.order)?.plan_in_order(options)?;
            let total = gp.weights + gp.inputs + gp.outputs + gp.plan.peak;
            arenas.push(gp.plan.peak);
            // What fits with the fewest bytes moved, then the lowest total: an order that needs
            // no moves beats one that fits only by copying or recomputing.
            let moved = gp.reduced.moves.iter().map(|m| m.bytes).fold(0u64, u64::saturating_add);
            let key = (!gp.fits, moved, total, c.bound, i);
            if best.as_ref().is_none_or(|(k, _)| key < *k) {
                best = Some((key, gp));
            }
        }
        let Some(((_, _, _, _, chosen), mut gp)) = best else {
            return self.plan_in_order(options);
        };
        let order = schedule.candidates[chosen].order.clone();
        gp.schedule = Some(ScheduledOrder { order, chosen, schedule, arenas });
        Ok(gp)
    }

    fn plan_in_order(&self, options: GraphOptions) -> Result<GraphPlan> {
        let align = options.alignment;
        // The moves add sizes rounded to the alignment (resident bytes, bytes live at a step)
        // before any problem checks them: check the alignment, and that all the graph's buffers
        // together fit in 64 bits, which bounds every such sum.
        Problem::new(Vec::new(), align)?;
        let live = self.liveness();
        Problem::new(live.buffers.iter().map(|b| b.buffer).collect(), align)
            .map_err(|e| AclError::new(e.code, format!("the graph's tensors and workspaces: {}", e.message)))?;
        let limit = options.mem_limit.unwrap_or(u64::MAX);
        let mut target = limit;
        let mut round = 0;
        loop {
            let reduced = reduce(self, &live, align, target, options.allow);
            let problem = Problem::new(reduced.arena.clone(), align)?;
            let capacity = options.mem_limit.map(|m| m.saturating_sub(reduced.resident));
            let plan = problem.plan_with(
                options.strategy,
                PlanOptions { capacity, time_limit: options.time_limit, work_limit: options.work_limit },
            );
            let total = reduced.resident.saturating_add(plan.peak);
            round += 1;
            if total <= limit || round == ROUNDS || target == 0 {
                return Ok(self.finish(live, reduced, plan, align, total <= limit));
            }
            // Fragmentation: ask the moves for what the placement lost over the bound.
            target = target.saturating_sub(total - limit);
        }
    }

    fn finish(&self, live: Liveness, reduced: Reduced, plan: Plan, align: u64, fits: bool) -> GraphPlan {
        let (mut weights, mut inputs, mut outputs) = (0, 0, 0);
        for (b, gb) in live.buffers.iter().enumerate() {
            if gb.planned() || reduced.moves.iter().any(|m| m.buffer == b) {
                continue;
            }
            let size = gb.buffer.size.next_multiple_of(align);
            match gb.role {
                Some(Role::Weight) => weights += size,
                Some(Role::Input) => inputs += size,
                Some(Role::Output) => outputs += size,
                _ => {}
            }
        }
        GraphPlan { liveness: live, reduced, plan, weights, inputs, outputs, fits, schedule: None }
    }
}

#[cfg(test)]
mod tests {
    use super::super::graph::{Op, Tensor};
    use super::*;

    #[test]
    fn a_chain_plans_at_the_bound_and_a_limit_triggers_moves() {
        // x -> 6 layers (weights w_i) -> y; plus a skip from layer 0's output to the last layer.
        let mut tensors = vec![Tensor { size: 4096, role: Role::Input, alias_of: None }];
        let mut ops = Vec::new();
        let mut prev = 0;
        for i in 0..6 {
            tensors.push(Tensor { size: 512, role: Role::Weight, alias_of: None });
            let w = tensors.len() - 1;
            let role = if i == 5 { Role::Output } else { Role::Activation };
            tensors.push(Tensor { size: 4096, role, alias_of: None });
            let out = tensors.len() - 1;
            let mut inputs = vec![prev, w];
            if i == 5 {
                inputs.push(2); // the skip: layer 0's output
            }
            ops.push(Op { inputs, outputs: vec![out], workspace: 1024 });
            prev = out;
        }
        let g = Graph::new(tensors, ops).unwrap();
        let none = MoveOptions { weights: false, activations: false, recompute: false, per_transfer: 0 };
        let opts = GraphOptions {
            alignment: 512,
            strategy: Strategy::Npumem,
            time_limit: 0.0,
            work_limit: None,
            mem_limit: None,
            allow: none,
            schedule: None,
        };
        let free = g.plan(opts).unwrap();
        assert!(free.fits && free.reduced.moves.is_empty());
        assert_eq!(free.plan.peak, free.plan.lower_bound);
        assert_eq!((free.weights, free.inputs, free.outputs), (6 * 512, 4096, 4096));
        let total = free.weights + free.inputs + free.outputs + free.plan.peak;
        let all = MoveOptions { weights: true, activations: true, recompute: true, per_transfer: 0 };
        let tight = g.plan(GraphOptions { mem_limit: Some(total - 2048), allow: all, ..opts }).unwrap();
        assert!(tight.fits, "{:?}", tight.reduced.moves);
        assert!(!tight.reduced.moves.is_empty());
        let p = Problem::new(tight.reduced.arena.clone(), 512).unwrap();
        assert_eq!(p.validate(&tight.plan.offsets).unwrap(), tight.plan.peak);
        assert!(tight.weights + tight.inputs + tight.outputs + tight.plan.peak <= total - 2048);
        let stuck = g.plan(GraphOptions { mem_limit: Some(4096), allow: all, ..opts }).unwrap();
        assert!(!stuck.fits);
    }
}
