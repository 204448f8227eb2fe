//! A replay of a synthetic trace through `Device::replay_chunk`, for the replay rate
//! (events per second) and instruction counts (`valgrind --tool=callgrind`).
//!
//! `cargo build --release -p npumem-core --example replay_loop`, then
//! `[BASELINE=1] target/release/examples/replay_loop [EVENTS] [LIVE] [SHAPE] [ALLOCATOR]`: a trace of
//! EVENTS events (default 10,000,000) holding about LIVE blocks (default 2,000), replayed once
//! on a fresh 64 GiB simulated device. SHAPE `training` is training steps of a model with fixed
//! shapes (`training`); a number is a seeded random churn whose sizes come from that many
//! distinct values (default 64, log-uniform from 512 B to 4 MiB; 0: every size random). With
//! BASELINE set, the same events made one by one (`malloc` / `free`) on a fresh device follow,
//! and the ratio of their CPU times.

use std::time::Instant;

use npumem_core::backend::SimConfig;
use npumem_core::device::{Replay, ReplayEvents};
use npumem_core::units::GIB;
use npumem_core::{AllocatorKind, Device, DeviceConfig, Policy};

/// xorshift64*: a seeded stream of u64s.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A log-uniform size from 512 B to 4 MiB.
    fn size(&mut self) -> u64 {
        let bits = 9.0 + (self.next() % 1_000_000) as f64 / 1_000_000.0 * 13.0;
        2f64.powf(bits) as u64
    }
}

/// `(is_alloc, id, size)` events keeping about `live` blocks live, every block freed by the end.
pub fn trace(events: usize, live: usize, sizes: usize, seed: u64) -> Vec<(bool, u64, u64)> {
    let mut rng = Rng(seed | 1);
    let table: Vec<u64> = (0..sizes).map(|_| rng.size()).collect();
    let mut out = Vec::with_capacity(events);
    let mut held: Vec<(u64, u64)> = Vec::new();
    let mut next_id = 0u64;
    while out.len() + held.len() < events {
        let grow = held.len() < live / 2 || (held.len() < 2 * live && rng.next() % 2 == 0);
        if grow {
            let size = if table.is_empty() { rng.size() } else { table[(rng.next() % table.len() as u64) as usize] };
            out.push((true, next_id, size));
            held.push((next_id, size));
            next_id += 1;
        } else {
            let at = (rng.next() % held.len() as u64) as usize;
            let (id, size) = held.swap_remove(at);
            out.push((false, id, size));
        }
    }
    out.extend(held.into_iter().map(|(id, size)| (false, id, size)));
    out
}

/// CPU time of this thread (the replay runs on it): steadier than wall time on a shared
/// machine, where other processes take turns on the cores.
fn cpu_seconds() -> f64 {
    let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec through a valid pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
    t.tv_sec as f64 + t.tv_nsec as f64 * 1e-9
}

/// Training steps of a model of `layers` layers with fixed shapes: each layer's forward keeps
/// four activations and makes a temporary; the backward pass makes two gradient temporaries
/// per layer and releases that layer's activations, in reverse. About `4 * layers` blocks live
/// at the peak; sizes from 8 shapes (64 KiB to 8 MiB).
pub fn training(events: usize, layers: usize) -> Vec<(bool, u64, u64)> {
    const SHAPES: [u64; 8] = [64 << 10, 192 << 10, 256 << 10, 768 << 10, 1 << 20, 3 << 20, 4 << 20, 8 << 20];
    let mut out = Vec::with_capacity(events + 16 * layers);
    let mut next = 0u64;
    let mut alloc = |out: &mut Vec<(bool, u64, u64)>, size: u64| {
        out.push((true, next, size));
        next += 1;
        (next - 1, size)
    };
    while out.len() < events {
        let mut saved = Vec::with_capacity(layers);
        for l in 0..layers {
            let keep: Vec<(u64, u64)> = (0..4).map(|i| alloc(&mut out, SHAPES[(l + i) % 8])).collect();
            let tmp = alloc(&mut out, SHAPES[(l + 5) % 8]);
            out.push((false, tmp.0, tmp.1));
            saved.push(keep);
        }
        for (l, keep) in saved.into_iter().enumerate().rev() {
            let g1 = alloc(&mut out, SHAPES[(l + 2) % 8]);
            let g2 = alloc(&mut out, SHAPES[(l + 3) % 8]);
            out.push((false, g1.0, g1.1));
            out.push((false, g2.0, g2.1));
            out.extend(keep.into_iter().rev().map(|(id, size)| (false, id, size)));
        }
    }
    out
}

/// The events one by one with `malloc` / `free` and a hash map from id to pointer (what
/// `replay_events` did before `replay_chunk`), on a fresh device: CPU seconds.
fn one_by_one(allocator: AllocatorKind, trace: &[(bool, u64, u64)]) -> npumem_core::Result<f64> {
    let mut dev = device(allocator)?;
    let cpu = cpu_seconds();
    let mut live: rustc_hash::FxHashMap<u64, u64> = rustc_hash::FxHashMap::default();
    for &(is_alloc, id, size) in trace {
        if is_alloc {
            live.insert(id, dev.malloc(size, Policy::HugeFirst)?);
        } else if let Some(p) = live.remove(&id) {
            dev.free(p)?;
        }
    }
    Ok(cpu_seconds() - cpu)
}

fn device(allocator: AllocatorKind) -> npumem_core::Result<Device> {
    let sim = SimConfig { capacity: 64 * GIB, ..Default::default() };
    Device::new(DeviceConfig { sim, allocator, ..Default::default() })
}

fn main() -> npumem_core::Result<()> {
    let mut args = std::env::args().skip(1);
    let events: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(10_000_000);
    let live: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(2_000).max(1);
    let shape = args.next().unwrap_or_else(|| "64".into());
    let allocator = AllocatorKind::parse(&args.next().unwrap_or_else(|| "npumem".into()))?;
    let trace = match shape.parse::<usize>() {
        Ok(sizes) => trace(events, live, sizes, 7),
        Err(_) => training(events, live / 4),
    };
    let mut dev = device(allocator)?;
    // The trace as the columns a caller holds (what the Python binding passes in).
    let is_alloc: Vec<u8> = trace.iter().map(|e| e.0 as u8).collect();
    let ids: Vec<u64> = trace.iter().map(|e| e.1).collect();
    let sizes: Vec<u64> = trace.iter().map(|e| e.2).collect();
    let events = ReplayEvents { is_alloc: &is_alloc, ids: &ids, sizes: &sizes, streams: None };
    let (start, cpu) = (Instant::now(), cpu_seconds());
    let mut replay = Replay::new(ids.iter().max().map_or(0, |m| m + 1), ids.len() as u64, 0);
    dev.replay_chunk(&mut replay, events, Policy::HugeFirst, false)?;
    let out = replay.finish();
    let (s, c) = (start.elapsed().as_secs_f64(), cpu_seconds() - cpu);
    let rate = |t: f64| trace.len() as f64 / t / 1e6;
    let base = if std::env::var_os("BASELINE").is_some() { Some(one_by_one(allocator, &trace)?) } else { None };
    println!(
        "{} events ({} allocs, {} OOMs, peak live {} B): {s:.3} s wall ({:.2} M events/s), {c:.3} s CPU ({:.2} M events/s){}",
        trace.len(),
        out.allocs,
        out.ooms,
        out.peak_live,
        rate(s),
        rate(c),
        base.map_or(String::new(), |b| format!("; one by one: {:.2} M events/s CPU ({:.2}x)", rate(b), b / c)),
    );
    Ok(())
}
