#![no_main]
//! See `npumem_fuzz::alloc_conf` for what this target checks.
libfuzzer_sys::fuzz_target!(|data: &[u8]| npumem_fuzz::alloc_conf::run(data));
