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
//! every failed call leaves the device as it was. With `owner_tracked` (the allocator agreed to
//! let the device keep its blocks' records: the npumem pool), the blocks live in the allocator
//! are exactly `live`'s allocations, the pending frees' and (inside a replay call) the replay's
//! held ones, and every free and snapshot hands the allocator their [`Granted`] facts:
//! `granted` and `page` as granted, `requested` the size of the malloc that made the block —
//! the allocation's `size`, or for a block revived at another size its entry in
//! `pool_requested`, kept until its memory is back with the allocator.

mod access;
mod batch;
mod id_table;
mod live;
mod ordered;
mod pins;
mod runtime;
mod vmm;

pub use batch::{Replay, ReplayEvents, ReplayOutcome, ReplaySample};
use live::LiveTable;
use pins::Pins;

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

/// Which allocator family a device uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AllocatorKind {
    /// npumem's VMM pool (the default).
    Npumem,
    /// No cache: every malloc maps fresh frames, every free unmaps them.
    Direct,
    /// PyTorch's caching allocator rules.
    PyTorch,
    /// torch_npu's caching allocator rules.
    TorchNpu,
}

impl AllocatorKind {
    pub const NAMES: &'static str = "\"npumem\", \"direct\", \"pytorch\", \"torch_npu\"";

    pub fn parse(name: &str) -> Result<Self> {
        match name {
            "npumem" => Ok(AllocatorKind::Npumem),
            "direct" => Ok(AllocatorKind::Direct),
            "pytorch" => Ok(AllocatorKind::PyTorch),
            "torch_npu" => Ok(AllocatorKind::TorchNpu),
            other => Err(AclError::invalid_param(format!("unknown allocator {other:?}; available: {}", Self::NAMES))),
        }
    }

    /// Builds the allocator, tuned by `alloc_conf` (PYTORCH_NPU_ALLOC_CONF grammar).
    fn build(self, alloc_conf: &str, capacity: u64) -> Result<Box<dyn Allocator>> {
        let family = match self {
            AllocatorKind::Npumem => {
                return Ok(Box::new(VmmAllocator::new(VmmConfig::parse(alloc_conf)?, capacity)));
            }
            AllocatorKind::Direct if alloc_conf.trim().is_empty() => return Ok(Box::new(DirectAllocator::new())),
            AllocatorKind::Direct => {
                return Err(AclError::invalid_param(
                    "the direct allocator has no settings; pass alloc_conf only with a caching allocator",
                ));
            }
            AllocatorKind::PyTorch => Family::PyTorch,
            AllocatorKind::TorchNpu => Family::TorchNpu,
        };
        Ok(Box::new(CachingAllocator::new(CachingConfig::parse(family, alloc_conf)?, capacity)))
    }
}

/// The memory a device's allocators run on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendKind {
    /// The simulated device (frames, page table and bytes in the simulator).
    Sim,
    /// Real host memory through the VMM calls (`HostBackend`): pointers can be dereferenced.
    Host,
    /// AscendCL's VMM calls, the library loaded at run time (`AclBackend`).
    Acl,
    /// The CUDA driver's VMM calls, the library loaded at run time (`CudaBackend`).
    Cuda,
}

impl BackendKind {
    pub const NAMES: &'static str = "\"sim\" (the simulated device), \"host\" (real host memory), \"acl\" (AscendCL, \
                                     loaded at run time), \"cuda\" (the CUDA driver, loaded at run time)";

    pub fn parse(name: &str) -> Result<Self> {
        match name {
            "sim" => Ok(BackendKind::Sim),
            "host" => Ok(BackendKind::Host),
            "acl" => Ok(BackendKind::Acl),
            "cuda" => Ok(BackendKind::Cuda),
            other => Err(AclError::invalid_param(format!("unknown backend {other:?}; available: {}", Self::NAMES))),
        }
    }

    /// The name `parse` takes.
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Sim => "sim",
            BackendKind::Host => "host",
            BackendKind::Acl => "acl",
            BackendKind::Cuda => "cuda",
        }
    }

    /// The capacity and normal page of a device of this kind (on the runtime's device
    /// `ordinal`) unless told otherwise: the
    /// simulator's 32 GiB of 4 KiB pages, the memory the host could take now in its system
    /// pages, an accelerator's whole memory in its runtime's normal granularity.
    pub fn defaults(self, ordinal: i32) -> Result<(u64, PageSize)> {
        let normal = |b: &dyn Backend| b.page_size(crate::vm::PageKind::Normal);
        Ok(match self {
            BackendKind::Sim => (SimConfig::default().capacity, SimConfig::default().normal_page),
            BackendKind::Host => {
                let probe = HostBackend::new(HostConfig { capacity: 64 << 20 })?;
                (crate::backend::host::default_capacity(), normal(&probe))
            }
            BackendKind::Acl => AclBackend::open(ordinal, None).map(|b| (b.capacity(), normal(&b)))?,
            BackendKind::Cuda => CudaBackend::open(ordinal, None).map(|b| (b.capacity(), normal(&b)))?,
        })
    }

    /// A backend of this kind for a device of `config` (the simulator's giant frames and
    /// normal page are checked against what a real backend has); `va_slice` cuts the
    /// simulator's window (see [`DeviceConfig::va_slice`]).
    fn open(self, config: SimConfig, ordinal: i32, va_slice: Option<(u32, u32)>) -> Result<Box<dyn Backend>> {
        let name = self.name();
        if let (Some((index, count)), false) = (va_slice, self == BackendKind::Sim) {
            return Err(AclError::invalid_param(format!(
                "va_slice=({index}, {count}) cuts the simulator's window; {name}-backend devices get distinct \
                 address windows from their memory's owner"
            )));
        }
        if self != BackendKind::Sim && config.giant_frames > 0 {
            return Err(AclError::invalid_param(format!(
                "giant_frames={} sets 1 GiB frames aside in the simulator; the {name} backend takes 1 GiB pages \
                 from its memory (the host's hugetlb pool: /sys/kernel/mm/hugepages/hugepages-1048576kB)",
                config.giant_frames
            )));
        }
        let backend: Box<dyn Backend> = match self {
            BackendKind::Sim => {
                let (start, end) = match va_slice {
                    Some((index, count)) => crate::vm::va_slice(index, count)?,
                    None => (crate::vm::VA_WINDOW_START, crate::vm::VA_WINDOW_END),
                };
                return Ok(Box::new(SimBackend::with_window(config, crate::vm::VaSpace::new(start, end))?));
            }
            BackendKind::Host => Box::new(HostBackend::new(HostConfig { capacity: config.capacity })?),
            BackendKind::Acl => Box::new(AclBackend::open(ordinal, Some(config.capacity))?),
            BackendKind::Cuda => Box::new(CudaBackend::open(ordinal, Some(config.capacity))?),
        };
        let normal = backend.page_size(crate::vm::PageKind::Normal);
        if config.normal_page != normal {
            return Err(AclError::invalid_param(format!(
                "normal_page={} but the {name} backend's normal pages are {}; it uses its own",
                config.normal_page.label(),
                normal.label()
            )));
        }
        Ok(backend)
    }
}

/// Everything needed to build a device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceConfig {
    /// The device's shape: capacity (for the host backend, the most it may hold), normal page
    /// and giant frames (the simulator's; the host backend takes its pages from the kernel).
    pub sim: SimConfig,
    pub backend: BackendKind,
    /// The runtime's device the `acl` and `cuda` backends use (`aclrtSetDevice`, `cuDeviceGet`).
    pub ordinal: i32,
    pub allocator: AllocatorKind,
    /// Settings of the allocator, in the PYTORCH_NPU_ALLOC_CONF grammar.
    pub alloc_conf: String,
    /// Wraps the backend in a [`FaultyBackend`], so that `inject_faults` can make driver calls
    /// fail.
    pub faults: bool,
    /// `(index, count)`: the simulated device hands out addresses only from slice `index` of
    /// the device window cut in `count` ([`crate::vm::va_slice`]), so that `count` devices share
    /// one address space without overlapping; `None`: the whole window.
    pub va_slice: Option<(u32, u32)>,
}

impl Default for DeviceConfig {
    fn default() -> Self {
        DeviceConfig {
            sim: SimConfig::default(),
            backend: BackendKind::Sim,
            ordinal: 0,
            allocator: AllocatorKind::Npumem,
            alloc_conf: String::new(),
            faults: false,
            va_slice: None,
        }
    }
}

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

/// A pending free's key: (the time its streams complete, a sequence number).
type PendingKey = (u64, u64);

/// A freed block waiting for its streams, and the point (vector clock) its free sits at: work
/// that follows that point may reuse it; `marks` are the runtime events (if any) its streams'
/// work must reach first.
#[derive(Clone, Debug)]
struct PendingFree {
    allocation: Allocation,
    point: Clock,
    marks: Vec<crate::stream::runtime::Handle>,
}

/// Queued work touching a block: its stream, when the operation ends on the simulated clock, and
/// the runtime's mark after it (0 without runtime work).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Busy {
    stream: StreamId,
    end_ns: u64,
    mark: crate::stream::runtime::Handle,
}

/// The stream-ordered reuse rules (`aclrtMemPoolAttr` / cudaMallocAsync's pool attributes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReusePolicy {
    /// A malloc on a stream that (through events) follows a free's point may reuse the block.
    pub follow_event_dependencies: bool,
    /// A freed block whose streams have completed is reusable by any stream, without the host
    /// having synchronised with them.
    pub allow_opportunistic: bool,
    /// When memory runs out, a malloc may take a pending block by making its stream wait for
    /// the free's point.
    pub allow_internal_dependencies: bool,
    /// Reserved bytes the allocator keeps when the host synchronises; above it, the coldest
    /// cached memory is returned to the device (`u64::MAX`: keep everything).
    pub release_threshold: u64,
}

impl Default for ReusePolicy {
    fn default() -> Self {
        ReusePolicy {
            follow_event_dependencies: true,
            allow_opportunistic: true,
            allow_internal_dependencies: true,
            release_threshold: u64::MAX,
        }
    }
}

/// How many recently freed pointers are remembered to name double frees.
const FREED_MEMORY: usize = 4096;

/// The last `FREED_MEMORY` freed pointers, in a ring (0 marks an empty slot: no allocation
/// starts at address 0).
#[derive(Debug)]
struct FreedRing {
    slots: Box<[u64]>,
    next: usize,
}

impl Default for FreedRing {
    fn default() -> Self {
        FreedRing { slots: vec![0; FREED_MEMORY].into_boxed_slice(), next: 0 }
    }
}

impl FreedRing {
    #[inline]
    fn push(&mut self, ptr: u64) {
        self.slots[self.next] = ptr;
        self.next = (self.next + 1) % FREED_MEMORY;
    }

    /// `push` of each of `ptrs` in order, a slice copy per stretch of the ring. Of a batch longer
    /// than the ring only the last `FREED_MEMORY` pointers are copied (the others would be
    /// overwritten), to the slots they would have reached.
    #[inline]
    fn extend(&mut self, mut ptrs: &[u64]) {
        let skipped = ptrs.len().saturating_sub(FREED_MEMORY);
        self.next = (self.next + skipped) % FREED_MEMORY;
        ptrs = &ptrs[skipped..];
        while !ptrs.is_empty() {
            let take = ptrs.len().min(FREED_MEMORY - self.next);
            self.slots[self.next..self.next + take].copy_from_slice(&ptrs[..take]);
            self.next = (self.next + take) % FREED_MEMORY;
            ptrs = &ptrs[take..];
        }
    }

    fn contains(&self, ptr: &u64) -> bool {
        *ptr != 0 && self.slots.contains(ptr)
    }
}

pub struct Device {
    backend: Box<dyn Backend>,
    allocator: Box<dyn Allocator>,
    /// Whether the allocator leaves its blocks' records to the device (see the module's
    /// invariants).
    owner_tracked: bool,
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
    /// `free_blocks`' run of blocks for an owner-tracked allocator (at most `FREE_RUN`).
    free_run: Vec<Granted>,
    recently_freed: FreedRing,
    host: HostHeap,
    stats: DeviceStats,
    /// The trace of allocator actions, while recording (`record_memory_history`).
    history: Option<History>,
    started: std::time::Instant,
    sched: Scheduler,
    /// Streams besides its own that used a live allocation (`record_stream`).
    stream_uses: FxHashMap<u64, Vec<StreamId>>,
    /// Queued work touching a block (launch arguments, async copies and memsets), by the
    /// block's start: (stream, end of its last such operation). Kept until the block's memory
    /// goes back to the allocator, through a free and a revival.
    busy: FxHashMap<u64, Vec<Busy>>,
    /// The pending frees by start address (for operations completing on their memory).
    pending_by_addr: BTreeMap<u64, PendingKey>,
    /// Freed blocks waiting for their streams, by `PendingKey` (ready time, sequence).
    pending_frees: BTreeMap<PendingKey, PendingFree>,
    /// Pending frees that their own stream may reuse at once (stream order already puts the
    /// new user after the old one): stream → (granted, ptr) → key in `pending_frees`.
    same_stream: FxHashMap<StreamId, BTreeMap<(u64, u64), PendingKey>>,
    free_seq: u64,
    sanitizer: Sanitizer,
    reuse: ReusePolicy,
    /// Driver calls already charged to the host clock (and their total).
    charged: BackendCounters,
    charged_calls: u64,
    /// Allocation-site tags of live allocations (for sanitizer and leak reports).
    tags: FxHashMap<u64, String>,
    /// Live allocations held by direct views of their memory (host backend) or by an owning
    /// object (`Device.buffer`), by start: how many. A pinned allocation cannot be freed.
    pins: Pins,
    /// The program's own reservations, physical allocations and mappings (the VMM calls).
    user_vmm: vmm::UserVmm,
    /// Runtime handles of the streams and events (absent: 0), and the streams whose runtime work
    /// may be incomplete (see `runtime.rs`).
    rt_streams: FxHashMap<StreamId, crate::stream::runtime::Handle>,
    rt_events: FxHashMap<EventId, crate::stream::runtime::Handle>,
    rt_dirty: runtime::Dirty,
    /// Streams adopted from the program (`adopt_stream`): never destroyed on the runtime.
    rt_adopted: runtime::Dirty,
    /// Adopted streams (the default stream too) on a runtime with a queue: the program queues
    /// work on them that npumem does not see, so they count as dirty always.
    rt_opaque: runtime::Dirty,
}

impl Device {
    /// A device on the simulator, real host memory or an accelerator runtime.
    pub fn new(config: DeviceConfig) -> Result<Self> {
        let backend = config.backend.open(config.sim, config.ordinal, config.va_slice)?;
        let (_, capacity) = backend.mem_info(crate::acl::MemScope::All);
        let allocator = config.allocator.build(&config.alloc_conf, capacity)?;
        if !config.faults {
            return Ok(Self::with_parts(backend, allocator));
        }
        let faulty = FaultyBackend::new(backend);
        let injector = faulty.injector();
        Ok(Self::with_parts(Box::new(faulty), allocator).with_fault_injector(injector))
    }

    /// A device over any backend and allocator (which keeps no records of its own of the blocks
    /// the device's live table holds, where it can: see [`Allocator::track_blocks_for_owner`]).
    pub fn with_parts(backend: Box<dyn Backend>, allocator: Box<dyn Allocator>) -> Self {
        let mut device = Self::with_pool_map(backend, allocator);
        device.owner_tracked = device.allocator.track_blocks_for_owner();
        device
    }

    /// `with_parts` with an allocator that keeps its own records of its blocks (as every
    /// family but npumem's does): the reference the tests compare owner tracking with.
    #[doc(hidden)]
    pub fn with_pool_map(backend: Box<dyn Backend>, allocator: Box<dyn Allocator>) -> Self {
        Device {
            backend,
            allocator,
            owner_tracked: false,
            fault_injector: None,
            pool_requested: FxHashMap::default(),
            live: LiveTable::default(),
            free_scratch: Vec::new(),
            free_run: Vec::new(),
            recently_freed: FreedRing::default(),
            host: HostHeap::default(),
            stats: DeviceStats::default(),
            history: None,
            started: std::time::Instant::now(),
            sched: Scheduler::new(CostModel::ascend910b()),
            stream_uses: FxHashMap::default(),
            busy: FxHashMap::default(),
            pending_by_addr: BTreeMap::new(),
            pending_frees: BTreeMap::new(),
            same_stream: FxHashMap::default(),
            free_seq: 0,
            sanitizer: Sanitizer::new(SanitizerMode::Collect),
            reuse: ReusePolicy::default(),
            charged: BackendCounters::default(),
            charged_calls: 0,
            tags: FxHashMap::default(),
            pins: Pins::default(),
            user_vmm: vmm::UserVmm::default(),
            rt_streams: FxHashMap::default(),
            rt_events: FxHashMap::default(),
            rt_dirty: runtime::Dirty::default(),
            rt_adopted: runtime::Dirty::default(),
            rt_opaque: runtime::Dirty::default(),
        }
    }

    /// Starts (with room for `max_entries` trace entries, the oldest dropped first) or stops
    /// recording the allocator's history, as `torch.cuda.memory._record_memory_history` does.
    pub fn record_memory_history(&mut self, enabled: bool, max_entries: usize) {
        self.allocator.set_recording(enabled);
        self.allocator.take_events();
        self.history = enabled.then(|| History::new(max_entries));
    }

    /// Records `action` for `stream`, after the allocator's segment events that came before it.
    /// A free is recorded before the segment events the allocator made while taking the block back
    /// (a segment is released after the blocks in it, as PyTorch's traces and memory_viz have it):
    /// those wait in the allocator's log until the next entry or `history()`, so a batch of frees
    /// lists every block's free before the segments it emptied. They carry the stream of the first
    /// free since the last flush (a run of frees on several streams gives its segment events the
    /// first one's).
    #[inline]
    fn trace(&mut self, action: Action, addr: u64, size: u64, stream: StreamId) {
        if self.history.is_none() {
            return;
        }
        let free = matches!(action, Action::FreeRequested | Action::FreeCompleted);
        if !free {
            self.flush_events(stream);
        }
        if let Some(history) = self.history.as_mut() {
            let time_us = self.started.elapsed().as_micros() as u64;
            history.push(TraceEntry { action, addr, size, stream, time_us });
            if free {
                history.events_stream.get_or_insert(stream);
            }
        }
    }

    fn flush_events(&mut self, stream: StreamId) {
        let Some(history) = self.history.as_mut() else { return };
        let time_us = self.started.elapsed().as_micros() as u64;
        let stream = history.events_stream.take().unwrap_or(stream);
        for (action, addr, size) in self.allocator.take_events() {
            history.push(TraceEntry { action, addr, size, stream, time_us });
        }
    }

    /// The recorded trace, oldest first (empty when not recording), with the allocator's segment
    /// events not yet moved into it.
    pub fn history(&mut self) -> Vec<TraceEntry> {
        self.flush_events(DEFAULT_STREAM);
        self.history.as_ref().map_or_else(Vec::new, |h| h.entries().copied().collect())
    }

    /// The allocator's segments and blocks, for `memory_snapshot`.
    pub fn segments(&self) -> Vec<SegmentSnapshot> {
        if !self.owner_tracked {
            return self.allocator.segments();
        }
        self.allocator.segments_with(&self.pool_blocks())
    }

    /// The blocks live in the allocator, in address order, as it granted them: the live
    /// allocations and the pending frees (a replay's held blocks are published before any
    /// caller can ask).
    fn pool_blocks(&self) -> Vec<Granted> {
        let live = self.live.sorted();
        let pending = self.pending_frees.values().map(|p| &p.allocation);
        let mut blocks: Vec<Granted> = live.iter().chain(pending).map(|a| self.granted_of(a)).collect();
        if !self.pending_frees.is_empty() {
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
        if !self.pending_frees.is_empty() {
            if let Some(ptr) = self.reuse_on_stream(size, policy, padded, stream)? {
                return Ok(ptr);
            }
        }
        let mut granted = self.allocate(size, policy, padded);
        if granted.as_ref().is_err_and(|e| e.code.is_out_of_memory()) && !self.pending_frees.is_empty() {
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
        if calls == self.charged_calls {
            return;
        }
        self.charged_calls = calls;
        let now = self.backend.counters();
        let before = std::mem::replace(&mut self.charged, now);
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
        // summary counts segments and free memory, which do not depend on the live blocks: an
        // owner-tracked pool is not given them.)
        let summary = self.allocator.fragmentation_with(&[]).summary();
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

    /// Pins the live allocation (or `map_mem` mapping) holding `[ptr, ptr + len)` for a direct
    /// view of its memory (backends whose memory is this process's, i.e. the host backend): it
    /// cannot be freed (or unmapped) until `unpin`. Returns its start.
    pub fn pin(&mut self, ptr: u64, len: u64) -> Result<u64> {
        if !self.backend.host_accessible() {
            return Err(self.unsupported(
                "memory of this process: its bytes live in the simulator (copy them, or use backend=\"host\")",
            ));
        }
        if self.side(ptr, len.max(1), "view")? != Side::Device {
            return Err(AclError::rt_param(format!(
                "{ptr:#x} is malloc_host memory, already a host address: view it directly"
            )));
        }
        // A live allocation, or a range the program mapped with map_mem (classified above).
        let base = self
            .containing(ptr)
            .map(|a| a.ptr)
            .or_else(|| self.user_vmm.mapping_of(ptr, 1))
            .ok_or_else(|| AclError::internal(format!("{ptr:#x} is device memory of no allocation or mapping")))?;
        self.pins.add(base);
        Ok(base)
    }

    /// `malloc_on` (with `aclrtMalloc`'s booking) for an object that owns the allocation
    /// (`Device.buffer`), pinned in the same call: a plain `free` of it is refused until the
    /// owner's `free_held`.
    pub fn malloc_held(&mut self, size: u64, policy: Policy, stream: StreamId) -> Result<u64> {
        let ptr = self.malloc_on(size, policy, true, stream)?;
        self.pins.add(ptr);
        Ok(ptr)
    }

    /// The owner's free of a `malloc_held` allocation: releases its hold, then frees it as
    /// `free` does (refused while a view still pins it; the hold is released all the same).
    pub fn free_held(&mut self, ptr: u64) -> Result<()> {
        self.unpin(ptr);
        self.free_on(ptr, None)
    }

    /// Releases one pin of the allocation at `base`.
    pub fn unpin(&mut self, base: u64) {
        self.pins.release(base);
    }

    /// The error for a free (or unmap) of a pinned allocation (or mapping).
    fn pinned(&self, ptr: u64) -> Option<AclError> {
        let n = self.pins.count(ptr);
        if n == 0 {
            return None;
        }
        Some(AclError::bad_free(format!(
            "the memory at {ptr:#x} is held by {n} view(s) or owner(s) (to_numpy(copy=False), Device.buffer); \
             delete them before freeing or unmapping it"
        )))
    }

    /// Tags the live allocation at `ptr` with where it came from (a call site, a tensor name);
    /// sanitizer findings and leak reports carry it.
    pub fn set_tag(&mut self, ptr: u64, tag: &str) -> Result<()> {
        if !self.live.contains(ptr) {
            return Err(AclError::rt_param(format!(
                "{ptr:#x} is not a live allocation; tag the pointer malloc returned"
            )));
        }
        self.tags.insert(ptr, tag.to_string());
        Ok(())
    }

    /// The tag of the live allocation at `ptr`.
    pub fn tag(&self, ptr: u64) -> Option<&str> {
        self.tags.get(&ptr).map(String::as_str)
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
        self.allocator.set_memory_fraction(fraction)
    }

    /// The allocator's statistics (PyTorch's `memory_stats` scheme).
    pub fn pool_stats(&self) -> &PoolStats {
        self.allocator.stats()
    }

    pub fn reset_peak_stats(&mut self) {
        self.allocator.reset_peak_stats();
    }

    /// Where the allocator's memory goes: waste, cached memory, free extents, per segment.
    pub fn fragmentation(&self) -> Fragmentation {
        if !self.owner_tracked {
            return self.allocator.fragmentation();
        }
        self.allocator.fragmentation_with(&self.pool_blocks())
    }
}

#[cfg(test)]
mod freed_ring_tests {
    use super::{FREED_MEMORY, FreedRing};

    /// `extend` leaves the ring as `push` of each pointer would, for batches shorter and longer
    /// than the ring, from any starting slot.
    #[test]
    fn extend_is_push_of_each() {
        for start in [0, 1, FREED_MEMORY - 1] {
            for len in [0, 5, FREED_MEMORY - 1, FREED_MEMORY, FREED_MEMORY + 1, 3 * FREED_MEMORY + 7] {
                let (mut pushed, mut extended) = (FreedRing::default(), FreedRing::default());
                for ring in [&mut pushed, &mut extended] {
                    (0..start as u64).for_each(|p| ring.push(p + 1));
                }
                let ptrs: Vec<u64> = (0..len as u64).map(|p| 0x10_0000 + p).collect();
                ptrs.iter().for_each(|&p| pushed.push(p));
                extended.extend(&ptrs);
                assert_eq!((pushed.next, &pushed.slots), (extended.next, &extended.slots), "start {start}, len {len}");
            }
        }
    }
}
