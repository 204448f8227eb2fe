//! `Memory`: the stand-in device's memory, made of host memory the way a driver's VMM API shapes
//! device memory.
//!
//! - a VA reservation is an anonymous `PROT_NONE | MAP_NORESERVE` mapping placed with
//!   `MAP_FIXED_NOREPLACE` (inside the 16–24 TiB window for AscendCL, next fit from the last
//!   reservation, stepping over ranges the process already uses; anywhere for CUDA);
//! - a physical allocation is a `memfd_create` file of its size (its pages are taken when first
//!   touched); the configured capacity is counted, not committed;
//! - a map is `mmap(MAP_FIXED | MAP_SHARED)` of that file into the reservation (two mappings of
//!   one allocation alias); an unmap puts a fresh `PROT_NONE` mapping back; a CUDA mapping stays
//!   `PROT_NONE` until `cuMemSetAccess`;
//! - copies and memsets check that every device byte they touch is mapped and accessible, then
//!   move bytes with `memmove` / `memset`; an address outside the device's reservations (and
//!   outside AscendCL's window) is host memory, which the caller vouches for, as with the real
//!   runtimes.
//!
//! Invariants: reservations never overlap; every mapping lies inside one reservation, starts at
//! a multiple of its allocation's granule and overlaps no other; a reservation with a mapping is
//! not released; a physical allocation's memory goes back when it has been freed and its last
//! mapping is gone (a free of a mapped one defers); `in_use` is the size of the allocations whose
//! memory is held and never passes the capacity; a failed call changes nothing.

use std::collections::{BTreeMap, HashMap};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use crate::Fail;

/// Where a reservation may go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// Wherever the runtime chooses.
    Anywhere,
    /// Exactly here, or fail (AscendCL's `expectPtr`).
    Exactly(u64),
    /// Here if free, else anywhere (CUDA's `addr` hint).
    Prefer(u64),
}

#[derive(Debug)]
pub struct Physical {
    fd: OwnedFd,
    pub size: u64,
    pub granule: u64,
    mapped: u32,
    freed: bool,
}

impl Physical {
    /// Live mappings of this allocation.
    pub fn mapped(&self) -> u32 {
        self.mapped
    }
}

#[derive(Clone, Copy, Debug)]
pub struct Mapping {
    pub handle: u64,
    pub size: u64,
    pub accessible: bool,
    /// The devices granted access (bit `d` for device `d`; every bit for a mapping accessible
    /// when made).
    pub granted: u64,
}

/// How many live objects of each kind the runtime holds (`npumem_fake_live_counts`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LiveCounts {
    /// Physical allocations whose memory is held (a freed but still mapped one counts).
    pub handles: u64,
    pub mappings: u64,
    pub reservations: u64,
    pub streams: u64,
    pub events: u64,
    pub host_blocks: u64,
    /// Bytes of the held physical allocations.
    pub physical_bytes: u64,
    /// Faults the switch has injected so far.
    pub faults_fired: u64,
}

#[derive(Debug)]
pub struct Memory {
    window: Option<(u64, u64)>,
    /// Where the next reservation search starts (next fit).
    cursor: u64,
    capacity: u64,
    reservations: BTreeMap<u64, u64>,
    mappings: BTreeMap<u64, Mapping>,
    physical: HashMap<u64, Physical>,
    next_handle: u64,
    in_use: u64,
    /// `aclrtMallocHost` / `cuMemAllocHost` blocks: address → size.
    host: HashMap<u64, u64>,
    /// `cuMemAlloc` blocks: address → (handle, size).
    linear: HashMap<u64, (u64, u64)>,
}

const HOST_ALIGN: usize = 64;
/// How far the reservation search steps past a range the process already uses.
const STEP: u64 = 1 << 30;

fn align_up(v: u64, a: u64) -> Option<u64> {
    v.checked_add(a - 1).map(|x| x & !(a - 1))
}

/// A `PROT_NONE` reservation of `[at, at + len)`, only if nothing of the process is there.
fn map_none_at(at: u64, len: u64) -> bool {
    // SAFETY: MAP_FIXED_NOREPLACE maps only where nothing is mapped; the result is checked.
    let p = unsafe {
        libc::mmap(
            at as *mut _,
            len as usize,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_FIXED_NOREPLACE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return false;
    }
    if p as u64 != at {
        // An old kernel without MAP_FIXED_NOREPLACE placed it elsewhere: undo.
        // SAFETY: the mapping was just made and nothing else knows it.
        unsafe { libc::munmap(p, len as usize) };
        return false;
    }
    true
}

/// A `PROT_NONE` reservation of `len` bytes aligned to `align`, wherever the kernel has room.
fn map_none_anywhere(len: u64, align: u64) -> Option<u64> {
    let span = len.checked_add(align)?;
    // SAFETY: a fresh anonymous mapping anywhere; the result is checked.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            span as usize,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return None;
    }
    let base = p as u64;
    let start = align_up(base, align)?;
    // SAFETY: the slack before and after the aligned range belongs to the mapping just made.
    unsafe {
        if start > base {
            libc::munmap(base as *mut _, (start - base) as usize);
        }
        if base + span > start + len {
            libc::munmap((start + len) as *mut _, (base + span - start - len) as usize);
        }
    }
    Some(start)
}

/// Puts a fresh `PROT_NONE` mapping over `[va, va + len)` (which is ours).
fn unmap_to_none(va: u64, len: u64) -> bool {
    let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_FIXED;
    // SAFETY: the range lies inside one of our reservations; MAP_FIXED replaces only it.
    unsafe { libc::mmap(va as *mut _, len as usize, libc::PROT_NONE, flags, -1, 0) != libc::MAP_FAILED }
}

impl Memory {
    pub fn new(window: Option<(u64, u64)>, capacity: u64) -> Memory {
        Memory {
            window,
            cursor: window.map_or(0, |w| w.0),
            capacity,
            reservations: BTreeMap::new(),
            mappings: BTreeMap::new(),
            physical: HashMap::new(),
            next_handle: 0x4000_0001,
            in_use: 0,
            host: HashMap::new(),
            linear: HashMap::new(),
        }
    }

    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// (free, total) bytes of device memory.
    pub fn mem_info(&self) -> (u64, u64) {
        (self.capacity - self.in_use, self.capacity)
    }

    /// The reservation that overlaps `[at, at + len)`, as its end.
    fn overlapping_reservation(&self, at: u64, len: u64) -> Option<u64> {
        let (&s, &l) = self.reservations.range(..at + len).next_back()?;
        (s + l > at).then_some(s + l)
    }

    /// Reserves `size` bytes of VA aligned to `align` (a power of two).
    pub fn reserve(&mut self, size: u64, align: u64, placement: Placement) -> Result<u64, Fail> {
        let window = self.window;
        let fits = |at: u64| {
            at % align == 0
                && at.checked_add(size).is_some_and(|end| window.is_none_or(|(lo, hi)| at >= lo && end <= hi))
        };
        let va = match placement {
            Placement::Exactly(at) | Placement::Prefer(at)
                if fits(at) && self.overlapping_reservation(at, size).is_none() && map_none_at(at, size) =>
            {
                Some(at)
            }
            Placement::Exactly(_) => return Err(Fail::InvalidValue),
            _ => match window {
                None => map_none_anywhere(size, align),
                Some(window) => self.place_in_window(size, align, window),
            },
        };
        let va = va.ok_or(Fail::OutOfMemory)?;
        self.reservations.insert(va, size);
        Ok(va)
    }

    /// Next fit inside the window: from the cursor to the end, then from the start.
    fn place_in_window(&mut self, size: u64, align: u64, (lo, hi): (u64, u64)) -> Option<u64> {
        for (from, to) in [(self.cursor, hi), (lo, self.cursor.min(hi))] {
            let Some(mut at) = align_up(from, align) else { continue };
            while at < to && at.checked_add(size).is_some_and(|end| end <= hi) {
                let next = if let Some(end) = self.overlapping_reservation(at, size) {
                    end
                } else if map_none_at(at, size) {
                    self.cursor = at + size;
                    return Some(at);
                } else {
                    // Something else of the process lives there (another library's mapping).
                    at + STEP.max(align)
                };
                match align_up(next, align) {
                    Some(n) => at = n,
                    None => break,
                }
            }
        }
        None
    }

    /// Releases the reservation that starts at `va` (of `size` bytes, where the caller says).
    pub fn release(&mut self, va: u64, size: Option<u64>) -> Result<(), Fail> {
        let &len = self.reservations.get(&va).ok_or(Fail::InvalidValue)?;
        if size.is_some_and(|s| s != len) {
            return Err(Fail::InvalidValue);
        }
        if self.mappings.range(va..va + len).next().is_some() {
            return Err(Fail::InUse);
        }
        // SAFETY: the reservation is ours and nothing is mapped in it.
        unsafe { libc::munmap(va as *mut _, len as usize) };
        self.reservations.remove(&va);
        Ok(())
    }

    /// A physical allocation of `size` bytes in units of `granule`.
    pub fn create(&mut self, size: u64, granule: u64) -> Result<u64, Fail> {
        if size == 0 || size % granule != 0 {
            return Err(Fail::InvalidValue);
        }
        if self.in_use.checked_add(size).is_none_or(|total| total > self.capacity) {
            return Err(Fail::OutOfMemory);
        }
        // SAFETY: the name is a valid C string; the result is checked.
        let raw = unsafe { libc::memfd_create(c"npumem-fake".as_ptr(), libc::MFD_CLOEXEC) };
        if raw < 0 {
            return Err(Fail::OutOfMemory);
        }
        // SAFETY: `raw` is a new descriptor nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: a plain system call on our descriptor.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), size as libc::off_t) } != 0 {
            return Err(Fail::OutOfMemory);
        }
        let handle = self.next_handle;
        self.next_handle += 1;
        self.physical.insert(handle, Physical { fd, size, granule, mapped: 0, freed: false });
        self.in_use += size;
        Ok(handle)
    }

    /// The live (not freed) physical allocation `handle`.
    pub fn physical(&self, handle: u64) -> Result<&Physical, Fail> {
        self.physical.get(&handle).filter(|p| !p.freed).ok_or(Fail::InvalidHandle)
    }

    /// Frees `handle`; a mapped allocation keeps its memory until its last unmap.
    pub fn free(&mut self, handle: u64) -> Result<(), Fail> {
        let p = self.physical.get_mut(&handle).filter(|p| !p.freed).ok_or(Fail::InvalidHandle)?;
        p.freed = true;
        if p.mapped == 0 {
            self.drop_physical(handle);
        }
        Ok(())
    }

    fn drop_physical(&mut self, handle: u64) {
        if let Some(p) = self.physical.remove(&handle) {
            self.in_use -= p.size;
        }
    }

    /// Maps the first `size` bytes of `handle` at `va`, readable and writable at once or (CUDA)
    /// only after `set_access`.
    pub fn map(&mut self, va: u64, size: u64, handle: u64, accessible: bool) -> Result<(), Fail> {
        let p = self.physical(handle)?;
        if size == 0 || size > p.size || size % p.granule != 0 {
            return Err(Fail::InvalidValue);
        }
        if va % p.granule != 0 {
            return Err(Fail::Unaligned);
        }
        let end = va.checked_add(size).ok_or(Fail::InvalidValue)?;
        let inside = self.reservations.range(..=va).next_back().is_some_and(|(&s, &l)| end <= s + l);
        if !inside {
            return Err(Fail::NotReserved);
        }
        if self.mappings.range(..end).next_back().is_some_and(|(&m, mp)| m + mp.size > va) {
            return Err(Fail::AlreadyMapped);
        }
        let prot = if accessible { libc::PROT_READ | libc::PROT_WRITE } else { libc::PROT_NONE };
        // SAFETY: [va, end) lies inside one of our PROT_NONE reservations with nothing mapped in
        // it (checked above), so MAP_FIXED replaces only our own reserved pages.
        let m = unsafe {
            libc::mmap(va as *mut _, size as usize, prot, libc::MAP_SHARED | libc::MAP_FIXED, p.fd.as_raw_fd(), 0)
        };
        if m == libc::MAP_FAILED {
            return Err(Fail::OutOfMemory);
        }
        self.physical.get_mut(&handle).expect("checked").mapped += 1;
        let granted = if accessible { u64::MAX } else { 0 };
        self.mappings.insert(va, Mapping { handle, size, accessible, granted });
        Ok(())
    }

    /// The mappings that exactly tile `[va, va + size)`, as their starts.
    fn tiling(&self, va: u64, size: u64) -> Result<Vec<u64>, Fail> {
        let end = va.checked_add(size).ok_or(Fail::InvalidValue)?;
        let mut at = va;
        let mut starts = Vec::new();
        for (&m, mp) in self.mappings.range(va..end) {
            if m != at {
                return Err(Fail::NotMapped);
            }
            starts.push(m);
            at = m + mp.size;
        }
        if at != end || starts.is_empty() {
            return Err(Fail::NotMapped);
        }
        Ok(starts)
    }

    /// Makes the mappings that tile `[va, va + size)` readable and writable by the devices of
    /// `devices` (a bit per device; `cuMemSetAccess`).
    pub fn set_access(&mut self, va: u64, size: u64, devices: u64) -> Result<(), Fail> {
        let starts = self.tiling(va, size)?;
        // SAFETY: the range is exactly our own mappings.
        if unsafe { libc::mprotect(va as *mut _, size as usize, libc::PROT_READ | libc::PROT_WRITE) } != 0 {
            return Err(Fail::InvalidValue);
        }
        for m in starts {
            let mapping = self.mappings.get_mut(&m).expect("tiled");
            mapping.accessible = true;
            mapping.granted |= devices;
        }
        Ok(())
    }

    /// Checks that `device` was granted access to every mapping device memory in
    /// `[addr, addr + len)` lies in (host memory needs none).
    pub fn check_granted(&self, addr: u64, len: u64, device: i32) -> Result<(), Fail> {
        if !self.check(addr, len)? {
            return Ok(());
        }
        let end = addr + len;
        let bit = 1u64.checked_shl(device as u32).unwrap_or(0);
        for (_, mp) in self.mappings.range(..end).rev().take_while(|&(&m, mp)| m + mp.size > addr) {
            if mp.granted & bit == 0 {
                return Err(Fail::NoAccess);
            }
        }
        Ok(())
    }

    /// Unmaps the mapping that starts at `va` (AscendCL), or the mappings that exactly tile
    /// `[va, va + size)` (CUDA).
    pub fn unmap(&mut self, va: u64, size: Option<u64>) -> Result<(), Fail> {
        let starts = match size {
            None => vec![va].into_iter().filter(|m| self.mappings.contains_key(m)).collect(),
            Some(size) => self.tiling(va, size)?,
        };
        if starts.is_empty() {
            return Err(Fail::NotMapped);
        }
        for m in starts {
            let mp = self.mappings[&m];
            if !unmap_to_none(m, mp.size) {
                return Err(Fail::OutOfMemory);
            }
            self.mappings.remove(&m);
            let p = self.physical.get_mut(&mp.handle).expect("mapped allocations are held");
            p.mapped -= 1;
            if p.mapped == 0 && p.freed {
                self.drop_physical(mp.handle);
            }
        }
        Ok(())
    }

    /// Whether `addr` is this device's memory (inside a reservation, or AscendCL's window).
    pub fn is_device(&self, addr: u64) -> bool {
        self.window.is_some_and(|(lo, hi)| (lo..hi).contains(&addr))
            || self.reservations.range(..=addr).next_back().is_some_and(|(&s, &l)| addr < s + l)
    }

    /// Checks that `[addr, addr + len)` is either host memory (outside the device) or device
    /// memory mapped and accessible throughout; returns whether it is device memory.
    pub fn check(&self, addr: u64, len: u64) -> Result<bool, Fail> {
        if addr == 0 {
            return Err(Fail::InvalidValue);
        }
        let end = addr.checked_add(len).ok_or(Fail::InvalidValue)?;
        if !self.is_device(addr) {
            return Ok(false);
        }
        let mut at = addr;
        while at < end {
            let (m, mp) =
                self.mappings.range(..=at).next_back().filter(|&(&m, mp)| at < m + mp.size).ok_or(Fail::NotMapped)?;
            if !mp.accessible {
                return Err(Fail::NoAccess);
            }
            at = m + mp.size;
        }
        Ok(true)
    }

    /// `memmove` of `len` bytes from `src` to `dst` after checking both, and that they are on the
    /// sides `want` names as (dst is device, src is device), when it names them.
    pub fn copy(&self, dst: u64, src: u64, len: u64, want: Option<(bool, bool)>) -> Result<(), Fail> {
        let sides = (self.check(dst, len)?, self.check(src, len)?);
        if want.is_some_and(|w| w != sides) {
            return Err(Fail::InvalidValue);
        }
        if len > 0 && dst != src {
            // SAFETY: device ranges were checked to be mapped read-write; host ranges are the
            // caller's, as the real runtime's are. `ptr::copy` allows overlap.
            unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, len as usize) };
        }
        Ok(())
    }

    /// `memset` of `len` bytes at `dst` after checking it (and that it is device memory, when
    /// `device_only`).
    pub fn fill(&self, dst: u64, value: u8, len: u64, device_only: bool) -> Result<(), Fail> {
        if !self.check(dst, len)? && device_only {
            return Err(Fail::InvalidValue);
        }
        // SAFETY: as in `copy`.
        unsafe { std::ptr::write_bytes(dst as *mut u8, value, len as usize) };
        Ok(())
    }

    /// Page-locked host memory (`aclrtMallocHost`, `cuMemAllocHost`), 64-byte aligned.
    pub fn malloc_host(&mut self, size: u64) -> Result<u64, Fail> {
        let layout = usize::try_from(size)
            .ok()
            .and_then(|s| std::alloc::Layout::from_size_align(s.max(1), HOST_ALIGN).ok())
            .ok_or(Fail::InvalidValue)?;
        // SAFETY: the layout has a non-zero size.
        let p = unsafe { std::alloc::alloc(layout) };
        if p.is_null() {
            return Err(Fail::OutOfMemory);
        }
        self.host.insert(p as u64, size);
        Ok(p as u64)
    }

    pub fn free_host(&mut self, ptr: u64) -> Result<(), Fail> {
        let size = self.host.remove(&ptr).ok_or(Fail::InvalidValue)?;
        let layout = std::alloc::Layout::from_size_align(size.max(1) as usize, HOST_ALIGN).expect("made at malloc");
        // SAFETY: `ptr` came from `alloc` with this layout and is freed once (removed above).
        unsafe { std::alloc::dealloc(ptr as *mut u8, layout) };
        Ok(())
    }

    /// `cuMemAlloc`: a reservation, an allocation and an accessible mapping of `size` bytes
    /// rounded up to `granule`.
    pub fn alloc_linear(&mut self, size: u64, granule: u64) -> Result<u64, Fail> {
        let size = align_up(size.max(1), granule).ok_or(Fail::InvalidValue)?;
        let handle = self.create(size, granule)?;
        let va = match self.reserve(size, granule, Placement::Anywhere) {
            Ok(va) => va,
            Err(e) => {
                self.free(handle)?;
                return Err(e);
            }
        };
        if let Err(e) = self.map(va, size, handle, true) {
            self.release(va, None)?;
            self.free(handle)?;
            return Err(e);
        }
        self.free(handle)?; // kept until the unmap
        self.linear.insert(va, (handle, size));
        Ok(va)
    }

    pub fn free_linear(&mut self, va: u64) -> Result<(), Fail> {
        let &(_, size) = self.linear.get(&va).ok_or(Fail::InvalidValue)?;
        self.unmap(va, Some(size))?;
        self.release(va, None)?;
        self.linear.remove(&va);
        Ok(())
    }

    /// (handles, mappings, reservations, host blocks, physical bytes).
    pub fn counts(&self) -> LiveCounts {
        LiveCounts {
            handles: self.physical.len() as u64,
            mappings: self.mappings.len() as u64,
            reservations: self.reservations.len() as u64,
            host_blocks: self.host.len() as u64,
            physical_bytes: self.in_use,
            ..LiveCounts::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn map_alias_defer_and_release() {
        let mut m = Memory::new(Some((0x1000_0000_0000, 0x1800_0000_0000)), 64 * MIB);
        let va = m.reserve(4 * MIB, 2 * MIB, Placement::Anywhere).unwrap();
        assert!(m.is_device(va) && va % (2 * MIB) == 0);
        let h = m.create(MIB, 4096).unwrap();
        assert_eq!(m.create(64 * MIB, 4096), Err(Fail::OutOfMemory));
        assert_eq!(m.create(1000, 4096), Err(Fail::InvalidValue));
        m.map(va, MIB, h, true).unwrap();
        m.map(va + 2 * MIB, MIB, h, true).unwrap();
        assert_eq!(m.map(va + MIB / 2, MIB, h, true), Err(Fail::AlreadyMapped));
        assert_eq!(m.map(va + 3 * MIB + 4096, MIB, h, true), Err(Fail::NotReserved));
        assert_eq!(m.map(va + 1, 4096, h, true), Err(Fail::Unaligned));
        m.fill(va + 10, 7, 3, true).unwrap();
        let mut out = [0u8; 3];
        m.copy(out.as_mut_ptr() as u64, va + 2 * MIB + 10, 3, Some((false, true))).unwrap();
        assert_eq!(m.copy(va, va + 2 * MIB, 3, Some((false, true))), Err(Fail::InvalidValue));
        assert_eq!(out, [7, 7, 7]);
        assert_eq!(m.check(va + MIB, 1), Err(Fail::NotMapped));
        assert_eq!(m.release(va, None), Err(Fail::InUse));
        m.free(h).unwrap();
        assert_eq!(m.free(h), Err(Fail::InvalidHandle));
        assert_eq!(m.counts().physical_bytes, MIB, "freed while mapped: held until the last unmap");
        m.unmap(va, None).unwrap();
        m.unmap(va + 2 * MIB, None).unwrap();
        assert_eq!(m.counts(), LiveCounts { reservations: 1, ..LiveCounts::default() });
        m.release(va, None).unwrap();
        assert_eq!(m.release(va, None), Err(Fail::InvalidValue));
    }

    #[test]
    fn exact_placement_and_cuda_access() {
        let mut m = Memory::new(None, 64 * MIB);
        let va = m.reserve(4 * MIB, 2 * MIB, Placement::Anywhere).unwrap();
        assert_eq!(m.reserve(MIB, 4096, Placement::Exactly(va)), Err(Fail::InvalidValue));
        let other = m.reserve(2 * MIB, 2 * MIB, Placement::Prefer(va)).unwrap();
        assert_ne!(other, va);
        let h = m.create(2 * MIB, 2 * MIB).unwrap();
        m.map(va, 2 * MIB, h, false).unwrap();
        assert_eq!(m.fill(va, 1, 1, true), Err(Fail::NoAccess));
        assert_eq!(m.set_access(va, 4 * MIB, 1), Err(Fail::NotMapped));
        m.set_access(va, 2 * MIB, 1).unwrap();
        assert_eq!(m.check_granted(va, 16, 0), Ok(()));
        assert_eq!(m.check_granted(va, 16, 1), Err(Fail::NoAccess), "device 1 was not granted access");
        m.fill(va, 1, 2 * MIB, true).unwrap();
        assert_eq!(m.unmap(va, Some(MIB)), Err(Fail::NotMapped));
        m.unmap(va, Some(2 * MIB)).unwrap();
        m.free(h).unwrap();
        m.release(va, Some(4 * MIB)).unwrap();
        m.release(other, None).unwrap();
        let p = m.alloc_linear(100, 2 * MIB).unwrap();
        m.fill(p, 0, 2 * MIB, true).unwrap();
        let mut host = [1u8; 4];
        assert_eq!(m.fill(host.as_mut_ptr() as u64, 0, 4, true), Err(Fail::InvalidValue));
        m.fill(host.as_mut_ptr() as u64, 0, 4, false).unwrap();
        assert_eq!(host, [0; 4]);
        m.free_linear(p).unwrap();
        assert_eq!(m.counts(), LiveCounts::default());
    }
}
