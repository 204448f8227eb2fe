//! `VaSpace`: the device virtual address window and its reservations.
//!
//! The same structure serves as the sub-allocator of address ranges inside a pool's VA
//! reservation, with a finer granule (`VaSpace::with_granule`).
//!
//! Invariants: reservations lie inside the window, never overlap, start at a multiple of their
//! alignment and have a non-zero length that is a multiple of the granule (4 KiB by default);
//! free extents are kept coalesced (no two free extents touch), so `free + reserved == window
//! size` always holds. Placement is best fit by length, lowest address among equals, in
//! O(log n). Reservations are found by start address in a hash map (O(1): a pool's
//! sub-allocator holds one per live block, up to millions); the address-ordered index that
//! "which reservation contains this address" needs is kept only by spaces that ask for it
//! (`with_containment_index`), and when present holds exactly the hash map's entries. A space
//! whose owner keeps every reservation's length itself (a pool: its block records and waiting
//! stacks know each block's size) keeps no reservation map at all (`untracked`): it is released
//! with `release_range`, which checks that the range lies wholly outside the free extents
//! (touching them at most), and its `reserved` is empty. At 10^6 live blocks that map is 16 MB
//! of hash table whose probes miss the cache on every reserve and release.

use std::collections::{BTreeMap, BTreeSet};

use rustc_hash::FxHashMap;

use super::{VA_WINDOW_END, VA_WINDOW_START};
use crate::error::{AclError, Result};
use crate::units::{KIB, checked_align_up, format_size};

/// The smallest unit of VA that is handed out.
pub const VA_GRANULE: u64 = 4 * KIB;

/// The device virtual address window.
#[derive(Debug)]
pub struct VaSpace {
    /// What the range is, for error messages.
    name: &'static str,
    granule: u64,
    start: u64,
    end: u64,
    /// Free extents by start address → length.
    free_by_addr: BTreeMap<u64, u64>,
    /// Free extents ordered by (length, start), for best fit.
    free_by_len: BTreeSet<(u64, u64)>,
    /// Live reservations by start address → length (empty in an `untracked` space).
    reserved: FxHashMap<u64, u64>,
    /// Whether `reserved` records the reservations (see `untracked`).
    tracked: bool,
    /// The same, ordered by address, where `reservation_containing` is asked often.
    by_addr: Option<BTreeMap<u64, u64>>,
    reserved_bytes: u64,
}

impl Default for VaSpace {
    fn default() -> Self {
        Self::new(VA_WINDOW_START, VA_WINDOW_END)
    }
}

impl VaSpace {
    /// A window `[start, end)` handed out in 4 KiB granules; both ends must be granule-aligned.
    pub fn new(start: u64, end: u64) -> Self {
        Self::with_granule(start, end, VA_GRANULE, "device virtual address window")
    }

    /// A range handed out in units of `granule` (a power of two dividing both ends), called
    /// `name` in error messages.
    pub fn with_granule(start: u64, end: u64, granule: u64, name: &'static str) -> Self {
        assert!(granule.is_power_of_two() && start < end && start % granule == 0 && end % granule == 0);
        let mut va = VaSpace {
            name,
            granule,
            start,
            end,
            free_by_addr: BTreeMap::new(),
            free_by_len: BTreeSet::new(),
            reserved: FxHashMap::default(),
            tracked: true,
            by_addr: None,
            reserved_bytes: 0,
        };
        va.insert_free(start, end - start);
        va
    }

    /// The space with an address-ordered index of its reservations, so that
    /// `reservation_containing` takes O(log n) instead of a scan of every reservation.
    pub fn with_containment_index(mut self) -> Self {
        self.by_addr = Some(self.reserved.iter().map(|(&s, &l)| (s, l)).collect());
        self
    }

    /// The space without a record of its reservations: its owner keeps their lengths and
    /// releases them with `release_range` (`release`, `reservation_at` and
    /// `reservation_containing` then know none). Call before the first reservation.
    pub fn untracked(mut self) -> Self {
        debug_assert!(self.reserved.is_empty() && self.by_addr.is_none());
        self.tracked = false;
        self
    }

    pub fn window(&self) -> (u64, u64) {
        (self.start, self.end)
    }

    pub fn granule(&self) -> u64 {
        self.granule
    }

    /// Free extents in address order, as (start, len).
    pub fn free_extents(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.free_by_addr.iter().map(|(&s, &l)| (s, l))
    }

    /// Free extents of at least `min_len` bytes, shortest first (lowest address among equals),
    /// as (start, len).
    pub fn free_extents_by_len(&self, min_len: u64) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.free_by_len.range((min_len, 0)..).map(|&(len, start)| (start, len))
    }

    /// The free extents overlapping `[lo, hi)`, clipped to it, in address order.
    pub fn free_extents_in(&self, lo: u64, hi: u64) -> Vec<(u64, u64)> {
        let mut out: Vec<(u64, u64)> = self
            .free_by_addr
            .range(..hi)
            .rev()
            .take_while(|&(&s, &l)| s + l > lo)
            .map(|(&s, &l)| (s.max(lo), (s + l).min(hi) - s.max(lo)))
            .collect();
        out.reverse();
        out
    }

    pub fn reserved_bytes(&self) -> u64 {
        self.reserved_bytes
    }

    /// The live reservations (none recorded in an `untracked` space).
    pub fn reservation_count(&self) -> usize {
        self.reserved.len()
    }

    /// The largest free extent (not counting alignment losses).
    pub fn largest_free(&self) -> u64 {
        self.free_by_len.last().map_or(0, |&(len, _)| len)
    }

    /// Reserves `size` bytes aligned to `align` (a power of two ≥ the granule; `size` is rounded
    /// up to a multiple of the granule). Returns the start address.
    pub fn reserve(&mut self, size: u64, align: u64) -> Result<u64> {
        let size = self.check_request(size, align)?;
        // Best fit: the shortest extents first; the first that fits after alignment wins. The
        // scan is bounded: past a few candidates, take the shortest extent of at least
        // `size + align - granule` bytes, which always fits whatever its alignment.
        const SCAN: usize = 32;
        let fits = |&(len, start): &(u64, u64)| {
            let aligned = checked_align_up(start, align)?;
            (aligned.checked_add(size)? <= start + len).then_some((start, len, aligned))
        };
        let mut found = self.free_by_len.range((size, 0)..).take(SCAN).find_map(fits);
        if found.is_none() {
            let sure = size.saturating_add(align - self.granule);
            found = self.free_by_len.range((sure, 0)..).next().and_then(fits);
        }
        let Some((start, len, aligned)) = found else {
            return Err(AclError::oom(format!(
                "the {} has no free range of {} aligned to {} (largest free extent {}); free \
                 what you no longer need",
                self.name,
                format_size(size),
                format_size(align),
                format_size(self.largest_free())
            )));
        };
        self.carve(start, len, aligned, size);
        Ok(aligned)
    }

    /// Reserves exactly `[addr, addr + size)`, as `aclrtReserveMemAddress` does with `expectPtr`.
    pub fn reserve_at(&mut self, addr: u64, size: u64, align: u64) -> Result<u64> {
        let size = self.check_request(size, align)?;
        if addr % align != 0 {
            return Err(AclError::invalid_param(format!(
                "the expected address {addr:#x} is not aligned to {}; pass an aligned address or 0",
                format_size(align)
            )));
        }
        let hit = self.free_by_addr.range(..=addr).next_back().map(|(&s, &l)| (s, l));
        match hit {
            Some((start, len)) if addr.checked_add(size).is_some_and(|e| e <= start + len) => {
                self.carve(start, len, addr, size);
                Ok(addr)
            }
            _ => Err(AclError::invalid_param(format!(
                "the range {addr:#x}+{} is not free inside the device window {:#x}..{:#x}; \
                 pass 0 to let the runtime choose",
                format_size(size),
                self.start,
                self.end
            ))),
        }
    }

    /// Releases the reservation that starts at `addr`, returning its length.
    pub fn release(&mut self, addr: u64) -> Result<u64> {
        let Some(len) = self.reserved.remove(&addr) else {
            return Err(AclError::invalid_param(format!(
                "{addr:#x} is not the start of a virtual address reservation; pass the address \
                 that reserve returned"
            )));
        };
        if let Some(by_addr) = &mut self.by_addr {
            by_addr.remove(&addr);
        }
        self.free_range(addr, len)?;
        Ok(len)
    }

    /// Releases `[addr, addr + len)`, reserved as one range or as several neighbouring ones: in
    /// an `untracked` space, where the owner knows the lengths. In a tracked space `addr` must
    /// start a reservation of exactly `len` bytes. Fails, changing nothing, where the range
    /// leaves the window or overlaps free space.
    pub fn release_range(&mut self, addr: u64, len: u64) -> Result<()> {
        if self.tracked {
            return match self.reservation_at(addr) {
                Some(l) if l == len => self.release(addr).map(|_| ()),
                _ => Err(self.not_reserved(addr, len)),
            };
        }
        if len == 0 || len % self.granule != 0 || addr < self.start || addr.saturating_add(len) > self.end {
            return Err(self.not_reserved(addr, len));
        }
        self.free_range(addr, len)
    }

    fn not_reserved(&self, addr: u64, len: u64) -> AclError {
        AclError::invalid_param(format!(
            "{addr:#x}+{} is not a reserved range of the {}; release what reserve returned",
            format_size(len),
            self.name
        ))
    }

    /// Gives `[addr, addr + len)` back to the free extents, coalesced with the free extents it
    /// touches; fails, changing nothing, where it overlaps one.
    fn free_range(&mut self, addr: u64, len: u64) -> Result<()> {
        let end = addr + len;
        let left = self.free_by_addr.range(..addr).next_back().map(|(&s, &l)| (s, l));
        let right = self.free_by_addr.range(addr..).next().map(|(&s, &l)| (s, l));
        if left.is_some_and(|(s, l)| s + l > addr) || right.is_some_and(|(s, _)| s < end) {
            return Err(self.not_reserved(addr, len));
        }
        self.reserved_bytes -= len;
        let mut start = addr;
        let mut len_total = len;
        // Coalesce with the free extent on the left and on the right.
        if let Some((ls, ll)) = left.filter(|&(s, l)| s + l == addr) {
            self.remove_free(ls, ll);
            start = ls;
            len_total += ll;
        }
        if let Some((rs, rl)) = right.filter(|&(s, _)| s == end) {
            self.remove_free(rs, rl);
            len_total += rl;
        }
        self.insert_free(start, len_total);
        Ok(())
    }

    /// The length of the reservation that starts at `addr` (an exact lookup).
    pub fn reservation_at(&self, addr: u64) -> Option<u64> {
        self.reserved.get(&addr).copied()
    }

    /// The reservation that contains `addr`, as `(start, len)`.
    pub fn reservation_containing(&self, addr: u64) -> Option<(u64, u64)> {
        let contains = |&(&s, &l): &(&u64, &u64)| (s..s + l).contains(&addr);
        match &self.by_addr {
            Some(by_addr) => by_addr.range(..=addr).next_back().filter(contains),
            None => self.reserved.iter().find(contains),
        }
        .map(|(&s, &l)| (s, l))
    }

    fn check_request(&self, size: u64, align: u64) -> Result<u64> {
        if size == 0 {
            return Err(AclError::invalid_param("cannot reserve 0 bytes of address space; pass a size > 0"));
        }
        if !align.is_power_of_two() || align < self.granule {
            return Err(AclError::invalid_param(format!(
                "alignment {align} is not a power of two of at least {}",
                format_size(self.granule)
            )));
        }
        checked_align_up(size, self.granule).filter(|&s| s <= self.end - self.start).ok_or_else(|| {
            AclError::oom(format!(
                "{} is larger than the whole device address window ({})",
                format_size(size),
                format_size(self.end - self.start)
            ))
        })
    }

    /// Takes `[at, at+size)` out of the free extent `[start, start+len)`.
    fn carve(&mut self, start: u64, len: u64, at: u64, size: u64) {
        self.remove_free(start, len);
        if at > start {
            self.insert_free(start, at - start);
        }
        let end = start + len;
        if at + size < end {
            self.insert_free(at + size, end - (at + size));
        }
        if self.tracked {
            self.reserved.insert(at, size);
        }
        if let Some(by_addr) = &mut self.by_addr {
            by_addr.insert(at, size);
        }
        self.reserved_bytes += size;
    }

    fn insert_free(&mut self, start: u64, len: u64) {
        self.free_by_addr.insert(start, len);
        self.free_by_len.insert((len, start));
    }

    fn remove_free(&mut self, start: u64, len: u64) {
        self.free_by_addr.remove(&start);
        self.free_by_len.remove(&(len, start));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::units::{GIB, MIB};
    use proptest::prelude::*;

    #[test]
    fn reserve_aligns_and_release_coalesces() {
        let mut va = VaSpace::default();
        let a = va.reserve(4096, 4096).unwrap();
        let b = va.reserve(3 * MIB, 2 * MIB).unwrap();
        assert_eq!(a, VA_WINDOW_START);
        assert_eq!(b % (2 * MIB), 0);
        assert!(b >= a + 4096);
        assert_eq!(va.reservation_containing(b + 5), Some((b, 3 * MIB)));
        va.release(a).unwrap();
        va.release(b).unwrap();
        assert_eq!(va.reserved_bytes(), 0);
        assert_eq!(va.largest_free(), VA_WINDOW_END - VA_WINDOW_START);
        assert!(va.release(a).is_err());
    }

    #[test]
    fn untracked_spaces_release_ranges_and_refuse_free_ones() {
        let mut va = VaSpace::new(VA_WINDOW_START, VA_WINDOW_START + GIB).untracked();
        let a = va.reserve(8192, 4096).unwrap();
        let b = va.reserve(4096, 4096).unwrap();
        assert_eq!((va.reservation_count(), va.reservation_at(a), va.release(a).is_err()), (0, None, true));
        // Two neighbouring reservations go back as one range; a free or partly free range, a
        // range off the window or off the granule is refused.
        va.release_range(a, 12288).unwrap();
        assert_eq!(va.reserved_bytes(), 0);
        assert_eq!(va.largest_free(), GIB);
        for (at, len) in [(b, 4096), (a, 0), (a, 100), (VA_WINDOW_START + GIB, 4096), (a - 4096, 4096)] {
            assert!(va.release_range(at, len).is_err(), "{at:#x}+{len}");
        }
        // A tracked space takes a range only as the exact reservation.
        let mut tracked = VaSpace::new(VA_WINDOW_START, VA_WINDOW_START + GIB);
        let c = tracked.reserve(8192, 4096).unwrap();
        assert!(tracked.release_range(c, 4096).is_err());
        tracked.release_range(c, 8192).unwrap();
        assert_eq!(tracked.reservation_count(), 0);
    }

    #[test]
    fn reserve_at_and_errors() {
        let mut va = VaSpace::default();
        let want = VA_WINDOW_START + GIB;
        assert_eq!(va.reserve_at(want, GIB, GIB).unwrap(), want);
        assert!(va.reserve_at(want + 4096, 4096, 4096).is_err());
        assert!(va.reserve(0, 4096).is_err());
        assert!(va.reserve(4096, 3000).is_err());
        assert!(va.reserve(u64::MAX, 4096).is_err());
    }

    proptest! {
        #[test]
        fn reservations_never_overlap(ops in proptest::collection::vec((0u8..3, 1u64..64, 0u32..4), 1..200)) {
            let mut va = VaSpace::new(VA_WINDOW_START, VA_WINDOW_START + 4 * GIB);
            // The same operations on a space with the address-ordered index: the same answers.
            let mut indexed = VaSpace::new(VA_WINDOW_START, VA_WINDOW_START + 4 * GIB).with_containment_index();
            // And on an untracked space, released by range: the same placements and free extents.
            let mut untracked = VaSpace::new(VA_WINDOW_START, VA_WINDOW_START + 4 * GIB).untracked();
            let mut live: Vec<(u64, u64)> = Vec::new();
            for (op, pages, align_log) in ops {
                if op < 2 || live.is_empty() {
                    let size = pages * 64 * 1024;
                    let align = 4096u64 << (align_log * 3);
                    let got = va.reserve(size, align);
                    prop_assert_eq!(indexed.reserve(size, align).ok(), got.as_ref().ok().copied());
                    prop_assert_eq!(untracked.reserve(size, align).ok(), got.as_ref().ok().copied());
                    if let Ok(addr) = got {
                        prop_assert_eq!(addr % align, 0);
                        for &(s, l) in &live {
                            prop_assert!(addr + size <= s || s + l <= addr);
                        }
                        live.push((addr, size));
                    }
                } else {
                    let (s, l) = live.swap_remove(pages as usize % live.len());
                    prop_assert_eq!(va.release(s).unwrap(), l);
                    prop_assert_eq!(indexed.release(s).unwrap(), l);
                    // Overlapping free space (the range and the granule past its end, now free
                    // or reserved by a neighbour) is refused, changing nothing.
                    untracked.release_range(s, l).unwrap();
                    prop_assert!(untracked.release_range(s, l).is_err());
                    prop_assert!(untracked.release_range(s, l + 4096).is_err());
                }
                prop_assert!(untracked.free_extents().eq(va.free_extents()));
                prop_assert_eq!(untracked.reserved_bytes(), va.reserved_bytes());
                // Containment (the scan without the index, the index's range query with it) at
                // each reservation's ends and just past them, and in a free gap.
                for &(s, l) in &live {
                    for probe in [s, s + l - 1, s + l, s.wrapping_sub(1)] {
                        let want = live.iter().copied().find(|&(a, b)| (a..a + b).contains(&probe));
                        prop_assert_eq!(va.reservation_containing(probe), want);
                        prop_assert_eq!(indexed.reservation_containing(probe), want);
                    }
                }
                let total: u64 = live.iter().map(|&(_, l)| l).sum();
                prop_assert_eq!(va.reserved_bytes(), total);
                let free: u64 = va.free_by_addr.values().sum();
                prop_assert_eq!(free + total, 4 * GIB);
            }
            for (s, _) in live { va.release(s).unwrap(); }
            prop_assert_eq!(va.largest_free(), 4 * GIB);
        }
    }
}
