//! `LiveTable`: the device's live allocations, kept by address beside the pages that hold
//! them (as the pool's `BlockMap` keeps its blocks). The address space is cut into 2 MiB
//! pages; a page that holds live allocations has a leaf: one 16-byte record per 512-byte grain
//! of the page (the grain every allocator family places blocks on). The allocation at `ptr` is
//! found by index arithmetic: a lookup of the page (the last page used is remembered, so a run
//! of neighbouring blocks does not even hash) and one record access. Neighbouring blocks have
//! neighbouring records: a batch of blocks from one pool page walks one leaf in order, where a
//! hash map by address touches a random bucket, and misses the cache, for each block; batches
//! also name the blocks ahead of time (`LiveTable::prefetch`), so a record's cache miss
//! overlaps the work on those before. A random malloc or free touches one record, as a hash
//! map's bucket. (A packed variant — a 2-byte grain index naming packed records — took 8x less
//! memory but put two dependent cache misses on each random free: 20-30% slower on a random
//! churn at 10^6 live blocks.)
//!
//! What a leaf cannot hold goes to `Hashed` (a hash map by address with a lazily synced
//! ordered index): a pointer off the 512-byte grain, an allocation whose fields do not fit a
//! record (size or grant slack of 4 GiB or more, a stream id past 32 bits, booking slack past
//! 255 bytes), and allocations on new pages once the leaves would take more than
//! `slots_per_live` records (512 bytes) per live allocation, plus `free_leaves` leaves (1 MiB).
//! That budget bounds memory however sparse the addresses are (the host backend's are real
//! process addresses; several devices share the 48-bit VA): whatever addresses come in, the
//! leaves take at most 512 bytes per live allocation at the peak plus 1 MiB. Pages that hold an
//! allocation every 16 KiB on average (a pool's pages) all fit the budget; records take 3% of
//! the address range they cover. A leaf that empties is kept (a batch freed and made again
//! refills the same pages) and is taken over by the next new page before a new leaf is made.
//!
//! Invariants: each live allocation is held exactly once — in the leaf of its page (`live`
//! set in its record) or in `loose`; `pages`, `ordered` and the leaves' `page` fields name the
//! same set of pages, each with its bit set in `marked` (a set bit may be stale); each leaf's
//! `live` counts its live records and `in_leaves` sums them; a leaf's `groups` has bit `g` set
//! for every 64-record group holding a live record (a set bit may be stale); a leaf with no
//! live record is in `emptied` (once: `listed`); the leaves take at most `slots_per_live`
//! records per live allocation at the peak plus `free_leaves` leaves, and `grow_at` is the
//! least `in_leaves` at which that budget allows one more; `last` names a page in `pages` and
//! its leaf, or no page.

mod hashed;

use std::collections::BTreeSet;

use rustc_hash::FxHashMap;

use super::Allocation;
use crate::acl::Policy;
use crate::prefetch::prefetch;
use crate::vm::PageSize;
use hashed::Hashed;

/// A leaf covers `1 << PAGE_SHIFT` bytes in records of `1 << GRAIN_SHIFT` bytes each.
const PAGE_SHIFT: u32 = 21;
const GRAIN_SHIFT: u32 = 9;
const GRAIN_MASK: u64 = (1 << GRAIN_SHIFT) - 1;
const SLOTS: usize = 1 << (PAGE_SHIFT - GRAIN_SHIFT);
/// Records a 64-bit group mask covers per bit.
const GROUP: usize = SLOTS / 64;
/// Leaves that may exist beyond the budget's share (1 MiB of records).
const FREE_LEAVES: usize = 16;
/// The records the leaves may take per live allocation (512 bytes): an allocation every 16 KiB
/// of its pages on average keeps every page in a leaf.
const SLOTS_PER_LIVE: usize = 32;
/// `page` when `last` names no page (a page number is at most 64 - 21 bits).
const NO_PAGE: u64 = u64::MAX;

/// An allocation less its pointer (the slot's address), packed in 16 bytes.
#[derive(Clone, Copy, Debug, Default)]
struct Record {
    size: u32,
    /// `granted - size`.
    granted_extra: u32,
    stream: u32,
    /// `booked - size`.
    booked_extra: u8,
    policy: u8,
    page: u8,
    live: bool,
}

const PAGE_SIZES: [PageSize; 4] = [PageSize::Size4K, PageSize::Size64K, PageSize::Size2M, PageSize::Size1G];

impl Record {
    /// The packed form of `a`, or None when a field does not fit.
    #[inline]
    fn pack(a: &Allocation) -> Option<Record> {
        Some(Record {
            size: u32::try_from(a.size).ok()?,
            granted_extra: u32::try_from(a.granted.checked_sub(a.size)?).ok()?,
            stream: u32::try_from(a.stream).ok()?,
            booked_extra: u8::try_from(a.booked.checked_sub(a.size)?).ok()?,
            policy: a.policy as u8,
            page: a.page as u8,
            live: true,
        })
    }

    #[inline]
    fn unpack(&self, ptr: u64) -> Allocation {
        let size = self.size as u64;
        Allocation {
            ptr,
            size,
            booked: size + self.booked_extra as u64,
            granted: size + self.granted_extra as u64,
            policy: Policy::ALL[self.policy as usize],
            page: PAGE_SIZES[self.page as usize],
            stream: self.stream as u64,
        }
    }
}

/// The records of one 2 MiB page.
#[derive(Debug)]
struct Leaf {
    page: u64,
    live: u32,
    /// Whether the leaf is in `emptied`.
    listed: bool,
    /// Bit `g`: records `g * GROUP ..` may hold a live one.
    groups: u64,
    records: Box<[Record]>,
}

impl Leaf {
    /// The live record with the greatest slot at or below `top`; clears the group bits found
    /// stale on the way.
    fn at_or_before(&mut self, top: usize) -> Option<usize> {
        let mut g = top / GROUP;
        loop {
            if self.groups & (1 << g) != 0 {
                let first = g * GROUP;
                let last = top.min(first + GROUP - 1);
                if let Some(s) = (first..=last).rev().find(|&s| self.records[s].live) {
                    return Some(s);
                }
                if last == first + GROUP - 1 {
                    self.groups &= !(1 << g);
                }
            }
            if g == 0 {
                return None;
            }
            g -= 1;
        }
    }
}

#[derive(Debug)]
pub(super) struct LiveTable {
    /// The leaf of each page that has one, by page number (`ptr >> PAGE_SHIFT`).
    pages: FxHashMap<u64, u32>,
    /// A filter of `pages`: bit `marker(page)` is set for every page that has a leaf (a set
    /// bit may be stale), so that most pages without one are known without hashing.
    marked: [u64; 4],
    leaves: Vec<Leaf>,
    /// The page numbers of `pages` in order, for "which allocation holds this address".
    ordered: BTreeSet<u64>,
    /// Leaves that went empty (a page may have refilled one since).
    emptied: Vec<u32>,
    /// The page of the last insert or remove, and its leaf.
    last: (u64, u32),
    in_leaves: usize,
    /// The least `in_leaves` at which the budget allows one more leaf (`usize::MAX`: none).
    grow_at: usize,
    /// The budget: leaves may take `slots_per_live` records per live allocation, plus
    /// `free_leaves` leaves.
    slots_per_live: usize,
    free_leaves: usize,
    loose: Hashed,
}

impl Default for LiveTable {
    fn default() -> Self {
        Self::with_budget(SLOTS_PER_LIVE, FREE_LEAVES, Hashed::default())
    }
}

impl LiveTable {
    fn with_budget(slots_per_live: usize, free_leaves: usize, loose: Hashed) -> Self {
        let mut table = LiveTable {
            pages: FxHashMap::default(),
            marked: [0; 4],
            leaves: Vec::new(),
            ordered: BTreeSet::new(),
            emptied: Vec::new(),
            last: (NO_PAGE, 0),
            in_leaves: 0,
            grow_at: 0,
            slots_per_live,
            free_leaves,
            loose,
        };
        table.grow_at = table.grow_at();
        table
    }

    /// The least `in_leaves` at which the budget — `slots_per_live` records per allocation in
    /// the leaves, plus the first allocation's share and `free_leaves` leaves — allows one more
    /// leaf than there are.
    fn grow_at(&self) -> usize {
        let needed = (self.leaves.len() + 1).saturating_sub(self.free_leaves).saturating_mul(SLOTS);
        if self.leaves.len() >= u32::MAX as usize {
            usize::MAX
        } else if needed == 0 {
            0
        } else if self.slots_per_live == 0 {
            usize::MAX
        } else {
            needed.div_ceil(self.slots_per_live) - 1
        }
    }

    #[inline(always)]
    fn slot(ptr: u64) -> usize {
        ((ptr >> GRAIN_SHIFT) as usize) & (SLOTS - 1)
    }

    /// `page`'s bit in `marked`.
    #[inline(always)]
    fn marker(page: u64) -> usize {
        (page.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 56) as usize
    }

    /// False when `page` has no leaf (true: it may have one).
    #[inline(always)]
    fn may_have_leaf(&self, page: u64) -> bool {
        let bit = Self::marker(page);
        self.marked[bit / 64] & (1 << (bit % 64)) != 0
    }

    /// The leaf of `page`, if it has one (remembered for the next call).
    #[inline(always)]
    fn leaf_of(&mut self, page: u64) -> Option<u32> {
        if self.last.0 == page {
            return Some(self.last.1);
        }
        if !self.may_have_leaf(page) {
            return None;
        }
        let &leaf = self.pages.get(&page)?;
        self.last = (page, leaf);
        Some(leaf)
    }

    /// Inserts a live allocation (none is live at its pointer).
    #[inline(always)]
    pub fn insert(&mut self, allocation: Allocation) {
        let ptr = allocation.ptr;
        if ptr & GRAIN_MASK == 0 {
            if let Some(record) = Record::pack(&allocation) {
                let page = ptr >> PAGE_SHIFT;
                let leaf = match self.leaf_of(page) {
                    Some(leaf) => Some(leaf),
                    None if self.may_grow() => self.new_leaf(page),
                    None => None,
                };
                if let Some(leaf) = leaf {
                    let leaf = &mut self.leaves[leaf as usize];
                    let slot = Self::slot(ptr);
                    debug_assert!(!leaf.records[slot].live, "{ptr:#x} is live already");
                    leaf.records[slot] = record;
                    leaf.live += 1;
                    leaf.groups |= 1 << (slot / GROUP);
                    self.in_leaves += 1;
                    return;
                }
            }
        }
        debug_assert!(self.get(ptr).is_none(), "{ptr:#x} is live already");
        self.loose.insert(allocation);
    }

    /// Whether `new_leaf` may find a leaf: one may have gone empty, or the budget allows
    /// another (checked before the call, which a table of large allocations, most of them
    /// loose, would otherwise make on every insert).
    #[inline(always)]
    fn may_grow(&self) -> bool {
        !self.emptied.is_empty() || self.within_budget()
    }

    /// Whether the budget allows one more leaf.
    #[inline(always)]
    fn within_budget(&self) -> bool {
        debug_assert_eq!(self.grow_at, self.grow_at());
        self.in_leaves >= self.grow_at
    }

    /// A leaf for `page`: one that went empty, taken over, else a new one while the budget
    /// allows; None when the budget is spent.
    #[cold]
    fn new_leaf(&mut self, page: u64) -> Option<u32> {
        let mut taken = None;
        while let Some(i) = self.emptied.pop() {
            let leaf = &mut self.leaves[i as usize];
            leaf.listed = false;
            if leaf.live == 0 {
                taken = Some(i);
                break;
            }
        }
        let i = match taken {
            Some(i) => {
                let leaf = &mut self.leaves[i as usize];
                let old = std::mem::replace(&mut leaf.page, page);
                leaf.groups = 0;
                self.pages.remove(&old);
                self.ordered.remove(&old);
                i
            }
            None => {
                if !self.within_budget() {
                    return None;
                }
                let records = vec![Record::default(); SLOTS].into_boxed_slice();
                self.leaves.push(Leaf { page, live: 0, listed: false, groups: 0, records });
                self.grow_at = self.grow_at();
                (self.leaves.len() - 1) as u32
            }
        };
        self.pages.insert(page, i);
        let bit = Self::marker(page);
        self.marked[bit / 64] |= 1 << (bit % 64);
        self.ordered.insert(page);
        self.last = (page, i);
        Some(i)
    }

    /// Starts loading the record of `ptr` into the cache, when `ptr` is on the page of the
    /// last insert or remove (a hint, with no effect on the contents: a batch gives the pointer
    /// a few places ahead, so that its record's cache miss overlaps the work on those before).
    #[inline(always)]
    pub fn prefetch(&self, ptr: u64) {
        if self.last.0 == ptr >> PAGE_SHIFT {
            prefetch(&self.leaves[self.last.1 as usize].records[Self::slot(ptr)]);
        }
    }

    /// Removes and returns the live allocation at `ptr`.
    #[inline(always)]
    pub fn remove(&mut self, ptr: u64) -> Option<Allocation> {
        // Where most allocations are is looked at first (an allocation is in one place only):
        // in a table of large allocations, most are loose, and their pages have no leaf.
        if self.loose.len() > self.in_leaves {
            if let Some(a) = self.loose.remove(ptr) {
                return Some(a);
            }
            return self.remove_from_leaf(ptr);
        }
        match self.remove_from_leaf(ptr) {
            Some(a) => Some(a),
            None if self.loose.len() == 0 => None,
            None => self.loose.remove(ptr),
        }
    }

    /// Removes and returns the live allocation at `ptr` if a leaf holds it.
    #[inline(always)]
    fn remove_from_leaf(&mut self, ptr: u64) -> Option<Allocation> {
        if ptr & GRAIN_MASK == 0 && self.in_leaves > 0 {
            if let Some(i) = self.leaf_of(ptr >> PAGE_SHIFT) {
                let leaf = &mut self.leaves[i as usize];
                let record = &mut leaf.records[Self::slot(ptr)];
                if record.live {
                    record.live = false;
                    let allocation = record.unpack(ptr);
                    leaf.live -= 1;
                    self.in_leaves -= 1;
                    if leaf.live == 0 {
                        leaf.groups = 0;
                        if !leaf.listed {
                            leaf.listed = true;
                            self.emptied.push(i);
                        }
                    }
                    return Some(allocation);
                }
            }
        }
        None
    }

    #[inline]
    pub fn get(&self, ptr: u64) -> Option<Allocation> {
        if ptr & GRAIN_MASK == 0 && self.in_leaves > 0 {
            let page = ptr >> PAGE_SHIFT;
            let leaf = if self.last.0 == page {
                Some(&self.last.1)
            } else if self.may_have_leaf(page) {
                self.pages.get(&page)
            } else {
                None
            };
            if let Some(&i) = leaf {
                let record = &self.leaves[i as usize].records[Self::slot(ptr)];
                if record.live {
                    return Some(record.unpack(ptr));
                }
            }
        }
        if self.loose.len() == 0 { None } else { self.loose.get(ptr) }
    }

    #[inline]
    pub fn contains(&self, ptr: u64) -> bool {
        self.get(ptr).is_some()
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.in_leaves + self.loose.len()
    }

    /// The live allocations in address order.
    pub fn sorted(&self) -> Vec<Allocation> {
        let mut all = self.loose.sorted();
        for &page in &self.ordered {
            let leaf = &self.leaves[self.pages[&page] as usize];
            let base = page << PAGE_SHIFT;
            all.extend(
                leaf.records
                    .iter()
                    .enumerate()
                    .filter(|(_, r)| r.live)
                    .map(|(s, r)| r.unpack(base + ((s as u64) << GRAIN_SHIFT))),
            );
        }
        all.sort_unstable_by_key(|a| a.ptr);
        all
    }

    /// The live allocation in a leaf with the greatest start address at or below `addr`.
    fn leaf_at_or_before(&mut self, addr: u64) -> Option<Allocation> {
        let page = addr >> PAGE_SHIFT;
        let mut top = Self::slot(addr);
        let mut pages = self.ordered.range(..=page).rev();
        let mut next = pages.next().copied();
        while let Some(p) = next {
            if p != page {
                top = SLOTS - 1;
            }
            let leaf = &mut self.leaves[self.pages[&p] as usize];
            if leaf.live > 0 {
                if let Some(s) = leaf.at_or_before(top) {
                    return Some(leaf.records[s].unpack((p << PAGE_SHIFT) + ((s as u64) << GRAIN_SHIFT)));
                }
            }
            next = pages.next().copied();
        }
        None
    }

    /// The live allocation `a` with `a.ptr <= addr < a.ptr + extent(a)`.
    pub fn containing(&mut self, addr: u64, extent: impl Fn(&Allocation) -> u64) -> Option<Allocation> {
        if let Some(a) = self.get(addr) {
            return (extent(&a) > 0).then_some(a);
        }
        let paged = self.leaf_at_or_before(addr);
        let loose = if self.loose.len() == 0 { None } else { self.loose.at_or_before(addr) };
        let a = match (paged, loose) {
            (Some(p), Some(l)) => std::cmp::max_by_key(p, l, |a| a.ptr),
            (p, l) => p.or(l)?,
        };
        (addr - a.ptr < extent(&a)).then_some(a)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    #[test]
    fn records_keep_every_policy_and_page_size() {
        for (i, &policy) in Policy::ALL.iter().enumerate() {
            assert_eq!(policy as usize, i);
        }
        for (i, &page) in PAGE_SIZES.iter().enumerate() {
            assert_eq!(page as usize, i);
        }
    }

    /// Pointers over a few 2 MiB pages far apart in the 48-bit space (the host backend's are
    /// real process addresses): on the grain, off it, at a page's first and last grain.
    fn pointer() -> impl Strategy<Value = u64> {
        let page = prop_oneof![Just(1u64 << 20), Just(5 << 20), Just(6 << 20), Just(0x7fff_ffe0_0000 >> 21 << 21)];
        let offset = prop_oneof![
            4 => (0u64..24).prop_map(|g| g << GRAIN_SHIFT),
            1 => Just((SLOTS as u64 - 1) << GRAIN_SHIFT),
            1 => (0u64..24).prop_map(|g| (g << GRAIN_SHIFT) + 64),
        ];
        (page, offset).prop_map(|(p, o)| (p >> PAGE_SHIFT << PAGE_SHIFT) + o)
    }

    proptest! {
        /// Against a BTreeMap: the same answer for every lookup, containment query and listing
        /// after any mix of inserts and removes — with leaves, with the budget spent (pages
        /// going to the hash map, emptied leaves taken over by new pages), and with fields too
        /// wide for a record.
        #[test]
        fn answers_like_an_ordered_map(
            ops in proptest::collection::vec((0u8..3, pointer(), 1u64..5000), 1..300),
            slots_per_live in prop_oneof![Just(0usize), Just(SLOTS_PER_LIVE), Just(SLOTS)],
            free_leaves in 0usize..3,
        ) {
            // A budget that lets no or a few leaves exist beyond the live allocations' share.
            let mut table = LiveTable::with_budget(slots_per_live, free_leaves, Hashed::with_slack(3));
            let mut model: BTreeMap<u64, Allocation> = BTreeMap::new();
            let mut peak = 0;
            for (op, ptr, x) in ops {
                match op {
                    0 if !model.contains_key(&ptr) => {
                        // Sizes that keep allocations apart (a pointer's neighbours are 512 B
                        // or more away): what the allocators grant never overlaps.
                        let size = 1 + x % 64;
                        let mut a = Allocation {
                            ptr,
                            size,
                            booked: size + x % 40,
                            granted: size + 64,
                            policy: Policy::ALL[(x % 8) as usize],
                            page: PAGE_SIZES[(x % 4) as usize],
                            stream: x % 3,
                        };
                        match x % 11 {
                            0 => a.stream = 1 << 40,
                            1 => a.booked = a.size + 300,
                            2 => a.size = 5 << 30,
                            _ => {}
                        }
                        a.granted = a.granted.max(a.size);
                        table.insert(a);
                        model.insert(ptr, a);
                    }
                    1 => prop_assert_eq!(table.remove(ptr), model.remove(&ptr)),
                    _ => {
                        let addr = ptr + x % 700;
                        for extent in [|a: &Allocation| a.size, |a: &Allocation| a.granted] {
                            let want = model.range(..=addr).next_back().map(|(_, a)| a).filter(|a| addr - a.ptr < extent(a));
                            prop_assert_eq!(table.containing(addr, extent), want.copied());
                        }
                        prop_assert_eq!(table.get(ptr), model.get(&ptr).copied());
                        prop_assert_eq!(table.contains(addr), model.contains_key(&addr));
                    }
                }
                prop_assert_eq!(table.len(), model.len());
                // The budget holds (leaves are kept after frees: it bounds them by the peak)
                // and the page indexes agree.
                peak = peak.max(model.len());
                prop_assert!(table.leaves.len() * SLOTS <= peak * slots_per_live + free_leaves * SLOTS);
                // The cached budget check agrees with the budget's formula.
                let room = (table.in_leaves + 1) * slots_per_live + free_leaves * SLOTS;
                prop_assert_eq!(table.within_budget(), (table.leaves.len() + 1) * SLOTS <= room);
                prop_assert_eq!(table.pages.len(), table.leaves.len());
                prop_assert_eq!(table.ordered.len(), table.leaves.len());
                prop_assert_eq!(table.in_leaves, table.leaves.iter().map(|l| l.live as usize).sum::<usize>());
            }
            prop_assert_eq!(table.sorted(), model.values().copied().collect::<Vec<_>>());
        }
    }
}
