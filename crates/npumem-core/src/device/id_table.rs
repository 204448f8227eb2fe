//! `IdTable`: which pointer each live id of a replay holds (0: none; no allocation starts at
//! 0; the table stores any u64, and the replay also stores odd marks: an entry of its
//! unpublished blocks, or an alloc being served). Traces number their allocations densely,
//! mostly in order, and free most of them soon: the ids live at one time sit in a narrow band
//! that moves up through the id space. A dense
//! trace's ids go in a window — a ring of up to `WINDOW` slots (512 KiB, a power of two), slot
//! `id % len` for the ids `base .. base + len` — so a lookup is an index computation, and
//! the same memory serves the whole trace: it stays in the cache, and no page of a table sized
//! by the largest id is touched for the first time (a page fault) as the ids grow. An id past
//! the window moves it up: the slots of the ids it leaves behind become the new ids' slots
//! (nothing shifts), and the live ones among them (long-lived blocks: weights) move to
//! `old`, a hash map. A sparse trace (ids far more spread than its events) keeps every id in
//! the hash map.
//!
//! Invariants (window): `slots.len()` is a power of two, at least 2, and `mask` is one less;
//! every live id in `base .. base + slots.len()` has its pointer at `slots[id & mask]`, every
//! other slot is 0; every live id below `base` is in `old`; no id at or past
//! `base + slots.len()` is live.

use rustc_hash::FxHashMap;

/// The window's slots at most (512 KiB; a power of two).
const WINDOW: usize = 1 << 16;
/// The window's slots at least (a power of two).
const MIN_WINDOW: usize = 1 << 10;
/// Ids up to this bound (and up to 4x the events, plus a margin) go to a window.
const DENSE_LIMIT: u64 = 1 << 30;
/// A window that had to jump past more than this many of its lengths at once, this many times,
/// holds a trace sparser than its hint said: its ids go to a hash map from then on.
const JUMPS: u32 = 64;

#[derive(Debug)]
pub(super) enum IdTable {
    Window(Window),
    Sparse(FxHashMap<u64, u64>),
}

#[derive(Debug)]
pub(super) struct Window {
    slots: Vec<u64>,
    /// `slots.len() - 1`.
    mask: usize,
    base: u64,
    old: FxHashMap<u64, u64>,
    jumps: u32,
}

impl IdTable {
    /// A table for ids below `id_bound` (a hint: ids past it work too) of a trace of about
    /// `events` events.
    pub(super) fn new(id_bound: u64, events: u64) -> Self {
        if id_bound <= DENSE_LIMIT && id_bound <= events.saturating_mul(4).saturating_add(1 << 16) {
            let len = (id_bound as usize).clamp(MIN_WINDOW, WINDOW).next_power_of_two();
            IdTable::Window(Window { slots: vec![0; len], mask: len - 1, base: 0, old: FxHashMap::default(), jumps: 0 })
        } else {
            IdTable::Sparse(FxHashMap::default())
        }
    }

    #[inline(always)]
    pub(super) fn get(&self, id: u64) -> u64 {
        match self {
            IdTable::Window(w) => {
                if w.covers(id) {
                    w.slots[id as usize & w.mask]
                } else if id < w.base {
                    w.old.get(&id).copied().unwrap_or(0)
                } else {
                    0
                }
            }
            IdTable::Sparse(m) => m.get(&id).copied().unwrap_or(0),
        }
    }

    /// Sets the pointer of `id` (0: no longer live).
    #[inline(always)]
    pub(super) fn set(&mut self, id: u64, ptr: u64) {
        match self {
            IdTable::Window(w) if w.covers(id) => w.slots[id as usize & w.mask] = ptr,
            _ => self.set_outside(id, ptr),
        }
    }

    /// `set` of an id outside the window, or of a sparse table.
    #[cold]
    fn set_outside(&mut self, id: u64, ptr: u64) {
        match self {
            IdTable::Window(w) if id < w.base => {
                if ptr == 0 {
                    w.old.remove(&id);
                } else {
                    w.old.insert(id, ptr);
                }
            }
            IdTable::Window(_) if ptr == 0 => {}
            IdTable::Window(w) => {
                if w.slide(id) {
                    w.slots[id as usize & w.mask] = ptr;
                } else {
                    let mut m = std::mem::take(&mut w.old);
                    m.extend(w.slots.iter().enumerate().filter(|&(_, &p)| p != 0).map(|(i, &p)| (w.id_of(i), p)));
                    m.insert(id, ptr);
                    *self = IdTable::Sparse(m);
                }
            }
            IdTable::Sparse(m) => {
                if ptr == 0 {
                    m.remove(&id);
                } else {
                    m.insert(id, ptr);
                }
            }
        }
    }

    /// Sets `id` to `ptr` when it holds none (0), and says whether it did: `get` and `set` in
    /// one lookup of the window.
    #[inline(always)]
    pub(super) fn claim(&mut self, id: u64, ptr: u64) -> bool {
        match self {
            IdTable::Window(w) if w.covers(id) => {
                let slot = &mut w.slots[id as usize & w.mask];
                let free = *slot == 0;
                if free {
                    *slot = ptr;
                }
                free
            }
            _ => {
                let free = self.get(id) == 0;
                if free {
                    self.set_outside(id, ptr);
                }
                free
            }
        }
    }

    /// The pointer of `id`, which is no longer live.
    #[inline(always)]
    pub(super) fn take(&mut self, id: u64) -> u64 {
        match self {
            IdTable::Window(w) if w.covers(id) => std::mem::take(&mut w.slots[id as usize & w.mask]),
            _ => {
                let p = self.get(id);
                if p != 0 {
                    self.set_outside(id, 0);
                }
                p
            }
        }
    }

    /// Every live pointer, leaving the table empty.
    pub(super) fn drain(&mut self) -> Vec<u64> {
        match self {
            IdTable::Window(w) => {
                let mut out: Vec<u64> = w.old.drain().map(|(_, p)| p).collect();
                out.extend(w.slots.iter().copied().filter(|&p| p != 0));
                w.slots.fill(0);
                out
            }
            IdTable::Sparse(m) => m.drain().map(|(_, p)| p).filter(|&p| p != 0).collect(),
        }
    }
}

impl Window {
    /// Whether `id` is in `base .. base + slots.len()`.
    #[inline(always)]
    fn covers(&self, id: u64) -> bool {
        id.wrapping_sub(self.base) < self.slots.len() as u64
    }

    /// The id the window keeps in slot `i`.
    fn id_of(&self, i: usize) -> u64 {
        self.base + (i.wrapping_sub(self.base as usize) & self.mask) as u64
    }

    /// Moves the window up so that it covers `id` (at or past its end), with half its length
    /// free above `id`; the live ids it leaves behind go to `old`, and their slots, cleared,
    /// become the slots of the ids it now covers. False when the table should become a hash
    /// map instead (the window jumped too often).
    fn slide(&mut self, id: u64) -> bool {
        let len = self.slots.len() as u64;
        // No id at or past u64::MAX - len / 2 fits a window: a hash map takes them.
        let Some(base) =
            id.checked_add(1).and_then(|x| x.checked_sub(len / 2)).filter(|b| b.checked_add(len).is_some())
        else {
            return false;
        };
        let passed = base - self.base;
        if passed > 2 * len {
            self.jumps += 1;
            if self.jumps > JUMPS {
                return false;
            }
        }
        // The slots of ids below the new base (at most the whole window) are emptied: the ring
        // from the old base's slot, in at most two pieces.
        let gone = passed.min(len) as usize;
        let start = self.base as usize & self.mask;
        let first = gone.min(self.slots.len() - start);
        self.leave(start, first, self.base);
        self.leave(0, gone - first, self.base + first as u64);
        self.base = base;
        true
    }

    /// Empties slots `start .. start + n`, those of the ids from `id`, moving the live ones to
    /// `old` (8 slots at a time are checked at once: most are empty).
    fn leave(&mut self, start: usize, n: usize, id: u64) {
        for (c, chunk) in self.slots[start..start + n].chunks_mut(8).enumerate() {
            if chunk.iter().fold(0, |any, &p| any | p) == 0 {
                continue;
            }
            for (i, slot) in chunk.iter_mut().enumerate() {
                if *slot != 0 {
                    self.old.insert(id + (c * 8 + i) as u64, std::mem::take(slot));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    proptest! {
        /// Against a HashMap: the same pointer for every id after any mix of sets, claims and takes,
        /// with ids in a band that moves up (a trace's), far behind it (long-lived blocks) and
        /// far ahead (jumps, up to a switch to a hash map), and the same pointers drained.
        #[test]
        fn answers_like_a_map(
            bound in prop_oneof![Just(0u64), Just(100), Just(5000), Just(1 << 40)],
            ops in proptest::collection::vec((0u8..4, 0u64..3000, 1u64..1000), 1..400),
        ) {
            let mut table = IdTable::new(bound, 1000);
            let mut model: HashMap<u64, u64> = HashMap::new();
            let mut front = 0u64;
            for (op, x, ptr) in ops {
                // Mostly near a front that moves up by steps of up to 3 windows.
                let id = match op {
                    0 => { front += x % 64; front }
                    1 => front.saturating_sub(x),
                    2 => x,
                    _ => { front += x * 64; front }
                };
                if ptr % 3 == 0 {
                    prop_assert_eq!(table.take(id), model.remove(&id).unwrap_or(0));
                } else if ptr % 3 == 1 {
                    let free = model.get(&id).copied().unwrap_or(0) == 0;
                    prop_assert_eq!(table.claim(id, ptr), free);
                    if free {
                        model.insert(id, ptr);
                    }
                } else {
                    table.set(id, ptr);
                    model.insert(id, ptr);
                }
                prop_assert_eq!(table.get(id), model.get(&id).copied().unwrap_or(0));
                prop_assert_eq!(table.get(x), model.get(&x).copied().unwrap_or(0));
            }
            let mut drained = table.drain();
            let mut want: Vec<u64> = model.into_values().collect();
            drained.sort_unstable();
            want.sort_unstable();
            prop_assert_eq!(drained, want);
            prop_assert_eq!(table.get(front), 0);
        }
    }
}
