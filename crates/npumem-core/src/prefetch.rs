//! Cache hints: `prefetch` asks the CPU to start loading the line holding a value, so that a
//! batch that knows which records it will touch a few steps ahead (the pool's block records,
//! the device's live-table records) overlaps their cache misses with the work on the records
//! before them.
//!
//! Invariant: a hint never changes memory or program results, and never faults.

/// A hint to load the cache line at `p` (a no-op off x86_64).
#[inline(always)]
pub fn prefetch<T>(p: &T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: SSE is part of x86_64; a prefetch is a hint that never faults, and `p` is valid.
    unsafe {
        core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(p as *const T as *const i8)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}
