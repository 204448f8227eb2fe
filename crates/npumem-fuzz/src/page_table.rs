//! The page table against a model: map / unmap / translate sequences on
//! `npumem_core::vm::PageTable`, judged by a `BTreeMap` of mapped pages.
//!
//! Checked after every step: a map succeeds exactly when the VA is in range and aligned, the
//! frame aligned and in the physical address range, and the page overlaps no mapped page; an
//! unmap succeeds exactly when that page (same VA, same size) is mapped, and returns its frame;
//! every translation agrees with the model (address, page size, walk depth); the statistics
//! count the model's pages, and the tables per level are exactly those the model's pages need
//! (empty tables are pruned). At the end, unmapping everything leaves the root alone.

use std::collections::{BTreeMap, BTreeSet};

use arbitrary::{Arbitrary, Unstructured};
use npumem_core::units::{GIB, MIB};
use npumem_core::vm::page_table::VA_BITS;
use npumem_core::vm::{PageSize, PageTable};

/// Two level-0 regions (512 GiB apart), so level-0 tables come and go too.
const BASES: [u64; 2] = [0x1000_0000_0000, 0x1000_0000_0000 + (512 << 30)];
/// Physical addresses the table can hold (bits 12..52 of a descriptor).
const PA_LIMIT: u64 = 1 << 52;

#[derive(Arbitrary, Debug)]
enum Va {
    /// An aligned VA in a small area, so pages of different sizes collide often.
    Near { region: bool, gib: u8, mib2: u8, page: u16 },
    /// Any value: out of range, misaligned, ...
    Raw(u64),
}

#[derive(Arbitrary, Debug)]
enum Pa {
    Frame(u16),
    Raw(u64),
}

#[derive(Arbitrary, Debug)]
enum Op {
    Map {
        size: u8,
        va: Va,
        pa: Pa,
    },
    Unmap {
        size: u8,
        va: Va,
    },
    /// Unmaps the model's `n`-th page with its own size.
    UnmapLive(u16),
    Translate {
        va: Va,
        offset: u32,
    },
}

fn size_of(k: u8) -> PageSize {
    PageSize::ALL[k as usize % 4]
}

fn va_of(va: &Va, size: PageSize) -> u64 {
    match *va {
        Va::Near { region, gib, mib2, page } => {
            let mut v = BASES[usize::from(region)] + u64::from(gib % 4) * GIB;
            if size.bytes() < GIB {
                v += u64::from(mib2 % 8) * 2 * MIB;
            }
            if size.bytes() < 2 * MIB {
                v += u64::from(page) * size.bytes() % (2 * MIB);
            }
            v
        }
        Va::Raw(v) => v,
    }
}

fn pa_of(pa: &Pa, size: PageSize) -> u64 {
    match *pa {
        Pa::Frame(f) => u64::from(f) * size.bytes() % (1 << 44),
        Pa::Raw(p) => p,
    }
}

fn depth(size: PageSize) -> u32 {
    match size {
        PageSize::Size1G => 2,
        PageSize::Size2M => 3,
        PageSize::Size4K | PageSize::Size64K => 4,
    }
}

/// The mapped page holding `va`, if any.
fn holding(model: &BTreeMap<u64, (u64, PageSize)>, va: u64) -> Option<(u64, u64, PageSize)> {
    let (&v, &(p, s)) = model.range(..=va).next_back()?;
    (va < v + s.bytes()).then_some((v, p, s))
}

/// Tables per level that the model's pages need: the root, one level-1 table per 512 GiB
/// region in use, one level-2 table per 1 GiB range holding pages below 1 GiB, one level-3
/// table per 2 MiB range holding 4 KiB / 64 KiB pages.
fn tables_needed(model: &BTreeMap<u64, (u64, PageSize)>) -> [u64; 4] {
    let mut sets: [BTreeSet<u64>; 3] = Default::default();
    for (&v, &(_, s)) in model {
        sets[0].insert(v >> 39);
        if s.bytes() < GIB {
            sets[1].insert(v >> 30);
        }
        if s.bytes() < 2 * MIB {
            sets[2].insert(v >> 21);
        }
    }
    [1, sets[0].len() as u64, sets[1].len() as u64, sets[2].len() as u64]
}

pub fn run(data: &[u8]) {
    let ops: Vec<Op> = crate::sequence(&mut Unstructured::new(data), 512);
    let mut pt = PageTable::new();
    let mut model: BTreeMap<u64, (u64, PageSize)> = BTreeMap::new();
    for op in &ops {
        match op {
            Op::Map { size, va, pa } => {
                let size = size_of(*size);
                let (va, pa) = (va_of(va, size), pa_of(pa, size));
                let valid = va >> VA_BITS == 0
                    && va % size.bytes() == 0
                    && pa % size.bytes() == 0
                    && pa < PA_LIMIT
                    && model.range(..va + size.bytes()).next_back().is_none_or(|(&v, &(_, s))| v + s.bytes() <= va);
                let r = pt.map(va, pa, size);
                assert_eq!(r.is_ok(), valid, "map({va:#x}, {pa:#x}, {size:?}) = {r:?}; model {model:x?}");
                if valid {
                    model.insert(va, (pa, size));
                }
            }
            Op::Unmap { size, va } => {
                let size = size_of(*size);
                let va = va_of(va, size);
                let r = pt.unmap(va, size);
                match model.get(&va) {
                    Some(&(pa, s)) if s == size => {
                        assert_eq!(r.ok(), Some(pa), "unmap({va:#x}, {size:?})");
                        model.remove(&va);
                    }
                    _ => assert!(r.is_err(), "unmap({va:#x}, {size:?}) of a page not mapped so: {r:?}"),
                }
            }
            Op::UnmapLive(n) => {
                if model.is_empty() {
                    continue;
                }
                let (&va, &(pa, size)) = model.iter().nth(usize::from(*n) % model.len()).expect("in range");
                assert_eq!(pt.unmap(va, size).ok(), Some(pa), "unmap of the mapped page {va:#x} {size:?}");
                model.remove(&va);
            }
            Op::Translate { va, offset } => {
                let va = va_of(va, PageSize::Size4K).wrapping_add(u64::from(*offset));
                let got = pt.translate(va).map(|t| (t.pa, t.page_size, t.depth));
                let want = holding(&model, va).map(|(v, p, s)| (p + (va - v), s, depth(s)));
                assert_eq!(got, want, "translate({va:#x})");
            }
        }
        check(&pt, &model);
    }
    for (&va, &(pa, size)) in &model {
        assert_eq!(pt.unmap(va, size).ok(), Some(pa), "final unmap of {va:#x}");
    }
    assert_eq!(pt.stats().tables, [1, 0, 0, 0], "tables left after unmapping everything");
}

fn check(pt: &PageTable, model: &BTreeMap<u64, (u64, PageSize)>) {
    let stats = pt.stats();
    let mut pages = [0u64; 4];
    for &(_, s) in model.values() {
        pages[PageSize::ALL.iter().position(|&p| p == s).expect("listed")] += 1;
    }
    assert_eq!(stats.pages, pages, "pages per size");
    assert_eq!(stats.mapped_bytes, model.values().map(|&(_, s)| s.bytes()).sum::<u64>());
    assert_eq!(stats.tables, tables_needed(model), "tables per level (pruning)");
    for (&v, &(p, s)) in model {
        for off in [0, s.bytes() - 1] {
            let t = pt.translate(v + off).expect("a mapped page translates");
            assert_eq!((t.pa, t.page_size, t.depth), (p + off, s, depth(s)), "translate({:#x})", v + off);
        }
    }
}
