//! `BlockMap`: the live blocks of one npumem pool, by start address, for a pool that keeps its own
//! records (one used alone: tests, benchmarks). Under a `Device` the pool leaves them to the
//! device's live table (owner tracking: one record per live block) and its maps stay empty. Small
//! blocks are kept beside the pages that hold them: a block starts on a quantum boundary, so a page
//! where a small block ever started has one record per quantum, and insert, remove and lookup are
//! an index computation and one record access — no hashing, and blocks that are neighbours in
//! memory are neighbours in the map (a batch of thousands of 4 KiB blocks touches a few lines).
//! On pages of more than `DENSE_QUANTA` quanta (2 MiB pages), a large block (at least
//! 1/`DENSE_SHARE` of a page, `large_from` bytes, a power of two) is kept in a coarser array
//! instead: per page where a large block ever started, one record per `large_from` bytes (16
//! records, 256 bytes). Two live large blocks are at least `large_from` bytes apart, so at most
//! one starts in each such bucket; its record keeps the block's quantum offset in the bucket
//! (`at`), which a lookup checks. A per-quantum array for such blocks would be mostly empty and
//! scattered (64 KiB a 2 MiB page at 512 bytes), so that every malloc and free touched a cold
//! line of a cold page of records; a hash map by address (what they had before) costs a hash and
//! a probe on every insert and remove.
//!
//! Invariants: a block starting at `ptr` is recorded in exactly one place: the record of its
//! quantum in its page's array if it is small, else the record of its bucket in its page's
//! coarse array (with `at` its quantum offset in the bucket); `len` counts the
//! blocks and `bytes` sums their sizes; `size - requested < quantum` (the pool rounds requests
//! up to the quantum), which is what lets a record keep the difference in 16 bits. Memory is
//! one 16-byte record per quantum of every page a small block ever started in (3% of the range
//! used, at a 512-byte quantum), plus 16 records per page a large block ever started in.

use crate::vm::PageSize;

/// Blocks smaller than 1/`DENSE_SHARE` of a page are kept in their page's record array.
const DENSE_SHARE: u64 = 16;
/// Pages of at most this many quanta keep every block in their record array (at most 16 KiB of
/// records a page: small pages' arrays are dense enough).
const DENSE_QUANTA: u64 = 1024;

// A record is 16 bytes: a page of small records is 64 KiB at a 512-byte quantum.
const _: () = assert!(std::mem::size_of::<Record>() == 16);

/// Record `slot` of `page` in `arrays` (per page, an array of `per_page` records, made when a
/// page first needs one).
#[inline(always)]
fn record_in(arrays: &mut Vec<Option<Box<[Record]>>>, page: usize, slot: usize, per_page: usize) -> &mut Record {
    if page >= arrays.len() {
        arrays.resize_with(page + 1, || None);
    }
    &mut arrays[page].get_or_insert_with(|| vec![Record::default(); per_page].into_boxed_slice())[slot]
}

/// A live block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Block {
    /// Bytes set aside (the request rounded up to the quantum).
    pub size: u64,
    /// Bytes asked for.
    pub requested: u64,
    /// The page size backing the block.
    pub page: PageSize,
}

#[derive(Clone, Copy, Debug, Default)]
struct Record {
    size: u64,
    slack: u16,
    /// None: no block starts here.
    page: Option<PageSize>,
    /// In a coarse (large-block) record: the block's offset in its bucket, in quanta.
    at: u32,
}

#[derive(Debug)]
pub struct BlockMap {
    base: u64,
    page_shift: u32,
    quantum_shift: u32,
    /// `page - 1` and `quantum - 1`, and records per page.
    page_mask: u64,
    quantum_mask: u64,
    per_page: usize,
    /// Blocks of at least this many bytes are large (a power of two; `u64::MAX`: none are).
    large_from: u64,
    /// `log2(large_from)`, `large_from - 1`, and coarse records per page.
    large_shift: u32,
    large_mask: u64,
    large_per_page: usize,
    pages: Vec<Option<Box<[Record]>>>,
    /// Per page, the large blocks' records, one per `large_from` bytes.
    large: Vec<Option<Box<[Record]>>>,
    len: usize,
    bytes: u64,
}

impl BlockMap {
    /// A map of blocks in a range starting at `base`, with pages of `page` bytes and blocks
    /// starting on multiples of `quantum` (both powers of two, quantum ≤ 64 KiB).
    pub fn new(base: u64, page: u64, quantum: u64) -> Self {
        assert!(page.is_power_of_two() && quantum.is_power_of_two() && quantum <= page && quantum <= 1 << 16);
        let large_from = if page / quantum > DENSE_QUANTA { (page / DENSE_SHARE).max(quantum) } else { u64::MAX };
        let large_shift = if large_from == u64::MAX { 0 } else { large_from.trailing_zeros() };
        BlockMap {
            base,
            page_shift: page.trailing_zeros(),
            quantum_shift: quantum.trailing_zeros(),
            page_mask: page - 1,
            quantum_mask: quantum - 1,
            per_page: (page / quantum) as usize,
            large_from,
            large_shift,
            large_mask: large_from.wrapping_sub(1),
            large_per_page: if large_from == u64::MAX { 0 } else { (page / large_from) as usize },
            pages: Vec::new(),
            large: Vec::new(),
            len: 0,
            bytes: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The sum of the live blocks' sizes.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    #[inline]
    fn at(&self, ptr: u64) -> (usize, usize) {
        let offset = ptr - self.base;
        let page = (offset >> self.page_shift) as usize;
        let slot = ((offset & self.page_mask) >> self.quantum_shift) as usize;
        (page, slot)
    }

    /// Whether `ptr` can start a block: inside the range, on a quantum boundary.
    #[inline]
    fn can_start(&self, ptr: u64) -> bool {
        ptr >= self.base && ptr & self.quantum_mask == 0
    }

    #[inline]
    fn record(&self, ptr: u64) -> Option<&Record> {
        if !self.can_start(ptr) {
            return None;
        }
        let (page, slot) = self.at(ptr);
        match self.pages.get(page).and_then(Option::as_ref).map(|records| &records[slot]) {
            Some(record) if record.page.is_some() => Some(record),
            _ => {
                let (bucket, at) = self.bucket(ptr);
                let record = &self.large.get(page)?.as_ref()?[bucket];
                (record.page.is_some() && record.at == at).then_some(record)
            }
        }
    }

    /// A large block's bucket in its page's coarse array, and its offset there in quanta.
    #[inline(always)]
    fn bucket(&self, ptr: u64) -> (usize, u32) {
        let offset = (ptr - self.base) & self.page_mask;
        ((offset >> self.large_shift) as usize, ((offset & self.large_mask) >> self.quantum_shift) as u32)
    }

    /// Records a live block at `ptr` (a quantum multiple inside the range, where no live block
    /// starts).
    #[inline(always)]
    pub fn insert(&mut self, ptr: u64, block: Block) {
        let slack = block.size - block.requested;
        debug_assert!(slack < 1 << self.quantum_shift);
        let mut new = Record { size: block.size, slack: slack as u16, page: Some(block.page), at: 0 };
        let record = if block.size >= self.large_from {
            let (bucket, at) = self.bucket(ptr);
            new.at = at;
            let page = ((ptr - self.base) >> self.page_shift) as usize;
            record_in(&mut self.large, page, bucket, self.large_per_page)
        } else {
            let (page, slot) = self.at(ptr);
            record_in(&mut self.pages, page, slot, self.per_page)
        };
        debug_assert!(record.page.is_none(), "a block already starts at {ptr:#x}");
        *record = new;
        self.len += 1;
        self.bytes += block.size;
    }

    /// Removes and returns the live block at `ptr`.
    #[inline(always)]
    pub fn remove(&mut self, ptr: u64) -> Option<Block> {
        if !self.can_start(ptr) {
            return None;
        }
        let (page, slot) = self.at(ptr);
        // The page's small records first (a page of the large pool seldom has them, so that
        // look is cheap there), then its coarse ones.
        let mut block = match self.pages.get_mut(page) {
            Some(Some(records)) => Self::take(&mut records[slot], None),
            _ => None,
        };
        if block.is_none() {
            let (bucket, at) = self.bucket(ptr);
            if let Some(Some(records)) = self.large.get_mut(page) {
                block = Self::take(&mut records[bucket], Some(at));
            }
        }
        let block = block?;
        self.len -= 1;
        self.bytes -= block.size;
        Some(block)
    }

    pub fn get(&self, ptr: u64) -> Option<Block> {
        self.record(ptr).and_then(Self::block)
    }

    /// Starts loading the record of a small block at `ptr` into the cache (a hint, with no
    /// effect on the contents: a batch names a block a few places ahead, so that its record's
    /// cache miss overlaps the work on those before). Does nothing for a pointer outside the
    /// range or on a page without records.
    #[inline(always)]
    pub fn prefetch(&self, ptr: u64) {
        if ptr < self.base {
            return;
        }
        let (page, slot) = self.at(ptr);
        if let Some(Some(records)) = self.pages.get(page) {
            if let Some(record) = records.get(slot) {
                crate::prefetch::prefetch(record);
            }
        }
    }

    /// The block of `record`, which no longer starts there, if one does (at offset `at` in its
    /// bucket, for a coarse record).
    #[inline(always)]
    fn take(record: &mut Record, at: Option<u32>) -> Option<Block> {
        if at.is_some_and(|at| record.at != at) {
            return None;
        }
        let block = Self::block(record)?;
        record.page = None;
        Some(block)
    }

    fn block(record: &Record) -> Option<Block> {
        let page = record.page?;
        Some(Block { size: record.size, requested: record.size - record.slack as u64, page })
    }

    /// The live blocks in address order: the small ones (in order already) merged with the
    /// large ones, sorted.
    pub fn iter(&self) -> impl Iterator<Item = (u64, Block)> + '_ {
        let mut large = self.large_blocks().peekable();
        let mut small = self.small().peekable();
        std::iter::from_fn(move || match (small.peek(), large.peek()) {
            (Some(s), Some(l)) if l.0 < s.0 => large.next(),
            (Some(_), _) => small.next(),
            (None, _) => large.next(),
        })
    }

    /// The large blocks, in address order.
    fn large_blocks(&self) -> impl Iterator<Item = (u64, Block)> + '_ {
        self.large.iter().enumerate().filter_map(|(i, p)| p.as_ref().map(|r| (i, r))).flat_map(move |(i, records)| {
            let page_start = self.base + ((i as u64) << self.page_shift);
            records.iter().enumerate().filter_map(move |(j, r)| {
                let ptr = page_start + ((j as u64) << self.large_shift) + ((r.at as u64) << self.quantum_shift);
                Self::block(r).map(|b| (ptr, b))
            })
        })
    }

    fn small(&self) -> impl Iterator<Item = (u64, Block)> + '_ {
        self.pages.iter().enumerate().filter_map(|(i, p)| p.as_ref().map(|r| (i, r))).flat_map(move |(i, records)| {
            let page_start = self.base + ((i as u64) << self.page_shift);
            records
                .iter()
                .enumerate()
                .filter_map(move |(j, r)| Self::block(r).map(|b| (page_start + ((j as u64) << self.quantum_shift), b)))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    proptest! {
        /// Against a BTreeMap: the same blocks after any mix of inserts and removes.
        #[test]
        fn behaves_like_an_ordered_map(
            ops in proptest::collection::vec((any::<bool>(), 0u64..2000, 1u64..2000, any::<bool>()), 1..300),
            huge_pages in any::<bool>(),
        ) {
            let base = 1 << 40;
            // Small blocks in the pages' record arrays, large ones in the pages' coarse arrays,
            // on 64 KiB and 2 MiB pages: the same answers as the model. Blocks do not overlap
            // (the pool never makes two live blocks share bytes).
            let page = if huge_pages { 2 << 20 } else { 64 * 1024 };
            let spread = if huge_pages { 4 } else { 1 };
            let mut map = BlockMap::new(base, page, 512);
            let mut model: BTreeMap<u64, Block> = BTreeMap::new();
            for (insert, slot, requested, large) in ops {
                let ptr = base + slot * 512 * spread;
                let requested = if large { requested * 1024 } else { requested };
                let size = requested.div_ceil(512) * 512;
                let free = model.range(..ptr + size).next_back().is_none_or(|(&p, b)| p + b.size <= ptr);
                if insert && free {
                    let block = Block { size, requested, page: PageSize::Size64K };
                    map.insert(ptr, block);
                    model.insert(ptr, block);
                } else {
                    prop_assert_eq!(map.remove(ptr), model.remove(&ptr));
                }
                prop_assert_eq!(map.get(ptr), model.get(&ptr).copied());
                prop_assert_eq!(map.get(ptr + 512), model.get(&(ptr + 512)).copied());
                prop_assert_eq!(map.len(), model.len());
                prop_assert_eq!(map.bytes(), model.values().map(|b| b.size).sum::<u64>());
            }
            prop_assert_eq!(map.iter().collect::<Vec<_>>(), model.clone().into_iter().collect::<Vec<_>>());
            prop_assert_eq!(map.get(base - 512), None);
            if let Some((&ptr, _)) = model.iter().next() {
                prop_assert_eq!(map.remove(ptr + 64), None);
            }
        }
    }
}
