//! The graph as a scheduling problem: which orders are allowed and what memory an order needs.
//!
//! Rules:
//! - an op runs after the producer of every tensor it reads (data edges);
//! - within an alias class (views and in-place results share one buffer), every op that produces a
//!   member is a write: it stays after every op that touched the class before it in the given
//!   order and before every op that touches the class after it (ops between two writes, all
//!   readers, may be reordered among themselves). A view counts as a write: safe, and it costs
//!   little freedom because a view sits next to its base's producer;
//! - memory is counted in the arena's model ([`Graph::liveness`]): a planned class (activations)
//!   is live from the step of its first toucher to that of its last one, inclusive, at its
//!   aligned size; an op's workspace at its own step; resident classes (weights, graph inputs and
//!   outputs) cost the same in every order and are left out. A planned class that no op touches
//!   is live at step 0, whichever op runs there.
//!
//! Invariant: [`Dag::peak`] of an order equals [`Problem::lower_bound`](crate::Problem) of the
//! reordered graph's arena, so every strategy is judged by the bound the offsets start from.

use super::super::graph::Graph;

/// Dependencies and memory of a graph's ops.
pub(crate) struct Dag {
    pub n: usize,
    /// Direct predecessors and successors of each op (deduplicated, sorted).
    pub preds: Vec<Vec<u32>>,
    pub succs: Vec<Vec<u32>>,
    /// Planned classes each op touches (sorted).
    pub touch: Vec<Vec<u32>>,
    /// Ops touching each planned class, in the given order.
    pub touchers: Vec<Vec<u32>>,
    /// Aligned size of each planned class.
    pub size: Vec<u64>,
    /// The op producing each planned class's root tensor (its definer), if any.
    pub definer: Vec<Option<u32>>,
    /// Aligned workspace of each op.
    pub ws: Vec<u64>,
    /// Aligned bytes of planned classes no op touches (live at step 0).
    pub untouched: u64,
}

impl Dag {
    pub fn new(graph: &Graph, alignment: u64) -> Dag {
        let n = graph.ops().len();
        let live = graph.liveness();
        let align = |s: u64| s.next_multiple_of(alignment);
        // Planned alias classes: renumber the liveness buffers that are activations.
        let mut class = vec![u32::MAX; live.buffers.len()];
        let mut size = Vec::new();
        for (b, gb) in live.buffers.iter().enumerate() {
            if gb.role.is_some() && gb.planned() {
                class[b] = size.len() as u32;
                size.push(align(gb.buffer.size));
            }
        }
        let mut touch = vec![Vec::new(); n];
        let mut touchers = vec![Vec::new(); size.len()];
        let mut definer = vec![None; size.len()];
        let mut producer = vec![u32::MAX; graph.tensors().len()];
        for (k, op) in graph.ops().iter().enumerate() {
            for &t in &op.outputs {
                producer[t] = k as u32;
            }
            for &t in op.inputs.iter().chain(&op.outputs) {
                let c = class[live.buffer_of[t]];
                if c != u32::MAX {
                    touch[k].push(c);
                }
            }
            touch[k].sort_unstable();
            touch[k].dedup();
            for &c in &touch[k] {
                touchers[c as usize].push(k as u32);
            }
        }
        for (t, tensor) in graph.tensors().iter().enumerate() {
            let c = class[live.buffer_of[t]];
            if tensor.alias_of.is_none() && c != u32::MAX && producer[t] != u32::MAX {
                definer[c as usize] = Some(producer[t]);
            }
        }
        let untouched = (0..size.len()).filter(|&c| touchers[c].is_empty()).map(|c| size[c]).sum();
        let mut preds: Vec<Vec<u32>> = vec![Vec::new(); n];
        for (k, op) in graph.ops().iter().enumerate() {
            for &t in &op.inputs {
                let p = producer[t];
                if p != u32::MAX && p as usize != k {
                    preds[k].push(p);
                }
            }
        }
        // Write order within every alias class, resident ones included (an optimizer's in-place
        // update of a weight must follow the weight's last read).
        let mut class_ops: Vec<Vec<(u32, bool)>> = vec![Vec::new(); live.buffers.len()];
        for (k, op) in graph.ops().iter().enumerate() {
            let written: Vec<usize> = op.outputs.iter().map(|&t| live.buffer_of[t]).collect();
            let mut seen: Vec<usize> = op.inputs.iter().chain(&op.outputs).map(|&t| live.buffer_of[t]).collect();
            seen.sort_unstable();
            seen.dedup();
            for b in seen {
                class_ops[b].push((k as u32, written.contains(&b)));
            }
        }
        for ops in &class_ops {
            let mut last_write: Option<u32> = None;
            let mut readers: Vec<u32> = Vec::new();
            for &(k, write) in ops {
                if write {
                    preds[k as usize].extend(last_write.iter().chain(&readers).copied().filter(|&p| p != k));
                    readers.clear();
                    last_write = Some(k);
                } else {
                    preds[k as usize].extend(last_write);
                    readers.push(k);
                }
            }
        }
        let mut succs = vec![Vec::new(); n];
        for (k, p) in preds.iter_mut().enumerate() {
            p.sort_unstable();
            p.dedup();
            for &q in p.iter() {
                succs[q as usize].push(k as u32);
            }
        }
        let ws = graph.ops().iter().map(|o| if o.workspace > 0 { align(o.workspace) } else { 0 }).collect();
        Dag { n, preds, succs, touch, touchers, size, definer, ws, untouched }
    }

    /// Whether `order` lists every op once and respects every edge.
    #[cfg(test)]
    pub fn is_order(&self, order: &[usize]) -> bool {
        if order.len() != self.n {
            return false;
        }
        let mut pos = vec![usize::MAX; self.n];
        for (i, &o) in order.iter().enumerate() {
            if o >= self.n || pos[o] != usize::MAX {
                return false;
            }
            pos[o] = i;
        }
        (0..self.n).all(|k| self.preds[k].iter().all(|&p| pos[p as usize] < pos[k]))
    }

    /// The largest memory live at one step when the ops run in `order` (a valid order).
    pub fn peak(&self, order: &[usize]) -> u64 {
        let mut left: Vec<u32> = self.touchers.iter().map(|t| t.len() as u32).collect();
        // Untouched classes are live at step 0 (and in the arena even with no op at all).
        let (mut live, mut peak) = (0u64, self.untouched);
        for (step, &o) in order.iter().enumerate() {
            let (during, after) = self.step(&left, live, o);
            peak = peak.max(during + if step == 0 { self.untouched } else { 0 });
            live = after;
            for &c in &self.touch[o] {
                left[c as usize] -= 1;
            }
        }
        peak
    }

    /// Running `o` with `left[c]` touchers of each class still to run and `live` bytes open:
    /// the bytes live during its step and those still open after it.
    #[inline]
    pub fn step(&self, left: &[u32], live: u64, o: usize) -> (u64, u64) {
        let (mut born, mut dies) = (0u64, 0u64);
        for &c in &self.touch[o] {
            let c = c as usize;
            let total = self.touchers[c].len() as u32;
            if left[c] == total {
                born += self.size[c];
            }
            if left[c] == 1 {
                dies += self.size[c];
            }
        }
        (live + born + self.ws[o], live + born - dies)
    }
}
