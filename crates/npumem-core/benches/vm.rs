//! Criterion benches of the vm layer: the buddy frame allocator against a named peer
//! (`buddy_system_allocator::FrameAllocator`, the buddy allocator of the rCore kernel family),
//! the page table's map/unmap/translate, and the TLB model's simulated accesses per second.
//!
//! Run: `cargo bench -p npumem-core --bench vm` (results in docs/benchmarks.md).

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use npumem_core::units::{GIB, KIB, MIB};
use npumem_core::vm::{FrameAllocator, PageSize, PageTable};

const FRAMES: usize = 4096;

fn frames(c: &mut Criterion) {
    let mut g = c.benchmark_group("frames: alloc 4096 x 4KiB then free");
    g.bench_function("npumem FrameAllocator", |b| {
        let mut fa = FrameAllocator::new(4 * GIB, 4 * KIB, 0).unwrap();
        let mut got = Vec::with_capacity(FRAMES);
        b.iter(|| {
            for _ in 0..FRAMES {
                got.push(fa.alloc(4 * KIB).unwrap());
            }
            // Free in an interleaved order so buddies merge late, as after real churn.
            for parity in [0, 1] {
                for (i, &pa) in got.iter().enumerate() {
                    if i % 2 == parity {
                        fa.free(black_box(pa)).unwrap();
                    }
                }
            }
            got.clear();
        });
    });
    g.bench_function("peer buddy_system_allocator", |b| {
        let mut fa = buddy_system_allocator::FrameAllocator::<32>::new();
        fa.add_frame(0, (4 * GIB / (4 * KIB)) as usize);
        let mut got = Vec::with_capacity(FRAMES);
        b.iter(|| {
            for _ in 0..FRAMES {
                got.push(fa.alloc(1).unwrap());
            }
            for parity in [0, 1] {
                for (i, &f) in got.iter().enumerate() {
                    if i % 2 == parity {
                        fa.dealloc(black_box(f), 1);
                    }
                }
            }
            got.clear();
        });
    });
    g.finish();
}

fn page_table(c: &mut Criterion) {
    const BASE: u64 = 0x1000_0000_0000;
    let mut g = c.benchmark_group("page table");
    g.bench_function("map+unmap 512 x 4KiB", |b| {
        let mut pt = PageTable::new();
        b.iter(|| {
            for i in 0..512u64 {
                pt.map(BASE + i * 4096, i * 4096, PageSize::Size4K).unwrap();
            }
            for i in 0..512u64 {
                pt.unmap(BASE + i * 4096, PageSize::Size4K).unwrap();
            }
        });
    });
    g.bench_function("map+unmap 1 x 2MiB", |b| {
        let mut pt = PageTable::new();
        b.iter(|| {
            pt.map(BASE, 2 * MIB, PageSize::Size2M).unwrap();
            pt.unmap(BASE, PageSize::Size2M).unwrap();
        });
    });
    let mut pt = PageTable::new();
    for i in 0..(64 * MIB / 4096) {
        pt.map(BASE + i * 4096, i * 4096, PageSize::Size4K).unwrap();
    }
    g.bench_function("translate (4KiB leaf, depth 4)", |b| {
        let mut va = BASE;
        b.iter(|| {
            va = BASE + (va.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407) % (64 * MIB));
            black_box(pt.translate(va))
        });
    });
    g.finish();
}

fn tlb(c: &mut Criterion) {
    use criterion::Throughput;
    use npumem_core::vm::{Tlb, TlbConfig, Translation};
    const BASE: u64 = 0x1000_0000_0000;
    const N: u64 = 1 << 20;
    let mut pt = PageTable::new();
    for i in 0..(64 * MIB / 4096) {
        pt.map(BASE + i * 4096, i * 4096, PageSize::Size4K).unwrap();
    }
    let translate = |va: u64| -> Option<Translation> { pt.translate(va) };
    let mut g = c.benchmark_group("tlb (zen4 preset, 4 KiB pages)");
    g.throughput(Throughput::Elements(N));
    let streaming: Vec<u64> = (0..N).map(|i| BASE + i * 64 % (64 * MIB)).collect();
    g.bench_function("streaming, 64 B steps", |b| {
        let mut tlb = Tlb::new(TlbConfig::preset("zen4").unwrap()).unwrap();
        b.iter(|| tlb.run(black_box(&streaming), translate));
    });
    let mut x = 1u64;
    let random: Vec<u64> = (0..N)
        .map(|_| {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            BASE + (x >> 20) % (64 * MIB)
        })
        .collect();
    g.bench_function("uniform random over 64 MiB", |b| {
        let mut tlb = Tlb::new(TlbConfig::preset("zen4").unwrap()).unwrap();
        b.iter(|| tlb.run(black_box(&random), translate));
    });
    g.finish();
}

criterion_group!(benches, frames, page_table, tlb);
criterion_main!(benches);
