//! `SimBackend`: a simulated NPU whose HBM bytes are really stored.
//!
//! Physical memory comes from the buddy [`FrameAllocator`]; every map writes real descriptors into
//! the [`PageTable`]; every byte access walks that table and lands in [`PhysMemory`], so what is
//! written through one mapping is read back through any other mapping of the same frames.
//!
//! Byte access moves page by page through the page table, never through a buffer sized by the
//! request: a copy pairs source and destination pages and hands each physically contiguous piece
//! to [`PhysMemory`], so copying gigabytes costs no host memory beyond the destination chunks that
//! receive written bytes, and copying (or reading, or zeroing) never-written memory allocates
//! nothing. Overlapping copies behave as `memmove` (overlap judged on device addresses; two
//! mappings of the same frames that overlap physically are as undefined as on the device).
//!
//! Invariants: each physical allocation owns `size / page` frames of its page size; a frame is
//! owned by at most one allocation; its frames return to the allocator exactly when the
//! books ([`Ledger`]) release it (freed, and no mapping left); every mapping lies in a
//! reservation and no reservation with a live mapping is released; a byte operation that fails
//! (unmapped address, host out of memory) changes no byte.

use super::ledger::Ledger;
use super::physical::{self, Physical};
use super::{Backend, BackendCounters, PhysHandle};
use crate::acl::MemScope;
use crate::error::{AclError, Result};
use crate::units::{GIB, MIB, format_size};
use crate::vm::{
    FrameAllocator, FrameStats, PageKind, PageSize, PageTable, PageTableStats, PhysMemory, Translation, VaSpace,
};

/// Configuration of a simulated device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SimConfig {
    /// Bytes of HBM.
    pub capacity: u64,
    /// The normal page: 4 KiB or 64 KiB.
    pub normal_page: PageSize,
    /// 1 GiB frames set aside at start for giant pages.
    pub giant_frames: u64,
}

/// The largest simulated device: 1 TiB of HBM (real NPUs carry up to a few hundred GiB).
pub const MAX_CAPACITY: u64 = 1 << 40;

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig { capacity: 32 * GIB, normal_page: PageSize::Size4K, giant_frames: 0 }
    }
}

/// What the simulator keeps of a physical allocation: its page kind and its frames.
#[derive(Debug)]
struct Frames {
    kind: PageKind,
    frames: Vec<u64>,
}

#[derive(Debug)]
pub struct SimBackend {
    config: SimConfig,
    /// Reservations in the device window, the mappings in them and the physical allocations.
    ledger: Ledger<Frames>,
    frames: FrameAllocator,
    page_table: PageTable,
    memory: PhysMemory,
}

impl SimBackend {
    pub fn new(config: SimConfig) -> Result<Self> {
        Self::with_window(config, VaSpace::default())
    }

    /// A simulated device whose addresses come from `space` (a slice of the device window
    /// when several devices share one address space).
    pub fn with_window(config: SimConfig, space: VaSpace) -> Result<Self> {
        if !matches!(config.normal_page, PageSize::Size4K | PageSize::Size64K) {
            return Err(AclError::invalid_param(format!(
                "normal_page must be 4KiB or 64KiB, not {}",
                config.normal_page.label()
            )));
        }
        if config.capacity > MAX_CAPACITY {
            return Err(AclError::invalid_param(format!(
                "capacity {} is larger than the simulator's limit of {}; choose a smaller device",
                format_size(config.capacity),
                format_size(MAX_CAPACITY)
            )));
        }
        let frames = FrameAllocator::new(config.capacity, config.normal_page.bytes(), config.giant_frames)?;
        Ok(SimBackend {
            config,
            ledger: Ledger::new(space),
            memory: PhysMemory::new(config.capacity),
            frames,
            page_table: PageTable::new(),
        })
    }

    pub fn config(&self) -> SimConfig {
        self.config
    }

    /// Host bytes backing the written parts of simulated HBM.
    pub fn resident_bytes(&self) -> u64 {
        self.memory.resident_bytes()
    }

    fn release_frames(&mut self, alloc: Physical<Frames>) -> Result<()> {
        let bytes = alloc.page.bytes();
        for pa in alloc.memory.frames {
            if alloc.memory.kind == PageKind::Giant {
                self.frames.free_giant(pa)?;
            } else {
                self.frames.free(pa)?;
            }
            self.memory.discard(pa, bytes);
        }
        Ok(())
    }

    fn oom_message(&self, size: u64, kind: PageKind, page: PageSize) -> String {
        let s = self.frames.stats();
        if kind == PageKind::Giant {
            return format!(
                "cannot allocate {} of 1 GiB giant pages: {} of {} giant frames are free",
                format_size(size),
                s.giant_free,
                s.giant_total
            );
        }
        if size > s.free_bytes {
            return format!(
                "cannot allocate {} of {} pages: only {} of HBM is free for {kind} pages",
                format_size(size),
                page.label(),
                format_size(s.free_bytes),
                kind = kind.label()
            );
        }
        format!(
            "cannot allocate {} of {} pages although {} of HBM is free: fragmentation leaves only {} in \
             free blocks of at least {} (largest free block {})",
            format_size(size),
            page.label(),
            format_size(s.free_bytes),
            format_size(s.free_bytes_in_blocks_of(page.bytes())),
            page.label(),
            format_size(s.largest_free_block)
        )
    }

    /// Checks that `[va, va + len)` is mapped and creates the memory chunks a store there needs,
    /// so that the store cannot fail half-way; on an error nothing changed.
    fn stage(&mut self, va: u64, len: u64) -> Result<()> {
        for_each_piece(&self.page_table, va, len, |_, _, _| Ok(()))?;
        let table = &self.page_table;
        self.memory.all_or_nothing(|m, created| {
            for_each_piece(table, va, len, |pa, _, n| m.materialise(pa, n as u64, created))
        })
    }
}

/// An error for an access to an unmapped device address.
fn unmapped(va: u64) -> AclError {
    AclError::rt_param(format!(
        "device address {va:#x} is not mapped; it was freed or never allocated (use after free?)"
    ))
}

/// Walks `[va, va + len)` page by page, calling `f(pa, offset_in_range, piece_len)`; stops at
/// the first unmapped page or error of `f`.
fn for_each_piece(
    table: &PageTable,
    va: u64,
    len: u64,
    mut f: impl FnMut(u64, usize, usize) -> Result<()>,
) -> Result<()> {
    let end = va.checked_add(len).ok_or_else(|| AclError::rt_param("address range overflows"))?;
    let mut at = va;
    while at < end {
        let t = table.translate(at).ok_or_else(|| unmapped(at))?;
        // Within one page the physical range is contiguous (a 64 KiB page's 16 frames too).
        let page = t.page_size.bytes();
        let n = (page - (at % page)).min(end - at);
        f(t.pa, (at - va) as usize, n as usize)?;
        at += n;
    }
    Ok(())
}

/// Walks a copy of `len` bytes from `src` to `dst` (both mapped) in pieces that are physically
/// contiguous on both sides, calling `f(dst_pa, src_pa, piece_len)`: from the low end, or from
/// the high end when `backward`.
fn for_each_pair(
    table: &PageTable,
    dst: u64,
    src: u64,
    len: u64,
    backward: bool,
    mut f: impl FnMut(u64, u64, u64) -> Result<()>,
) -> Result<()> {
    let translate = |va: u64| table.translate(va).ok_or_else(|| unmapped(va));
    let (mut lo, mut hi) = (0u64, len);
    while lo < hi {
        if backward {
            // The pages holding the last byte left on each side.
            let (d, s) = (translate(dst + hi - 1)?, translate(src + hi - 1)?);
            let left = |va: u64, t: Translation| va % t.page_size.bytes() + 1;
            let n = left(dst + hi - 1, d).min(left(src + hi - 1, s)).min(hi - lo);
            hi -= n;
            f(d.pa + 1 - n, s.pa + 1 - n, n)?;
        } else {
            let (d, s) = (translate(dst + lo)?, translate(src + lo)?);
            let room = |va: u64, t: Translation| t.page_size.bytes() - va % t.page_size.bytes();
            let n = room(dst + lo, d).min(room(src + lo, s)).min(hi - lo);
            f(d.pa, s.pa, n)?;
            lo += n;
        }
    }
    Ok(())
}

impl Backend for SimBackend {
    fn name(&self) -> &'static str {
        "sim"
    }

    fn page_size(&self, kind: PageKind) -> PageSize {
        match kind {
            PageKind::Normal => self.config.normal_page,
            PageKind::Huge => PageSize::Size2M,
            PageKind::Giant => PageSize::Size1G,
        }
    }

    fn reserve(&mut self, size: u64, align: u64, hint: Option<u64>) -> Result<u64> {
        self.ledger.reserve(size, align, hint)
    }

    fn release(&mut self, va: u64) -> Result<()> {
        self.ledger.release(va)
    }

    fn create_physical(&mut self, size: u64, kind: PageKind) -> Result<PhysHandle> {
        let page = self.page_size(kind);
        physical::check_size(size, page, kind)?;
        let count = size / page.bytes();
        let available = match kind {
            PageKind::Giant => self.frames.giant_counts().1 * GIB,
            _ => self.frames.buddy_free_bytes(),
        };
        if size > available {
            return Err(AclError::oom(self.oom_message(size, kind, page)));
        }
        // The frame list is sized by the request (bounded by the free memory checked above):
        // taken fallibly, so a host short of memory refuses instead of aborting.
        let mut frames = Vec::new();
        frames.try_reserve_exact(count as usize).map_err(|_| {
            AclError::oom(format!(
                "the host has no memory left to track {count} frames of a {} allocation",
                format_size(size)
            ))
        })?;
        for _ in 0..count {
            let got = match kind {
                PageKind::Giant => self.frames.alloc_giant(),
                _ => self.frames.alloc(page.bytes()),
            };
            match got {
                Ok(pa) => frames.push(pa),
                Err(_) => {
                    let message = self.oom_message(size, kind, page);
                    for pa in frames {
                        match kind {
                            PageKind::Giant => self.frames.free_giant(pa)?,
                            _ => self.frames.free(pa)?,
                        }
                    }
                    return Err(AclError::oom(message));
                }
            }
        }
        Ok(self.ledger.insert(size, page, Frames { kind, frames }))
    }

    fn free_physical(&mut self, handle: PhysHandle) -> Result<()> {
        match self.ledger.free(handle)? {
            Some(alloc) => self.release_frames(alloc),
            None => Ok(()),
        }
    }

    fn map(&mut self, va: u64, handle: PhysHandle) -> Result<()> {
        let page_table = &mut self.page_table;
        self.ledger.map(va, handle, |alloc| {
            let page = alloc.page;
            for (i, &pa) in alloc.memory.frames.iter().enumerate() {
                if let Err(e) = page_table.map(va + i as u64 * page.bytes(), pa, page) {
                    for k in 0..i as u64 {
                        page_table.unmap(va + k * page.bytes(), page)?;
                    }
                    return Err(e);
                }
            }
            Ok(())
        })
    }

    fn unmap(&mut self, va: u64) -> Result<()> {
        let page_table = &mut self.page_table;
        let released = self.ledger.unmap(va, |mapping, page| {
            for i in 0..mapping.size / page.bytes() {
                page_table.unmap(va + i * page.bytes(), page)?;
            }
            Ok(())
        })?;
        match released {
            Some(alloc) => self.release_frames(alloc),
            None => Ok(()),
        }
    }

    fn read(&mut self, va: u64, out: &mut [u8]) -> Result<()> {
        let memory = &self.memory;
        for_each_piece(&self.page_table, va, out.len() as u64, |pa, off, n| {
            memory.read(pa, &mut out[off..off + n]);
            Ok(())
        })?;
        self.ledger.counters.bytes_read += out.len() as u64;
        Ok(())
    }

    fn write(&mut self, va: u64, data: &[u8]) -> Result<()> {
        self.stage(va, data.len() as u64)?;
        let memory = &mut self.memory;
        for_each_piece(&self.page_table, va, data.len() as u64, |pa, off, n| {
            memory.store(pa, &data[off..off + n]);
            Ok(())
        })?;
        self.ledger.counters.bytes_written += data.len() as u64;
        Ok(())
    }

    fn fill(&mut self, va: u64, value: u8, count: u64) -> Result<()> {
        if value == 0 {
            // Zeroing needs no host memory (and frees the chunks it covers whole).
            for_each_piece(&self.page_table, va, count, |_, _, _| Ok(()))?;
        } else {
            self.stage(va, count)?;
        }
        let memory = &mut self.memory;
        for_each_piece(&self.page_table, va, count, |pa, _, n| {
            memory.set(pa, value, n as u64);
            Ok(())
        })?;
        self.ledger.counters.bytes_written += count;
        Ok(())
    }

    fn copy(&mut self, dst: u64, src: u64, count: u64) -> Result<()> {
        // Validate both ranges, then create the destination chunks that will hold written
        // source bytes, before moving a byte: a failure changes nothing.
        for_each_piece(&self.page_table, src, count, |_, _, _| Ok(()))?;
        for_each_piece(&self.page_table, dst, count, |_, _, _| Ok(()))?;
        let table = &self.page_table;
        self.memory.all_or_nothing(|m, created| {
            for_each_pair(table, dst, src, count, false, |d, s, n| m.materialise_for_copy(d, s, n, created))
        })?;
        // memmove: when the destination starts inside the source, copy from the high end.
        let backward = dst > src && dst - src < count;
        let memory = &mut self.memory;
        for_each_pair(table, dst, src, count, backward, |d, s, n| memory.copy(d, s, n))?;
        self.ledger.counters.bytes_read += count;
        self.ledger.counters.bytes_written += count;
        Ok(())
    }

    fn mapping_containing(&self, va: u64) -> Option<(u64, PhysHandle, u64)> {
        self.ledger.mapping_containing(va)
    }

    fn window(&self) -> (u64, u64) {
        self.ledger.space.window()
    }

    fn mem_info(&self, scope: MemScope) -> (u64, u64) {
        let s = self.frames.stats();
        let giant_bytes = (s.giant_total * GIB, s.giant_free * GIB);
        match scope {
            MemScope::Ddr => (0, 0),
            MemScope::All => (s.free_bytes + giant_bytes.1, s.buddy_bytes + giant_bytes.0),
            MemScope::Normal => (s.free_bytes, s.buddy_bytes),
            MemScope::Huge => (s.free_bytes_in_blocks_of(2 * MIB), s.buddy_bytes),
            MemScope::Giant => (giant_bytes.1, giant_bytes.0),
        }
    }

    fn translate(&self, va: u64) -> Result<Translation> {
        self.page_table.translate(va).ok_or_else(|| AclError::rt_param(format!("device address {va:#x} is not mapped")))
    }

    fn counters(&self) -> BackendCounters {
        self.ledger.counters
    }

    #[inline]
    fn driver_calls(&self) -> u64 {
        let c = &self.ledger.counters;
        c.physical_allocs + c.physical_frees + c.maps + c.unmaps
    }

    fn frame_stats(&self) -> Option<FrameStats> {
        Some(self.frames.stats())
    }

    fn page_table_stats(&self) -> Option<PageTableStats> {
        Some(self.page_table.stats())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorCode;
    use crate::units::KIB;
    use proptest::strategy::Strategy;

    fn sim(capacity: u64, giant: u64) -> SimBackend {
        SimBackend::new(SimConfig { capacity, normal_page: PageSize::Size4K, giant_frames: giant }).unwrap()
    }

    #[test]
    fn two_mappings_share_bytes() {
        let mut b = sim(64 * MIB, 0);
        let h = b.create_physical(2 * MIB, PageKind::Huge).unwrap();
        let va1 = b.reserve(2 * MIB, 2 * MIB, None).unwrap();
        let va2 = b.reserve(2 * MIB, 2 * MIB, None).unwrap();
        b.map(va1, h).unwrap();
        b.map(va2, h).unwrap();
        b.write(va1 + 100, b"hello").unwrap();
        let mut out = [0u8; 5];
        b.read(va2 + 100, &mut out).unwrap();
        assert_eq!(&out, b"hello");
        // Freeing while mapped defers; the frames come back at the last unmap.
        b.free_physical(h).unwrap();
        assert!(b.free_physical(h).is_err());
        assert!(b.map(va1, h).is_err());
        b.unmap(va1).unwrap();
        assert_eq!(b.mem_info(MemScope::All).0, 62 * MIB);
        b.unmap(va2).unwrap();
        assert_eq!(b.mem_info(MemScope::All).0, 64 * MIB);
        assert!(b.release(va1 + 4096).is_err());
        b.release(va1).unwrap();
        b.release(va2).unwrap();
        let c = b.counters();
        assert_eq!((c.maps, c.unmaps, c.physical_allocs, c.physical_frees), (2, 2, 1, 1));
    }

    #[test]
    fn refuses_bad_maps_and_unmapped_access() {
        let mut b = sim(64 * MIB, 0);
        let h = b.create_physical(8 * KIB, PageKind::Normal).unwrap();
        assert!(b.map(crate::vm::VA_WINDOW_START, h).is_err(), "no reservation");
        let va = b.reserve(4 * MIB, 2 * MIB, None).unwrap();
        b.map(va, h).unwrap();
        assert!(b.map(va + 4096, h).is_err(), "overlap");
        assert!(b.release(va).is_err(), "still mapped");
        let mut out = [0u8; 16];
        assert!(b.read(va + 8 * KIB - 8, &mut out).is_err(), "runs past the mapping");
        assert!(b.write(va + 8 * KIB - 8, &[1; 16]).is_err());
        b.read(va, &mut out).unwrap();
        assert!(b.create_physical(3 * KIB, PageKind::Normal).is_err());
        assert!(b.create_physical(GIB, PageKind::Giant).is_err());
        let err = b.create_physical(128 * MIB, PageKind::Huge).unwrap_err();
        assert_eq!(err.code, ErrorCode::RtMemoryAllocation);
    }

    #[test]
    fn overlapping_copy_is_memmove() {
        let mut b = sim(64 * MIB, 0);
        let h = b.create_physical(64 * KIB, PageKind::Normal).unwrap();
        let va = b.reserve(64 * KIB, 4096, None).unwrap();
        b.map(va, h).unwrap();
        let data: Vec<u8> = (0..10_000u32).map(|i| i as u8).collect();
        b.write(va, &data).unwrap();
        b.copy(va + 1000, va, 10_000).unwrap();
        let mut out = vec![0u8; 10_000];
        b.read(va + 1000, &mut out).unwrap();
        assert_eq!(out, data);
    }

    #[test]
    fn copying_unwritten_gigabytes_costs_no_host_memory() {
        let mut b = sim(20 * GIB, 0);
        let map = |b: &mut SimBackend| {
            let h = b.create_physical(8 * GIB, PageKind::Huge).unwrap();
            let va = b.reserve(8 * GIB, 2 * MIB, None).unwrap();
            b.map(va, h).unwrap();
            va
        };
        let (src, dst) = (map(&mut b), map(&mut b));
        b.copy(dst, src, 8 * GIB).unwrap();
        b.fill(dst, 0, 8 * GIB).unwrap();
        let mut out = vec![1u8; 4096];
        b.read(dst + 5 * GIB, &mut out).unwrap();
        assert!(out.iter().all(|&x| x == 0));
        assert_eq!(b.resident_bytes(), 0, "nothing was materialised");
        // Written bytes move; only the chunks that receive them are stored.
        b.write(src + 3 * GIB, b"payload").unwrap();
        b.copy(dst, src, 8 * GIB).unwrap();
        b.read(dst + 3 * GIB, &mut out[..7]).unwrap();
        assert_eq!(&out[..7], b"payload");
        assert_eq!(b.resident_bytes(), 2 * 64 * KIB);
        let c = b.counters();
        assert_eq!((c.bytes_read, c.bytes_written), (16 * GIB + 4096 + 7, 24 * GIB + 7));
    }

    #[test]
    fn failed_byte_operations_change_nothing() {
        let mut b = sim(64 * MIB, 0);
        let h = b.create_physical(64 * KIB, PageKind::Normal).unwrap();
        let va = b.reserve(2 * MIB, 4096, None).unwrap();
        b.map(va, h).unwrap();
        b.write(va, &[5; 100]).unwrap();
        let before = b.resident_bytes();
        assert!(b.write(va + 60 * KIB, &[1; 8 * KIB as usize]).is_err(), "runs past the mapping");
        assert!(b.fill(va + 60 * KIB, 3, 8 * KIB).is_err());
        assert!(b.copy(va + 60 * KIB, va, 8 * KIB).is_err());
        assert!(b.copy(va, va + 60 * KIB, 8 * KIB).is_err());
        assert_eq!(b.resident_bytes(), before);
        let mut out = vec![0u8; 64 * KIB as usize];
        b.read(va, &mut out).unwrap();
        assert!(out[..100].iter().all(|&x| x == 5) && out[100..].iter().all(|&x| x == 0));
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]
        /// Copies, fills and writes over 4 KiB pages mapped onto scattered frames behave as on
        /// one flat buffer (memmove for overlapping copies), in either direction.
        #[test]
        fn scattered_pages_match_a_flat_buffer(
            order in proptest::sample::subsequence((0..32u64).collect::<Vec<_>>(), 32).prop_shuffle(),
            ops in proptest::collection::vec((0u8..3, 0u64..128 * KIB, 0u64..128 * KIB, 0u64..64 * KIB), 1..12),
        ) {
            const PAGES: u64 = 32;
            let mut b = sim(64 * MIB, 0);
            let handles: Vec<_> = (0..PAGES).map(|_| b.create_physical(4 * KIB, PageKind::Normal).unwrap()).collect();
            let va = b.reserve(PAGES * 4 * KIB, 4096, None).unwrap();
            for (slot, &page) in order.iter().enumerate() {
                b.map(va + slot as u64 * 4 * KIB, handles[page as usize]).unwrap();
            }
            let size = PAGES * 4 * KIB;
            let mut model = vec![0u8; size as usize];
            for (i, (kind, dst, src, len)) in ops.into_iter().enumerate() {
                let len = len.min(size - dst).min(size - src);
                let (d, s, n) = (dst as usize, src as usize, len as usize);
                match kind {
                    0 => {
                        let data: Vec<u8> = (0..n).map(|k| (k * 31 + i) as u8).collect();
                        b.write(va + dst, &data).unwrap();
                        model[d..d + n].copy_from_slice(&data);
                    }
                    1 => {
                        b.fill(va + dst, (src % 3) as u8, len).unwrap();
                        model[d..d + n].fill((src % 3) as u8);
                    }
                    _ => {
                        b.copy(va + dst, va + src, len).unwrap();
                        model.copy_within(s..s + n, d);
                    }
                }
                let mut all = vec![0u8; size as usize];
                b.read(va, &mut all).unwrap();
                proptest::prop_assert_eq!(&all, &model);
            }
        }
    }

    #[test]
    fn giant_pages_and_mem_info() {
        let mut b = sim(4 * GIB, 1);
        assert_eq!(b.mem_info(MemScope::Giant), (GIB, GIB));
        assert_eq!(b.mem_info(MemScope::All), (4 * GIB, 4 * GIB));
        assert_eq!(b.mem_info(MemScope::Normal), (3 * GIB, 3 * GIB));
        let h = b.create_physical(GIB, PageKind::Giant).unwrap();
        let va = b.reserve(GIB, GIB, None).unwrap();
        b.map(va, h).unwrap();
        let t = b.translate(va + GIB - 1).unwrap();
        assert_eq!((t.page_size, t.depth), (PageSize::Size1G, 2));
        assert_eq!(b.mem_info(MemScope::Giant), (0, GIB));
        assert_eq!(b.page_table_stats().unwrap().pages, [0, 0, 0, 1]);
    }
}
