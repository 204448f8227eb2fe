//! Fixed loops: the run kernel's inner loop compiled for one chain shape — two links (an L1 and
//! an L2 array) of `W1` and `W2` ways — and run for one translation (page size, group, walk
//! depth) at a time.
//!
//! [`Tlb::run_kernel`] hands a stretch of its addresses to the fixed loop of the page size it
//! has just simulated, with the run's dense table for that size ([`memo::DenseTable`]: one word
//! per 2 MiB region for huge and giant pages, per 4 KiB granule for small ones). The loop takes
//! every address whose table word is exactly that translation: the tag is one shift of the
//! address, a repeat of the previous access's entry is counted, anything else looks the two
//! links up and fills them (walking on a miss of both) through [`super::array::Ways`], whose width is a
//! constant and whose sets are indexed without a bounds check per access. It stops at the first
//! address it cannot take (its word unknown, another translation, a split region) and returns
//! its index: the kernel simulates that one access and may hand the rest back. Faults known to
//! the table are counted on the way.
//!
//! Why it is exact: it changes the same state in the same order as the kernel's access-by-access
//! path for these accesses (look up L1; on a miss look up L2, fill L2 and walk on its miss, fill
//! L1), and a table word is what `translate` said for an address of its unit during this run.
//! A repeat is recognised by its tag alone: a tag equal to the previous access's names that
//! access's page, which holds this address.
//!
//! Invariants: a fixed loop is chosen ([`fixed_loops`]) only for a page size whose chain has two
//! links, the first in level 0, both kernel arrays of the loop's widths; after it returns, the
//! cursor's last tag and mask describe the last access exactly as the kernel's path would.

use super::array::{Array, fingerprint};
use super::chain::{Cursor, PAGE_SHIFT, Tally, stretch};
use super::memo::{DENSE_KNOWN, DenseTable, FAULT};
use super::walk::Walker;
use super::{Tlb, TlbStats};

/// What the kernel hands a fixed loop: from index `start` of `addresses`, the accesses whose
/// translation packs to `bits` (as [`super::memo::Known::pack`]), through `table`.
#[derive(Clone, Copy)]
pub(super) struct Handoff<'a> {
    pub addresses: &'a [u64],
    pub start: usize,
    pub bits: u32,
    pub table: DenseTable<'a>,
}

/// A fixed loop: takes what a [`Handoff`] offers, counting into the cursor and tally; returns
/// the index of the first address it did not take.
pub(super) type FixedLoop = fn(&mut Tlb, Handoff<'_>, &mut Cursor, &mut Tally) -> usize;

/// The fixed loop of each page size (`PageSize as usize`), where its chain has a shape one is
/// compiled for: two links, the first in level 0 (`l1_mask` says one holds the size), both
/// kernel arrays of 4 or 8 ways (L1) and 4, 8, 12 or 16 ways (L2).
/// Each loop comes compiled twice: for the x86_64 baseline, and for CPUs with AVX2, BMI1/2 and
/// LZCNT (three-operand shifts, bit-field extracts and broadcasts: fewer instructions an
/// access), taken where [`wide_isa`] says the CPU has them.
pub(super) fn fixed_loops(
    chains: &[Vec<u8>; 4],
    arrays: &[Array],
    l1_masks: [u8; 4],
    wide: bool,
) -> [Option<FixedLoop>; 4] {
    macro_rules! pick {
        ($w1:literal, $w2:literal) => {{
            #[cfg(target_arch = "x86_64")]
            if wide {
                return Some(fixed_wide::<$w1, $w2> as FixedLoop);
            }
            fixed::<$w1, $w2> as FixedLoop
        }};
    }
    std::array::from_fn(|p| {
        let &[a, b] = &chains[p][..] else { return None };
        let (a, b) = (&arrays[a as usize], &arrays[b as usize]);
        if l1_masks[p] == 0 || !a.kernel || !b.kernel {
            return None;
        }
        Some(match (a.cfg.ways, b.cfg.ways) {
            (4, 4) => pick!(4, 4),
            (4, 8) => pick!(4, 8),
            (4, 12) => pick!(4, 12),
            (4, 16) => pick!(4, 16),
            (8, 4) => pick!(8, 4),
            (8, 8) => pick!(8, 8),
            (8, 12) => pick!(8, 12),
            (8, 16) => pick!(8, 16),
            _ => return None,
        })
    })
}

/// Whether this CPU runs the loops compiled for AVX2, BMI1/2 and LZCNT.
pub(super) fn wide_isa() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("bmi1")
            && std::arch::is_x86_feature_detected!("bmi2")
            && std::arch::is_x86_feature_detected!("lzcnt")
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// [`Walker::walk`], kept out of the loop (rare on the paths the loops are for, and its registers
/// would crowd the loop's).
#[cold]
#[inline(never)]
fn cold_walk(walker: &mut Walker, stats: &mut TlbStats, step_cycles: u64, va: u64, depth: u32) {
    walker.walk(stats, step_cycles, va, depth);
}

/// [`stretch`], kept out of the loop (once a stretch; inlined, it costs the loop registers).
#[inline(never)]
fn stretch_apart(addresses: &[u64], va: u64, shift: u32) -> usize {
    stretch(addresses, va, shift)
}

/// Two distinct elements of `items`, mutably.
fn two_mut<T>(items: &mut [T], a: usize, b: usize) -> (&mut T, &mut T) {
    assert_ne!(a, b, "two links of a chain are two arrays");
    if a < b {
        let (lo, hi) = items.split_at_mut(b);
        (&mut lo[a], &mut hi[0])
    } else {
        let (lo, hi) = items.split_at_mut(a);
        (&mut hi[0], &mut lo[b])
    }
}

/// The fixed loop for an L1 of `W1` ways and an L2 of `W2` ways ([`FixedLoop`]), for the
/// x86_64 baseline.
fn fixed<const W1: usize, const W2: usize>(
    tlb: &mut Tlb,
    h: Handoff<'_>,
    cursor: &mut Cursor,
    tally: &mut Tally,
) -> usize {
    fixed_body::<W1, W2, false>(tlb, h, cursor, tally)
}

/// [`fixed`] for CPUs with AVX2, BMI1/2 and LZCNT.
#[cfg(target_arch = "x86_64")]
fn fixed_wide<const W1: usize, const W2: usize>(
    tlb: &mut Tlb,
    h: Handoff<'_>,
    cursor: &mut Cursor,
    tally: &mut Tally,
) -> usize {
    // SAFETY: `fixed_loops` hands this loop out only where `wide_isa` found the features.
    unsafe { fixed_isa::<W1, W2>(tlb, h, cursor, tally) }
}

/// [`fixed_body`] compiled for AVX2, BMI1/2 and LZCNT.
///
/// # Safety
/// The CPU must have those features.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,bmi1,bmi2,lzcnt")]
unsafe fn fixed_isa<const W1: usize, const W2: usize>(
    tlb: &mut Tlb,
    h: Handoff<'_>,
    cursor: &mut Cursor,
    tally: &mut Tally,
) -> usize {
    fixed_body::<W1, W2, true>(tlb, h, cursor, tally)
}

/// The body of every fixed loop (`AVX2`: compiled for it, see [`super::array::Ways::lookup`]).
#[inline(always)]
fn fixed_body<const W1: usize, const W2: usize, const AVX2: bool>(
    tlb: &mut Tlb,
    h: Handoff<'_>,
    cursor: &mut Cursor,
    tally: &mut Tally,
) -> usize {
    let Handoff { addresses, start, bits, table } = h;
    let p = (bits & 3) as usize;
    let (first, second) = (tlb.chains.of[p][0] as usize, tlb.chains.of[p][1] as usize);
    let l1_mask = tlb.plans[p].l1_mask;
    let step_cycles = tlb.config.walk_step_cycles;
    let Tlb { arrays, walker, stats, .. } = &mut *tlb;
    let (a1, a2) = two_mut(arrays, first, second);
    let l1_full = a1.full();
    let (Some(mut l1), Some(mut l2)) = (a1.ways_mut::<W1>(), a2.ways_mut::<W2>()) else {
        return start;
    };
    // The tag is the entry's unit number (the page number past the group's bits) over the
    // packed bits' low six; the table word of every address this loop takes is `expected`.
    let (shift, low, depth) = (PAGE_SHIFT[p] + ((bits >> 2) & 15), u64::from(bits & 63), bits >> 8);
    let (expected, fault) = (DENSE_KNOWN | u64::from(bits), DENSE_KNOWN | u64::from(FAULT));
    let mut last = cursor.last_tag;
    // Hot counters only: accesses simulated follow from the index (every other address taken
    // is a repeat or a fault), L2 hits from the L1 hits and the walks (one per miss of both,
    // each counted once in `stats.walks`), fills from the hits, evictions from the fills into
    // empty ways (counted for L2; for L1, the drop of its empty ways over the loop).
    let walks_before = stats.walks;
    let (mut repeats, mut faults, mut l1_hits) = (0u64, 0u64, 0u64);
    let mut empty_fills = [if l1_full { 0 } else { l1.empty() }, 0u64];
    let mut i = start;
    while let Some(&va) = addresses.get(i) {
        let tag = ((va >> shift) << 6) | low;
        if tag == last {
            // A stretch of accesses to the previous access's entry.
            let run = stretch_apart(&addresses[i..], va, shift);
            repeats += run as u64;
            i += run;
            continue;
        }
        let word = table.words.get((va >> table.shift).wrapping_sub(table.first) as usize).copied().unwrap_or(0);
        if word != expected {
            if word != fault {
                break;
            }
            faults += 1;
            i += 1;
            continue;
        }
        i += 1;
        last = tag;
        let (vpn, fp) = (tag >> 6, fingerprint(tag));
        if l1.lookup::<AVX2>(tag, vpn, fp) {
            l1_hits += 1;
            continue;
        }
        if !l2.lookup::<AVX2>(tag, vpn, fp) {
            empty_fills[1] += u64::from(!l2.fill(tag, vpn, fp));
            cold_walk(walker, stats, step_cycles, va, depth);
        }
        l1.fill(tag, vpn, fp);
    }
    if !l1_full {
        let left = l1.empty();
        empty_fills[0] -= left;
        if left == 0 {
            a1.mark_full();
        }
    }
    let simulated = (i - start) as u64 - repeats - faults;
    let walks = tlb.stats.walks - walks_before;
    let hits = [l1_hits, simulated - l1_hits - walks];
    let fills = [simulated - hits[0], simulated - hits[0] - hits[1]];
    if simulated != 0 {
        (cursor.last_tag, cursor.last_mask) = (last, l1_mask);
    }
    cursor.faults += faults;
    tally.simulated[p] += simulated;
    for link in 0..2 {
        tally.hits[p][link] += hits[link];
        tally.evictions[p][link] += fills[link] - empty_fills[link];
    }
    // Repeats are L1 hits on the most recent entry: counted, no state changes.
    let c = &mut tlb.counters[first];
    c.lookups += repeats;
    c.hits += repeats;
    i
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TlbConfig;
    use crate::reference::ReferenceTlb;
    use npumem_base::{PageSize, Translation};

    /// The loops compiled for the baseline (the machine running the tests may take the others)
    /// against the reference, on both presets they serve and on unified two-level hierarchies of
    /// every compiled shape, over 4 KiB and 2 MiB pages with holes.
    #[test]
    fn baseline_loops_match_the_reference() {
        const BASE: u64 = 0x2000_0000_0000;
        for (page, span) in [(PageSize::Size4K, 64u64 << 20), (PageSize::Size2M, 1 << 30)] {
            // Page i of the span maps to frame i * 7919 mod pages, except every 13th (a hole).
            let pages = span / page.bytes();
            let depth = if page == PageSize::Size2M { 3 } else { 4 };
            let translate = |va: u64| {
                let i = va.checked_sub(BASE)? / page.bytes();
                let pa = ((i * 7919) % pages) * page.bytes() + va % page.bytes();
                (i < pages && i % 13 != 5).then_some(Translation { pa, page_size: page, depth })
            };
            let mut x = 3u64;
            let mut next = move || {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x
            };
            let streams: Vec<Vec<u64>> = vec![
                (0..30_000).map(|_| BASE + next() % span).collect(),
                (0..30_000).map(|_| BASE + (next() % 300) * page.bytes() + next() % 64).collect(),
                (0..30_000u64).map(|i| BASE + i * 4160 % span).collect(),
            ];
            let shapes = [(4, 8), (4, 16), (8, 4), (8, 8), (8, 12), (8, 16)].map(|(w1, w2)| {
                let mut config = TlbConfig::preset("champsim_default").unwrap();
                config.name = format!("{w1}x{w2}");
                (config.levels[0][0].entries, config.levels[0][0].ways) = (4 * w1, w1);
                (config.levels[1][0].entries, config.levels[1][0].ways) = (64 * w2, w2);
                config
            });
            let presets = ["skylake", "champsim_default"].map(|p| TlbConfig::preset(p).unwrap());
            for config in presets.into_iter().chain(shapes) {
                let preset = config.name.clone();
                let mut fast = Tlb::new(config.clone()).unwrap();
                let masks = fast.plans.each_ref().map(|p| p.l1_mask);
                fast.fixed = fixed_loops(&fast.chains.of, &fast.arrays, masks, false);
                assert!(fast.fixed[page as usize].is_some(), "{preset}: a fixed loop for {page:?}");
                let mut slow = ReferenceTlb::new(config).unwrap();
                for s in &streams {
                    fast.run(s, translate);
                    slow.run(s, translate);
                    assert_eq!(fast.stats(), slow.stats(), "{preset}, {page:?}");
                    assert_eq!(fast.contents(), slow.contents(), "{preset}, {page:?}");
                }
            }
        }
    }
}
