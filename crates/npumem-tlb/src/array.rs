//! `Array`: one set-associative TLB array (exact LRU, tree-PLRU, round-robin or random
//! replacement), found in O(1) however wide its sets are. Page-walk caches are arrays of one set
//! (fully associative, LRU).
//!
//! Rules and invariants (checked against `super::reference` slot for slot by the tests):
//! - a tag is held in at most one slot, always in the same set;
//! - entries are never invalidated: the first `filled[s]` ways of a set hold tags, the rest are
//!   empty (counted for every array but narrow LRU ones);
//! - in a narrow array (at most [`SCAN_WAYS`] ways) the fingerprint of each filled way is that of
//!   its tag, and a narrow LRU set's [`Order`] holds each of its ways once: filled ways by
//!   recency, then the empty ones with the lowest at the back, so a fill takes the least recent;
//! - in a wide array the index maps exactly the held tags to their slots and, under LRU, the
//!   recency list of a set links exactly its filled slots, most recent first;
//! - PLRU bits and round-robin pointers evolve exactly as in the reference.
//!
//! Note [TLB array layout]: a narrow set is searched by comparing 16-bit fingerprints of all its
//! tags at once (SSE2 on x86_64) and checking the full tag where one matches, so a random hit
//! position costs no branch misprediction; a wide set (fully associative L1s, walk caches of up
//! to 4096 entries) goes through a hash index from tag to slot. Each set is one row of words
//! (tags, then the recency order and fingerprints of narrow arrays), so one base pointer and the
//! set's index reach everything a lookup and a fill touch; [`FP_WORDS`] words of padding follow
//! the last row so that the 32-byte fingerprint compare of any row stays inside the buffer.

use rustc_hash::FxHashMap;

use super::batch::Access;
use super::{ArrayConfig, ArrayStats, Replacement};
use npumem_base::PageSize;
use order::Order;

/// The tag of an empty slot (no real tag reaches it: a tag is a page number shifted left by 6).
pub(super) const EMPTY: u64 = u64::MAX;
/// Sets of at most this many ways are scanned; wider ones are indexed.
pub(super) const SCAN_WAYS: usize = 16;
const NIL: u32 = u32::MAX;

/// Bit of `p` in a mask of page sizes.
pub(super) fn size_bit(p: PageSize) -> u8 {
    1 << (p as u8)
}

/// Words a lookup reads from the start of a narrow set's fingerprints: 16-bit lanes, way `w` in
/// lane `w % 4` of word `w / 4` (on little-endian machines, `u16` number `w` of the words'
/// bytes). A row holds `ways.div_ceil(4)` of them; the lanes past the set's width (the next
/// row's words, or the padding after the last row) are masked off. A lookup compares the
/// fingerprints of all ways at once and checks the full tag only where a fingerprint matches.
const FP_WORDS: usize = SCAN_WAYS / 4;

/// Words a row of a narrow set of `ways` ways: its tags, its recency order, its fingerprints.
const fn narrow_stride(ways: usize) -> usize {
    ways + 1 + ways.div_ceil(4)
}

/// The fingerprint of `tag` (its high bits after a multiplicative hash: tags of one set share
/// their low page-number bits).
#[inline(always)]
pub(super) fn fingerprint(tag: u64) -> u16 {
    (tag.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 48) as u16
}

/// The ways whose fingerprint in `fps` (a row's [`FP_WORDS`] words) is `fp`, as a bit mask
/// (bit `w` for way `w`).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(super) fn fp_matches(fps: &[u64], fp: u16) -> u32 {
    use std::arch::x86_64::*;
    assert!(fps.len() >= FP_WORDS);
    // SAFETY: SSE2 is part of the x86_64 baseline; `fps` holds 32 readable bytes (two unaligned
    // 16-byte loads stay inside them); x86_64 is little-endian, so lane `w` is `u16` number `w`.
    unsafe {
        let needle = _mm_set1_epi16(fp as i16);
        let lo = _mm_cmpeq_epi16(_mm_loadu_si128(fps.as_ptr().cast()), needle);
        let hi = _mm_cmpeq_epi16(_mm_loadu_si128(fps.as_ptr().add(2).cast()), needle);
        // Each 16-bit lane is all ones or all zeros: packing to bytes keeps it, one bit a way.
        _mm_movemask_epi8(_mm_packs_epi16(lo, hi)) as u32
    }
}

/// The ways whose fingerprint in `fps` (a row's [`FP_WORDS`] words) is `fp`, as a bit mask
/// (bit `w` for way `w`).
#[cfg(not(target_arch = "x86_64"))]
#[inline(always)]
pub(super) fn fp_matches(fps: &[u64], fp: u16) -> u32 {
    (0..SCAN_WAYS).fold(0, |m, w| m | u32::from((fps[w / 4] >> (16 * (w % 4))) as u16 == fp) << w)
}

/// Sets the fingerprint of way `way` in `fps` (a row's [`FP_WORDS`] words) to `fp`.
#[inline(always)]
pub(super) fn set_fp(fps: &mut [u64], way: usize, fp: u16) {
    assert!(way < 4 * fps.len());
    #[cfg(target_endian = "little")]
    // SAFETY: lane `way` is `u16` number `way` of the words' bytes on a little-endian machine,
    // and `way < 4 * fps.len()` keeps it inside them.
    unsafe {
        fps.as_mut_ptr().cast::<u16>().add(way).write(fp);
    }
    #[cfg(not(target_endian = "little"))]
    {
        let (word, shift) = (&mut fps[way / 4], 16 * (way % 4));
        *word = (*word & !(0xFFFF << shift)) | u64::from(fp) << shift;
    }
}

/// The way holding `tag` in the narrow set `row` (its row) of `ways` ways, `way_bits` their bits.
#[inline(always)]
fn find_narrow(row: &[u64], ways: usize, way_bits: u32, tag: u64) -> Option<usize> {
    let mut candidates = fp_matches(&row[ways + 1..], fingerprint(tag)) & way_bits;
    while candidates != 0 {
        let way = candidates.trailing_zeros() as usize;
        if row[way] == tag {
            return Some(way);
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
    fn make_most_recent(&mut self, set: usize, slot: usize) {
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
    /// Per set, one row of `stride` words: its `ways` tags (slot `set * stride + way`), then in
    /// a narrow array its recency order (LRU: its ways most recent first, 4 bits each, [`Order`])
    /// and its fingerprints ([`narrow_stride`]), with [`FP_WORDS`] words of padding after the
    /// last row — one base pointer reaches all of a set.
    rows: Box<[u64]>,
    /// Words a row: `ways` in a wide array, [`narrow_stride`] in a narrow one.
    stride: usize,
    /// Bits of the ways of a set (`ways` ones).
    way_bits: u32,
    /// Whether this is a narrow LRU array (the common case, with its own fast paths).
    narrow_lru: bool,
    /// Per set: how many ways hold tags (not kept for narrow LRU arrays, whose order knows).
    filled: Box<[u32]>,
    /// Per set: tree pseudo-LRU bits, or the next round-robin victim.
    meta: Box<[u64]>,
    ways: usize,
    sets: usize,
    /// `sets - 1` when `sets` is a power of two.
    set_mask: Option<u64>,
    /// Whether this array takes the chained kernel's narrow paths (narrow LRU over a power of
    /// two of sets: [`Array::lookup_narrow`], [`Array::fill_narrow`]).
    pub(super) kernel: bool,
    /// `sets - 1` for a kernel array (0 otherwise).
    kernel_mask: u64,
    /// Whether [`Ways::empty`] found every way holding a tag (it stays so: entries are never
    /// invalidated).
    full: bool,
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
        let stride = if wide { ways } else { narrow_stride(ways) };
        let mut row = vec![EMPTY; stride];
        let mut rows = if wide {
            row.repeat(sets)
        } else {
            row[ways..].fill(0);
            row[ways] = if narrow_lru { Order::initial(ways) } else { 0 };
            [row.repeat(sets), vec![0; FP_WORDS]].concat()
        };
        rows.shrink_to_fit();
        Array {
            rows: rows.into(),
            stride,
            way_bits: if wide { 0 } else { u32::MAX >> (32 - ways) },
            narrow_lru,
            filled: vec![0; sets].into(),
            meta: vec![0; if has_meta { sets } else { 0 }].into(),
            ways,
            sets,
            set_mask: sets.is_power_of_two().then(|| sets as u64 - 1),
            kernel: narrow_lru && sets.is_power_of_two(),
            kernel_mask: if narrow_lru && sets.is_power_of_two() { sets as u64 - 1 } else { 0 },
            full: false,
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
        let base = set * self.stride;
        find_narrow(&self.rows[base..], self.ways, self.way_bits, tag).map(|way| base + way)
    }

    /// Whether [`Ways::empty`] found every slot of this array holding a tag.
    pub(super) fn full(&self) -> bool {
        self.full
    }

    /// Records that [`Ways::empty`] found no empty slot.
    pub(super) fn mark_full(&mut self) {
        self.full = true;
    }

    /// The tag of every slot, set by set, way by way (`EMPTY` for an empty one).
    pub(super) fn tags(&self) -> impl Iterator<Item = u64> + '_ {
        self.rows.chunks_exact(self.stride).take(self.sets).flat_map(|row| row[..self.ways].iter().copied())
    }

    /// Looks `tag` (of page number `vpn`) up; a hit updates the replacement state.
    #[inline(always)]
    pub(super) fn lookup(&mut self, tag: u64, vpn: u64) -> bool {
        let set = self.set_of(vpn);
        if self.narrow_lru {
            let (ways, row) = (self.ways, &mut self.rows[set * self.stride..]);
            return match find_narrow(row, ways, self.way_bits, tag) {
                Some(way) => {
                    row[ways] = Order::touch(row[ways], way as u64);
                    true
                }
                None => false,
            };
        }
        match self.find(set, tag) {
            Some(slot) => {
                self.touch(set, slot);
                true
            }
            None => false,
        }
    }

    /// Looks `tag` up and inserts it on a miss (a walk cache); returns whether it hit.
    #[inline]
    pub(super) fn lookup_fill(&mut self, tag: u64) -> bool {
        let hit = self.lookup(tag, tag);
        if !hit {
            self.fill(tag, tag, &mut 0);
        }
        hit
    }

    /// Marks `slot` of `set` the most recently used.
    #[inline(always)]
    fn touch(&mut self, set: usize, slot: usize) {
        match self.replacement {
            Replacement::Lru => match &mut self.wide {
                Some(wide) => wide.make_most_recent(set, slot),
                None => {
                    let order = set * self.stride + self.ways;
                    self.rows[order] = Order::touch(self.rows[order], (slot - set * self.stride) as u64);
                }
            },
            Replacement::Plru => {
                // Walk the tree from the root towards the way, pointing each node away from it.
                let way = slot - set * self.stride;
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
        let (base, ways) = (set * self.stride, self.ways);
        match self.replacement {
            Replacement::Lru => match &self.wide {
                Some(wide) => wide.tail[set] as usize - base,
                None => Order::least_recent(self.rows[base + ways], ways),
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
    pub(super) fn fill(&mut self, tag: u64, vpn: u64, rng: &mut u64) -> bool {
        let set = self.set_of(vpn);
        if self.narrow_lru {
            return self.fill_narrow_lru(set, tag);
        }
        let filled = self.filled[set] as usize;
        let (way, evicted) = if filled < self.ways {
            self.filled[set] += 1;
            (filled, false)
        } else {
            (self.victim(set, rng), true)
        };
        let slot = set * self.stride + way;
        let old = std::mem::replace(&mut self.rows[slot], tag);
        match &mut self.wide {
            Some(wide) => {
                if evicted {
                    wide.index.remove(&old);
                }
                wide.index.insert(tag, slot as u32);
            }
            None => set_fp(&mut self.rows[slot - way + self.ways + 1..], way, fingerprint(tag)),
        }
        self.touch(set, slot);
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
                if self.lookup(a.tag, a.tag >> 6) {
                    hits += 1;
                    hit[j] = true;
                } else {
                    evictions += u64::from(self.fill(a.tag, a.tag >> 6, rng));
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

    /// The row of `set` in a kernel array (its tags, order and fingerprints).
    #[inline(always)]
    fn kernel_row(&mut self, vpn: u64) -> &mut [u64] {
        debug_assert!(self.kernel);
        let set = (vpn & self.kernel_mask) as usize;
        &mut self.rows[set * self.stride..]
    }

    /// [`Array::lookup`] for a kernel array, given the tag's fingerprint `fp`.
    #[inline(always)]
    pub(super) fn lookup_narrow(&mut self, tag: u64, vpn: u64, fp: u16) -> bool {
        let (ways, way_bits) = (self.ways, self.way_bits);
        let row = self.kernel_row(vpn);
        let mut candidates = fp_matches(&row[ways + 1..], fp) & way_bits;
        while candidates != 0 {
            let way = candidates.trailing_zeros() as usize;
            if row[way] == tag {
                row[ways] = Order::touch(row[ways], way as u64);
                return true;
            }
            candidates &= candidates - 1;
        }
        false
    }

    /// [`Array::fill`] for a kernel array, given the tag's fingerprint `fp`.
    #[inline(always)]
    pub(super) fn fill_narrow(&mut self, tag: u64, vpn: u64, fp: u16) -> bool {
        let ways = self.ways;
        Self::refill_row(self.kernel_row(vpn), ways, tag, fp)
    }

    /// Inserts `tag` (not held) into `set` of a narrow LRU array, in its least recent way (the
    /// next empty one while the set is not full); returns whether it evicted.
    #[inline(always)]
    fn fill_narrow_lru(&mut self, set: usize, tag: u64) -> bool {
        let ways = self.ways;
        Self::refill_row(&mut self.rows[set * self.stride..], ways, tag, fingerprint(tag))
    }

    /// Inserts `tag` (not held, fingerprint `fp`) into the least recent way of the narrow LRU
    /// set whose row is `row`, of `ways` ways; returns whether it evicted.
    #[inline(always)]
    fn refill_row(row: &mut [u64], ways: usize, tag: u64, fp: u16) -> bool {
        let order = row[ways];
        let way = Order::least_recent(order, ways);
        row[ways] = Order::refill(order, way as u64, ways);
        set_fp(&mut row[ways + 1..], way, fp);
        std::mem::replace(&mut row[way], tag) != EMPTY
    }

    /// [`Array::pass`] for LRU over narrow sets, the common case, in one tight loop; returns
    /// (lookups, hits, evictions).
    fn pass_narrow_lru(&mut self, accesses: &[Access], reach: &[u32], hit: &mut [bool]) -> (u64, u64, u64) {
        let sizes = self.sizes_mask;
        let (mut lookups, mut hits, mut evictions) = (0, 0, 0);
        for (j, &i) in reach.iter().enumerate() {
            let a = &accesses[i as usize];
            if sizes & size_bit(a.page) == 0 {
                continue;
            }
            lookups += 1;
            let vpn = a.tag >> 6;
            if self.lookup(a.tag, vpn) {
                hits += 1;
                hit[j] = true;
            } else {
                let set = self.set_of(vpn);
                evictions += u64::from(self.fill_narrow_lru(set, a.tag));
            }
        }
        (lookups, hits, evictions)
    }
}

/// A kernel array with `W` ways, borrowed for a fixed loop ([`super::fixed`]): the same state
/// as [`Array::lookup_narrow`] and [`Array::fill_narrow`] change, in the same way, with the
/// width a constant (the recency order's shifts are immediates, a set of at most 4 ways is
/// matched in one 64-bit word) and no bounds check per access (checked once, in
/// [`Array::ways_mut`]).
pub(super) struct Ways<'a, const W: usize> {
    /// The rows of the array's sets, [`narrow_stride`] words each, then [`FP_WORDS`] of padding.
    rows: &'a mut [u64],
    /// `sets - 1` (a power of two of sets).
    mask: u64,
}

impl Array {
    /// This array's sets as [`Ways`]; `None` unless it is a kernel array of exactly `W` ways.
    pub(super) fn ways_mut<const W: usize>(&mut self) -> Option<Ways<'_, W>> {
        let sets = self.kernel_mask as usize + 1;
        let fits = self.kernel
            && self.ways == W
            && self.stride == narrow_stride(W)
            && self.rows.len() == sets * self.stride + FP_WORDS;
        fits.then_some(Ways { rows: &mut self.rows, mask: self.kernel_mask })
    }
}

impl<const W: usize> Ways<'_, W> {
    /// Words a row: the tags at `0..W`, the order at `W`, the fingerprints from `W + 1`.
    const STRIDE: usize = narrow_stride(W);

    /// The ways of set `set` whose fingerprint may be `fp` (every one that is; for `W <= 4`
    /// possibly others above the lowest true one, which the tag check rejects), as one bit per
    /// way at bit `way * STEP`.
    const STEP: u32 = if W <= 4 { 16 } else { 1 };

    /// The row of the set of page number `vpn`.
    #[inline(always)]
    fn row(&mut self, vpn: u64) -> *mut u64 {
        let set = (vpn & self.mask) as usize;
        // SAFETY: `set <= mask`, and `ways_mut` checked that `rows` holds `mask + 1` rows of
        // `STRIDE` words and `FP_WORDS` of padding: the row's `STRIDE` words are inside `rows`,
        // and so are the `FP_WORDS` words from its fingerprints (`W + 1 + FP_WORDS <= STRIDE +
        // FP_WORDS`).
        unsafe { self.rows.as_mut_ptr().add(set * Self::STRIDE) }
    }

    #[inline(always)]
    fn candidates(fps: &[u64], fp: u16) -> u64 {
        if W <= 4 {
            // Four 16-bit lanes in one word: the classic has-zero test on fps ^ fp, exact for
            // the lowest matching lane (a borrow can only flag lanes above a zero one).
            const ONES: u64 = 0x0001_0001_0001_0001;
            let x = fps[0] ^ u64::from(fp).wrapping_mul(ONES);
            let lanes = if W == 4 { u64::MAX } else { (1u64 << (16 * W)) - 1 };
            x.wrapping_sub(ONES) & !x & (ONES << 15) & lanes
        } else {
            u64::from(fp_matches(fps, fp) & (u32::MAX >> (32 - W)))
        }
    }

    /// Looks `tag` (page number `vpn`, fingerprint `fp`) up; a hit becomes the most recent of
    /// its set. Returns whether it hit. With `AVX2` (only ever inlined into code compiled for
    /// AVX2, on a CPU that has it: [`super::fixed`]), a set of 4, 8, 12 or 16 ways compares its
    /// full tags, four ways a vector instruction, instead of fingerprints.
    #[inline(always)]
    pub(super) fn lookup<const AVX2: bool>(&mut self, tag: u64, vpn: u64, fp: u16) -> bool {
        let row = self.row(vpn);
        #[cfg(target_arch = "x86_64")]
        if AVX2 && W % 4 == 0 {
            use std::arch::x86_64::*;
            // SAFETY: `AVX2` is true only in loops compiled for AVX2 and run where the CPU has
            // it; `row` starts a row of `rows` (`row`): `W` tags, then the order.
            unsafe {
                let needle = _mm256_set1_epi64x(tag as i64);
                let mut hits = 0u32;
                for k in 0..W / 4 {
                    let eq = _mm256_cmpeq_epi64(_mm256_loadu_si256(row.add(4 * k).cast()), needle);
                    hits |= (_mm256_movemask_pd(_mm256_castsi256_pd(eq)) as u32) << (4 * k);
                }
                if hits == 0 {
                    return false;
                }
                let order = row.add(W);
                *order = Order::touch(*order, u64::from(hits.trailing_zeros()));
                return true;
            }
        }
        // SAFETY: `row` starts a row of `rows` with `FP_WORDS` readable words from its
        // fingerprints (`row`); every way below is below `W`.
        unsafe {
            let fps = std::slice::from_raw_parts(row.add(W + 1), FP_WORDS);
            let mut candidates = Self::candidates(fps, fp);
            while candidates != 0 {
                let way = (candidates.trailing_zeros() / Self::STEP) as usize;
                if *row.add(way) == tag {
                    let order = row.add(W);
                    *order = Order::touch(*order, way as u64);
                    return true;
                }
                candidates &= candidates - 1;
            }
        }
        false
    }

    /// How many ways hold no tag: a fill into one of them evicts nothing, and entries are never
    /// invalidated, so the fills that evicted are the fills less the drop of this count (O(sets)
    /// around a fixed loop, until [`Array::full`], instead of a counter in it).
    pub(super) fn empty(&self) -> u64 {
        let rows = self.rows.chunks_exact(Self::STRIDE);
        rows.map(|row| row[..W].iter().filter(|&&t| t == EMPTY).count() as u64).sum()
    }

    /// Inserts `tag` (not held) in its set's least recent way; returns whether it evicted.
    #[inline(always)]
    pub(super) fn fill(&mut self, tag: u64, vpn: u64, fp: u16) -> bool {
        let row = self.row(vpn);
        // SAFETY: `row` starts a row of `rows` with `FP_WORDS` words from its fingerprints
        // (`row`), none borrowed elsewhere; `least_recent` is a way of the order, below `W`, so
        // its fingerprint lane is in this row.
        unsafe {
            let order = row.add(W);
            let way = Order::least_recent(*order, W);
            *order = Order::refill(*order, way as u64, W);
            let fps = std::slice::from_raw_parts_mut(row.add(W + 1), FP_WORDS);
            set_fp(fps, way, fp);
            std::mem::replace(&mut *row.add(way), tag) != EMPTY
        }
    }
}

mod order;

#[cfg(test)]
mod tests;
