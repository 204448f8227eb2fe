//! `Pins`: how many views and owners hold each live allocation (or `map_mem` mapping) by its
//! start address; a held one cannot be freed or unmapped. A multiset kept as one slot in front
//! of a hash map: an owner made and dropped in turn (`Device.buffer` in a loop) pins and
//! releases through the slot, without hashing.
//!
//! Invariants: the count of `ptr` is `(hot == ptr) + map[ptr]`; `hot` is 0 when the slot is
//! empty (no allocation or mapping starts at address 0); the map holds no zero count.

use std::collections::hash_map::Entry;

use rustc_hash::FxHashMap;

#[derive(Debug, Default)]
pub(super) struct Pins {
    hot: u64,
    map: FxHashMap<u64, u32>,
}

impl Pins {
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.hot == 0 && self.map.is_empty()
    }

    /// One more pin of `ptr` (not 0).
    #[inline]
    pub fn add(&mut self, ptr: u64) {
        debug_assert_ne!(ptr, 0);
        if self.hot == 0 {
            self.hot = ptr;
        } else {
            *self.map.entry(ptr).or_default() += 1;
        }
    }

    /// One pin of `ptr` fewer (none if it has none).
    #[inline]
    pub fn release(&mut self, ptr: u64) {
        if self.hot == ptr && ptr != 0 {
            self.hot = 0;
        } else if let Entry::Occupied(mut n) = self.map.entry(ptr) {
            if *n.get() > 1 {
                *n.get_mut() -= 1;
            } else {
                n.remove();
            }
        }
    }

    /// How many pins `ptr` has.
    pub fn count(&self, ptr: u64) -> u32 {
        u32::from(self.hot == ptr && ptr != 0) + self.map.get(&ptr).copied().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    proptest! {
        /// Against a map of counts: the same count for every address after any mix of pins and
        /// releases (releases of unpinned addresses included).
        #[test]
        fn counts_like_a_map(ops in proptest::collection::vec((any::<bool>(), 1u64..6), 1..200)) {
            let mut pins = Pins::default();
            let mut model: BTreeMap<u64, u32> = BTreeMap::new();
            for (add, ptr) in ops {
                if add {
                    pins.add(ptr);
                    *model.entry(ptr).or_default() += 1;
                } else {
                    pins.release(ptr);
                    if let Some(n) = model.get_mut(&ptr) {
                        *n -= 1;
                        if *n == 0 {
                            model.remove(&ptr);
                        }
                    }
                }
                for p in 0..7 {
                    prop_assert_eq!(pins.count(p), model.get(&p).copied().unwrap_or(0));
                }
                prop_assert_eq!(pins.is_empty(), model.is_empty());
                prop_assert!(!pins.map.values().any(|&n| n == 0));
            }
        }
    }
}
