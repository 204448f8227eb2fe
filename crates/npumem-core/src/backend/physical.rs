//! `PhysicalBooks`: the books every backend keeps of its physical allocations — the handles it
//! gave out, how many live mappings each has, and which of them were freed while still mapped
//! (`aclrtFreePhysical` on a mapped handle defers the release of its memory until the last
//! unmap). Each backend keeps beside an entry what is its own (frames, a memfd, the runtime's
//! handle) and does the releasing; the books say *when*.
//!
//! Invariants:
//! - handles are issued from 1 upwards from one counter for the whole process and never reused,
//!   so a handle of another device (or backend) is unknown to these books, never another entry;
//! - an entry is held from `insert` until it is *released*: by `free` when it has no mapping,
//!   else by the `unmap` that takes its last mapping — exactly once, and handed back to the
//!   caller at that moment (`Some(entry)`), never otherwise;
//! - an entry is *live* until `free` is asked for it; only a live entry may be mapped or freed
//!   (else `ACL_ERROR_RT_INVALID_HANDLE`, and nothing changes); a freed entry that is still
//!   mapped only waits for its unmaps;
//! - `mapped` counts the entry's live mappings and never goes below zero: an unmap of a handle
//!   with no mapping is an internal error that changes nothing;
//! - `held_bytes` is the sum of the sizes of the entries held (live or waiting for unmaps);
//! - the maps and unmaps the books count (with their pages) go into the backend's
//!   [`BackendCounters`] as they are counted; frees are counted by the backend, which may not
//!   get its memory back at once (a runtime that refuses).

use std::sync::atomic::{AtomicU64, Ordering};

use rustc_hash::FxHashMap;

use super::{BackendCounters, PhysHandle};
use crate::error::{AclError, ErrorCode, Result};
use crate::vm::{PageKind, PageSize, Translation};

/// Checks the size of a physical allocation of `kind` memory in `page` pages: a non-zero
/// multiple of the page (the allocation granularity).
pub fn check_size(size: u64, page: PageSize, kind: PageKind) -> Result<()> {
    if size == 0 || size % page.bytes() != 0 {
        return Err(AclError::invalid_param(format!(
            "physical allocation size {size} must be a non-zero multiple of the {} granularity of {} memory",
            page.label(),
            kind.label()
        )));
    }
    Ok(())
}

/// Where `va`, in the mapping of `handle` that starts at `start`, lies — for backends whose
/// physical addresses are not visible (host memory, a runtime's): the allocation's handle and
/// the offset in it stand for the physical address (equal for two mappings of one byte), with
/// the page-table depth `page` pages would take.
pub fn handle_translation(start: u64, handle: PhysHandle, va: u64, page: PageSize) -> Translation {
    let depth = match page {
        PageSize::Size1G => 2,
        PageSize::Size2M => 3,
        _ => 4,
    };
    Translation { pa: (handle << 40) | (va - start), page_size: page, depth }
}

/// One physical allocation in the books: its size and page size, its mappings, and what the
/// backend keeps of it (`memory`).
#[derive(Debug)]
pub struct Physical<T> {
    pub size: u64,
    pub page: PageSize,
    pub memory: T,
    mapped: u32,
    free_requested: bool,
}

impl<T> Physical<T> {
    /// Live mappings of this allocation.
    pub fn mapped(&self) -> u32 {
        self.mapped
    }

    /// Whether `free` was asked for it (it waits for its last unmap).
    pub fn free_requested(&self) -> bool {
        self.free_requested
    }
}

/// The physical allocations of one backend (see the module's invariants).
#[derive(Debug)]
pub struct PhysicalBooks<T> {
    entries: FxHashMap<PhysHandle, Physical<T>>,
    held_bytes: u64,
}

impl<T> Default for PhysicalBooks<T> {
    fn default() -> Self {
        PhysicalBooks { entries: FxHashMap::default(), held_bytes: 0 }
    }
}

/// The next handle of any backend in the process.
static NEXT_HANDLE: AtomicU64 = AtomicU64::new(1);

fn unknown(handle: PhysHandle) -> AclError {
    AclError::new(ErrorCode::RtInvalidHandle, format!("physical handle {handle} is unknown or already freed"))
}

impl<T> PhysicalBooks<T> {
    /// Records a new allocation of `size` bytes of `page` pages, unmapped; returns its handle.
    pub fn insert(&mut self, size: u64, page: PageSize, memory: T) -> PhysHandle {
        let handle = NEXT_HANDLE.fetch_add(1, Ordering::Relaxed);
        self.entries.insert(handle, Physical { size, page, memory, mapped: 0, free_requested: false });
        self.held_bytes += size;
        handle
    }

    /// The live (not freed) allocation `handle`.
    pub fn live(&self, handle: PhysHandle) -> Result<&Physical<T>> {
        self.entries.get(&handle).filter(|p| !p.free_requested).ok_or_else(|| unknown(handle))
    }

    /// The allocation `handle`, live or waiting for its unmaps.
    pub fn get(&self, handle: PhysHandle) -> Option<&Physical<T>> {
        self.entries.get(&handle)
    }

    /// The page size of the allocation `handle` (live or waiting for its unmaps): what a
    /// mapping of it holds, so that the books not knowing it is an internal error.
    pub fn page(&self, handle: PhysHandle) -> Result<PageSize> {
        self.entries.get(&handle).map(|p| p.page).ok_or_else(|| {
            AclError::internal(format!("a mapping holds physical handle {handle}, which the books do not"))
        })
    }

    /// Frees `handle`: released now (returned) when it has no mapping, else at its last unmap
    /// (`None`). An unknown or already freed handle is an error and changes nothing.
    pub fn free(&mut self, handle: PhysHandle) -> Result<Option<Physical<T>>> {
        let p = self.entries.get_mut(&handle).filter(|p| !p.free_requested).ok_or_else(|| unknown(handle))?;
        if p.mapped > 0 {
            p.free_requested = true;
            return Ok(None);
        }
        Ok(self.take(handle))
    }

    /// Counts a new mapping of the live allocation `handle` (and its pages in `counters`).
    pub fn map(&mut self, handle: PhysHandle, counters: &mut BackendCounters) -> Result<()> {
        let p = self.entries.get_mut(&handle).filter(|p| !p.free_requested).ok_or_else(|| unknown(handle))?;
        p.mapped += 1;
        counters.maps += 1;
        counters.pages_mapped += p.size / p.page.bytes();
        Ok(())
    }

    /// Counts an unmap of `handle` (and its pages in `counters`); returns the allocation when
    /// that released it (it was freed and this was its last mapping).
    pub fn unmap(&mut self, handle: PhysHandle, counters: &mut BackendCounters) -> Result<Option<Physical<T>>> {
        let p = self
            .entries
            .get_mut(&handle)
            .filter(|p| p.mapped > 0)
            .ok_or_else(|| AclError::internal(format!("physical handle {handle} has no mapping to take away")))?;
        p.mapped -= 1;
        counters.unmaps += 1;
        counters.pages_unmapped += p.size / p.page.bytes();
        if p.mapped == 0 && p.free_requested {
            return Ok(self.take(handle));
        }
        Ok(None)
    }

    fn take(&mut self, handle: PhysHandle) -> Option<Physical<T>> {
        let p = self.entries.remove(&handle)?;
        self.held_bytes -= p.size;
        Some(p)
    }

    /// Bytes of the allocations held (live or waiting for their unmaps).
    pub fn held_bytes(&self) -> u64 {
        self.held_bytes
    }

    /// Allocations held.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Every allocation held, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (PhysHandle, &Physical<T>)> {
        self.entries.iter().map(|(&h, p)| (h, p))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    const PAGE: PageSize = PageSize::Size4K;

    #[test]
    fn freeing_a_mapped_allocation_waits_for_its_last_unmap() {
        let (mut b, mut c) = (PhysicalBooks::default(), BackendCounters::default());
        let h = b.insert(8192, PAGE, "frames");
        b.map(h, &mut c).unwrap();
        b.map(h, &mut c).unwrap();
        assert!(b.free(h).unwrap().is_none(), "mapped: deferred");
        assert_eq!(b.free(h).unwrap_err().code, ErrorCode::RtInvalidHandle, "a second free");
        assert!(b.map(h, &mut c).is_err(), "a freed handle maps no more");
        assert!(b.live(h).is_err() && b.get(h).is_some_and(|p| p.free_requested()));
        assert!(b.unmap(h, &mut c).unwrap().is_none());
        assert_eq!(b.held_bytes(), 8192);
        let released = b.unmap(h, &mut c).unwrap().expect("the last unmap releases");
        assert_eq!((released.memory, released.size, released.mapped()), ("frames", 8192, 0));
        assert_eq!((b.held_bytes(), b.len()), (0, 0));
        assert_eq!(b.unmap(h, &mut c).unwrap_err().code, ErrorCode::RtDrvInternal);
        let h2 = b.insert(4096, PAGE, "more");
        assert!(h2 > h, "handles are not reused");
        assert!(b.free(h2).unwrap().is_some(), "unmapped: released at once");
        assert_eq!((c.maps, c.unmaps, c.pages_mapped, c.pages_unmapped), (2, 2, 4, 4));
        assert!(check_size(0, PAGE, PageKind::Normal).is_err() && check_size(6000, PAGE, PageKind::Normal).is_err());
        check_size(8192, PAGE, PageKind::Normal).unwrap();
    }

    #[derive(Clone, Debug)]
    enum Op {
        Insert(u64),
        Free(usize),
        Map(usize),
        Unmap(usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (1u64..16).prop_map(|pages| Op::Insert(pages * 4096)),
            (0usize..12).prop_map(Op::Free),
            (0usize..12).prop_map(Op::Map),
            (0usize..12).prop_map(Op::Unmap),
        ]
    }

    /// The model: per handle ever issued, (size, mappings, freed, released).
    #[derive(Default)]
    struct Model {
        handles: Vec<PhysHandle>,
        state: BTreeMap<PhysHandle, (u64, u32, bool, bool)>,
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]
        /// Random programs of inserts, frees, maps and unmaps (valid and not) against a model:
        /// every call answers as the model says, an allocation is released exactly once — by a
        /// free without mappings or by the last unmap after a free — and the byte count matches.
        #[test]
        fn books_match_a_simple_model(ops in proptest::collection::vec(op(), 1..80)) {
            let (mut books, mut counters) = (PhysicalBooks::default(), BackendCounters::default());
            let mut m = Model::default();
            let (mut maps, mut unmaps) = (0u64, 0u64);
            let mut released = Vec::new();
            for op in ops {
                let pick = |i: usize| m.handles.get(i % m.handles.len().max(1)).copied().unwrap_or(999);
                match op {
                    Op::Insert(size) => {
                        let h = books.insert(size, PAGE, size);
                        prop_assert!(!m.state.contains_key(&h), "handle {} reused", h);
                        m.handles.push(h);
                        m.state.insert(h, (size, 0, false, false));
                    }
                    Op::Free(i) => {
                        let h = pick(i);
                        let got = books.free(h);
                        match m.state.get_mut(&h) {
                            Some((size, mapped, freed @ false, done)) => {
                                *freed = true;
                                let out = got.unwrap();
                                prop_assert_eq!(out.is_some(), *mapped == 0);
                                if let Some(p) = out {
                                    prop_assert_eq!(p.memory, *size);
                                    *done = true;
                                    released.push(h);
                                }
                            }
                            _ => prop_assert!(got.is_err()),
                        }
                    }
                    Op::Map(i) => {
                        let h = pick(i);
                        let got = books.map(h, &mut counters);
                        match m.state.get_mut(&h) {
                            Some((_, mapped, false, _)) => {
                                got.unwrap();
                                *mapped += 1;
                                maps += 1;
                            }
                            _ => prop_assert!(got.is_err()),
                        }
                    }
                    Op::Unmap(i) => {
                        let h = pick(i);
                        let got = books.unmap(h, &mut counters);
                        match m.state.get_mut(&h) {
                            Some((size, mapped, freed, done)) if *mapped > 0 => {
                                *mapped -= 1;
                                unmaps += 1;
                                let out = got.unwrap();
                                prop_assert_eq!(out.is_some(), *mapped == 0 && *freed);
                                if let Some(p) = out {
                                    prop_assert_eq!(p.memory, *size);
                                    *done = true;
                                    released.push(h);
                                }
                            }
                            _ => prop_assert!(got.is_err()),
                        }
                    }
                }
                let held: Vec<_> = m.state.iter().filter(|(_, s)| !s.3).map(|(&h, s)| (h, s.0)).collect();
                prop_assert_eq!(books.len(), held.len());
                prop_assert_eq!((counters.maps, counters.unmaps), (maps, unmaps));
                prop_assert_eq!(books.held_bytes(), held.iter().map(|&(_, s)| s).sum::<u64>());
                for (h, s) in &m.state {
                    match books.get(*h) {
                        Some(p) => prop_assert!(!s.3 && p.mapped() == s.1 && p.free_requested() == s.2),
                        None => prop_assert!(s.3),
                    }
                }
            }
            let mut unique = released.clone();
            unique.sort_unstable();
            unique.dedup();
            prop_assert_eq!(unique.len(), released.len(), "released twice");
        }
    }
}
