//! Graph planning on arbitrary graphs: `plan::Graph::new` (the graph reader's checks), its
//! liveness, and `Graph::plan` with every strategy, scheduler, alignment, memory limit and move
//! option.
//!
//! Checked: no panic (a bad graph or option is an error); liveness gives every tensor a buffer
//! that is live at each step where an op reads or writes it, with non-empty lifetimes and
//! positive sizes; a graph plan's offsets validate against its arena with its own peak; `fits`
//! says whether resident memory plus the arena is within the limit; the resident bytes by role
//! add up to the resident total.

use arbitrary::{Arbitrary, Unstructured};
use npumem_core::plan::{
    Graph, GraphOptions, MoveOptions, Op, Problem, Role, ScheduleOptions, Scheduler, Strategy, Tensor,
};

use crate::plan::{Alignment, Num};

#[derive(Arbitrary, Debug)]
struct InTensor {
    size: Num,
    role: u8,
    alias_of: Option<u8>,
}

#[derive(Arbitrary, Debug)]
struct InOp {
    inputs: Vec<u8>,
    outputs: Vec<u8>,
    workspace: Num,
}

#[derive(Arbitrary, Debug)]
struct Input {
    tensors: Vec<InTensor>,
    ops: Vec<InOp>,
    alignment: Alignment,
    strategy: u8,
    mem_limit: Option<Num>,
    allow: (bool, bool, bool),
    per_transfer: Num,
}

const ROLES: [Role; 4] = [Role::Activation, Role::Weight, Role::Input, Role::Output];

pub fn run(data: &[u8]) {
    let Ok(input) = Input::arbitrary_take_rest(Unstructured::new(data)) else { return };
    // One index past the end now and then: an out-of-range reference.
    let n = input.tensors.len().min(40);
    let index = |i: u8| usize::from(i) % (n + 1);
    let tensors: Vec<Tensor> = input.tensors[..n]
        .iter()
        .map(|t| Tensor { size: t.size.value(), role: ROLES[usize::from(t.role) % 4], alias_of: t.alias_of.map(index) })
        .collect();
    let ops: Vec<Op> = input
        .ops
        .iter()
        .take(40)
        .map(|o| Op {
            inputs: o.inputs.iter().take(6).map(|&i| index(i)).collect(),
            outputs: o.outputs.iter().take(4).map(|&i| index(i)).collect(),
            workspace: o.workspace.value(),
        })
        .collect();
    let Ok(graph) = Graph::new(tensors.clone(), ops.clone()) else { return };
    let live = graph.liveness();
    assert_eq!(live.buffer_of.len(), tensors.len());
    assert_eq!(live.steps, ops.len() as u64);
    assert_eq!(live.uses.len(), live.buffers.len());
    for b in &live.buffers {
        assert!(b.buffer.lower < b.buffer.upper && b.buffer.size > 0, "{b:?}");
    }
    for (k, op) in ops.iter().enumerate() {
        let k = k as u64;
        for &t in op.inputs.iter().chain(&op.outputs) {
            let b = &live.buffers[live.buffer_of[t]];
            assert!(b.buffer.lower <= k && k < b.buffer.upper, "tensor {t} used at step {k}: {b:?}");
            assert!(live.uses[live.buffer_of[t]].binary_search(&k).is_ok(), "uses of tensor {t}");
        }
        if op.workspace > 0 {
            assert!(live.buffers.iter().any(|b| b.role.is_none() && b.owner == k as usize), "workspace of op {k}");
        }
    }
    let options = GraphOptions {
        alignment: input.alignment.value(),
        strategy: Strategy::ALL[usize::from(input.strategy) % Strategy::ALL.len()],
        time_limit: 0.0,
        work_limit: None,
        mem_limit: input.mem_limit.map(Num::value),
        allow: MoveOptions {
            weights: input.allow.0,
            activations: input.allow.1,
            recompute: input.allow.2,
            per_transfer: input.per_transfer.value(),
        },
        // Half the inputs choose the order first, with every scheduler and a small search.
        schedule: (input.strategy & 0x80 != 0).then(|| ScheduleOptions {
            scheduler: Scheduler::ALL[usize::from(input.strategy >> 3) % Scheduler::ALL.len()],
            work_limit: 500,
        }),
    };
    let Ok(gp) = graph.plan(options) else {
        return;
    };
    let problem = Problem::new(gp.reduced.arena.clone(), options.alignment).expect("the arena is a valid problem");
    assert_eq!(problem.validate(&gp.plan.offsets).ok(), Some(gp.plan.peak), "{:?}", gp.plan);
    let limit = options.mem_limit.unwrap_or(u64::MAX);
    assert_eq!(gp.fits, gp.reduced.resident.saturating_add(gp.plan.peak) <= limit, "fits");
    let by_role = u128::from(gp.weights) + u128::from(gp.inputs) + u128::from(gp.outputs);
    assert_eq!(by_role, u128::from(gp.reduced.resident), "resident bytes by role");
    if let Some(s) = &gp.schedule {
        let reordered = graph.reordered(&s.order).expect("the chosen order is a permutation of the ops");
        assert_eq!(reordered.liveness().buffers, gp.liveness.buffers, "the plan's liveness is the order's");
    }
}
