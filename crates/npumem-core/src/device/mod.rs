//! `Device`: AscendCL memory semantics over an allocator and a backend.
//!
//! One `malloc`: check the size and policy → book `ALIGN_UP(size, 32) (+ 32)` bytes → the
//! allocator reserves VA, creates physical memory and maps it through the backend → the live table
//! records the allocation. One `memcpy`: check `count <= dst_max` → classify each address as
//! device (inside a live allocation) or host (inside a live `malloc_host` block) → check both
//! ranges fit → move the bytes (device bytes through the page table).
//!
//! The runtime rules and the allocation table live here; byte access (copies, memsets,
//! classification of addresses) is in `access.rs`; streams, events, stream-ordered frees and
//! the sanitizer's hooks are in `ordered.rs`.
//!
//! Invariants: `live` holds exactly the allocations the allocator has granted and not freed; no
//! byte outside a live allocation's requested size or a live host block is ever read or written;
//! every failed call leaves the device as it was. The device keeps the one record of each block
//! live in the allocator: those blocks are exactly `live`'s allocations, the pending frees' and
//! (inside a replay call) the replay's held ones, and every free and snapshot hands the
//! allocator their [`Granted`] facts: `granted` and `page` as granted, `requested` the size of
//! the malloc that made the block — the allocation's `size`, or for a block revived at another
//! size its entry in `pool_requested`, kept until its memory is back with the allocator.

mod access;
mod batch;
mod config;
mod freed;
mod id_table;
mod live;
mod ordered;
mod pending;
mod pinning;
mod pins;
mod replay;
mod runtime;
mod trace;
mod vmm;

pub use config::{AllocatorKind, BackendKind, DeviceConfig, ReusePolicy};
use freed::FreedRing;
use live::LiveTable;
use pending::{BlockUses, PendingFrees};
use pins::Pins;
pub use replay::{Replay, ReplayEvents, ReplayOutcome, ReplaySample};
use runtime::RuntimeHandles;
use trace::Recording;

use rustc_hash::FxHashMap;
use std::collections::BTreeMap;

use crate::acl::{MemAttr, MemcpyKind, Policy};
use crate::backend::{
    AclBackend, Backend, BackendCounters, CudaBackend, FaultCounts, FaultInjector, FaultPlan, FaultyBackend,
    HostBackend, HostConfig, SimBackend, SimConfig,
};
use crate::error::{AclError, ErrorCode, Result};
use crate::host::HostHeap;
use crate::policy::{HUGE_FIRST_NORMAL_LIMIT, START_ALIGN, booked_size};
use crate::pool::{
    Action, Allocator, CachingAllocator, CachingConfig, DirectAllocator, Family, Fragmentation, Granted, History,
    PoolStats, Request, SegmentSnapshot, Tally, TraceEntry, VmmAllocator, VmmConfig,
};
use crate::sanitizer::{Finding, FindingKind, HOST, Sanitizer, SanitizerMode, Touch};
use crate::stream::{Clock, CostModel, DEFAULT_STREAM, Effect, EventId, Scheduler, StreamId};
use crate::units::format_size;
use crate::vm::{FrameStats, PageSize, PageTableStats, Translation};

/// One live device allocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Allocation {
    pub ptr: u64,
    /// Bytes the caller asked for; the accessible range.
    pub size: u64,
    /// Bytes the runtime booked (aligned to 32, padded by 32 for `malloc`).
    pub booked: u64,
    /// Bytes the allocator set aside (page-rounded for the direct allocator).
    pub granted: u64,
    pub policy: Policy,
    pub page: PageSize,
    /// The stream the block was allocated for (its work is ordered before the free).
    pub stream: StreamId,
}

/// Counters of the runtime layer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeviceStats {
    pub mallocs: u64,
    pub frees: u64,
    /// Mallocs that failed for lack of memory (invalid requests are not counted).
    pub failed_mallocs: u64,
    /// HUGE_FIRST requests above 1 MiB that got normal pages because no 2 MiB frame was free.
    pub huge_fallbacks: u64,
    /// Copies whose `kind` disagreed with the direction the addresses imply (advisory, as in CANN).
    pub kind_mismatches: u64,
    /// Async effects dropped because their memory was freed before they completed.
    pub lost_effects: u64,
    /// Frees whose memory went back to the allocator only once the streams using it completed.
    pub deferred_frees: u64,
    /// Frees still waiting for their streams.
    pub pending_frees: u64,
    /// Mallocs that hit out-of-memory, synchronised the device to reclaim pending frees, and
    /// retried (PyTorch's `num_sync_all_streams`).
    pub sync_reclaims: u64,
    /// Mallocs served by a block freed on the same stream whose old work is still queued.
    pub same_stream_reuses: u64,
    /// Mallocs served by a pending block of another stream that the malloc's stream follows
    /// through events.
    pub event_dependency_reuses: u64,
    /// Mallocs that took a pending block by making their stream wait for its free.
    pub internal_dependency_reuses: u64,
    pub live_count: u64,
    pub live_requested: u64,
    pub live_granted: u64,
    pub peak_granted: u64,
}

impl DeviceStats {
    /// Counts mallocs of `t.blocks` allocations (`t.requested` bytes asked for, `t.bytes`
    /// granted).
    #[inline]
    fn on_mallocs(&mut self, t: Tally) {
        self.mallocs += t.blocks;
        self.live_count += t.blocks;
        self.live_requested += t.requested;
        self.live_granted += t.bytes;
        self.peak_granted = self.peak_granted.max(self.live_granted);
    }

    /// Counts frees of `t.blocks` allocations.
    #[inline]
    fn on_frees(&mut self, t: Tally) {
        self.frees += t.blocks;
        self.live_count -= t.blocks;
        self.live_requested -= t.requested;
        self.live_granted -= t.bytes;
    }
}

/// Where an address lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Side {
    Device,
    Host,
}

/// The device's driver calls already charged to the host clock.
#[derive(Debug, Default)]
struct DriverCharge {
    /// The backend's counters at the last charge.
    counters: BackendCounters,
    /// Their total driver calls.
    calls: u64,
}

pub struct Device {
    backend: Box<dyn Backend>,
    allocator: Box<dyn Allocator>,
    /// The countdowns of the [`FaultyBackend`] wrapping `backend`, when one does.
    fault_injector: Option<FaultInjector>,
    /// Blocks revived (stream-ordered reuse) at a size other than their pool's request: that
    /// request, by pointer, until the block's memory goes back to the allocator.
    pool_requested: FxHashMap<u64, u64>,
    live: LiveTable,
    /// `free_many`'s list of the allocations it took out, kept between calls (a batch of a
    /// million blocks would otherwise fault in fresh pages for it every time); its capacity
    /// stays at the largest batch's, 56 bytes a block.
    free_scratch: Vec<Allocation>,
    /// `free_blocks`' run of blocks (at most `FREE_RUN`).
    free_run: Vec<Granted>,
    recently_freed: FreedRing,
    host: HostHeap,
    stats: DeviceStats,
    recording: Recording,
    sched: Scheduler,
    uses: BlockUses,
    pending: PendingFrees,
    sanitizer: Sanitizer,
    reuse: ReusePolicy,
    charge: DriverCharge,
    /// Allocation-site tags of live allocations (for sanitizer and leak reports).
    tags: FxHashMap<u64, String>,
    /// Live allocations held by direct views of their memory (host backend) or by an owning
    /// object (`Device.buffer`), by start: how many. A pinned allocation cannot be freed.
    pins: Pins,
    /// The program's own reservations, physical allocations and mappings (the VMM calls).
    user_vmm: vmm::UserVmm,
    rt: RuntimeHandles,
}

impl Device {
    /// The allocator's segments and blocks, for `memory_snapshot`.
    pub fn segments(&self) -> Vec<SegmentSnapshot> {
        self.allocator.segments(&self.pool_blocks())
    }

    /// The blocks live in the allocator, in address order, as it granted them: the live
    /// allocations and the pending frees (a replay's held blocks are published before any
    /// caller can ask).
    fn pool_blocks(&self) -> Vec<Granted> {
        let live = self.live.sorted();
        let pending = self.pending.frees.values().map(|p| &p.allocation);
        let mut blocks: Vec<Granted> = live.iter().chain(pending).map(|a| self.granted_of(a)).collect();
        if !self.pending.frees.is_empty() {
            blocks.sort_unstable_by_key(|b| b.ptr);
        }
        blocks
    }

    /// What the allocator granted for `a` (see the module's invariants).
    #[inline(always)]
    pub(super) fn granted_of(&self, a: &Allocation) -> Granted {
        let requested = if self.pool_requested.is_empty() {
            a.size
        } else {
            self.pool_requested.get(&a.ptr).copied().unwrap_or(a.size)
        };
        Granted { ptr: a.ptr, granted: a.granted, requested, page: a.page }
    }

    /// Whether `addr` is this device's memory and no other device's (of the same runtime too).
    pub fn holds(&self, addr: u64) -> bool {
        self.backend.holds(addr)
    }

    /// The address window this device's allocations and reservations come from, `[start, end)`.
    pub fn va_window(&self) -> (u64, u64) {
        self.backend.window()
    }

    pub fn backend_name(&self) -> &'static str {
        self.backend.name()
    }

    pub fn allocator_name(&self) -> &'static str {
        self.allocator.name()
    }

    /// `aclrtMalloc`: books `ALIGN_UP(size, 32) + 32` bytes (no pad under HUGE1G).
    pub fn malloc(&mut self, size: u64, policy: Policy) -> Result<u64> {
        self.malloc_on(size, policy, true, DEFAULT_STREAM)
    }

    /// `aclrtMallocAlign32`: books `ALIGN_UP(size, 32)` bytes.
    pub fn malloc_align32(&mut self, size: u64, policy: Policy) -> Result<u64> {
        self.malloc_on(size, policy, false, DEFAULT_STREAM)
    }

    /// A malloc for `stream`: the block's later free is ordered after the stream's work;
    /// `padded` picks `aclrtMalloc`'s booking over `aclrtMallocAlign32`'s.
    pub fn malloc_on(&mut self, size: u64, policy: Policy, padded: bool, stream: StreamId) -> Result<u64> {
        if stream != DEFAULT_STREAM {
            // The default stream always exists (it cannot be destroyed).
            self.sched.tail_ns(stream)?;
        }
        self.settle();
        let result = self.malloc_settled(size, policy, padded, stream);
        self.charge_driver();
        result
    }

    /// `malloc_on` after the stream is checked and completed work is settled (a batch does
    /// both once); the caller charges the driver calls.
    #[inline]
    fn malloc_settled(&mut self, size: u64, policy: Policy, padded: bool, stream: StreamId) -> Result<u64> {
        if !self.pending.frees.is_empty() {
            if let Some(ptr) = self.reuse_on_stream(size, policy, padded, stream)? {
                return Ok(ptr);
            }
        }
        let mut granted = self.allocate(size, policy, padded);
        if granted.as_ref().is_err_and(|e| e.code.is_out_of_memory()) && !self.pending.frees.is_empty() {
            if self.reuse.allow_internal_dependencies {
                if let Some(ptr) = self.reuse_with_dependency(size, policy, padded, stream)? {
                    return Ok(ptr);
                }
            }
            // Memory is held by frees waiting for their streams: wait for them and retry.
            self.stats.sync_reclaims += 1;
            self.synchronize_device()?;
            granted = self.allocate(size, policy, padded);
        }
        self.finish_malloc(granted, size, policy, stream)
    }

    /// Charges the host clock for the driver calls made since the last charge: physical
    /// allocations and frees, maps and unmaps (the cost a caching pool saves).
    pub(super) fn charge_driver(&mut self) {
        let calls = self.backend.driver_calls();
        if calls == self.charge.calls {
            return;
        }
        self.charge.calls = calls;
        let now = self.backend.counters();
        let before = std::mem::replace(&mut self.charge.counters, now);
        let allocs = (now.physical_allocs - before.physical_allocs) + (now.physical_frees - before.physical_frees);
        let maps = (now.maps - before.maps) + (now.unmaps - before.unmaps);
        let cost = &self.sched.cost;
        let ns = allocs as f64 * cost.driver_alloc_ns + maps as f64 * cost.map_ns;
        self.sched.advance(ns as u64);
    }

    fn allocate(&mut self, size: u64, policy: Policy, padded: bool) -> Result<(u64, crate::pool::Grant)> {
        booked_size(size, policy, padded).and_then(|booked| {
            let request = Request { size, booked, policy };
            self.allocator.malloc(self.backend.as_mut(), &request).map(|g| (booked, g))
        })
    }

    /// Records a granted malloc as live (inlined into its callers: a replay's short runs go
    /// through here one block at a time), or turns a failed one into its error.
    #[inline(always)]
    fn finish_malloc(
        &mut self,
        granted: Result<(u64, crate::pool::Grant)>,
        size: u64,
        policy: Policy,
        stream: StreamId,
    ) -> Result<u64> {
        match granted {
            Ok((booked, grant)) => {
                let allocation = self.allocation_of(grant, size, booked, policy, stream);
                self.record_live(allocation);
                Ok(grant.ptr)
            }
            Err(e) => Err(self.failed_malloc(e, size, policy, stream)),
        }
    }

    /// The error of a failed malloc (an out-of-memory one counted and traced).
    #[cold]
    fn failed_malloc(&mut self, e: AclError, size: u64, policy: Policy, stream: StreamId) -> AclError {
        if e.code.is_out_of_memory() {
            self.stats.failed_mallocs += 1;
            let free = self.backend.mem_info(crate::acl::MemScope::All).0;
            self.trace(Action::Oom, free, size, stream);
        }
        self.malloc_error(e, size, policy)
    }

    /// The allocation a grant makes (counting HUGE_FIRST's fallbacks to normal pages).
    #[inline]
    fn allocation_of(
        &mut self,
        grant: crate::pool::Grant,
        size: u64,
        booked: u64,
        policy: Policy,
        stream: StreamId,
    ) -> Allocation {
        // Caching families size blocks by their own rules (torch_npu pads, PyTorch does not), so
        // the grant covers the request, not necessarily aclrtMalloc's booking.
        debug_assert!(grant.ptr % START_ALIGN == 0 && grant.granted >= size);
        debug_assert!(crate::policy::honours(policy, grant.page), "{policy:?} on {:?} pages", grant.page);
        if policy.base() == Policy::HugeFirst
            && size > HUGE_FIRST_NORMAL_LIMIT
            && grant.page.bytes() < PageSize::Size2M.bytes()
        {
            self.stats.huge_fallbacks += 1;
        }
        Allocation { ptr: grant.ptr, size, booked, granted: grant.granted, policy, page: grant.page, stream }
    }

    #[inline(always)]
    fn record_live(&mut self, allocation: Allocation) {
        self.live.insert(allocation);
        self.note_malloc(&allocation);
    }

    /// What a malloc records beside the live table: its trace entry and the counters (a
    /// replay's unpublished blocks get only this until they are published).
    #[inline(always)]
    fn note_malloc(&mut self, allocation: &Allocation) {
        self.trace(Action::Alloc, allocation.ptr, allocation.granted, allocation.stream);
        self.stats.on_mallocs(Tally { blocks: 1, bytes: allocation.granted, requested: allocation.size });
    }

    fn malloc_error(&self, e: AclError, size: u64, policy: Policy) -> AclError {
        if !e.code.is_out_of_memory() {
            return e;
        }
        let (free, total) = self.backend.mem_info(crate::acl::MemScope::All);
        let hint = match policy.base() {
            Policy::HugeOnly => {
                " HUGE_ONLY needs free 2 MiB frames: use HUGE_FIRST to accept normal pages, \
                                 or free memory to let huge frames re-form."
            }
            Policy::Huge1gOnly => " HUGE1G_ONLY needs giant frames set aside (giant_frames) or use HUGE_FIRST.",
            _ => " Free memory you no longer need or use a larger device.",
        };
        // The allocator's own state explains many failures: every OOM says what it holds. (The
        // summary counts segments and free memory, which do not depend on the live blocks: the
        // allocator is not given them.)
        let summary = self.allocator.fragmentation(&[]).summary();
        let pool = format!("; {} allocator: {summary}", self.allocator.name());
        AclError::oom(format!(
            "malloc({}, {}) failed: {} (device: {} free of {}{pool}).{hint}",
            format_size(size),
            policy.name(),
            e.message,
            format_size(free),
            format_size(total),
        ))
    }

    /// `aclrtFree`: the pointer is dead at once; its memory goes back to the allocator when the
    /// work queued on its stream (and on every stream recorded with `record_stream`) has
    /// completed, so no queued operation can see it reused.
    pub fn free(&mut self, ptr: u64) -> Result<()> {
        self.free_on(ptr, None)
    }

    fn bad_pointer(&mut self, ptr: u64) -> AclError {
        if let Some(a) = self.containing(ptr) {
            return AclError::bad_free(format!(
                "{ptr:#x} points {} bytes into the allocation at {:#x}; free the pointer malloc returned",
                ptr - a.ptr,
                a.ptr
            ));
        }
        if self.recently_freed.contains(&ptr) {
            return AclError::bad_free(format!("double free: {ptr:#x} was already freed"));
        }
        AclError::bad_free(format!("{ptr:#x} is not a live device allocation; it never came from malloc"))
    }

    fn containing(&mut self, addr: u64) -> Option<Allocation> {
        self.live.containing(addr, |a| a.granted)
    }

    /// The live allocation that starts at `ptr`.
    pub fn allocation(&self, ptr: u64) -> Option<Allocation> {
        self.live.get(ptr)
    }

    /// All live allocations in address order.
    pub fn allocations(&self) -> Vec<Allocation> {
        self.live.sorted()
    }

    /// `aclrtMallocHost`: the runtime's page-locked host memory on a backend with a runtime
    /// (`aclrtMallocHost`, `cuMemAllocHost`), else npumem's own host memory; zeroed, 64-byte
    /// aligned.
    pub fn malloc_host(&mut self, size: u64) -> Result<u64> {
        self.host.alloc(size, self.backend.as_mut())
    }

    /// `aclrtFreeHost`. It does not wait: freeing a block that queued async copies still use is
    /// a use-after-free hazard (reported; those copies are lost). On a runtime with a queue the
    /// runtime's queued copies finish first (they would touch the freed memory).
    pub fn free_host(&mut self, ptr: u64) -> Result<()> {
        if ptr == 0 {
            return Err(AclError::invalid_param("free_host(NULL): pass a pointer returned by malloc_host"));
        }
        self.settle();
        if self.host.block_start(ptr) == Some(ptr) && self.sanitizer.tracks(ptr) {
            let clock = self.sched.host_clock().clone();
            self.sanitizer.check_free(ptr, 0, HOST, &clock, &[], None)?;
        }
        if let Some(size) = self.host.block_size(ptr) {
            self.rt_synchronize_device()?;
            // The copies and fills still queued on the block are lost with it, now: landing
            // later, they would write (or read) memory that is gone or is the next malloc_host
            // block at the same address.
            self.settle();
            self.stats.lost_effects += self.sched.drop_effects_touching(ptr, ptr.saturating_add(size));
        }
        self.host.free(ptr, self.backend.as_mut())?;
        self.sanitizer.forget(ptr);
        Ok(())
    }

    /// `aclrtGetMemInfo`: (free, total) bytes of the memory `attr` names.
    pub fn mem_info(&self, attr: MemAttr) -> (u64, u64) {
        self.backend.mem_info(attr.scope())
    }

    /// Where a device VA is mapped.
    pub fn translate(&self, va: u64) -> Result<Translation> {
        if !self.backend.owns(va) {
            return Err(AclError::rt_param(format!("{va:#x} is not a device address")));
        }
        self.backend.translate(va)
    }

    /// The page-table walk of a device VA: its translation and the descriptors the walk read.
    /// Only a backend that keeps a page table walks one (the simulator); elsewhere the OS or the
    /// driver maps the pages, and a depth would be made up, so the walk is refused.
    pub fn walk(&self, va: u64) -> Result<Translation> {
        if self.backend.page_table_stats().is_none() {
            return Err(self.unsupported(
                "page-table walk (its pages are mapped by the OS or driver; translate() gives the mapping)",
            ));
        }
        self.translate(va)
    }

    pub fn frame_stats(&self) -> Result<FrameStats> {
        self.backend.frame_stats().ok_or_else(|| self.unsupported("frame statistics"))
    }

    pub fn page_table_stats(&self) -> Result<PageTableStats> {
        self.backend.page_table_stats().ok_or_else(|| self.unsupported("page-table statistics"))
    }

    fn unsupported(&self, what: &str) -> AclError {
        AclError::new(ErrorCode::FeatureUnsupported, format!("the {} backend has no {what}", self.backend.name()))
    }

    /// The device whose `inject_faults` and `faults` arm and read `injector`, the handle of the
    /// [`FaultyBackend`] its backend is wrapped in.
    pub fn with_fault_injector(mut self, injector: FaultInjector) -> Self {
        self.fault_injector = Some(injector);
        self
    }

    /// Arms driver failures (the device must have been made with `faults`).
    pub fn inject_faults(&mut self, plan: FaultPlan) -> Result<()> {
        self.fault_injector()?.arm(plan)
    }

    /// The driver failures injected so far and those still armed.
    pub fn faults(&mut self) -> Result<(FaultCounts, FaultPlan)> {
        let f = self.fault_injector()?;
        Ok((f.injected(), f.plan()))
    }

    fn fault_injector(&self) -> Result<&FaultInjector> {
        self.fault_injector.as_ref().ok_or_else(|| {
            AclError::new(
                ErrorCode::FeatureUnsupported,
                format!("this {} device injects no faults; create it with faults=True", self.backend.name()),
            )
        })
    }

    pub fn backend_counters(&self) -> BackendCounters {
        self.backend.counters()
    }

    pub fn stats(&self) -> DeviceStats {
        self.stats
    }

    /// Live `malloc_host` bytes and blocks.
    pub fn host_usage(&self) -> (u64, usize) {
        (self.host.live_bytes(), self.host.live_count())
    }

    /// Returns cached memory to the backend (nothing to do for the direct allocator), and asks
    /// the runtime again for what it refused to take back before: what it still refuses is the
    /// error (207002), after the cache was emptied.
    pub fn empty_cache(&mut self) -> Result<()> {
        self.settle();
        let result = self.allocator.empty_cache(self.backend.as_mut());
        let reclaimed = self.backend.reclaim_stranded();
        self.flush_events(DEFAULT_STREAM);
        self.charge_driver();
        result.and(reclaimed)
    }

    /// What the runtime refused to take back and the backend keeps to ask again: (objects,
    /// bytes of physical memory among them).
    pub fn stranded(&self) -> (u64, u64) {
        self.backend.stranded()
    }

    /// The backend's warnings since the last call (a free the runtime refused), oldest first.
    pub fn take_warnings(&mut self) -> Vec<String> {
        self.backend.take_warnings()
    }

    /// Returns the coldest cached memory to the device until at most `bytes` are reserved.
    pub fn trim_to(&mut self, bytes: u64) -> Result<u64> {
        let result = self.allocator.trim_to(self.backend.as_mut(), bytes);
        self.flush_events(DEFAULT_STREAM);
        self.charge_driver();
        result
    }

    /// Caps the allocator's reservations at `fraction` of the device.
    pub fn set_memory_fraction(&mut self, fraction: f64) -> Result<()> {
        self.allocator.books_mut().set_memory_fraction(fraction)
    }

    /// The allocator's statistics (PyTorch's `memory_stats` scheme).
    pub fn pool_stats(&self) -> &PoolStats {
        &self.allocator.books().stats
    }

    pub fn reset_peak_stats(&mut self) {
        self.allocator.books_mut().reset_peak_stats();
    }

    /// Where the allocator's memory goes: waste, cached memory, free extents, per segment.
    pub fn fragmentation(&self) -> Fragmentation {
        self.allocator.fragmentation(&self.pool_blocks())
    }
}
