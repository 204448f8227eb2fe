//! `BlockMap`: the live blocks of one npumem pool, by start address, kept beside the pages
//! that hold them: a block starts on a quantum boundary, so each page of the pool's range has
//! one record per quantum, allocated the first time a block starts in that page. Insert, remove
//! and lookup are an index computation and one record access — no hashing, and blocks that are
//! neighbours in memory are neighbours in the map. Where a page holds many quanta (a 2 MiB page
//! has 4,096 at 512 bytes) its record array is 64 KiB for the few blocks such pages hold, and a
//! malloc or free would touch a cold line of a cold page of records each time: pools with more
//! than `DENSE_RECORDS` quanta a page keep their records in one hash map by address instead
//! (hundreds of kilobytes for thousands of blocks, where the arrays took hundreds of megabytes).
//!
//! Invariants: a record is set iff a live block starts at its address; `len` counts the set
//! records and `bytes` sums their sizes; `size - requested < quantum` (the pool rounds requests up to the quantum), which is
//! what lets a record keep the difference in 16 bits. Memory is one 16-byte record per quantum
//! of every page a block ever started in (3% of the range used, at a 512-byte quantum), or, in
//! the hash-map form, one entry per live block.

use rustc_hash::FxHashMap;

use crate::vm::PageSize;

/// Pages of up to this many quanta keep an array of records; larger ones, a hash map.
const DENSE_RECORDS: u64 = 1024;

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
    pages: Vec<Option<Box<[Record]>>>,
    /// The records by address, in place of `pages`, when a page has more than `DENSE_RECORDS`
    /// quanta.
    sparse: Option<FxHashMap<u64, Record>>,
    len: usize,
    bytes: u64,
}

impl BlockMap {
    /// A map of blocks in a range starting at `base`, with pages of `page` bytes and blocks
    /// starting on multiples of `quantum` (both powers of two, quantum ≤ 64 KiB).
    pub fn new(base: u64, page: u64, quantum: u64) -> Self {
        assert!(page.is_power_of_two() && quantum.is_power_of_two() && quantum <= page && quantum <= 1 << 16);
        BlockMap {
            base,
            page_shift: page.trailing_zeros(),
            quantum_shift: quantum.trailing_zeros(),
            page_mask: page - 1,
            quantum_mask: quantum - 1,
            per_page: (page / quantum) as usize,
            pages: Vec::new(),
            sparse: (page / quantum > DENSE_RECORDS).then(FxHashMap::default),
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
        if let Some(sparse) = &self.sparse {
            return sparse.get(&ptr);
        }
        let (page, slot) = self.at(ptr);
        self.pages.get(page)?.as_ref().map(|records| &records[slot])
    }

    /// Records a live block at `ptr` (a quantum multiple inside the range, where no live block
    /// starts).
    #[inline(always)]
    pub fn insert(&mut self, ptr: u64, block: Block) {
        let slack = block.size - block.requested;
        debug_assert!(slack < 1 << self.quantum_shift);
        let new = Record { size: block.size, slack: slack as u16, page: Some(block.page) };
        if let Some(sparse) = &mut self.sparse {
            let old = sparse.insert(ptr, new);
            debug_assert!(old.is_none(), "a block already starts at {ptr:#x}");
        } else {
            let (page, slot) = self.at(ptr);
            if page >= self.pages.len() {
                self.pages.resize_with(page + 1, || None);
            }
            let per_page = self.per_page;
            let records =
                self.pages[page].get_or_insert_with(|| vec![Record::default(); per_page].into_boxed_slice());
            let record = &mut records[slot];
            debug_assert!(record.page.is_none(), "a block already starts at {ptr:#x}");
            *record = new;
        }
        self.len += 1;
        self.bytes += block.size;
    }

    /// Removes and returns the live block at `ptr`.
    #[inline(always)]
    pub fn remove(&mut self, ptr: u64) -> Option<Block> {
        if !self.can_start(ptr) {
            return None;
        }
        let block = if let Some(sparse) = &mut self.sparse {
            Self::block(&sparse.remove(&ptr)?)?
        } else {
            let (page, slot) = self.at(ptr);
            let record = &mut self.pages.get_mut(page)?.as_mut()?[slot];
            let block = Self::block(record)?;
            record.page = None;
            block
        };
        self.len -= 1;
        self.bytes -= block.size;
        Some(block)
    }

    pub fn get(&self, ptr: u64) -> Option<Block> {
        self.record(ptr).and_then(Self::block)
    }

    fn block(record: &Record) -> Option<Block> {
        let page = record.page?;
        Some(Block { size: record.size, requested: record.size - record.slack as u64, page })
    }

    /// The live blocks in address order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, Block)> + '_ {
        let mut sparse: Vec<(u64, Block)> = self
            .sparse
            .iter()
            .flatten()
            .filter_map(|(&ptr, r)| Self::block(r).map(|b| (ptr, b)))
            .collect();
        sparse.sort_unstable_by_key(|&(ptr, _)| ptr);
        sparse.into_iter().chain(self.dense())
    }

    fn dense(&self) -> impl Iterator<Item = (u64, Block)> + '_ {
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
            ops in proptest::collection::vec((any::<bool>(), 0u64..2000, 1u64..2000), 1..300),
            huge_pages in any::<bool>(),
        ) {
            let base = 1 << 40;
            // 64 KiB pages keep arrays of records, 2 MiB pages a hash map: the same answers.
            let page = if huge_pages { 2 << 20 } else { 64 * 1024 };
            let mut map = BlockMap::new(base, page, 512);
            prop_assert_eq!(map.sparse.is_some(), huge_pages);
            let mut model = BTreeMap::new();
            for (insert, slot, requested) in ops {
                let ptr = base + slot * 512;
                if insert && !model.contains_key(&ptr) {
                    let block = Block { size: requested.div_ceil(512) * 512, requested, page: PageSize::Size64K };
                    map.insert(ptr, block);
                    model.insert(ptr, block);
                } else {
                    prop_assert_eq!(map.remove(ptr), model.remove(&ptr));
                }
                prop_assert_eq!(map.get(ptr), model.get(&ptr).copied());
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
