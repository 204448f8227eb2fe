//! Chains: access-by-access simulation for hierarchies where every page size has at most one
//! array per level (every preset: split L1s as Skylake's, or one unified array a level).
//!
//! For such a hierarchy a page size's arrays form a chain, one link a level, and an access is
//! simulated exactly as the reference does it — look the links up in order until one hits, fill
//! every link before it (or walk and fill them all) — but without the general case's per-level
//! search for the arrays holding the size, without a batch to write and read back, and with the
//! counters of each link in the link itself. Being access by access, the order of every state
//! change (random replacement's shared generator included) is the reference's.
//!
//! When moreover every array is narrow LRU over a power of two of sets, `run` takes the kernel
//! ([`Tlb::run_kernel`]): one loop over the addresses that reads the memo's packed answer,
//! builds the tag with one shift, and runs the chain (unrolled for two levels) with the arrays'
//! narrow lookup and fill, tallying hits and evictions per (page size, link); lookups, misses and
//! hit cycles follow from the tallies at the end (every simulated access looks up a chain's first
//! link, every miss the next), so the counters are the same sums. After each access it
//! simulates, the kernel hands the addresses that follow to that page size's fixed loop, if it
//! has one ([`super::fixed`]), which takes them while they translate alike and hands back the
//! first that does not.
//!
//! Invariants: `Chains::of[p]` lists exactly the arrays of `Tlb::plans[p]`, one per level, in
//! level order; a chain is used only when `Tlb::chained` (no level has two arrays for one size),
//! the kernel only when `Tlb::kernel` (chained, every array narrow LRU over a power of two of
//! sets); after `run_kernel`, `Tlb::last` is the last access's entry exactly as the general
//! loop leaves it.

use super::array::{EMPTY, fingerprint};
use super::fixed::Handoff;
use super::memo::{DEEP, Known};
use super::{PageSize, Pages, Tlb, Translation};

/// The kind bits of a packed translation (0: a page).
const KIND: u32 = 3 << 6;
/// log2 of each page size's bytes, by `PageSize as usize`.
pub(super) const PAGE_SHIFT: [u32; 4] = [12, 16, 21, 30];

/// One link of a chain: an array index.
pub(super) type Link = u8;

/// Per page size (`PageSize as usize`), the arrays holding it, level by level.
#[derive(Debug, Default)]
pub(super) struct Chains {
    pub of: [Vec<Link>; 4],
}

impl Chains {
    /// The chains of a hierarchy, and whether they are its whole structure (at most one array
    /// per level for every size; otherwise they must not be used).
    pub(super) fn new(plans: &[super::Plan; 4]) -> (Self, bool) {
        let mut chains = Chains::default();
        let mut chained = true;
        for (p, plan) in plans.iter().enumerate() {
            let mut start = 0;
            for &end in &plan.level_ends {
                chained &= end - start <= 1;
                start = end;
            }
            chains.of[p] = plan.arrays.clone();
        }
        (chains, chained)
    }
}

impl Tlb {
    /// Simulates one access along its page size's chain (the hierarchy is chained): the same
    /// state changes, in the same order, as [`Tlb::simulate`].
    #[inline(always)]
    pub(super) fn simulate_chained(&mut self, tag: u64, va: u64, page: PageSize, depth: u32) {
        let vpn = tag >> 6;
        let links = self.chains.of[page as usize].len();
        let mut reached = links;
        for i in 0..links {
            if self.probe(self.chains.of[page as usize][i] as usize, tag, vpn) {
                reached = i;
                break;
            }
        }
        if reached == links {
            self.walk(va, depth);
        }
        let chain = &self.chains.of[page as usize];
        for &ai in &chain[..reached] {
            let ai = ai as usize;
            if self.arrays[ai].fill(tag, vpn, &mut self.rng) {
                self.counters[ai].evictions += 1;
            }
        }
    }
}

impl Tlb {
    /// [`Tlb::run`] for a hierarchy that is chained and whose arrays are all narrow LRU over a
    /// power of two of sets (the skylake and champsim_default presets): one loop that translates
    /// through the memo, counts repeats of the previous access's page as L1 hits, and simulates
    /// the rest along their chain with the arrays' narrow paths. Counts exactly what
    /// [`Tlb::run_general`] counts, state change for state change.
    pub(super) fn run_kernel(
        &mut self,
        addresses: &[u64],
        pages: &mut Pages<'_>,
        translate: &impl Fn(u64) -> Option<Translation>,
    ) {
        // Per page size: accesses simulated, and per link of its chain hits and evictions (the
        // lookups follow: every simulated access looks up the first link, every miss the next).
        let mut tally = Tally::default();
        // The previous access's entry and the L1 arrays holding it (`EMPTY` when none does),
        // and its page (`va - lo < len`): a repeat is an L1 hit on the most recent entry.
        let (last_tag, last_mask) = self.last.unwrap_or((EMPTY, 0));
        let mut cursor = Cursor { last_tag, last_mask, faults: 0 };
        let (mut lo, mut len) = (0u64, 0u64);
        let mut streak = 0u64;
        // A dense table for the fixed loops, and the index before which none is entered again
        // (one that stopped at once waits a while: mixed page sizes would thrash).
        if self.fixed.iter().any(Option::is_some) {
            pages.memo.plan(addresses.len());
        }
        let mut retry_at = 0;
        let mut i = 0;
        while let Some(&va) = addresses.get(i) {
            if va.wrapping_sub(lo) < len {
                // A run of accesses to the previous page, counted in a tight loop of its own.
                let run = stretch(&addresses[i..], va, len.trailing_zeros());
                streak += run as u64;
                i += run;
                continue;
            }
            i += 1;
            let bits = pages.resolve_packed(va, translate);
            if bits & KIND != 0 {
                if bits == DEEP {
                    // A depth too large to remember (never from a page table): simulated as
                    // the general path does.
                    let Known::Page { page, depth, group } = pages.ask(va, translate) else {
                        cursor.faults += 1;
                        continue;
                    };
                    self.count_l1_hits(cursor.last_mask, std::mem::take(&mut streak));
                    self.last = (cursor.last_tag != EMPTY).then_some((cursor.last_tag, cursor.last_mask));
                    if let Some(a) = self.admit(va, page, depth, group) {
                        self.simulate_chained(a.tag, va, page, depth);
                    }
                    self.stats.accesses -= 1; // counted with the others at the end
                    (cursor.last_tag, cursor.last_mask) = self.last.unwrap_or((EMPTY, 0));
                    (lo, len) = (0, 0);
                    continue;
                }
                cursor.faults += 1;
                continue;
            }
            let (page, depth) = (PageSize::ALL[(bits & 3) as usize], bits >> 8);
            let tag = ((va >> (PAGE_SHIFT[(bits & 3) as usize] + ((bits >> 2) & 15))) << 6) | u64::from(bits & 63);
            if tag != cursor.last_tag {
                if streak != 0 {
                    self.count_l1_hits(cursor.last_mask, streak);
                    streak = 0;
                }
                let l1_mask = self.plans[page as usize].l1_mask;
                (cursor.last_tag, cursor.last_mask) = if l1_mask != 0 { (tag, l1_mask) } else { (EMPTY, 0) };
                if !self.simulate_kernel(&mut tally, tag, page) {
                    self.walk(va, depth);
                }
                // The rest of this stretch of pages like this one, in the size's fixed loop.
                if let (Some(fixed), Some(table), true) =
                    (self.fixed[page as usize], pages.memo.dense_table(page), i >= retry_at)
                {
                    let next = fixed(self, Handoff { addresses, start: i, bits, table }, &mut cursor, &mut tally);
                    if next < i + 16 {
                        retry_at = next + 64;
                    }
                    i = next;
                    (lo, len) = (0, 0);
                    continue;
                }
            } else {
                // Another page of the previous access's (coalesced) entry.
                streak += 1;
            }
            (lo, len) = if cursor.last_tag == EMPTY { (0, 0) } else { (va & !(page.bytes() - 1), page.bytes()) };
        }
        self.count_l1_hits(cursor.last_mask, streak);
        self.last = (cursor.last_tag != EMPTY).then_some((cursor.last_tag, cursor.last_mask));
        self.stats.accesses += addresses.len() as u64 - cursor.faults;
        self.stats.faults += cursor.faults;
        for (p, chain) in self.chains.of.iter().enumerate() {
            let mut reach = tally.simulated[p];
            for (i, &ai) in chain.iter().enumerate() {
                let (a, c) = (&self.arrays[ai as usize], &mut self.counters[ai as usize]);
                let hits = tally.hits[p][i];
                c.lookups += reach;
                c.hits += hits;
                c.misses += reach - hits;
                c.evictions += tally.evictions[p][i];
                self.stats.cycles = self.stats.cycles.saturating_add(hits.saturating_mul(a.hit_cycles));
                reach -= hits;
            }
        }
    }

    /// Simulates one access along its chain of kernel arrays, counting into `tally`; returns
    /// whether a link hit (otherwise the caller walks).
    #[inline(always)]
    fn simulate_kernel(&mut self, tally: &mut Tally, tag: u64, page: PageSize) -> bool {
        let (vpn, fp, p) = (tag >> 6, fingerprint(tag), page as usize);
        let chain = &self.chains.of[p][..];
        tally.simulated[p] += 1;
        if let &[l1, l2] = chain {
            // Two levels (the common shape), unrolled.
            let (l1, l2) = (l1 as usize, l2 as usize);
            if self.arrays[l1].lookup_narrow(tag, vpn, fp) {
                tally.hits[p][0] += 1;
                return true;
            }
            let hit = self.arrays[l2].lookup_narrow(tag, vpn, fp);
            if hit {
                tally.hits[p][1] += 1;
            } else {
                tally.evictions[p][1] += u64::from(self.arrays[l2].fill_narrow(tag, vpn, fp));
            }
            tally.evictions[p][0] += u64::from(self.arrays[l1].fill_narrow(tag, vpn, fp));
            return hit;
        }
        let mut reached = chain.len();
        for (i, &ai) in chain.iter().enumerate() {
            if self.arrays[ai as usize].lookup_narrow(tag, vpn, fp) {
                tally.hits[p][i & 3] += 1;
                reached = i;
                break;
            }
        }
        for (i, &ai) in chain[..reached].iter().enumerate() {
            tally.evictions[p][i & 3] += u64::from(self.arrays[ai as usize].fill_narrow(tag, vpn, fp));
        }
        reached < chain.len()
    }
}

/// How many of the leading `addresses` lie on the page of `va` (`1 << shift` bytes, aligned):
/// blocks of eight at a time (one reduction a block, which the compiler vectorises), then one by
/// one.
#[inline(always)]
pub(super) fn stretch(addresses: &[u64], va: u64, shift: u32) -> usize {
    let mut n = 0;
    for block in addresses.chunks_exact(8) {
        if block.iter().fold(0, |acc, &v| acc | (v ^ va)) >> shift != 0 {
            break;
        }
        n += 8;
    }
    n + addresses[n..].iter().take_while(|&&v| (v ^ va) >> shift == 0).count()
}

/// What [`Tlb::run_kernel`] counts, per page size and link (a chain has at most 4 links: one a
/// level).
#[derive(Default)]
pub(super) struct Tally {
    pub simulated: [u64; 4],
    pub hits: [[u64; 4]; 4],
    pub evictions: [[u64; 4]; 4],
}

/// Where [`Tlb::run_kernel`] stands: the previous access's entry and the L1 arrays holding it
/// (`EMPTY` and 0 when none does), and the faults counted so far.
pub(super) struct Cursor {
    pub last_tag: u64,
    pub last_mask: u8,
    pub faults: u64,
}
