//! Improvement around the peak: after the greedy portfolio, repeatedly move a buffer that ends
//! at the peak to an earlier position of the placement order (and, half of the time, swap two
//! neighbours), re-place with best fit, and keep the new order when the peak does not grow.
//!
//! Invariants: the result is never worse than the input placement; the search is deterministic
//! (a fixed-seed generator and an iteration budget, not a clock), so a problem always gets the
//! same plan; it stops early at the lower bound.

use super::Problem;
use super::strategy::Placement;

/// SplitMix64: a small, well-mixed deterministic generator (not worth a crate for one use).
struct SplitMix(u64);

impl SplitMix {
    fn below(&mut self, n: usize) -> usize {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        ((z ^ (z >> 31)) % n as u64) as usize
    }
}

impl Problem {
    /// Improves the placement `offsets` obtained from order `seq` within `iterations` re-placements.
    /// `bound` is the problem's lower bound (the search stops there).
    pub(super) fn improve(
        &self,
        mut seq: Vec<usize>,
        mut offsets: Vec<u64>,
        iterations: usize,
        bound: u64,
    ) -> Vec<u64> {
        let mut peak = self.peak_of(&offsets);
        let mut rng = SplitMix(0x6E70_756D_656D);
        let bs = self.buffers();
        for _ in 0..iterations {
            if peak <= bound {
                break;
            }
            let at_peak: Vec<usize> =
                (0..seq.len()).filter(|&k| offsets[seq[k]] + self.aligned(bs[seq[k]].size) == peak).collect();
            let mut cand = seq.clone();
            let from = at_peak[rng.below(at_peak.len())];
            let to = rng.below(from + 1);
            let moved = cand.remove(from);
            cand.insert(to, moved);
            if cand.len() > 1 && rng.below(2) == 0 {
                let k = rng.below(cand.len() - 1);
                cand.swap(k, k + 1);
            }
            let placed = self.place_seq(&cand, Placement::BestFit);
            let p = self.peak_of(&placed);
            if p <= peak {
                (seq, offsets, peak) = (cand, placed, p);
            }
        }
        offsets
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Buffer, Strategy};
    use super::*;

    #[test]
    fn improvement_is_deterministic_and_never_worse() {
        let mut rng = SplitMix(7);
        let buffers = (0..120)
            .map(|_| {
                let lower = rng.below(60) as u64;
                Buffer { lower, upper: lower + 1 + rng.below(20) as u64, size: 1 + rng.below(4096) as u64 }
            })
            .collect();
        let p = Problem::new(buffers, 32).unwrap();
        let a = p.plan(Strategy::Npumem);
        let b = p.plan(Strategy::Npumem);
        assert_eq!(a.offsets, b.offsets);
        assert_eq!(p.validate(&a.offsets).unwrap(), a.peak);
        let greedy = [Strategy::TfliteGreedyBySize, Strategy::BestFitInOrder].map(|s| p.plan(s).peak);
        assert!(a.peak <= greedy[0].min(greedy[1]));
        assert!(a.peak >= p.lower_bound());
    }
}
