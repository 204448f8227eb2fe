//! `HostPool`: a pool of real host memory for high-rate allocation from many threads. It depends
//! on npumem-base (errors, sizes) and npumem-sync (lock-free stacks) only, nothing of the device
//! stack.
//!
//! Blocks come in size classes ([`classes`]) carved from one reserved mapping ([`region`]).
//! Freed blocks are kept, with their pages, for reuse: a program stops paying page faults for
//! every large temporary. The fast path takes no lock: each thread keeps a small cache of free
//! blocks per class; a miss refills it with one atomic swap from the class's shared lock-free
//! stack (`npumem_sync::TaggedStack`, model-checked with loom) — or takes a whole batch that
//! another thread gave back (`npumem_sync::Batches`, slots on the same kind of stack) —, and an
//! overflowing cache gives half back with one compare-and-swap; a free from another thread than the allocating one is
//! just a free into that thread's cache. Only carving new chunks takes the pool's lock.
//!
//! Invariants: a block is in at most one place at a time — handed out, in one thread's cache,
//! or on its class's shared stack; the pool never writes into a free block (free-list links live
//! in a separate table, one `u32` per 64-byte unit; `alloc_zeroed` clears a block as it hands it
//! out, [`zeroed`]); the class of a block is found from its address
//! (the chunk table), so `free` needs no size; the mapping lives as long as the last handle to
//! the pool (blocks handed to Python hold one).

mod classes;
mod region;
mod zeroed;

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use npumem_sync::{BATCH, Batches, Links, NIL, TaggedStack};
use parking_lot::Mutex;

pub use classes::{MIN_BLOCK, class_of, size_of};
use region::Region;
pub use region::{CHUNK, HugePages};

use npumem_base::error::{AclError, Result};

/// Bytes of free blocks a thread keeps per class before giving half back ...
const CACHE_BYTES: u64 = 16 << 20;
/// ... but at least this many blocks, and at most that many.
const CACHE_MIN: usize = 2;
const CACHE_MAX: usize = 2 * BATCH;
/// Batch slots of a pool (each 1 KiB of indices): enough for every thread to have a few in
/// flight; when they run out, blocks go back as linked chains instead. (Under Miri, which
/// interprets the million atomics' construction, a few: enough for its test.)
const BATCH_SLOTS: usize = if cfg!(miri) { 8 } else { 4096 };
/// Classes up to this size are carved in slabs of several blocks.
const SLAB_MAX_BLOCK: u64 = 32 << 10;

/// Counters of a pool.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HostPoolStats {
    /// Bytes of the reserved mapping.
    pub capacity: u64,
    /// Bytes carved into blocks so far (their pages are committed once touched).
    pub carved: u64,
    /// Blocks on the shared stacks (not counting the threads' caches).
    pub shared_free_blocks: u64,
    /// Slow-path visits: chunks carved under the lock.
    pub carves: u64,
    /// Bytes whose pages `trim` gave back.
    pub trimmed: u64,
}

struct Shared {
    id: u64,
    region: Region,
    stacks: Vec<TaggedStack>,
    /// Full batches handed between threads (see `batches`).
    batches: Batches,
    /// Blocks on each shared stack (approximate under concurrency; for stats and trim).
    counts: Vec<AtomicU64>,
    carve_lock: Mutex<()>,
    carves: AtomicU64,
    trimmed: AtomicU64,
    /// Per class: how `alloc_zeroed` cleared its recent blocks (see [`zeroed`]).
    zero_history: Vec<zeroed::History>,
}

/// Free-list links live in the region's link tables (per chunk for blocks that span chunks, per
/// 64-byte unit for slab blocks), never in the blocks.
impl Links for Region {
    fn next(&self, index: u32) -> u32 {
        self.slot(index).load(Ordering::Relaxed)
    }

    fn set_next(&self, index: u32, next: u32) {
        self.slot(index).store(next, Ordering::Relaxed)
    }
}

impl Region {
    fn slot(&self, index: u32) -> &std::sync::atomic::AtomicU32 {
        if self.class_at(index).is_some_and(|c| size_of(c) > SLAB_MAX_BLOCK) {
            self.chunk_link(index)
        } else {
            self.link(index)
        }
    }
}

/// A pool of host memory (cheap to clone: a handle).
#[derive(Clone)]
pub struct HostPool {
    shared: Arc<Shared>,
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

impl HostPool {
    /// Reserves `capacity` bytes of address space (pages are committed when touched).
    pub fn new(capacity: u64, huge: HugePages) -> Result<HostPool> {
        let region = Region::new(capacity, huge)?;
        let classes = class_of(region.len()) + 1;
        Ok(HostPool {
            shared: Arc::new(Shared {
                id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
                region,
                stacks: (0..classes).map(|_| TaggedStack::new()).collect(),
                batches: Batches::new(BATCH_SLOTS, classes),
                counts: (0..classes).map(|_| AtomicU64::new(0)).collect(),
                carve_lock: Mutex::new(()),
                carves: AtomicU64::new(0),
                trimmed: AtomicU64::new(0),
                zero_history: (0..classes).map(|_| zeroed::History::default()).collect(),
            }),
        })
    }

    /// The reserved range: `(base address, bytes)`.
    pub fn address_range(&self) -> (u64, u64) {
        (self.shared.region.base(), self.shared.region.len())
    }

    pub fn huge_pages(&self) -> HugePages {
        self.shared.region.huge
    }

    /// A block of at least `size` bytes, 64-byte aligned (4 KiB aligned from 4 KiB). Its
    /// contents are whatever the last user left (zero when fresh).
    pub fn alloc(&self, size: u64) -> Result<*mut u8> {
        if size == 0 {
            return Err(AclError::invalid_param("host pool: size 0; allocate at least 1 byte"));
        }
        if size > self.shared.region.len() {
            return Err(AclError::oom(format!(
                "host pool: {size} bytes exceed the pool's capacity of {} bytes",
                self.shared.region.len()
            )));
        }
        let class = class_of(size);
        let index = with_cache(&self.shared, |cache| cache.pop(&self.shared, class))?;
        Ok(self.shared.region.ptr(index))
    }

    /// Like `alloc`, with the first `size` bytes zero: written, or for large blocks dropped to
    /// the kernel's zero pages where they were not in use ([`zeroed`] says which and why).
    pub fn alloc_zeroed(&self, size: u64) -> Result<*mut u8> {
        let ptr = self.alloc(size)?;
        // SAFETY: a block of at least `size` bytes of the pool's anonymous mapping, handed to
        // nobody yet.
        unsafe { zeroed::clear(ptr, size as usize, &self.shared.zero_history[class_of(size)]) };
        Ok(ptr)
    }

    /// Gives a block back.
    ///
    /// # Safety
    /// `ptr` came from `alloc` of this pool (or a clone) and is not used afterwards.
    pub unsafe fn free(&self, ptr: *mut u8) {
        // SAFETY: forwarded contract.
        let ours = unsafe { self.try_free(ptr) };
        assert!(ours, "free of a pointer this pool never handed out");
    }

    /// Like `free`, but returns false (and does nothing) for a pointer outside the pool's carved
    /// memory, for callers that must never panic (NumPy's allocator hooks).
    ///
    /// # Safety
    /// As `free` for pointers of this pool.
    pub unsafe fn try_free(&self, ptr: *mut u8) -> bool {
        let Some((index, class)) = self.locate(ptr) else { return false };
        // Fallible only when the thread's storage is being torn down: give it to the shared stack.
        if with_cache(&self.shared, |cache| {
            cache.push(&self.shared, class, index);
            Ok(())
        })
        .is_err()
        {
            self.shared.push_shared(class, index, index, 1);
        }
        true
    }

    /// The block's index and class, if `ptr` lies in the carved part of this pool.
    fn locate(&self, ptr: *const u8) -> Option<(u32, usize)> {
        let index = self.shared.region.index_of(ptr)?;
        Some((index, self.shared.region.class_at(index)?))
    }

    /// The usable size of the block at `ptr` (its class size), if it is one of this pool's.
    pub fn block_size(&self, ptr: *const u8) -> Option<u64> {
        self.locate(ptr).map(|(_, c)| size_of(c))
    }

    /// The size class (`class_of`'s numbering) of the block at `ptr`, if it lies in the pool's
    /// carved memory.
    pub fn block_class(&self, ptr: *const u8) -> Option<usize> {
        self.locate(ptr).map(|(_, c)| c)
    }

    /// Gives the pages of free blocks of `min_block` bytes (at least one chunk) or more on the
    /// shared stacks back to the system (the blocks stay in the pool; their pages read as zero and fault in again
    /// when reused). Returns the bytes released.
    pub fn trim(&self, min_block: u64) -> u64 {
        let s = &self.shared;
        let mut released = 0;
        for class in class_of(min_block.max(CHUNK))..s.stacks.len() {
            // Batched blocks join the chain first.
            let mut batched = Vec::new();
            while s.batches.take(class, &mut batched) > 0 {}
            if !batched.is_empty() {
                s.counts[class].fetch_sub(batched.len() as u64, Ordering::Relaxed);
                link_and_push(s, class, &batched);
            }
            let top = s.stacks[class].take_all();
            if top == NIL {
                continue;
            }
            let (mut i, mut last, mut n) = (top, top, 0u64);
            while i != NIL {
                let next = s.region.next(i);
                // Links live out of band: the whole block can go.
                s.region.release_pages(i, size_of(class));
                released += size_of(class);
                (last, n) = (i, n + 1);
                i = next;
            }
            s.counts[class].fetch_sub(n, Ordering::Relaxed);
            s.push_shared(class, top, last, n);
        }
        s.trimmed.fetch_add(released, Ordering::Relaxed);
        released
    }

    pub fn stats(&self) -> HostPoolStats {
        let s = &self.shared;
        HostPoolStats {
            capacity: s.region.len(),
            carved: s.region.carved_bytes(),
            shared_free_blocks: s.counts.iter().map(|c| c.load(Ordering::Relaxed)).sum(),
            carves: s.carves.load(Ordering::Relaxed),
            trimmed: s.trimmed.load(Ordering::Relaxed),
        }
    }

    /// Moves this thread's cached blocks back to the shared stacks (threads do it when they
    /// exit; call it to make `stats` exact).
    pub fn flush_thread_cache(&self) {
        let _ = with_cache(&self.shared, |cache| {
            cache.flush(&self.shared);
            Ok(())
        });
    }
}

impl Shared {
    fn push_shared(&self, class: usize, first: u32, last: u32, n: u64) {
        self.counts[class].fetch_add(n, Ordering::Relaxed);
        self.stacks[class].push_chain(first, last, &self.region);
    }

    /// The slow path, under the lock: `n` fresh blocks of `class`, `step` indices apart from
    /// `first` (not linked: the caller links only what it puts on the shared stack) — or none
    /// when another thread refilled the shared stack meanwhile.
    fn carve(&self, class: usize) -> Result<Option<(u32, u32, u32)>> {
        let _guard = self.carve_lock.lock();
        if !self.stacks[class].is_empty() || self.batches.has_full(class) {
            return Ok(None);
        }
        self.carves.fetch_add(1, Ordering::Relaxed);
        let size = size_of(class);
        let step = (size / MIN_BLOCK) as u32;
        if size > SLAB_MAX_BLOCK {
            let first = self.region.carve(size.div_ceil(CHUNK), class)?;
            return Ok(Some((first, 1, step)));
        }
        // A slab of at least 8 blocks, whole chunks.
        let slab = (8 * size).next_multiple_of(CHUNK);
        let first = self.region.carve(slab / CHUNK, class)?;
        Ok(Some((first, (slab / size) as u32, step)))
    }
}

/// One thread's free blocks of one pool, per class.
struct ThreadCache {
    pool_id: u64,
    pool: Weak<Shared>,
    free: Vec<Vec<u32>>,
}

impl ThreadCache {
    fn limit(class: usize) -> usize {
        ((CACHE_BYTES / size_of(class)) as usize).clamp(CACHE_MIN, CACHE_MAX)
    }

    fn pop(&mut self, s: &Shared, class: usize) -> Result<u32> {
        if let Some(i) = self.free[class].pop() {
            return Ok(i);
        }
        let want = Self::limit(class).div_ceil(2);
        loop {
            // Refill with a whole batch another thread gave back (one pop, one contiguous
            // copy), else with up to half a cache of pops from the shared stack...
            let cache = &mut self.free[class];
            let got = s.batches.take(class, cache);
            if got > 0 {
                s.counts[class].fetch_sub(got as u64, Ordering::Relaxed);
                return Ok(cache.pop().expect("a batch is never empty"));
            }
            while cache.len() < want {
                match s.stacks[class].pop(&s.region) {
                    Some(i) => cache.push(i),
                    None => break,
                }
            }
            if !cache.is_empty() {
                s.counts[class].fetch_sub(cache.len() as u64, Ordering::Relaxed);
                return Ok(cache.pop().expect("not empty"));
            }
            // ... else carve: keep what fits, put the rest on the shared stack as one chain.
            let Some((first, n, step)) = s.carve(class)? else { continue };
            let keep = (n as usize).min(want) as u32;
            // Hand out in address order: push in reverse so that pop yields `first` first.
            for k in (0..keep).rev() {
                cache.push(first + k * step);
            }
            if keep < n {
                let rest: Vec<u32> = (keep..n).map(|k| first + k * step).collect();
                link_and_push(s, class, &rest);
            }
            return Ok(cache.pop().expect("a carve yields at least one block"));
        }
    }

    fn push(&mut self, s: &Shared, class: usize, index: u32) {
        let limit = Self::limit(class);
        let cache = &mut self.free[class];
        cache.push(index);
        if cache.len() > limit {
            // Give the older half back with one compare-and-swap: as a batch (one contiguous
            // array for the next taker), or as a linked chain when no batch slot is free.
            let give = (cache.len() / 2).min(BATCH);
            let given = match s.batches.give(class, &cache[..give]) {
                Ok(()) => {
                    s.counts[class].fetch_add(give as u64, Ordering::Relaxed);
                    true
                }
                Err(_) => false,
            };
            let chain: Vec<u32> = cache.drain(..give).collect();
            if !given {
                link_and_push(s, class, &chain);
            }
        }
    }

    fn flush(&mut self, s: &Shared) {
        for class in 0..self.free.len() {
            let chain = std::mem::take(&mut self.free[class]);
            link_and_push(s, class, &chain);
        }
    }
}

fn link_and_push(s: &Shared, class: usize, chain: &[u32]) {
    let (Some(&first), Some(&last)) = (chain.first(), chain.last()) else { return };
    for w in chain.windows(2) {
        s.region.set_next(w[0], w[1]);
    }
    s.push_shared(class, first, last, chain.len() as u64);
}

impl Drop for ThreadCache {
    fn drop(&mut self) {
        if let Some(s) = self.pool.upgrade() {
            self.flush(&s);
        }
    }
}

thread_local! {
    static CACHES: RefCell<Vec<ThreadCache>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` on this thread's cache for `s` (created on first use; caches of dropped pools are
/// pruned then). Errs only while the thread's storage is being destroyed.
fn with_cache<T>(s: &Arc<Shared>, f: impl FnOnce(&mut ThreadCache) -> Result<T>) -> Result<T> {
    CACHES
        .try_with(|caches| {
            let mut caches = caches.borrow_mut();
            let pos = match caches.iter().position(|c| c.pool_id == s.id) {
                Some(p) => p,
                None => {
                    caches.retain(|c| c.pool.strong_count() > 0);
                    caches.push(ThreadCache {
                        pool_id: s.id,
                        pool: Arc::downgrade(s),
                        free: (0..s.stacks.len()).map(|_| Vec::new()).collect(),
                    });
                    caches.len() - 1
                }
            };
            f(&mut caches[pos])
        })
        .unwrap_or_else(|_| Err(AclError::internal("host pool: thread storage is being destroyed")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;
    use std::sync::Mutex as StdMutex;

    fn pool() -> HostPool {
        HostPool::new(1 << 30, HugePages::Transparent).unwrap()
    }

    #[test]
    fn zeroed_blocks_read_zero_on_every_reuse() {
        let p = pool();
        // Small (written), large and used (written, then a dropping probe), large and untouched
        // (dropped), and a size that leaves partial pages at the end.
        for size in [100usize, 4096, zeroed::DROP_MIN, (1 << 20) + 1000] {
            for round in 0..40 {
                let a = p.alloc_zeroed(size as u64).unwrap();
                // SAFETY: a live block of at least `size` bytes, freed below.
                let bytes = unsafe { std::slice::from_raw_parts_mut(a, size) };
                assert!(bytes.iter().all(|&b| b == 0), "size {size}, round {round}: not zero");
                if round % 3 != 2 {
                    bytes.iter_mut().step_by(512).for_each(|b| *b = 0xA5); // used, dirty
                    bytes[size - 1] = 0x5A;
                }
                // SAFETY: freed once, not used after.
                unsafe { p.free(a) };
            }
        }
    }

    #[test]
    fn blocks_are_real_aligned_and_reused() {
        let p = pool();
        let a = p.alloc(100).unwrap();
        assert_eq!(a as usize % 64, 0);
        assert_eq!(p.block_size(a), Some(128));
        // SAFETY: a block of 128 bytes from the pool.
        unsafe { std::ptr::write_bytes(a, 0xAB, 128) };
        // SAFETY: freed once, not used after.
        unsafe { p.free(a) };
        let b = p.alloc(120).unwrap();
        assert_eq!(a, b, "the thread cache hands the same block back");
        let big = p.alloc(64 << 20).unwrap();
        assert_eq!(big as usize % CHUNK as usize, 0);
        assert_eq!(p.block_size(big), Some(64 << 20));
        // SAFETY: freed once.
        unsafe { p.free(big) };
        assert_eq!(p.alloc(60 << 20).unwrap(), big, "a 60 MiB request reuses the 64 MiB class block");
        assert!(p.alloc(0).is_err());
        assert!(p.alloc(2 << 30).is_err());
        assert_eq!(p.block_size(std::ptr::null()), None);
    }

    #[test]
    fn many_threads_never_share_a_block() {
        let p = pool();
        let owners: Vec<Vec<usize>> = std::thread::scope(|scope| {
            let hs: Vec<_> = (0..4)
                .map(|t| {
                    let p = p.clone();
                    scope.spawn(move || {
                        let mut live: Vec<*mut u8> = Vec::new();
                        let mut seen = Vec::new();
                        for round in 0..20_000usize {
                            let size = [64u64, 200, 4096, 100_000][(round + t) % 4];
                            if round % 3 == 2 {
                                if let Some(ptr) = live.pop() {
                                    // SAFETY: allocated above, freed once.
                                    unsafe { p.free(ptr) };
                                }
                            } else {
                                let ptr = p.alloc(size).unwrap();
                                // SAFETY: the block is ours: stamp it and check nobody else does.
                                unsafe { ptr.cast::<u64>().write(t as u64 + 1) };
                                live.push(ptr);
                            }
                        }
                        for &ptr in &live {
                            // SAFETY: still ours.
                            assert_eq!(unsafe { ptr.cast::<u64>().read() }, t as u64 + 1);
                            seen.push(ptr as usize);
                        }
                        seen
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let mut all: Vec<usize> = owners.into_iter().flatten().collect();
        let n = all.len();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), n, "a block was handed to two owners");
    }

    #[test]
    fn cross_thread_frees_come_back_and_trim_releases_pages() {
        let p = pool();
        let ptrs: Vec<usize> = (0..100).map(|_| p.alloc(2 << 20).unwrap() as usize).collect();
        let q = p.clone();
        std::thread::spawn(move || {
            for &ptr in &ptrs {
                // SAFETY: allocated on the main thread, freed once here.
                unsafe { q.free(ptr as *mut u8) };
            }
        })
        .join()
        .unwrap();
        // The other thread exited: its cache went back to the shared stack.
        assert_eq!(p.stats().shared_free_blocks, 100);
        let carved = p.stats().carved;
        for _ in 0..100 {
            p.alloc(2 << 20).unwrap();
        }
        assert_eq!(p.stats().carved, carved, "reused, not carved");
        let r = p.alloc(4 << 20).unwrap();
        // SAFETY: freed once.
        unsafe { p.free(r) };
        p.flush_thread_cache();
        assert!(p.trim(1 << 20) >= (4 << 20) - 4096);
        assert_eq!(p.alloc(4 << 20).unwrap(), r);
    }

    /// Sized for Miri (`make miri` runs it there: the link tables, the lock-free stacks and
    /// batches, the raw block pointers and the thread caches' hand-over under a checker of
    /// undefined behaviour and data races): slab blocks (links per 64-byte unit) and
    /// chunk-spanning ones (links per chunk), a cache that overflows into batches and chains,
    /// frees from another thread, a trim, and reuse; every block is stamped and checked.
    #[test]
    fn link_tables_hand_blocks_over_once() {
        struct Blocks(Vec<*mut u8>);
        // SAFETY: the blocks are handed to the other thread, which alone uses them then.
        unsafe impl Send for Blocks {}
        let p = HostPool::new(8 << 20, HugePages::None).unwrap();
        // 64 B (600 blocks: more than a thread cache keeps) and 4 KiB are slab classes; 40 KiB
        // and 1 MiB span chunks.
        let plan: [(u64, usize); 4] = [(64, 600), (4096, 40), (40 << 10, 20), (1 << 20, 4)];
        let alloc_all = |stamp: fn(*mut u8) -> u64| -> Vec<*mut u8> {
            let mut blocks = Vec::new();
            for &(size, n) in &plan {
                for _ in 0..n {
                    let ptr = p.alloc(size).unwrap();
                    // SAFETY: a live block of at least 64 bytes that this test owns.
                    unsafe { ptr.cast::<u64>().write(stamp(ptr)) };
                    blocks.push(ptr);
                }
            }
            let mut addrs: Vec<usize> = blocks.iter().map(|&b| b as usize).collect();
            addrs.sort_unstable();
            addrs.dedup();
            assert_eq!(addrs.len(), blocks.len(), "a block was handed out twice");
            blocks
        };
        let blocks = alloc_all(|ptr| ptr as u64);
        // Half are freed here (the 64-byte cache overflows into a batch), half by another
        // thread, whose cache goes back to the shared stacks as linked chains when it exits.
        let (mine, theirs) = blocks.split_at(blocks.len() / 2);
        for &ptr in mine {
            // SAFETY: stamped with its own address above; freed once.
            assert_eq!(unsafe { ptr.cast::<u64>().read() }, ptr as u64);
            unsafe { p.free(ptr) };
        }
        let (q, theirs) = (p.clone(), Blocks(theirs.to_vec()));
        std::thread::spawn(move || {
            let theirs = theirs; // the whole wrapper moves (a closure would capture `.0` alone)
            for ptr in theirs.0 {
                // SAFETY: allocated on the main thread, freed once here.
                unsafe { q.free(ptr) };
            }
        })
        .join()
        .unwrap();
        p.flush_thread_cache();
        assert!(p.trim(CHUNK) >= 4 << 20, "the chunk-spanning blocks' pages go back");
        // As many blocks again, each handed out once, without carving more.
        let carved = p.stats().carved;
        let again = alloc_all(|ptr| !(ptr as u64));
        assert_eq!(p.stats().carved, carved, "reused, not carved");
        for &ptr in &again {
            // SAFETY: stamped above; still ours.
            assert_eq!(unsafe { ptr.cast::<u64>().read() }, !(ptr as u64));
        }
    }

    #[test]
    fn live_blocks_never_overlap_across_threads() {
        let p = HostPool::new(2 << 30, HugePages::Transparent).unwrap();
        let map: StdMutex<BTreeMap<usize, (usize, usize)>> = StdMutex::new(BTreeMap::new());
        std::thread::scope(|scope| {
            for t in 0..4usize {
                let p = p.clone();
                let map = &map;
                scope.spawn(move || {
                    let mut seed = t as u64 * 7919 + 1;
                    let mut rnd = |n: u64| {
                        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                        (seed >> 33) % n
                    };
                    let sizes = [64u64, 200, 4096, 70 << 10, 1 << 20];
                    let mut live: Vec<(usize, usize)> = Vec::new();
                    for _ in 0..5000 {
                        if !live.is_empty() && rnd(100) < 45 {
                            let (a, _) = live.swap_remove(rnd(live.len() as u64) as usize);
                            map.lock().unwrap().remove(&a);
                            // SAFETY: ours, freed once.
                            unsafe { p.free(a as *mut u8) };
                        } else {
                            let n = sizes[rnd(5) as usize] as usize;
                            let a = p.alloc(n as u64).unwrap() as usize;
                            let mut m = map.lock().unwrap();
                            if let Some((&b, &(len, owner))) = m.range(..a + n).next_back() {
                                assert!(b + len <= a, "thread {t}: [{a:#x}+{n}) overlaps [{b:#x}+{len}) of {owner}");
                            }
                            m.insert(a, (n, t));
                            live.push((a, n));
                        }
                    }
                });
            }
        });
    }
}
