//! `DriverBackend`: the `Backend` trait over a real accelerator runtime's VMM calls — AscendCL
//! ([`super::acl`]) or the CUDA driver ([`super::cuda`]) — through the small [`Driver`] seam each
//! of them implements. What the two share lives here: the books (a [`Ledger`], so the VMM
//! contract is checked before the runtime is called), the capacity budget, the runtime's
//! reservations, stranded frees and host blocks, and the clean-up when the backend goes.
//!
//! - `capacity` is a budget inside the runtime's device: physical allocations past it are
//!   out-of-memory (207001) before the runtime is asked; the runtime's own out-of-memory
//!   passes through with its code;
//! - a reservation the runtime placed off the alignment asked for is made again `align` bytes
//!   larger and used from its first aligned address (AscendCL takes no alignment); a driver that
//!   holds one window for its life (CUDA) has its reservations placed inside it by the books;
//! - the runtime's free is never called on a mapped handle (AscendCL's `aclrtFreePhysical`
//!   requires the handle unmapped first): freeing a mapped physical allocation marks it in the
//!   books, and the unmap that takes its last mapping frees it in the runtime;
//! - freeing an unmapped physical allocation or releasing an empty reservation cannot fail under
//!   the `Backend` contract (the allocators tear segments down on it); where the runtime refuses
//!   all the same, the object is *stranded*: gone from the books the allocators see, kept in a
//!   list that is retried before each new allocation or reservation, at `reclaim_stranded`
//!   (the device's `empty_cache`) and when the backend goes, its bytes counted against the
//!   capacity until the runtime has taken it back. Each refusal is reported: counted
//!   (`refused_frees`), recorded as a warning (`take_warnings`), and, while it persists, the
//!   error `reclaim_stranded` returns (207002 `ACL_ERROR_RT_MEMORY_FREE`);
//! - `malloc_host` is the runtime's page-locked host memory (`aclrtMallocHost`,
//!   `cuMemAllocHost`), the blocks it returned kept in the books (a free of another address is
//!   an error before the runtime sees it) and freed when the backend goes;
//! - an overlapping device-to-device copy goes through host memory in 1 MiB pieces, in the
//!   order `memmove` would take (the runtimes' copies do not allow overlap);
//! - physical addresses are not visible: `translate` reports the allocation's handle and the
//!   offset in it (equal for two mappings of one byte) and the allocation's page size.
//!
//! Invariants: the books hold exactly what the runtime holds for this backend; every runtime
//! call is made with the backend's device current on the calling thread; a call that fails —
//! in the books' checks or in the runtime — leaves both as they were (a failure in the second of
//! two runtime steps undoes the first); bytes in use never pass the capacity; dropping the
//! backend unmaps, frees and releases everything it holds.

use rustc_hash::{FxHashMap, FxHashSet};

use super::ledger::Ledger;
use super::physical;
use super::{Backend, BackendCounters, PhysHandle};
use crate::acl::MemScope;
use crate::error::{AclError, ErrorCode, Result};
use crate::stream::RuntimeStreams;
use crate::stream::runtime::Handle;
use crate::units::{MIB, checked_align_up, format_size};
use crate::vm::{PageKind, PageSize, Translation, VaSpace};

mod streams;

/// An opaque handle of the runtime's (`aclrtDrvMemHandle`, `CUmemGenericAllocationHandle`).
pub type RawHandle = u64;

/// What a runtime does for a [`DriverBackend`]: its VMM calls here, its streams and events as
/// [`RuntimeStreams`]. Every call makes the backend's device current on the calling thread first.
pub trait Driver: RuntimeStreams {
    /// The backend's name ("acl", "cuda").
    fn name(&self) -> &'static str;
    /// The allocation granularity of physical memory of `kind`, in bytes.
    fn granularity(&self, kind: PageKind) -> Result<u64>;
    /// The range every reservation of the runtime lies in (for the books).
    fn window(&self) -> (u64, u64);
    /// Whether every address of `window` is the device's (AscendCL's VA window).
    fn owns_window(&self) -> bool;
    /// Whether `window` is one reservation the driver holds for its whole life (the CUDA
    /// driver's): the backend then places its reservations inside it in its books, without
    /// runtime calls.
    fn holds_window(&self) -> bool {
        false
    }
    /// Reserves `size` bytes of VA (aligned to `align` where the runtime takes an alignment),
    /// exactly at `hint` when given.
    fn reserve(&self, size: u64, align: u64, hint: Option<u64>) -> Result<u64>;
    fn release(&self, va: u64, size: u64) -> Result<()>;
    fn create(&self, size: u64, kind: PageKind) -> Result<RawHandle>;
    fn free(&self, handle: RawHandle) -> Result<()>;
    /// Maps the whole of `handle` (`size` bytes) at `va`, readable and writable.
    fn map(&self, va: u64, size: u64, handle: RawHandle) -> Result<()>;
    fn unmap(&self, va: u64, size: u64) -> Result<()>;
    fn read(&self, va: u64, out: &mut [u8]) -> Result<()>;
    fn write(&self, va: u64, data: &[u8]) -> Result<()>;
    fn fill(&self, va: u64, value: u8, count: u64) -> Result<()>;
    /// Copies between device ranges that do not overlap.
    fn copy(&self, dst: u64, src: u64, count: u64) -> Result<()>;
    /// (free, total) bytes of the runtime's device memory of `scope`.
    fn mem_info(&self, scope: MemScope) -> Result<(u64, u64)>;
    /// `size` bytes of the runtime's page-locked host memory (`aclrtMallocHost`,
    /// `cuMemAllocHost`).
    fn malloc_host(&self, size: u64) -> Result<u64>;
    /// Frees a block `malloc_host` returned (`aclrtFreeHost`, `cuMemFreeHost`).
    fn free_host(&self, addr: u64) -> Result<()>;
    /// How the runtime answers a query of an event never recorded: complete (CUDA's
    /// `cuEventQuery`) or not ready (AscendCL's `aclrtQueryEventStatus`, whose events start in
    /// their initial state).
    fn fresh_event_complete(&self) -> bool;
}

/// `RuntimeStreams` for a driver whose runtime (`self.bound()`) has the stream and event calls
/// under these names (`AclRuntime`, `CudaRuntime`); `$synchronize_device` waits for the device.
macro_rules! runtime_streams {
    ($driver:ty, $synchronize_device:ident) => {
        impl RuntimeStreams for $driver {
            fn is_real(&self) -> bool {
                true
            }

            fn create_stream(&mut self) -> Result<Handle> {
                self.bound()?.create_stream()
            }

            fn destroy_stream(&mut self, stream: Handle) -> Result<()> {
                self.bound()?.destroy_stream(stream)
            }

            fn create_event(&mut self) -> Result<Handle> {
                self.bound()?.create_event()
            }

            fn destroy_event(&mut self, event: Handle) -> Result<()> {
                self.bound()?.destroy_event(event)
            }

            fn record_event(&mut self, event: Handle, stream: Handle) -> Result<()> {
                self.bound()?.record_event(event, stream)
            }

            fn stream_wait_event(&mut self, stream: Handle, event: Handle) -> Result<()> {
                self.bound()?.stream_wait_event(stream, event)
            }

            fn query_event(&mut self, event: Handle) -> Result<bool> {
                self.bound()?.query_event(event)
            }

            fn synchronize_event(&mut self, event: Handle) -> Result<()> {
                self.bound()?.synchronize_event(event)
            }

            fn synchronize_stream(&mut self, stream: Handle) -> Result<()> {
                self.bound()?.synchronize_stream(stream)
            }

            fn synchronize_device(&mut self) -> Result<()> {
                self.bound()?.$synchronize_device()
            }

            fn memcpy_async(&mut self, dst: u64, src: u64, count: u64, stream: Handle) -> Result<bool> {
                // SAFETY: the device checked both ranges (device memory, or its pinned host blocks,
                // which it keeps until the runtime's work on them is complete) before queuing the copy.
                unsafe { self.bound()?.memcpy_async(dst, src, count, stream) }.map(|()| true)
            }

            fn memset_async(&mut self, dst: u64, value: u8, count: u64, stream: Handle) -> Result<bool> {
                self.bound()?.memset_async(dst, value, count, stream).map(|()| true)
            }
        }
    };
}
pub(super) use runtime_streams;

/// Bytes an overlapping copy moves through host memory at a time.
const BOUNCE: u64 = MIB;

pub struct DriverBackend<D: Driver> {
    driver: D,
    capacity: u64,
    pages: [PageSize; 3],
    /// Reservations, mappings and physical allocations (each with the runtime's handle).
    ledger: Ledger<RawHandle>,
    /// Reservations by their start: (the runtime's start, the runtime's size).
    reservations: FxHashMap<u64, (u64, u64)>,
    /// Bytes of stranded physical allocations (still the runtime's, so counted against the
    /// capacity with the books' bytes).
    stranded_bytes: u64,
    /// The runtime streams and events this backend created (and destroys when it goes).
    streams: FxHashSet<Handle>,
    events: FxHashSet<Handle>,
    /// What the runtime refused to take back (see the module's notes), retried.
    stranded: Vec<Stranded>,
    /// Warnings not yet taken (`take_warnings`), at most `WARNINGS_KEPT`.
    warnings: Vec<String>,
    /// The runtime's page-locked host blocks this backend handed out (freed when it goes).
    host_blocks: FxHashSet<u64>,
    /// Destroyed events kept for the next `create_event` (the device makes one per free under
    /// queued work; the runtime's create and destroy cost more than a reuse), at most
    /// `EVENT_POOL` of them; not in `events`.
    spare_events: Vec<Handle>,
    /// Events handed out from `spare_events` and not recorded since: they answer a query as a
    /// new event does (`Driver::fresh_event_complete`), not as their last record did.
    reissued: FxHashSet<Handle>,
}

/// The most warnings a backend keeps until they are taken (later ones are counted only).
const WARNINGS_KEPT: usize = 64;

/// The most destroyed events a backend keeps for reuse.
const EVENT_POOL: usize = 256;

/// A physical allocation (its raw handle and size) or a reservation (the runtime's start and
/// size) the runtime refused to free.
#[derive(Clone, Copy, Debug)]
enum Stranded {
    Physical(RawHandle, u64),
    Reservation(u64, u64),
}

impl std::fmt::Display for Stranded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            Stranded::Physical(raw, size) => write!(f, "physical allocation {raw:#x} ({})", format_size(size)),
            Stranded::Reservation(start, len) => {
                write!(f, "the address reservation at {start:#x} ({})", format_size(len))
            }
        }
    }
}

fn page_of(driver: &impl Driver, kind: PageKind) -> Result<PageSize> {
    let bytes = driver.granularity(kind)?;
    PageSize::from_bytes(bytes).ok_or_else(|| {
        AclError::new(
            ErrorCode::FeatureUnsupported,
            format!(
                "the {} runtime allocates {} memory in units of {}; npumem handles 4 KiB, 64 KiB, 2 MiB and 1 GiB",
                driver.name(),
                kind.label(),
                format_size(bytes)
            ),
        )
    })
}

impl<D: Driver> DriverBackend<D> {
    /// A backend over `driver` that may hold `capacity` bytes (at most the device's memory).
    pub fn new(driver: D, capacity: u64) -> Result<Self> {
        let normal = page_of(&driver, PageKind::Normal)?;
        // A runtime with one granularity (CUDA) may not answer for the larger kinds: their sizes
        // are multiples of it all the same.
        let larger = |kind, size| page_of(&driver, kind).unwrap_or(size);
        let pages = [normal, larger(PageKind::Huge, PageSize::Size2M), larger(PageKind::Giant, PageSize::Size1G)];
        let (_, total) = driver.mem_info(MemScope::All)?;
        if capacity < normal.bytes() || capacity > total {
            return Err(AclError::invalid_param(format!(
                "capacity {} is out of range: the {} device has {} (and allocates at least {})",
                format_size(capacity),
                driver.name(),
                format_size(total),
                normal.label()
            )));
        }
        let (lo, hi) = driver.window();
        let space = VaSpace::with_granule(lo, hi, normal.bytes(), "runtime's address space");
        Ok(DriverBackend {
            driver,
            capacity,
            pages,
            ledger: Ledger::new(space),
            reservations: FxHashMap::default(),
            stranded_bytes: 0,
            streams: FxHashSet::default(),
            events: FxHashSet::default(),
            stranded: Vec::new(),
            warnings: Vec::new(),
            host_blocks: FxHashSet::default(),
            spare_events: Vec::new(),
            reissued: FxHashSet::default(),
        })
    }

    pub fn driver(&self) -> &D {
        &self.driver
    }

    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Reserves at the runtime, making the range larger when the runtime placed it off `align`.
    fn reserve_aligned(&self, size: u64, align: u64, hint: Option<u64>) -> Result<(u64, u64, u64)> {
        let va = self.driver.reserve(size, align, hint)?;
        if va % align == 0 {
            return Ok((va, va, size));
        }
        self.driver.release(va, size)?;
        if hint.is_some() {
            return Err(AclError::invalid_param(format!(
                "the runtime placed the reservation at {va:#x}, not at the hint aligned to {}",
                format_size(align)
            )));
        }
        let wide = size
            .checked_add(align)
            .ok_or_else(|| AclError::invalid_param(format!("reservation size {size} is too large")))?;
        let base = self.driver.reserve(wide, align, None)?;
        let start = checked_align_up(base, align).expect("inside the runtime's reservation");
        Ok((start, base, wide))
    }

    /// Keeps `what` the runtime refused to take back (`error`), and reports it: counted in
    /// `refused_frees` and recorded as a warning.
    fn strand(&mut self, what: Stranded, error: &AclError) {
        self.ledger.counters.refused_frees += 1;
        if let Stranded::Physical(_, size) = what {
            self.stranded_bytes += size;
        }
        if self.warnings.len() < WARNINGS_KEPT {
            self.warnings.push(format!(
                "the {} runtime refused to free {what}: {}; npumem keeps it (counted against the capacity) \
                 and asks again before the next allocation and at empty_cache",
                self.driver.name(),
                error.message
            ));
        }
        self.stranded.push(what);
    }

    /// Asks the runtime again to take back what it refused before; keeps what it still
    /// refuses, and returns the last refusal.
    fn retry_stranded(&mut self) -> Option<AclError> {
        if self.stranded.is_empty() {
            return None;
        }
        let driver = &self.driver;
        let (stranded_bytes, counters) = (&mut self.stranded_bytes, &mut self.ledger.counters);
        let mut refused = None;
        self.stranded.retain(|&s| {
            let result = match s {
                Stranded::Physical(raw, _) => driver.free(raw),
                Stranded::Reservation(start, len) => driver.release(start, len),
            };
            match (result, s) {
                (Err(e), _) => {
                    refused = Some(e);
                    return true;
                }
                (Ok(()), Stranded::Physical(_, size)) => {
                    *stranded_bytes -= size;
                    counters.physical_frees += 1;
                }
                (Ok(()), Stranded::Reservation(..)) => counters.releases += 1,
            }
            false
        });
        refused
    }
}

impl<D: Driver> Backend for DriverBackend<D> {
    fn name(&self) -> &'static str {
        self.driver.name()
    }

    fn page_size(&self, kind: PageKind) -> PageSize {
        self.pages[kind as usize]
    }

    fn reserve(&mut self, size: u64, align: u64, hint: Option<u64>) -> Result<u64> {
        let normal = self.pages[0].bytes();
        let align = align.max(normal);
        if size == 0 || !align.is_power_of_two() {
            return Err(AclError::invalid_param(format!(
                "cannot reserve {size} bytes aligned to {align}: the size must be above 0 and the alignment a power of two"
            )));
        }
        let size = checked_align_up(size, normal)
            .ok_or_else(|| AclError::invalid_param(format!("reservation size {size} is too large")))?;
        self.retry_stranded();
        if self.driver.holds_window() {
            let va = self.ledger.reserve(size, align, hint)?;
            self.reservations.insert(va, (va, 0));
            return Ok(va);
        }
        let (va, start, len) = self.reserve_aligned(size, align, hint)?;
        if let Err(e) = self.ledger.reserve(size, normal, Some(va)) {
            let _ = self.driver.release(start, len);
            return Err(AclError::internal(format!(
                "the runtime reserved {va:#x}+{} over a range npumem holds: {}",
                format_size(size),
                e.message
            )));
        }
        self.reservations.insert(va, (start, len));
        Ok(va)
    }

    fn release(&mut self, va: u64) -> Result<()> {
        // The books refuse a release with mappings (or of no reservation) before the runtime.
        self.ledger.space.check_release(va)?;
        let &(start, len) = self.reservations.get(&va).expect("the books and the runtime agree");
        let refused = if len > 0 { self.driver.release(start, len).err() } else { None };
        self.ledger.space.release(va)?;
        self.reservations.remove(&va);
        match refused {
            Some(e) => self.strand(Stranded::Reservation(start, len), &e),
            None => self.ledger.counters.releases += 1,
        }
        Ok(())
    }

    fn create_physical(&mut self, size: u64, kind: PageKind) -> Result<PhysHandle> {
        let page = self.page_size(kind);
        physical::check_size(size, page, kind)?;
        self.retry_stranded();
        self.ledger.check_capacity(self.driver.name(), self.capacity, self.stranded_bytes, size)?;
        let raw = self.driver.create(size, kind)?;
        Ok(self.ledger.insert(size, page, raw))
    }

    fn free_physical(&mut self, handle: PhysHandle) -> Result<()> {
        let p = self.ledger.allocs.live(handle)?;
        let raw = p.memory;
        if p.mapped() > 0 {
            // The runtime's free waits for the last unmap (`unmap`).
            self.ledger.allocs.free(handle)?;
            return Ok(());
        }
        let refused = self.driver.free(raw).err();
        if let Some(p) = self.ledger.allocs.free(handle)? {
            match refused {
                Some(e) => self.strand(Stranded::Physical(p.memory, p.size), &e),
                None => self.ledger.counters.physical_frees += 1,
            }
        }
        Ok(())
    }

    fn map(&mut self, va: u64, handle: PhysHandle) -> Result<()> {
        let driver = &self.driver;
        self.ledger.map(va, handle, |p| driver.map(va, p.size, p.memory))
    }

    fn unmap(&mut self, va: u64) -> Result<()> {
        let driver = &self.driver;
        let released = self.ledger.unmap(va, |mapping, _| driver.unmap(va, mapping.size))?;
        // The last mapping of an allocation freed while mapped: the runtime frees it here.
        if let Some(p) = released
            && let Err(e) = self.driver.free(p.memory)
        {
            // The books counted it freed; the runtime has not taken it back yet.
            self.ledger.counters.physical_frees -= 1;
            self.strand(Stranded::Physical(p.memory, p.size), &e);
        }
        Ok(())
    }

    fn read(&mut self, va: u64, out: &mut [u8]) -> Result<()> {
        let driver = &self.driver;
        self.ledger.read(va, out.len() as u64, || if out.is_empty() { Ok(()) } else { driver.read(va, out) })
    }

    fn write(&mut self, va: u64, data: &[u8]) -> Result<()> {
        let driver = &self.driver;
        self.ledger.write(va, data.len() as u64, || if data.is_empty() { Ok(()) } else { driver.write(va, data) })
    }

    fn fill(&mut self, va: u64, value: u8, count: u64) -> Result<()> {
        let driver = &self.driver;
        self.ledger.write(va, count, || if count == 0 { Ok(()) } else { driver.fill(va, value, count) })
    }

    fn copy(&mut self, dst: u64, src: u64, count: u64) -> Result<()> {
        let driver = &self.driver;
        self.ledger.copy(dst, src, count, || {
            if count == 0 || dst == src {
                Ok(())
            } else if dst.abs_diff(src) >= count {
                driver.copy(dst, src, count)
            } else {
                // Overlap: through host memory, back to front when the destination is above
                // the source (so no byte is overwritten before it is read).
                let mut buf = vec![0u8; count.min(BOUNCE) as usize];
                let pieces = count.div_ceil(BOUNCE);
                for i in 0..pieces {
                    let i = if dst > src { pieces - 1 - i } else { i };
                    let off = i * BOUNCE;
                    let piece = &mut buf[..(count - off).min(BOUNCE) as usize];
                    driver.read(src + off, piece)?;
                    driver.write(dst + off, piece)?;
                }
                Ok(())
            }
        })
    }

    fn mem_info(&self, scope: MemScope) -> (u64, u64) {
        if scope == MemScope::Ddr {
            return (0, 0);
        }
        let budget = self.ledger.unused(self.capacity, self.stranded_bytes);
        match self.driver.mem_info(scope) {
            Ok((free, total)) => (free.min(budget), total.min(self.capacity)),
            Err(_) => (budget, self.capacity),
        }
    }

    fn translate(&self, va: u64) -> Result<Translation> {
        self.ledger.translate_by_handle(va)
    }

    fn mapping_containing(&self, va: u64) -> Option<(u64, PhysHandle, u64)> {
        self.ledger.mapping_containing(va)
    }

    fn owns(&self, va: u64) -> bool {
        let (lo, hi) = self.driver.window();
        (self.driver.owns_window() && (lo..hi).contains(&va)) || self.ledger.space.reserved(va)
    }

    fn holds(&self, va: u64) -> bool {
        if self.driver.holds_window() {
            let (lo, hi) = self.driver.window();
            return (lo..hi).contains(&va);
        }
        self.ledger.space.reserved(va)
    }

    fn counters(&self) -> BackendCounters {
        self.ledger.counters
    }

    fn streams(&mut self) -> &mut dyn RuntimeStreams {
        self
    }

    fn stranded(&self) -> (u64, u64) {
        (self.stranded.len() as u64, self.stranded_bytes)
    }

    fn reclaim_stranded(&mut self) -> Result<()> {
        let Some(e) = self.retry_stranded() else { return Ok(()) };
        let (count, bytes) = self.stranded();
        Err(AclError::new(
            ErrorCode::RtMemoryFree,
            format!(
                "the {} runtime still refuses to take back {count} object(s) npumem freed ({} of physical memory \
                 among them); the last refusal: {}",
                self.name(),
                format_size(bytes),
                e.message
            ),
        ))
    }

    fn take_warnings(&mut self) -> Vec<String> {
        std::mem::take(&mut self.warnings)
    }

    fn malloc_host(&mut self, size: u64) -> Option<Result<u64>> {
        Some(self.driver.malloc_host(size).and_then(|addr| {
            // (Freeing it would free the live block at that address, or NULL.)
            if addr == 0 || self.host_blocks.contains(&addr) {
                return Err(AclError::internal(format!(
                    "the {} runtime returned {addr:#x} for a host allocation, which is NULL or already handed out",
                    self.name()
                )));
            }
            self.host_blocks.insert(addr);
            Ok(addr)
        }))
    }

    fn free_host(&mut self, addr: u64) -> Result<()> {
        if !self.host_blocks.contains(&addr) {
            return Err(AclError::bad_free(format!(
                "host address {addr:#x} is not a block the {} runtime's malloc_host returned to this device",
                self.name()
            )));
        }
        self.driver.free_host(addr)?;
        self.host_blocks.remove(&addr);
        Ok(())
    }
}

impl<D: Driver> Drop for DriverBackend<D> {
    fn drop(&mut self) {
        // Best effort: a runtime that fails here has nothing better to be told. Queued work
        // finishes before its streams, events and memory go.
        let _ = self.driver.synchronize_device();
        for &event in self.events.iter().chain(&self.spare_events) {
            let _ = self.driver.destroy_event(event);
        }
        for &stream in &self.streams {
            let _ = self.driver.destroy_stream(stream);
        }
        for &block in &self.host_blocks {
            let _ = self.driver.free_host(block);
        }
        for (va, mapping) in self.ledger.space.mappings() {
            let _ = self.driver.unmap(va, mapping.size);
        }
        // (Those freed while mapped were left to their last unmap, just made.)
        for (_, p) in self.ledger.allocs.iter() {
            let _ = self.driver.free(p.memory);
        }
        self.retry_stranded();
        for &(start, len) in self.reservations.values().filter(|(_, len)| *len > 0) {
            let _ = self.driver.release(start, len);
        }
    }
}
