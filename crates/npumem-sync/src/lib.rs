//! Lock-free building blocks of npumem's fast paths, small enough to model-check with loom
//! (`RUSTFLAGS="--cfg loom" cargo test -p npumem-sync --release --test loom`).
//!
//! [`Batches`] hands fixed-size arrays of indices between threads through two kinds of
//! `TaggedStack` (free slots, full slots per class).
//!
//! [`TaggedStack`] is a Treiber stack of `u32` indices whose links live outside it (in the free
//! blocks themselves, for an allocator): the head packs the top index and a generation tag into
//! one 64-bit atomic, and every successful update bumps the tag, so a pop that read a stale
//! `next` (the ABA problem) fails its compare-and-swap instead of corrupting the list.
//!
//! Invariants: an index is in at most one stack at a time (the caller's duty: it pushes only
//! indices it owns); `push`, `push_chain` and `pop` are linearizable; `take_all` empties the
//! stack atomically and hands the whole chain to the caller, who then owns every index on it.

mod batches;

pub use batches::{BATCH, Batches};

#[cfg(loom)]
use loom::sync::atomic::{AtomicU64, Ordering};
#[cfg(not(loom))]
use std::sync::atomic::{AtomicU64, Ordering};

/// Where the stack keeps each index's successor. `NIL` ends a chain.
pub trait Links {
    fn next(&self, index: u32) -> u32;
    fn set_next(&self, index: u32, next: u32);
}

/// The end of a chain.
pub const NIL: u32 = u32::MAX;

/// A lock-free LIFO of indices (see the crate docs).
pub struct TaggedStack {
    /// High 32 bits: tag; low 32 bits: the top index, or `NIL`.
    head: AtomicU64,
}

fn pack(tag: u32, top: u32) -> u64 {
    (u64::from(tag) << 32) | u64::from(top)
}

fn unpack(word: u64) -> (u32, u32) {
    ((word >> 32) as u32, word as u32)
}

impl Default for TaggedStack {
    fn default() -> Self {
        Self::new()
    }
}

impl TaggedStack {
    pub fn new() -> Self {
        TaggedStack { head: AtomicU64::new(pack(0, NIL)) }
    }

    /// Pushes one index.
    pub fn push(&self, index: u32, links: &impl Links) {
        self.push_chain(index, index, links);
    }

    /// Pushes a chain `first -> ... -> last` (linked through `links`) with one successful
    /// compare-and-swap.
    pub fn push_chain(&self, first: u32, last: u32, links: &impl Links) {
        let mut current = self.head.load(Ordering::Relaxed);
        loop {
            let (tag, top) = unpack(current);
            links.set_next(last, top);
            // Release: the links written above are visible to whoever pops `first`.
            match self.head.compare_exchange_weak(
                current,
                pack(tag.wrapping_add(1), first),
                Ordering::Release,
                Ordering::Relaxed,
            ) {
                Ok(_) => return,
                Err(seen) => current = seen,
            }
        }
    }

    /// Pops the top index, if any.
    pub fn pop(&self, links: &impl Links) -> Option<u32> {
        let mut current = self.head.load(Ordering::Acquire);
        loop {
            let (tag, top) = unpack(current);
            if top == NIL {
                return None;
            }
            // May read a link that another thread is rewriting; then the tag has moved on and
            // the exchange below fails.
            let next = links.next(top);
            match self.head.compare_exchange_weak(
                current,
                pack(tag.wrapping_add(1), next),
                Ordering::Acquire,
                Ordering::Acquire,
            ) {
                Ok(_) => return Some(top),
                Err(seen) => current = seen,
            }
        }
    }

    /// Takes the whole stack in one atomic swap: returns its top (`NIL` when empty); the chain
    /// is then the caller's.
    pub fn take_all(&self) -> u32 {
        let mut current = self.head.load(Ordering::Relaxed);
        loop {
            let (tag, top) = unpack(current);
            if top == NIL {
                return NIL;
            }
            match self.head.compare_exchange_weak(
                current,
                pack(tag.wrapping_add(1), NIL),
                Ordering::Acquire,
                Ordering::Relaxed,
            ) {
                Ok(_) => return top,
                Err(seen) => current = seen,
            }
        }
    }

    pub fn is_empty(&self) -> bool {
        unpack(self.head.load(Ordering::Relaxed)).1 == NIL
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;

    struct Arr(Vec<AtomicU32>);

    impl Links for Arr {
        fn next(&self, i: u32) -> u32 {
            self.0[i as usize].load(Ordering::Relaxed)
        }
        fn set_next(&self, i: u32, n: u32) {
            self.0[i as usize].store(n, Ordering::Relaxed)
        }
    }

    fn arr(n: usize) -> Arr {
        Arr((0..n).map(|_| AtomicU32::new(NIL)).collect())
    }

    #[test]
    fn lifo_chains_and_take_all() {
        let links = arr(8);
        let s = TaggedStack::new();
        assert!(s.is_empty() && s.pop(&links).is_none());
        s.push(1, &links);
        s.push(2, &links);
        links.set_next(5, 6);
        s.push_chain(5, 6, &links);
        assert_eq!(s.pop(&links), Some(5));
        let top = s.take_all();
        assert!(s.is_empty());
        let mut chain = vec![];
        let mut i = top;
        while i != NIL {
            chain.push(i);
            i = links.next(i);
        }
        assert_eq!(chain, vec![6, 2, 1]);
    }

    #[test]
    fn threads_never_lose_or_duplicate_an_index() {
        // Smaller under Miri (`make miri`), which interprets every atomic operation.
        const N: u32 = if cfg!(miri) { 64 } else { 4096 };
        const ROUNDS: u32 = if cfg!(miri) { 300 } else { 20_000 };
        let links = arr(N as usize);
        let s = TaggedStack::new();
        for i in 0..N {
            s.push(i, &links);
        }
        let got: Vec<Vec<u32>> = std::thread::scope(|scope| {
            let hs: Vec<_> = (0..4)
                .map(|_| {
                    scope.spawn(|| {
                        let mut mine = Vec::new();
                        for round in 0..ROUNDS {
                            if let Some(i) = s.pop(&links) {
                                if round % 3 == 0 {
                                    s.push(i, &links); // give some back
                                } else {
                                    mine.push(i);
                                }
                            }
                        }
                        mine
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let mut all: Vec<u32> = got.into_iter().flatten().collect();
        let mut i = s.take_all();
        while i != NIL {
            all.push(i);
            i = links.next(i);
        }
        all.sort_unstable();
        assert_eq!(all, (0..N).collect::<Vec<_>>());
    }
}
