//! A compute graph to plan: ops in execution order, tensors with sizes and roles, aliases, and
//! per-op workspaces. [`Graph::liveness`] turns it into planning buffers.
//!
//! Semantics (inclusive op steps, as graph compilers use them): op `k` runs at step `k`; its
//! inputs and outputs are live at step `k`. An activation lives from its producer's step to its
//! last consumer's step (just its producer's step when nothing reads it); graph outputs live to
//! the last step; weights and graph inputs from step 0 to their last use. A workspace lives for
//! its op's step only. Aliases (views, in-place results, outputs that reuse an input) form
//! classes by union-find: a class is one buffer whose lifetime is the hull of its members' and
//! whose size is the largest member's. A class holding a weight, a graph input or a graph output
//! is resident (not planned into the activation arena); the other classes and the workspaces are
//! planned.
//!
//! Invariants (checked by [`Graph::new`]): indices are in range; every tensor has at most one
//! producer; weights and graph inputs have none; an activation or output that an op reads has a
//! producer at an earlier step; alias chains are acyclic; sizes are positive.

use super::Buffer;
use npumem_base::error::{AclError, Result};

/// What a tensor is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Role {
    /// An intermediate result: planned into the arena.
    Activation,
    /// A constant parameter: resident for the whole run.
    Weight,
    /// A graph input, provided by the caller.
    Input,
    /// A graph output, handed back to the caller (lives to the end).
    Output,
}

impl Role {
    pub fn parse(name: &str) -> Result<Role> {
        Ok(match name {
            "activation" => Role::Activation,
            "weight" => Role::Weight,
            "input" => Role::Input,
            "output" => Role::Output,
            _ => {
                return Err(AclError::invalid_param(format!(
                    "unknown tensor role {name:?}; use activation, weight, input or output"
                )));
            }
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Role::Activation => "activation",
            Role::Weight => "weight",
            Role::Input => "input",
            Role::Output => "output",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tensor {
    pub size: u64,
    pub role: Role,
    /// The tensor whose memory this one shares (a view, an in-place result).
    pub alias_of: Option<usize>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Op {
    pub inputs: Vec<usize>,
    pub outputs: Vec<usize>,
    /// Scratch bytes the op needs while it runs.
    pub workspace: u64,
}

/// Ops in execution order over tensors.
#[derive(Clone, Debug)]
pub struct Graph {
    tensors: Vec<Tensor>,
    ops: Vec<Op>,
}

/// One buffer of the lowered graph: an alias class or a workspace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GraphBuffer {
    /// Live over the half-open steps `[lower, upper)`; `size` is the largest member's.
    pub buffer: Buffer,
    /// The class's role (weight > input > output > activation when members differ);
    /// `None` for a workspace.
    pub role: Option<Role>,
    /// The op of a workspace, or the class's representative tensor.
    pub owner: usize,
}

/// The graph lowered to buffers.
#[derive(Clone, Debug)]
pub struct Liveness {
    pub buffers: Vec<GraphBuffer>,
    /// For each tensor, its buffer.
    pub buffer_of: Vec<usize>,
    /// For each buffer, the steps at which an op produces or reads one of its tensors (sorted).
    pub uses: Vec<Vec<u64>>,
    /// Steps in the graph (= ops).
    pub steps: u64,
}

impl GraphBuffer {
    /// Whether the buffer goes into the planned arena (activations and workspaces).
    pub fn planned(&self) -> bool {
        matches!(self.role, None | Some(Role::Activation))
    }
}

impl Graph {
    /// Checks the graph (see the module's invariants); errors name the tensor or op.
    pub fn new(tensors: Vec<Tensor>, ops: Vec<Op>) -> Result<Graph> {
        let n = tensors.len();
        let bad = |msg: String| Err(AclError::invalid_param(msg));
        let mut producer: Vec<Option<usize>> = vec![None; n];
        for (k, op) in ops.iter().enumerate() {
            for &t in op.inputs.iter().chain(&op.outputs) {
                if t >= n {
                    return bad(format!("op {k} uses tensor {t}, but there are {n} tensors"));
                }
            }
            for &t in &op.outputs {
                if let Some(p) = producer[t] {
                    return bad(format!(
                        "tensor {t} is produced by op {p} and again by op {k}; give each result its own tensor (alias_of for in-place)"
                    ));
                }
                if matches!(tensors[t].role, Role::Weight | Role::Input) {
                    return bad(format!(
                        "tensor {t} is {} but op {k} produces it; mark it activation or output",
                        if tensors[t].role == Role::Input { "an input" } else { "a weight" }
                    ));
                }
                producer[t] = Some(k);
            }
        }
        for (k, op) in ops.iter().enumerate() {
            for &t in &op.inputs {
                let needs_producer = matches!(tensors[t].role, Role::Activation | Role::Output);
                match producer[t] {
                    Some(p) if p >= k && !op.outputs.contains(&t) => {
                        return bad(format!(
                            "op {k} reads tensor {t} before op {p} produces it; list ops in execution order"
                        ));
                    }
                    None if needs_producer => {
                        return bad(format!("op {k} reads tensor {t}, which no op produces; mark it input or weight"));
                    }
                    _ => {}
                }
            }
        }
        for (t, tensor) in tensors.iter().enumerate() {
            if tensor.size == 0 {
                return bad(format!("tensor {t} has size 0; every tensor needs at least 1 byte"));
            }
            if let Some(base) = tensor.alias_of {
                if base >= n {
                    return bad(format!("tensor {t} aliases tensor {base}, but there are {n} tensors"));
                }
                // Walk the chain: a cycle would revisit `t` within n steps.
                let mut cur = base;
                for _ in 0..n {
                    if cur == t {
                        return bad(format!("tensor {t} is in an alias cycle"));
                    }
                    match tensors[cur].alias_of {
                        // An index out of range is that tensor's own error, reported in its turn.
                        Some(next) if next < n => cur = next,
                        _ => break,
                    }
                }
            }
        }
        Ok(Graph { tensors, ops })
    }

    pub fn tensors(&self) -> &[Tensor] {
        &self.tensors
    }

    pub fn ops(&self) -> &[Op] {
        &self.ops
    }

    /// Each tensor's alias-class root.
    fn roots(&self) -> Vec<usize> {
        (0..self.tensors.len())
            .map(|mut t| {
                while let Some(base) = self.tensors[t].alias_of {
                    t = base;
                }
                t
            })
            .collect()
    }

    /// Lowers the graph to buffers: alias classes first (in order of their root tensor), then one
    /// workspace buffer per op that needs one.
    pub fn liveness(&self) -> Liveness {
        let n = self.tensors.len();
        let steps = self.ops.len() as u64;
        let last_step = steps.saturating_sub(1);
        // Per tensor: first and last step it is live at.
        let mut first: Vec<Option<u64>> = vec![None; n];
        let mut last: Vec<u64> = vec![0; n];
        for (k, op) in self.ops.iter().enumerate() {
            let k = k as u64;
            for &t in op.outputs.iter().chain(&op.inputs) {
                first[t] = Some(first[t].map_or(k, |f| f.min(k)));
                last[t] = last[t].max(k);
            }
        }
        let roots = self.roots();
        let mut class_of = vec![usize::MAX; n];
        let mut buffers: Vec<GraphBuffer> = Vec::new();
        for &r in &roots {
            if class_of[r] == usize::MAX {
                class_of[r] = buffers.len();
                buffers.push(GraphBuffer {
                    buffer: Buffer::new(u64::MAX, 0, 0),
                    role: Some(Role::Activation),
                    owner: r,
                });
            }
        }
        let rank = |role: Role| match role {
            Role::Weight => 3,
            Role::Input => 2,
            Role::Output => 1,
            Role::Activation => 0,
        };
        for (t, tensor) in self.tensors.iter().enumerate() {
            let b = &mut buffers[class_of[roots[t]]];
            let (lo, hi) = match tensor.role {
                Role::Weight | Role::Input => (0, last[t]),
                Role::Output => (first[t].unwrap_or(0), last_step.max(last[t])),
                Role::Activation => (first[t].unwrap_or(0), last[t].max(first[t].unwrap_or(0))),
            };
            b.buffer.lower = b.buffer.lower.min(lo);
            b.buffer.upper = b.buffer.upper.max(hi + 1);
            b.buffer.size = b.buffer.size.max(tensor.size);
            if let Some(role) = b.role
                && rank(tensor.role) > rank(role)
            {
                b.role = Some(tensor.role);
            }
        }
        let buffer_of: Vec<usize> = (0..n).map(|t| class_of[roots[t]]).collect();
        let mut uses = vec![Vec::new(); buffers.len()];
        for (k, op) in self.ops.iter().enumerate() {
            for &t in op.outputs.iter().chain(&op.inputs) {
                uses[buffer_of[t]].push(k as u64);
            }
        }
        for u in &mut uses {
            u.sort_unstable();
            u.dedup();
        }
        for (k, op) in self.ops.iter().enumerate() {
            if op.workspace > 0 {
                let k = k as u64;
                buffers.push(GraphBuffer {
                    buffer: Buffer::new(k, k + 1, op.workspace),
                    role: None,
                    owner: k as usize,
                });
                uses.push(vec![k]);
            }
        }
        Liveness { buffers, buffer_of, uses, steps }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(size: u64, role: Role) -> Tensor {
        Tensor { size, role, alias_of: None }
    }

    fn op(inputs: &[usize], outputs: &[usize], workspace: u64) -> Op {
        Op { inputs: inputs.to_vec(), outputs: outputs.to_vec(), workspace }
    }

    #[test]
    fn lifetimes_aliases_and_workspaces() {
        // x(input) -> conv(w) -> a -> relu_ in place (b aliases a) -> view v of b -> add(v, x) -> y(output)
        let mut tensors = vec![
            t(100, Role::Input),      // 0 x
            t(10, Role::Weight),      // 1 w
            t(200, Role::Activation), // 2 a
            t(200, Role::Activation), // 3 b = relu_(a)
            t(50, Role::Activation),  // 4 v = view(b)
            t(100, Role::Output),     // 5 y
            t(30, Role::Activation),  // 6 dead result of op 0
        ];
        tensors[3].alias_of = Some(2);
        tensors[4].alias_of = Some(3);
        let ops = vec![op(&[0, 1], &[2, 6], 64), op(&[2], &[3], 0), op(&[3], &[4], 0), op(&[4, 0], &[5], 0)];
        let g = Graph::new(tensors, ops).unwrap();
        let l = g.liveness();
        assert_eq!(l.steps, 4);
        let buf = |tensor: usize| &l.buffers[l.buffer_of[tensor]];
        assert_eq!(l.buffer_of[2], l.buffer_of[3]);
        assert_eq!(l.buffer_of[3], l.buffer_of[4]);
        assert_eq!(buf(2).buffer, Buffer::new(0, 4, 200), "a, b and v share one buffer to the add");
        assert_eq!(buf(0).buffer, Buffer::new(0, 4, 100));
        assert_eq!(buf(0).role, Some(Role::Input));
        assert_eq!(buf(1).role, Some(Role::Weight));
        assert_eq!(buf(5).buffer, Buffer::new(3, 4, 100));
        assert_eq!(buf(6).buffer, Buffer::new(0, 1, 30), "a dead result lives at its producer's step");
        let ws: Vec<&GraphBuffer> = l.buffers.iter().filter(|b| b.role.is_none()).collect();
        assert_eq!(ws.len(), 1);
        assert_eq!(ws[0].buffer, Buffer::new(0, 1, 64));
        assert_eq!(l.buffers.iter().filter(|b| b.planned()).count(), 3);
    }

    #[test]
    fn bad_graphs_are_refused_with_a_reason() {
        let cases: Vec<(Vec<Tensor>, Vec<Op>, &str)> = vec![
            (vec![t(8, Role::Activation)], vec![op(&[0], &[], 0)], "no op produces"),
            (vec![t(8, Role::Input), t(8, Role::Activation)], vec![op(&[1], &[], 0), op(&[0], &[1], 0)], "before op 1"),
            (vec![t(8, Role::Input)], vec![op(&[], &[0], 0)], "is an input"),
            (vec![t(8, Role::Activation)], vec![op(&[], &[0], 0), op(&[], &[0], 0)], "again by op 1"),
            (vec![t(8, Role::Activation)], vec![op(&[], &[3], 0)], "there are 1 tensors"),
            (vec![t(0, Role::Input)], vec![], "size 0"),
        ];
        for (tensors, ops, want) in cases {
            let err = Graph::new(tensors, ops).unwrap_err();
            assert!(err.message.contains(want), "{} does not say {want:?}", err.message);
        }
        let mut cyc = vec![t(8, Role::Activation), t(8, Role::Activation)];
        cyc[0].alias_of = Some(1);
        cyc[1].alias_of = Some(0);
        assert!(Graph::new(cyc, vec![op(&[], &[0, 1], 0)]).unwrap_err().message.contains("cycle"));
    }
}
