//! `LiveTable`: the device's live allocations. Malloc, free and exact lookups go through a hash
//! map by start address (O(1)); "which allocation holds this address" needs an address-ordered
//! index, which is brought up to date lazily: malloc and free only note the pointer as dirty,
//! and the first containment query after them applies the notes. A query for an allocation's
//! own start address (most copies) needs no index at all.
//!
//! Invariants: `by_ptr` holds exactly the live allocations; every pointer whose presence in
//! `ordered` may differ from `by_ptr` is in `dirty`, so after `sync` the keys of `ordered` are
//! exactly those of `by_ptr`; `dirty` is synced once it could hold 4,096 pointers that are
//! neither live nor indexed, keeping memory bounded when no query comes.

use std::cell::RefCell;
use std::collections::BTreeSet;

use rustc_hash::{FxHashMap, FxHashSet};

use super::Allocation;

#[derive(Debug, Default)]
struct Index {
    ordered: BTreeSet<u64>,
    dirty: FxHashSet<u64>,
}

impl Index {
    fn sync(&mut self, by_ptr: &FxHashMap<u64, Allocation>) {
        for ptr in self.dirty.drain() {
            if by_ptr.contains_key(&ptr) {
                self.ordered.insert(ptr);
            } else {
                self.ordered.remove(&ptr);
            }
        }
    }
}

#[derive(Debug, Default)]
pub(super) struct LiveTable {
    by_ptr: FxHashMap<u64, Allocation>,
    index: RefCell<Index>,
}

impl LiveTable {
    #[inline]
    pub fn insert(&mut self, allocation: Allocation) {
        self.by_ptr.insert(allocation.ptr, allocation);
        self.note(allocation.ptr);
    }

    #[inline]
    pub fn remove(&mut self, ptr: u64) -> Option<Allocation> {
        let allocation = self.by_ptr.remove(&ptr)?;
        self.note(ptr);
        Some(allocation)
    }

    #[inline]
    fn note(&mut self, ptr: u64) {
        let index = self.index.get_mut();
        index.dirty.insert(ptr);
        // A dirty pointer is live, indexed, or neither (allocated and freed since the last
        // sync): only the last kind can pile up, so sync when it might.
        if index.dirty.len() > self.by_ptr.len() + index.ordered.len() + 4096 {
            index.sync(&self.by_ptr);
        }
    }

    #[inline]
    pub fn get(&self, ptr: u64) -> Option<&Allocation> {
        self.by_ptr.get(&ptr)
    }

    #[inline]
    pub fn contains(&self, ptr: u64) -> bool {
        self.by_ptr.contains_key(&ptr)
    }

    /// The live allocations in address order.
    pub fn sorted(&self) -> Vec<Allocation> {
        let mut all: Vec<Allocation> = self.by_ptr.values().copied().collect();
        all.sort_unstable_by_key(|a| a.ptr);
        all
    }

    /// The live allocation `a` with `a.ptr <= addr < a.ptr + extent(a)`.
    pub fn containing(&self, addr: u64, extent: impl Fn(&Allocation) -> u64) -> Option<&Allocation> {
        if let Some(a) = self.by_ptr.get(&addr) {
            return (extent(a) > 0).then_some(a);
        }
        let mut index = self.index.borrow_mut();
        index.sync(&self.by_ptr);
        let &ptr = index.ordered.range(..=addr).next_back()?;
        let a = &self.by_ptr[&ptr];
        (addr - a.ptr < extent(a)).then_some(a)
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
            ops in proptest::collection::vec((0u8..3, 0u64..64, 1u64..200), 1..400),
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
                    _ => {
                        let addr = ptr + x;
                        for extent in [|a: &Allocation| a.size, |a: &Allocation| a.granted] {
                            let want = model.range(..=addr).next_back().map(|(_, a)| a).filter(|a| addr < a.ptr + extent(a));
                            prop_assert_eq!(table.containing(addr, extent), want);
                        }
                        prop_assert_eq!(table.get(ptr), model.get(&ptr));
                    }
                }
            }
            prop_assert_eq!(table.sorted(), model.values().copied().collect::<Vec<_>>());
        }
    }
}
