//! `HostBackend`: the VMM API over real Linux memory, in the shape of `aclrtReserveMemAddress` /
//! `aclrtMallocPhysical` / `aclrtMapMem`, so that every allocator family runs on memory a program
//! can dereference.
//!
//! - the backend's address window: one anonymous `PROT_NONE | MAP_NORESERVE` mapping of 16 times
//!   the capacity (64 GiB to 8 TiB; address space only), starting at 16 TiB as on the device when
//!   that range is free, else wherever the kernel puts it; reservations are carved from it (best fit, as `VaSpace` does), so a
//!   released range stays this device's (a later access is a use after free, never somebody
//!   else's memory) and never collides with the process's other mappings;
//! - physical allocation: a `memfd_create` file of that size (`MFD_HUGETLB | MFD_HUGE_2MB` /
//!   `MFD_HUGE_1GB` for huge / giant pages), its memory committed at once with `fallocate`, so
//!   a shortage is an out-of-memory error here, never a `SIGBUS` on first touch;
//! - map: `mmap(MAP_FIXED | MAP_SHARED)` of the memfd into the reservation (normal pages are
//!   advised `MADV_NOHUGEPAGE`, so the page size reported is the one in force); unmap: a fresh
//!   `PROT_NONE` reservation mapped over it; several mappings of one allocation alias;
//! - byte access: plain memory access, after checking every byte lies in a mapping.
//!
//! Invariants: reservations lie in the window and never overlap; every mapping lies inside one
//! live reservation and no two overlap; whatever of the window is not mapped is `PROT_NONE`; a
//! reservation with a mapping is not released; a physical allocation's memory (its memfd) is released when it
//! is freed and no longer mapped (freeing a mapped one defers to its last unmap); bytes in use
//! never pass the configured capacity; a failed call changes nothing. Dropping the backend
//! unmaps and closes everything.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use super::ledger::Ledger;
use super::physical;
use super::{Backend, BackendCounters, PhysHandle};
use crate::acl::MemScope;
use crate::error::{AclError, ErrorCode, Result};
use crate::units::{GIB, MIB, format_size};
use crate::vm::{PageKind, PageSize, Translation, VA_WINDOW_END, VA_WINDOW_START, VaSpace};

/// The smallest capacity a host backend takes: one page of the largest normal size.
const HOST_MIN_CAPACITY: u64 = 64 * 1024;

/// The largest address window (the device's: 8 TiB).
const MAX_WINDOW: u64 = VA_WINDOW_END - VA_WINDOW_START;

/// The address window of a backend of `capacity` bytes: 16 times it (the npumem pool reserves
/// 8 times the device), from 64 GiB to 8 TiB, so that many devices fit in one process.
pub(super) fn window_size(capacity: u64) -> u64 {
    capacity.saturating_mul(16).next_multiple_of(GIB).clamp(64 * GIB, MAX_WINDOW)
}

/// Configuration of a host backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HostConfig {
    /// Bytes of physical memory the backend may hold at once (its "device" capacity).
    pub capacity: u64,
}

/// What the host backend keeps of a physical allocation: its memfd (closing it gives the
/// memory back) and its page kind.
#[derive(Debug)]
struct Memfd {
    fd: OwnedFd,
    kind: PageKind,
}

#[derive(Debug)]
pub struct HostBackend {
    config: HostConfig,
    normal: PageSize,
    /// The window's start and length (all of it is this backend's mapping).
    window: u64,
    window_len: u64,
    /// Reservations inside the window, the mappings in them and the physical allocations
    /// (their bytes count against the capacity until released).
    ledger: Ledger<Memfd>,
}

/// A field of /proc/meminfo, in bytes.
fn meminfo(field: &str) -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with(field) && l[field.len()..].starts_with(':'))?;
    let mut words = line[field.len() + 1..].split_whitespace();
    let value: u64 = words.next()?.parse().ok()?;
    Some(if words.next() == Some("kB") { value * 1024 } else { value })
}

/// (free, total) pages of the kernel's hugetlb pool of `page` pages.
fn hugetlb_pool(page: PageSize) -> (u64, u64) {
    let dir = format!("/sys/kernel/mm/hugepages/hugepages-{}kB", page.bytes() / 1024);
    let read = |name: &str| {
        std::fs::read_to_string(format!("{dir}/{name}")).ok().and_then(|s| s.trim().parse().ok()).unwrap_or(0)
    };
    (read("free_hugepages"), read("nr_hugepages"))
}

/// The path that reserves pages of `page` in the kernel's hugetlb pool, for messages.
fn nr_hugepages_path(page: PageSize) -> String {
    match page {
        PageSize::Size2M => "/proc/sys/vm/nr_hugepages".to_string(),
        _ => format!("/sys/kernel/mm/hugepages/hugepages-{}kB/nr_hugepages", page.bytes() / 1024),
    }
}

fn errno() -> std::io::Error {
    std::io::Error::last_os_error()
}

impl HostBackend {
    /// A backend that may hold `config.capacity` bytes at once.
    pub fn new(config: HostConfig) -> Result<Self> {
        if !(HOST_MIN_CAPACITY..=crate::backend::sim::MAX_CAPACITY).contains(&config.capacity) {
            return Err(AclError::invalid_param(format!(
                "capacity {} is out of range: the host backend holds from {} to {}",
                format_size(config.capacity),
                format_size(HOST_MIN_CAPACITY),
                format_size(crate::backend::sim::MAX_CAPACITY)
            )));
        }
        // SAFETY: sysconf only reads a system constant.
        let system_page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        let normal = match system_page {
            4096 => PageSize::Size4K,
            65536 => PageSize::Size64K,
            other => {
                return Err(AclError::new(
                    ErrorCode::FeatureUnsupported,
                    format!("the host backend needs 4 KiB or 64 KiB system pages; this system's are {other} bytes"),
                ));
            }
        };
        let window_len = window_size(config.capacity);
        let window = Self::map_window(window_len)?;
        Ok(HostBackend {
            config,
            normal,
            window,
            window_len,
            ledger: Ledger::new(VaSpace::with_granule(
                window,
                window + window_len,
                normal.bytes(),
                "host backend's address window",
            )),
        })
    }

    /// Maps the address window: at the device's 16–24 TiB when that range is free, else where
    /// the kernel chooses (aligned to 1 GiB, so giant pages fit).
    fn map_window(len: u64) -> Result<u64> {
        let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE;
        // SAFETY: MAP_FIXED_NOREPLACE maps only if nothing of this process is in the range.
        let p = unsafe {
            libc::mmap(
                VA_WINDOW_START as *mut _,
                len as usize,
                libc::PROT_NONE,
                flags | libc::MAP_FIXED_NOREPLACE,
                -1,
                0,
            )
        };
        if p != libc::MAP_FAILED && p as u64 == VA_WINDOW_START {
            return Ok(VA_WINDOW_START);
        }
        if p != libc::MAP_FAILED {
            // SAFETY: an old kernel placed it elsewhere; it is ours to undo.
            unsafe { libc::munmap(p, len as usize) };
        }
        let span = len + GIB;
        // SAFETY: a new PROT_NONE mapping anywhere the kernel chooses.
        let p = unsafe { libc::mmap(std::ptr::null_mut(), span as usize, libc::PROT_NONE, flags, -1, 0) };
        if p == libc::MAP_FAILED {
            return Err(AclError::oom(format!(
                "the host has no {} of free address space for the device window ({})",
                format_size(span),
                errno()
            )));
        }
        let base = p as u64;
        let start = base.next_multiple_of(GIB);
        // SAFETY: the slack before and after the aligned window is part of the mapping just made.
        unsafe {
            if start > base {
                libc::munmap(base as *mut _, (start - base) as usize);
            }
            if base + span > start + len {
                libc::munmap((start + len) as *mut _, (base + span - start - len) as usize);
            }
        }
        Ok(start)
    }

    /// The memory this process could take now (`MemAvailable`), the default capacity.
    pub fn available_memory() -> u64 {
        meminfo("MemAvailable").unwrap_or(0)
    }

    pub fn config(&self) -> HostConfig {
        self.config
    }
}

impl Backend for HostBackend {
    fn name(&self) -> &'static str {
        "host"
    }

    fn page_size(&self, kind: PageKind) -> PageSize {
        match kind {
            PageKind::Normal => self.normal,
            PageKind::Huge => PageSize::Size2M,
            PageKind::Giant => PageSize::Size1G,
        }
    }

    fn reserve(&mut self, size: u64, align: u64, hint: Option<u64>) -> Result<u64> {
        // The window is PROT_NONE already: a reservation is bookkeeping only.
        self.ledger.reserve(size, align.max(self.normal.bytes()), hint)
    }

    fn release(&mut self, va: u64) -> Result<()> {
        self.ledger.release(va)
    }

    fn create_physical(&mut self, size: u64, kind: PageKind) -> Result<PhysHandle> {
        let page = self.page_size(kind);
        physical::check_size(size, page, kind)?;
        self.ledger.check_capacity("host", self.config.capacity, 0, size)?;
        let flags = libc::MFD_CLOEXEC
            | match kind {
                PageKind::Normal => 0,
                PageKind::Huge => libc::MFD_HUGETLB | libc::MFD_HUGE_2MB,
                PageKind::Giant => libc::MFD_HUGETLB | libc::MFD_HUGE_1GB,
            };
        let shortage = |why: &str| {
            let (free, total) = hugetlb_pool(page);
            AclError::oom(format!(
                "cannot allocate {} of {} pages: {why} (the kernel's pool of {} pages has {free} of {total} free); \
                 reserve more with `echo N > {}` as root, or use HUGE_FIRST to accept normal pages",
                format_size(size),
                page.label(),
                page.label(),
                nr_hugepages_path(page)
            ))
        };
        // SAFETY: the name is a valid C string; the result is checked.
        let raw = unsafe { libc::memfd_create(c"npumem".as_ptr(), flags) };
        if raw < 0 {
            let e = errno();
            return Err(match kind {
                PageKind::Normal => AclError::oom(format!("memfd_create failed: {e}")),
                _ => shortage(&format!("memfd_create refused hugetlb pages ({e})")),
            });
        }
        // SAFETY: `raw` is a new descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: plain system calls on our descriptor; results are checked.
        let committed = unsafe {
            libc::ftruncate(fd.as_raw_fd(), size as libc::off_t) == 0
                && libc::fallocate(fd.as_raw_fd(), 0, 0, size as libc::off_t) == 0
        };
        if !committed {
            let e = errno();
            return Err(match kind {
                PageKind::Normal => AclError::oom(format!(
                    "the host could not commit {} of memory ({e}); MemAvailable is {}",
                    format_size(size),
                    format_size(Self::available_memory())
                )),
                _ => shortage(&format!("the kernel could not commit them ({e})")),
            });
        }
        Ok(self.ledger.insert(size, page, Memfd { fd, kind }))
    }

    fn free_physical(&mut self, handle: PhysHandle) -> Result<()> {
        // Released now (closing the memfd gives its memory back) or at the last unmap.
        self.ledger.free(handle).map(drop)
    }

    fn map(&mut self, va: u64, handle: PhysHandle) -> Result<()> {
        self.ledger.map(va, handle, |alloc| {
            let size = alloc.size;
            // SAFETY: [va, va + size) lies inside one of our PROT_NONE reservations with no
            // mapping in it (the ledger checked), so MAP_FIXED replaces only our own reserved pages.
            let p = unsafe {
                libc::mmap(
                    va as *mut _,
                    size as usize,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED | libc::MAP_FIXED,
                    alloc.memory.fd.as_raw_fd(),
                    0,
                )
            };
            if p == libc::MAP_FAILED {
                return Err(AclError::new(ErrorCode::RtDrvInternal, format!("mapping at {va:#x} failed: {}", errno())));
            }
            if alloc.memory.kind == PageKind::Normal {
                // Normal pages stay normal: no transparent huge pages behind the reported size.
                // SAFETY: advice on the mapping just made; failure only leaves the kernel's default.
                unsafe { libc::madvise(va as *mut _, size as usize, libc::MADV_NOHUGEPAGE) };
            }
            Ok(())
        })
    }

    fn unmap(&mut self, va: u64) -> Result<()> {
        // A memfd released by the last unmap closes (its memory goes back) as it drops.
        self.ledger
            .unmap(va, |mapping, _| {
                let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_FIXED;
                // SAFETY: the range is our own mapping; a fresh PROT_NONE mapping replaces it, so the
                // reservation stays whole and holds none of the memfd's pages.
                let p = unsafe { libc::mmap(va as *mut _, mapping.size as usize, libc::PROT_NONE, flags, -1, 0) };
                if p == libc::MAP_FAILED {
                    return Err(AclError::new(
                        ErrorCode::RtDrvInternal,
                        format!("unmapping {va:#x} failed: {}", errno()),
                    ));
                }
                Ok(())
            })
            .map(drop)
    }

    fn read(&mut self, va: u64, out: &mut [u8]) -> Result<()> {
        self.ledger.read(va, out.len() as u64, || {
            // SAFETY: every byte of the source is in a live read-write mapping of ours (checked),
            // and `out` is a distinct Rust buffer.
            unsafe { std::ptr::copy_nonoverlapping(va as *const u8, out.as_mut_ptr(), out.len()) };
            Ok(())
        })
    }

    fn write(&mut self, va: u64, data: &[u8]) -> Result<()> {
        self.ledger.write(va, data.len() as u64, || {
            // SAFETY: every byte of the destination is in a live read-write mapping of ours.
            unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), va as *mut u8, data.len()) };
            Ok(())
        })
    }

    fn fill(&mut self, va: u64, value: u8, count: u64) -> Result<()> {
        self.ledger.write(va, count, || {
            // SAFETY: every byte of the range is in a live read-write mapping of ours.
            unsafe { std::ptr::write_bytes(va as *mut u8, value, count as usize) };
            Ok(())
        })
    }

    fn copy(&mut self, dst: u64, src: u64, count: u64) -> Result<()> {
        self.ledger.copy(dst, src, count, || {
            // SAFETY: both ranges are in live read-write mappings of ours; `copy` allows overlap
            // (memmove), and ranges that alias through two mappings of one memfd behave the same.
            unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, count as usize) };
            Ok(())
        })
    }

    fn mem_info(&self, scope: MemScope) -> (u64, u64) {
        let cap = self.config.capacity;
        let free = self.ledger.unused(cap, 0);
        let available = Self::available_memory();
        match scope {
            MemScope::Ddr => (0, 0),
            MemScope::All | MemScope::Normal => (free.min(available), cap),
            MemScope::Huge | MemScope::Giant => {
                let page = if scope == MemScope::Huge { PageSize::Size2M } else { PageSize::Size1G };
                let (pool_free, pool_total) = hugetlb_pool(page);
                ((pool_free * page.bytes()).min(free), (pool_total * page.bytes()).min(cap))
            }
        }
    }

    fn translate(&self, va: u64) -> Result<Translation> {
        self.ledger.translate_by_handle(va)
    }

    fn counters(&self) -> BackendCounters {
        self.ledger.counters
    }

    fn mapping_containing(&self, va: u64) -> Option<(u64, PhysHandle, u64)> {
        self.ledger.mapping_containing(va)
    }

    fn window(&self) -> (u64, u64) {
        (self.window, self.window + self.window_len)
    }

    fn host_accessible(&self) -> bool {
        true
    }
}

impl Drop for HostBackend {
    fn drop(&mut self) {
        // SAFETY: the window is ours (with whatever is mapped in it); nothing refers to it once
        // the backend is gone. The memfds close with the ledger.
        unsafe { libc::munmap(self.window as *mut _, self.window_len as usize) };
    }
}

/// The bytes `HostConfig::capacity` defaults to: what the process could take now, or 1 GiB
/// where /proc/meminfo cannot be read.
pub fn default_capacity() -> u64 {
    match HostBackend::available_memory() {
        0 => GIB,
        bytes => bytes.max(64 * MIB),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(capacity: u64) -> HostBackend {
        HostBackend::new(HostConfig { capacity }).unwrap()
    }

    #[test]
    fn two_mappings_of_one_allocation_alias() {
        let mut b = host(64 * MIB);
        let h = b.create_physical(64 * 1024, PageKind::Normal).unwrap();
        let va = b.reserve(4 * MIB, 2 * MIB, None).unwrap();
        assert_eq!(va % (2 * MIB), 0);
        let (start, end) = b.window();
        assert!(b.owns(va) && b.owns(start) && !b.owns(end) && end - start == 64 * GIB);
        b.map(va, h).unwrap();
        b.map(va + MIB, h).unwrap();
        b.write(va + 10, b"npumem").unwrap();
        let mut out = [0u8; 6];
        b.read(va + MIB + 10, &mut out).unwrap();
        assert_eq!(&out, b"npumem");
        assert_eq!(b.translate(va + 10).unwrap().pa, b.translate(va + MIB + 10).unwrap().pa);
        assert_eq!(b.translate(va).unwrap().page_size, b.page_size(PageKind::Normal));
        assert!(b.read(va + 64 * 1024, &mut out).is_err(), "past the mapping");
        assert!(b.release(va).is_err(), "a reservation with mappings stays");
        b.free_physical(h).unwrap();
        assert_eq!(b.mem_info(MemScope::All).1, 64 * MIB);
        assert_eq!(b.ledger.held_bytes(), 64 * 1024, "freed while mapped: kept until the last unmap");
        b.unmap(va).unwrap();
        b.read(va + MIB + 10, &mut out).unwrap();
        b.unmap(va + MIB).unwrap();
        assert_eq!(b.ledger.held_bytes(), 0);
        assert!(b.read(va + MIB + 10, &mut out).is_err());
        b.release(va).unwrap();
        assert_eq!(b.ledger.space.reservation_count(), 0);
        assert!(b.owns(va), "a released range stays in the window");
    }

    #[test]
    fn capacity_and_bad_calls_are_errors() {
        for bad in [0, 4095, 1 << 41] {
            assert!(HostBackend::new(HostConfig { capacity: bad }).is_err(), "capacity {bad}");
        }
        let mut b = host(MIB);
        let err = b.create_physical(2 * MIB, PageKind::Normal).unwrap_err();
        assert!(err.code.is_out_of_memory(), "{}", err.message);
        assert!(b.create_physical(1000, PageKind::Normal).is_err());
        assert!(b.map(0x1000, 7).is_err());
        let h = b.create_physical(MIB, PageKind::Normal).unwrap();
        assert!(b.map(0x1000, h).is_err(), "no reservation there");
        let va = b.reserve(MIB, 4096, None).unwrap();
        assert!(b.map(va + 4096, h).is_err(), "runs past the reservation");
        b.map(va, h).unwrap();
        let other = b.reserve(MIB, 4096, None).unwrap();
        b.copy(va + 8, va, 100).unwrap();
        assert!(b.copy(other, va, 8).is_err(), "the destination is not mapped");
        b.fill(va, 7, MIB).unwrap();
        let mut out = [0u8; 2];
        b.read(va + MIB - 2, &mut out).unwrap();
        assert_eq!(out, [7, 7]);
        b.unmap(va).unwrap();
        b.free_physical(h).unwrap();
        assert!(b.free_physical(h).is_err());
    }

    #[test]
    fn huge_pages_come_from_the_hugetlb_pool_or_fail_naming_it() {
        let mut b = host(64 * MIB);
        match b.create_physical(2 * MIB, PageKind::Huge) {
            Ok(h) => {
                let va = b.reserve(2 * MIB, 2 * MIB, None).unwrap();
                b.map(va, h).unwrap();
                assert_eq!(b.translate(va).unwrap().page_size, PageSize::Size2M);
                b.write(va + 2 * MIB - 1, &[1]).unwrap();
                b.unmap(va).unwrap();
                b.free_physical(h).unwrap();
            }
            Err(e) => {
                assert!(e.code.is_out_of_memory(), "{}", e.message);
                assert!(e.message.contains("/proc/sys/vm/nr_hugepages"), "{}", e.message);
            }
        }
    }
}
