//! `FreedRing`: the last `FREED_MEMORY` freed pointers, so that a free of one of them is named a
//! double free.
//!
//! Rules: slot 0 marks an empty slot (no allocation starts at address 0); `next` is the slot the
//! next pointer goes to.

/// How many recently freed pointers are remembered to name double frees.
const FREED_MEMORY: usize = 4096;

/// The last `FREED_MEMORY` freed pointers, in a ring (0 marks an empty slot: no allocation
/// starts at address 0).
#[derive(Debug)]
pub(super) struct FreedRing {
    slots: Box<[u64]>,
    next: usize,
}

impl Default for FreedRing {
    fn default() -> Self {
        FreedRing { slots: vec![0; FREED_MEMORY].into_boxed_slice(), next: 0 }
    }
}

impl FreedRing {
    #[inline]
    pub(super) fn push(&mut self, ptr: u64) {
        self.slots[self.next] = ptr;
        self.next = (self.next + 1) % FREED_MEMORY;
    }

    /// `push` of each of `ptrs` in order, a slice copy per stretch of the ring. Of a batch longer
    /// than the ring only the last `FREED_MEMORY` pointers are copied (the others would be
    /// overwritten), to the slots they would have reached.
    #[inline]
    pub(super) fn extend(&mut self, mut ptrs: &[u64]) {
        let skipped = ptrs.len().saturating_sub(FREED_MEMORY);
        self.next = (self.next + skipped) % FREED_MEMORY;
        ptrs = &ptrs[skipped..];
        while !ptrs.is_empty() {
            let take = ptrs.len().min(FREED_MEMORY - self.next);
            self.slots[self.next..self.next + take].copy_from_slice(&ptrs[..take]);
            self.next = (self.next + take) % FREED_MEMORY;
            ptrs = &ptrs[take..];
        }
    }

    pub(super) fn contains(&self, ptr: &u64) -> bool {
        *ptr != 0 && self.slots.contains(ptr)
    }
}

#[cfg(test)]
mod tests {
    use super::{FREED_MEMORY, FreedRing};

    /// `extend` leaves the ring as `push` of each pointer would, for batches shorter and longer
    /// than the ring, from any starting slot.
    #[test]
    fn extend_is_push_of_each() {
        for start in [0, 1, FREED_MEMORY - 1] {
            for len in [0, 5, FREED_MEMORY - 1, FREED_MEMORY, FREED_MEMORY + 1, 3 * FREED_MEMORY + 7] {
                let (mut pushed, mut extended) = (FreedRing::default(), FreedRing::default());
                for ring in [&mut pushed, &mut extended] {
                    (0..start as u64).for_each(|p| ring.push(p + 1));
                }
                let ptrs: Vec<u64> = (0..len as u64).map(|p| 0x10_0000 + p).collect();
                ptrs.iter().for_each(|&p| pushed.push(p));
                extended.extend(&ptrs);
                assert_eq!((pushed.next, &pushed.slots), (extended.next, &extended.slots), "start {start}, len {len}");
            }
        }
    }
}
