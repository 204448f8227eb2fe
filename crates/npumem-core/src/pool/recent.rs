//! `RecentFrees`: the npumem pool's front cache. A freed pooled block is not released into its
//! pool's free space at once; it waits in a LIFO stack of blocks of exactly its size, and the
//! next malloc of that size (same pool) takes it back in O(1) — no best-fit search, no
//! coalescing, no page bookkeeping. A malloc that finds no block of its size and that the pool
//! cannot place on mapped pages of its small pool (or any miss while the pool is near its
//! limit) releases
//! every waiting block (`take_all`) before it searches, so that page mapping, trimming and
//! out-of-memory handling always see all free memory, exactly as without the cache.
//!
//! Invariants: a waiting block is free to the pool's statistics and live table but still holds
//! its VA reservation and counts on its pages (they stay mapped, as the pool keeps idle pages
//! mapped anyway); `len` is the number of waiting blocks; every small stack that is non-empty or
//! flagged `listed` has its index in `touched` exactly once, so `take_all` visits only those.

use rustc_hash::FxHashMap;

use super::PoolKind;
use crate::units::MIB;
use crate::vm::PageSize;

/// Small-pool blocks up to this size have an array slot per size (size / quantum); the rest
/// are found by (pool, size) in a hash map.
const SMALL_LIMIT: u64 = MIB;

/// A waiting block: its address and the page size backing it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Waiting {
    pub ptr: u64,
    pub page: PageSize,
}

#[derive(Debug)]
pub struct RecentFrees {
    quantum_shift: u32,
    /// Per size / quantum: the stack and whether its index is in `touched`.
    small: Vec<(Vec<Waiting>, bool)>,
    touched: Vec<u32>,
    other: FxHashMap<(PoolKind, u64), Vec<Waiting>>,
    len: usize,
}

impl RecentFrees {
    /// Stacks for blocks whose sizes are multiples of `quantum` (a power of two).
    pub fn new(quantum: u64) -> Self {
        debug_assert!(quantum.is_power_of_two());
        RecentFrees {
            quantum_shift: quantum.trailing_zeros(),
            small: Vec::new(),
            touched: Vec::new(),
            other: FxHashMap::default(),
            len: 0,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn len(&self) -> usize {
        self.len
    }

    fn slot(&self, kind: PoolKind, size: u64) -> Option<usize> {
        (kind == PoolKind::Small && size <= SMALL_LIMIT).then(|| (size >> self.quantum_shift) as usize)
    }

    /// A waiting block of exactly `size` bytes in `kind`'s pool, the most recently freed first.
    #[inline(always)]
    pub fn pop(&mut self, kind: PoolKind, size: u64) -> Option<Waiting> {
        if self.len == 0 {
            return None;
        }
        let got = match self.slot(kind, size) {
            Some(i) => self.small.get_mut(i)?.0.pop(),
            None => self.other.get_mut(&(kind, size))?.pop(),
        };
        self.len -= got.is_some() as usize;
        got
    }

    /// Takes waiting blocks of exactly `size` bytes of `kind`'s pool: `count`, given how many
    /// wait, says how many (at most that many). They come from the back of the drain
    /// (`next_back`) in the order `pop` would give them, the most recently freed first; what is
    /// still in the drain (`as_slice`) are the blocks the next ones come from, for a look-ahead.
    /// None when no block of that size ever waited.
    #[inline]
    pub fn take(
        &mut self,
        kind: PoolKind,
        size: u64,
        count: impl FnOnce(usize) -> usize,
    ) -> Option<std::vec::Drain<'_, Waiting>> {
        let stack = match self.slot(kind, size) {
            Some(i) => &mut self.small.get_mut(i)?.0,
            None => self.other.get_mut(&(kind, size))?,
        };
        let taken = count(stack.len()).min(stack.len());
        self.len -= taken;
        let keep = stack.len() - taken;
        Some(stack.drain(keep..))
    }

    /// Keeps a freed block of `size` bytes of `kind`'s pool.
    #[inline(always)]
    pub fn push(&mut self, kind: PoolKind, size: u64, block: Waiting) {
        match self.slot(kind, size) {
            Some(i) => {
                if i >= self.small.len() {
                    self.small.resize_with(i + 1, Default::default);
                }
                let (stack, listed) = &mut self.small[i];
                if !*listed {
                    *listed = true;
                    self.touched.push(i as u32);
                }
                stack.push(block);
            }
            None => self.other.entry((kind, size)).or_default().push(block),
        }
        self.len += 1;
    }

    /// Every waiting block as (pool, address, size), in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (PoolKind, u64, u64)> + '_ {
        let shift = self.quantum_shift;
        let small = self.touched.iter().flat_map(move |&i| {
            self.small[i as usize].0.iter().map(move |w| (PoolKind::Small, w.ptr, (i as u64) << shift))
        });
        let other = self.other.iter().flat_map(|(&(kind, size), stack)| stack.iter().map(move |w| (kind, w.ptr, size)));
        small.chain(other)
    }

    /// Removes and returns every waiting block as (pool, address, size).
    pub fn take_all(&mut self) -> Vec<(PoolKind, u64, u64)> {
        let all: Vec<_> = self.iter().collect();
        for &i in &self.touched {
            let (stack, listed) = &mut self.small[i as usize];
            stack.clear();
            *listed = false;
        }
        self.touched.clear();
        self.other.clear();
        self.len = 0;
        all
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_sizes_lifo_and_take_all() {
        let mut r = RecentFrees::new(512);
        let w = |ptr| Waiting { ptr, page: PageSize::Size4K };
        r.push(PoolKind::Small, 4096, w(1));
        r.push(PoolKind::Small, 4096, w(2));
        r.push(PoolKind::Small, 1024, w(3));
        r.push(PoolKind::Large, 4096, w(4));
        r.push(PoolKind::Small, 4 * MIB, w(5));
        assert_eq!(r.len(), 5);
        assert_eq!(r.pop(PoolKind::Small, 4096), Some(w(2)));
        assert_eq!(r.pop(PoolKind::Small, 4608), None);
        assert_eq!(r.pop(PoolKind::Large, 1024), None);
        assert_eq!(r.pop(PoolKind::Large, 4096), Some(w(4)));
        assert_eq!(r.len(), 3);
        let mut all = r.take_all();
        all.sort_unstable_by_key(|&(_, p, _)| p);
        assert_eq!(all, vec![(PoolKind::Small, 1, 4096), (PoolKind::Small, 3, 1024), (PoolKind::Small, 5, 4 * MIB)]);
        assert!(r.is_empty() && r.iter().next().is_none());
        // `take` hands out the same blocks in the same order as repeated `pop`s.
        for p in 10..15 {
            r.push(PoolKind::Small, 4096, w(p));
        }
        let take = |r: &mut RecentFrees, kind, size, n: usize| {
            r.take(kind, size, |waiting| waiting.min(n)).map_or_else(Vec::new, |d| d.rev().collect::<Vec<_>>())
        };
        assert_eq!(take(&mut r, PoolKind::Small, 4096, 3), vec![w(14), w(13), w(12)]);
        assert_eq!(r.len(), 2);
        // `count` sees how many wait; asking for more takes what there is.
        assert_eq!(
            r.take(PoolKind::Small, 4096, |waiting| waiting + 7).map(|d| d.rev().collect::<Vec<_>>()),
            Some(vec![w(11), w(10)])
        );
        assert_eq!(take(&mut r, PoolKind::Large, 8192, 9), vec![]);
        assert!(r.is_empty());
        assert_eq!(r.pop(PoolKind::Small, 1024), None);
        // A stack emptied by pops and refilled is listed once.
        r.push(PoolKind::Small, 1024, w(6));
        r.pop(PoolKind::Small, 1024);
        r.push(PoolKind::Small, 1024, w(7));
        assert_eq!(r.take_all(), vec![(PoolKind::Small, 7, 1024)]);
    }
}
