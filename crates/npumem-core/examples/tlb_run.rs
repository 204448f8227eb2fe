//! A fixed TLB run, for instruction counts (`valgrind --tool=callgrind`) and profiles, which are
//! steadier than wall time on a shared machine.
//!
//! `cargo build --release -p npumem-core --example tlb_run`, then
//! `target/release/examples/tlb_run PRESET PAGE PATTERN [fast|reference]` with PAGE `4KiB` (over
//! 64 MiB) or `2MiB` (over 1 GiB) and PATTERN `streaming`, `strided`, `uniform` or `zipf`;
//! `ACCESSES` (default 16 Mi) accesses through the page table; `SPAN_MIB` sets the footprint
//! and `HOST` (`4KiB`, `2MiB` or `1GiB`) runs the preset as a guest over that host page size. Under callgrind, subtract a run
//! with half the accesses and divide by the difference for the instructions per access.

use std::time::Instant;

use npumem_core::units::{GIB, MIB};
use npumem_core::vm::tlb::HostConfig;
use npumem_core::vm::tlb::reference::ReferenceTlb;
use npumem_core::vm::{PageSize, PageTable, Tlb, TlbConfig};

const BASE: u64 = 0x1000_0000_0000;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |i: usize, default: &str| args.get(i).cloned().unwrap_or_else(|| default.to_string());
    let (preset, page, pattern, model) = (arg(0, "skylake"), arg(1, "2MiB"), arg(2, "uniform"), arg(3, "fast"));
    let n: u64 = std::env::var("ACCESSES").ok().and_then(|s| s.parse().ok()).unwrap_or(16 << 20);
    let (page, span) = match page.as_str() {
        "4KiB" => (PageSize::Size4K, 64 * MIB),
        "2MiB" => (PageSize::Size2M, GIB),
        other => fail(&format!("unknown page {other:?}: use 4KiB or 2MiB")),
    };
    let span = std::env::var("SPAN_MIB").ok().and_then(|s| s.parse::<u64>().ok()).map_or(span, |m| m * MIB);
    let mut pt = PageTable::new();
    for i in 0..span / page.bytes() {
        pt.map(BASE + i * page.bytes(), i * page.bytes(), page).expect("maps");
    }
    let mut x = 1u64;
    let mut next = move || {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        x >> 11
    };
    let pages = span / 4096;
    let addresses: Vec<u64> = match pattern.as_str() {
        "streaming" => (0..n).map(|i| BASE + i * 64 % span).collect(),
        "strided" => (0..n).map(|i| BASE + i * 4160 % span).collect(),
        "uniform" => (0..n).map(|_| BASE + next() % span).collect(),
        "zipf" => (0..n)
            .map(|_| {
                let u = next() as f64 / (1u64 << 53) as f64;
                let rank = ((u * (pages as f64).ln()).exp() as u64 - 1).min(pages - 1);
                BASE + rank.wrapping_mul(0x9E37_79B9_7F4A_7C15 | 1) % pages * 4096 + next() % 4096
            })
            .collect(),
        other => fail(&format!("unknown pattern {other:?}: use streaming, strided, uniform or zipf")),
    };
    let mut config = TlbConfig::preset(&preset).unwrap_or_else(|e| fail(&e.message));
    if let Ok(host) = std::env::var("HOST") {
        let page = match host.as_str() {
            "4KiB" => PageSize::Size4K,
            "2MiB" => PageSize::Size2M,
            "1GiB" => PageSize::Size1G,
            other => fail(&format!("unknown HOST {other:?}: use 4KiB, 2MiB or 1GiB")),
        };
        config.host = Some(HostConfig::with_page(page));
    }
    let (start, cpu) = (Instant::now(), thread_cpu_seconds());
    let walks = match model.as_str() {
        "fast" => {
            let mut tlb = Tlb::new(config).expect("valid preset");
            tlb.run(&addresses, |va| pt.translate(va));
            tlb.stats().walks
        }
        "reference" => {
            let mut tlb = ReferenceTlb::new(config).expect("valid preset");
            tlb.run(&addresses, |va| pt.translate(va));
            tlb.stats().walks
        }
        other => fail(&format!("unknown model {other:?}: use fast or reference")),
    };
    let (secs, cpu) = (start.elapsed().as_secs_f64(), thread_cpu_seconds() - cpu);
    println!(
        "{preset} {pattern} {model}: {n} accesses, {walks} walks, {:.1} M accesses/s ({:.1} M/s of CPU time)",
        n as f64 / secs / 1e6,
        n as f64 / cpu / 1e6
    );
}

/// CPU time of this thread (steadier than wall time on a loaded machine).
fn thread_cpu_seconds() -> f64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid timespec for clock_gettime to write.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

fn fail(message: &str) -> ! {
    eprintln!("{message}");
    std::process::exit(2)
}
