//! Fitting a graph under a memory limit: when resident bytes (weights, graph inputs and outputs)
//! plus the planned arena exceed the limit, choose what to move out of device memory.
//!
//! Moves, each applied to one buffer at most once:
//! - **offload a weight**: it stays in host memory and is prefetched into the arena before each
//!   group of uses — a transient buffer from the step before the use (the copy overlaps the
//!   previous op) to the use; uses at most two steps apart share one copy. Cost: size × copies
//!   host-to-device.
//! - **offload an activation** across its longest idle gap (between two uses `s < t`, `t >= s + 4`):
//!   it stays one more step for the device-to-host copy and is prefetched back the step before
//!   `t`. Cost: 2 × size.
//! - **recompute an activation** (a single tensor, not aliased) across its longest gap
//!   (`t >= s + 3`): dropped after `s`, its producer re-runs the step before `t`; allowed when the
//!   producer reads only resident tensors or buffers that are live then anyway. Cost: size
//!   recomputed, one op re-run.
//!
//! Selection is greedy on the bound: the excess `Σ_t max(0, resident + live(t) - target)` (live =
//! aligned bytes of the arena's buffers at step t) is driven to zero by repeatedly applying the
//! move with the lowest cost per byte of excess removed (ties: more removed), where a move costs
//! its bytes plus a fixed `per_transfer` for each copy or re-run. The caller
//! plans the arena and, if fragmentation pushes it over, calls again with a tighter target.
//!
//! Invariants: every operand of an op is in device memory at the op's step (no move touches a
//! buffer at a step where it is used); `resident + max live` never grows with a move.

use super::Buffer;
use super::graph::{Graph, Liveness, Role};

/// Which kinds of move may be used, and what each transfer costs beyond its bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MoveOptions {
    pub weights: bool,
    pub activations: bool,
    pub recompute: bool,
    /// Fixed cost of one copy or op re-run, in byte-equivalents (e.g. PCIe latency x bandwidth),
    /// so that many tiny moves do not beat one large one.
    pub per_transfer: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MoveKind {
    OffloadWeight,
    OffloadActivation,
    Recompute,
}

impl MoveKind {
    pub fn name(self) -> &'static str {
        match self {
            MoveKind::OffloadWeight => "offload_weight",
            MoveKind::OffloadActivation => "offload_activation",
            MoveKind::Recompute => "recompute",
        }
    }
}

/// One applied move.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Move {
    pub kind: MoveKind,
    /// The graph buffer (index into `Liveness::buffers`).
    pub buffer: usize,
    /// Bytes copied (both directions) or recomputed.
    pub bytes: u64,
    /// Copies (offload) or op re-runs (recompute).
    pub transfers: u32,
    /// For activations: the last use before the gap and the use after it.
    pub gap: Option<(u64, u64)>,
    /// The producer op re-run by a recompute.
    pub op: Option<usize>,
}

/// The arena after the moves.
#[derive(Clone, Debug)]
pub struct Reduced {
    pub moves: Vec<Move>,
    /// The buffers the arena must hold (pieces of moved buffers, transient weight copies) and,
    /// for each, its graph buffer.
    pub arena: Vec<Buffer>,
    pub owner: Vec<usize>,
    /// Resident bytes (weights not offloaded, graph inputs and outputs), aligned.
    pub resident: u64,
}

/// Chooses moves until the bound `resident + max live` is at most `target`, or nothing helps.
pub fn reduce(graph: &Graph, live: &Liveness, alignment: u64, target: u64, allow: MoveOptions) -> Reduced {
    let aligned = |s: u64| s.next_multiple_of(alignment);
    let nb = live.buffers.len();
    let steps = live.steps.max(1) as usize;
    // Current pieces of every buffer in the arena; resident buffers have none.
    let mut pieces: Vec<Vec<Buffer>> =
        live.buffers.iter().map(|b| if b.planned() { vec![b.buffer] } else { Vec::new() }).collect();
    let mut resident: u64 = live.buffers.iter().filter(|b| !b.planned()).map(|b| aligned(b.buffer.size)).sum();
    let mut profile = vec![0u64; steps];
    for b in pieces.iter().flatten() {
        add(&mut profile, b, aligned(b.size), true);
    }
    let mut moved = vec![false; nb];
    let mut moves = Vec::new();
    // The producer of each single-tensor class (for recompute).
    let mut members = vec![0u32; nb];
    for &b in &live.buffer_of {
        members[b] += 1;
    }
    let mut producer: Vec<Option<usize>> = vec![None; nb];
    for (k, op) in graph.ops().iter().enumerate() {
        for &t in &op.outputs {
            producer[live.buffer_of[t]] = Some(k);
        }
    }
    loop {
        // `resident + l` fits (`Graph::plan` checks the sum of all sizes); the sum over the
        // steps may not: u128.
        let excess = |profile: &[u64], resident: u64| -> u128 {
            profile.iter().map(|&l| u128::from((resident + l).saturating_sub(target))).sum()
        };
        let now = excess(&profile, resident);
        if now == 0 {
            break;
        }
        // (bytes per excess removed, removed, move, new pieces, resident saved)
        let mut best: Option<(f64, u128, Move, Vec<Buffer>, u64)> = None;
        for b in 0..nb {
            if moved[b] {
                continue;
            }
            for (mv, new_pieces, saved) in candidates(graph, live, b, &pieces, &moved, &producer, &members, allow) {
                let saved = if saved > 0 { aligned(saved) } else { 0 };
                let mut trial = profile.clone();
                for p in &pieces[b] {
                    add(&mut trial, p, aligned(p.size), false);
                }
                for p in &new_pieces {
                    add(&mut trial, p, aligned(p.size), true);
                }
                let after = excess(&trial, resident - saved);
                if after >= now {
                    continue;
                }
                let removed = now - after;
                let cost = mv.bytes.saturating_add(u64::from(mv.transfers).saturating_mul(allow.per_transfer));
                let ratio = cost as f64 / removed as f64;
                if best.as_ref().is_none_or(|(r, rem, ..)| ratio < *r || (ratio == *r && removed > *rem)) {
                    best = Some((ratio, removed, mv, new_pieces, saved));
                }
            }
        }
        let Some((_, _, mv, new_pieces, saved)) = best else { break };
        let b = mv.buffer;
        for p in &pieces[b] {
            add(&mut profile, p, aligned(p.size), false);
        }
        for p in &new_pieces {
            add(&mut profile, p, aligned(p.size), true);
        }
        pieces[b] = new_pieces;
        resident -= saved;
        moved[b] = true;
        moves.push(mv);
    }
    let mut arena = Vec::new();
    let mut owner = Vec::new();
    for (b, ps) in pieces.into_iter().enumerate() {
        for p in ps {
            arena.push(p);
            owner.push(b);
        }
    }
    Reduced { moves, arena, owner, resident }
}

/// Adds (or removes) `size` bytes at every step of `b`.
fn add(profile: &mut [u64], b: &Buffer, size: u64, plus: bool) {
    let hi = (b.upper as usize).min(profile.len());
    for l in &mut profile[(b.lower as usize).min(hi)..hi] {
        if plus {
            *l += size;
        } else {
            *l -= size;
        }
    }
}

/// The longest gap `(s, t)` between consecutive uses with `t >= s + min`.
fn longest_gap(uses: &[u64], min: u64) -> Option<(u64, u64)> {
    uses.windows(2)
        .map(|w| (w[0], w[1]))
        .filter(|&(s, t)| t >= s + min)
        .max_by_key(|&(s, t)| (t - s, std::cmp::Reverse(s)))
}

/// The moves possible for buffer `b`: (move, its pieces after the move, resident bytes saved
/// before alignment).
#[allow(clippy::too_many_arguments)]
fn candidates(
    graph: &Graph,
    live: &Liveness,
    b: usize,
    pieces: &[Vec<Buffer>],
    moved: &[bool],
    producer: &[Option<usize>],
    members: &[u32],
    allow: MoveOptions,
) -> Vec<(Move, Vec<Buffer>, u64)> {
    let gb = &live.buffers[b];
    let uses = &live.uses[b];
    let size = gb.buffer.size;
    let mut out = Vec::new();
    let mv = |kind, bytes, transfers, gap, op| Move { kind, buffer: b, bytes, transfers, gap, op };
    match gb.role {
        Some(Role::Weight) if allow.weights => {
            // Group uses at most two steps apart; each group gets one prefetch.
            let mut new = Vec::new();
            for &u in uses {
                match new.last_mut() {
                    Some(Buffer { upper, .. }) if u <= *upper + 1 => *upper = u + 1,
                    _ => new.push(Buffer::new(u.saturating_sub(1), u + 1, size)),
                }
            }
            let copies = new.len() as u32;
            let bytes = size.saturating_mul(u64::from(copies));
            out.push((mv(MoveKind::OffloadWeight, bytes, copies, None, None), new, size));
        }
        Some(Role::Activation) => {
            let (lo, hi) = (gb.buffer.lower, gb.buffer.upper);
            if allow.activations
                && let Some((s, t)) = longest_gap(uses, 4)
            {
                let new = vec![Buffer::new(lo, s + 2, size), Buffer::new(t - 1, hi, size)];
                out.push((mv(MoveKind::OffloadActivation, size.saturating_mul(2), 2, Some((s, t)), None), new, 0));
            }
            if allow.recompute
                && members[b] == 1
                && let Some(p) = producer[b]
                && let Some((s, t)) = longest_gap(uses, 3)
            {
                // The producer's inputs must be in device memory at step t - 1.
                let available = graph.ops()[p].inputs.iter().all(|&i| {
                    let ib = live.buffer_of[i];
                    if ib == b {
                        return false;
                    }
                    match live.buffers[ib].role {
                        Some(Role::Weight) => !moved[ib],
                        Some(Role::Input) | Some(Role::Output) => true,
                        _ => pieces[ib].iter().any(|q| q.lower < t && t - 1 < q.upper),
                    }
                });
                if available {
                    let new = vec![Buffer::new(lo, s + 1, size), Buffer::new(t - 1, hi, size)];
                    out.push((mv(MoveKind::Recompute, size, 1, Some((s, t)), Some(p)), new, 0));
                }
            }
        }
        _ => {}
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::graph::{Op, Tensor};
    use super::*;

    fn t(size: u64, role: Role) -> Tensor {
        Tensor { size, role, alias_of: None }
    }

    fn op(inputs: &[usize], outputs: &[usize]) -> Op {
        Op { inputs: inputs.to_vec(), outputs: outputs.to_vec(), workspace: 0 }
    }

    /// A forward/backward chain: f0..f3 produce a0..a3 (each reading the previous and a weight),
    /// then b3..b0 read them back in reverse: the classic training shape.
    fn training() -> (Graph, Liveness) {
        let mut tensors = vec![t(1000, Role::Input)]; // 0: x
        for _ in 0..4 {
            tensors.push(t(100, Role::Weight)); // 1..=4: w0..w3
        }
        for _ in 0..4 {
            tensors.push(t(1000, Role::Activation)); // 5..=8: a0..a3
        }
        for _ in 0..4 {
            tensors.push(t(1000, Role::Activation)); // 9..=12: g3..g0
        }
        let mut ops = Vec::new();
        for i in 0..4 {
            let prev = if i == 0 { 0 } else { 4 + i };
            ops.push(op(&[prev, 1 + i], &[5 + i]));
        }
        for i in 0..4 {
            // backward op i reads a_{3-i}, w_{3-i} and the previous gradient
            let a = 8 - i;
            let mut inputs = vec![a, 4 - i];
            if i > 0 {
                inputs.push(8 + i);
            }
            ops.push(op(&inputs, &[9 + i]));
        }
        tensors[12].role = Role::Output;
        let g = Graph::new(tensors, ops).unwrap();
        let l = g.liveness();
        (g, l)
    }

    fn bound(r: &Reduced, steps: u64) -> u64 {
        let mut profile = vec![0u64; steps as usize];
        for b in &r.arena {
            add(&mut profile, b, b.size, true);
        }
        r.resident + profile.into_iter().max().unwrap_or(0)
    }

    #[test]
    fn no_moves_when_it_fits() {
        let (g, l) = training();
        let all = MoveOptions { weights: true, activations: true, recompute: true, per_transfer: 0 };
        let r = reduce(&g, &l, 1, u64::MAX, all);
        assert!(r.moves.is_empty());
        assert_eq!(r.resident, 1000 + 400 + 1000);
    }

    #[test]
    fn moves_reach_a_lower_target_and_keep_operands_on_device() {
        let (g, l) = training();
        let all = MoveOptions { weights: true, activations: true, recompute: true, per_transfer: 0 };
        let before = bound(&reduce(&g, &l, 1, u64::MAX, all), l.steps);
        assert_eq!(before, 7400);
        let target = before - 1000;
        let r = reduce(&g, &l, 1, target, all);
        assert!(!r.moves.is_empty());
        assert!(bound(&r, l.steps) <= target, "{} > {target}", bound(&r, l.steps));
        check_operands(&g, &l, &r);
        // Below what any move can reach, it still does its best (and stays consistent).
        let best = reduce(&g, &l, 1, 0, all);
        assert!(bound(&best, l.steps) <= bound(&r, l.steps));
        check_operands(&g, &l, &best);
    }

    /// Every operand of every op is on device at its step.
    fn check_operands(g: &Graph, l: &Liveness, r: &Reduced) {
        for (k, op) in g.ops().iter().enumerate() {
            let k = k as u64;
            for &tensor in op.inputs.iter().chain(&op.outputs) {
                let b = l.buffer_of[tensor];
                let resident = !l.buffers[b].planned() && !r.moves.iter().any(|m| m.buffer == b);
                let in_arena = r.arena.iter().zip(&r.owner).any(|(p, &o)| o == b && p.lower <= k && k < p.upper);
                assert!(resident || in_arena, "tensor {tensor} missing at step {k}");
            }
        }
    }

    #[test]
    fn each_kind_can_be_switched_off() {
        let (g, l) = training();
        let none = MoveOptions { weights: false, activations: false, recompute: false, per_transfer: 0 };
        assert!(reduce(&g, &l, 1, 0, none).moves.is_empty());
        let only_weights = MoveOptions { weights: true, ..none };
        let r = reduce(&g, &l, 1, 0, only_weights);
        assert!(!r.moves.is_empty() && r.moves.iter().all(|m| m.kind == MoveKind::OffloadWeight));
        let only_recompute = MoveOptions { recompute: true, ..none };
        let r = reduce(&g, &l, 1, 0, only_recompute);
        assert!(r.moves.iter().all(|m| m.kind == MoveKind::Recompute));
        // a0 is read by f1 (step 1) and by the last backward op (step 7); its producer f0 reads
        // the input x and w0, both resident: it can be recomputed.
        assert!(r.moves.iter().any(|m| m.buffer == l.buffer_of[5] && m.op == Some(0)));
    }
}
