//! `PageTable`: a 4-level radix page table with a 4 KiB granule (Arm VMSAv8-style, 48-bit VA).
//!
//! Level 0 entries cover 512 GiB, level 1 1 GiB, level 2 2 MiB, level 3 4 KiB. A 1 GiB page is a
//! block entry at level 1, a 2 MiB page a block entry at level 2, a 4 KiB page an entry at level 3,
//! and a 64 KiB page 16 aligned, contiguous level-3 entries that carry the contiguous hint.
//! Tables live in an arena and are 512 raw 64-bit descriptors each, as in hardware.
//!
//! Descriptor encoding: bit 0 valid; bit 1 set = table pointer (bits 12.. = arena index),
//! clear = leaf (bits 12..52 = physical address); bit 2 = contiguous hint.
//!
//! Invariants: a VA is covered by at most one leaf; a table exists only while it has a valid
//! entry (empty tables are freed on unmap, the root excepted); `live` of each table equals its
//! number of valid descriptors; the leaf counters equal the leaves in the tree.

pub use npumem_base::Translation;

use super::PageSize;
use crate::error::{AclError, Result};

const ENTRIES: usize = 512;
const VALID: u64 = 1;
const TABLE: u64 = 2;
const CONTIG: u64 = 4;
const ADDR_MASK: u64 = 0x000F_FFFF_FFFF_F000;
/// VA bits translated by the table.
pub const VA_BITS: u32 = 48;
const CONTIG_RUN: usize = 16;

/// Bit position of each level's index.
const SHIFT: [u32; 4] = [39, 30, 21, 12];

#[inline]
fn index(va: u64, level: usize) -> usize {
    ((va >> SHIFT[level]) & (ENTRIES as u64 - 1)) as usize
}

fn leaf_level(size: PageSize) -> usize {
    match size {
        PageSize::Size1G => 1,
        PageSize::Size2M => 2,
        PageSize::Size4K | PageSize::Size64K => 3,
    }
}

/// Counts of entries and tables.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PageTableStats {
    /// Mapped pages per page size, in `PageSize::ALL` order (a 64 KiB page counts once).
    pub pages: [u64; 4],
    /// Valid leaf descriptors per page size (a 64 KiB page uses 16).
    pub leaf_entries: [u64; 4],
    /// Tables per level (level 0 is the root).
    pub tables: [u64; 4],
    /// Bytes of descriptor memory the tables occupy (4 KiB each).
    pub table_bytes: u64,
    pub mapped_bytes: u64,
}

#[derive(Debug)]
struct Table {
    entries: Box<[u64; ENTRIES]>,
    live: u16,
    level: u8,
}

#[derive(Debug)]
pub struct PageTable {
    tables: Vec<Option<Table>>,
    free_slots: Vec<u32>,
    pages: [u64; 4],
    tables_per_level: [u64; 4],
}

impl Default for PageTable {
    fn default() -> Self {
        Self::new()
    }
}

fn size_slot(size: PageSize) -> usize {
    PageSize::ALL.iter().position(|&p| p == size).expect("listed")
}

impl PageTable {
    pub fn new() -> Self {
        let mut pt = PageTable { tables: Vec::new(), free_slots: Vec::new(), pages: [0; 4], tables_per_level: [0; 4] };
        pt.new_table(0);
        pt
    }

    fn new_table(&mut self, level: u8) -> u32 {
        let table = Table { entries: Box::new([0; ENTRIES]), live: 0, level };
        self.tables_per_level[level as usize] += 1;
        match self.free_slots.pop() {
            Some(slot) => {
                self.tables[slot as usize] = Some(table);
                slot
            }
            None => {
                self.tables.push(Some(table));
                (self.tables.len() - 1) as u32
            }
        }
    }

    fn table(&self, slot: u32) -> &Table {
        self.tables[slot as usize].as_ref().expect("live table")
    }

    fn table_mut(&mut self, slot: u32) -> &mut Table {
        self.tables[slot as usize].as_mut().expect("live table")
    }

    fn check_va(va: u64, size: PageSize) -> Result<()> {
        if va >> VA_BITS != 0 {
            return Err(AclError::rt_param(format!("virtual address {va:#x} is beyond the {VA_BITS}-bit VA range")));
        }
        if va % size.bytes() != 0 {
            return Err(AclError::new(
                crate::ErrorCode::RtAddrUnaligned,
                format!("virtual address {va:#x} is not aligned to its {} page", size.label()),
            ));
        }
        Ok(())
    }

    /// Walks from the root to `level`, creating tables on the way. Fails if a block entry
    /// already covers the VA.
    fn walk_create(&mut self, va: u64, level: usize) -> Result<u32> {
        let mut slot = 0u32;
        for l in 0..level {
            let i = index(va, l);
            let entry = self.table(slot).entries[i];
            slot = if entry & VALID == 0 {
                let child = self.new_table(l as u8 + 1);
                let t = self.table_mut(slot);
                t.entries[i] = ((child as u64) << 12) | TABLE | VALID;
                t.live += 1;
                child
            } else if entry & TABLE != 0 {
                (entry >> 12) as u32
            } else {
                return Err(already_mapped(va));
            };
        }
        Ok(slot)
    }

    /// Maps one page of `size` at `va` onto the physical frame at `pa`.
    pub fn map(&mut self, va: u64, pa: u64, size: PageSize) -> Result<()> {
        Self::check_va(va, size)?;
        if pa % size.bytes() != 0 || pa & !ADDR_MASK != 0 {
            return Err(AclError::internal(format!(
                "physical frame {pa:#x} is not aligned to a {} page",
                size.label()
            )));
        }
        let level = leaf_level(size);
        let slot = self.walk_create(va, level)?;
        let first = index(va, level);
        let run = if size == PageSize::Size64K { CONTIG_RUN } else { 1 };
        let t = self.table_mut(slot);
        if t.entries[first..first + run].iter().any(|&e| e & VALID != 0) {
            let empty = t.live == 0;
            if empty {
                self.prune(va, level);
            }
            return Err(already_mapped(va));
        }
        let flags = if run > 1 { CONTIG | VALID } else { VALID };
        for (k, e) in t.entries[first..first + run].iter_mut().enumerate() {
            *e = (pa + (k as u64) * 4096) | flags;
        }
        t.live += run as u16;
        self.pages[size_slot(size)] += 1;
        Ok(())
    }

    /// Unmaps the page of `size` at `va` and returns its physical frame.
    pub fn unmap(&mut self, va: u64, size: PageSize) -> Result<u64> {
        Self::check_va(va, size)?;
        let level = leaf_level(size);
        let run = if size == PageSize::Size64K { CONTIG_RUN } else { 1 };
        let path = self.path(va, level).ok_or_else(|| not_mapped(va, size))?;
        let slot = path[level];
        let first = index(va, level);
        let t = self.table_mut(slot);
        let head = t.entries[first];
        let want_contig = if run > 1 { CONTIG } else { 0 };
        let ok =
            t.entries[first..first + run].iter().all(|&e| e & (VALID | TABLE) == VALID && e & CONTIG == want_contig);
        if !ok {
            return Err(not_mapped(va, size));
        }
        t.entries[first..first + run].fill(0);
        t.live -= run as u16;
        self.pages[size_slot(size)] -= 1;
        if self.table(slot).live == 0 {
            self.prune(va, level);
        }
        Ok(head & ADDR_MASK)
    }

    /// The table slots from the root to `level` along `va`, if all exist.
    fn path(&self, va: u64, level: usize) -> Option<[u32; 4]> {
        let mut path = [0u32; 4];
        for l in 0..level {
            let e = self.table(path[l]).entries[index(va, l)];
            if e & (VALID | TABLE) != (VALID | TABLE) {
                return None;
            }
            path[l + 1] = (e >> 12) as u32;
        }
        Some(path)
    }

    /// Frees empty tables from `level` upwards along `va` (never the root).
    fn prune(&mut self, va: u64, level: usize) {
        let Some(path) = self.path(va, level) else { return };
        for l in (1..=level).rev() {
            if self.table(path[l]).live != 0 {
                break;
            }
            let t = self.tables[path[l] as usize].take().expect("live table");
            self.tables_per_level[t.level as usize] -= 1;
            self.free_slots.push(path[l]);
            let parent = self.table_mut(path[l - 1]);
            parent.entries[index(va, l - 1)] = 0;
            parent.live -= 1;
        }
    }

    /// Walks the table for `va`.
    pub fn translate(&self, va: u64) -> Option<Translation> {
        if va >> VA_BITS != 0 {
            return None;
        }
        let mut slot = 0u32;
        for level in 0..4 {
            let e = self.table(slot).entries[index(va, level)];
            if e & VALID == 0 {
                return None;
            }
            if e & TABLE != 0 {
                if level == 3 {
                    return None;
                }
                slot = (e >> 12) as u32;
                continue;
            }
            let (page_size, offset_mask) = match level {
                1 => (PageSize::Size1G, PageSize::Size1G.bytes() - 1),
                2 => (PageSize::Size2M, PageSize::Size2M.bytes() - 1),
                3 if e & CONTIG != 0 => (PageSize::Size64K, 4095),
                3 => (PageSize::Size4K, 4095),
                _ => return None,
            };
            return Some(Translation { pa: (e & ADDR_MASK) + (va & offset_mask), page_size, depth: level as u32 + 1 });
        }
        None
    }

    pub fn stats(&self) -> PageTableStats {
        let mut s = PageTableStats { pages: self.pages, tables: self.tables_per_level, ..Default::default() };
        for (i, size) in PageSize::ALL.iter().enumerate() {
            let per_page = if *size == PageSize::Size64K { CONTIG_RUN as u64 } else { 1 };
            s.leaf_entries[i] = self.pages[i] * per_page;
            s.mapped_bytes += self.pages[i] * size.bytes();
        }
        s.table_bytes = self.tables_per_level.iter().sum::<u64>() * 4096;
        s
    }
}

fn already_mapped(va: u64) -> AclError {
    AclError::rt_param(format!("virtual address {va:#x} is already mapped; unmap it first"))
}

fn not_mapped(va: u64, size: PageSize) -> AclError {
    AclError::rt_param(format!("no {} page is mapped at virtual address {va:#x}", size.label()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::units::{GIB, MIB};
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    const BASE: u64 = 0x1000_0000_0000;

    #[test]
    fn maps_each_size_with_its_depth() {
        let mut pt = PageTable::new();
        pt.map(BASE, 0x4000_0000, PageSize::Size1G).unwrap();
        pt.map(BASE + GIB, 0x20_0000, PageSize::Size2M).unwrap();
        pt.map(BASE + GIB + 2 * MIB, 0x1000, PageSize::Size4K).unwrap();
        pt.map(BASE + GIB + 2 * MIB + 64 * 1024, 0x10_0000, PageSize::Size64K).unwrap();
        let t = pt.translate(BASE + 123).unwrap();
        assert_eq!((t.pa, t.page_size, t.depth), (0x4000_0000 + 123, PageSize::Size1G, 2));
        let t = pt.translate(BASE + GIB + 5).unwrap();
        assert_eq!((t.pa, t.page_size, t.depth), (0x20_0005, PageSize::Size2M, 3));
        let t = pt.translate(BASE + GIB + 2 * MIB + 7).unwrap();
        assert_eq!((t.pa, t.page_size, t.depth), (0x1007, PageSize::Size4K, 4));
        let t = pt.translate(BASE + GIB + 2 * MIB + 64 * 1024 + 5000).unwrap();
        assert_eq!((t.pa, t.page_size, t.depth), (0x10_0000 + 5000, PageSize::Size64K, 4));
        assert_eq!(pt.translate(BASE + 3 * GIB), None);
        let s = pt.stats();
        assert_eq!(s.pages, [1, 1, 1, 1]);
        assert_eq!(s.leaf_entries, [1, 16, 1, 1]);
        assert_eq!(s.tables, [1, 1, 1, 1]);
        // Overlaps are refused.
        assert!(pt.map(BASE + 4096, 0, PageSize::Size4K).is_err());
        assert!(pt.map(BASE + GIB, 0, PageSize::Size1G).is_err());
        assert!(pt.map(BASE + GIB + 2 * MIB + 64 * 1024 + 4096, 0, PageSize::Size4K).is_err());
        // Wrong size on unmap is refused; right size works and prunes tables.
        assert!(pt.unmap(BASE, PageSize::Size2M).is_err());
        assert!(pt.unmap(BASE + GIB + 2 * MIB + 64 * 1024, PageSize::Size4K).is_err());
        assert_eq!(pt.unmap(BASE, PageSize::Size1G).unwrap(), 0x4000_0000);
        pt.unmap(BASE + GIB, PageSize::Size2M).unwrap();
        pt.unmap(BASE + GIB + 2 * MIB, PageSize::Size4K).unwrap();
        pt.unmap(BASE + GIB + 2 * MIB + 64 * 1024, PageSize::Size64K).unwrap();
        assert_eq!(pt.stats(), PageTableStats { tables: [1, 0, 0, 0], table_bytes: 4096, ..Default::default() });
    }

    #[test]
    fn rejects_misaligned_and_out_of_range() {
        let mut pt = PageTable::new();
        assert_eq!(pt.map(BASE + 4096, 0, PageSize::Size2M).unwrap_err().code, crate::ErrorCode::RtAddrUnaligned);
        assert!(pt.map(1 << 50, 0, PageSize::Size4K).is_err());
        assert!(pt.map(BASE, 0x1000, PageSize::Size2M).is_err());
        assert_eq!(pt.translate(u64::MAX), None);
    }

    fn size_of(k: u8) -> PageSize {
        PageSize::ALL[k as usize % 4]
    }

    proptest! {
        #[test]
        fn agrees_with_model(ops in proptest::collection::vec((any::<bool>(), 0u8..4, 0u64..64, 0u64..4096), 1..200)) {
            // Model: VA page start -> (pa, size). Slots are 2 MiB apart inside a 128 MiB area plus
            // one 1 GiB slot, so pages of different sizes collide often.
            let mut pt = PageTable::new();
            let mut model: BTreeMap<u64, (u64, PageSize)> = BTreeMap::new();
            for (map, k, slot, frame) in ops {
                let size = size_of(k);
                let va = if size == PageSize::Size1G { BASE + GIB } else { BASE + GIB + (slot * 2 * MIB) + if size.bytes() < 2 * MIB { (frame % 32) * size.bytes() % (2 * MIB) } else { 0 } };
                let va = va - va % size.bytes();
                let pa = frame * size.bytes() % (1 << 44);
                let overlaps = model.iter().any(|(&v, &(_, s))| va < v + s.bytes() && v < va + size.bytes());
                if map {
                    let r = pt.map(va, pa, size);
                    prop_assert_eq!(r.is_ok(), !overlaps);
                    if r.is_ok() { model.insert(va, (pa, size)); }
                } else {
                    let exact = model.get(&va).is_some_and(|&(_, s)| s == size);
                    let r = pt.unmap(va, size);
                    prop_assert_eq!(r.is_ok(), exact);
                    if exact { prop_assert_eq!(r.unwrap(), model.remove(&va).unwrap().0); }
                }
                for (&v, &(p, s)) in &model {
                    let t = pt.translate(v + s.bytes() - 1).unwrap();
                    prop_assert_eq!(t.pa, p + s.bytes() - 1);
                    prop_assert_eq!(t.page_size, s);
                }
                let st = pt.stats();
                prop_assert_eq!(st.mapped_bytes, model.values().map(|&(_, s)| s.bytes()).sum::<u64>());
            }
            for (v, (_, s)) in model { pt.unmap(v, s).unwrap(); }
            prop_assert_eq!(pt.stats().tables, [1, 0, 0, 0]);
        }
    }
}
