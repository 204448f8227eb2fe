//! Chains: access-by-access simulation for hierarchies where every page size has at most one
//! array per level (every preset: split L1s as Skylake's, or one unified array a level).
//!
//! For such a hierarchy a page size's arrays form a chain, one link a level, and an access is
//! simulated exactly as the reference does it — look the links up in order until one hits, fill
//! every link before it (or walk and fill them all) — but without the general case's per-level
//! search for the arrays holding the size, without a batch to write and read back, and with the
//! counters of each link in the link itself. Being access by access, the order of every state
//! change (random replacement's shared generator included) is the reference's.
//!
//! Invariants: `Chains::of[p]` lists exactly the arrays of `Tlb::plans[p]`, one per level, in
//! level order; a chain is used only when `Tlb::chained` (no level has two arrays for one size).

use super::{PageSize, Tlb};

/// One link of a chain: an array index.
pub(super) type Link = u8;

/// Per page size (`PageSize as usize`), the arrays holding it, level by level.
#[derive(Debug, Default)]
pub(super) struct Chains {
    pub of: [Vec<Link>; 4],
}

impl Chains {
    /// The chains of a hierarchy, and whether they are its whole structure (at most one array
    /// per level for every size; otherwise they must not be used).
    pub(super) fn new(plans: &[super::Plan; 4]) -> (Self, bool) {
        let mut chains = Chains::default();
        let mut chained = true;
        for (p, plan) in plans.iter().enumerate() {
            let mut start = 0;
            for &end in &plan.level_ends {
                chained &= end - start <= 1;
                start = end;
            }
            chains.of[p] = plan.arrays.clone();
        }
        (chains, chained)
    }
}

impl Tlb {
    /// Simulates one access along its page size's chain (the hierarchy is chained): the same
    /// state changes, in the same order, as [`Tlb::simulate`].
    #[inline(always)]
    pub(super) fn simulate_chained(&mut self, tag: u64, va: u64, now: u64, page: PageSize, depth: u32) {
        let vpn = tag >> 6;
        let chain = &self.chains.of[page as usize];
        let mut reached = chain.len();
        for (i, &ai) in chain.iter().enumerate() {
            let ai = ai as usize;
            let (a, c) = (&mut self.arrays[ai], &mut self.counters[ai]);
            c.lookups += 1;
            if a.lookup(tag, vpn, now) {
                c.hits += 1;
                self.stats.cycles = self.stats.cycles.saturating_add(a.hit_cycles);
                reached = i;
                break;
            }
            c.misses += 1;
        }
        if reached == chain.len() {
            self.walk(va, depth, now);
        }
        let chain = &self.chains.of[page as usize];
        for &ai in &chain[..reached] {
            let ai = ai as usize;
            if self.arrays[ai].fill(tag, vpn, now, &mut self.rng) {
                self.counters[ai].evictions += 1;
            }
        }
    }
}
