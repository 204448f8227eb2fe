//! `RecentFrees`: the npumem pool's front cache. A freed pooled block is not released into its
//! pool's free space at once; it waits in a LIFO stack of blocks of exactly its size, and the
//! next malloc of that size (same pool) takes it back in O(1) — no best-fit search, no
//! coalescing, no page bookkeeping. A malloc that finds no block of its size and that the pool
//! cannot place on mapped pages of its small pool (or any miss while the pool is near its
//! limit) releases every waiting block (`iter`, then `clear`: no list of them is built) before
//! it searches, so that page mapping, trimming and out-of-memory handling always see all free
//! memory, exactly as without the cache.
//!
//! Stacks of other sizes (the large pool's, and small-pool blocks over `SMALL_LIMIT`) are found
//! by their key, `size << 1 | pool`, in `by_key` (a hash map to their index in `others`), with a
//! direct-mapped memo of the last keys used in front of it: a run of a few sizes (a training
//! step's shapes) finds its stacks without hashing.
//!
//! Invariants: a waiting block is free to the pool's statistics and live table but still holds
//! its VA reservation and counts on its pages (they stay mapped, as the pool keeps idle pages
//! mapped anyway); `len` is the number of waiting blocks; every small stack that is non-empty or
//! flagged `listed` has its index in `touched` exactly once, and so has every other stack in
//! `others_touched`, so `clear` visits only those; `by_key` maps each key of `others` to its
//! index, and every memo entry with a non-zero key names a stack of `others` with that key.

use rustc_hash::FxHashMap;

use super::PoolKind;
use crate::units::MIB;
use crate::vm::PageSize;

/// Small-pool blocks up to this size have an array slot per size (size / quantum); the rest
/// are found by (pool, size) in a hash map.
const SMALL_LIMIT: u64 = MIB;
/// Entries of the memo in front of `by_key`.
const MEMO: usize = 16;
/// `clear` forgets the other sizes' stacks (all empty then) once there are more than this
/// many, so that a trace of ever new sizes keeps memory bounded.
const OTHERS_KEPT: usize = 4096;

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
    /// Stacks of other sizes: (key, stack, listed in `others_touched`).
    others: Vec<(u64, Vec<Waiting>, bool)>,
    others_touched: Vec<u32>,
    by_key: FxHashMap<u64, u32>,
    /// (key, index in `others`), by the key's quantum count modulo `MEMO`; key 0: empty.
    memo: [(u64, u32); MEMO],
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
            others: Vec::new(),
            others_touched: Vec::new(),
            by_key: FxHashMap::default(),
            memo: [(0, 0); MEMO],
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

    /// The key of another size's stack (never 0: such sizes are over `SMALL_LIMIT` or large).
    #[inline(always)]
    fn key(kind: PoolKind, size: u64) -> u64 {
        size << 1 | kind as u64
    }

    #[inline(always)]
    fn memo_at(&self, key: u64) -> usize {
        // Fibonacci hashing: the training shapes (3, 4, 8 MiB) differ only in high bits.
        (key.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (64 - MEMO.trailing_zeros())) as usize
    }

    /// The index in `others` of the stack of `key`, if it has one.
    #[inline(always)]
    fn find(&mut self, key: u64) -> Option<usize> {
        let at = self.memo_at(key);
        let (k, i) = self.memo[at];
        if k == key {
            return Some(i as usize);
        }
        let i = *self.by_key.get(&key)?;
        self.memo[at] = (key, i);
        Some(i as usize)
    }

    /// The stack of `key` in `others`, made if it has none, and listed.
    #[inline(always)]
    fn other_mut(&mut self, key: u64) -> &mut Vec<Waiting> {
        let i = match self.find(key) {
            Some(i) => i,
            None => {
                let i = self.others.len();
                self.others.push((key, Vec::new(), false));
                self.by_key.insert(key, i as u32);
                let at = self.memo_at(key);
                self.memo[at] = (key, i as u32);
                i
            }
        };
        let (_, stack, listed) = &mut self.others[i];
        if !*listed {
            *listed = true;
            self.others_touched.push(i as u32);
        }
        stack
    }

    /// A waiting block of exactly `size` bytes in `kind`'s pool, the most recently freed first.
    #[inline(always)]
    pub fn pop(&mut self, kind: PoolKind, size: u64) -> Option<Waiting> {
        if self.len == 0 {
            return None;
        }
        let got = match self.slot(kind, size) {
            Some(i) => self.small.get_mut(i)?.0.pop(),
            None => {
                let i = self.find(Self::key(kind, size))?;
                self.others[i].1.pop()
            }
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
            None => {
                let i = self.find(Self::key(kind, size))?;
                &mut self.others[i].1
            }
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
            None => self.other_mut(Self::key(kind, size)).push(block),
        }
        self.len += 1;
    }

    /// Every waiting block as (pool, address, size), in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (PoolKind, u64, u64)> + '_ {
        let shift = self.quantum_shift;
        let small = self.touched.iter().flat_map(move |&i| {
            self.small[i as usize].0.iter().map(move |w| (PoolKind::Small, w.ptr, (i as u64) << shift))
        });
        let other = self.others_touched.iter().flat_map(move |&i| {
            let (key, stack, _) = &self.others[i as usize];
            let kind = if key & 1 == 0 { PoolKind::Small } else { PoolKind::Large };
            stack.iter().map(move |w| (kind, w.ptr, key >> 1))
        });
        small.chain(other)
    }

    /// Removes and returns every waiting block as (pool, address, size).
    #[cfg(test)]
    pub fn take_all(&mut self) -> Vec<(PoolKind, u64, u64)> {
        let all: Vec<_> = self.iter().collect();
        self.clear();
        all
    }

    /// Removes every waiting block (after `iter` has visited them: a miss near the limit
    /// releases thousands at 10^6 live blocks, and a list of them would be a fresh, page-faulting
    /// allocation each time).
    pub fn clear(&mut self) {
        for &i in &self.touched {
            let (stack, listed) = &mut self.small[i as usize];
            stack.clear();
            *listed = false;
        }
        self.touched.clear();
        for &i in &self.others_touched {
            let (_, stack, listed) = &mut self.others[i as usize];
            stack.clear();
            *listed = false;
        }
        self.others_touched.clear();
        if self.others.len() > OTHERS_KEPT {
            self.others.clear();
            self.by_key.clear();
            self.memo = [(0, 0); MEMO];
        }
        self.len = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    proptest! {
        /// Against a map of LIFO stacks by (pool, size): the same blocks come back from `pop`,
        /// `take` and `take_all`, whatever the sizes (small slots, other stacks, memo
        /// collisions).
        #[test]
        fn behaves_like_stacks_by_size(
            ops in proptest::collection::vec((0u8..8, any::<bool>(), 0usize..24, 1usize..4), 1..400),
        ) {
            let sizes: Vec<u64> = (0..24u64).map(|i| if i < 8 { (i + 1) * 512 } else { MIB + i * (MIB / 2) }).collect();
            let mut r = RecentFrees::new(512);
            let mut model: HashMap<(PoolKind, u64), Vec<u64>> = HashMap::new();
            let mut next = 1u64;
            for (op, large, s, n) in ops {
                let kind = if large { PoolKind::Large } else { PoolKind::Small };
                let size = sizes[s];
                match op {
                    0..=3 => {
                        r.push(kind, size, Waiting { ptr: next, page: PageSize::Size2M });
                        model.entry((kind, size)).or_default().push(next);
                        next += 1;
                    }
                    4 | 5 => {
                        let want = model.get_mut(&(kind, size)).and_then(Vec::pop);
                        prop_assert_eq!(r.pop(kind, size).map(|w| w.ptr), want);
                    }
                    6 => {
                        let got: Vec<u64> =
                            r.take(kind, size, |w| w.min(n)).map_or_else(Vec::new, |d| d.rev().map(|w| w.ptr).collect());
                        let stack = model.entry((kind, size)).or_default();
                        let want: Vec<u64> = (0..n.min(stack.len())).filter_map(|_| stack.pop()).collect();
                        prop_assert_eq!(got, want);
                    }
                    _ => {
                        let mut got = r.take_all();
                        got.sort_unstable_by_key(|&(_, p, _)| p);
                        let mut want: Vec<(PoolKind, u64, u64)> =
                            model.drain().flat_map(|((k, s), v)| v.into_iter().map(move |p| (k, p, s))).collect();
                        want.sort_unstable_by_key(|&(_, p, _)| p);
                        prop_assert_eq!(got, want);
                    }
                }
                prop_assert_eq!(r.len(), model.values().map(Vec::len).sum::<usize>());
                prop_assert_eq!(r.iter().count(), r.len());
            }
        }
    }

    #[test]
    fn forgets_other_sizes_past_the_bound_and_keeps_working() {
        let mut r = RecentFrees::new(512);
        let w = |ptr| Waiting { ptr, page: PageSize::Size2M };
        for i in 0..(OTHERS_KEPT as u64 + 10) {
            r.push(PoolKind::Large, 2 * MIB + i * 512, w(i + 1));
        }
        assert_eq!(r.take_all().len(), OTHERS_KEPT + 10);
        assert!(r.others.is_empty() && r.by_key.is_empty());
        assert_eq!(r.pop(PoolKind::Large, 2 * MIB), None);
        r.push(PoolKind::Large, 2 * MIB, w(7));
        r.push(PoolKind::Small, 2 * MIB, w(8));
        assert_eq!(r.pop(PoolKind::Large, 2 * MIB), Some(w(7)));
        assert_eq!(r.take_all(), vec![(PoolKind::Small, 8, 2 * MIB)]);
    }

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
