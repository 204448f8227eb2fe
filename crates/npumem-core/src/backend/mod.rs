//! The `Backend` trait: the driver's virtual-memory-management API, the one seam between npumem's
//! allocators and real or simulated memory.
//!
//! It mirrors AscendCL's VMM calls (`aclrtReserveMemAddress`, `aclrtMallocPhysical`,
//! `aclrtMapMem`, `aclrtUnmapMem`, `aclrtFreePhysical`, `aclrtReleaseMemAddress`) plus byte access
//! at device addresses and memory information, so that four backends slot in behind the same
//! allocators: the simulator (`sim`), real host memory (`host`), and AscendCL (`acl`) and the CUDA
//! driver (`cuda`) loaded at run time (`driver` holds what those two share, `ffi` the loading).
//! What the backends keep the same way lives beside the trait: the address space and its
//! mappings ([`address_map::AddressMap`]), the physical allocations with their deferred frees
//! ([`physical::PhysicalBooks`]), and the two with the counters as one [`ledger::Ledger`].
//!
//! Contract every backend keeps: a physical allocation is mapped whole (size equal to its size,
//! offset 0) at a VA aligned to its page size inside a live reservation; a reservation is
//! released only when nothing is mapped in it; freeing a still-mapped physical allocation defers
//! the release of its memory until its last unmap (the runtime's free is called only then:
//! AscendCL requires a handle unmapped before `aclrtFreePhysical`); byte access
//! touches only mapped addresses and fails, never crashes, elsewhere.

pub mod acl;
pub mod address_map;
pub mod cuda;
pub mod current;
pub mod driver;
pub mod faulty;
pub mod ffi;
pub mod host;
pub mod ledger;
pub mod physical;
pub mod sim;

pub use acl::{AclBackend, AclDriver, AclRuntime};
pub use cuda::{CudaBackend, CudaDriver, CudaRuntime};
pub use driver::{Driver, DriverBackend};
pub use faulty::{FaultCounts, FaultInjector, FaultPlan, FaultyBackend};
pub use host::{HostBackend, HostConfig};
pub use sim::{SimBackend, SimConfig};

use crate::acl::MemScope;
use crate::error::Result;
use crate::stream::{NoRuntime, RuntimeStreams};
use crate::vm::{FrameStats, PageKind, PageSize, PageTableStats, Translation};

/// An opaque physical-allocation handle (`aclrtDrvMemHandle`).
pub type PhysHandle = u64;

/// How often each driver-level operation ran: the cost a caching allocator exists to avoid.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BackendCounters {
    pub reserves: u64,
    pub releases: u64,
    pub physical_allocs: u64,
    pub physical_frees: u64,
    pub maps: u64,
    pub unmaps: u64,
    /// Page-table entries written by maps (a 64 KiB page counts once).
    pub pages_mapped: u64,
    pub pages_unmapped: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
    /// Physical frees and reservation releases the runtime refused (each kept and retried; see
    /// `Backend::stranded`).
    pub refused_frees: u64,
}

pub trait Backend: Send {
    /// A short name ("sim", "host", "acl", "cuda").
    fn name(&self) -> &'static str;

    /// The page size physical allocations of `kind` use (the allocation granularity).
    fn page_size(&self, kind: PageKind) -> PageSize;

    /// Reserves `size` bytes of device VA aligned to `align`, at `hint` if given.
    fn reserve(&mut self, size: u64, align: u64, hint: Option<u64>) -> Result<u64>;

    /// Releases the reservation that starts at `va`; nothing may be mapped in it.
    fn release(&mut self, va: u64) -> Result<()>;

    /// Allocates `size` bytes (a multiple of the page size of `kind`) of physical memory.
    fn create_physical(&mut self, size: u64, kind: PageKind) -> Result<PhysHandle>;

    /// Frees a physical allocation; if it is mapped, its memory goes back at its last unmap.
    fn free_physical(&mut self, handle: PhysHandle) -> Result<()>;

    /// Maps the whole of `handle` at `va`.
    fn map(&mut self, va: u64, handle: PhysHandle) -> Result<()>;

    /// Unmaps the mapping that starts at `va`.
    fn unmap(&mut self, va: u64) -> Result<()>;

    /// Reads `out.len()` bytes at device address `va`.
    fn read(&mut self, va: u64, out: &mut [u8]) -> Result<()>;

    /// Writes `data` at device address `va`.
    fn write(&mut self, va: u64, data: &[u8]) -> Result<()>;

    /// Sets `count` bytes at `va` to `value`.
    fn fill(&mut self, va: u64, value: u8, count: u64) -> Result<()>;

    /// Copies `count` bytes from `src` to `dst`, both device addresses; overlap is allowed.
    fn copy(&mut self, dst: u64, src: u64, count: u64) -> Result<()>;

    /// (free, total) bytes of the memory `scope` names.
    fn mem_info(&self, scope: MemScope) -> (u64, u64);

    /// Where `va` is mapped.
    fn translate(&self, va: u64) -> Result<Translation>;

    /// The mapping holding `va`, as (its start, its physical allocation, its size).
    fn mapping_containing(&self, va: u64) -> Option<(u64, PhysHandle, u64)>;

    /// The backend's address window `[start, end)`: every reservation lies in it.
    fn window(&self) -> (u64, u64) {
        (crate::vm::VA_WINDOW_START, crate::vm::VA_WINDOW_END)
    }

    /// Whether `va` is device memory of this backend (inside its address window): what the
    /// device checks an address against before treating it as host memory.
    fn owns(&self, va: u64) -> bool {
        let (start, end) = self.window();
        (start..end).contains(&va)
    }

    /// Whether `va` is this backend's own, never another backend's of the same runtime: `owns`,
    /// narrowed to its reservations where devices of one runtime share a window (AscendCL's).
    fn holds(&self, va: u64) -> bool {
        self.owns(va)
    }

    fn counters(&self) -> BackendCounters;

    /// Physical allocations and frees (refused ones too), maps and unmaps so far: the calls the
    /// host clock is charged for (cheaper to poll than `counters`).
    fn driver_calls(&self) -> u64 {
        let c = self.counters();
        c.physical_allocs + c.physical_frees + c.maps + c.unmaps + c.refused_frees
    }

    /// Buddy-allocator state, where the backend can see physical memory.
    fn frame_stats(&self) -> Option<FrameStats> {
        None
    }

    /// Page-table state, where the backend keeps a page table.
    fn page_table_stats(&self) -> Option<PageTableStats> {
        None
    }

    /// Whether this backend's device addresses are this process's own memory, which a program
    /// may read and write directly (the host backend); the simulator's are not.
    fn host_accessible(&self) -> bool {
        false
    }

    /// The backend's own streams and events (the stream half of the seam). Backends without a
    /// runtime queue (the simulator, host memory) have `NoRuntime`: the simulated clock decides.
    fn streams(&mut self) -> &mut dyn RuntimeStreams {
        // `NoRuntime` is a zero-sized type: leaking one allocates nothing.
        Box::leak(Box::new(NoRuntime))
    }

    /// What the runtime refused to take back (a physical free or a release) and the backend
    /// keeps to ask again: (objects, bytes of physical memory among them). Backends without a
    /// runtime never refuse.
    fn stranded(&self) -> (u64, u64) {
        (0, 0)
    }

    /// Asks the runtime again for what it refused; an `ACL_ERROR_RT_MEMORY_FREE` (207002)
    /// naming what it still refuses, if anything.
    fn reclaim_stranded(&mut self) -> Result<()> {
        Ok(())
    }

    /// The warnings recorded since the last call (a free the runtime refused), oldest first.
    fn take_warnings(&mut self) -> Vec<String> {
        Vec::new()
    }

    /// `size` bytes of the runtime's page-locked host memory (`aclrtMallocHost`,
    /// `cuMemAllocHost`), where the backend has a runtime; `None` where it has not (the
    /// simulator, host memory), and npumem's own host memory serves `malloc_host`.
    fn malloc_host(&mut self, _size: u64) -> Option<Result<u64>> {
        None
    }

    /// Frees a block `malloc_host` returned.
    fn free_host(&mut self, addr: u64) -> Result<()> {
        Err(crate::error::AclError::bad_free(format!(
            "host address {addr:#x}: the {} backend hands out no runtime host memory",
            self.name()
        )))
    }
}
