//! The host pool's memory: one anonymous mapping reserved up front (`MAP_NORESERVE`: pages are
//! committed when first touched), advised for transparent huge pages — or backed by 1 GiB hugetlb
//! pages, all reserved when the pool is made (capacity / 1 GiB of them must be free), carved from the bottom in 64 KiB chunks.
//!
//! Invariants: `[base, base + len)` stays mapped until the region is dropped; chunks are handed
//! out once, in increasing address order (`carve` is called under the pool's carve lock); the
//! class of every carved chunk is recorded before any block in it is handed out.

use std::sync::atomic::{AtomicU8, AtomicU32, Ordering};

use npumem_base::error::{AclError, Result};
use npumem_base::units::format_size;

/// Granule of the region and of the chunk → class table.
pub const CHUNK: u64 = 64 << 10;

/// Flags of the lazily committed mappings. Miri (`make miri`) emulates only
/// `MAP_PRIVATE | MAP_ANONYMOUS`: under it the pages are committed at once, which no program
/// can tell apart.
const LAZY_ANONYMOUS: libc::c_int = if cfg!(miri) {
    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS
} else {
    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE
};

/// How the region is backed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HugePages {
    /// 4 KiB pages only (`MADV_NOHUGEPAGE`).
    None,
    /// Transparent huge pages where the kernel allows (`MADV_HUGEPAGE`).
    Transparent,
    /// 1 GiB hugetlb pages (`MAP_HUGETLB | MAP_HUGE_1GB`): needs capacity / 1 GiB free pages
    /// reserved by the administrator (`/sys/kernel/mm/hugepages/hugepages-1048576kB/nr_hugepages`);
    /// they are all claimed when the pool is made, so a shortage is an error then, not a crash
    /// later.
    Giant,
}

impl HugePages {
    pub fn parse(name: &str) -> Result<HugePages> {
        match name {
            "none" => Ok(HugePages::None),
            "transparent" | "thp" => Ok(HugePages::Transparent),
            "1g" | "giant" => Ok(HugePages::Giant),
            _ => Err(AclError::invalid_param(format!("huge_pages {name:?} is not one of 'none', 'transparent', '1g'"))),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            HugePages::None => "none",
            HugePages::Transparent => "transparent",
            HugePages::Giant => "1g",
        }
    }
}

pub struct Region {
    base: *mut u8,
    len: u64,
    /// Class + 1 of each carved chunk (0: not carved).
    class: Vec<AtomicU8>,
    /// Free-list links of slab blocks, one `u32` per 64-byte unit, in a second lazily committed
    /// mapping (neighbouring small blocks share its cache lines) ...
    links: *mut AtomicU32,
    /// ... and of blocks that span whole chunks, one per chunk (dense: a large block's link
    /// never costs its own page of the table). Either way the pool never writes into a block.
    chunk_links: Vec<AtomicU32>,
    /// Chunks carved so far (guarded by the pool's carve lock).
    carved: std::sync::atomic::AtomicU64,
    pub huge: HugePages,
}

// SAFETY: the region is plain memory owned by the pool; concurrent access to distinct blocks is
// the allocator's contract, and the metadata is atomic.
unsafe impl Send for Region {}
// SAFETY: as above.
unsafe impl Sync for Region {}

impl Region {
    pub fn new(capacity: u64, huge: HugePages) -> Result<Region> {
        let align = if huge == HugePages::Giant { 1 << 30 } else { CHUNK };
        let len = capacity.checked_next_multiple_of(align).filter(|&l| l > 0 && l < 1 << 38).ok_or_else(|| {
            AclError::invalid_param(format!(
                "capacity {capacity} must be between 1 byte and 256 GiB (block indices are 32-bit in 64-byte units)"
            ))
        })?;
        // Hugetlb pages are reserved at mmap time (no MAP_NORESERVE): with NORESERVE the call
        // would succeed without pages and the first touch would raise SIGBUS.
        let flags = match huge {
            HugePages::Giant => {
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_HUGETLB | (30 << libc::MAP_HUGE_SHIFT)
            }
            _ => LAZY_ANONYMOUS,
        };
        // SAFETY: an anonymous private mapping at an address of the kernel's choice.
        let base =
            unsafe { libc::mmap(std::ptr::null_mut(), len as usize, libc::PROT_READ | libc::PROT_WRITE, flags, -1, 0) };
        if base == libc::MAP_FAILED {
            let err = std::io::Error::last_os_error();
            let hint = if huge == HugePages::Giant {
                "; 1 GiB pages must be reserved first (nr_hugepages of hugepages-1048576kB), or use huge_pages='transparent'"
            } else {
                "; use a smaller capacity"
            };
            return Err(AclError::oom(format!("cannot map {} for the host pool: {err}{hint}", format_size(len))));
        }
        let advice = match huge {
            HugePages::Transparent => libc::MADV_HUGEPAGE,
            HugePages::None => libc::MADV_NOHUGEPAGE,
            HugePages::Giant => 0,
        };
        // (Miri has no madvise; the advice changes no contents.)
        if advice != 0 && !cfg!(miri) {
            // SAFETY: advice on the mapping just created; failure (no THP support) is harmless.
            unsafe { libc::madvise(base, len as usize, advice) };
        }
        let chunks = (len / CHUNK) as usize;
        Ok(Region {
            base: base.cast(),
            len,
            class: (0..chunks).map(|_| AtomicU8::new(0)).collect(),
            links: map_links(len)?,
            chunk_links: (0..chunks).map(|_| AtomicU32::new(u32::MAX)).collect(),
            carved: std::sync::atomic::AtomicU64::new(0),
            huge,
        })
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn base(&self) -> u64 {
        self.base as u64
    }

    pub fn carved_bytes(&self) -> u64 {
        self.carved.load(Ordering::Relaxed) * CHUNK
    }

    /// Carves `chunks` chunks for `class`; returns the first one's block index (in units of
    /// `MIN_BLOCK`). Call with the carve lock held.
    pub fn carve(&self, chunks: u64, class: usize) -> Result<u32> {
        let first = self.carved.load(Ordering::Relaxed);
        let end = first + chunks;
        if end * CHUNK > self.len {
            return Err(AclError::oom(format!(
                "host pool exhausted: {} of {} carved, {} more needed; create the pool with a larger capacity or call trim()",
                format_size(first * CHUNK),
                format_size(self.len),
                format_size(chunks * CHUNK)
            )));
        }
        for c in first..end {
            self.class[c as usize].store(class as u8 + 1, Ordering::Release);
        }
        self.carved.store(end, Ordering::Relaxed);
        Ok((first * CHUNK / super::classes::MIN_BLOCK) as u32)
    }

    /// The class of the block at `index`, if it lies in a carved chunk.
    pub fn class_at(&self, index: u32) -> Option<usize> {
        let chunk = (index as u64 * super::classes::MIN_BLOCK / CHUNK) as usize;
        match self.class.get(chunk)?.load(Ordering::Acquire) {
            0 => None,
            c => Some(c as usize - 1),
        }
    }

    /// The free-list link slot of the chunk-spanning block at `index`.
    pub fn chunk_link(&self, index: u32) -> &AtomicU32 {
        &self.chunk_links[(index as u64 * super::classes::MIN_BLOCK / CHUNK) as usize]
    }

    /// The free-list link slot of the slab block at `index`.
    pub fn link(&self, index: u32) -> &AtomicU32 {
        debug_assert!((index as u64) < self.len / super::classes::MIN_BLOCK);
        // SAFETY: the table has one slot per 64-byte unit of the region and lives as long as it;
        // zero-filled pages are valid `AtomicU32`s.
        unsafe { &*self.links.add(index as usize) }
    }

    pub fn ptr(&self, index: u32) -> *mut u8 {
        // SAFETY (of the arithmetic): indices come from `carve`, inside the mapping.
        self.base.wrapping_add(index as usize * super::classes::MIN_BLOCK as usize)
    }

    /// The index of `ptr`, if it is a block start inside the region.
    pub fn index_of(&self, ptr: *const u8) -> Option<u32> {
        let off = (ptr as u64).checked_sub(self.base as u64)?;
        (off < self.len && off % super::classes::MIN_BLOCK == 0).then_some((off / super::classes::MIN_BLOCK) as u32)
    }

    /// Drops the pages of `[index, index + bytes)` (they read as zero and are committed again
    /// when touched).
    pub fn release_pages(&self, index: u32, bytes: u64) {
        if cfg!(miri) {
            // Miri has no madvise: zero the block, as the dropped pages would read.
            // SAFETY: the range is a free block of this mapping, which nobody else uses.
            unsafe { self.ptr(index).write_bytes(0, bytes as usize) };
            return;
        }
        // SAFETY: the range is a free block of this mapping; MADV_DONTNEED keeps the mapping.
        unsafe { libc::madvise(self.ptr(index).cast(), bytes as usize, libc::MADV_DONTNEED) };
    }
}

/// The link table: `len / 64` slots of 4 bytes, committed as they are touched.
fn map_links(len: u64) -> Result<*mut AtomicU32> {
    let bytes = (len / super::classes::MIN_BLOCK * 4) as usize;
    // SAFETY: an anonymous private mapping at an address of the kernel's choice.
    let p =
        unsafe { libc::mmap(std::ptr::null_mut(), bytes, libc::PROT_READ | libc::PROT_WRITE, LAZY_ANONYMOUS, -1, 0) };
    if p == libc::MAP_FAILED {
        return Err(AclError::oom(format!(
            "cannot map the host pool's link table ({}): {}",
            format_size(bytes as u64),
            std::io::Error::last_os_error()
        )));
    }
    Ok(p.cast())
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: the mappings created in `new`; no block outlives the pool (holders keep it
        // alive).
        unsafe {
            libc::munmap(self.base.cast(), self.len as usize);
            libc::munmap(self.links.cast(), (self.len / super::classes::MIN_BLOCK * 4) as usize);
        }
    }
}
