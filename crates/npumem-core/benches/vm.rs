//! Criterion benches of the vm layer: the buddy frame allocator against a named peer
//! (`buddy_system_allocator::FrameAllocator`, the buddy allocator of the rCore kernel family),
//! the page table's map/unmap/translate, and the TLB model's simulated accesses per second.
//!
//! Run: `cargo bench -p npumem-core --bench vm` (results in docs/benchmarks.md).

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use npumem_core::units::{GIB, KIB, MIB, format_size};
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

/// Address streams of `n` accesses over `span` bytes from `base`: streaming (64 B steps),
/// strided (one access per 4 KiB page + 64 B, so every access is on a new 4 KiB page), uniform
/// random, and Zipf-distributed pages (s = 1, by inverting the log-uniform distribution of
/// ranks; ranks scattered over the pages by an odd multiplier) at random offsets.
fn tlb_streams(base: u64, span: u64, n: u64) -> Vec<(&'static str, Vec<u64>)> {
    let mut x = 1u64;
    let mut next = move || {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        x >> 11
    };
    let pages = span / 4096;
    let zipf = |u: u64| -> u64 {
        let rank = ((u as f64 / (1u64 << 53) as f64) * (pages as f64).ln()).exp() as u64 - 1;
        (rank.min(pages - 1).wrapping_mul(0x9E37_79B9_7F4A_7C15 | 1)) % pages
    };
    vec![
        ("streaming, 64 B steps", (0..n).map(|i| base + i * 64 % span).collect()),
        ("strided, 4 KiB + 64 B", (0..n).map(|i| base + i * 4160 % span).collect()),
        ("uniform random", (0..n).map(|_| base + next() % span).collect()),
        ("Zipf pages (s = 1)", (0..n).map(|_| base + zipf(next()) * 4096 + next() % 4096).collect()),
    ]
}

/// The TLB model against its reference (`ReferenceTlb`, linear scans), on 4 KiB pages (zen4, 64 MiB) and 2 MiB pages (skylake, 1 GiB).
fn tlb(c: &mut Criterion) {
    use criterion::Throughput;
    use npumem_core::vm::tlb::reference::ReferenceTlb;
    use npumem_core::vm::{Tlb, TlbConfig, Translation};
    const BASE: u64 = 0x1000_0000_0000;
    const N: u64 = 1 << 20;
    for (preset, page, span) in [("zen4", PageSize::Size4K, 64 * MIB), ("skylake", PageSize::Size2M, GIB)] {
        let mut pt = PageTable::new();
        for i in 0..span / page.bytes() {
            pt.map(BASE + i * page.bytes(), i * page.bytes(), page).unwrap();
        }
        let translate = |va: u64| -> Option<Translation> { pt.translate(va) };
        let mut g = c.benchmark_group(format!("tlb ({preset}, {} pages over {})", page.label(), format_size(span)));
        g.throughput(Throughput::Elements(N));
        for (name, addresses) in tlb_streams(BASE, span, N) {
            g.bench_function(name, |b| {
                let mut tlb = Tlb::new(TlbConfig::preset(preset).unwrap()).unwrap();
                b.iter(|| tlb.run(black_box(&addresses), translate));
            });
            g.bench_function(format!("{name} (reference model)"), |b| {
                let mut tlb = ReferenceTlb::new(TlbConfig::preset(preset).unwrap()).unwrap();
                b.iter(|| tlb.run(black_box(&addresses), translate));
            });
        }
        g.finish();
    }
}

criterion_group!(benches, frames, page_table, tlb);
criterion_main!(benches);
