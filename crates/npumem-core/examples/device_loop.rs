//! A fixed loop of `Device` allocations, for instruction counts (`valgrind --tool=callgrind`)
//! and profiles, which are steadier than wall time on a shared machine.
//!
//! `cargo build --release -p npumem-core --example device_loop`, then
//! `OPS=4000000 valgrind --tool=callgrind target/release/examples/device_loop batch 1000`
//! (or `pair`): subtract a run with `OPS=2000000` and divide by 2,000,000 for the
//! instructions per operation without the device's set-up.

use std::time::Instant;

use npumem_core::backend::SimConfig;
use npumem_core::units::GIB;
use npumem_core::{Device, DeviceConfig, Policy};

fn main() -> npumem_core::Result<()> {
    let mut args = std::env::args().skip(1);
    let mode = args.next().unwrap_or_else(|| "batch".into());
    let live: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(1000).max(1);
    let ops: usize = std::env::var("OPS").ok().and_then(|s| s.parse().ok()).unwrap_or(20_000_000);
    let sim = SimConfig { capacity: 16 * GIB, ..Default::default() };
    let mut dev = Device::new(DeviceConfig { sim, ..Default::default() })?;
    let sizes = vec![4096u64; live];
    let start = Instant::now();
    match mode.as_str() {
        "batch" => {
            for _ in 0..ops / (2 * live) {
                let ptrs = dev.malloc_many(&sizes, Policy::HugeFirst, 0)?;
                dev.free_many(&ptrs)?;
            }
        }
        "pair" => {
            for _ in 0..ops / 2 {
                let p = dev.malloc(std::hint::black_box(4096), Policy::HugeFirst)?;
                dev.free(p)?;
            }
        }
        other => {
            eprintln!("unknown mode {other:?}: use batch or pair");
            std::process::exit(2);
        }
    }
    let ns = start.elapsed().as_nanos() as f64 / ops as f64;
    println!("{mode} with {live} live: {ns:.1} ns/op, {:.1} M ops/s", 1e3 / ns);
    Ok(())
}
