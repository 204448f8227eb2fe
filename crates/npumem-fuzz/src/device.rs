//! The allocator families under action sequences: one decoded program of mallocs (size,
//! policy, stream), frees (plain, on a stream, bad pointers, batches), cache trims, copies,
//! memsets, kernel launches, events, waits, synchronisations and stream replacements (destroy,
//! create), run on a small simulated `Device` of each family ("npumem", "pytorch",
//! "torch_npu", "direct").
//!
//! Checked after every step, against a model of the live pointers the harness keeps:
//! - the device's live allocations are exactly the model's, never overlap (`[ptr, ptr +
//!   granted)`), are 64-byte aligned, cover their request, and are mapped at both ends;
//! - the statistics equal a recount (`live_count`, `live_requested`, `live_granted`,
//!   `mallocs - frees`; the pool's allocation count is the live blocks plus the pending frees;
//!   allocated ≤ reserved ≤ the device's used bytes);
//! - a failed call changes nothing observable: the allocation table and live statistics (and,
//!   for calls other than mallocs, which may release cached memory before they give up, the
//!   memory counters, frames, page tables and pool statistics) are as before;
//! - bytes written synchronously while no async work is queued read back as written;
//! - no panic;
//!
//! and at the end, once everything is freed, the device synchronised and the cache emptied:
//! no free is pending, nothing is allocated or reserved, and every byte of the device is free.

use arbitrary::{Arbitrary, Unstructured};
use npumem_core::backend::SimConfig;
use npumem_core::policy;
use npumem_core::pool::PoolStats;
use npumem_core::sanitizer::SanitizerMode;
use npumem_core::stream::{DEFAULT_STREAM, EventId, StreamId};
use npumem_core::units::{KIB, MIB};
use npumem_core::vm::{FrameStats, PageSize, PageTableStats};
use npumem_core::{Allocation, AllocatorKind, Device, DeviceConfig, MemAttr, Policy};

/// Streams besides the default one, and events, created at the start.
const STREAMS: usize = 3;
const EVENTS: usize = 3;
/// A stream / event id that does not exist.
const BOGUS_ID: u64 = 1 << 40;
/// Host blocks (`malloc_host`) for copies.
const HOST_BLOCK: u64 = 64 * KIB;
/// Actions per program (bounded so that one input runs in milliseconds).
const MAX_ACTIONS: usize = 256;
/// Fills up to this size cover the whole allocation; larger ones their first and last 4 KiB.
const WHOLE_FILL: u64 = 256 * KIB;

const FAMILIES: [AllocatorKind; 4] =
    [AllocatorKind::Npumem, AllocatorKind::PyTorch, AllocatorKind::TorchNpu, AllocatorKind::Direct];

/// A size: mostly small, sometimes up to about twice the device, sometimes absurd.
#[derive(Arbitrary, Debug, Clone, Copy)]
enum Size {
    Tiny(u16),
    Medium(u32),
    Large(u32),
    Raw(u64),
}

impl Size {
    fn bytes(self) -> u64 {
        match self {
            Size::Tiny(n) => u64::from(n),
            Size::Medium(n) => u64::from(n) % (8 * MIB),
            Size::Large(n) => u64::from(n) % (96 * MIB),
            Size::Raw(n) => n,
        }
    }
}

/// An address operand: into a live allocation, into a host block, a freed pointer, or raw.
#[derive(Arbitrary, Debug, Clone, Copy)]
enum Addr {
    Live { slot: u16, offset: u32 },
    Host { block: bool, offset: u32 },
    Freed(u8),
    Raw(u64),
}

#[derive(Arbitrary, Debug, Clone)]
enum Action {
    Malloc {
        size: Size,
        policy: u8,
        padded: bool,
        stream: u8,
    },
    Free(u16),
    FreeOn {
        slot: u16,
        stream: u8,
    },
    FreeAddr(Addr),
    /// The first `n % 5` sizes (fixed-size arrays keep every action a few bytes long).
    MallocMany {
        sizes: [Size; 4],
        n: u8,
        policy: u8,
        stream: u8,
    },
    /// The first `n % 5` slots (a repeat makes the batch invalid), and maybe another address.
    FreeMany {
        slots: [u16; 4],
        n: u8,
        extra: Option<Addr>,
    },
    EmptyCache,
    TrimTo(Size),
    Memcpy {
        dst: Addr,
        src: Addr,
        count: u32,
        slack: u16,
        kind: u8,
    },
    Memset {
        dst: Addr,
        value: u8,
        count: u32,
        slack: u16,
    },
    MemcpyAsync {
        dst: Addr,
        src: Addr,
        count: u32,
        kind: u8,
        stream: u8,
    },
    MemsetAsync {
        dst: Addr,
        value: u8,
        count: u32,
        stream: u8,
    },
    /// Reads the first `n % 3` of `reads`, writes the first `n / 3 % 3` of `writes`.
    Launch {
        stream: u8,
        duration: u32,
        reads: [Addr; 2],
        writes: [Addr; 2],
        n: u8,
    },
    RecordEvent {
        event: u8,
        stream: u8,
    },
    StreamWaitEvent {
        stream: u8,
        event: u8,
    },
    RecordStream {
        slot: u16,
        stream: u8,
    },
    SynchronizeStream(u8),
    SynchronizeEvent(u8),
    SynchronizeDevice,
    /// Destroys one of the created streams (its queued work still completes) and creates a
    /// new one in its place.
    ReplaceStream(u8),
    /// Fills a live allocation (the model remembers the byte when no async work is queued).
    Fill {
        slot: u16,
        value: u8,
    },
    /// Reads a live allocation's first and last byte and compares them with the model.
    Check(u16),
}

#[derive(Debug)]
struct Program {
    /// Device shape: capacity and normal page.
    shape: u8,
    sanitizer: u8,
    conf: u8,
    actions: Vec<Action>,
}

impl Program {
    fn decode(data: &[u8]) -> Program {
        let mut u = Unstructured::new(data);
        let [shape, sanitizer, conf] = u.arbitrary().unwrap_or_default();
        Program { shape, sanitizer, conf, actions: crate::sequence(&mut u, MAX_ACTIONS) }
    }
}

/// A live allocation as the harness knows it.
#[derive(Clone, Copy, Debug)]
struct Live {
    ptr: u64,
    size: u64,
    /// The byte at both ends, when the harness wrote it and nothing can overwrite it.
    fill: Option<u8>,
}

/// What must not change when a call fails.
#[derive(Debug, PartialEq)]
struct LiveView {
    allocations: Vec<Allocation>,
    live: (u64, u64, u64),
    host: (u64, usize),
}

#[derive(Debug, PartialEq)]
struct MemoryView {
    hbm: (u64, u64),
    frames: Option<FrameStats>,
    tables: Option<PageTableStats>,
    pool: PoolStats,
}

struct Harness {
    d: Device,
    live: Vec<Live>,
    freed: Vec<u64>,
    streams: Vec<StreamId>,
    events: Vec<EventId>,
    host: [u64; 2],
    /// The sanitizer is in raise mode: a free that is a hazard is refused (and frees nothing).
    raise: bool,
}

fn policy(p: u8) -> Policy {
    Policy::ALL[usize::from(p) % Policy::ALL.len()]
}

/// The family's settings for conf index `c` (empty for most programs).
fn conf(kind: AllocatorKind, c: u8) -> &'static str {
    let caching = ["", "max_split_size_mb:32", "roundup_power2_divisions:4", "garbage_collection_threshold:0.5"];
    let npumem = ["", "large_threshold_mb:4", "garbage_collection_threshold:0.5", "per_process_memory_fraction:0.5"];
    // Five programs in eight run with the defaults.
    let i = if c % 8 < 4 { usize::from(c % 4) } else { 0 };
    match kind {
        AllocatorKind::Npumem => npumem[i],
        AllocatorKind::Direct => "",
        _ => caching[i],
    }
}

impl Harness {
    fn new(kind: AllocatorKind, p: &Program) -> Harness {
        let sim = match p.shape % 3 {
            0 => SimConfig { capacity: 64 * MIB, normal_page: PageSize::Size4K, giant_frames: 0 },
            1 => SimConfig { capacity: 48 * MIB, normal_page: PageSize::Size64K, giant_frames: 0 },
            _ => SimConfig { capacity: 32 * MIB, normal_page: PageSize::Size4K, giant_frames: 0 },
        };
        let config =
            DeviceConfig { sim, allocator: kind, alloc_conf: conf(kind, p.conf).to_string(), ..Default::default() };
        let mut d = Device::new(config).expect("a valid device");
        let mode = [SanitizerMode::Collect, SanitizerMode::Off, SanitizerMode::Raise][usize::from(p.sanitizer % 3)];
        d.set_sanitizer(mode);
        let streams = (0..STREAMS).map(|_| d.create_stream().unwrap()).collect();
        let events = (0..EVENTS).map(|_| d.create_event().unwrap()).collect();
        let host = [d.malloc_host(HOST_BLOCK).expect("host"), d.malloc_host(HOST_BLOCK).expect("host")];
        Harness { d, live: Vec::new(), freed: Vec::new(), streams, events, host, raise: mode == SanitizerMode::Raise }
    }

    fn stream(&self, s: u8) -> StreamId {
        match usize::from(s) % (STREAMS + 2) {
            0 => DEFAULT_STREAM,
            i if i <= STREAMS => self.streams[i - 1],
            _ => BOGUS_ID,
        }
    }

    fn event(&self, e: u8) -> EventId {
        self.events.get(usize::from(e) % (EVENTS + 1)).copied().unwrap_or(BOGUS_ID)
    }

    fn slot(&self, s: u16) -> Option<usize> {
        (!self.live.is_empty()).then(|| usize::from(s) % self.live.len())
    }

    fn addr(&self, a: Addr) -> u64 {
        match a {
            Addr::Live { slot, offset } => match self.slot(slot) {
                Some(i) => self.live[i].ptr + u64::from(offset) % (self.live[i].size + 64),
                None => u64::from(offset),
            },
            Addr::Host { block, offset } => self.host[usize::from(block)] + u64::from(offset) % (HOST_BLOCK + 64),
            Addr::Freed(k) if !self.freed.is_empty() => self.freed[usize::from(k) % self.freed.len()],
            Addr::Freed(_) => 0,
            Addr::Raw(p) => p,
        }
    }

    /// Forgets every remembered byte (async work may land on any of them).
    fn forget_fills(&mut self) {
        self.live.iter_mut().for_each(|l| l.fill = None);
    }

    /// The live allocation containing `addr`, for invalidating its remembered bytes.
    fn touched(&mut self, addr: u64) {
        if let Some(l) = self.live.iter_mut().find(|l| addr >= l.ptr && addr < l.ptr + l.size) {
            l.fill = None;
        }
    }

    fn remove(&mut self, ptr: u64) {
        let i = self.live.iter().position(|l| l.ptr == ptr).expect("freed pointer was live in the model");
        self.live.swap_remove(i);
        self.freed.push(ptr);
        if self.freed.len() > 16 {
            self.freed.remove(0);
        }
    }

    fn live_view(&self) -> LiveView {
        let s = self.d.stats();
        LiveView {
            allocations: self.d.allocations(),
            live: (s.live_count, s.live_requested, s.live_granted),
            host: self.d.host_usage(),
        }
    }

    fn memory_view(&self) -> MemoryView {
        MemoryView {
            hbm: self.d.mem_info(MemAttr::Hbm),
            frames: self.d.frame_stats().ok(),
            tables: self.d.page_table_stats().ok(),
            pool: self.d.pool_stats().clone(),
        }
    }

    /// Whether `e` is the sanitizer refusing a free that is a use-after-free hazard (raise mode).
    fn hazard(&self, e: &npumem_core::AclError) -> bool {
        self.raise && e.finding == Some("use_after_free")
    }

    /// Runs one action; returns whether it failed and whether it was a malloc.
    fn step(&mut self, action: &Action) -> (bool, bool) {
        match action {
            Action::Malloc { size, policy: p, padded, stream } => {
                let (size, stream) = (size.bytes(), self.stream(*stream));
                match self.d.malloc_on(size, policy(*p), *padded, stream) {
                    Ok(ptr) => {
                        self.live.push(Live { ptr, size, fill: None });
                        (false, true)
                    }
                    Err(_) => (true, true),
                }
            }
            Action::Free(slot) => {
                let Some(i) = self.slot(*slot) else { return (false, false) };
                let ptr = self.live[i].ptr;
                match self.d.free(ptr) {
                    Ok(()) => {
                        self.remove(ptr);
                        (false, false)
                    }
                    Err(e) if self.hazard(&e) => (true, false),
                    Err(e) => panic!("free of live {ptr:#x}: {e}"),
                }
            }
            Action::FreeOn { slot, stream } => {
                let Some(i) = self.slot(*slot) else { return (false, false) };
                let (ptr, stream) = (self.live[i].ptr, self.stream(*stream));
                match self.d.free_on(ptr, Some(stream)) {
                    Ok(()) => {
                        self.remove(ptr);
                        (false, false)
                    }
                    Err(e) => {
                        assert!(
                            stream == BOGUS_ID || self.hazard(&e),
                            "free_on({ptr:#x}, {stream}) of a live pointer: {e}"
                        );
                        (true, false)
                    }
                }
            }
            Action::FreeAddr(a) => {
                let ptr = self.addr(*a);
                match self.d.free(ptr) {
                    Ok(()) => {
                        self.remove(ptr);
                        (false, false)
                    }
                    Err(_) => {
                        assert!(!self.live.iter().any(|l| l.ptr == ptr), "free of live {ptr:#x} failed");
                        (true, false)
                    }
                }
            }
            Action::MallocMany { sizes, n, policy: p, stream } => {
                let sizes: Vec<u64> = sizes.iter().take(usize::from(n % 5)).map(|s| s.bytes()).collect();
                let stream = self.stream(*stream);
                match self.d.malloc_many(&sizes, policy(*p), stream) {
                    Ok(ptrs) => {
                        assert_eq!(ptrs.len(), sizes.len());
                        self.live.extend(ptrs.iter().zip(&sizes).map(|(&ptr, &size)| Live { ptr, size, fill: None }));
                        (false, true)
                    }
                    Err(_) => (true, true),
                }
            }
            Action::FreeMany { slots, n, extra } => {
                let mut ptrs: Vec<u64> = Vec::new();
                if !self.live.is_empty() {
                    let slots = slots.iter().take(usize::from(n % 5));
                    ptrs = slots.map(|&s| self.live[usize::from(s) % self.live.len()].ptr).collect();
                }
                if let Some(a) = extra {
                    ptrs.push(self.addr(*a));
                }
                let mut distinct = ptrs.clone();
                distinct.sort_unstable();
                distinct.dedup();
                let valid = distinct.len() == ptrs.len() && ptrs.iter().all(|p| self.live.iter().any(|l| l.ptr == *p));
                let r = self.d.free_many(&ptrs);
                let refused = r.as_ref().is_err_and(|e| self.hazard(e));
                assert_eq!(r.is_ok(), valid && !refused, "free_many({ptrs:x?}) = {r:?}");
                if r.is_ok() {
                    ptrs.iter().for_each(|&p| self.remove(p));
                }
                (r.is_err(), false)
            }
            Action::EmptyCache => (self.d.empty_cache().is_err(), false),
            Action::TrimTo(bytes) => (self.d.trim_to(bytes.bytes()).is_err(), false),
            Action::Memcpy { dst, src, count, slack, kind } => {
                let (dst, src) = (self.addr(*dst), self.addr(*src));
                let count = u64::from(*count) % (2 * MIB);
                let r = self.d.memcpy(dst, count + u64::from(*slack), src, count, u32::from(*kind % 6));
                if r.is_ok() && count > 0 {
                    self.touched(dst);
                }
                (r.is_err(), false)
            }
            Action::Memset { dst, value, count, slack } => {
                let dst = self.addr(*dst);
                let count = u64::from(*count) % (2 * MIB);
                let r = self.d.memset(dst, count + u64::from(*slack), i32::from(*value), count);
                if r.is_ok() && count > 0 {
                    self.touched(dst);
                }
                (r.is_err(), false)
            }
            Action::MemcpyAsync { dst, src, count, kind, stream } => {
                let (dst, src, stream) = (self.addr(*dst), self.addr(*src), self.stream(*stream));
                let count = u64::from(*count) % (2 * MIB);
                let r = self.d.memcpy_async(dst, count, src, count, u32::from(*kind % 6), stream);
                if r.is_ok() {
                    self.forget_fills();
                }
                (r.is_err(), false)
            }
            Action::MemsetAsync { dst, value, count, stream } => {
                let (dst, stream) = (self.addr(*dst), self.stream(*stream));
                let count = u64::from(*count) % (2 * MIB);
                let r = self.d.memset_async(dst, count, i32::from(*value), count, stream);
                if r.is_ok() {
                    self.forget_fills();
                }
                (r.is_err(), false)
            }
            Action::Launch { stream, duration, reads, writes, n } => {
                let stream = self.stream(*stream);
                let reads: Vec<u64> = reads.iter().take(usize::from(n % 3)).map(|a| self.addr(*a)).collect();
                let writes: Vec<u64> = writes.iter().take(usize::from(n / 3 % 3)).map(|a| self.addr(*a)).collect();
                (self.d.launch(stream, u64::from(*duration), &reads, &writes).is_err(), false)
            }
            Action::RecordEvent { event, stream } => {
                let (e, s) = (self.event(*event), self.stream(*stream));
                (self.d.record_event(e, s).is_err(), false)
            }
            Action::StreamWaitEvent { stream, event } => {
                let (e, s) = (self.event(*event), self.stream(*stream));
                (self.d.stream_wait_event(s, e).is_err(), false)
            }
            Action::RecordStream { slot, stream } => {
                let Some(i) = self.slot(*slot) else { return (false, false) };
                let (ptr, s) = (self.live[i].ptr, self.stream(*stream));
                (self.d.record_stream(ptr, s).is_err(), false)
            }
            Action::SynchronizeStream(s) => {
                let s = self.stream(*s);
                (self.d.synchronize_stream(s).is_err(), false)
            }
            Action::SynchronizeEvent(e) => {
                let e = self.event(*e);
                (self.d.synchronize_event(e).is_err(), false)
            }
            Action::ReplaceStream(k) => {
                let k = usize::from(*k) % STREAMS;
                let r = self.d.destroy_stream(self.streams[k]);
                assert!(r.is_ok(), "destroy_stream of a live stream: {r:?}");
                self.streams[k] = self.d.create_stream().unwrap();
                (false, false)
            }
            Action::SynchronizeDevice => {
                self.d.synchronize_device().expect("synchronize");
                (false, false)
            }
            Action::Fill { slot, value } => {
                let Some(i) = self.slot(*slot) else { return (false, false) };
                let Live { ptr, size, .. } = self.live[i];
                let ranges = if size <= WHOLE_FILL {
                    vec![(ptr, size)]
                } else {
                    vec![(ptr, 4 * KIB), (ptr + size - 4 * KIB, 4 * KIB)]
                };
                for (p, n) in ranges {
                    if let Err(e) = self.d.memset(p, n, i32::from(*value), n) {
                        // Only the sanitizer in "raise" mode refuses a fill of live memory.
                        assert!(!self.d.sanitizer_reports().is_empty(), "fill of live {ptr:#x}+{size}: {e}");
                        self.live[i].fill = None;
                        return (true, false);
                    }
                }
                let quiet = self.d.scheduler().pending_effects() == 0;
                self.live[i].fill = quiet.then_some(*value);
                (false, false)
            }
            Action::Check(slot) => {
                let Some(i) = self.slot(*slot) else { return (false, false) };
                let Live { ptr, size, fill } = self.live[i];
                let mut b = [0u8; 1];
                for p in [ptr, ptr + size - 1] {
                    match self.d.read(p, &mut b) {
                        Ok(()) => {
                            if let Some(v) = fill {
                                assert_eq!(b[0], v, "byte at {p:#x} of {ptr:#x}+{size}");
                            }
                        }
                        Err(e) => {
                            assert!(!self.d.sanitizer_reports().is_empty(), "read of live {p:#x}: {e}");
                            return (true, false);
                        }
                    }
                }
                (false, false)
            }
        }
    }

    /// The invariants that hold between any two calls.
    fn check(&self, context: &Context) {
        let allocations = self.d.allocations();
        let mut model: Vec<u64> = self.live.iter().map(|l| l.ptr).collect();
        model.sort_unstable();
        let mut ptrs: Vec<u64> = allocations.iter().map(|a| a.ptr).collect();
        ptrs.sort_unstable();
        assert_eq!(ptrs, model, "{context}: the live allocations are the model's");
        let mut sorted = allocations.clone();
        sorted.sort_by_key(|a| a.ptr);
        for w in sorted.windows(2) {
            assert!(w[0].ptr + w[0].granted <= w[1].ptr, "{context}: {:x?} overlaps {:x?}", w[0], w[1]);
        }
        for a in &sorted {
            let size = self.live.iter().find(|l| l.ptr == a.ptr).expect("in the model").size;
            assert_eq!(a.size, size, "{context}: size of {:#x}", a.ptr);
            assert!(a.ptr % 64 == 0 && a.granted >= a.size, "{context}: {a:x?}");
            // Mapped end to end, on pages the policy promises (one translation per 2 MiB window:
            // a 2 MiB or 1 GiB page covers its whole window), the smallest of them reported.
            let mut smallest = PageSize::Size1G;
            let mut at = a.ptr;
            while at < a.ptr + a.granted {
                let t = self.d.translate(at).unwrap_or_else(|_| panic!("{context}: {at:#x} of {a:x?} is not mapped"));
                assert!(policy::honours(a.policy, t.page_size), "{context}: {a:x?} on {:?} pages", t.page_size);
                smallest = smallest.min(t.page_size);
                let window = t.page_size.bytes().max(2 * MIB);
                at = (at / window + 1) * window;
            }
            assert!(self.d.translate(a.ptr + a.granted - 1).is_ok(), "{context}: the end of {a:x?} is not mapped");
            assert_eq!(a.page, smallest, "{context}: {a:x?} reports its smallest page");
        }
        let s = self.d.stats();
        let requested: u64 = sorted.iter().map(|a| a.size).sum();
        let granted: u64 = sorted.iter().map(|a| a.granted).sum();
        assert_eq!(
            (s.live_count, s.live_requested, s.live_granted),
            (sorted.len() as u64, requested, granted),
            "{context}: live stats"
        );
        assert_eq!(s.mallocs - s.frees, s.live_count, "{context}: mallocs - frees");
        assert!(s.peak_granted >= s.live_granted, "{context}: peak");
        let pool = self.d.pool_stats();
        assert_eq!(
            pool.allocation.all.current,
            s.live_count + s.pending_frees,
            "{context}: pool allocations = live + pending frees"
        );
        assert!(pool.allocated_bytes.all.current >= granted, "{context}: pool allocated bytes cover the live blocks");
        assert!(
            pool.allocated_bytes.all.current <= pool.reserved_bytes.all.current,
            "{context}: allocated <= reserved"
        );
        let (free, total) = self.d.mem_info(MemAttr::Hbm);
        assert!(free <= total && pool.reserved_bytes.all.current <= total - free, "{context}: reserved within used");
    }
}

/// Where a check failed: the family and the action (formatted only for a failure's message).
struct Context<'a> {
    kind: AllocatorKind,
    step: Option<(usize, &'a Action)>,
}

impl std::fmt::Display for Context<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.step {
            Some((n, action)) => write!(f, "{:?} #{n} {action:?}", self.kind),
            None => write!(f, "{:?} at the start or the end", self.kind),
        }
    }
}

fn run_family(kind: AllocatorKind, p: &Program) {
    let mut h = Harness::new(kind, p);
    h.check(&Context { kind, step: None });
    for (n, action) in p.actions.iter().enumerate() {
        // Apply what completed already, so that a failed call's own effect can be judged.
        h.d.memset(0, 0, 0, 0).expect("a zero-byte memset is a no-op");
        let (before, memory) = (h.live_view(), h.memory_view());
        let (failed, malloc) = h.step(action);
        let context = Context { kind, step: Some((n, action)) };
        if failed {
            assert_eq!(h.live_view(), before, "{context}: a failed call changed the live allocations");
            if !malloc {
                assert_eq!(h.memory_view(), memory, "{context}: a failed call changed the memory state");
            }
        }
        h.check(&context);
    }
    // Everything freed and the cache emptied: nothing is held, every frame is free again.
    let context = Context { kind, step: None };
    h.d.synchronize_device().expect("synchronize");
    let ptrs: Vec<u64> = h.live.iter().map(|l| l.ptr).collect();
    h.d.free_many(&ptrs).expect("free_many of every live pointer");
    h.live.clear();
    h.d.synchronize_device().expect("synchronize");
    h.check(&context);
    assert_eq!(h.d.stats().pending_frees, 0, "{context}: frees still pending after synchronize_device");
    h.d.empty_cache().expect("empty_cache");
    let pool = h.d.pool_stats();
    assert_eq!(pool.allocated_bytes.all.current, 0, "{context}: allocated bytes after freeing everything");
    assert_eq!(pool.reserved_bytes.all.current, 0, "{context}: reserved bytes after empty_cache");
    let (free, total) = h.d.mem_info(MemAttr::Hbm);
    assert_eq!(free, total, "{context}: device memory still used after freeing everything and empty_cache");
}

pub fn run(data: &[u8]) {
    let program = Program::decode(data);
    for kind in FAMILIES {
        run_family(kind, &program);
    }
}
