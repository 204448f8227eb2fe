//! `LiveTable`: the device's live allocations by address, in three levels: 512-byte grains on
//! 2 MiB pages, then 64 KiB grains on 256 MiB pages (`Paged`, generic over the grain), then
//! `Hashed` for the rest. It is the one record of each live block: the allocator is handed the
//! block's `Granted` on every free and snapshot. See Note [Live table layout].
//!
//! Invariants of each level (asserted by `check_invariants` in test builds):
//! - Each live allocation it is given is held exactly once: in the leaf of its page (its
//!   record's `at` set to 1 + its offset in the grain, in 512-byte units) or in `loose`.
//! - `pages`, `ordered` and the leaves' `page` fields name the same set of pages, each with its
//!   bit set in `marked` (a set bit may be stale).
//! - Each leaf's `live` counts its live records and `in_leaves` sums them; a leaf's `groups` has
//!   bit `g` set for every 64-record group holding a live record (a set bit may be stale).
//! - A leaf with no live record is in `emptied`, once (`listed`).
//! - The leaves take at most `slots_per_live` records per live allocation at the peak plus
//!   `free_leaves` leaves; `grow_at` is the least `in_leaves` at which that budget allows one more.
//! - `last`, and each entry of `memo` (the pages last looked up, by their marker modulo `MEMO`),
//!   names a page in `pages` and its leaf, or no page.
//!
//! Note [Live table layout]: the allocation at `ptr` is found by index arithmetic: a lookup of
//! its page (the last page used is remembered, so a run of neighbouring blocks does not even
//! hash; `memo` lets the allocations of two pools, on two pages, alternate without hashing),
//! then one 16-byte record. A batch of blocks from one pool page walks one leaf in order, where
//! a hash map by address touches a random bucket, and misses the cache, for each block. A leaf
//! keeps the record of grain `s` at `cell(s)`, which puts the records of grains 4 KiB apart side
//! by side (four to a 64-byte line): blocks of 4 KiB or more share lines as they share pages (a
//! batch of 10^6 4 KiB blocks: 43% fewer last-level read misses than grain order,
//! docs/benchmarks.md); batches also name the blocks ahead of time (`LiveTable::prefetch`), so a
//! record's cache miss overlaps the work on those before. Allocations of 64 KiB or more go to
//! the coarse level first (two never start in one 64 KiB grain, so a pool's large blocks all
//! fit); a small one whose coarse grain is taken goes on; without the coarse level a training
//! run's large blocks all go to `Hashed`, 2.1% more instructions per replayed event. `Hashed`
//! takes a pointer off the 512-byte grain, an allocation whose fields do not fit a record (size
//! or grant slack of 4 GiB or more, a stream id past 32 bits, booking slack past 255 bytes), and
//! allocations on new pages once a level's budget is spent. The budget bounds memory however
//! sparse the addresses are (the host backend's are real process addresses; several devices
//! share the 48-bit VA): each level's leaves take at most 512 bytes per live allocation at the
//! peak plus 1 MiB; pages that hold an allocation every 16 KiB (fine) or 2 MiB (coarse) on
//! average all fit. A leaf that empties is kept (a batch freed and made again refills the same
//! pages) and is taken over by the next new page before a new leaf is made. Limitation: a packed
//! variant (a 2-byte grain index naming packed records) would take 8x less memory but puts two
//! dependent cache misses on each random free: 20-30% slower on a random churn at 10^6 live
//! blocks.

mod hashed;
#[cfg(test)]
mod invariants;

/// Entries of a paged table's memo of pages looked up.
const MEMO: usize = 4;

use std::collections::BTreeSet;

use rustc_hash::FxHashMap;

use super::Allocation;
use crate::acl::Policy;
use crate::prefetch::prefetch;
use crate::vm::PageSize;
use hashed::Hashed;

/// The grain every allocator family places blocks on: a pointer a leaf holds is on it.
const BLOCK_SHIFT: u32 = 9;
const BLOCK_MASK: u64 = (1 << BLOCK_SHIFT) - 1;
/// The records of a leaf (64 KiB of them): a fine leaf covers a 2 MiB page in 512-byte grains,
/// a coarse leaf a 256 MiB page in 64 KiB grains.
const SLOTS: usize = 1 << 12;
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
    /// 0: no live allocation; else 1 + the allocation's offset in its grain, in 512-byte
    /// units (always 1 in a fine leaf).
    at: u8,
}

impl Record {
    #[inline(always)]
    fn live(&self) -> bool {
        self.at != 0
    }
}

const PAGE_SIZES: [PageSize; 4] = [PageSize::Size4K, PageSize::Size64K, PageSize::Size2M, PageSize::Size1G];

/// The policy `pack` stored as `p as u8` (a match the compiler makes an identity: the
/// discriminants are the indexes, which `records_keep_every_policy_and_page_size` checks).
#[inline(always)]
fn policy_of(p: u8) -> Policy {
    match p & 7 {
        0 => Policy::ALL[0],
        1 => Policy::ALL[1],
        2 => Policy::ALL[2],
        3 => Policy::ALL[3],
        4 => Policy::ALL[4],
        5 => Policy::ALL[5],
        6 => Policy::ALL[6],
        _ => Policy::ALL[7],
    }
}

/// The page size `pack` stored as `p as u8`.
#[inline(always)]
fn page_of(p: u8) -> PageSize {
    match p & 3 {
        0 => PAGE_SIZES[0],
        1 => PAGE_SIZES[1],
        2 => PAGE_SIZES[2],
        _ => PAGE_SIZES[3],
    }
}

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
            at: 1,
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
            policy: policy_of(self.policy),
            page: page_of(self.page),
            stream: self.stream as u64,
        }
    }
}

/// Slots whose records share a run: the record of slot `s` is kept at `cell(s)`, so that the
/// records of allocations 4 KiB apart (slots 8 apart) are neighbours, four to a cache line.
const SPREAD_SHIFT: u32 = 3;

/// Where a leaf keeps the record of `slot` (a permutation of `0..SLOTS`): the slot's low
/// `SPREAD_SHIFT` bits pick one of 8 runs of `SLOTS / 8` records, the rest the place in it.
/// Allocations are mostly 4 KiB or more (a batch of them, or a pool page of them, is a run of
/// slots 8 or more apart), and with the slot itself as the index each of their records would
/// sit alone on its 64-byte line: at 10^6 live blocks, a cold line per malloc and per free.
/// Allocations of 512 bytes to 2 KiB are the ones spread out instead.
#[inline(always)]
fn cell(slot: usize) -> usize {
    ((slot & ((1 << SPREAD_SHIFT) - 1)) << (SLOTS.trailing_zeros() - SPREAD_SHIFT)) | (slot >> SPREAD_SHIFT)
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
    /// A fixed-size array: a slot (masked to `SLOTS`) indexes it without a bounds check.
    records: Box<[Record; SLOTS]>,
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
                if let Some(s) = (first..=last).rev().find(|&s| self.records[cell(s)].live()) {
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

/// Where a paged table keeps what its leaves do not hold: the next, coarser table, and at the
/// end `Hashed`.
pub(super) trait Loose: Default {
    /// Allocations of this size or more are given to it first: two never start in one of its
    /// grains, so its leaves hold them all.
    const FIRST_FROM: u64;
    fn insert(&mut self, allocation: Allocation);
    fn remove(&mut self, ptr: u64) -> Option<Allocation>;
    fn get(&self, ptr: u64) -> Option<Allocation>;
    /// How many allocations it holds.
    fn len(&self) -> usize;
    /// The live allocations in address order.
    fn sorted(&self) -> Vec<Allocation>;
    /// The live allocation with the greatest start address at or below `addr`.
    fn at_or_before(&mut self, addr: u64) -> Option<Allocation>;
    /// Panics, naming the rule, if an invariant does not hold.
    #[cfg(test)]
    fn check_invariants(&self);
}

impl Loose for Hashed {
    const FIRST_FROM: u64 = u64::MAX;
    #[inline(always)]
    fn insert(&mut self, allocation: Allocation) {
        Hashed::insert(self, allocation)
    }
    #[inline(always)]
    fn remove(&mut self, ptr: u64) -> Option<Allocation> {
        Hashed::remove(self, ptr)
    }
    #[inline(always)]
    fn get(&self, ptr: u64) -> Option<Allocation> {
        Hashed::get(self, ptr)
    }
    #[inline(always)]
    fn len(&self) -> usize {
        Hashed::len(self)
    }
    fn sorted(&self) -> Vec<Allocation> {
        Hashed::sorted(self)
    }
    fn at_or_before(&mut self, addr: u64) -> Option<Allocation> {
        Hashed::at_or_before(self, addr)
    }
    #[cfg(test)]
    fn check_invariants(&self) {
        Hashed::check_invariants(self)
    }
}

/// The device's live table: 512-byte grains on 2 MiB pages, then 64 KiB grains on 256 MiB
/// pages, then the hash map.
pub(super) type LiveTable = Paged<9, Paged<16, Hashed>>;

/// Leaves of `SLOTS` records of `1 << GRAIN_SHIFT` bytes each, and `L` for the rest.
#[derive(Debug)]
pub(super) struct Paged<const GRAIN_SHIFT: u32, L> {
    /// The leaf of each page that has one, by page number (`ptr >> Self::PAGE_SHIFT`).
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
    /// Pages looked up before, and their leaves, by `marker(page) % MEMO`.
    memo: [(u64, u32); MEMO],
    in_leaves: usize,
    /// The least `in_leaves` at which the budget allows one more leaf (`usize::MAX`: none).
    grow_at: usize,
    /// The budget: leaves may take `slots_per_live` records per live allocation, plus
    /// `free_leaves` leaves.
    slots_per_live: usize,
    free_leaves: usize,
    loose: L,
}

impl<const GRAIN_SHIFT: u32, L: Loose> Default for Paged<GRAIN_SHIFT, L> {
    fn default() -> Self {
        Self::with_budget(SLOTS_PER_LIVE, FREE_LEAVES, L::default())
    }
}

impl<const GRAIN_SHIFT: u32, L: Loose> Paged<GRAIN_SHIFT, L> {
    const PAGE_SHIFT: u32 = GRAIN_SHIFT + SLOTS.trailing_zeros();

    fn with_budget(slots_per_live: usize, free_leaves: usize, loose: L) -> Self {
        assert!((BLOCK_SHIFT..=BLOCK_SHIFT + 8).contains(&GRAIN_SHIFT), "an offset in a grain fits `Record::at`");
        let mut table = Paged {
            pages: FxHashMap::default(),
            marked: [0; 4],
            leaves: Vec::new(),
            ordered: BTreeSet::new(),
            emptied: Vec::new(),
            last: (NO_PAGE, 0),
            memo: [(NO_PAGE, 0); MEMO],
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

    /// The `Record::at` of an allocation at `ptr` (on the 512-byte grain).
    #[inline(always)]
    fn at(ptr: u64) -> u8 {
        1 + ((ptr & ((1 << GRAIN_SHIFT) - 1)) >> BLOCK_SHIFT) as u8
    }

    /// The start address of the allocation in `slot` of `page`'s leaf, with `at` set.
    #[inline(always)]
    fn ptr_of(page: u64, slot: usize, at: u8) -> u64 {
        (page << Self::PAGE_SHIFT) + ((slot as u64) << GRAIN_SHIFT) + (((at - 1) as u64) << BLOCK_SHIFT)
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
        let memo = Self::marker(page) % MEMO;
        if self.memo[memo].0 == page {
            self.last = self.memo[memo];
            return Some(self.last.1);
        }
        if !self.may_have_leaf(page) {
            return None;
        }
        let &leaf = self.pages.get(&page)?;
        self.last = (page, leaf);
        self.memo[memo] = self.last;
        Some(leaf)
    }

    /// Inserts a live allocation (none is live at its pointer).
    #[inline(always)]
    pub fn insert(&mut self, allocation: Allocation) {
        let ptr = allocation.ptr;
        if ptr & BLOCK_MASK == 0 && allocation.size < L::FIRST_FROM {
            if let Some(mut record) = Record::pack(&allocation) {
                let page = ptr >> Self::PAGE_SHIFT;
                let leaf = match self.leaf_of(page) {
                    Some(leaf) => Some(leaf),
                    None if self.may_grow() => self.new_leaf(page),
                    None => None,
                };
                if let Some(leaf) = leaf {
                    let leaf = &mut self.leaves[leaf as usize];
                    let slot = Self::slot(ptr);
                    // A coarse grain holds one allocation: another that starts in it is loose.
                    if !leaf.records[cell(slot)].live() {
                        record.at = Self::at(ptr);
                        leaf.records[cell(slot)] = record;
                        leaf.live += 1;
                        leaf.groups |= 1 << (slot / GROUP);
                        self.in_leaves += 1;
                        return;
                    }
                    debug_assert!(leaf.records[cell(slot)].at != Self::at(ptr), "{ptr:#x} is live already");
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
                let memo = &mut self.memo[Self::marker(old) % MEMO];
                if memo.0 == old {
                    *memo = (NO_PAGE, 0);
                }
                self.pages.remove(&old);
                self.ordered.remove(&old);
                i
            }
            None => {
                if !self.within_budget() {
                    return None;
                }
                let records = vec![Record::default(); SLOTS].into_boxed_slice().try_into().expect("SLOTS records");
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
        self.memo[Self::marker(page) % MEMO] = self.last;
        Some(i)
    }

    /// Starts loading the record of `ptr` into the cache, when `ptr` is on the page of the
    /// last insert or remove (a hint, with no effect on the contents: a batch gives the pointer
    /// a few places ahead, so that its record's cache miss overlaps the work on those before).
    #[inline(always)]
    pub fn prefetch(&self, ptr: u64) {
        if self.last.0 == ptr >> Self::PAGE_SHIFT {
            prefetch(&self.leaves[self.last.1 as usize].records[cell(Self::slot(ptr))]);
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
        if ptr & BLOCK_MASK == 0 && self.in_leaves > 0 {
            if let Some(i) = self.leaf_of(ptr >> Self::PAGE_SHIFT) {
                let leaf = &mut self.leaves[i as usize];
                let record = &mut leaf.records[cell(Self::slot(ptr))];
                if record.at == Self::at(ptr) {
                    record.at = 0;
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
        if ptr & BLOCK_MASK == 0 && self.in_leaves > 0 {
            let page = ptr >> Self::PAGE_SHIFT;
            let leaf = if self.last.0 == page {
                Some(&self.last.1)
            } else if self.may_have_leaf(page) {
                self.pages.get(&page)
            } else {
                None
            };
            if let Some(&i) = leaf {
                let record = &self.leaves[i as usize].records[cell(Self::slot(ptr))];
                if record.at == Self::at(ptr) {
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
            all.extend(
                (0..SLOTS)
                    .map(|s| (s, &leaf.records[cell(s)]))
                    .filter(|(_, r)| r.live())
                    .map(|(s, r)| r.unpack(Self::ptr_of(page, s, r.at))),
            );
        }
        all.sort_unstable_by_key(|a| a.ptr);
        all
    }

    /// The live allocation in a leaf with the greatest start address at or below `addr`.
    fn leaf_at_or_before(&mut self, addr: u64) -> Option<Allocation> {
        let page = addr >> Self::PAGE_SHIFT;
        let mut top = Self::slot(addr);
        let mut pages = self.ordered.range(..=page).rev();
        let mut next = pages.next().copied();
        while let Some(p) = next {
            if p != page {
                top = SLOTS - 1;
            }
            let leaf = &mut self.leaves[self.pages[&p] as usize];
            if leaf.live > 0 {
                let mut found = leaf.at_or_before(top);
                // The allocation in `addr`'s own grain may start after `addr`.
                if let Some(s) = found.filter(|&s| Self::ptr_of(p, s, leaf.records[cell(s)].at) > addr) {
                    found = if s == 0 { None } else { leaf.at_or_before(s - 1) };
                }
                if let Some(s) = found {
                    return Some(leaf.records[cell(s)].unpack(Self::ptr_of(p, s, leaf.records[cell(s)].at)));
                }
            }
            next = pages.next().copied();
        }
        None
    }

    /// The live allocation with the greatest start address at or below `addr`.
    fn at_or_before(&mut self, addr: u64) -> Option<Allocation> {
        if let Some(a) = self.get(addr) {
            return Some(a);
        }
        let paged = self.leaf_at_or_before(addr);
        let loose = if self.loose.len() == 0 { None } else { self.loose.at_or_before(addr) };
        match (paged, loose) {
            (Some(p), Some(l)) => Some(std::cmp::max_by_key(p, l, |a| a.ptr)),
            (p, l) => p.or(l),
        }
    }

    /// The live allocation `a` with `a.ptr <= addr < a.ptr + extent(a)`.
    pub fn containing(&mut self, addr: u64, extent: impl Fn(&Allocation) -> u64) -> Option<Allocation> {
        let a = self.at_or_before(addr)?;
        (addr - a.ptr < extent(&a)).then_some(a)
    }
}

impl<const GRAIN_SHIFT: u32, L: Loose> Loose for Paged<GRAIN_SHIFT, L> {
    const FIRST_FROM: u64 = 1 << GRAIN_SHIFT;
    #[inline(always)]
    fn insert(&mut self, allocation: Allocation) {
        Paged::insert(self, allocation)
    }
    #[inline(always)]
    fn remove(&mut self, ptr: u64) -> Option<Allocation> {
        Paged::remove(self, ptr)
    }
    #[inline(always)]
    fn get(&self, ptr: u64) -> Option<Allocation> {
        Paged::get(self, ptr)
    }
    #[inline(always)]
    fn len(&self) -> usize {
        self.in_leaves + self.loose.len()
    }
    fn sorted(&self) -> Vec<Allocation> {
        Paged::sorted(self)
    }
    fn at_or_before(&mut self, addr: u64) -> Option<Allocation> {
        Paged::at_or_before(self, addr)
    }
    #[cfg(test)]
    fn check_invariants(&self) {
        Paged::check_invariants(self)
    }
}

#[cfg(test)]
mod tests;
