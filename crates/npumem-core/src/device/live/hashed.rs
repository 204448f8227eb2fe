//! `Hashed`: the live table's fallback for the allocations its address-ordered pages do not
//! hold (a pointer off the 512-byte grain, a field too wide for a page record, a page over the
//! memory budget). See Note [Lazy ordered index].
//!
//! Invariants (asserted by `check_invariants` in test builds):
//! - The `LIVE` entries of `by_ptr` are exactly the live allocations; `live` counts them.
//! - While `indexed`: the keys of `ordered` are exactly the `INDEXED` entries, and every `LIVE`
//!   entry that is not `INDEXED`, and every `INDEXED` tombstone, has its pointer in `dirty` (so
//!   a sync leaves only entries that are both, or neither); `dirty` holds at most the live and
//!   indexed entries plus `slack` pointers.
//! - While not `indexed`: `ordered` and `dirty` are empty and no entry is `INDEXED`.
//! - Tombstones that are neither are counted in `unindexed_tombstones`, and swept once they
//!   outnumber the live entries by `slack`.
//! - An entry keeps an allocation in 24 bytes (sizes as differences, the stream in 32 bits); the
//!   rare allocation that does not fit is kept whole in `wide` (flag `WIDE`), exactly while its
//!   entry is `LIVE`.
//!
//! Note [Lazy ordered index]: malloc, free and exact lookups go through one hash map by start
//! address (O(1)); "which allocation is at or before this address" needs an address-ordered
//! index, which is built by the first ordered query and then brought up to date lazily: a malloc
//! of a new address notes it in a dirty list, a free leaves a tombstone, and the next ordered
//! query applies the notes. A malloc at an address freed before revives its tombstone in place.
//! When the notes would outnumber the entries (more than twice as many mallocs and frees since
//! the last query as there are entries, plus `slack`), the index is dropped rather than brought
//! up to date, and the next query builds it again from the map (a sort, sequential work): a
//! table that is never queried (a service's churn) keeps no index at all and pays no tree
//! operation per malloc or free, and a query costs at most the work of the notes it replaces.
//! Memory stays bounded when no query comes.

use std::collections::BTreeSet;
use std::collections::hash_map::Entry as Slot;

use rustc_hash::FxHashMap;

use super::super::Allocation;
use crate::acl::Policy;
use crate::vm::PageSize;

const LIVE: u8 = 1;
const INDEXED: u8 = 2;
const WIDE: u8 = 4;

/// An allocation less its pointer (the key), packed.
#[derive(Clone, Copy, Debug)]
struct Entry {
    size: u64,
    /// `granted - size`.
    granted_extra: u32,
    stream: u32,
    policy: Policy,
    /// `booked - size`.
    booked_extra: u8,
    page: PageSize,
    flags: u8,
}

impl Entry {
    /// The packed form of `a` with `flags`, or None when a field does not fit.
    #[inline]
    fn pack(a: &Allocation, flags: u8) -> Option<Entry> {
        Some(Entry {
            size: a.size,
            granted_extra: u32::try_from(a.granted.checked_sub(a.size)?).ok()?,
            stream: u32::try_from(a.stream).ok()?,
            policy: a.policy,
            booked_extra: u8::try_from(a.booked.checked_sub(a.size)?).ok()?,
            page: a.page,
            flags,
        })
    }

    #[inline]
    fn unpack(&self, ptr: u64) -> Allocation {
        Allocation {
            ptr,
            size: self.size,
            booked: self.size + self.booked_extra as u64,
            granted: self.size + self.granted_extra as u64,
            policy: self.policy,
            page: self.page,
            stream: self.stream as u64,
        }
    }

    /// A placeholder for an allocation kept in `wide`.
    fn wide(a: &Allocation, flags: u8) -> Entry {
        Entry {
            size: a.size,
            granted_extra: 0,
            stream: 0,
            policy: a.policy,
            booked_extra: 0,
            page: a.page,
            flags: flags | WIDE,
        }
    }
}

/// How many stale notes (dirty pointers, tombstones) may pile up beyond the live entries.
const SLACK: usize = 4096;

#[derive(Debug)]
pub(in crate::device) struct Hashed {
    by_ptr: FxHashMap<u64, Entry>,
    wide: FxHashMap<u64, Allocation>,
    ordered: BTreeSet<u64>,
    dirty: Vec<u64>,
    /// Whether `ordered` is kept (built by the first ordered query, dropped when the notes
    /// would outnumber the entries).
    indexed: bool,
    live: usize,
    unindexed_tombstones: usize,
    slack: usize,
}

impl Default for Hashed {
    fn default() -> Self {
        Self::with_slack(SLACK)
    }
}

impl Hashed {
    pub(super) fn with_slack(slack: usize) -> Self {
        Hashed {
            by_ptr: FxHashMap::default(),
            wide: FxHashMap::default(),
            ordered: BTreeSet::new(),
            dirty: Vec::new(),
            indexed: false,
            live: 0,
            unindexed_tombstones: 0,
            slack,
        }
    }

    #[inline(always)]
    pub(super) fn insert(&mut self, allocation: Allocation) {
        let mut pack = |flags| {
            Entry::pack(&allocation, flags).unwrap_or_else(|| {
                self.wide.insert(allocation.ptr, allocation);
                Entry::wide(&allocation, flags)
            })
        };
        match self.by_ptr.entry(allocation.ptr) {
            Slot::Occupied(mut o) => {
                // A tombstone. An unindexed one came from an entry whose pointer is still in
                // `dirty` (a sync would have dropped it), so the revived entry is noted already.
                let entry = o.get_mut();
                debug_assert!(entry.flags & LIVE == 0, "{:#x} is live already", allocation.ptr);
                if entry.flags == 0 {
                    self.unindexed_tombstones -= 1;
                }
                *entry = pack(LIVE | (entry.flags & INDEXED));
            }
            Slot::Vacant(v) => {
                v.insert(pack(LIVE));
                self.note(allocation.ptr);
            }
        }
        self.live += 1;
    }

    #[inline(always)]
    pub(super) fn remove(&mut self, ptr: u64) -> Option<Allocation> {
        let Slot::Occupied(mut o) = self.by_ptr.entry(ptr) else { return None };
        let entry = o.get_mut();
        if entry.flags & LIVE == 0 {
            return None;
        }
        let allocation = if entry.flags & WIDE != 0 {
            entry.flags &= !WIDE;
            self.wide.remove(&ptr).expect("a wide entry's allocation")
        } else {
            entry.unpack(ptr)
        };
        // A tombstone, so that a malloc at the same address revives it in place.
        self.live -= 1;
        if entry.flags & INDEXED != 0 {
            entry.flags = INDEXED;
            self.note(ptr);
        } else {
            entry.flags = 0;
            self.unindexed_tombstones += 1;
            if self.unindexed_tombstones > self.live + self.slack {
                self.by_ptr.retain(|_, e| e.flags != 0);
                self.unindexed_tombstones = 0;
            }
        }
        Some(allocation)
    }

    #[inline]
    fn note(&mut self, ptr: u64) {
        if !self.indexed {
            return;
        }
        self.dirty.push(ptr);
        if self.dirty.len() > self.live + self.ordered.len() + self.slack {
            self.drop_index();
        }
    }

    /// Forgets the ordered index (its notes would cost more to apply than building it again):
    /// every entry becomes unindexed and the tombstones are swept.
    #[cold]
    fn drop_index(&mut self) {
        self.by_ptr.retain(|_, e| {
            e.flags &= !INDEXED;
            e.flags != 0
        });
        self.unindexed_tombstones = 0;
        self.ordered = BTreeSet::new();
        self.dirty = Vec::new();
        self.indexed = false;
    }

    /// Brings the ordered index up to date: applies the notes, or builds it from the map.
    fn sync(&mut self) {
        if !self.indexed {
            self.by_ptr.retain(|_, e| {
                e.flags |= INDEXED;
                e.flags & LIVE != 0
            });
            self.unindexed_tombstones = 0;
            let mut keys: Vec<u64> = self.by_ptr.keys().copied().collect();
            keys.sort_unstable();
            self.ordered = keys.into_iter().collect();
            self.indexed = true;
            return;
        }
        for ptr in self.dirty.drain(..) {
            let Slot::Occupied(mut o) = self.by_ptr.entry(ptr) else { continue };
            let entry = o.get_mut();
            if entry.flags & (LIVE | INDEXED) == LIVE {
                entry.flags |= INDEXED;
                self.ordered.insert(ptr);
            } else if entry.flags & LIVE == 0 {
                if entry.flags & INDEXED != 0 {
                    self.ordered.remove(&ptr);
                } else {
                    self.unindexed_tombstones -= 1;
                }
                o.remove();
            }
        }
    }

    #[inline]
    pub(super) fn get(&self, ptr: u64) -> Option<Allocation> {
        self.by_ptr.get(&ptr).filter(|e| e.flags & LIVE != 0).map(|e| self.unpack(ptr, e))
    }

    #[inline]
    fn unpack(&self, ptr: u64, e: &Entry) -> Allocation {
        if e.flags & WIDE != 0 { self.wide[&ptr] } else { e.unpack(ptr) }
    }

    /// How many allocations it holds.
    #[inline]
    pub(super) fn len(&self) -> usize {
        self.live
    }

    /// The live allocations in address order.
    pub(super) fn sorted(&self) -> Vec<Allocation> {
        let mut all: Vec<Allocation> =
            self.by_ptr.iter().filter(|(_, e)| e.flags & LIVE != 0).map(|(&p, e)| self.unpack(p, e)).collect();
        all.sort_unstable_by_key(|a| a.ptr);
        all
    }

    /// The live allocation with the greatest start address at or below `addr`.
    pub(super) fn at_or_before(&mut self, addr: u64) -> Option<Allocation> {
        if let Some(a) = self.get(addr) {
            return Some(a);
        }
        self.sync();
        let &ptr = self.ordered.range(..=addr).next_back()?;
        Some(self.unpack(ptr, &self.by_ptr[&ptr]))
    }

    /// Asserts every invariant of the module docs against an independent recount (test builds
    /// only; the property tests call it after every step).
    #[cfg(test)]
    pub(super) fn check_invariants(&self) {
        let live = self.by_ptr.values().filter(|e| e.flags & LIVE != 0).count();
        assert_eq!(self.live, live, "`live` counts the LIVE entries");
        let unindexed = self.by_ptr.values().filter(|e| e.flags == 0).count();
        assert_eq!(self.unindexed_tombstones, unindexed, "`unindexed_tombstones` counts the bare tombstones");
        // A WIDE entry is LIVE and has its allocation in `wide`; `wide` holds nothing else.
        for (ptr, e) in &self.by_ptr {
            assert!(e.flags & WIDE == 0 || e.flags & LIVE != 0, "WIDE entry {ptr:#x} is LIVE");
            assert_eq!(e.flags & WIDE != 0, self.wide.contains_key(ptr), "{ptr:#x} is in `wide` exactly while WIDE");
        }
        assert_eq!(
            self.wide.len(),
            self.by_ptr.values().filter(|e| e.flags & WIDE != 0).count(),
            "`wide` holds WIDE entries only"
        );
        if self.indexed {
            let indexed: BTreeSet<u64> =
                self.by_ptr.iter().filter(|(_, e)| e.flags & INDEXED != 0).map(|(&p, _)| p).collect();
            assert!(self.ordered == indexed, "`ordered` is the INDEXED entries");
            let dirty: BTreeSet<u64> = self.dirty.iter().copied().collect();
            for (ptr, e) in &self.by_ptr {
                let stale = e.flags & (LIVE | INDEXED) == LIVE || e.flags & (LIVE | INDEXED) == INDEXED;
                assert!(!stale || dirty.contains(ptr), "stale entry {ptr:#x} is noted in `dirty`");
            }
            assert!(self.dirty.len() <= self.live + self.ordered.len() + self.slack, "`dirty` stays bounded");
        } else {
            assert!(self.ordered.is_empty() && self.dirty.is_empty(), "no index kept while not `indexed`");
            assert!(self.by_ptr.values().all(|e| e.flags & INDEXED == 0), "no INDEXED entry while not `indexed`");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::acl::Policy;
    use crate::vm::PageSize;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    fn allocation(ptr: u64, size: u64) -> Allocation {
        Allocation {
            ptr,
            size,
            booked: size,
            granted: size + 32,
            policy: Policy::HugeFirst,
            page: PageSize::Size4K,
            stream: 0,
        }
    }

    proptest! {
        /// Against a BTreeMap: the same answer for every lookup after
        /// any mix of inserts, removes and queries.
        #[test]
        fn answers_like_an_ordered_map(
            ops in proptest::collection::vec((0u8..3, 0u64..64, 1u64..200), 1..400),
            slack in prop_oneof![Just(0usize), Just(3), Just(4096)],
        ) {
            // A small slack makes index drops and sweeps happen inside short runs.
            let mut table = Hashed::with_slack(slack);
            let mut model: BTreeMap<u64, Allocation> = BTreeMap::new();
            for (op, slot, x) in ops {
                let ptr = (1 << 20) + slot * 256;
                match op {
                    0 if !model.contains_key(&ptr) => {
                        let mut a = allocation(ptr, x);
                        // Some do not fit an entry: a stream id past 32 bits, a huge grant.
                        match x % 7 {
                            0 => a.stream = 1 << 40,
                            1 => a.granted = a.size + (5 << 30),
                            _ => {}
                        }
                        table.insert(a);
                        model.insert(ptr, a);
                    }
                    1 => prop_assert_eq!(table.remove(ptr), model.remove(&ptr)),
                    _ => {
                        let addr = ptr + x;
                        let want = model.range(..=addr).next_back().map(|(_, a)| *a);
                        prop_assert_eq!(table.at_or_before(addr), want);
                        prop_assert_eq!(table.get(ptr), model.get(&ptr).copied());
                        // A sync applies every note: no tombstone is left, the index is exact.
                        if table.get(addr).is_none() {
                            prop_assert_eq!(table.by_ptr.len(), model.len());
                            prop_assert_eq!(table.ordered.len(), model.len());
                            prop_assert_eq!(table.unindexed_tombstones, 0);
                        }
                    }
                }
                // Without an index, nothing of one is kept; with one, every note is bounded.
                table.check_invariants();
            }
            prop_assert_eq!(table.sorted(), model.values().copied().collect::<Vec<_>>());
            prop_assert_eq!(table.len(), model.len());
            let wide = model.values().filter(|a| Entry::pack(a, 0).is_none()).count();
            prop_assert_eq!(table.wide.len(), wide);
        }
    }
}
