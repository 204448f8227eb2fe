//! `HostHeap`: real host memory for `aclrtMallocHost` (the device's `malloc_host`), 64-byte
//! aligned.
//!
//! The blocks are genuine process memory, so their addresses can be handed to ctypes, numpy or
//! other native code. npumem itself touches host memory only inside blocks it allocated and still
//! holds, after checking the whole range: an unknown or freed host address is an error, never a
//! wild access.
//!
//! Where the backend has a runtime (AscendCL, CUDA), a block is the runtime's page-locked host
//! memory (`Backend::malloc_host`: `aclrtMallocHost`, `cuMemAllocHost`), zeroed here, and goes
//! back with the runtime's free. Elsewhere (the simulator, host memory) blocks come from the
//! system's zeroing allocator (`calloc`) with 64 bytes of slack, and the returned address is
//! the first 64-byte boundary inside: large blocks then arrive as fresh, lazily zeroed pages
//! instead of being cleared byte by byte, as an aligned zeroed allocation would be.
//!
//! Invariants: `blocks` maps each live address to its size and where it came from (the raw
//! allocation behind it, `Layout(size + 64, 16)`, or the runtime), zero-initialised; blocks never
//! overlap (the allocator guarantees it; a runtime's address that would overlap is refused); a
//! block of the system allocator is deallocated exactly once, by `free` or on drop; a runtime's
//! block is freed by `free` through the runtime, or, if the heap goes first, by the backend when
//! it goes; a free the runtime refuses leaves the block live.

use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::collections::BTreeMap;

use crate::backend::Backend;
use crate::error::{AclError, Result};
use crate::units::format_size;

/// Start alignment of host allocations.
pub const HOST_ALIGN: usize = 64;

/// Where a host block came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Origin {
    /// The system allocator, at this raw address.
    System(u64),
    /// The backend's runtime.
    Runtime,
}

#[derive(Debug, Default)]
pub struct HostHeap {
    /// Address → (size, origin).
    blocks: BTreeMap<u64, (u64, Origin)>,
    bytes: u64,
}

fn raw_layout(size: u64) -> Option<Layout> {
    let total = usize::try_from(size).ok()?.checked_add(HOST_ALIGN)?;
    Layout::from_size_align(total, 16).ok()
}

/// Gives back a block of `size` bytes the system allocator gave at `raw`.
///
/// # Safety
/// `raw` was returned by `alloc_zeroed(raw_layout(size))` and is deallocated only here, once.
unsafe fn dealloc_system(raw: u64, size: u64) {
    let layout = raw_layout(size).expect("validated at alloc");
    // SAFETY: the caller's contract.
    unsafe { dealloc(raw as *mut u8, layout) };
}

// SAFETY: the heap owns its blocks outright (raw addresses, no shared Rust references); moving
// ownership to another thread is as safe as moving a Vec.
unsafe impl Send for HostHeap {}

impl HostHeap {
    /// `size` bytes of zeroed host memory: the runtime's page-locked memory where `backend` has
    /// a runtime, else the system allocator's.
    pub fn alloc(&mut self, size: u64, backend: &mut dyn Backend) -> Result<u64> {
        if size == 0 {
            return Err(AclError::invalid_param("malloc_host size must be greater than 0"));
        }
        let layout = raw_layout(size)
            .ok_or_else(|| AclError::invalid_param(format!("malloc_host size {size} is too large for this host")))?;
        if let Some(got) = backend.malloc_host(size) {
            let addr = got?;
            let clash = addr.checked_add(size).is_none_or(|end| {
                self.blocks.range(..end).next_back().is_some_and(|(&start, &(len, _))| start + len > addr)
            });
            if addr % HOST_ALIGN as u64 != 0 || clash {
                let _ = backend.free_host(addr);
                return Err(AclError::internal(format!(
                    "the {} runtime returned host address {addr:#x} for {}: not 64-byte aligned, or over a live block",
                    backend.name(),
                    format_size(size)
                )));
            }
            // SAFETY: the runtime handed out `size` bytes at `addr`, owned by this heap from now
            // until it is freed; zeroing them keeps the heap's blocks initialised.
            unsafe { std::ptr::write_bytes(addr as *mut u8, 0, size as usize) };
            self.blocks.insert(addr, (size, Origin::Runtime));
            self.bytes += size;
            return Ok(addr);
        }
        // SAFETY: the layout has a non-zero size (at least HOST_ALIGN bytes).
        let raw = unsafe { alloc_zeroed(layout) };
        if raw.is_null() {
            return Err(AclError::oom(format!("the host could not allocate {} of memory", format_size(size))));
        }
        let raw = raw as u64;
        // The slack of HOST_ALIGN bytes leaves room for `size` bytes after the boundary.
        let addr = (raw + HOST_ALIGN as u64 - 1) & !(HOST_ALIGN as u64 - 1);
        self.blocks.insert(addr, (size, Origin::System(raw)));
        self.bytes += size;
        Ok(addr)
    }

    /// Frees the block at `addr` (through `backend`'s runtime when it came from there; a free
    /// the runtime refuses leaves the block live).
    pub fn free(&mut self, addr: u64, backend: &mut dyn Backend) -> Result<()> {
        let &(size, origin) = self.blocks.get(&addr).ok_or_else(|| {
            AclError::bad_free(format!(
                "host address {addr:#x} is not a live malloc_host allocation (already freed, or not from malloc_host)"
            ))
        })?;
        match origin {
            Origin::Runtime => backend.free_host(addr)?,
            // SAFETY: the block is live; the removal below makes this its only deallocation.
            Origin::System(raw) => unsafe { dealloc_system(raw, size) },
        }
        self.blocks.remove(&addr);
        self.bytes -= size;
        Ok(())
    }

    /// The size of the live block that starts at `start`.
    pub fn block_size(&self, start: u64) -> Option<u64> {
        self.blocks.get(&start).map(|&(size, _)| size)
    }

    /// Whether `addr` falls inside a live block.
    pub fn contains(&self, addr: u64) -> bool {
        self.block_of(addr).is_some()
    }

    /// The start of the live block containing `addr`.
    pub fn block_start(&self, addr: u64) -> Option<u64> {
        self.block_of(addr).map(|(s, _)| s)
    }

    fn block_of(&self, addr: u64) -> Option<(u64, u64)> {
        self.blocks.range(..=addr).next_back().filter(|&(&s, &(l, _))| addr < s + l).map(|(&s, &(l, _))| (s, l))
    }

    /// Checks that `[addr, addr + len)` lies inside one live block.
    pub fn check(&self, addr: u64, len: u64) -> Result<()> {
        let (start, size) = self.block_of(addr).ok_or_else(|| {
            AclError::rt_param(format!("host address {addr:#x} is not inside a live malloc_host allocation"))
        })?;
        let end = start + size;
        if addr.checked_add(len).is_none_or(|e| e > end) {
            return Err(AclError::rt_param(format!(
                "{len} bytes at host address {addr:#x} run {} bytes past the end of the malloc_host \
                 allocation at {start:#x} ({} long)",
                addr.saturating_add(len) - end,
                format_size(size)
            )));
        }
        Ok(())
    }

    pub fn slice(&self, addr: u64, len: u64) -> Result<&[u8]> {
        self.check(addr, len)?;
        // SAFETY: the range lies inside a live, zero-initialised block owned by this heap, and the
        // shared borrow of `self` keeps it from being freed while the slice lives.
        Ok(unsafe { std::slice::from_raw_parts(addr as *const u8, len as usize) })
    }

    pub fn slice_mut(&mut self, addr: u64, len: u64) -> Result<&mut [u8]> {
        self.check(addr, len)?;
        // SAFETY: as in `slice`; the exclusive borrow of `self` makes this the only Rust view.
        Ok(unsafe { std::slice::from_raw_parts_mut(addr as *mut u8, len as usize) })
    }

    /// memmove inside host memory; both ranges must lie in live blocks.
    pub fn copy(&mut self, dst: u64, src: u64, len: u64) -> Result<()> {
        self.check(src, len)?;
        self.check(dst, len)?;
        // SAFETY: both ranges were checked to lie in live blocks of this heap; `ptr::copy`
        // allows overlap.
        unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, len as usize) };
        Ok(())
    }

    pub fn live_bytes(&self) -> u64 {
        self.bytes
    }

    pub fn live_count(&self) -> usize {
        self.blocks.len()
    }
}

impl Drop for HostHeap {
    fn drop(&mut self) {
        // The runtime's blocks go with the backend, which keeps them in its books.
        for &(size, origin) in self.blocks.values() {
            if let Origin::System(raw) = origin {
                // SAFETY: a live block; the heap is going, so each is deallocated once.
                unsafe { dealloc_system(raw, size) };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alloc_access_free() {
        let mut b = crate::backend::SimBackend::new(crate::backend::SimConfig::default()).unwrap();
        let b: &mut dyn Backend = &mut b;
        let mut h = HostHeap::default();
        let a = h.alloc(100, b).unwrap();
        assert_eq!(a % 64, 0);
        h.slice_mut(a, 10).unwrap().copy_from_slice(b"0123456789");
        h.copy(a + 2, a, 8).unwrap();
        assert_eq!(h.slice(a, 10).unwrap(), b"0101234567");
        assert!(h.check(a + 90, 11).is_err());
        assert!(h.check(a + 100, 1).is_err());
        assert!(h.alloc(0, b).is_err());
        h.free(a, b).unwrap();
        assert!(h.free(a, b).is_err());
        assert!(h.slice(a, 1).is_err());
        assert!(h.alloc(u64::MAX, b).is_err());
    }
}
