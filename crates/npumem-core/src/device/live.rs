//! `LiveTable`: the device's live allocations. Malloc, free and exact lookups go through one
//! hash map by start address (O(1)); "which allocation holds this address" needs an
//! address-ordered index, which is brought up to date lazily: a malloc only notes a new pointer
//! as dirty, a free leaves a tombstone noted as dirty, and the first containment query after
//! them applies the notes. A query for an allocation's own start address (most copies)
//! needs no index at all; a block freed and allocated again at the same address (the pools'
//! fast path) revives its tombstone and needs no index work either.
//!
//! Invariants: the `LIVE` entries of `by_ptr` are exactly the live allocations (`live` counts
//! them); the keys of `ordered` are exactly the `INDEXED` entries; every entry that is not both
//! (a new allocation, a tombstone) has its pointer in `dirty`, which is applied once it could hold 4,096 stale pointers beyond those
//! entries, keeping memory bounded when no query comes; `MARKED` is set only inside
//! `free_many`'s check and cleared before it returns.

use std::collections::BTreeSet;
use std::collections::hash_map::Entry as Slot;

use rustc_hash::FxHashMap;

use super::Allocation;

const LIVE: u8 = 1;
const INDEXED: u8 = 2;
const MARKED: u8 = 4;

#[derive(Clone, Copy, Debug)]
struct Entry {
    allocation: Allocation,
    flags: u8,
}

/// Why a pointer cannot be marked for a batch free.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Unmarkable {
    NotLive,
    Twice,
}

#[derive(Debug, Default)]
pub(super) struct LiveTable {
    by_ptr: FxHashMap<u64, Entry>,
    ordered: BTreeSet<u64>,
    dirty: Vec<u64>,
    live: usize,
}

impl LiveTable {
    #[inline]
    pub fn insert(&mut self, allocation: Allocation) {
        match self.by_ptr.entry(allocation.ptr) {
            Slot::Occupied(mut o) => {
                // A tombstone: its pointer is still in `dirty` (only a sync drops tombstones).
                let entry = o.get_mut();
                debug_assert!(entry.flags & LIVE == 0, "{:#x} is live already", allocation.ptr);
                *entry = Entry { allocation, flags: LIVE | (entry.flags & INDEXED) };
            }
            Slot::Vacant(v) => {
                v.insert(Entry { allocation, flags: LIVE });
                self.note(allocation.ptr);
            }
        }
        self.live += 1;
    }

    #[inline]
    pub fn remove(&mut self, ptr: u64) -> Option<Allocation> {
        let Slot::Occupied(mut o) = self.by_ptr.entry(ptr) else { return None };
        let entry = o.get_mut();
        if entry.flags & LIVE == 0 {
            return None;
        }
        let allocation = entry.allocation;
        // A tombstone, so that a malloc at the same address (the pools reuse the most recently
        // freed block first) revives it in place; the next sync drops it otherwise.
        entry.flags &= INDEXED;
        self.live -= 1;
        self.note(ptr);
        Some(allocation)
    }

    #[inline]
    fn note(&mut self, ptr: u64) {
        self.dirty.push(ptr);
        if self.dirty.len() > self.live + self.ordered.len() + 4096 {
            self.sync();
        }
    }

    fn sync(&mut self) {
        for ptr in self.dirty.drain(..) {
            let Slot::Occupied(mut o) = self.by_ptr.entry(ptr) else { continue };
            let entry = o.get_mut();
            if entry.flags & (LIVE | INDEXED) == LIVE {
                entry.flags |= INDEXED;
                self.ordered.insert(ptr);
            } else if entry.flags & LIVE == 0 {
                if entry.flags & INDEXED != 0 {
                    self.ordered.remove(&ptr);
                }
                o.remove();
            }
        }
    }

    #[inline]
    pub fn get(&self, ptr: u64) -> Option<Allocation> {
        self.by_ptr.get(&ptr).filter(|e| e.flags & LIVE != 0).map(|e| e.allocation)
    }

    #[inline]
    pub fn contains(&self, ptr: u64) -> bool {
        self.get(ptr).is_some()
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.live
    }

    /// Marks a live pointer for a batch free; fails for a pointer that is not live or already
    /// marked.
    #[inline]
    pub fn mark(&mut self, ptr: u64) -> Result<(), Unmarkable> {
        match self.by_ptr.get_mut(&ptr) {
            Some(e) if e.flags & MARKED != 0 => Err(Unmarkable::Twice),
            Some(e) if e.flags & LIVE != 0 => {
                e.flags |= MARKED;
                Ok(())
            }
            _ => Err(Unmarkable::NotLive),
        }
    }

    pub fn unmark(&mut self, ptr: u64) {
        if let Some(e) = self.by_ptr.get_mut(&ptr) {
            e.flags &= !MARKED;
        }
    }

    /// The live allocations in address order.
    pub fn sorted(&self) -> Vec<Allocation> {
        let mut all: Vec<Allocation> =
            self.by_ptr.values().filter(|e| e.flags & LIVE != 0).map(|e| e.allocation).collect();
        all.sort_unstable_by_key(|a| a.ptr);
        all
    }

    /// The live allocation `a` with `a.ptr <= addr < a.ptr + extent(a)`.
    pub fn containing(&mut self, addr: u64, extent: impl Fn(&Allocation) -> u64) -> Option<Allocation> {
        if let Some(a) = self.get(addr) {
            return (extent(&a) > 0).then_some(a);
        }
        self.sync();
        let &ptr = self.ordered.range(..=addr).next_back()?;
        let a = self.by_ptr[&ptr].allocation;
        (addr - a.ptr < extent(&a)).then_some(a)
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
        /// Against a BTreeMap (the table it replaced): the same answer for every lookup after
        /// any mix of inserts, removes and queries.
        #[test]
        fn answers_like_an_ordered_map(
            ops in proptest::collection::vec((0u8..4, 0u64..64, 1u64..200), 1..400),
        ) {
            let mut table = LiveTable::default();
            let mut model: BTreeMap<u64, Allocation> = BTreeMap::new();
            for (op, slot, x) in ops {
                let ptr = (1 << 20) + slot * 256;
                match op {
                    0 if !model.contains_key(&ptr) => {
                        let a = allocation(ptr, x);
                        table.insert(a);
                        model.insert(ptr, a);
                    }
                    1 => prop_assert_eq!(table.remove(ptr), model.remove(&ptr)),
                    3 => {
                        // A batch check marks and unmarks; nothing else changes.
                        let want = if model.contains_key(&ptr) { Ok(()) } else { Err(Unmarkable::NotLive) };
                        prop_assert_eq!(table.mark(ptr), want);
                        if want.is_ok() {
                            prop_assert_eq!(table.mark(ptr), Err(Unmarkable::Twice));
                            table.unmark(ptr);
                        }
                    }
                    _ => {
                        let addr = ptr + x;
                        for extent in [|a: &Allocation| a.size, |a: &Allocation| a.granted] {
                            let want = model.range(..=addr).next_back().map(|(_, a)| a).filter(|a| addr < a.ptr + extent(a));
                            prop_assert_eq!(table.containing(addr, extent), want.copied());
                        }
                        prop_assert_eq!(table.get(ptr), model.get(&ptr).copied());
                    }
                }
            }
            prop_assert_eq!(table.sorted(), model.values().copied().collect::<Vec<_>>());
            prop_assert_eq!(table.len(), model.len());
        }
    }
}
