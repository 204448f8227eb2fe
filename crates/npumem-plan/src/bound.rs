//! Lower bounds on the arena a plan needs.
//!
//! Invariant: every valid placement of the problem has `peak >= max_live()`.

use super::Problem;

impl Problem {
    /// The largest sum of aligned sizes live at one step (the max-load bound): no placement can
    /// do better, and on most real graphs the best plans reach it.
    pub fn lower_bound(&self) -> u64 {
        let mut events: Vec<(u64, bool, u64)> = Vec::with_capacity(2 * self.buffers().len());
        for b in self.buffers() {
            let size = self.aligned(b.size);
            events.push((b.lower, true, size));
            events.push((b.upper, false, size));
        }
        // Ends (false) before starts at the same step: half-open lifetimes.
        events.sort_unstable();
        let (mut live, mut best) = (0u64, 0u64);
        for (_, start, size) in events {
            if start {
                live += size;
                best = best.max(live);
            } else {
                live -= size;
            }
        }
        best
    }
}

#[cfg(test)]
mod tests {
    use super::super::Buffer;
    use super::*;

    #[test]
    fn max_live_with_alignment_and_half_open_lifetimes() {
        let p = Problem::new(vec![Buffer::new(0, 2, 10), Buffer::new(2, 4, 30), Buffer::new(1, 3, 5)], 1).unwrap();
        assert_eq!(p.lower_bound(), 35);
        let p = Problem::new(vec![Buffer::new(0, 2, 10), Buffer::new(2, 4, 30), Buffer::new(1, 3, 5)], 16).unwrap();
        assert_eq!(p.lower_bound(), 48);
    }
}
