//! Size classes of the host pool: 64-byte steps up to 256 B, then four classes per doubling
//! (at most 25% internal waste, as jemalloc's spacing).
//!
//! Invariants: `class_of(size)` is the smallest class whose size is at least `size`;
//! `size_of(class_of(s)) >= s`; class sizes are multiples of 64 and strictly increasing.

/// The smallest block and the unit of block indices.
pub const MIN_BLOCK: u64 = 64;

/// The class of `size` bytes (`size >= 1`).
pub fn class_of(size: u64) -> usize {
    if size <= 256 {
        return (size.max(1).div_ceil(64) - 1) as usize; // 0..=3
    }
    // size in (2^p, 2^(p+1)], p >= 8: four steps of 2^(p-2).
    let p = 63 - (size - 1).leading_zeros() as u64; // floor(log2(size - 1))
    let step = 1u64 << (p - 2);
    let k = (size - 1 - (1 << p)) / step; // 0..=3
    (4 + (p - 8) * 4 + k) as usize
}

/// The block size of `class`.
pub fn size_of(class: usize) -> u64 {
    if class < 4 {
        return 64 * (class as u64 + 1);
    }
    let p = (class as u64 - 4) / 4 + 8;
    let k = (class as u64 - 4) % 4;
    (1u64 << p) + (k + 1) * (1u64 << (p - 2))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_are_tight_and_increasing() {
        assert_eq!((size_of(0), size_of(3), size_of(4), size_of(7), size_of(8)), (64, 256, 320, 512, 640));
        let mut prev = 0;
        for c in 0..100 {
            assert!(size_of(c) > prev && size_of(c) % 64 == 0);
            assert_eq!(class_of(size_of(c)), c);
            assert_eq!(class_of(size_of(c) + 1), c + 1);
            prev = size_of(c);
        }
        for s in [1u64, 63, 64, 65, 4096, 4097, 1 << 20, (1 << 20) + 1, 64 << 20, 3 << 30] {
            let c = class_of(s);
            assert!(size_of(c) >= s && (c == 0 || size_of(c - 1) < s), "{s}");
            assert!(size_of(c) as f64 <= s as f64 * 1.25 + 64.0, "{s}: {}", size_of(c));
        }
    }
}
