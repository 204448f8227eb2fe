//! The page walk after a TLB miss: the guest's radix walk, its upper steps skipped by the
//! page-walk caches, and — for a guest of a virtual machine — every guest table read and the
//! data's guest-physical page translated through the host's page table (the two-dimensional walk
//! of Bhargava et al., ASPLOS 2008: n·m + n + m reads for n guest and m host levels with every
//! cache off, Gandhi et al., MICRO 2014).
//!
//! Rules:
//! - A guest walk-cache hit at table level l skips guest levels 0..=l and their host
//!   translations (the cache holds the next table's host-physical address, as a 2D PWC does).
//! - Each guest table read taken is preceded by the host translation of the table's
//!   guest-physical page; the data's page is translated last. A host translation asks the
//!   nested TLB first (one host page an entry) and walks the host table on a miss, its upper
//!   steps skipped by the host walk caches.
//! - Guest tables of one level lie in consecutive guest frames in VA order ([`table_gpa`]); the
//!   data's guest-physical address is its guest-virtual one (one to one): the model knows no
//!   guest allocator, only which host pages the walks share.
//! - Every read taken costs `walk_step_cycles`; with no host this is the native walk, bit for
//!   bit.

use crate::TlbStats;
use crate::config::HostConfig;
use crate::walk_cache::WalkCache;

/// The VA bits below each walk cache's tag (table levels 0, 1, 2).
const WALK_CACHE_SHIFT: [u32; 3] = [39, 30, 21];

/// Guest-physical frames of the guest's page tables: above any data address (a 57-bit VA).
const TABLES: u64 = 1 << 62;

/// The guest-physical address of the guest table at `level` (0 = root) that a walk of `va`
/// reads: tables of one level in consecutive 4 KiB frames, one per region the level covers
/// (512 GiB, 1 GiB, 2 MiB for levels 1, 2, 3), each level in its own window.
#[inline]
pub fn table_gpa(level: u32, va: u64) -> u64 {
    let covers = 48u32.saturating_sub(9 * level).max(21);
    let region = (va & ((1 << 48) - 1)) >> covers;
    TABLES | (u64::from(level.min(15)) << 48) | (region << 12)
}

/// Guest table levels above the leaf a walk of `depth` reads from the walk caches' view:
/// depth 4 → tables 0, 1, 2; depth 3 → 0, 1; depth 2 → 0.
#[inline]
fn upper_tables(depth: u32) -> usize {
    (depth as usize).saturating_sub(1).min(3)
}

/// The radix walk's walk-cache probes for `addr` (deepest first; a hit skips the levels above
/// and with it; the levels below the hit are filled, the walk read them): returns the steps
/// skipped.
#[inline]
fn radix(caches: &mut [Option<WalkCache>; 3], addr: u64, depth: u32) -> u64 {
    let tables = upper_tables(depth);
    let mut probe =
        |level: usize| caches[level].as_mut().is_some_and(|c| c.lookup_fill(addr >> WALK_CACHE_SHIFT[level]));
    let mut skipped = 0;
    for level in (0..tables).rev() {
        if probe(level) {
            skipped = level as u64 + 1;
            break;
        }
    }
    for level in skipped as usize..tables {
        probe(level);
    }
    skipped
}

/// The host dimension's state: nested TLB and host walk caches.
#[derive(Debug)]
pub(crate) struct Host {
    page_shift: u32,
    depth: u32,
    tlb: Option<WalkCache>,
    caches: [Option<WalkCache>; 3],
}

impl Host {
    fn new(h: &HostConfig) -> Self {
        Host {
            page_shift: h.page_size.bytes().trailing_zeros(),
            depth: h.depth(),
            tlb: (h.nested_tlb_entries > 0).then(|| WalkCache::new(h.nested_tlb_entries)),
            caches: h.walk_cache_entries.map(|n| (n > 0).then(|| WalkCache::new(n))),
        }
    }

    /// Host reads to translate guest-physical `gpa` (0 on a nested-TLB hit).
    #[inline]
    fn translate(&mut self, stats: &mut TlbStats, gpa: u64) -> u64 {
        if let Some(tlb) = &mut self.tlb {
            if tlb.lookup_fill(gpa >> self.page_shift) {
                stats.nested_tlb_hits += 1;
                return 0;
            }
            stats.nested_tlb_misses += 1;
        }
        stats.nested_walks += 1;
        let skipped = radix(&mut self.caches, gpa, self.depth);
        let steps = u64::from(self.depth) - skipped;
        stats.nested_steps_skipped += skipped;
        stats.nested_steps += steps;
        steps
    }

    /// Every entry of the nested TLB, then of each host walk cache (empty for none).
    fn contents(&self) -> Vec<Vec<u64>> {
        std::iter::once(&self.tlb)
            .chain(&self.caches)
            .map(|c| c.as_ref().map_or_else(Vec::new, WalkCache::tags))
            .collect()
    }
}

/// The walk caches of both dimensions.
#[derive(Debug)]
pub(crate) struct Walker {
    caches: [Option<WalkCache>; 3],
    host: Option<Host>,
}

impl Walker {
    pub(crate) fn new(walk_cache_entries: [usize; 3], host: Option<&HostConfig>) -> Self {
        Walker { caches: walk_cache_entries.map(|n| (n > 0).then(|| WalkCache::new(n))), host: host.map(Host::new) }
    }

    /// Every entry of each guest walk cache, then (with a host) of the nested TLB and each host
    /// walk cache.
    pub(crate) fn contents(&self) -> Vec<Vec<u64>> {
        let mut out: Vec<Vec<u64>> =
            self.caches.iter().map(|c| c.as_ref().map_or_else(Vec::new, WalkCache::tags)).collect();
        if let Some(h) = &self.host {
            out.extend(h.contents());
        }
        out
    }

    /// A walk of `va` whose guest leaf is `depth` reads down, counted in `stats` at `step_cycles`
    /// a read.
    #[inline]
    pub(crate) fn walk(&mut self, stats: &mut TlbStats, step_cycles: u64, va: u64, depth: u32) {
        stats.walks += 1;
        let skipped = radix(&mut self.caches, va, depth);
        let steps = u64::from(depth) - skipped;
        stats.walk_steps_skipped += skipped;
        stats.walk_steps += steps;
        let mut reads = steps;
        if let Some(host) = &mut self.host {
            for level in skipped as u32..depth {
                reads += host.translate(stats, table_gpa(level, va));
            }
            reads += host.translate(stats, va);
        }
        stats.cycles = stats.cycles.saturating_add(reads.saturating_mul(step_cycles));
    }
}
