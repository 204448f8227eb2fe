//! The recency order of a narrow LRU set packed in one word.
//!
//! - Ways are 4-bit lanes, most recent in the low bits; at most 16 ways.
//! - Each way of the set appears in the order exactly once.

/// The recency order of a narrow LRU set: its ways (4 bits each, so at most 16) from the most
/// recent in the low bits to the least recent at bits `4 * (ways - 1)`; bits above are unused.
pub(super) struct Order;

/// A nibble of ones in every 4-bit lane.
const NIBBLES_1: u64 = 0x1111_1111_1111_1111;

impl Order {
    /// The order of an empty set: `ways - 1` most recent, way 0 least recent (filled first).
    pub(super) fn initial(ways: usize) -> u64 {
        (0..ways as u64).fold(0, |order, w| order | w << (4 * (ways as u64 - 1 - w)))
    }

    /// The least recent way.
    #[inline(always)]
    pub(super) fn least_recent(order: u64, ways: usize) -> usize {
        ((order >> (4 * (ways - 1))) & 15) as usize
    }

    /// `order` after a fill of its least recent way `way`: every way moves back one place and
    /// `way` goes to the front.
    #[inline(always)]
    pub(super) fn refill(order: u64, way: u64, ways: usize) -> u64 {
        // Shifting by 4 * ways would overflow at 16 ways: shift twice.
        let live = !((u64::MAX << (4 * (ways - 1))) << 4);
        ((order << 4) & live) | way
    }

    /// `order` after a use of `way` (present in it): `way` moves to the front, the ways before
    /// it back one place.
    #[inline(always)]
    pub(super) fn touch(order: u64, way: u64) -> u64 {
        // The lowest zero nibble of order ^ (way in every lane) is `way`'s place (the classic
        // has-zero-byte test, exact for the lowest lane).
        let x = order ^ way.wrapping_mul(NIBBLES_1);
        let zeros = x.wrapping_sub(NIBBLES_1) & !x & (NIBBLES_1 << 3);
        // Every bit up to the lowest flag (`way`'s lane and those before it; one BLSMSK where
        // BMI1 is enabled): the lanes before `way` move up one, `way` lands in lane 0, those
        // after it stay. `way` is in the order, so a flag is set.
        let through = zeros ^ zeros.wrapping_sub(1);
        (order & !through) | ((order << 4) & through) | way
    }
}
