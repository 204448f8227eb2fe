#![no_main]
//! See `npumem_fuzz::page_table` for what this target checks.
libfuzzer_sys::fuzz_target!(|data: &[u8]| npumem_fuzz::page_table::run(data));
