//! Per-allocation latency as the live set grows: for each
//! allocator family and each live-set size N, the cost of one operation of
//!
//! - `batch`: `malloc_many` of N 4 KiB blocks (`BATCH_SIZE` bytes if set), then `free_many` of
//!   them (2N operations);
//! - `churn`: with N blocks of mixed sizes held live, free a random one and allocate a new one
//!   (a long-running service whose pool has grown): ns per malloc + free pair. The victim of
//!   each step is drawn one step ahead and its slot of the benchmark's own vector of live
//!   pointers prefetched: a service that frees a tensor holds its pointer in hand, while at
//!   10^6 live blocks that 8 MB vector would add a cache miss per pair that is the benchmark's,
//!   not the allocator's (0.37 last-level misses a pair; docs/benchmarks.md). The
//!   allocator's own records for the victim stay as cold as in a service.
//!
//! `cargo build --release -p npumem-core --example flat_latency`, then
//! `target/release/examples/flat_latency [MODE] [N...] [-- FAMILIES]` (defaults: both modes,
//! N = 1000 100000 1000000, every family); times are the thread's CPU time. `REPEAT=k` measures
//! every size k times, the sizes taking turns, and prints each size's least time (the ratio then
//! compares the two ends at the same moments of a VM whose speed drifts). Instruction counts:
//! `OPS=... valgrind --tool=callgrind target/release/examples/flat_latency churn 1000000 npumem`.

use npumem_core::backend::SimConfig;
use npumem_core::prefetch::prefetch;
use npumem_core::units::GIB;
use npumem_core::{AllocatorKind, Device, DeviceConfig, Policy};

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

/// The sizes of the churn: 16 values from 512 B to 64 KiB (a service's tensors).
const SIZES: [u64; 16] =
    [512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768, 40960, 49152, 65536];

fn device(allocator: AllocatorKind) -> Device {
    let sim = SimConfig { capacity: 256 * GIB, ..Default::default() };
    Device::new(DeviceConfig { sim, allocator, ..Default::default() }).expect("device")
}

/// CPU time of this thread, in ns: steadier than wall time on a shared, loaded machine, where
/// other processes take turns on the cores.
fn cpu_ns() -> f64 {
    let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec through a valid pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
    t.tv_sec as f64 * 1e9 + t.tv_nsec as f64
}

/// ns (CPU time) per operation of the batch loop with `n` blocks.
fn batch(allocator: AllocatorKind, n: usize, ops: usize) -> f64 {
    let mut dev = device(allocator);
    let size = std::env::var("BATCH_SIZE").ok().and_then(|s| s.parse().ok()).unwrap_or(4096u64);
    let sizes = vec![size; n];
    let rounds = (ops / (2 * n)).max(2);
    // One warm round: the pool's pages and records exist before timing.
    let ptrs = dev.malloc_many(&sizes, Policy::HugeFirst, 0).expect("malloc_many");
    dev.free_many(&ptrs).expect("free_many");
    let start = cpu_ns();
    for _ in 0..rounds {
        let ptrs = dev.malloc_many(&sizes, Policy::HugeFirst, 0).expect("malloc_many");
        dev.free_many(&ptrs).expect("free_many");
    }
    (cpu_ns() - start) / (2 * n * rounds) as f64
}

/// ns (CPU time) per malloc + free pair with `n` blocks held live.
fn churn(allocator: AllocatorKind, n: usize, ops: usize) -> f64 {
    let mut dev = device(allocator);
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut live: Vec<u64> =
        (0..n).map(|_| dev.malloc(SIZES[(rng.next() % 16) as usize], Policy::HugeFirst).expect("fill")).collect();
    // The victim and the new size of the next step (drawn as the steps draw them).
    let draw = |rng: &mut Rng| ((rng.next() % n as u64) as usize, SIZES[(rng.next() % 16) as usize]);
    let mut next = draw(&mut rng);
    // Warm-up: the same churn, untimed, so the pool reaches its steady state.
    let step = |dev: &mut Device, live: &mut Vec<u64>, rng: &mut Rng, next: &mut (usize, u64)| {
        let (at, size) = std::mem::replace(next, draw(rng));
        prefetch(&live[next.0]);
        dev.free(live[at]).expect("free");
        live[at] = dev.malloc(size, Policy::HugeFirst).expect("malloc");
    };
    for _ in 0..ops.min(n) {
        step(&mut dev, &mut live, &mut rng, &mut next);
    }
    let start = cpu_ns();
    for _ in 0..ops {
        step(&mut dev, &mut live, &mut rng, &mut next);
    }
    (cpu_ns() - start) / ops as f64
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let split = args.iter().position(|a| a == "--").unwrap_or(args.len());
    let (head, families) = args.split_at(split);
    let modes: Vec<&str> = head.iter().map(String::as_str).filter(|a| a.parse::<usize>().is_err()).collect();
    let modes = if modes.is_empty() { vec!["batch", "churn"] } else { modes };
    let mut ns: Vec<usize> = head.iter().filter_map(|a| a.parse().ok()).collect();
    if ns.is_empty() {
        ns = vec![1_000, 100_000, 1_000_000];
    }
    let families: Vec<&str> = if families.len() > 1 {
        families[1..].iter().map(String::as_str).collect()
    } else {
        vec!["npumem", "pytorch", "torch_npu", "direct"]
    };
    let ops: usize = std::env::var("OPS").ok().and_then(|s| s.parse().ok()).unwrap_or(2_000_000);
    let repeat: usize = std::env::var("REPEAT").ok().and_then(|s| s.parse().ok()).unwrap_or(1).max(1);
    for mode in modes {
        for fam in &families {
            let kind = AllocatorKind::parse(fam).expect("family");
            // Each size measured `repeat` times, the sizes taking turns, and the least time kept
            // per size: on a VM whose speed drifts, both ends of the ratio see the same moments.
            let mut times = vec![f64::INFINITY; ns.len()];
            for _ in 0..repeat {
                for (t, &n) in times.iter_mut().zip(&ns) {
                    let ops = if *fam == "direct" { ops / 20 } else { ops };
                    let ns_op = if mode == "batch" { batch(kind, n, ops.max(2 * n)) } else { churn(kind, n, ops) };
                    *t = t.min(ns_op);
                }
            }
            let row: Vec<String> = ns.iter().zip(&times).map(|(n, t)| format!("{n}: {t:.1} ns")).collect();
            let ratio = times.last().unwrap_or(&0.0) / times.first().unwrap_or(&1.0);
            println!("{mode:<6} {fam:<10} {}  (largest / smallest: {ratio:.2}x)", row.join("  "));
        }
    }
}
