//! `Device`: AscendCL memory semantics over an allocator and a backend.
//!
//! One `malloc`: check the size and policy → book `ALIGN_UP(size, 32) (+ 32)` bytes → the
//! allocator reserves VA, creates physical memory and maps it through the backend → the live table
//! records the allocation. One `memcpy`: check `count <= dst_max` → classify each address as
//! device (inside a live allocation) or host (inside a live `malloc_host` block) → check both
//! ranges fit → move the bytes (device bytes through the page table).
//!
//! Invariants: `live` holds exactly the allocations the allocator has granted and not freed; no
//! byte outside a live allocation's requested size or a live host block is ever read or written;
//! every failed call leaves the device as it was.

use std::collections::{BTreeMap, HashMap, VecDeque};

use crate::acl::{MemAttr, MemcpyKind, Policy};
use crate::backend::{Backend, BackendCounters, SimBackend, SimConfig};
use crate::error::{AclError, ErrorCode, Result};
use crate::host::HostHeap;
use crate::policy::{HUGE_FIRST_NORMAL_LIMIT, START_ALIGN, booked_size};
use crate::pool::{
    Action, Allocator, CachingAllocator, CachingConfig, DirectAllocator, Family, Fragmentation, History, PoolStats,
    Request, SegmentSnapshot, TraceEntry, VmmAllocator, VmmConfig,
};
use crate::sanitizer::{Finding, FindingKind, HOST, Sanitizer, SanitizerMode};
use crate::stream::{Clock, CostModel, DEFAULT_STREAM, Effect, EventId, Scheduler, StreamId};
use crate::units::format_size;
use crate::vm::{FrameStats, PageSize, PageTableStats, Translation, is_device_address};

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

/// Everything needed to build a simulated device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceConfig {
    pub sim: SimConfig,
    pub allocator: AllocatorKind,
    /// Settings of the allocator, in the PYTORCH_NPU_ALLOC_CONF grammar.
    pub alloc_conf: String,
}

impl Default for DeviceConfig {
    fn default() -> Self {
        DeviceConfig { sim: SimConfig::default(), allocator: AllocatorKind::Npumem, alloc_conf: String::new() }
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

/// Where an address lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Side {
    Device,
    Host,
}

/// A pending free's key: (the time its streams complete, a sequence number).
type PendingKey = (u64, u64);

/// A freed block waiting for its streams, and the point (vector clock) its free sits at: work
/// that follows that point may reuse it.
#[derive(Clone, Debug)]
struct PendingFree {
    allocation: Allocation,
    point: Clock,
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

pub struct Device {
    backend: Box<dyn Backend>,
    allocator: Box<dyn Allocator>,
    live: BTreeMap<u64, Allocation>,
    recently_freed: VecDeque<u64>,
    host: HostHeap,
    stats: DeviceStats,
    /// The trace of allocator actions, while recording (`record_memory_history`).
    history: Option<History>,
    started: std::time::Instant,
    sched: Scheduler,
    /// Streams besides its own that used a live allocation (`record_stream`).
    stream_uses: HashMap<u64, Vec<StreamId>>,
    /// Freed blocks waiting for their streams, by `PendingKey` (ready time, sequence).
    pending_frees: BTreeMap<PendingKey, PendingFree>,
    /// Pending frees that their own stream may reuse at once (stream order already puts the
    /// new user after the old one): stream → (granted, ptr) → key in `pending_frees`.
    same_stream: HashMap<StreamId, BTreeMap<(u64, u64), PendingKey>>,
    free_seq: u64,
    sanitizer: Sanitizer,
    reuse: ReusePolicy,
}

impl Device {
    /// A simulated device.
    pub fn new(config: DeviceConfig) -> Result<Self> {
        let backend = SimBackend::new(config.sim)?;
        let (_, capacity) = backend.mem_info(crate::acl::MemScope::All);
        let allocator = config.allocator.build(&config.alloc_conf, capacity)?;
        Ok(Self::with_parts(Box::new(backend), allocator))
    }

    /// A device over any backend and allocator.
    pub fn with_parts(backend: Box<dyn Backend>, allocator: Box<dyn Allocator>) -> Self {
        Device {
            backend,
            allocator,
            live: BTreeMap::new(),
            recently_freed: VecDeque::new(),
            host: HostHeap::default(),
            stats: DeviceStats::default(),
            history: None,
            started: std::time::Instant::now(),
            sched: Scheduler::new(CostModel::ascend910b()),
            stream_uses: HashMap::new(),
            pending_frees: BTreeMap::new(),
            same_stream: HashMap::new(),
            free_seq: 0,
            sanitizer: Sanitizer::new(SanitizerMode::Collect),
            reuse: ReusePolicy::default(),
        }
    }

    /// Starts (with room for `max_entries` trace entries, the oldest dropped first) or stops
    /// recording the allocator's history, as `torch.cuda.memory._record_memory_history` does.
    pub fn record_memory_history(&mut self, enabled: bool, max_entries: usize) {
        self.allocator.set_recording(enabled);
        self.allocator.take_events();
        self.history = enabled.then(|| History::new(max_entries));
    }

    /// Moves the allocator's segment events into the history, then records `action`.
    fn trace(&mut self, action: Action, addr: u64, size: u64) {
        self.flush_events();
        if let Some(history) = self.history.as_mut() {
            let time_us = self.started.elapsed().as_micros() as u64;
            history.push(TraceEntry { action, addr, size, time_us });
        }
    }

    fn flush_events(&mut self) {
        let Some(history) = self.history.as_mut() else { return };
        let time_us = self.started.elapsed().as_micros() as u64;
        for (action, addr, size) in self.allocator.take_events() {
            history.push(TraceEntry { action, addr, size, time_us });
        }
    }

    /// The recorded trace, oldest first (empty when not recording).
    pub fn history(&self) -> Vec<TraceEntry> {
        self.history.as_ref().map_or_else(Vec::new, |h| h.entries().copied().collect())
    }

    /// The allocator's segments and blocks, for `memory_snapshot`.
    pub fn segments(&self) -> Vec<SegmentSnapshot> {
        self.allocator.segments()
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
        self.sched.tail_ns(stream)?;
        self.settle();
        if let Some(ptr) = self.reuse_on_stream(size, policy, padded, stream)? {
            return Ok(ptr);
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
            self.synchronize_device();
            granted = self.allocate(size, policy, padded);
        }
        self.finish_malloc(granted, size, policy, stream)
    }

    /// Serves a malloc on `stream` from a pending free it may safely take without waiting: one
    /// freed on the same stream (stream order runs the new work after the old, as PyTorch's
    /// per-stream pools rely on), or — following event dependencies — one whose free point the
    /// stream already follows through events. The block must be of the same policy, hold the
    /// request and be at most twice its size.
    fn reuse_on_stream(&mut self, size: u64, policy: Policy, padded: bool, stream: StreamId) -> Result<Option<u64>> {
        let booked = booked_size(size, policy, padded)?;
        let fits = |p: &PendingFree| {
            let a = &p.allocation;
            a.granted >= size && a.granted <= size.saturating_mul(2) && a.policy.base() == policy.base()
        };
        let same = self.same_stream.get(&stream).and_then(|index| {
            index.range((size, 0)..).take(8).map(|(_, &key)| key).find(|key| fits(&self.pending_frees[key]))
        });
        let key = match same {
            Some(key) => {
                self.stats.same_stream_reuses += 1;
                key
            }
            None if self.reuse.follow_event_dependencies => {
                let clock = self.sched.next_clock(stream);
                let followed = self
                    .pending_frees
                    .iter()
                    .take(64)
                    .find(|(_, p)| fits(p) && p.point.iter().all(|(&s, &t)| crate::stream::covers(&clock, s, t)));
                let Some((&key, _)) = followed else { return Ok(None) };
                self.stats.event_dependency_reuses += 1;
                key
            }
            None => return Ok(None),
        };
        Ok(Some(self.revive(key, size, booked, policy)))
    }

    /// On out-of-memory: takes the earliest pending block that fits and makes `stream` wait
    /// for its free (an internal dependency).
    fn reuse_with_dependency(
        &mut self,
        size: u64,
        policy: Policy,
        padded: bool,
        stream: StreamId,
    ) -> Result<Option<u64>> {
        let booked = booked_size(size, policy, padded)?;
        let found = self
            .pending_frees
            .iter()
            .find(|(_, p)| p.allocation.granted >= size && p.allocation.policy.base() == policy.base())
            .map(|(&key, p)| (key, p.point.clone()));
        let Some((key, point)) = found else { return Ok(None) };
        self.sched.stream_wait_point(stream, key.0, &point)?;
        self.stats.internal_dependency_reuses += 1;
        Ok(Some(self.revive(key, size, booked, policy)))
    }

    /// Turns the pending free at `key` back into a live allocation of `size` bytes.
    fn revive(&mut self, key: PendingKey, size: u64, booked: u64, policy: Policy) -> u64 {
        let old = self.pending_frees.remove(&key).expect("pending free").allocation;
        if let Some(index) = self.same_stream.get_mut(&old.stream) {
            index.remove(&(old.granted, old.ptr));
        }
        self.stats.pending_frees -= 1;
        self.record_live(Allocation { size, booked, policy, ..old });
        old.ptr
    }

    fn allocate(&mut self, size: u64, policy: Policy, padded: bool) -> Result<(u64, crate::pool::Grant)> {
        booked_size(size, policy, padded).and_then(|booked| {
            let request = Request { size, booked, policy };
            self.allocator.malloc(self.backend.as_mut(), &request).map(|g| (booked, g))
        })
    }

    fn finish_malloc(
        &mut self,
        granted: Result<(u64, crate::pool::Grant)>,
        size: u64,
        policy: Policy,
        stream: StreamId,
    ) -> Result<u64> {
        let (booked, grant) = match granted {
            Ok(g) => g,
            Err(e) => {
                if e.code.is_out_of_memory() {
                    self.stats.failed_mallocs += 1;
                    let free = self.backend.mem_info(crate::acl::MemScope::All).0;
                    self.trace(Action::Oom, free, size);
                }
                return Err(self.malloc_error(e, size, policy));
            }
        };
        // Caching families size blocks by their own rules (torch_npu pads, PyTorch does not), so
        // the grant covers the request, not necessarily aclrtMalloc's booking.
        debug_assert!(grant.ptr % START_ALIGN == 0 && grant.granted >= size);
        if policy.base() == Policy::HugeFirst
            && size > HUGE_FIRST_NORMAL_LIMIT
            && grant.page.bytes() < PageSize::Size2M.bytes()
        {
            self.stats.huge_fallbacks += 1;
        }
        let allocation =
            Allocation { ptr: grant.ptr, size, booked, granted: grant.granted, policy, page: grant.page, stream };
        self.record_live(allocation);
        Ok(grant.ptr)
    }

    fn record_live(&mut self, allocation: Allocation) {
        self.live.insert(allocation.ptr, allocation);
        self.trace(Action::Alloc, allocation.ptr, allocation.granted);
        let s = &mut self.stats;
        s.mallocs += 1;
        s.live_count += 1;
        s.live_requested += allocation.size;
        s.live_granted += allocation.granted;
        s.peak_granted = s.peak_granted.max(s.live_granted);
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
        // The allocator's own state explains many failures: every OOM says what it holds.
        let pool = format!("; {} allocator: {}", self.allocator.name(), self.allocator.fragmentation().summary());
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

    /// A free ordered on `stream` when given (as `aclrtMemPoolFreeAsync`: the memory is reusable
    /// once that stream reaches this point, e.g. after it waited on an event recorded behind
    /// the last use), else after the block's own stream and recorded streams.
    pub fn free_on(&mut self, ptr: u64, stream: Option<StreamId>) -> Result<()> {
        if ptr == 0 {
            return Err(AclError::invalid_param("free(NULL): pass a pointer returned by malloc"));
        }
        let Some(allocation) = self.live.get(&ptr).copied() else {
            let error = self.bad_pointer(ptr);
            if self.recently_freed.contains(&ptr) {
                let finding = Finding {
                    kind: FindingKind::DoubleFree,
                    message: error.message.clone(),
                    addr: ptr,
                    size: 0,
                    allocation: Some(ptr),
                    streams: vec![],
                };
                let _ = self.sanitizer.report(finding, false);
            }
            return Err(error);
        };
        let uses = self.stream_uses.get(&ptr).map_or(&[][..], Vec::as_slice);
        let own_stream_only = uses.is_empty() && stream.is_none_or(|s| s == allocation.stream);
        // The free's point: after the given stream's work so far, or after the block's own
        // stream's and every recorded stream's.
        let (ready, point) = match stream {
            Some(s) => (self.sched.tail_ns(s)?, self.sched.clock(s).clone()),
            None => {
                let mut point = self.sched.clock(allocation.stream).clone();
                let mut ready = self.sched.tail_ns(allocation.stream).unwrap_or(0);
                for &s in uses {
                    ready = ready.max(self.sched.tail_ns(s).unwrap_or(0));
                    crate::stream::join(&mut point, self.sched.clock(s));
                }
                (ready, point)
            }
        };
        if ready <= self.sched.now_ns() {
            self.allocator.free(self.backend.as_mut(), ptr)?;
        }
        self.live.remove(&ptr);
        self.stream_uses.remove(&ptr);
        self.sanitizer.forget(ptr);
        self.trace(Action::FreeRequested, ptr, allocation.granted);
        if ready <= self.sched.now_ns() {
            self.trace(Action::FreeCompleted, ptr, allocation.granted);
        } else {
            self.free_seq += 1;
            let key = (ready, self.free_seq);
            self.pending_frees.insert(key, PendingFree { allocation, point });
            if own_stream_only {
                self.same_stream.entry(allocation.stream).or_default().insert((allocation.granted, ptr), key);
            }
            self.stats.deferred_frees += 1;
            self.stats.pending_frees += 1;
        }
        if self.recently_freed.len() == FREED_MEMORY {
            self.recently_freed.pop_front();
        }
        self.recently_freed.push_back(ptr);
        let s = &mut self.stats;
        s.frees += 1;
        s.live_count -= 1;
        s.live_requested -= allocation.size;
        s.live_granted -= allocation.granted;
        Ok(())
    }

    /// `record_stream`: `stream` also uses the allocation at `ptr`; its free waits for that
    /// stream's work too.
    pub fn record_stream(&mut self, ptr: u64, stream: StreamId) -> Result<()> {
        self.sched.tail_ns(stream)?;
        let Some(allocation) = self.live.get(&ptr) else {
            return Err(AclError::rt_param(format!("{ptr:#x} is not a live allocation; record_stream needs one")));
        };
        let uses = self.stream_uses.entry(ptr).or_default();
        if stream != allocation.stream && !uses.contains(&stream) {
            uses.push(stream);
        }
        Ok(())
    }

    /// Returns to the allocator the freed blocks whose streams have completed, in order of
    /// completion (a stream that is still busy holds back only its own frees). Without
    /// opportunistic reuse a completed free also waits until the host has synchronised with it.
    fn reap(&mut self) {
        let now = self.sched.now_ns();
        let opportunistic = self.reuse.allow_opportunistic;
        let host = self.sched.host_clock();
        let due: Vec<PendingKey> = self
            .pending_frees
            .range(..(now + 1, 0))
            .filter(|(_, p)| opportunistic || p.point.iter().all(|(&s, &t)| crate::stream::covers(host, s, t)))
            .map(|(&k, _)| k)
            .collect();
        for key in due {
            let a = self.pending_frees.remove(&key).expect("pending free").allocation;
            self.stats.pending_frees -= 1;
            if let Some(index) = self.same_stream.get_mut(&a.stream) {
                index.remove(&(a.granted, a.ptr));
            }
            if self.allocator.free(self.backend.as_mut(), a.ptr).is_ok() {
                self.trace(Action::FreeCompleted, a.ptr, a.granted);
            }
        }
    }

    /// The stream-ordered reuse rules in force.
    pub fn reuse_policy(&self) -> ReusePolicy {
        self.reuse
    }

    pub fn set_reuse_policy(&mut self, policy: ReusePolicy) {
        self.reuse = policy;
    }

    /// After the host synchronises: give back cached memory above the release threshold.
    fn apply_release_threshold(&mut self) {
        let threshold = self.reuse.release_threshold;
        if threshold != u64::MAX && self.allocator.stats().reserved_bytes.all.current > threshold {
            let _ = self.allocator.trim_to(self.backend.as_mut(), threshold);
            self.flush_events();
        }
    }

    fn bad_pointer(&self, ptr: u64) -> AclError {
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

    fn containing(&self, addr: u64) -> Option<&Allocation> {
        self.live.range(..=addr).next_back().map(|(_, a)| a).filter(|a| addr < a.ptr + a.granted)
    }

    /// The live allocation that starts at `ptr`.
    pub fn allocation(&self, ptr: u64) -> Option<Allocation> {
        self.live.get(&ptr).copied()
    }

    /// All live allocations in address order.
    pub fn allocations(&self) -> impl Iterator<Item = &Allocation> {
        self.live.values()
    }

    /// `aclrtMallocHost`: real host memory, 64-byte aligned.
    pub fn malloc_host(&mut self, size: u64) -> Result<u64> {
        self.host.alloc(size)
    }

    /// `aclrtFreeHost`.
    pub fn free_host(&mut self, ptr: u64) -> Result<()> {
        if ptr == 0 {
            return Err(AclError::invalid_param("free_host(NULL): pass a pointer returned by malloc_host"));
        }
        self.host.free(ptr)
    }

    /// Classifies `[addr, addr + len)` and checks that it lies wholly in one live allocation.
    fn side(&mut self, addr: u64, len: u64, role: &str) -> Result<Side> {
        self.classify(addr, len, role).map_err(|(error, kind)| {
            if let Some(kind) = kind {
                let finding = Finding {
                    kind,
                    message: error.message.clone(),
                    addr,
                    size: len,
                    allocation: None,
                    streams: vec![],
                };
                let _ = self.sanitizer.report(finding, false);
            }
            error
        })
    }

    /// Where `[addr, addr + len)` lives, or the error (and the sanitizer finding it makes).
    fn classify(&self, addr: u64, len: u64, role: &str) -> std::result::Result<Side, (AclError, Option<FindingKind>)> {
        if addr == 0 {
            return Err((AclError::invalid_param(format!("{role} is NULL")), None));
        }
        if is_device_address(addr) {
            let a = self.live.range(..=addr).next_back().map(|(_, a)| a).filter(|a| addr < a.ptr + a.size);
            let Some(a) = a else {
                let (why, kind) = if self.containing(addr).is_some() {
                    ("lies in the padding past the requested size of an allocation", FindingKind::OutOfBounds)
                } else {
                    (
                        "is not inside a live device allocation (freed already? use after free)",
                        FindingKind::UseAfterFree,
                    )
                };
                return Err((AclError::rt_param(format!("{role} {addr:#x} {why}")), Some(kind)));
            };
            let end = a.ptr + a.size;
            if addr.checked_add(len).is_none_or(|e| e > end) {
                let error = AclError::rt_param(format!(
                    "{len} bytes at {role} {addr:#x} run {} bytes past the end of the allocation at {:#x} \
                     ({} bytes); copy less or allocate more",
                    addr.saturating_add(len) - end,
                    a.ptr,
                    a.size
                ));
                return Err((error, Some(FindingKind::OutOfBounds)));
            }
            return Ok(Side::Device);
        }
        if self.host.contains(addr) {
            self.host
                .check(addr, len)
                .map_err(|e| (AclError::rt_param(format!("{role}: {}", e.message)), Some(FindingKind::OutOfBounds)))?;
            return Ok(Side::Host);
        }
        Err((
            AclError::rt_param(format!(
                "{role} {addr:#x} is neither a device address nor host memory from malloc_host; pass \
                 Python data with write()/read(), or copy it into a malloc_host buffer first"
            )),
            None,
        ))
    }

    /// The start of the (device or host) allocation holding `addr`, for the sanitizer.
    fn base_of(&self, addr: u64) -> u64 {
        self.containing(addr).map(|a| a.ptr).or_else(|| self.host.block_start(addr)).unwrap_or(addr)
    }

    /// Tells the sanitizer about an access by the host.
    fn touch_host(&mut self, addr: u64, len: u64, write: bool) -> Result<()> {
        if !self.sanitizer.enabled() || len == 0 {
            return Ok(());
        }
        let base = self.base_of(addr);
        let epoch = self.sched.host_tick();
        self.sanitizer.access(HOST, epoch, self.sched.host_clock(), base, addr, addr + len, write)
    }

    /// Tells the sanitizer about an access by the next operation on `stream`, whose clock is
    /// `clock` (from `Scheduler::next_clock`).
    fn touch_op(&mut self, stream: StreamId, clock: &Clock, addr: u64, len: u64, write: bool) -> Result<()> {
        if !self.sanitizer.enabled() || len == 0 {
            return Ok(());
        }
        let base = self.base_of(addr);
        let epoch = clock.get(&stream).copied().unwrap_or(0);
        self.sanitizer.access(stream, epoch, clock, base, addr, addr + len, write)
    }

    /// Checks that `[ptr, ptr + len)` may be read or written (device or `malloc_host` memory),
    /// without touching it: the check `read`/`write` make first, for callers that must size a
    /// buffer before they copy.
    pub fn check_range(&mut self, ptr: u64, len: u64) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        self.side(ptr, len, "address").map(|_| ())
    }

    /// Checks a copy the way `aclrtMemcpy` does and classifies both ends; `None` for a no-op.
    fn check_copy(&mut self, dst: u64, dst_max: u64, src: u64, count: u64, kind: u32) -> Result<Option<(Side, Side)>> {
        let kind = MemcpyKind::from_raw(kind)?;
        if matches!(kind, MemcpyKind::InnerDeviceToDevice | MemcpyKind::InterDeviceToDevice) {
            return Err(AclError::invalid_param(format!(
                "{} is not accepted by aclrtMemcpy (the runtime takes kinds 0-5); use ACL_MEMCPY_DEFAULT",
                kind.name()
            )));
        }
        if count == 0 {
            return Ok(None);
        }
        if count > dst_max {
            return Err(AclError::rt_param(format!(
                "count {count} is larger than dst_max {dst_max}; the copy would overflow the destination"
            )));
        }
        let dst_side = self.side(dst, count, "destination")?;
        let src_side = self.side(src, count, "source")?;
        if let Some(named) = kind.direction() {
            let actual = (src_side == Side::Device, dst_side == Side::Device);
            if named != actual {
                self.stats.kind_mismatches += 1;
                let side = |device: bool| if device { "device" } else { "host" };
                let message = format!(
                    "{} copies {} to {}, but the addresses say {} to {} (the runtime ignores the kind)",
                    kind.name(),
                    side(named.0),
                    side(named.1),
                    side(actual.0),
                    side(actual.1)
                );
                let finding = Finding {
                    kind: FindingKind::KindMismatch,
                    message,
                    addr: dst,
                    size: count,
                    allocation: None,
                    streams: vec![],
                };
                self.sanitizer.report(finding, false)?;
            }
        }
        Ok((dst != src).then_some((dst_side, src_side)))
    }

    /// Moves `count` bytes between checked ranges.
    fn move_bytes(&mut self, dst: u64, dst_side: Side, src: u64, src_side: Side, count: u64) -> Result<()> {
        match (src_side, dst_side) {
            (Side::Host, Side::Host) => self.host.copy(dst, src, count),
            (Side::Host, Side::Device) => {
                let data = self.host.slice(src, count)?;
                self.backend.write(dst, data)
            }
            (Side::Device, Side::Host) => {
                let out = self.host.slice_mut(dst, count)?;
                self.backend.read(src, out)
            }
            (Side::Device, Side::Device) => self.backend.copy(dst, src, count),
        }
    }

    fn fill_bytes(&mut self, ptr: u64, side: Side, byte: u8, count: u64) -> Result<()> {
        match side {
            Side::Host => {
                self.host.slice_mut(ptr, count)?.fill(byte);
                Ok(())
            }
            Side::Device => self.backend.fill(ptr, byte, count),
        }
    }

    /// `aclrtMemcpy`: copies `count` bytes now, against the memory as it is on the host clock
    /// (no implicit synchronisation); the direction comes from the addresses, `kind` is validated
    /// but advisory.
    pub fn memcpy(&mut self, dst: u64, dst_max: u64, src: u64, count: u64, kind: u32) -> Result<()> {
        self.settle();
        let Some((dst_side, src_side)) = self.check_copy(dst, dst_max, src, count, kind)? else {
            return Ok(());
        };
        self.touch_host(src, count, false)?;
        self.touch_host(dst, count, true)?;
        self.move_bytes(dst, dst_side, src, src_side, count)?;
        let ns = self.sched.cost.copy_ns(count, src_side == Side::Device, dst_side == Side::Device, true);
        self.sched.advance(ns);
        Ok(())
    }

    /// `aclrtMemcpyAsync`: queues the copy on `stream`. Host memory here is pinned (`malloc_host`),
    /// so the call returns at once and the bytes land when the copy completes on the device
    /// clock; the ranges must stay valid until then. Returns (start, end) on the device clock.
    pub fn memcpy_async(
        &mut self,
        dst: u64,
        dst_max: u64,
        src: u64,
        count: u64,
        kind: u32,
        stream: StreamId,
    ) -> Result<(u64, u64)> {
        self.settle();
        self.sched.tail_ns(stream)?;
        let Some((dst_side, src_side)) = self.check_copy(dst, dst_max, src, count, kind)? else {
            return self.sched.enqueue(stream, 0, "memcpy", 0, None);
        };
        let clock = self.sched.next_clock(stream);
        self.touch_op(stream, &clock, src, count, false)?;
        self.touch_op(stream, &clock, dst, count, true)?;
        let ns = self.sched.cost.copy_ns(count, src_side == Side::Device, dst_side == Side::Device, true);
        let label = match (src_side, dst_side) {
            (Side::Host, Side::Device) => "copy H2D",
            (Side::Device, Side::Host) => "copy D2H",
            (Side::Device, Side::Device) => "copy D2D",
            (Side::Host, Side::Host) => "copy H2H",
        };
        self.sched.enqueue(stream, ns, label, count, Some(Effect::Copy { dst, src, count }))
    }

    /// `aclrtMemset`: sets `count` bytes at `ptr` (device or host) to the low byte of `value`.
    pub fn memset(&mut self, ptr: u64, dst_max: u64, value: i32, count: u64) -> Result<()> {
        self.settle();
        if count == 0 {
            return Ok(());
        }
        if count > dst_max {
            return Err(AclError::rt_param(format!(
                "count {count} is larger than dst_max {dst_max}; the memset would overflow the destination"
            )));
        }
        let side = self.side(ptr, count, "destination")?;
        self.touch_host(ptr, count, true)?;
        self.fill_bytes(ptr, side, value as u8, count)?;
        self.sched.advance(self.sched.cost.fill_ns(count));
        Ok(())
    }

    /// `aclrtMemsetAsync`: queues a byte fill on `stream`.
    pub fn memset_async(
        &mut self,
        ptr: u64,
        dst_max: u64,
        value: i32,
        count: u64,
        stream: StreamId,
    ) -> Result<(u64, u64)> {
        self.settle();
        if count > dst_max {
            return Err(AclError::rt_param(format!(
                "count {count} is larger than dst_max {dst_max}; the memset would overflow the destination"
            )));
        }
        self.sched.tail_ns(stream)?;
        if count > 0 {
            self.side(ptr, count, "destination")?;
        }
        let clock = self.sched.next_clock(stream);
        self.touch_op(stream, &clock, ptr, count, true)?;
        let ns = self.sched.cost.fill_ns(count);
        let effect = (count > 0).then_some(Effect::Fill { dst: ptr, value: value as u8, count });
        self.sched.enqueue(stream, ns, "memset", count, effect)
    }

    /// Queues a kernel that runs for `duration_ns` on `stream`, touching the allocations at
    /// `reads` and `writes` (checked to be live; their bytes are left as they are).
    pub fn launch(&mut self, stream: StreamId, duration_ns: u64, reads: &[u64], writes: &[u64]) -> Result<(u64, u64)> {
        self.settle();
        self.sched.tail_ns(stream)?;
        for &p in reads.iter().chain(writes) {
            self.side(p, 1, "kernel argument")?;
        }
        // A kernel argument stands for the whole allocation it points into; an allocation both
        // read and written counts once, as written.
        let clock = self.sched.next_clock(stream);
        let mut touched: BTreeMap<(u64, u64), bool> = BTreeMap::new();
        for (&p, write) in reads.iter().map(|p| (p, false)).chain(writes.iter().map(|p| (p, true))) {
            let range = self.containing(p).map_or((p, 1), |a| (a.ptr, a.size));
            *touched.entry(range).or_default() |= write;
        }
        for ((base, len), write) in touched {
            self.touch_op(stream, &clock, base, len, write)?;
        }
        self.sched.enqueue(stream, duration_ns, "kernel", 0, None)
    }

    /// Applies the data effects of async work that has completed on the host clock. An effect
    /// whose memory was freed meanwhile is dropped and counted in `lost_effects`.
    fn settle(&mut self) {
        self.reap_effects();
        self.reap();
    }

    fn reap_effects(&mut self) {
        for effect in self.sched.take_due() {
            let applied = match effect {
                Effect::Copy { dst, src, count } => self
                    .side(dst, count, "destination")
                    .and_then(|d| self.side(src, count, "source").map(|s| (d, s)))
                    .and_then(|(d, s)| self.move_bytes(dst, d, src, s, count)),
                Effect::Fill { dst, value, count } => {
                    self.side(dst, count, "destination").and_then(|side| self.fill_bytes(dst, side, value, count))
                }
            };
            if applied.is_err() {
                self.stats.lost_effects += 1;
            }
        }
    }

    /// The scheduler: streams, events and the clocks.
    pub fn scheduler(&mut self) -> &mut Scheduler {
        &mut self.sched
    }

    /// Blocks the host until `stream`'s work is done, then applies its effects.
    pub fn synchronize_stream(&mut self, stream: StreamId) -> Result<()> {
        self.sched.synchronize_stream(stream)?;
        self.settle();
        self.apply_release_threshold();
        Ok(())
    }

    pub fn synchronize_event(&mut self, event: EventId) -> Result<()> {
        self.sched.synchronize_event(event)?;
        self.settle();
        self.apply_release_threshold();
        Ok(())
    }

    pub fn synchronize_device(&mut self) {
        self.sched.synchronize_device();
        self.settle();
        self.apply_release_threshold();
    }

    /// `aclrtRecordEvent`: the event completes when `stream`'s work queued so far has.
    pub fn record_event(&mut self, event: EventId, stream: StreamId) -> Result<()> {
        self.sched.record_event(event, stream)
    }

    /// `aclrtStreamWaitEvent`: `stream`'s later work starts after `event` completes.
    pub fn stream_wait_event(&mut self, stream: StreamId, event: EventId) -> Result<()> {
        self.sched.stream_wait_event(stream, event)
    }

    /// The sanitizer's findings so far.
    pub fn sanitizer_reports(&self) -> &[Finding] {
        self.sanitizer.findings()
    }

    pub fn clear_sanitizer_reports(&mut self) {
        self.sanitizer.clear();
    }

    pub fn set_sanitizer(&mut self, mode: SanitizerMode) {
        self.sanitizer.mode = mode;
    }

    /// What is still held: live allocations, live host blocks, streams besides the default one
    /// and events not destroyed.
    pub fn leak_report(&self) -> (Vec<Allocation>, usize, Vec<StreamId>, Vec<EventId>) {
        let streams = self.sched.stream_ids().into_iter().filter(|&s| s != DEFAULT_STREAM).collect();
        (self.live.values().copied().collect(), self.host.live_count(), streams, self.sched.event_ids())
    }

    /// Whether the event has completed on the host clock.
    pub fn query_event(&mut self, event: EventId) -> Result<bool> {
        self.settle();
        self.sched.query_event(event)
    }

    /// `aclrtEventElapsedTime`: milliseconds between two recorded events.
    pub fn event_elapsed_time(&mut self, start: EventId, end: EventId) -> Result<f64> {
        let (a, b) = (self.sched.event_time(start)?, self.sched.event_time(end)?);
        Ok((b as f64 - a as f64) / 1e6)
    }

    /// Writes `data` at `ptr` (device or `malloc_host` memory): a synchronous copy from pageable
    /// host memory, which costs the host its transfer time.
    pub fn write(&mut self, ptr: u64, data: &[u8]) -> Result<()> {
        self.settle();
        if data.is_empty() {
            return Ok(());
        }
        let count = data.len() as u64;
        let side = self.side(ptr, count, "destination")?;
        self.touch_host(ptr, count, true)?;
        match side {
            Side::Host => self.host.slice_mut(ptr, count)?.copy_from_slice(data),
            Side::Device => {
                self.backend.write(ptr, data)?;
                self.sched.advance(self.sched.cost.copy_ns(count, false, true, false));
            }
        }
        Ok(())
    }

    /// An async copy from pageable host memory (`data`) to device memory on `stream`: as in the
    /// real runtime it is synchronous, returning once the copy, queued behind the stream's work,
    /// has completed. Returns (start, end) on the device clock.
    pub fn write_on(&mut self, ptr: u64, data: &[u8], stream: StreamId) -> Result<(u64, u64)> {
        self.settle();
        let count = data.len() as u64;
        if count > 0 && self.side(ptr, count, "destination")? == Side::Host {
            return Err(AclError::rt_param("write with a stream targets device memory; this is host memory"));
        }
        self.sched.tail_ns(stream)?;
        let clock = self.sched.next_clock(stream);
        self.touch_op(stream, &clock, ptr, count, true)?;
        let ns = self.sched.cost.copy_ns(count, false, true, false);
        let span = self.sched.enqueue(stream, ns, "copy H2D (pageable)", count, None)?;
        self.sched.wait_for(stream, span.1);
        self.settle();
        if count > 0 {
            self.backend.write(ptr, data)?;
        }
        Ok(span)
    }

    /// An async copy from device memory to pageable host memory on `stream`: synchronous, like
    /// `write_on`, and ordered after the stream's queued work.
    pub fn read_on(&mut self, ptr: u64, out: &mut [u8], stream: StreamId) -> Result<(u64, u64)> {
        self.settle();
        let count = out.len() as u64;
        if count > 0 && self.side(ptr, count, "source")? == Side::Host {
            return Err(AclError::rt_param("read with a stream reads device memory; this is host memory"));
        }
        self.sched.tail_ns(stream)?;
        let clock = self.sched.next_clock(stream);
        self.touch_op(stream, &clock, ptr, count, false)?;
        let ns = self.sched.cost.copy_ns(count, true, false, false);
        let span = self.sched.enqueue(stream, ns, "copy D2H (pageable)", count, None)?;
        self.sched.wait_for(stream, span.1);
        self.settle();
        if count > 0 {
            self.backend.read(ptr, out)?;
        }
        Ok(span)
    }

    /// Reads `out.len()` bytes at `ptr` (device or `malloc_host` memory) into pageable memory.
    pub fn read(&mut self, ptr: u64, out: &mut [u8]) -> Result<()> {
        self.settle();
        if out.is_empty() {
            return Ok(());
        }
        let count = out.len() as u64;
        let side = self.side(ptr, count, "source")?;
        self.touch_host(ptr, count, false)?;
        match side {
            Side::Host => out.copy_from_slice(self.host.slice(ptr, count)?),
            Side::Device => {
                self.backend.read(ptr, out)?;
                self.sched.advance(self.sched.cost.copy_ns(count, true, false, false));
            }
        }
        Ok(())
    }

    /// `aclrtGetMemInfo`: (free, total) bytes of the memory `attr` names.
    pub fn mem_info(&self, attr: MemAttr) -> (u64, u64) {
        self.backend.mem_info(attr.scope())
    }

    /// Where a device VA is mapped.
    pub fn translate(&self, va: u64) -> Result<Translation> {
        if !is_device_address(va) {
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

    /// Returns cached memory to the backend (nothing to do for the direct allocator).
    pub fn empty_cache(&mut self) -> Result<()> {
        self.settle();
        let result = self.allocator.empty_cache(self.backend.as_mut());
        self.flush_events();
        result
    }

    /// Returns the coldest cached memory to the device until at most `bytes` are reserved.
    pub fn trim_to(&mut self, bytes: u64) -> Result<u64> {
        let result = self.allocator.trim_to(self.backend.as_mut(), bytes);
        self.flush_events();
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
        self.allocator.fragmentation()
    }
}
