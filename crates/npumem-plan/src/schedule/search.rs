//! Exact search for the order with the least memory, in the spirit of Serenity (Ahn et al.,
//! MLSys 2020): dynamic programming over the set of ops already run (the ready set's history),
//! one level per step, with a state merged when two orders reach the same set (only the lower
//! peak so far survives) and pruned when its peak so far exceeds an order already known.
//!
//! Rules:
//! - a pass keeps only states whose peak so far, and whose floor for the ops still to run (the
//!   must-live floor of each, valid in every order), stay below the best order known: it looks
//!   for a strict improvement;
//! - a level is exact while it holds every surviving state; the least peak so far over an exact
//!   level (or the best known peak, for the states pruned) is a lower bound for every order, as
//!   each order has one at least as good through a state of every level. A pass that stays exact to its end
//!   proves its result (or, when every state was pruned, the best known order) optimal;
//! - dominance: from a state, a ready op that frees at least the bytes it creates and stays at or
//!   below the peak so far is the only move tried (in any best completion it can be moved to
//!   the front: that only shortens lifetimes), which collapses chains of ops to one path;
//! - a first, narrow pass (a beam search) finds a good order cheaply, so the exact pass prunes
//!   hard; the search is bounded by work, never by time: `width` states per level (the rest,
//!   ranked by peak so far, then bytes live, then discovery, are dropped, and a pass that drops
//!   any proves nothing) and `work` transitions in all (past it, one state per level: a greedy
//!   finish). The same graph and limits give the same order on every run.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use super::dag::Dag;

/// What the search found.
pub(crate) struct Found {
    /// The best order reached (None when every state was pruned: nothing beats `upper`).
    pub order: Option<Vec<usize>>,
    pub peak: u64,
    /// Whether every level was exact: then `peak` (or `upper` when `order` is None) is optimal.
    pub exact: bool,
    /// The best lower bound proven by the exact levels.
    pub bound: u64,
    /// Transitions evaluated.
    pub work: u64,
}

/// FxHash: the bit sets are well mixed already, and SipHash would dominate a transition.
#[derive(Default)]
struct Fx(u64);

impl Hasher for Fx {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.write_u64(u64::from(*b));
        }
    }
    fn write_u64(&mut self, w: u64) {
        self.0 = (self.0.rotate_left(5) ^ w).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
    fn write_usize(&mut self, w: usize) {
        self.write_u64(w as u64);
    }
}

struct Level {
    words: usize,
    bits: Vec<u64>,
    live: Vec<u64>,
    peak: Vec<u64>,
    ready: Vec<Vec<u32>>,
    /// (parent state in the previous level, op run to get here).
    from: Vec<(u32, u32)>,
}

impl Level {
    fn new(words: usize) -> Level {
        Level { words, bits: Vec::new(), live: Vec::new(), peak: Vec::new(), ready: Vec::new(), from: Vec::new() }
    }
    fn len(&self) -> usize {
        self.peak.len()
    }
    fn set(&self, s: usize) -> &[u64] {
        &self.bits[s * self.words..(s + 1) * self.words]
    }
    /// Keeps the states `keep` (indices), in that order.
    fn select(self, keep: &[usize]) -> Level {
        let mut out = Level::new(self.words);
        for &s in keep {
            out.bits.extend_from_slice(self.set(s));
            out.live.push(self.live[s]);
            out.peak.push(self.peak[s]);
            out.ready.push(self.ready[s].clone());
            out.from.push(self.from[s]);
        }
        out
    }
}

#[inline]
fn has(set: &[u64], o: u32) -> bool {
    set[o as usize / 64] >> (o % 64) & 1 == 1
}

/// A narrow pass, then an exact one as wide as the work left allows, each looking for an order
/// below the best known (`upper`, the heuristics' best); `floor[o]` bounds the memory at `o`'s
/// step in every order.
pub(crate) fn search(d: &Dag, upper: u64, floor: &[u64], width: usize, work: u64) -> Found {
    let narrow = run(d, upper, floor, NARROW.min(width), work / 8);
    let (mut best, mut order) = (upper, None);
    if let Some(o) = narrow.order {
        (best, order) = (narrow.peak, Some(o));
    }
    if narrow.exact {
        return Found { order, peak: best, exact: true, bound: best, work: narrow.work };
    }
    let wide = run(d, best, floor, width, work.saturating_sub(narrow.work));
    let spent = narrow.work + wide.work;
    // Both passes' exact levels bound every order.
    let bound = narrow.bound.max(wide.bound);
    match wide.order {
        Some(o) => Found { order: Some(o), peak: wide.peak, exact: wide.exact, bound, work: spent },
        None => Found { order, peak: best, exact: wide.exact, bound, work: spent },
    }
}

/// States per level of the narrow (beam) pass that runs before the exact one.
const NARROW: usize = 32;

/// One pass: the best order strictly below `upper`, if it finds one.
fn run(d: &Dag, upper: u64, floor: &[u64], width: usize, work: u64) -> Found {
    let n = d.n;
    let words = n.div_ceil(64).max(1);
    let mut level = Level::new(words);
    level.bits.resize(words, 0);
    level.live.push(0);
    level.peak.push(0);
    level.ready.push((0..n as u32).filter(|&o| d.preds[o as usize].is_empty()).collect());
    level.from.push((0, 0));
    let mut trail: Vec<Vec<(u32, u32)>> = Vec::with_capacity(n);
    let (mut exact, mut bound, mut spent) = (true, 0u64, 0u64);
    let mut scratch = vec![0u64; words];
    let mut moves: Vec<(u32, u64, u64, u64)> = Vec::new();
    // Ops by falling floor: the first one not yet run has the largest floor still ahead.
    let mut by_floor: Vec<u32> = (0..n as u32).collect();
    by_floor.sort_by_key(|&o| (std::cmp::Reverse(floor[o as usize]), o));
    for step in 0..n {
        let mut next = Level::new(words);
        let mut index: HashMap<Box<[u64]>, u32, BuildHasherDefault<Fx>> = HashMap::default();
        for s in 0..level.len() {
            let set = level.set(s);
            // (op, bytes live during it, bytes it creates, bytes it frees)
            moves.clear();
            for &o in &level.ready[s] {
                spent += 1;
                let (mut born, mut dies) = (0u64, 0u64);
                for &c in &d.touch[o as usize] {
                    let t = &d.touchers[c as usize];
                    let done = t.iter().filter(|&&u| has(set, u)).count();
                    if done == 0 {
                        born += d.size[c as usize];
                    }
                    if done + 1 == t.len() {
                        dies += d.size[c as usize];
                    }
                }
                let during = level.live[s] + born + d.ws[o as usize] + if step == 0 { d.untouched } else { 0 };
                moves.push((o, during, born, dies));
            }
            // Dominance: an op that frees at least what it creates, without rising above the
            // peak so far, can run first in some best completion (moving it before the ops
            // that preceded it only shortens lifetimes), so it is the only move tried.
            let forced = moves.iter().position(|&(_, during, born, dies)| born <= dies && during <= level.peak[s]);
            let tried = match forced {
                Some(i) => i..i + 1,
                None => 0..moves.len(),
            };
            for &(o, during, born, dies) in &moves[tried] {
                let peak = level.peak[s].max(during);
                if peak >= upper {
                    continue;
                }
                scratch.copy_from_slice(set);
                scratch[o as usize / 64] |= 1 << (o % 64);
                if let Some(&at) = index.get(scratch.as_slice()) {
                    if peak < next.peak[at as usize] {
                        next.peak[at as usize] = peak;
                        next.from[at as usize] = (s as u32, o);
                    }
                    continue;
                }
                let mut ready: Vec<u32> = level.ready[s].iter().copied().filter(|&r| r != o).collect();
                for &x in &d.succs[o as usize] {
                    if d.preds[x as usize].iter().all(|&p| has(&scratch, p)) {
                        ready.push(x);
                    }
                }
                ready.sort_unstable();
                // The ops still to run each need their floor: a state that cannot beat `upper`
                // is dropped before it spreads.
                let ahead = by_floor.iter().find(|&&x| !has(&scratch, x)).map_or(0, |&x| floor[x as usize]);
                if ahead >= upper {
                    continue;
                }
                index.insert(scratch.clone().into_boxed_slice(), next.len() as u32);
                next.bits.extend_from_slice(&scratch);
                next.live.push(level.live[s] + born - dies);
                next.peak.push(peak);
                next.ready.push(ready);
                next.from.push((s as u32, o));
            }
        }
        if next.len() == 0 {
            // Every order is at or above `upper`: proven when no level was cut.
            return Found { order: None, peak: upper, exact, bound: if exact { upper } else { bound }, work: spent };
        }
        let cap = if spent >= work { 1 } else { width.max(1) };
        if next.len() > cap {
            exact = false;
            let mut rank: Vec<usize> = (0..next.len()).collect();
            rank.sort_by_key(|&s| (next.peak[s], next.live[s], s));
            rank.truncate(cap);
            next = next.select(&rank);
        }
        if exact {
            // Pruned states were at or above `upper`, kept ones below it.
            bound = bound.max(next.peak.iter().copied().min().unwrap_or(upper));
        }
        trail.push(next.from.clone());
        level = next;
    }
    // The last level holds one state: every op run.
    let peak = level.peak[0];
    let mut order = vec![0usize; n];
    let mut s = 0u32;
    for step in (0..n).rev() {
        let (parent, o) = trail[step][s as usize];
        order[step] = o as usize;
        s = parent;
    }
    Found { order: Some(order), peak, exact, bound: if exact { peak } else { bound }, work: spent }
}
