//! `Array`: one set-associative TLB array with exact LRU, tree-pseudo-LRU, round-robin or random
//! replacement, found in O(1) however wide its sets are. Page-walk caches are arrays of one set
//! (fully associative, LRU).
//!
//! A narrow set (at most [`SCAN_WAYS`] ways) is searched by comparing all its tags, which are
//! contiguous, into a bit mask (no branch per way, so a random hit position costs no
//! misprediction); a wider one (fully associative L1s of 72–256 entries, walk caches of up to
//! 4096) through a hash index from tag to slot, which is exact because a tag always falls in the
//! same set. LRU keeps a stamp per entry in narrow sets (the victim is the smallest stamp) and a
//! doubly linked recency list per set in wide ones (the victim is the tail); the two give the same
//! victim because no two entries of a set share a stamp. Entries are never invalidated, so a set
//! fills its ways in order and the first empty way is the number of ways filled.
//!
//! Invariants: a tag is held in at most one slot; `filled[s]` ways of set `s` hold tags, the
//! rest are empty; in a wide array the index maps exactly the held tags to their slots and, under
//! LRU, the recency list of a set links exactly its filled slots, most recent first; PLRU bits and
//! round-robin pointers evolve exactly as in `super::reference`, slot for slot.

use rustc_hash::FxHashMap;

use super::batch::Access;
use super::{ArrayConfig, ArrayStats, Replacement};
use crate::vm::PageSize;

/// The tag of an empty slot (no real tag reaches it: a tag is a page number shifted left by 6).
pub(super) const EMPTY: u64 = u64::MAX;
/// Sets of at most this many ways are scanned; wider ones are indexed.
pub(super) const SCAN_WAYS: usize = 16;
const NIL: u32 = u32::MAX;

/// Bit of `p` in a mask of page sizes.
pub(super) fn size_bit(p: PageSize) -> u8 {
    1 << (p as u8)
}

/// The 16-bit fingerprints of a narrow set's tags, one per way (ways past the set's width
/// hold stale values and are masked off): a lookup compares the fingerprints of all ways at once
/// and checks the full tag only where a fingerprint matches.
#[derive(Clone, Copy, Debug, Default)]
#[repr(C, align(32))]
struct Fingerprints([u16; SCAN_WAYS]);

/// The fingerprint of `tag` (its high bits after a multiplicative hash: tags of one set share
/// their low page-number bits).
#[inline(always)]
fn fingerprint(tag: u64) -> u16 {
    (tag.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 48) as u16
}

impl Fingerprints {
    /// The ways whose fingerprint is `fp`, as a bit mask (bit `w` for way `w`).
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    fn matches(&self, fp: u16) -> u32 {
        use std::arch::x86_64::*;
        // SAFETY: SSE2 is part of the x86_64 baseline; `self.0` is 32 readable bytes (two
        // unaligned 16-byte loads stay inside it).
        unsafe {
            let needle = _mm_set1_epi16(fp as i16);
            let lo = _mm_cmpeq_epi16(_mm_loadu_si128(self.0.as_ptr().cast()), needle);
            let hi = _mm_cmpeq_epi16(_mm_loadu_si128(self.0.as_ptr().add(8).cast()), needle);
            // Each 16-bit lane is all ones or all zeros: packing to bytes keeps it, one bit a way.
            _mm_movemask_epi8(_mm_packs_epi16(lo, hi)) as u32
        }
    }

    /// The ways whose fingerprint is `fp`, as a bit mask (bit `w` for way `w`).
    #[cfg(not(target_arch = "x86_64"))]
    #[inline(always)]
    fn matches(&self, fp: u16) -> u32 {
        self.0.iter().enumerate().fold(0, |m, (w, &f)| m | u32::from(f == fp) << w)
    }
}

/// The slot of `tags` holding `tag` in the narrow set starting at slot `base`, whose
/// fingerprints are `fps` and ways `way_bits`.
#[inline(always)]
fn find_narrow(tags: &[u64], fps: &Fingerprints, way_bits: u32, base: usize, tag: u64) -> Option<usize> {
    let mut candidates = fps.matches(fingerprint(tag)) & way_bits;
    while candidates != 0 {
        let slot = base + candidates.trailing_zeros() as usize;
        if tags[slot] == tag {
            return Some(slot);
        }
        candidates &= candidates - 1;
    }
    None
}

/// The index of a wide array, and its recency lists under LRU.
#[derive(Debug)]
struct Wide {
    index: FxHashMap<u64, u32>,
    /// Per slot, its more and less recent neighbours in its set's list (LRU only).
    newer: Vec<u32>,
    older: Vec<u32>,
    /// Per set, its most and least recent slot (LRU only).
    head: Vec<u32>,
    tail: Vec<u32>,
}

impl Wide {
    fn new(entries: usize, sets: usize, lru: bool) -> Self {
        let mut index = FxHashMap::default();
        index.reserve(entries);
        let (per_slot, per_set) = if lru { (entries, sets) } else { (0, 0) };
        Wide {
            index,
            newer: vec![NIL; per_slot],
            older: vec![NIL; per_slot],
            head: vec![NIL; per_set],
            tail: vec![NIL; per_set],
        }
    }

    /// Makes `slot` the most recent of `set` (linked or not yet).
    #[inline]
    fn move_to_front(&mut self, set: usize, slot: usize) {
        let s = slot as u32;
        if self.head[set] == s {
            return;
        }
        let (n, o) = (self.newer[slot], self.older[slot]);
        if n != NIL {
            self.older[n as usize] = o;
        }
        if o != NIL {
            self.newer[o as usize] = n;
        } else if self.tail[set] == s {
            self.tail[set] = n;
        }
        let h = self.head[set];
        self.newer[slot] = NIL;
        self.older[slot] = h;
        if h != NIL {
            self.newer[h as usize] = s;
        }
        self.head[set] = s;
        if self.tail[set] == NIL {
            self.tail[set] = s;
        }
    }
}

#[derive(Debug)]
pub(super) struct Array {
    pub(super) tags: Box<[u64]>,
    /// Per set of a narrow array, the fingerprints of its tags (empty for a wide array).
    fps: Box<[Fingerprints]>,
    /// Bits of the ways of a set (`ways` ones).
    way_bits: u32,
    /// LRU in narrow sets: the clock of each slot's last use.
    stamps: Box<[u64]>,
    /// Per set: how many ways hold tags.
    filled: Box<[u32]>,
    /// Per set: tree pseudo-LRU bits, or the next round-robin victim.
    meta: Box<[u64]>,
    ways: usize,
    sets: usize,
    /// `sets - 1` when `sets` is a power of two.
    set_mask: Option<u64>,
    replacement: Replacement,
    wide: Option<Box<Wide>>,
    pub(super) sizes_mask: u8,
    pub(super) hit_cycles: u64,
    pub(super) cfg: ArrayConfig,
}

impl Array {
    pub(super) fn new(cfg: ArrayConfig) -> Self {
        let (entries, ways, replacement) = (cfg.entries, cfg.ways, cfg.replacement);
        let sets = entries / ways;
        let wide = ways > SCAN_WAYS;
        let sizes_mask =
            if cfg.page_sizes.is_empty() { 0xFF } else { cfg.page_sizes.iter().fold(0, |m, &p| m | size_bit(p)) };
        let narrow_lru = replacement == Replacement::Lru && !wide;
        let has_meta = matches!(replacement, Replacement::Plru | Replacement::RoundRobin);
        Array {
            tags: vec![EMPTY; entries].into(),
            fps: vec![Fingerprints::default(); if wide { 0 } else { sets }].into(),
            way_bits: if wide { 0 } else { u32::MAX >> (32 - ways) },
            stamps: vec![0; if narrow_lru { entries } else { 0 }].into(),
            filled: vec![0; sets].into(),
            meta: vec![0; if has_meta { sets } else { 0 }].into(),
            ways,
            sets,
            set_mask: sets.is_power_of_two().then(|| sets as u64 - 1),
            replacement,
            wide: wide.then(|| Box::new(Wide::new(entries, sets, replacement == Replacement::Lru))),
            sizes_mask,
            hit_cycles: cfg.hit_cycles,
            cfg,
        }
    }

    /// A fully associative LRU array of `entries` (a page-walk cache).
    pub(super) fn walk_cache(entries: usize) -> Self {
        Array::new(ArrayConfig::new("walk cache", entries, entries, &[], Replacement::Lru, 0))
    }

    #[inline(always)]
    fn set_of(&self, vpn: u64) -> usize {
        match self.set_mask {
            Some(mask) => (vpn & mask) as usize,
            None => (vpn % self.sets as u64) as usize,
        }
    }

    /// The slot holding `tag` in `set`, if any.
    #[inline(always)]
    fn find(&self, set: usize, tag: u64) -> Option<usize> {
        if let Some(wide) = &self.wide {
            return wide.index.get(&tag).map(|&slot| slot as usize);
        }
        find_narrow(&self.tags, &self.fps[set], self.way_bits, set * self.ways, tag)
    }

    /// Looks `tag` (of page number `vpn`) up; a hit updates the replacement state.
    #[inline(always)]
    pub(super) fn lookup(&mut self, tag: u64, vpn: u64, now: u64) -> bool {
        let set = self.set_of(vpn);
        match self.find(set, tag) {
            Some(slot) => {
                self.touch(set, slot, now);
                true
            }
            None => false,
        }
    }

    /// Looks `tag` up and inserts it on a miss (a walk cache); returns whether it hit.
    #[inline]
    pub(super) fn lookup_fill(&mut self, tag: u64, now: u64) -> bool {
        let hit = self.lookup(tag, tag, now);
        if !hit {
            self.fill(tag, tag, now, &mut 0);
        }
        hit
    }

    /// Marks `slot` of `set` the most recently used.
    #[inline(always)]
    fn touch(&mut self, set: usize, slot: usize, now: u64) {
        match self.replacement {
            Replacement::Lru => match &mut self.wide {
                Some(wide) => wide.move_to_front(set, slot),
                None => self.stamps[slot] = now,
            },
            Replacement::Plru => {
                // Walk the tree from the root towards the way, pointing each node away from it.
                let way = slot - set * self.ways;
                let mut b = self.meta[set];
                let (mut node, mut lo, mut span) = (1usize, 0usize, self.ways);
                while span > 1 {
                    span /= 2;
                    let right = way >= lo + span;
                    if right {
                        b &= !(1 << node);
                        lo += span;
                    } else {
                        b |= 1 << node;
                    }
                    node = 2 * node + usize::from(right);
                }
                self.meta[set] = b;
            }
            Replacement::RoundRobin | Replacement::Random => {}
        }
    }

    /// The way to evict from the full `set`.
    #[inline(always)]
    fn victim(&mut self, set: usize, rng: &mut u64) -> usize {
        let (base, ways) = (set * self.ways, self.ways);
        match self.replacement {
            Replacement::Lru => match &self.wide {
                Some(wide) => wide.tail[set] as usize - base,
                None => {
                    // The first smallest stamp (stamps of a full set are distinct anyway).
                    let stamps = &self.stamps[base..base + ways];
                    let (mut best, mut oldest) = (0, stamps[0]);
                    for (w, &stamp) in stamps.iter().enumerate().skip(1) {
                        if stamp < oldest {
                            (best, oldest) = (w, stamp);
                        }
                    }
                    best
                }
            },
            Replacement::Plru => {
                let b = self.meta[set];
                let (mut node, mut lo, mut span) = (1usize, 0usize, ways);
                while span > 1 {
                    span /= 2;
                    let right = b & (1 << node) != 0;
                    if right {
                        lo += span;
                    }
                    node = 2 * node + usize::from(right);
                }
                lo
            }
            Replacement::RoundRobin => {
                let w = (self.meta[set] as usize) % ways;
                self.meta[set] = (w as u64 + 1) % ways as u64;
                w
            }
            Replacement::Random => {
                // xorshift64: deterministic for a given run.
                *rng ^= *rng << 13;
                *rng ^= *rng >> 7;
                *rng ^= *rng << 17;
                (*rng % ways as u64) as usize
            }
        }
    }

    /// Inserts `tag` (not held), evicting if its set is full; returns whether it evicted.
    #[inline(always)]
    pub(super) fn fill(&mut self, tag: u64, vpn: u64, now: u64, rng: &mut u64) -> bool {
        let set = self.set_of(vpn);
        let filled = self.filled[set] as usize;
        let (way, evicted) = if filled < self.ways {
            self.filled[set] += 1;
            (filled, false)
        } else {
            (self.victim(set, rng), true)
        };
        let slot = set * self.ways + way;
        let old = std::mem::replace(&mut self.tags[slot], tag);
        match &mut self.wide {
            Some(wide) => {
                if evicted {
                    wide.index.remove(&old);
                }
                wide.index.insert(tag, slot as u32);
            }
            None => self.fps[set].0[way] = fingerprint(tag),
        }
        self.touch(set, slot, now);
        evicted
    }

    /// Runs the accesses `reach` (indices into `accesses`, in clock order) whose page size this
    /// array holds through it: a hit sets `hit[j]` for `reach[j]` and adds the hit cost to
    /// `cycles` (saturating), a miss fills. The counters go to `counts`.
    pub(super) fn pass(
        &mut self,
        accesses: &[Access],
        reach: &[u32],
        hit: &mut [bool],
        counts: &mut ArrayStats,
        cycles: &mut u64,
        rng: &mut u64,
    ) {
        let (lookups, hits, evictions) = if self.wide.is_none() && self.replacement == Replacement::Lru {
            self.pass_narrow_lru(accesses, reach, hit)
        } else {
            let (mut lookups, mut hits, mut evictions) = (0, 0, 0);
            for (j, &i) in reach.iter().enumerate() {
                let a = &accesses[i as usize];
                if self.sizes_mask & size_bit(a.page) == 0 {
                    continue;
                }
                lookups += 1;
                if self.lookup(a.tag, a.tag >> 6, a.now) {
                    hits += 1;
                    hit[j] = true;
                } else {
                    evictions += u64::from(self.fill(a.tag, a.tag >> 6, a.now, rng));
                }
            }
            (lookups, hits, evictions)
        };
        counts.lookups += lookups;
        counts.hits += hits;
        counts.misses += lookups - hits;
        counts.evictions += evictions;
        *cycles = cycles.saturating_add(hits.saturating_mul(self.hit_cycles));
    }

    /// [`Array::pass`] for LRU over narrow sets, the common case, in one tight loop; returns
    /// (lookups, hits, evictions).
    fn pass_narrow_lru(&mut self, accesses: &[Access], reach: &[u32], hit: &mut [bool]) -> (u64, u64, u64) {
        let (ways, sets, set_mask, sizes) = (self.ways, self.sets as u64, self.set_mask, self.sizes_mask);
        let (mut lookups, mut hits, mut evictions) = (0, 0, 0);
        let way_bits = self.way_bits;
        let (tags, stamps, filled, fps) =
            (&mut self.tags[..], &mut self.stamps[..], &mut self.filled[..], &mut self.fps[..]);
        for (j, &i) in reach.iter().enumerate() {
            let a = &accesses[i as usize];
            if sizes & size_bit(a.page) == 0 {
                continue;
            }
            lookups += 1;
            let vpn = a.tag >> 6;
            let set = match set_mask {
                Some(mask) => (vpn & mask) as usize,
                None => (vpn % sets) as usize,
            };
            let base = set * ways;
            let set_tags = &mut tags[base..base + ways];
            let set_stamps = &mut stamps[base..base + ways];
            if let Some(w) = find_narrow(set_tags, &fps[set], way_bits, 0, a.tag) {
                set_stamps[w] = a.now;
                hits += 1;
                hit[j] = true;
                continue;
            }
            let f = filled[set] as usize;
            let w = if f < ways {
                filled[set] += 1;
                f
            } else {
                evictions += 1;
                // The first smallest stamp (stamps of a full set are distinct anyway).
                let (mut best, mut oldest) = (0, set_stamps[0]);
                for (w, &stamp) in set_stamps.iter().enumerate().skip(1) {
                    if stamp < oldest {
                        (best, oldest) = (w, stamp);
                    }
                }
                best
            };
            set_tags[w] = a.tag;
            fps[set].0[w] = fingerprint(a.tag);
            set_stamps[w] = a.now;
        }
        (lookups, hits, evictions)
    }
}
