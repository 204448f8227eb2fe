//! `SimBackend`: a simulated NPU whose HBM bytes are really stored.
//!
//! Physical memory comes from the buddy [`FrameAllocator`]; every map writes real descriptors into
//! the [`PageTable`]; every byte access walks that table and lands in [`PhysMemory`], so what is
//! written through one mapping is read back through any other mapping of the same frames.
//!
//! Invariants: each physical allocation owns `size / page` frames of its page size; a frame is
//! owned by at most one allocation; `mapped` of an allocation counts its live mappings and its
//! frames return to the allocator only when it is freed and `mapped == 0`; every mapping lies in a
//! reservation and no reservation with a live mapping is released.

use rustc_hash::FxHashMap;
use std::collections::BTreeMap;

use super::{Backend, BackendCounters, PhysHandle};
use crate::acl::MemScope;
use crate::error::{AclError, ErrorCode, Result};
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

#[derive(Debug)]
struct PhysAlloc {
    kind: PageKind,
    page: PageSize,
    frames: Vec<u64>,
    mapped: u32,
    free_requested: bool,
}

impl PhysAlloc {
    fn size(&self) -> u64 {
        self.frames.len() as u64 * self.page.bytes()
    }
}

#[derive(Clone, Copy, Debug)]
struct Mapping {
    handle: PhysHandle,
    size: u64,
}

#[derive(Debug)]
pub struct SimBackend {
    config: SimConfig,
    va: VaSpace,
    frames: FrameAllocator,
    page_table: PageTable,
    memory: PhysMemory,
    allocs: FxHashMap<PhysHandle, PhysAlloc>,
    next_handle: PhysHandle,
    mappings: BTreeMap<u64, Mapping>,
    counters: BackendCounters,
}

/// Largest piece a device-to-device copy moves through its bounce buffer at once.
const COPY_CHUNK: usize = 4 << 20;

impl SimBackend {
    pub fn new(config: SimConfig) -> Result<Self> {
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
            va: VaSpace::default(),
            memory: PhysMemory::new(config.capacity),
            frames,
            page_table: PageTable::new(),
            allocs: FxHashMap::default(),
            next_handle: 1,
            mappings: BTreeMap::new(),
            counters: BackendCounters::default(),
        })
    }

    pub fn config(&self) -> SimConfig {
        self.config
    }

    /// Host bytes backing the written parts of simulated HBM.
    pub fn resident_bytes(&self) -> u64 {
        self.memory.resident_bytes()
    }

    fn release_frames(&mut self, alloc: PhysAlloc) -> Result<()> {
        let bytes = alloc.page.bytes();
        for pa in alloc.frames {
            if alloc.kind == PageKind::Giant {
                self.frames.free_giant(pa)?;
            } else {
                self.frames.free(pa)?;
            }
            self.memory.discard(pa, bytes);
        }
        self.counters.physical_frees += 1;
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

    /// Walks `[va, va + len)` page by page, calling `f(pa, offset_in_range, piece_len)`.
    fn for_each_piece(&self, va: u64, len: u64, mut f: impl FnMut(u64, usize, usize)) -> Result<()> {
        let end = va.checked_add(len).ok_or_else(|| AclError::rt_param("address range overflows"))?;
        let mut at = va;
        while at < end {
            let t = self.page_table.translate(at).ok_or_else(|| {
                AclError::rt_param(format!(
                    "device address {at:#x} is not mapped; it was freed or never allocated (use after free?)"
                ))
            })?;
            // Within one page the physical range is contiguous (a 64 KiB page's 16 frames too).
            let page = t.page_size.bytes();
            let n = (page - (at % page)).min(end - at);
            f(t.pa, (at - va) as usize, n as usize);
            at += n;
        }
        Ok(())
    }
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
        let va = match hint {
            Some(at) => self.va.reserve_at(at, size, align)?,
            None => self.va.reserve(size, align)?,
        };
        self.counters.reserves += 1;
        Ok(va)
    }

    fn release(&mut self, va: u64) -> Result<()> {
        let Some((start, len)) = self.va.reservation_containing(va).filter(|&(s, _)| s == va) else {
            return Err(AclError::invalid_param(format!(
                "{va:#x} is not the start of a VA reservation; pass the address reserve returned"
            )));
        };
        if let Some((&m, _)) = self.mappings.range(start..start + len).next() {
            return Err(AclError::rt_param(format!(
                "the reservation at {va:#x} still has a mapping at {m:#x}; unmap it before releasing"
            )));
        }
        self.va.release(start)?;
        self.counters.releases += 1;
        Ok(())
    }

    fn create_physical(&mut self, size: u64, kind: PageKind) -> Result<PhysHandle> {
        let page = self.page_size(kind);
        if size == 0 || size % page.bytes() != 0 {
            return Err(AclError::invalid_param(format!(
                "physical allocation size {size} must be a non-zero multiple of the {} page granularity",
                page.label()
            )));
        }
        let count = size / page.bytes();
        let available = match kind {
            PageKind::Giant => self.frames.giant_counts().1 * GIB,
            _ => self.frames.buddy_free_bytes(),
        };
        if size > available {
            return Err(AclError::oom(self.oom_message(size, kind, page)));
        }
        let mut frames = Vec::with_capacity(count as usize);
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
        let handle = self.next_handle;
        self.next_handle += 1;
        self.allocs.insert(handle, PhysAlloc { kind, page, frames, mapped: 0, free_requested: false });
        self.counters.physical_allocs += 1;
        Ok(handle)
    }

    fn free_physical(&mut self, handle: PhysHandle) -> Result<()> {
        let alloc = self.allocs.get_mut(&handle).filter(|a| !a.free_requested).ok_or_else(|| {
            AclError::new(ErrorCode::RtInvalidHandle, format!("physical handle {handle} is unknown or already freed"))
        })?;
        if alloc.mapped > 0 {
            alloc.free_requested = true;
            return Ok(());
        }
        let alloc = self.allocs.remove(&handle).expect("present");
        self.release_frames(alloc)
    }

    fn map(&mut self, va: u64, handle: PhysHandle) -> Result<()> {
        let alloc = self.allocs.get(&handle).filter(|a| !a.free_requested).ok_or_else(|| {
            AclError::new(ErrorCode::RtInvalidHandle, format!("physical handle {handle} is unknown or already freed"))
        })?;
        let (page, size) = (alloc.page, alloc.size());
        let inside = self.va.reservation_containing(va).is_some_and(|(s, l)| va + size <= s + l);
        if !inside {
            return Err(AclError::rt_param(format!(
                "cannot map {} at {va:#x}: the range is not inside one VA reservation",
                format_size(size)
            )));
        }
        if va % page.bytes() != 0 {
            return Err(AclError::new(
                ErrorCode::RtAddrUnaligned,
                format!("cannot map {} pages at {va:#x}: the address is not page aligned", page.label()),
            ));
        }
        if let Some((&m, mp)) = self.mappings.range(..va + size).next_back() {
            if m + mp.size > va {
                return Err(AclError::rt_param(format!(
                    "cannot map at {va:#x}: the range overlaps the mapping at {m:#x}; unmap it first"
                )));
            }
        }
        let frames = &self.allocs[&handle].frames;
        for (i, &pa) in frames.iter().enumerate() {
            let at = va + i as u64 * page.bytes();
            if let Err(e) = self.page_table.map(at, pa, page) {
                for k in 0..i as u64 {
                    self.page_table.unmap(va + k * page.bytes(), page)?;
                }
                return Err(e);
            }
        }
        self.counters.maps += 1;
        self.counters.pages_mapped += frames.len() as u64;
        self.allocs.get_mut(&handle).expect("present").mapped += 1;
        self.mappings.insert(va, Mapping { handle, size });
        Ok(())
    }

    fn unmap(&mut self, va: u64) -> Result<()> {
        let mapping = self.mappings.remove(&va).ok_or_else(|| {
            AclError::rt_param(format!("nothing is mapped starting at {va:#x}; pass the address given to map"))
        })?;
        let alloc = self.allocs.get_mut(&mapping.handle).expect("mapped handles are live");
        let page = alloc.page;
        for i in 0..alloc.frames.len() as u64 {
            self.page_table.unmap(va + i * page.bytes(), page)?;
        }
        self.counters.unmaps += 1;
        self.counters.pages_unmapped += alloc.frames.len() as u64;
        alloc.mapped -= 1;
        if alloc.mapped == 0 && alloc.free_requested {
            let alloc = self.allocs.remove(&mapping.handle).expect("present");
            self.release_frames(alloc)?;
        }
        Ok(())
    }

    fn read(&mut self, va: u64, out: &mut [u8]) -> Result<()> {
        let memory = &self.memory;
        self.for_each_piece(va, out.len() as u64, |pa, off, n| memory.read(pa, &mut out[off..off + n]))?;
        self.counters.bytes_read += out.len() as u64;
        Ok(())
    }

    fn write(&mut self, va: u64, data: &[u8]) -> Result<()> {
        // Collect (and so validate) every piece first, so a failed write changes nothing.
        let mut pieces = Vec::new();
        self.for_each_piece(va, data.len() as u64, |pa, off, n| pieces.push((pa, off, n)))?;
        for (pa, off, n) in pieces {
            self.memory.write(pa, &data[off..off + n]);
        }
        self.counters.bytes_written += data.len() as u64;
        Ok(())
    }

    fn fill(&mut self, va: u64, value: u8, count: u64) -> Result<()> {
        let mut pieces = Vec::new();
        self.for_each_piece(va, count, |pa, _, n| pieces.push((pa, n)))?;
        for (pa, n) in pieces {
            self.memory.fill(pa, value, n as u64);
        }
        self.counters.bytes_written += count;
        Ok(())
    }

    fn copy(&mut self, dst: u64, src: u64, count: u64) -> Result<()> {
        // Validate both ranges before moving a byte.
        self.for_each_piece(src, count, |_, _, _| {})?;
        self.for_each_piece(dst, count, |_, _, _| {})?;
        let overlap = src < dst.saturating_add(count) && dst < src.saturating_add(count);
        if overlap {
            let mut buf = vec![0u8; count as usize];
            self.read(src, &mut buf)?;
            return self.write(dst, &buf);
        }
        let mut buf = vec![0u8; (count as usize).min(COPY_CHUNK)];
        let mut done = 0u64;
        while done < count {
            let n = (count - done).min(COPY_CHUNK as u64) as usize;
            self.read(src + done, &mut buf[..n])?;
            self.write(dst + done, &buf[..n])?;
            done += n as u64;
        }
        Ok(())
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
        self.counters
    }

    #[inline]
    fn driver_calls(&self) -> u64 {
        let c = &self.counters;
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
    use crate::units::KIB;

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
