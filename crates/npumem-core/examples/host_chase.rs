//! Host pointer-chase latency over growing footprints, with 4 KiB pages and with transparent huge
//! pages, from Rust (`npumem tlb validate` measures the same chase from Python, THP verified).
//!
//! One 64-byte line per 4 KiB page is visited in a random cycle (as test-tlb does), so the data
//! fits the caches long after the translations stop fitting the TLBs; the latency knees are then
//! the TLB's. Prints `footprint_bytes,page,ns_per_access` lines.
//!
//! Run: `cargo run --release -p npumem-core --example host_chase [max_footprint_mib]`

use std::time::Instant;

const PAGE: usize = 4096;

/// A 2 MiB-aligned anonymous mapping, with transparent huge pages asked for or refused.
fn map(bytes: usize, huge: bool) -> &'static mut [u64] {
    let len = bytes.div_ceil(2 << 20) * (2 << 20);
    // SAFETY: an anonymous private mapping of `len` bytes; checked for failure below.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert!(ptr != libc::MAP_FAILED, "mmap of {len} bytes failed");
    let advice = if huge { libc::MADV_HUGEPAGE } else { libc::MADV_NOHUGEPAGE };
    // SAFETY: `ptr` is the start of the mapping just made, `len` its length.
    unsafe { libc::madvise(ptr, len, advice) };
    // SAFETY: the mapping is `len` bytes of zeroed, writable memory owned by this program for its
    // whole run (never unmapped), aligned for u64.
    unsafe { std::slice::from_raw_parts_mut(ptr.cast::<u64>(), len / 8) }
}

fn chase(bytes: usize, huge: bool) -> f64 {
    let mem = map(bytes, huge);
    let pages = bytes / PAGE;
    // A random cyclic order of the pages (xorshift Fisher-Yates), one line per page.
    let mut order: Vec<usize> = (0..pages).collect();
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    for i in (1..pages).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        order.swap(i, (x % (i as u64 + 1)) as usize);
    }
    let slot = |p: usize| p * PAGE / 8 + (p * 7 % (PAGE / 64)) * 8;
    for w in 0..pages {
        mem[slot(order[w])] = slot(order[(w + 1) % pages]) as u64;
    }
    let steps = (4 * pages).max(2_000_000);
    let mut at = slot(order[0]);
    for _ in 0..pages {
        at = mem[at] as usize; // warm up
    }
    let t0 = Instant::now();
    for _ in 0..steps {
        at = mem[at] as usize;
    }
    let ns = t0.elapsed().as_nanos() as f64 / steps as f64;
    std::hint::black_box(at);
    ns
}

fn main() {
    let max_mib: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(1024);
    println!("footprint_bytes,page,ns_per_access");
    for huge in [false, true] {
        let mut bytes = 64 * 1024;
        while bytes <= max_mib << 20 {
            let ns = chase(bytes, huge);
            println!("{bytes},{},{ns:.3}", if huge { "thp" } else { "4KiB" });
            bytes *= 2;
        }
    }
}
