//! A lower bound on the memory of every order.
//!
//! Rule: at op `o`'s step, whatever the order, the classes `o` touches are live, and so is every
//! class with one toucher that must run before `o` (an ancestor) and another that must run after
//! it (a descendant); with `o`'s workspace that is a floor for the peak of every order. The
//! largest floor over the ops is the bound. Ancestor sets cost `n^2 / 8` bytes: above
//! [`MAX_OPS`] ops only the ops' own operands count.

use super::dag::Dag;

pub(crate) const MAX_OPS: usize = 10_000;

/// Each op's floor: the memory at its step in every order.
pub(crate) fn floors(d: &Dag) -> Vec<u64> {
    let n = d.n;
    let mut floor: Vec<u64> =
        (0..n).map(|o| d.ws[o] + d.touch[o].iter().map(|&c| d.size[c as usize]).sum::<u64>()).collect();
    if n <= MAX_OPS && n > 0 {
        let words = n.div_ceil(64);
        // anc[o]: strict ancestors; desc[o]: strict descendants (the given order is topological).
        let mut anc = vec![0u64; n * words];
        for o in 0..n {
            for &p in &d.preds[o] {
                let p = p as usize;
                for w in 0..words {
                    anc[o * words + w] |= anc[p * words + w];
                }
                anc[o * words + p / 64] |= 1 << (p % 64);
            }
        }
        let mut desc = vec![0u64; n * words];
        for o in (0..n).rev() {
            for &s in &d.succs[o] {
                let s = s as usize;
                for w in 0..words {
                    desc[o * words + w] |= desc[s * words + w];
                }
                desc[o * words + s / 64] |= 1 << (s % 64);
            }
        }
        let mut after = vec![0u64; words];
        let mut before = vec![0u64; words];
        for (c, t) in d.touchers.iter().enumerate() {
            if t.len() < 2 {
                continue;
            }
            after.iter_mut().for_each(|w| *w = 0);
            before.iter_mut().for_each(|w| *w = 0);
            for &u in t {
                let u = u as usize;
                for w in 0..words {
                    after[w] |= desc[u * words + w];
                    before[w] |= anc[u * words + w];
                }
            }
            for w in 0..words {
                let mut must = after[w] & before[w];
                while must != 0 {
                    let o = w * 64 + must.trailing_zeros() as usize;
                    must &= must - 1;
                    if !d.touch[o].contains(&(c as u32)) {
                        floor[o] += d.size[c];
                    }
                }
            }
        }
    }
    floor
}

/// The largest floor: no order needs less.
pub(crate) fn any_order_bound(floor: &[u64], d: &Dag) -> u64 {
    floor.iter().copied().max().unwrap_or(0).max(d.untouched)
}
