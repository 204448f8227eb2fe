//! Batches: `Tlb::run` collects the accesses that need simulating (`Access`: tag, address,
//! clock tick) and simulates each batch level by level instead of access by access.
//!
//! Why it is exact: an array's state (its tags, stamps, PLRU bits, round-robin pointer) changes
//! only when it is looked up or filled, and it is looked up by exactly the accesses that reach
//! its level (no array above holds the entry), in order; it is filled by exactly those of them
//! that miss its whole level (a hit below or a walk fills every closer level, and every array of
//! a level that missed is closer). So a level's arrays can take the batch's accesses that reach
//! them one after the other, and pass on those that miss to the next level; the walk caches take
//! the accesses that miss every level. Stamps are the accesses' own clock ticks, and the counters
//! are sums (the cycle counter a saturating sum of non-negative terms), so the order in which
//! levels are done does not show. Random replacement draws from one generator shared by all
//! arrays, in the order of the fills: with more than one random array that order matters, and
//! the batch is simulated access by access instead.
//!
//! Invariants: a batch holds accesses in clock order; after `drain` it is empty and every access
//! has been simulated exactly once.

use super::array::size_bit;
use super::{PageSize, Replacement, Tlb};

/// Accesses simulated per batch: large enough to amortise a level's set-up, small enough that
/// a batch and its index lists stay in the L2 cache.
const BATCH: usize = 4096;

/// One access to simulate: the tag of its entry, its address (for the walk caches), its clock
/// tick, page size and walk depth.
#[derive(Clone, Copy, Debug)]
pub(super) struct Access {
    pub tag: u64,
    pub va: u64,
    pub page: PageSize,
    pub depth: u8,
}

#[derive(Debug, Default)]
pub(super) struct Batch {
    accesses: Vec<Access>,
    /// Indices of the accesses that reach the current level, and of those that pass it.
    reach: Vec<u32>,
    pass: Vec<u32>,
    /// Per access of `reach`, whether the level held its entry.
    hit: Vec<bool>,
    /// The page sizes of the accesses (a mask of `size_bit`s): arrays holding none of them
    /// are skipped.
    sizes: u8,
}

impl Batch {
    /// Adds `access`; returns whether the batch is full.
    #[inline]
    pub fn push(&mut self, access: Access) -> bool {
        if self.accesses.capacity() == 0 {
            self.accesses.reserve_exact(BATCH);
        }
        self.sizes |= size_bit(access.page);
        self.accesses.push(access);
        self.accesses.len() >= BATCH
    }
}

impl Tlb {
    /// Simulates every access of `batch` and empties it.
    pub(super) fn drain(&mut self, batch: &mut Batch) {
        if batch.accesses.is_empty() {
            return;
        }
        let random = self.arrays.iter().filter(|a| a.cfg.replacement == Replacement::Random).count();
        if random > 1 {
            for &access in &batch.accesses {
                self.simulate(access);
            }
            batch.accesses.clear();
            batch.sizes = 0;
            return;
        }
        let Batch { accesses, reach, pass, hit, sizes } = batch;
        let sizes = std::mem::take(sizes);
        reach.clear();
        reach.extend(0..accesses.len() as u32);
        for level in 0..self.plans[0].level_ends.len() {
            if self.split[level] {
                self.split_level(level, sizes, accesses, reach, pass, hit);
            } else {
                self.level(level, accesses, reach, pass);
            }
            std::mem::swap(reach, pass);
        }
        for &i in reach.iter() {
            let a = accesses[i as usize];
            self.walk(a.va, u32::from(a.depth));
        }
        accesses.clear();
    }

    /// [`Tlb::level`] for a level where no page size has two arrays: each array takes the
    /// accesses of its page sizes on its own (their states are independent), in one pass.
    fn split_level(
        &mut self,
        level: usize,
        sizes: u8,
        accesses: &[Access],
        reach: &[u32],
        pass: &mut Vec<u32>,
        hit: &mut Vec<bool>,
    ) {
        hit.clear();
        hit.resize(reach.len(), false);
        let mut cycles = self.stats.cycles;
        for ai in self.level_arrays[level].clone() {
            if self.arrays[ai].sizes_mask & sizes == 0 {
                continue;
            }
            self.arrays[ai].pass(accesses, reach, hit, &mut self.counters[ai], &mut cycles, &mut self.rng);
        }
        self.stats.cycles = cycles;
        pass.clear();
        pass.extend(reach.iter().zip(hit.iter()).filter(|&(_, &h)| !h).map(|(&i, _)| i));
    }

    /// Runs the accesses `reach` (indices into `accesses`) through the arrays of `level`; those
    /// that miss it (or find no array for their page size) go to `pass`.
    fn level(&mut self, level: usize, accesses: &[Access], reach: &[u32], pass: &mut Vec<u32>) {
        pass.clear();
        // Per page size, the arrays of this level that hold it.
        let holders: [&[u8]; 4] = std::array::from_fn(|p| {
            let plan = &self.plans[p];
            let start = if level == 0 { 0 } else { plan.level_ends[level - 1] };
            &plan.arrays[start..plan.level_ends[level]]
        });
        let mut cycles = self.stats.cycles;
        for &i in reach {
            let a = &accesses[i as usize];
            let tag = a.tag;
            match holders[a.page as usize] {
                [] => pass.push(i),
                &[ai] => {
                    let ai = ai as usize;
                    let (array, c) = (&mut self.arrays[ai], &mut self.counters[ai]);
                    c.lookups += 1;
                    if array.lookup(tag, tag >> 6) {
                        c.hits += 1;
                        cycles = cycles.saturating_add(array.hit_cycles);
                    } else {
                        c.misses += 1;
                        c.evictions += u64::from(array.fill(tag, tag >> 6, &mut self.rng));
                        pass.push(i);
                    }
                }
                several => {
                    let mut hit = false;
                    for &ai in several {
                        let ai = ai as usize;
                        let (array, c) = (&mut self.arrays[ai], &mut self.counters[ai]);
                        c.lookups += 1;
                        if array.lookup(tag, tag >> 6) {
                            c.hits += 1;
                            cycles = cycles.saturating_add(array.hit_cycles);
                            hit = true;
                        } else {
                            c.misses += 1;
                        }
                    }
                    if !hit {
                        for &ai in several {
                            let ai = ai as usize;
                            if self.arrays[ai].fill(tag, tag >> 6, &mut self.rng) {
                                self.counters[ai].evictions += 1;
                            }
                        }
                        pass.push(i);
                    }
                }
            }
        }
        self.stats.cycles = cycles;
    }
}
