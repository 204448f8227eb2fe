//! The published schedulers, reproduced on the [`Dag`] so that one run compares them:
//!
//! - XLA's `DefaultMemoryScheduler` (openxla/xla `xla/hlo/transforms/simplifiers/
//!   hlo_memory_scheduler.cc`): `ListScheduler` (ready op with the largest `(bytes freed - bytes
//!   defined, user count)`, the last inserted winning ties, as `std::multimap::end() - 1` does),
//!   `DFSMemoryScheduler` (post-order, operands visited by descending cumulative extra users, then
//!   cumulative sizes, both capped as XLA caps them, then name) and `PostOrderScheduler`
//!   (`MakeInstructionPostOrder`: from each op without users, in program order, operands first);
//!   it keeps the one with the least memory "not accounting for fragmentation", ties to list,
//!   then DFS, then post-order.
//! - PyTorch Inductor's `reorder_for_peak_memory` (`torch/_inductor/memory.py`): the given order
//!   ("baseline"), `topological_sort_lpmf` (least peak memory first), `topological_sort_bfs`
//!   (earliest-executed predecessors first) and `topological_sort_dfs` (smallest
//!   size-with-reads first); the lowest estimated peak wins, the first on a tie.
//!
//! Rules of the translation: an HLO instruction / scheduler node is an op; a buffer is a planned
//! alias class, defined by the op producing its root tensor and used by every other op touching
//! it; resident tensors (weights, graph I/O) weigh nothing, as in the arena; names are op
//! indices (the given order); operand order is index order; every memory estimate is
//! [`Dag::peak`] (XLA's `MinimumMemoryForModule` and Inductor's `estimate_peak_memory` count
//! the same thing: outputs allocated at their op, freed after their last use).

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use super::dag::Dag;

/// Per op: bytes it defines and the classes it uses (touches without defining).
fn defined_and_uses(d: &Dag) -> (Vec<u64>, Vec<Vec<u32>>) {
    let mut defined = vec![0u64; d.n];
    for (c, def) in d.definer.iter().enumerate() {
        if let Some(o) = def {
            defined[*o as usize] += d.size[c];
        }
    }
    let uses = (0..d.n)
        .map(|o| d.touch[o].iter().copied().filter(|&c| d.definer[c as usize] != Some(o as u32)).collect())
        .collect();
    (defined, uses)
}

fn uses_count(d: &Dag) -> Vec<u32> {
    (0..d.size.len()).map(|c| d.touchers[c].iter().filter(|&&o| d.definer[c] != Some(o)).count() as u32).collect()
}

/// XLA `ListScheduler::CreateSchedule`.
pub(crate) fn xla_list(d: &Dag) -> Vec<usize> {
    let (defined, uses) = defined_and_uses(d);
    let mut unscheduled = uses_count(d);
    let mut preds_left: Vec<usize> = d.preds.iter().map(Vec::len).collect();
    // Ready ops with their priority and insertion number (re-inserted when the priority moves).
    let mut ready: Vec<(usize, (i128, usize), u64)> = Vec::new();
    let mut seq = 0u64;
    let priority = |o: usize, unscheduled: &[u32]| -> (i128, usize) {
        let freed: u64 = uses[o].iter().filter(|&&c| unscheduled[c as usize] == 1).map(|&c| d.size[c as usize]).sum();
        (freed as i128 - defined[o] as i128, d.succs[o].len())
    };
    for o in (0..d.n).filter(|&o| d.preds[o].is_empty()) {
        ready.push((o, priority(o, &unscheduled), seq));
        seq += 1;
    }
    let mut order = Vec::with_capacity(d.n);
    while !ready.is_empty() {
        let best = (0..ready.len()).max_by_key(|&i| (ready[i].1, ready[i].2)).unwrap_or(0);
        let (o, _, _) = ready.swap_remove(best);
        order.push(o);
        for &c in &uses[o] {
            unscheduled[c as usize] -= 1;
        }
        for &s in &d.succs[o] {
            preds_left[s as usize] -= 1;
            if preds_left[s as usize] == 0 {
                ready.push((s as usize, priority(s as usize, &unscheduled), seq));
                seq += 1;
            }
        }
        for entry in &mut ready {
            let p = priority(entry.0, &unscheduled);
            if p != entry.1 {
                *entry = (entry.0, p, seq);
                seq += 1;
            }
        }
    }
    order
}

/// Depth-first post-order from `roots`, each op's predecessors visited in the order `sorted`
/// gives them.
fn post_order(d: &Dag, roots: &[usize], sorted: impl Fn(&[u32]) -> Vec<u32>) -> Vec<usize> {
    let mut state = vec![0u8; d.n]; // 0 new, 1 on the stack, 2 done
    let mut order = Vec::with_capacity(d.n);
    for &r in roots {
        let mut stack: Vec<(usize, Vec<u32>, usize)> = Vec::new();
        if state[r] == 0 {
            state[r] = 1;
            stack.push((r, sorted(&d.preds[r]), 0));
        }
        while let Some((o, ops, i)) = stack.last_mut() {
            if let Some(&p) = ops.get(*i) {
                *i += 1;
                if state[p as usize] == 0 {
                    state[p as usize] = 1;
                    let next = sorted(&d.preds[p as usize]);
                    stack.push((p as usize, next, 0));
                }
            } else {
                state[*o] = 2;
                order.push(*o);
                stack.pop();
            }
        }
    }
    order
}

fn sinks(d: &Dag) -> Vec<usize> {
    (0..d.n).filter(|&o| d.succs[o].is_empty()).collect()
}

/// XLA `DFSMemoryScheduler::Run`.
pub(crate) fn xla_dfs(d: &Dag) -> Vec<usize> {
    let (defined, _) = defined_and_uses(d);
    let (mut extra, mut total) = (vec![0u64; d.n], vec![0u64; d.n]);
    let mut cumulative = 0u64;
    // The given order is a post-order of the graph (every op after its operands).
    for o in 0..d.n {
        extra[o] = (d.succs[o].len() as u64).saturating_sub(1);
        total[o] = defined[o];
        cumulative += defined[o];
        for &p in &d.preds[o] {
            extra[o] = extra[o].saturating_add(extra[p as usize]);
            total[o] = total[o].saturating_add(total[p as usize]);
        }
        total[o] = total[o].min(cumulative);
        extra[o] = extra[o].min(d.n as u64);
    }
    let key = |o: u32| (Reverse(extra[o as usize]), Reverse(total[o as usize]), o);
    let sorted = |ops: &[u32]| {
        let mut v = ops.to_vec();
        v.sort_by_key(|&o| key(o));
        v
    };
    let roots: Vec<usize> =
        sorted(&sinks(d).iter().map(|&o| o as u32).collect::<Vec<_>>()).into_iter().map(|o| o as usize).collect();
    post_order(d, &roots, sorted)
}

/// XLA `PostOrderScheduler::Run` (`MakeInstructionPostOrder`).
pub(crate) fn xla_post_order(d: &Dag) -> Vec<usize> {
    post_order(d, &sinks(d), |ops| ops.to_vec())
}

/// XLA's portfolio: (order, name) of the least-memory candidate.
pub(crate) fn xla(d: &Dag) -> (Vec<usize>, &'static str) {
    best(d, vec![(xla_list(d), "list"), (xla_dfs(d), "dfs"), (xla_post_order(d), "post-order")])
}

/// Inductor `topological_sort_lpmf`.
pub(crate) fn inductor_lpmf(d: &Dag) -> Vec<usize> {
    let (size, uses) = defined_and_uses(d);
    let mut outdegree = uses_count(d);
    let mut indegree: Vec<usize> = d.preds.iter().map(Vec::len).collect();
    let mut to_free = vec![0u64; d.n];
    // 1. an input that this op reads last is freed after it.
    for o in 0..d.n {
        for &c in &uses[o] {
            if outdegree[c as usize] == 1 {
                to_free[o] += d.size[c as usize];
            }
        }
    }
    // 2. an output that nothing reads is freed right away.
    for (c, def) in d.definer.iter().enumerate() {
        if let Some(o) = def
            && outdegree[c] == 0
        {
            to_free[*o as usize] += d.size[c];
        }
    }
    let mut ready: Vec<usize> = (0..d.n).filter(|&o| indegree[o] == 0).collect();
    let (mut live, mut max) = (0i128, 0i128);
    let mut gap = 0i128;
    let mut order = Vec::with_capacity(d.n);
    while !ready.is_empty() {
        let key = |o: usize| {
            let s = size[o] as i128;
            (if s > gap { s } else { 0 }, s - to_free[o] as i128, o)
        };
        let at = (0..ready.len()).min_by_key(|&i| key(ready[i])).unwrap_or(0);
        let o = ready.swap_remove(at);
        order.push(o);
        live += size[o] as i128;
        max = max.max(live);
        live -= to_free[o] as i128;
        gap = max - live;
        for &s in &d.succs[o] {
            indegree[s as usize] -= 1;
            if indegree[s as usize] == 0 {
                ready.push(s as usize);
            }
        }
        for &c in &uses[o] {
            let c = c as usize;
            outdegree[c] -= 1;
            if outdegree[c] == 1 {
                for &u in &d.touchers[c] {
                    if d.definer[c] != Some(u) {
                        to_free[u as usize] += d.size[c];
                    }
                }
            }
        }
    }
    order
}

/// Inductor `topological_sort_bfs`.
pub(crate) fn inductor_bfs(d: &Dag) -> Vec<usize> {
    let mut indegree: Vec<usize> = d.preds.iter().map(Vec::len).collect();
    let mut at = vec![0usize; d.n];
    let priority = |o: usize, at: &[usize]| {
        let mut p: Vec<usize> = d.preds[o].iter().map(|&q| at[q as usize]).collect();
        p.sort_unstable();
        p.dedup();
        p
    };
    let mut heap: BinaryHeap<Reverse<(Vec<usize>, usize)>> = BinaryHeap::new();
    for o in (0..d.n).filter(|&o| d.preds[o].is_empty()) {
        heap.push(Reverse((Vec::new(), o)));
    }
    let mut order = Vec::with_capacity(d.n);
    while let Some(Reverse((_, o))) = heap.pop() {
        at[o] = order.len();
        order.push(o);
        for &s in &d.succs[o] {
            let s = s as usize;
            indegree[s] -= 1;
            if indegree[s] == 0 {
                heap.push(Reverse((priority(s, &at), s)));
            }
        }
    }
    order
}

/// Inductor `topological_sort_dfs`.
pub(crate) fn inductor_dfs(d: &Dag) -> Vec<usize> {
    let (size, uses) = defined_and_uses(d);
    let with_reads: Vec<u64> =
        (0..d.n).map(|o| size[o] + uses[o].iter().map(|&c| d.size[c as usize]).sum::<u64>()).collect();
    let sorted = |ops: &[u32]| {
        let mut v = ops.to_vec();
        v.sort_by_key(|&o| (with_reads[o as usize], o));
        v
    };
    let all: Vec<u32> = (0..d.n as u32).collect();
    let roots: Vec<usize> = sorted(&all).into_iter().map(|o| o as usize).collect();
    post_order(d, &roots, sorted)
}

/// Inductor's portfolio: (order, name) of the lowest estimated peak.
pub(crate) fn inductor(d: &Dag) -> (Vec<usize>, &'static str) {
    let given = (0..d.n).collect();
    best(d, vec![(given, "baseline"), (inductor_lpmf(d), "lpmf"), (inductor_bfs(d), "bfs"), (inductor_dfs(d), "dfs")])
}

/// The candidate with the least [`Dag::peak`], the first on a tie.
fn best(d: &Dag, candidates: Vec<(Vec<usize>, &'static str)>) -> (Vec<usize>, &'static str) {
    let mut best: Option<(u64, Vec<usize>, &'static str)> = None;
    for (order, name) in candidates {
        let peak = d.peak(&order);
        if best.as_ref().is_none_or(|b| peak < b.0) {
            best = Some((peak, order, name));
        }
    }
    best.map(|(_, o, n)| (o, n)).unwrap_or_default()
}
