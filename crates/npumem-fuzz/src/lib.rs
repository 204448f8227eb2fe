//! Fuzz harnesses of npumem, one per target. Each `run(data)` decodes `data` with the
//! `arbitrary` crate into a structured input (an action sequence, a configuration, a planning
//! problem), drives npumem-core with it and checks the target's invariants, panicking with a
//! message when one fails. The cargo-fuzz targets in `fuzz/` call these functions, and
//! `tests/regressions.rs` replays every input kept under `fuzz/regressions/<target>/` through the
//! same functions on stable Rust, so a kept input means the same thing in both.
//!
//! Invariants: `run` never panics for a correct npumem-core, whatever the bytes; it decodes
//! bytes the same way on every toolchain (the `arbitrary` crate's format); it bounds every size
//! it derives from the input (device capacity, buffer counts, loop lengths) so that one input
//! runs in milliseconds — except where the target exists to check that npumem bounds a size
//! itself (the TLB geometry).

pub mod alloc_conf;
pub mod device;
pub mod graph;
pub mod page_table;
pub mod plan;
pub mod tlb;

/// A harness: decodes and checks one input.
pub type Harness = fn(&[u8]);

/// Decodes items until the input is used up (or `max` of them): every byte counts, where a
/// `Vec` from `arbitrary` would stop at the first byte that does not say "one more".
pub(crate) fn sequence<'a, T: arbitrary::Arbitrary<'a>>(u: &mut arbitrary::Unstructured<'a>, max: usize) -> Vec<T> {
    let mut items = Vec::new();
    while !u.is_empty() && items.len() < max {
        match T::arbitrary(u) {
            Ok(item) => items.push(item),
            Err(_) => break,
        }
    }
    items
}

/// Every target, by the name of its cargo-fuzz binary and of its regression directory.
pub const TARGETS: &[(&str, Harness)] = &[
    ("device_actions", device::run),
    ("page_table", page_table::run),
    ("alloc_conf", alloc_conf::run),
    ("plan_problem", plan::run),
    ("plan_graph", graph::run),
    ("tlb_config", tlb::run),
];
