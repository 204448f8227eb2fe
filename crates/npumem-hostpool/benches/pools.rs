//! npumem's `HostPool` against named peers on the same workloads, in one run:
//! `offset-allocator` (Sebastian Aaltonen's O(1) offset allocator; metadata only, no memory),
//! `rlsf` (TLSF over a real region), `buddy_system_allocator` (over a real region), the system
//! `malloc` and `mimalloc`.
//!
//! Workloads:
//! - `pair_4k`: one cached 4 KiB alloc + free;
//! - `random_sizes`: 1,000 live blocks of sizes in [16 B, 64 KiB), allocated then freed in a
//!   shuffled order (per operation);
//! - `rmm_random/N`: a clone of RMM's `random_allocations` benchmark (2N steps; sizes U(1, 1 MiB);
//!   allocate with probability 73% while fewer than N allocations were made and usage stays
//!   under 16,000 MiB, else free a random live block), N = 1,000 / 10,000 / 100,000;
//! - `cross_thread`: one thread allocates 4 KiB blocks and hands them in batches of 256 to a
//!   second thread that frees them (per block). Allocators that are not thread-safe run behind a
//!   mutex, as a user would have to share them.
//!
//! Run: `cargo bench -p npumem-hostpool --bench pools` (or `make bench B=pools`).

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::ptr::NonNull;
use std::sync::mpsc;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use npumem_hostpool::{HostPool, HugePages};
use parking_lot::Mutex;

const REGION: usize = 32 << 30;
const MIB: usize = 1 << 20;

/// An allocator under test; `H` is whatever it needs back to free.
trait Alloc: Send {
    type H: Copy + Send;
    fn name(&self) -> &'static str;
    fn alloc(&mut self, size: usize) -> Self::H;
    fn free(&mut self, h: Self::H, size: usize);
}

struct Pool(HostPool);
impl Alloc for Pool {
    type H = usize;
    fn name(&self) -> &'static str {
        "npumem HostPool"
    }
    fn alloc(&mut self, size: usize) -> usize {
        self.0.alloc(size as u64).expect("pool alloc") as usize
    }
    fn free(&mut self, h: usize, _: usize) {
        // SAFETY: `h` came from `alloc`, freed once.
        unsafe { self.0.free(h as *mut u8) }
    }
}

/// offset-allocator manages u32 units: 256-byte units cover the 16,000 MiB of the RMM workload.
struct Offset(offset_allocator::Allocator<u32>);
const UNIT: usize = 256;
impl Alloc for Offset {
    type H = offset_allocator::Allocation<u32>;
    fn name(&self) -> &'static str {
        "offset-allocator"
    }
    fn alloc(&mut self, size: usize) -> Self::H {
        self.0.allocate(size.div_ceil(UNIT) as u32).expect("offset-allocator alloc")
    }
    fn free(&mut self, h: Self::H, _: usize) {
        self.0.free(h)
    }
}

/// An anonymous mapping for the in-band allocators (pages are committed when touched).
fn region(len: usize) -> NonNull<u8> {
    // SAFETY: a private anonymous mapping; never unmapped (the benchmark process ends).
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED);
    NonNull::new(p.cast()).expect("mapped")
}

struct Tlsf(rlsf::Tlsf<'static, u64, u64, 48, 64>);
impl Alloc for Tlsf {
    type H = usize;
    fn name(&self) -> &'static str {
        "rlsf (TLSF)"
    }
    fn alloc(&mut self, size: usize) -> usize {
        self.0.allocate(Layout::from_size_align(size, 64).unwrap()).expect("rlsf alloc").as_ptr() as usize
    }
    fn free(&mut self, h: usize, _: usize) {
        // SAFETY: allocated by this TLSF with alignment 64.
        unsafe { self.0.deallocate(NonNull::new_unchecked(h as *mut u8), 64) }
    }
}
// SAFETY: the TLSF owns its region; the benchmark moves it between threads only behind a mutex.
unsafe impl Send for Tlsf {}

struct Buddy(buddy_system_allocator::Heap<40>);
impl Alloc for Buddy {
    type H = usize;
    fn name(&self) -> &'static str {
        "buddy_system_allocator"
    }
    fn alloc(&mut self, size: usize) -> usize {
        self.0.alloc(Layout::from_size_align(size, 64).unwrap()).expect("buddy alloc").as_ptr() as usize
    }
    fn free(&mut self, h: usize, size: usize) {
        // SAFETY: allocated by this heap with this layout.
        unsafe { self.0.dealloc(NonNull::new_unchecked(h as *mut u8), Layout::from_size_align(size, 64).unwrap()) }
    }
}

struct Sys;
impl Alloc for Sys {
    type H = usize;
    fn name(&self) -> &'static str {
        "system malloc"
    }
    fn alloc(&mut self, size: usize) -> usize {
        // SAFETY: a non-zero layout.
        unsafe { System.alloc(Layout::from_size_align(size, 64).unwrap()) as usize }
    }
    fn free(&mut self, h: usize, size: usize) {
        // SAFETY: allocated above with this layout.
        unsafe { System.dealloc(h as *mut u8, Layout::from_size_align(size, 64).unwrap()) }
    }
}

struct Mi;
impl Alloc for Mi {
    type H = usize;
    fn name(&self) -> &'static str {
        "mimalloc"
    }
    fn alloc(&mut self, size: usize) -> usize {
        // SAFETY: a non-zero layout.
        unsafe { mimalloc::MiMalloc.alloc(Layout::from_size_align(size, 64).unwrap()) as usize }
    }
    fn free(&mut self, h: usize, size: usize) {
        // SAFETY: allocated above with this layout.
        unsafe { mimalloc::MiMalloc.dealloc(h as *mut u8, Layout::from_size_align(size, 64).unwrap()) }
    }
}

fn peers() -> (Pool, Offset, Tlsf, Buddy, Sys, Mi) {
    let pool = Pool(HostPool::new(REGION as u64, HugePages::Transparent).unwrap());
    let offset = Offset(offset_allocator::Allocator::with_max_allocs((REGION / UNIT) as u32, 1 << 20));
    let mut tlsf = Tlsf(rlsf::Tlsf::new());
    // SAFETY: a fresh region owned by this TLSF for the rest of the process.
    unsafe { tlsf.0.insert_free_block_ptr(NonNull::slice_from_raw_parts(region(REGION), REGION)) };
    let mut buddy = Buddy(buddy_system_allocator::Heap::new());
    // SAFETY: a fresh region owned by this heap for the rest of the process.
    unsafe { buddy.0.init(region(REGION).as_ptr() as usize, REGION) };
    (pool, offset, tlsf, buddy, Sys, Mi)
}

/// A small deterministic generator (the workloads' seeds are fixed).
struct Lcg(u64);
impl Lcg {
    fn next(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

fn pair_4k<A: Alloc>(c: &mut Criterion, a: &mut A) {
    let mut g = c.benchmark_group("pair_4k");
    g.throughput(Throughput::Elements(1));
    let h = a.alloc(4096);
    a.free(h, 4096); // warm
    g.bench_function(a.name(), |b| {
        b.iter(|| {
            let h = a.alloc(black_box(4096));
            a.free(h, 4096);
        })
    });
    g.finish();
}

fn random_sizes<A: Alloc>(c: &mut Criterion, a: &mut A) {
    let mut rng = Lcg(42);
    let sizes: Vec<usize> = (0..1000).map(|_| 16 + rng.next(64 << 10) as usize).collect();
    let mut order: Vec<usize> = (0..1000).collect();
    for i in (1..order.len()).rev() {
        order.swap(i, rng.next(i as u64 + 1) as usize);
    }
    let mut g = c.benchmark_group("random_sizes");
    g.throughput(Throughput::Elements(2000));
    g.bench_function(a.name(), |b| {
        b.iter(|| {
            let hs: Vec<A::H> = sizes.iter().map(|&s| a.alloc(s)).collect();
            for &i in &order {
                a.free(hs[i], sizes[i]);
            }
        })
    });
    g.finish();
}

/// RMM's random_allocations loop (see the module docs).
fn rmm_random<A: Alloc>(a: &mut A, n: usize, max_size: usize) {
    let mut rng = Lcg(1);
    let mut live: Vec<(A::H, usize)> = Vec::with_capacity(n);
    let (mut allocs, mut usage) = (0usize, 0usize);
    for _ in 0..2 * n {
        let size = 1 + rng.next(max_size as u64) as usize;
        let allocate = allocs < n && usage + size < 16_000 * MIB && (live.is_empty() || rng.next(100) < 73);
        if allocate {
            live.push((a.alloc(size), size));
            allocs += 1;
            usage += size;
        } else if !live.is_empty() {
            let k = rng.next(live.len() as u64) as usize;
            let (h, s) = live.swap_remove(k);
            a.free(h, s);
            usage -= s;
        }
    }
    for (h, s) in live {
        a.free(h, s);
    }
}

fn rmm<A: Alloc>(c: &mut Criterion, a: &mut A) {
    let mut g = c.benchmark_group("rmm_random");
    g.sample_size(10);
    for n in [1_000usize, 10_000, 100_000] {
        if n == 100_000 && a.name() == "buddy_system_allocator" {
            continue; // its linear free-list walks take ~7 us/op at 10,000 already
        }
        g.throughput(Throughput::Elements(2 * n as u64));
        rmm_random(a, n.min(10_000), MIB); // warm the allocator's structures
        g.bench_function(format!("{}/{n}", a.name()), |b| b.iter(|| rmm_random(a, n, MIB)));
    }
    g.finish();
}

/// Producer allocates, consumer frees, through a shared handle.
fn cross_thread<A: Alloc + 'static>(c: &mut Criterion, a: A) {
    let name = a.name();
    let shared = std::sync::Arc::new(Mutex::new(a));
    let mut g = c.benchmark_group("cross_thread");
    const BLOCKS: usize = 64 * 256;
    g.throughput(Throughput::Elements(BLOCKS as u64));
    g.sample_size(20);
    g.bench_function(name, |b| {
        b.iter(|| {
            let (tx, rx) = mpsc::sync_channel::<Vec<A::H>>(8);
            let consumer = {
                let shared = shared.clone();
                std::thread::spawn(move || {
                    for batch in rx {
                        let mut a = shared.lock();
                        for h in batch {
                            a.free(h, 4096);
                        }
                    }
                })
            };
            for _ in 0..BLOCKS / 256 {
                let batch: Vec<A::H> = {
                    let mut a = shared.lock();
                    (0..256).map(|_| a.alloc(4096)).collect()
                };
                tx.send(batch).unwrap();
            }
            drop(tx);
            consumer.join().unwrap();
        })
    });
    g.finish();
}

/// The thread-safe allocators run without the mutex: each thread calls them directly.
fn cross_thread_direct<A: Alloc + Clone + 'static>(c: &mut Criterion, a: A) {
    let name = a.name();
    let mut g = c.benchmark_group("cross_thread");
    const BLOCKS: usize = 64 * 256;
    g.throughput(Throughput::Elements(BLOCKS as u64));
    g.sample_size(20);
    g.bench_function(format!("{name} (no lock)"), |b| {
        b.iter(|| {
            let (tx, rx) = mpsc::sync_channel::<Vec<A::H>>(8);
            let consumer = {
                let mut a = a.clone();
                std::thread::spawn(move || {
                    for batch in rx {
                        for h in batch {
                            a.free(h, 4096);
                        }
                    }
                })
            };
            let mut a = a.clone();
            for _ in 0..BLOCKS / 256 {
                let batch: Vec<A::H> = (0..256).map(|_| a.alloc(4096)).collect();
                tx.send(batch).unwrap();
            }
            drop(tx);
            consumer.join().unwrap();
        })
    });
    g.finish();
}

impl Clone for Pool {
    fn clone(&self) -> Self {
        Pool(self.0.clone())
    }
}
impl Clone for Mi {
    fn clone(&self) -> Self {
        Mi
    }
}
impl Clone for Sys {
    fn clone(&self) -> Self {
        Sys
    }
}

fn all(c: &mut Criterion) {
    let (mut pool, mut offset, mut tlsf, mut buddy, mut sys, mut mi) = peers();
    pair_4k(c, &mut pool);
    pair_4k(c, &mut offset);
    pair_4k(c, &mut tlsf);
    pair_4k(c, &mut buddy);
    pair_4k(c, &mut sys);
    pair_4k(c, &mut mi);
    random_sizes(c, &mut pool);
    random_sizes(c, &mut offset);
    random_sizes(c, &mut tlsf);
    random_sizes(c, &mut buddy);
    random_sizes(c, &mut sys);
    random_sizes(c, &mut mi);
    rmm(c, &mut pool);
    rmm(c, &mut offset);
    rmm(c, &mut tlsf);
    rmm(c, &mut buddy);
    rmm(c, &mut sys);
    rmm(c, &mut mi);
    cross_thread_direct(c, pool.clone());
    cross_thread_direct(c, Mi);
    cross_thread_direct(c, Sys);
    cross_thread(c, pool);
    cross_thread(c, offset);
    cross_thread(c, tlsf);
    cross_thread(c, buddy);
}

criterion_group! {
    name = benches;
    config = Criterion::default().warm_up_time(std::time::Duration::from_millis(300)).measurement_time(std::time::Duration::from_secs(1));
    targets = all
}
criterion_main!(benches);
