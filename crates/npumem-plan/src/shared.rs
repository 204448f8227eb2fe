//! Shared-object planning, as TFLite's GPU delegate does it: tensors are assigned to *objects*
//! (each as large as its largest tensor); tensors of one object never overlap in time; the
//! arena is the objects side by side. Also the bound that mode has: the sum of positional
//! maximums.
//!
//! Time is cut into *sections*, the maximal sets of buffers live together (a sweep snapshots the
//! live set at an end that follows a start); every buffer lies in a contiguous range of them.
//!
//! Invariants: every buffer gets exactly one object; two buffers of one object never overlap in
//! time; `positional_bound() >= lower_bound()` (the i-th largest live size at a step never
//! exceeds the i-th positional maximum, and the live sizes sum to at most the bound).

use std::collections::BTreeMap;

use super::Problem;

/// Sections found by one sweep: each buffer's range of sections and each section's breadth
/// (its aligned bytes).
struct Sections {
    span: Vec<(usize, usize)>,
    breadth: Vec<u64>,
}

impl Problem {
    fn sections(&self) -> Sections {
        let bs = self.buffers();
        let mut events: Vec<(u64, bool, usize)> = Vec::with_capacity(2 * bs.len());
        for (i, b) in bs.iter().enumerate() {
            events.push((b.lower, true, i));
            events.push((b.upper, false, i));
        }
        events.sort_unstable(); // ends (false) first at one step: half-open lifetimes
        let mut span = vec![(0, 0); bs.len()];
        let mut breadth = Vec::new();
        let (mut live, mut dirty) = (0u64, false);
        for (_, start, i) in events {
            let size = self.aligned(bs[i].size);
            if start {
                span[i].0 = breadth.len();
                live += size;
                dirty = true;
            } else {
                if dirty {
                    breadth.push(live);
                    dirty = false;
                }
                span[i].1 = breadth.len();
                live -= size;
            }
        }
        Sections { span, breadth }
    }

    /// The sum over positions i of the largest i-th biggest size live at one time: what
    /// shared-object planning needs at least (TFLite's `CalculatePositionalMaximums`).
    pub fn positional_bound(&self) -> u64 {
        let bs = self.buffers();
        let mut events: Vec<(u64, bool, usize)> = Vec::with_capacity(2 * bs.len());
        for (i, b) in bs.iter().enumerate() {
            events.push((b.lower, true, i));
            events.push((b.upper, false, i));
        }
        events.sort_unstable();
        let mut live: BTreeMap<std::cmp::Reverse<u64>, u32> = BTreeMap::new();
        let mut positional: Vec<u64> = Vec::new();
        let mut dirty = false;
        for (_, start, i) in events {
            let size = std::cmp::Reverse(self.aligned(bs[i].size));
            if start {
                *live.entry(size).or_default() += 1;
                dirty = true;
                continue;
            }
            if dirty {
                let mut k = 0;
                for (&std::cmp::Reverse(s), &count) in &live {
                    for _ in 0..count {
                        if k == positional.len() {
                            positional.push(s);
                        } else {
                            positional[k] = positional[k].max(s);
                        }
                        k += 1;
                    }
                }
                dirty = false;
            }
            if let Some(c) = live.get_mut(&size) {
                *c -= 1;
                if *c == 0 {
                    live.remove(&size);
                }
            }
        }
        positional.iter().sum()
    }

    /// TFLite's `GreedyByBreadthAssignment`: sections in order of decreasing breadth, and in each
    /// its unassigned buffers by decreasing size; a buffer goes to the smallest free object at
    /// least its size, else to the largest free one (which grows), else to a new object. A free
    /// object has no buffer overlapping the new one in time. Offsets: objects side by side in
    /// creation order.
    pub(super) fn greedy_by_breadth(&self) -> Vec<u64> {
        let bs = self.buffers();
        let Sections { span, breadth } = self.sections();
        // Each buffer is first met at the widest section of its range (the first one on ties):
        // a sparse table answers those range-argmax queries in O(1).
        let table = SparseArgMax::new(&breadth);
        let mut order: Vec<(std::cmp::Reverse<u64>, usize, std::cmp::Reverse<u64>, usize)> = (0..bs.len())
            .map(|i| {
                let s = table.argmax(span[i].0, span[i].1);
                (std::cmp::Reverse(breadth[s]), s, std::cmp::Reverse(self.aligned(bs[i].size)), i)
            })
            .collect();
        order.sort_unstable();
        // Per object: its size and its buffers' lifetimes by lower end.
        let mut sizes: Vec<u64> = Vec::new();
        let mut schedules: Vec<BTreeMap<u64, u64>> = Vec::new();
        let mut object = vec![0usize; bs.len()];
        for &(_, _, std::cmp::Reverse(size), i) in &order {
            let b = bs[i];
            let mut best: Option<usize> = None;
            for (obj, schedule) in schedules.iter().enumerate() {
                if let Some(best) = best {
                    let (best_size, cur) = (sizes[best], sizes[obj]);
                    let worse = if best_size < size { cur <= best_size } else { cur < size || cur >= best_size };
                    if worse {
                        continue;
                    }
                }
                let clash_after = schedule.range(b.lower..).next().is_some_and(|(&lo, _)| lo < b.upper);
                let clash_before = schedule.range(..b.lower).next_back().is_some_and(|(_, &hi)| hi > b.lower);
                if !clash_after && !clash_before {
                    best = Some(obj);
                }
            }
            let obj = best.unwrap_or_else(|| {
                sizes.push(0);
                schedules.push(BTreeMap::new());
                sizes.len() - 1
            });
            sizes[obj] = sizes[obj].max(size);
            schedules[obj].insert(b.lower, b.upper);
            object[i] = obj;
        }
        let mut base = Vec::with_capacity(sizes.len());
        let mut next = 0u64;
        for s in &sizes {
            base.push(next);
            next += s;
        }
        object.into_iter().map(|o| base[o]).collect()
    }
}

/// Range argmax over a fixed array (first index on ties), O(1) per query after O(n log n).
struct SparseArgMax<'a> {
    values: &'a [u64],
    levels: Vec<Vec<u32>>,
}

impl<'a> SparseArgMax<'a> {
    fn new(values: &'a [u64]) -> Self {
        let mut levels: Vec<Vec<u32>> = vec![(0..values.len() as u32).collect()];
        let mut width = 1;
        while 2 * width <= values.len() {
            let prev = levels.last().expect("level 0 exists");
            let next = (0..=values.len() - 2 * width).map(|i| Self::pick(values, prev[i], prev[i + width])).collect();
            levels.push(next);
            width *= 2;
        }
        SparseArgMax { values, levels }
    }

    fn pick(values: &[u64], a: u32, b: u32) -> u32 {
        if values[b as usize] > values[a as usize] { b } else { a }
    }

    /// The index of the largest value in `lo..hi` (non-empty).
    fn argmax(&self, lo: usize, hi: usize) -> usize {
        let k = (usize::BITS - 1 - (hi - lo).leading_zeros()) as usize;
        let level = &self.levels[k];
        Self::pick(self.values, level[lo], level[hi - (1 << k)]) as usize
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Buffer, Strategy};
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn positional_bound_of_a_small_case() {
        // Step 0: {100, 50}; step 1: {80, 70}: positional maxima 100 + 70 = 170 > max live 150.
        let p = Problem::new(
            vec![Buffer::new(0, 1, 100), Buffer::new(0, 1, 50), Buffer::new(1, 2, 80), Buffer::new(1, 2, 70)],
            1,
        )
        .unwrap();
        assert_eq!(p.lower_bound(), 150);
        assert_eq!(p.positional_bound(), 170);
        let plan = p.plan(Strategy::TfliteGreedyByBreadth);
        assert_eq!(plan.peak, 170, "two objects: 100 (then 80) and 70 (50 grows)");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        #[test]
        fn breadth_plans_are_valid_and_above_the_positional_bound(
            raw in proptest::collection::vec((0u64..30, 1u64..10, 1u64..5000), 1..60),
            align_pow in 0u32..6,
        ) {
            let buffers = raw.into_iter().map(|(l, d, s)| Buffer::new(l, l + d, s)).collect();
            let p = Problem::new(buffers, 1 << align_pow).unwrap();
            let plan = p.plan(Strategy::TfliteGreedyByBreadth);
            prop_assert_eq!(p.validate(&plan.offsets).unwrap(), plan.peak);
            prop_assert!(plan.peak >= p.positional_bound());
            prop_assert!(p.positional_bound() >= p.lower_bound());
        }
    }
}
