//! `WalkCache`: a fully associative LRU array of page-walk-cache (or nested-TLB) entries,
//! probed and filled in one call ([`WalkCache::lookup_fill`]).
//!
//! Rules and invariants (checked slot for slot against `super::reference` by the tests):
//! - a tag is held at most once; a miss fills the first empty slot while one is left, then the
//!   least recently used one (the reference's choice: stamps are distinct and increasing);
//! - small caches ([`SCAN_ENTRIES`] entries or fewer, every preset's) keep their tags in recency
//!   order, most recent first, each with its slot and 16-bit fingerprint: a probe compares the
//!   fingerprints of sixteen entries at once (as a narrow [`Array`] set) and the full tag only
//!   where one matches, a hit moves the tags before it down by one, a fill evicts the last — no
//!   hash, no list, no allocation, and the deeper walk caches, which miss most often on random
//!   access, cost a few dozen instructions a probe;
//! - larger ones use the hash-indexed [`Array`] (O(1) at any size).

use super::array::{Array, EMPTY, fingerprint, fp_matches, set_fp};

/// Caches of at most this many entries keep the recency-ordered scan; larger ones are indexed.
const SCAN_ENTRIES: usize = 64;

#[derive(Debug)]
pub(crate) enum WalkCache {
    Scan(Scan),
    Indexed(Box<Array>),
}

/// A small cache in recency order, kept as a ring: the entry at `head` is the most recent, the
/// ones after it (wrapping at `entries`) less and less recent.
#[derive(Debug)]
pub(crate) struct Scan {
    /// Tags by ring position; `EMPTY` where no entry is, padded to a multiple of 16 entries.
    ring: Box<[u64]>,
    /// The fingerprint of each ring position's tag, four to a word (as [`fp_matches`] reads).
    fps: Box<[u64]>,
    /// The slot of the entry at each ring position (`u16`: at most [`SCAN_ENTRIES`] slots).
    slots: Box<[u16]>,
    head: usize,
    len: usize,
    entries: usize,
}

impl WalkCache {
    /// A cache of `entries` (at least 1).
    pub(crate) fn new(entries: usize) -> Self {
        if entries > SCAN_ENTRIES {
            return WalkCache::Indexed(Box::new(Array::walk_cache(entries)));
        }
        let padded = entries.next_multiple_of(16);
        WalkCache::Scan(Scan {
            ring: vec![EMPTY; padded].into(),
            fps: vec![0; padded / 4].into(),
            slots: vec![0; padded].into(),
            head: 0,
            len: 0,
            entries,
        })
    }

    /// Looks `tag` up, making it the most recent, and fills it on a miss; returns whether it hit.
    #[inline]
    pub(crate) fn lookup_fill(&mut self, tag: u64) -> bool {
        match self {
            WalkCache::Scan(s) => s.lookup_fill(tag),
            WalkCache::Indexed(a) => a.lookup_fill(tag),
        }
    }

    /// The tag of every slot in slot order (`EMPTY` for an empty one).
    pub(crate) fn tags(&self) -> Vec<u64> {
        match self {
            WalkCache::Scan(s) => {
                let mut out = vec![EMPTY; s.entries];
                for (&tag, &slot) in s.ring.iter().zip(s.slots.iter()).filter(|(t, _)| **t != EMPTY) {
                    out[usize::from(slot)] = tag;
                }
                out
            }
            WalkCache::Indexed(a) => a.tags().collect(),
        }
    }
}

impl Scan {
    /// The ring position of `tag`, whose fingerprint is `fp`: sixteen fingerprints a compare,
    /// the full tag checked where one matches (an empty position or the padding holds `EMPTY`,
    /// which no tag equals).
    #[inline(always)]
    fn find(&self, tag: u64, fp: u16) -> Option<usize> {
        for (b, words) in self.fps.chunks_exact(4).enumerate() {
            let mut candidates = fp_matches(words, fp);
            while candidates != 0 {
                let at = 16 * b + candidates.trailing_zeros() as usize;
                if self.ring[at] == tag {
                    return Some(at);
                }
                candidates &= candidates - 1;
            }
        }
        None
    }

    /// Puts `tag` (fingerprint `fp`) and `slot` at ring position `at`.
    #[inline(always)]
    fn put(&mut self, at: usize, tag: u64, fp: u16, slot: u16) {
        (self.ring[at], self.slots[at]) = (tag, slot);
        set_fp(&mut self.fps[at / 4..], at % 4, fp);
    }

    /// The ring position `steps` after `at`.
    #[inline(always)]
    fn after(&self, at: usize, steps: usize) -> usize {
        let p = at + steps;
        if p >= self.entries { p - self.entries } else { p }
    }

    /// A hit moves the more recent entries one step back (as many moves as entries were more
    /// recent: few, on the hits that come often); a miss takes the position before `head` —
    /// empty while the cache is not full, else the least recent entry, whose slot it reuses.
    #[inline]
    fn lookup_fill(&mut self, tag: u64) -> bool {
        if self.ring[self.head] == tag {
            // The most recent entry again (a walk probes the levels below a hit twice).
            return true;
        }
        let fp = fingerprint(tag);
        if let Some(mut at) = self.find(tag, fp) {
            let slot = self.slots[at];
            while at != self.head {
                let prev = self.after(at, self.entries - 1);
                let moved = self.ring[prev];
                self.put(at, moved, fingerprint(moved), self.slots[prev]);
                at = prev;
            }
            self.put(at, tag, fp, slot);
            return true;
        }
        self.head = self.after(self.head, self.entries - 1);
        let slot = if self.len < self.entries {
            self.len += 1;
            (self.len - 1) as u16
        } else {
            self.slots[self.head]
        };
        self.put(self.head, tag, fp, slot);
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The scanned ring against the indexed array (itself checked against the reference), at
    /// every size around the block widths, on streams that hit at every recency position.
    #[test]
    fn scan_matches_the_indexed_array() {
        let mut x = 7u64;
        for entries in [1, 2, 3, 4, 8, 12, 15, 16, 17, 31, 32, 33, 48, 63, 64] {
            let (mut scan, mut indexed) = (WalkCache::new(entries), Array::walk_cache(entries));
            assert!(matches!(scan, WalkCache::Scan(_)));
            for i in 0..20_000u64 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                // Tags from a pool a little larger than the cache, and now and then a new one.
                let tag = if i % 97 == 0 { 1_000 + i } else { x % (entries as u64 + 3) };
                assert_eq!(scan.lookup_fill(tag), indexed.lookup_fill(tag), "{entries} entries, access {i}");
            }
            assert_eq!(scan.tags(), indexed.tags().collect::<Vec<_>>(), "{entries} entries");
        }
        assert!(matches!(WalkCache::new(SCAN_ENTRIES + 1), WalkCache::Indexed(_)));
    }
}
