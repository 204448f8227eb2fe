//! `Memo`: the translations one `Tlb::run` has already asked for, so that random access over a
//! footprint costs a table probe instead of a page-table walk per address.
//!
//! Two tables: one direct-mapped by 2 MiB region, which answers for a region covered by one
//! 2 MiB or 1 GiB page (or says the region holds smaller pages), and one by 4 KiB granule, which
//! answers for 4 KiB and 64 KiB pages and for granules that are not mapped. The granule table is
//! dense — one word per granule of the run's span, so a footprint of any size never conflicts —
//! when that span is at most [`DENSE_GRANULES`] granules and at most four per address of the run
//! (clearing it then costs less than the run); otherwise direct-mapped. The choice is made once
//! per run, at its first granule to remember, so a run over huge pages only never scans its
//! addresses for their span. Runs of the kernel also keep a dense table by 2 MiB region for
//! huge and giant pages ([`Memo::plan`]), grown as regions are remembered; the fixed loops read
//! both dense tables directly ([`Memo::dense_table`]). A slot is valid only
//! for the run that filled it (its generation), so a new run, which may see another page table,
//! starts empty without clearing anything.
//!
//! Invariants: a valid slot holds what `translate` said for an address in its region or granule
//! during the current run (the page table does not change during a run; every address of a page
//! translates to that page); a slot never answers for another key (the key is compared); a
//! nonzero word of a dense table is `DENSE_KNOWN` over what `translate` said for an address of its
//! granule or region during the current run, and the region table holds only regions one huge
//! or giant page covers.

use npumem_base::PageSize;

/// Packed: a fault, a split region; kinds sit in bits 6-7.
pub(super) const FAULT: u32 = 1 << 6;
const SPLIT: u32 = 2 << 6;
/// Not stored: what `Pages::resolve_packed` says of a page whose depth does not fit 24 bits.
pub(super) const DEEP: u32 = 3 << 6;
const REGION_SHIFT: u32 = 21;
const GRANULE_SHIFT: u32 = 12;
/// 2 MiB regions remembered: 8 GiB mapped with huge or giant pages without a conflict.
const REGION_BITS: u32 = 12;
/// 4 KiB granules remembered: 128 MiB mapped with 4 KiB pages, in 512 KiB of slots.
const GRANULE_BITS: u32 = 15;
/// The widest span with a dense granule table: 4 GiB, in 8 MiB of words.
pub(super) const DENSE_GRANULES: u64 = 1 << 20;
/// A dense word's bit saying it is known (the packed answer is below it).
pub(super) const DENSE_KNOWN: u64 = 1 << 32;
/// The widest span of 2 MiB regions with a dense region table beyond four per address of the
/// run: 8192 regions (16 GiB), 64 KiB of words.
const DENSE_REGIONS_FREE: u64 = 1 << 13;

/// What a run knows of an address's page.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Known {
    /// Mapped: its page size, walk depth and the pages its TLB entry covers.
    Page { page: PageSize, depth: u32, group: u32 },
    /// Not mapped.
    Fault,
    /// A 2 MiB region that holds pages smaller than itself (ask the granule table).
    Split,
}

/// A slot: 16 aligned bytes, what is known packed in one word (`Known::pack`), so a lookup reads
/// it in one load.
#[derive(Clone, Copy, Debug)]
struct Slot {
    key: u64,
    generation: u32,
    known: u32,
}

impl Known {
    /// Bits 0-1 the page size, 2-5 log2 of the group (a power of two up to 512), 6-7 the kind
    /// (page, fault, split), 8-31 the depth (`None` for a depth that does not fit: not
    /// remembered).
    pub(super) fn pack(self) -> Option<u32> {
        match self {
            Known::Page { page, depth, group } => {
                (depth < 1 << 24).then(|| page as u32 | group.trailing_zeros() << 2 | depth << 8)
            }
            Known::Fault => Some(FAULT),
            Known::Split => Some(SPLIT),
        }
    }

    #[inline(always)]
    pub(super) fn unpack(bits: u32) -> Self {
        match (bits >> 6) & 3 {
            0 => Known::Page {
                page: PageSize::ALL[(bits & 3) as usize],
                depth: bits >> 8,
                group: 1 << ((bits >> 2) & 15),
            },
            1 => Known::Fault,
            _ => Known::Split,
        }
    }
}

#[derive(Debug)]
pub(super) struct Memo {
    generation: u32,
    regions: Vec<Slot>,
    granules: Vec<Slot>,
    /// The dense granule table of this run (empty when it uses `granules`), from granule
    /// `dense_first`: 0 unknown, else `DENSE_KNOWN | packed`.
    dense: Vec<u64>,
    dense_first: u64,
    /// Whether this run has chosen its granule table (at its first granule to remember).
    decided: bool,
    /// The dense region table of this run (empty until a huge or giant page is remembered),
    /// from region `dense_regions_first`: 0 unknown, else `DENSE_KNOWN | packed` for a region
    /// one 2 MiB or 1 GiB page covers (split regions and faults are not kept in it). It grows
    /// to the regions remembered, at least doubling its span each time, up to
    /// `dense_regions_cap` regions (0 without [`Memo::plan`]: no table).
    dense_regions: Vec<u64>,
    dense_regions_first: u64,
    dense_regions_cap: u64,
}

/// A dense table of what a run knows, for the fixed loops ([`super::fixed`]): one word per unit
/// (`DENSE_KNOWN | packed`, or 0 while unknown) from unit `first`, a unit being `1 << shift`
/// bytes.
#[derive(Clone, Copy)]
pub(super) struct DenseTable<'a> {
    pub words: &'a [u64],
    pub first: u64,
    pub shift: u32,
}

/// The lowest and highest of `addresses` (`None` when empty): lane-wise minima and maxima over
/// chunks (independent chains), then across lanes.
fn bounds(addresses: &[u64]) -> Option<(u64, u64)> {
    let (mut lo, mut hi) = ([u64::MAX; 4], [0u64; 4]);
    let chunks = addresses.chunks_exact(4);
    for &va in chunks.remainder() {
        (lo[0], hi[0]) = (lo[0].min(va), hi[0].max(va));
    }
    for c in chunks {
        for k in 0..4 {
            (lo[k], hi[k]) = (lo[k].min(c[k]), hi[k].max(c[k]));
        }
    }
    let (lo, hi) = (lo.into_iter().min().unwrap_or(u64::MAX), hi.into_iter().max().unwrap_or(0));
    (lo <= hi).then_some((lo, hi))
}

#[inline]
fn slot_of(key: u64, bits: u32) -> usize {
    (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - bits)) as usize
}

impl Memo {
    pub(super) fn new() -> Self {
        let empty = Slot { key: 0, generation: 0, known: FAULT };
        Memo {
            generation: 0,
            regions: vec![empty; 1 << REGION_BITS],
            granules: vec![empty; 1 << GRANULE_BITS],
            dense: Vec::new(),
            dense_first: 0,
            decided: false,
            dense_regions: Vec::new(),
            dense_regions_first: 0,
            dense_regions_cap: 0,
        }
    }

    /// Forgets everything (a new run).
    pub(super) fn start_run(&mut self) {
        self.dense.clear();
        self.dense_regions.clear();
        self.dense_regions_cap = 0;
        self.decided = false;
        self.generation = self.generation.wrapping_add(1);
        if self.generation == 0 {
            // After 2^32 runs the oldest slots could look current again: clear them once.
            self.regions.iter_mut().chain(self.granules.iter_mut()).for_each(|s| s.generation = 0);
            self.generation = 1;
        }
    }

    /// What this run knows of `va`'s page, packed ([`Known::pack`]), if anything.
    #[inline(always)]
    pub(super) fn get_packed(&self, va: u64) -> Option<u32> {
        let region = va >> REGION_SHIFT;
        let r = self.regions[slot_of(region, REGION_BITS)];
        if r.generation != self.generation || r.key != region {
            return None;
        }
        if r.known != SPLIT {
            return Some(r.known);
        }
        let granule = va >> GRANULE_SHIFT;
        if !self.dense.is_empty() {
            let word = self.dense.get(granule.wrapping_sub(self.dense_first) as usize).copied().unwrap_or(0);
            return (word & DENSE_KNOWN != 0).then_some(word as u32);
        }
        let g = self.granules[slot_of(granule, GRANULE_BITS)];
        (g.generation == self.generation && g.key == granule).then_some(g.known)
    }

    /// What this run knows of `va`'s page, if anything.
    #[inline(always)]
    pub(super) fn get(&self, va: u64) -> Option<Known> {
        self.get_packed(va).map(Known::unpack)
    }

    /// Chooses the granule table of this run over `addresses` (once, before the first granule is
    /// remembered: a run of huge pages only never pays for the span).
    #[cold]
    fn decide(&mut self, addresses: &[u64]) {
        self.decided = true;
        if let Some((lo, hi)) = bounds(addresses) {
            let span = (hi >> GRANULE_SHIFT) - (lo >> GRANULE_SHIFT) + 1;
            if span <= DENSE_GRANULES && span <= 4 * addresses.len() as u64 {
                self.dense.resize(span as usize, 0);
                self.dense_first = lo >> GRANULE_SHIFT;
            }
        }
    }

    /// Lets this run, of `accesses` addresses, keep a dense region table spanning up to four
    /// 2 MiB regions per address plus [`DENSE_REGIONS_FREE`] (at most [`DENSE_GRANULES`]).
    pub(super) fn plan(&mut self, accesses: usize) {
        self.dense_regions_cap = (4 * accesses as u64).saturating_add(DENSE_REGIONS_FREE).min(DENSE_GRANULES);
    }

    /// Writes `word` for `region` in the dense region table, growing it when the span stays
    /// within its cap (to twice the span, on the side it grew: amortised linear).
    fn remember_region(&mut self, region: u64, word: u64) {
        let (first, len) = (self.dense_regions_first, self.dense_regions.len() as u64);
        let at = region.wrapping_sub(first);
        if at >= len {
            let (lo, hi) = if len == 0 { (region, region) } else { (first.min(region), (first + len - 1).max(region)) };
            let span = hi - lo + 1;
            if span > self.dense_regions_cap {
                return;
            }
            let want = (2 * span).max(64).min(self.dense_regions_cap);
            let new_first = if len != 0 && region < first { lo - (want - span).min(lo) } else { lo };
            let mut words = vec![0u64; want as usize];
            if len != 0 {
                let offset = (first - new_first) as usize;
                words[offset..offset + len as usize].copy_from_slice(&self.dense_regions);
            }
            (self.dense_regions, self.dense_regions_first) = (words, new_first);
        }
        let at = region.wrapping_sub(self.dense_regions_first) as usize;
        self.dense_regions[at] = word;
    }

    /// The dense table a fixed loop reads for pages of `page` size: the granule table for 4 KiB
    /// and 64 KiB pages, the region table for 2 MiB and 1 GiB ones; `None` when this run has
    /// none.
    pub(super) fn dense_table(&self, page: PageSize) -> Option<DenseTable<'_>> {
        let (words, first, shift) = match page {
            PageSize::Size4K | PageSize::Size64K => (&self.dense, self.dense_first, GRANULE_SHIFT),
            PageSize::Size2M | PageSize::Size1G => (&self.dense_regions, self.dense_regions_first, REGION_SHIFT),
        };
        (!words.is_empty()).then_some(DenseTable { words, first, shift })
    }

    /// Remembers what `translate` said of `va` (`Known::Page` or `Known::Fault`; a page whose
    /// depth does not fit a slot is not remembered).
    #[inline]
    pub(super) fn put(&mut self, va: u64, known: Known, addresses: &[u64]) {
        let Some(packed) = known.pack() else { return };
        let generation = self.generation;
        let region = va >> REGION_SHIFT;
        let whole = matches!(known, Known::Page { page: PageSize::Size2M | PageSize::Size1G, .. });
        self.regions[slot_of(region, REGION_BITS)] =
            Slot { key: region, generation, known: if whole { packed } else { SPLIT } };
        if whole {
            self.remember_region(region, DENSE_KNOWN | u64::from(packed));
        }
        if !whole {
            if !self.decided {
                self.decide(addresses);
            }
            let granule = va >> GRANULE_SHIFT;
            if !self.dense.is_empty() {
                if let Some(word) = self.dense.get_mut(granule.wrapping_sub(self.dense_first) as usize) {
                    *word = DENSE_KNOWN | u64::from(packed);
                }
                return;
            }
            self.granules[slot_of(granule, GRANULE_BITS)] = Slot { key: granule, generation, known: packed };
        }
    }
}
