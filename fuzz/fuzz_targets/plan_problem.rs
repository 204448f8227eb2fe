#![no_main]
//! See `npumem_fuzz::plan` for what this target checks.
libfuzzer_sys::fuzz_target!(|data: &[u8]| npumem_fuzz::plan::run(data));
