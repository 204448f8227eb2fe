//! The program's own virtual memory management, as AscendCL exposes it beside `aclrtMalloc`:
//! `aclrtReserveMemAddress`, `aclrtMallocPhysical`, `aclrtMapMem`, `aclrtUnmapMem`,
//! `aclrtFreePhysical`, `aclrtReleaseMemAddress` and `aclrtMemGetAllocationGranularity`, with the
//! runtime's argument rules, over the same backend the allocators use. Two mappings of one
//! physical allocation alias: what is written through one is read through the other (on the host
//! backend, in real memory).
//!
//! Invariants: the device's tables hold exactly the reservations, physical allocations and
//! mappings the program made and has not undone (the allocators' own are not among them); a
//! mapped range may be read, written and copied like an allocation (it is not one: `free` refuses
//! it); a reservation with a mapping is not released; a failed call changes nothing.

use super::*;
use crate::acl::MemScope;
use crate::backend::PhysHandle;
use crate::vm::PageKind;

/// What the program made through the VMM calls.
#[derive(Debug, Default)]
pub(super) struct UserVmm {
    /// Reservations: start → length.
    reservations: BTreeMap<u64, u64>,
    /// Live physical allocations (not yet freed by the program): handle → (size, page kind).
    handles: FxHashMap<PhysHandle, (u64, PageKind)>,
    /// Mappings: start → (size, handle).
    mappings: BTreeMap<u64, (u64, PhysHandle)>,
    /// Second mappings of allocations' memory (IPC imports, `map_alias`): start of the
    /// reservation → (its length, the starts of the mappings in it).
    aliases: BTreeMap<u64, (u64, Vec<u64>)>,
}

impl UserVmm {
    /// The mapping holding `[addr, addr + len)`, as its start.
    /// (An alias counts as one mapping, from its reservation's start.)
    pub(super) fn mapping_of(&self, addr: u64, len: u64) -> Option<u64> {
        let fits = |start: u64, size: u64| addr.checked_add(len).filter(|&end| end <= start + size).map(|_| start);
        let mapping = self.mappings.range(..=addr).next_back().and_then(|(&s, &(size, _))| fits(s, size));
        mapping.or_else(|| self.aliases.range(..=addr).next_back().and_then(|(&s, &(size, _))| fits(s, size)))
    }

    /// Whether `addr` lies in one of the program's mappings (or an alias).
    pub(super) fn mapped(&self, addr: u64) -> bool {
        self.mappings.range(..=addr).next_back().is_some_and(|(&s, &(size, _))| addr < s + size)
            || self.aliases.range(..=addr).next_back().is_some_and(|(&s, &(size, _))| addr < s + size)
    }
}

/// The page kind `aclrtMallocPhysical` gives memory of `attr` (ACL_HBM_MEM_NORMAL is allocated
/// as huge pages by the runtime; DDR and the whole-HBM attribute are not physical-memory types).
fn page_kind(attr: MemAttr) -> Result<PageKind> {
    match (attr, attr.scope()) {
        (MemAttr::HbmNormal, _) => Ok(PageKind::Huge),
        (_, MemScope::Normal) => Ok(PageKind::Normal),
        (_, MemScope::Huge) => Ok(PageKind::Huge),
        (_, MemScope::Giant) => Ok(PageKind::Giant),
        _ => Err(AclError::invalid_param(format!(
            "malloc_physical does not take {} for device memory; use ACL_MEM_NORMAL, ACL_MEM_HUGE, \
             ACL_MEM_HUGE1G, ACL_HBM_MEM_HUGE or their P2P variants",
            attr.name()
        ))),
    }
}

impl Device {
    /// `aclrtMemGetAllocationGranularity`: the size physical allocations of `attr` are made in
    /// (the minimum granularity; the recommended one is the same here).
    pub fn mem_get_allocation_granularity(&self, attr: MemAttr) -> Result<u64> {
        Ok(self.backend.page_size(page_kind(attr)?).bytes())
    }

    /// `aclrtReserveMemAddress`: `size` bytes of device address space; at `expect` when given and
    /// free. `alignment` is reserved (0); `flags` must be 0 (1 is accepted, as the runtime does).
    pub fn reserve_mem_address(&mut self, size: u64, alignment: u64, expect: Option<u64>, flags: u64) -> Result<u64> {
        if size == 0 {
            return Err(AclError::invalid_param("reserve_mem_address size must be greater than 0"));
        }
        if alignment != 0 {
            return Err(AclError::invalid_param(format!("alignment is reserved and must be 0, got {alignment}")));
        }
        if flags > 1 {
            return Err(AclError::invalid_param(format!(
                "flags must be 0 (or 1, kept for compatibility), got {flags}"
            )));
        }
        let page = self.backend.page_size(PageKind::Normal).bytes();
        let rounded = crate::units::checked_align_up(size, page)
            .ok_or_else(|| AclError::invalid_param(format!("reserve_mem_address size {size} is too large")))?;
        // As the runtime: below 1 GiB aligned to the size's power of two, else to 1 GiB.
        let align = if rounded < 1 << 30 { rounded.next_power_of_two().max(page) } else { 1 << 30 };
        let va = self.backend.reserve(rounded, align, expect)?;
        self.user_vmm.reservations.insert(va, rounded);
        Ok(va)
    }

    /// `aclrtReleaseMemAddress`: the reservation must have nothing mapped in it.
    pub fn release_mem_address(&mut self, va: u64) -> Result<()> {
        let Some(&len) = self.user_vmm.reservations.get(&va) else {
            return Err(AclError::invalid_param(format!(
                "{va:#x} is not an address reserve_mem_address returned (or it was released)"
            )));
        };
        if let Some((&m, _)) = self.user_vmm.mappings.range(va..va + len).next() {
            return Err(AclError::rt_param(format!(
                "the reservation at {va:#x} still has a mapping at {m:#x}; unmap_mem it before releasing"
            )));
        }
        self.backend.release(va)?;
        self.user_vmm.reservations.remove(&va);
        Ok(())
    }

    /// `aclrtMallocPhysical`: `size` bytes (a multiple of the granularity) of physical memory
    /// of `attr`'s page kind. `flags` must be 0.
    pub fn malloc_physical(&mut self, size: u64, attr: MemAttr, flags: u64) -> Result<PhysHandle> {
        if flags != 0 {
            return Err(AclError::invalid_param(format!("flags must be 0, got {flags}")));
        }
        let kind = page_kind(attr)?;
        let granularity = self.backend.page_size(kind).bytes();
        if size == 0 || size % granularity != 0 {
            return Err(AclError::invalid_param(format!(
                "malloc_physical size {size} must be a non-zero multiple of the {} granularity of {} \
                 (mem_get_allocation_granularity)",
                format_size(granularity),
                attr.name()
            )));
        }
        let handle = self.backend.create_physical(size, kind)?;
        self.user_vmm.handles.insert(handle, (size, kind));
        self.charge_driver();
        Ok(handle)
    }

    /// The size of the program's physical allocation `handle`.
    pub fn physical_size(&self, handle: PhysHandle) -> Result<u64> {
        self.user_vmm.handles.get(&handle).map(|&(size, _)| size).ok_or_else(|| {
            AclError::new(ErrorCode::RtInvalidHandle, format!("{handle} is not a live handle from malloc_physical"))
        })
    }

    /// `aclrtFreePhysical`: a handle still mapped keeps its memory until its last unmap.
    pub fn free_physical(&mut self, handle: PhysHandle) -> Result<()> {
        if !self.user_vmm.handles.contains_key(&handle) {
            return Err(AclError::new(
                ErrorCode::RtInvalidHandle,
                format!("{handle} is not a handle malloc_physical returned (or it was freed)"),
            ));
        }
        self.backend.free_physical(handle)?;
        self.user_vmm.handles.remove(&handle);
        self.charge_driver();
        Ok(())
    }

    /// `aclrtMapMem`: maps the whole of `handle` at `va`, inside one of the program's
    /// reservations. `size` must be the handle's size, `offset` and `flags` 0.
    pub fn map_mem(&mut self, va: u64, size: u64, offset: u64, handle: PhysHandle, flags: u64) -> Result<()> {
        if offset != 0 || flags != 0 {
            return Err(AclError::invalid_param(format!("offset and flags must be 0, got {offset} and {flags}")));
        }
        let Some(&(phys_size, _)) = self.user_vmm.handles.get(&handle) else {
            return Err(AclError::new(
                ErrorCode::RtInvalidHandle,
                format!("{handle} is not a live handle from malloc_physical"),
            ));
        };
        if size != phys_size {
            return Err(AclError::invalid_param(format!(
                "map_mem size {size} must equal the physical allocation's size {phys_size}"
            )));
        }
        let inside = self
            .user_vmm
            .reservations
            .range(..=va)
            .next_back()
            .is_some_and(|(&s, &l)| va.checked_add(size).is_some_and(|end| end <= s + l));
        if !inside {
            return Err(AclError::invalid_param(format!(
                "{} at {va:#x} is not inside one reservation from reserve_mem_address",
                format_size(size)
            )));
        }
        self.backend.map(va, handle)?;
        self.user_vmm.mappings.insert(va, (size, handle));
        self.charge_driver();
        Ok(())
    }

    /// `aclrtUnmapMem`: unmaps the mapping that starts at `va`.
    pub fn unmap_mem(&mut self, va: u64) -> Result<()> {
        if !self.user_vmm.mappings.contains_key(&va) {
            return Err(AclError::invalid_param(format!("nothing map_mem mapped starts at {va:#x}")));
        }
        if let Some(e) = self.pinned(va) {
            return Err(e);
        }
        self.settle();
        self.backend.unmap(va)?;
        self.user_vmm.mappings.remove(&va);
        self.sanitizer.forget(va);
        self.charge_driver();
        Ok(())
    }

    /// Maps the physical memory under `[ptr, ptr + size)` of a live allocation a second time, at
    /// a fresh reservation of this device (an IPC import of memory exported from here): returns
    /// the address of `ptr`'s byte in the new mapping. What is written through either address is
    /// read through the other, and the pages stay alive until `unmap_alias`, whatever becomes of
    /// the allocation. Nothing changes when it fails.
    pub fn map_alias(&mut self, ptr: u64, size: u64) -> Result<u64> {
        self.settle();
        if size == 0 {
            return Err(AclError::invalid_param("the range to map again must not be empty"));
        }
        let Some(a) = self.live.containing(ptr, |a| a.size) else {
            return Err(AclError::rt_param(format!("{ptr:#x} is not inside a live allocation")));
        };
        let end = ptr.checked_add(size).filter(|&e| e <= a.ptr + a.size).ok_or_else(|| {
            AclError::rt_param(format!(
                "{size} bytes at {ptr:#x} run past the end of the allocation at {:#x} ({} bytes)",
                a.ptr, a.size
            ))
        })?;
        let mut pieces: Vec<(u64, PhysHandle, u64)> = Vec::new();
        let mut at = ptr;
        while at < end {
            let piece = self
                .backend
                .mapping_containing(at)
                .ok_or_else(|| AclError::internal(format!("{at:#x} lies in an allocation but in no mapping")))?;
            at = piece.0 + piece.2;
            pieces.push(piece);
        }
        let base = pieces[0].0;
        let span = at - base;
        let va = self.backend.reserve(span, a.page.bytes(), None)?;
        for (i, &(start, handle, _)) in pieces.iter().enumerate() {
            if let Err(e) = self.backend.map(va + (start - base), handle) {
                for &(s, _, _) in &pieces[..i] {
                    let _ = self.backend.unmap(va + (s - base));
                }
                let _ = self.backend.release(va);
                self.charge_driver();
                return Err(e);
            }
        }
        let starts = pieces.iter().map(|&(s, _, _)| va + (s - base)).collect();
        self.user_vmm.aliases.insert(va, (span, starts));
        self.charge_driver();
        Ok(va + (ptr - base))
    }

    /// Undoes the `map_alias` whose range holds `addr`: unmaps it and releases its reservation.
    pub fn unmap_alias(&mut self, addr: u64) -> Result<()> {
        let Some((&va, _)) = self.user_vmm.aliases.range(..=addr).next_back().filter(|(s, (n, _))| addr < **s + *n)
        else {
            return Err(AclError::rt_param(format!("{addr:#x} is not in a range map_alias made")));
        };
        if let Some(e) = self.pinned(va) {
            return Err(e);
        }
        self.settle();
        let (_, starts) = self.user_vmm.aliases.remove(&va).expect("found above");
        for s in starts {
            self.backend.unmap(s)?;
        }
        self.backend.release(va)?;
        self.sanitizer.forget(va);
        self.charge_driver();
        Ok(())
    }
}
