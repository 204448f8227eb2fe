#![no_main]
//! See `npumem_fuzz::graph` for what this target checks.
libfuzzer_sys::fuzz_target!(|data: &[u8]| npumem_fuzz::graph::run(data));
