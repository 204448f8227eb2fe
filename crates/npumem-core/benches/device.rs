//! Criterion benches of the `Device` fast path: one `malloc`+`free` pair of 4 KiB on
//! the simulated device with the npumem pool, and the batch calls `malloc_many` / `free_many`
//! over 1,000 and 100,000 blocks, against a cached 4 KiB `malloc`+`free` pair of the system
//! allocator and of mimalloc in the same run.
//!
//! Run: `cargo bench -p npumem-core --bench device` (results in docs/benchmarks.md).

use std::alloc::{GlobalAlloc, Layout};
use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use npumem_core::backend::SimConfig;
use npumem_core::units::GIB;
use npumem_core::{Device, DeviceConfig, Policy};

fn device() -> Device {
    let sim = SimConfig { capacity: 16 * GIB, ..Default::default() };
    Device::new(DeviceConfig { sim, ..Default::default() }).unwrap()
}

fn pair(c: &mut Criterion) {
    let mut g = c.benchmark_group("device: 4 KiB malloc+free pair");
    g.bench_function("npumem Device", |b| {
        let mut d = device();
        b.iter(|| {
            let p = d.malloc(black_box(4096), Policy::HugeFirst).unwrap();
            d.free(black_box(p)).unwrap();
        });
    });
    g.bench_function("peer system malloc", |b| {
        b.iter(|| unsafe {
            // SAFETY: a fresh block of 4096 bytes is freed once, right after.
            let p = libc::malloc(black_box(4096));
            libc::free(black_box(p));
        });
    });
    g.bench_function("peer mimalloc", |b| {
        let layout = Layout::from_size_align(4096, 64).unwrap();
        b.iter(|| unsafe {
            // SAFETY: as above, through mimalloc's GlobalAlloc with the same layout both ways.
            let p = mimalloc::MiMalloc.alloc(black_box(layout));
            mimalloc::MiMalloc.dealloc(black_box(p), layout);
        });
    });
    g.finish();
}

fn batch(c: &mut Criterion) {
    for live in [1_000usize, 100_000] {
        let mut g = c.benchmark_group(format!("device: malloc_many+free_many of {live} x 4 KiB"));
        g.throughput(Throughput::Elements(2 * live as u64));
        g.sample_size(20);
        let sizes = vec![4096u64; live];
        g.bench_function("npumem Device", |b| {
            let mut d = device();
            b.iter(|| {
                let ptrs = d.malloc_many(black_box(&sizes), Policy::HugeFirst, 0).unwrap();
                d.free_many(&ptrs).unwrap();
            });
        });
        g.finish();
    }
}

criterion_group!(benches, pair, batch);
criterion_main!(benches);
