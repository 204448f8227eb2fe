//! `Ledger`: the books every backend keeps of what it holds — its address space (an
//! [`AddressMap`]: reservations and the mappings in them), its physical allocations (the
//! [`PhysicalBooks`]) and its [`BackendCounters`] — and the steps each backend takes the same
//! way around its own work (frames and a page table, system calls, a runtime's calls).
//!
//! Rules:
//! - a step checks first, then lets the backend act (`act`), then records: a check or an act
//!   that fails leaves the books and the counters as they were;
//! - the counters count what succeeded: reserves and releases, allocations, maps and unmaps
//!   (with their pages), bytes read and written;
//! - `physical_frees` counts an allocation when the books release it ([`Ledger::free`], or the
//!   [`Ledger::unmap`] that takes the last mapping of a freed one); a backend whose runtime may
//!   refuse to take it back frees through the books directly and counts it when the runtime has;
//! - a capacity is a budget of bytes held: the books' and any the backend holds outside them
//!   (`outside`, a runtime's refused frees).

use super::address_map::{AddressMap, Mapping};
use super::physical::{Physical, PhysicalBooks, handle_translation};
use super::{BackendCounters, PhysHandle};
use crate::error::{AclError, Result};
use crate::units::format_size;
use crate::vm::{PageSize, Translation, VaSpace};

/// The books of one backend; `T` is what the backend keeps of a physical allocation.
#[derive(Debug)]
pub struct Ledger<T> {
    pub space: AddressMap,
    pub allocs: PhysicalBooks<T>,
    pub counters: BackendCounters,
}

impl<T> Ledger<T> {
    /// Empty books whose reservations come from `space`.
    pub fn new(space: VaSpace) -> Self {
        Ledger { space: AddressMap::new(space), allocs: PhysicalBooks::default(), counters: BackendCounters::default() }
    }

    /// Reserves `size` bytes aligned to `align` in the books, at `hint` if given (and free).
    pub fn reserve(&mut self, size: u64, align: u64, hint: Option<u64>) -> Result<u64> {
        let va = self.space.reserve(size, align, hint)?;
        self.counters.reserves += 1;
        Ok(va)
    }

    /// Releases the reservation that starts at `va`, which must have nothing mapped in it.
    pub fn release(&mut self, va: u64) -> Result<()> {
        self.space.release(va)?;
        self.counters.releases += 1;
        Ok(())
    }

    /// Bytes of physical allocations the books hold (live, or freed and waiting for unmaps).
    pub fn held_bytes(&self) -> u64 {
        self.allocs.held_bytes()
    }

    /// What is left of `capacity` with the books' bytes and `outside` bytes held.
    pub fn unused(&self, capacity: u64, outside: u64) -> u64 {
        capacity - (self.held_bytes() + outside).min(capacity)
    }

    /// Checks that `size` more bytes fit in the `backend` backend's `capacity` (out of memory,
    /// naming what is held, otherwise).
    pub fn check_capacity(&self, backend: &str, capacity: u64, outside: u64, size: u64) -> Result<()> {
        let held = self.held_bytes() + outside;
        if held.saturating_add(size) > capacity {
            return Err(AclError::oom(format!(
                "the {backend} backend holds {} of its capacity of {}; {} more would pass it",
                format_size(held),
                format_size(capacity),
                format_size(size)
            )));
        }
        Ok(())
    }

    /// Records a new physical allocation of `size` bytes of `page` pages; returns its handle.
    pub fn insert(&mut self, size: u64, page: PageSize, memory: T) -> PhysHandle {
        let handle = self.allocs.insert(size, page, memory);
        self.counters.physical_allocs += 1;
        handle
    }

    /// Frees `handle`: the allocation, counted as freed, when the books release it now (it has
    /// no mapping); `None` when it waits for its last unmap.
    pub fn free(&mut self, handle: PhysHandle) -> Result<Option<Physical<T>>> {
        let released = self.allocs.free(handle)?;
        if released.is_some() {
            self.counters.physical_frees += 1;
        }
        Ok(released)
    }

    /// Maps the whole of the live allocation `handle` at `va`: checks it may (inside one
    /// reservation, page aligned, over nothing mapped), lets `act` map it, and records the
    /// mapping.
    pub fn map(&mut self, va: u64, handle: PhysHandle, act: impl FnOnce(&Physical<T>) -> Result<()>) -> Result<()> {
        let alloc = self.allocs.live(handle)?;
        let size = alloc.size;
        self.space.check_map(va, size, alloc.page)?;
        act(alloc)?;
        self.allocs.map(handle, &mut self.counters)?;
        self.space.insert(va, Mapping { handle, size });
        Ok(())
    }

    /// Unmaps the mapping that starts at `va`: `act(mapping, page)` takes it away, then the
    /// books forget it. Returns the allocation, counted as freed, when this was the last mapping
    /// of a freed one.
    pub fn unmap(&mut self, va: u64, act: impl FnOnce(Mapping, PageSize) -> Result<()>) -> Result<Option<Physical<T>>> {
        let mapping = self.space.mapping_at(va)?;
        act(mapping, self.allocs.page(mapping.handle)?)?;
        self.space.remove(va);
        let released = self.allocs.unmap(mapping.handle, &mut self.counters)?;
        if released.is_some() {
            self.counters.physical_frees += 1;
        }
        Ok(released)
    }

    /// Reads `len` bytes at `va`: checks they are mapped, lets `act` read them, counts them.
    pub fn read(&mut self, va: u64, len: u64, act: impl FnOnce() -> Result<()>) -> Result<()> {
        self.space.check_mapped(va, len)?;
        act()?;
        self.counters.bytes_read += len;
        Ok(())
    }

    /// Writes (or fills) `len` bytes at `va`: checks they are mapped, lets `act` write them,
    /// counts them.
    pub fn write(&mut self, va: u64, len: u64, act: impl FnOnce() -> Result<()>) -> Result<()> {
        self.space.check_mapped(va, len)?;
        act()?;
        self.counters.bytes_written += len;
        Ok(())
    }

    /// Copies `len` bytes from `src` to `dst`: checks both are mapped (the source first), lets
    /// `act` copy, counts the bytes read and written.
    pub fn copy(&mut self, dst: u64, src: u64, len: u64, act: impl FnOnce() -> Result<()>) -> Result<()> {
        self.space.check_mapped(src, len)?;
        self.space.check_mapped(dst, len)?;
        act()?;
        self.counters.bytes_read += len;
        self.counters.bytes_written += len;
        Ok(())
    }

    /// Where `va` lies, for a backend whose physical addresses are not visible: the mapping's
    /// allocation and the offset in it (see [`handle_translation`]).
    pub fn translate_by_handle(&self, va: u64) -> Result<Translation> {
        let (start, mapping) = self
            .space
            .containing(va)
            .ok_or_else(|| AclError::rt_param(format!("device address {va:#x} is not mapped")))?;
        Ok(handle_translation(start, mapping.handle, va, self.allocs.page(mapping.handle)?))
    }

    /// The mapping holding `va`, as (its start, its physical allocation, its size).
    pub fn mapping_containing(&self, va: u64) -> Option<(u64, PhysHandle, u64)> {
        self.space.containing(va).map(|(start, m)| (start, m.handle, m.size))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorCode;
    use crate::units::MIB;

    const PAGE: PageSize = PageSize::Size2M;

    fn fails(what: &str) -> Result<()> {
        Err(AclError::internal(what.to_string()))
    }

    /// A failed check or act changes neither the books nor the counters; each success counts
    /// once; the release of a freed allocation is counted at its last unmap.
    #[test]
    fn failures_change_nothing_and_successes_count_once() {
        let mut l: Ledger<&str> = Ledger::new(VaSpace::default());
        let va = l.reserve(4 * MIB, 2 * MIB, None).unwrap();
        let h = l.insert(2 * MIB, PAGE, "memory");
        l.check_capacity("test", 4 * MIB, MIB, MIB).unwrap();
        let oom = l.check_capacity("test", 4 * MIB, MIB, MIB + 1).unwrap_err();
        assert_eq!(oom.code, ErrorCode::RtMemoryAllocation);
        assert!(oom.message.starts_with("the test backend holds 3 MiB of its capacity of 4 MiB"), "{}", oom.message);
        assert_eq!((l.unused(3 * MIB, 0), l.unused(MIB, 0)), (MIB, 0));
        let before = l.counters;
        assert!(l.map(va + 4096, h, |_| Ok(())).is_err(), "not page aligned");
        assert!(l.map(va, h, |_| fails("the runtime refuses")).is_err());
        assert!(l.read(va, 1, || Ok(())).is_err(), "nothing mapped yet");
        assert_eq!((l.counters, l.mapping_containing(va)), (before, None));
        l.map(va, h, |p| if p.memory == "memory" { Ok(()) } else { fails("wrong allocation") }).unwrap();
        l.copy(va + 8, va, 16, || Ok(())).unwrap();
        assert!(l.copy(va + 2 * MIB, va, 16, || Ok(())).is_err(), "the destination is not mapped");
        assert!(l.write(va, 8, || fails("the copy failed")).is_err());
        assert_eq!(l.translate_by_handle(va + 10).unwrap().pa, (h << 40) | 10);
        assert_eq!(l.mapping_containing(va + 10), Some((va, h, 2 * MIB)));
        assert!(l.free(h).unwrap().is_none(), "mapped: waits for its unmap");
        assert!(l.unmap(va, |_, _| fails("the unmap failed")).is_err());
        assert_eq!(l.mapping_containing(va), Some((va, h, 2 * MIB)), "still mapped");
        let released = l.unmap(va, |m, page| if (m.size, page) == (2 * MIB, PAGE) { Ok(()) } else { fails("") });
        assert_eq!(released.unwrap().map(|p| p.memory), Some("memory"));
        assert!(l.unmap(va, |_, _| Ok(())).is_err(), "unmapped twice");
        l.release(va).unwrap();
        let c = l.counters;
        let counted = (c.reserves, c.releases, c.physical_allocs, c.physical_frees, c.maps, c.unmaps);
        assert_eq!(counted, (1, 1, 1, 1, 1, 1));
        assert_eq!((c.bytes_read, c.bytes_written, c.pages_mapped, c.pages_unmapped), (16, 16, 1, 1));
        assert_eq!(l.held_bytes(), 0);
    }
}
