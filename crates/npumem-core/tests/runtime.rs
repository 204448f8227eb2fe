//! The stream seam against a runtime with a queue of its own: a test runtime over host memory
//! whose streams run only when the test steps them, so that "the simulated clock says done, the
//! runtime has not run it yet" can be set up on purpose. Async copies are the runtime's (the
//! bytes land when it runs them); a block freed under queued runtime work goes to no other stream
//! until the runtime's event completes; same-stream reuse stays immediate; every event the device
//! records for itself is destroyed again.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use npumem_core::acl::MemScope;
use npumem_core::backend::{Backend, BackendCounters, HostBackend, HostConfig, PhysHandle};
use npumem_core::pool::VmmAllocator;
use npumem_core::stream::RuntimeStreams;
use npumem_core::stream::runtime::Handle;
use npumem_core::units::MIB;
use npumem_core::vm::{PageKind, PageSize, Translation};
use npumem_core::{AclError, Device, Result};

#[derive(Clone, Copy, Debug)]
enum Op {
    Copy {
        dst: u64,
        src: u64,
        count: u64,
    },
    Fill {
        dst: u64,
        value: u8,
        count: u64,
    },
    /// Blocks the stream until the event's position is reached.
    Wait {
        event: Handle,
    },
}

#[derive(Default)]
struct Queues {
    next: Handle,
    /// Each stream's queue (0: the default stream) and how many of its ops ran.
    streams: HashMap<Handle, (VecDeque<Op>, u64)>,
    /// Event → (stream, position it completes at), once recorded.
    events: HashMap<Handle, Option<(Handle, u64)>>,
}

impl Queues {
    fn done(&self, event: Handle) -> bool {
        match self.events.get(&event) {
            Some(Some((stream, at))) => self.streams.get(stream).is_none_or(|(_, ran)| *ran >= *at),
            _ => true,
        }
    }

    fn queued(&self, stream: Handle) -> u64 {
        let (q, ran) = &self.streams[&stream];
        ran + q.len() as u64
    }

    /// Runs the head of `stream`'s queue if it can; returns whether it ran one.
    fn step(&mut self, stream: Handle) -> bool {
        let Some(&op) = self.streams.get(&stream).and_then(|(q, _)| q.front()) else { return false };
        if let Op::Wait { event } = op {
            if !self.done(event) {
                return false;
            }
        }
        match op {
            // SAFETY: the device checked both ranges against live allocations (or pinned host
            // blocks) of this test's host backend before queuing the copy.
            Op::Copy { dst, src, count } => unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, count as usize) },
            // SAFETY: as above.
            Op::Fill { dst, value, count } => unsafe { std::ptr::write_bytes(dst as *mut u8, value, count as usize) },
            Op::Wait { .. } => {}
        }
        let (q, ran) = self.streams.get_mut(&stream).expect("present");
        q.pop_front();
        *ran += 1;
        true
    }

    fn run_all(&mut self) {
        let streams: Vec<Handle> = self.streams.keys().copied().collect();
        while streams.iter().any(|&s| self.step(s)) {}
    }
}

#[derive(Clone, Default)]
struct TestRuntime(Arc<Mutex<Queues>>);

impl TestRuntime {
    fn run_all(&self) {
        self.0.lock().unwrap().run_all();
    }

    fn live_events(&self) -> usize {
        self.0.lock().unwrap().events.len()
    }

    fn pending_ops(&self) -> usize {
        self.0.lock().unwrap().streams.values().map(|(q, _)| q.len()).sum()
    }
}

fn unknown(what: &str, h: Handle) -> AclError {
    AclError::invalid_param(format!("test runtime: unknown {what} {h}"))
}

impl RuntimeStreams for TestRuntime {
    fn is_real(&self) -> bool {
        true
    }

    fn create_stream(&mut self) -> Result<Handle> {
        let mut q = self.0.lock().unwrap();
        q.next += 1;
        let h = q.next;
        q.streams.insert(h, (VecDeque::new(), 0));
        Ok(h)
    }

    fn destroy_stream(&mut self, stream: Handle) -> Result<()> {
        let mut q = self.0.lock().unwrap();
        let (pending, _) = q.streams.get(&stream).ok_or_else(|| unknown("stream", stream))?;
        assert!(pending.is_empty(), "the device synchronises a stream before destroying it");
        q.streams.remove(&stream);
        Ok(())
    }

    fn create_event(&mut self) -> Result<Handle> {
        let mut q = self.0.lock().unwrap();
        q.next += 1;
        let h = q.next;
        q.events.insert(h, None);
        Ok(h)
    }

    fn destroy_event(&mut self, event: Handle) -> Result<()> {
        self.0.lock().unwrap().events.remove(&event).map(|_| ()).ok_or_else(|| unknown("event", event))
    }

    fn record_event(&mut self, event: Handle, stream: Handle) -> Result<()> {
        let mut q = self.0.lock().unwrap();
        let at = q.queued(stream);
        *q.events.get_mut(&event).ok_or_else(|| unknown("event", event))? = Some((stream, at));
        Ok(())
    }

    fn stream_wait_event(&mut self, stream: Handle, event: Handle) -> Result<()> {
        let mut q = self.0.lock().unwrap();
        q.streams.get_mut(&stream).ok_or_else(|| unknown("stream", stream))?.0.push_back(Op::Wait { event });
        Ok(())
    }

    fn query_event(&mut self, event: Handle) -> Result<bool> {
        Ok(self.0.lock().unwrap().done(event))
    }

    fn synchronize_event(&mut self, event: Handle) -> Result<()> {
        let mut q = self.0.lock().unwrap();
        while !q.done(event) {
            let streams: Vec<Handle> = q.streams.keys().copied().collect();
            assert!(streams.iter().any(|&s| q.step(s)), "deadlock");
        }
        Ok(())
    }

    fn synchronize_stream(&mut self, stream: Handle) -> Result<()> {
        let mut q = self.0.lock().unwrap();
        while !q.streams[&stream].0.is_empty() {
            let streams: Vec<Handle> = q.streams.keys().copied().collect();
            assert!(streams.iter().any(|&s| q.step(s)), "deadlock");
        }
        Ok(())
    }

    fn synchronize_device(&mut self) -> Result<()> {
        self.run_all();
        Ok(())
    }

    fn memcpy_async(&mut self, dst: u64, src: u64, count: u64, stream: Handle) -> Result<bool> {
        let mut q = self.0.lock().unwrap();
        q.streams.get_mut(&stream).ok_or_else(|| unknown("stream", stream))?.0.push_back(Op::Copy { dst, src, count });
        Ok(true)
    }

    fn memset_async(&mut self, dst: u64, value: u8, count: u64, stream: Handle) -> Result<bool> {
        let mut q = self.0.lock().unwrap();
        q.streams.get_mut(&stream).ok_or_else(|| unknown("stream", stream))?.0.push_back(Op::Fill {
            dst,
            value,
            count,
        });
        Ok(true)
    }
}

/// Host memory with the test runtime as its streams.
struct QueuedHost {
    host: HostBackend,
    rt: TestRuntime,
}

impl Backend for QueuedHost {
    fn name(&self) -> &'static str {
        "queued-host"
    }
    fn page_size(&self, kind: PageKind) -> PageSize {
        self.host.page_size(kind)
    }
    fn reserve(&mut self, size: u64, align: u64, hint: Option<u64>) -> Result<u64> {
        self.host.reserve(size, align, hint)
    }
    fn release(&mut self, va: u64) -> Result<()> {
        self.host.release(va)
    }
    fn create_physical(&mut self, size: u64, kind: PageKind) -> Result<PhysHandle> {
        self.host.create_physical(size, kind)
    }
    fn free_physical(&mut self, handle: PhysHandle) -> Result<()> {
        self.host.free_physical(handle)
    }
    fn map(&mut self, va: u64, handle: PhysHandle) -> Result<()> {
        self.host.map(va, handle)
    }
    fn unmap(&mut self, va: u64) -> Result<()> {
        self.host.unmap(va)
    }
    fn read(&mut self, va: u64, out: &mut [u8]) -> Result<()> {
        self.host.read(va, out)
    }
    fn write(&mut self, va: u64, data: &[u8]) -> Result<()> {
        self.host.write(va, data)
    }
    fn fill(&mut self, va: u64, value: u8, count: u64) -> Result<()> {
        self.host.fill(va, value, count)
    }
    fn copy(&mut self, dst: u64, src: u64, count: u64) -> Result<()> {
        self.host.copy(dst, src, count)
    }
    fn mem_info(&self, scope: MemScope) -> (u64, u64) {
        self.host.mem_info(scope)
    }
    fn translate(&self, va: u64) -> Result<Translation> {
        self.host.translate(va)
    }
    fn counters(&self) -> BackendCounters {
        self.host.counters()
    }
    fn mapping_containing(&self, va: u64) -> Option<(u64, PhysHandle, u64)> {
        self.host.mapping_containing(va)
    }
    fn window(&self) -> (u64, u64) {
        self.host.window()
    }
    fn owns(&self, va: u64) -> bool {
        self.host.owns(va)
    }
    fn host_accessible(&self) -> bool {
        true
    }
    fn streams(&mut self) -> &mut dyn RuntimeStreams {
        &mut self.rt
    }
}

fn device() -> (Device, TestRuntime) {
    let rt = TestRuntime::default();
    rt.0.lock().unwrap().streams.insert(0, (VecDeque::new(), 0));
    let host = HostBackend::new(HostConfig { capacity: 256 * MIB }).unwrap();
    let backend = QueuedHost { host, rt: rt.clone() };
    let allocator = VmmAllocator::new(Default::default(), 256 * MIB);
    (Device::with_parts(Box::new(backend), Box::new(allocator)), rt)
}

#[test]
fn the_runtime_moves_the_bytes_of_async_copies() {
    let (mut d, rt) = device();
    let s = d.create_stream().unwrap();
    let p = d.malloc(MIB, npumem_core::Policy::HugeFirst).unwrap();
    let host = d.malloc_host(MIB).unwrap();
    d.write(host, &[7u8; 16]).unwrap();
    d.memcpy_async(p, MIB, host, MIB, 1, s).unwrap();
    d.memset_async(p + 8, 8, 9, 8, s).unwrap();
    // The simulated clock may say done; the runtime has run nothing yet.
    d.scheduler().advance(1 << 40);
    let mut out = [0u8; 16];
    d.read(p, &mut out).unwrap();
    assert_eq!(out, [0u8; 16], "the runtime has not run the copy");
    assert_eq!(rt.pending_ops(), 2);
    d.synchronize_stream(s).unwrap();
    d.read(p, &mut out).unwrap();
    assert_eq!(out, [7, 7, 7, 7, 7, 7, 7, 7, 9, 9, 9, 9, 9, 9, 9, 9]);
    assert_eq!(d.stats().lost_effects, 0);
}

#[test]
fn a_block_freed_under_queued_runtime_work_waits_for_the_runtime_event() {
    let (mut d, rt) = device();
    let (s1, s2) = (d.create_stream().unwrap(), d.create_stream().unwrap());
    let host = d.malloc_host(MIB).unwrap();
    let p = d.malloc_on(MIB, npumem_core::Policy::HugeFirst, true, s1).unwrap();
    d.memcpy_async(p, MIB, host, MIB, 1, s1).unwrap();
    d.free(p).unwrap();
    d.scheduler().advance(1 << 40); // the simulated clock has long finished the copy
    let q = d.malloc_on(MIB, npumem_core::Policy::HugeFirst, true, s2).unwrap();
    assert_ne!(q, p, "another stream took the block while the runtime still copied into it");
    assert_eq!(d.stats().pending_frees, 1);
    rt.run_all(); // the runtime finishes; the next call settles and reaps
    let r = d.malloc_on(MIB, npumem_core::Policy::HugeFirst, true, s2).unwrap();
    assert_eq!((r, d.stats().pending_frees), (p, 0), "reusable once the runtime's event completed");
    for x in [q, r] {
        d.free(x).unwrap();
    }
    d.free_host(host).unwrap();
    d.synchronize_device().unwrap();
    assert_eq!(rt.live_events(), 0, "every mark the device recorded is destroyed");
}

#[test]
fn its_own_stream_takes_the_block_back_at_once() {
    let (mut d, rt) = device();
    let s = d.create_stream().unwrap();
    let host = d.malloc_host(MIB).unwrap();
    let p = d.malloc_on(MIB, npumem_core::Policy::HugeFirst, true, s).unwrap();
    d.memcpy_async(p, MIB, host, MIB, 1, s).unwrap();
    d.free(p).unwrap();
    let q = d.malloc_on(MIB, npumem_core::Policy::HugeFirst, true, s).unwrap();
    assert_eq!(q, p, "stream order puts the new work after the old");
    assert_eq!(d.stats().same_stream_reuses, 1);
    d.free(q).unwrap();
    d.free_host(host).unwrap();
    d.synchronize_device().unwrap();
    assert_eq!((rt.pending_ops(), rt.live_events()), (0, 0));
}

#[test]
fn events_and_waits_go_to_the_runtime() {
    let (mut d, rt) = device();
    let (a, b) = (d.create_stream().unwrap(), d.create_stream().unwrap());
    let host = d.malloc_host(MIB).unwrap();
    d.write(host, &[5u8; 4]).unwrap();
    let p = d.malloc(MIB, npumem_core::Policy::HugeFirst).unwrap();
    let q = d.malloc(MIB, npumem_core::Policy::HugeFirst).unwrap();
    d.memcpy_async(p, 4, host, 4, 1, a).unwrap();
    let e = d.create_event().unwrap();
    d.record_event(e, a).unwrap();
    d.stream_wait_event(b, e).unwrap();
    d.memcpy_async(q, 4, p, 4, 3, b).unwrap();
    d.scheduler().advance(1 << 40);
    assert!(!d.query_event(e).unwrap(), "the runtime's event decides");
    d.synchronize_event(e).unwrap();
    assert!(d.query_event(e).unwrap());
    d.synchronize_stream(b).unwrap();
    let mut out = [0u8; 4];
    d.read(q, &mut out).unwrap();
    assert_eq!(out, [5; 4], "b waited for a's copy before copying on");
    d.destroy_event(e).unwrap();
    d.destroy_stream(a).unwrap();
    d.destroy_stream(b).unwrap();
    assert_eq!(rt.live_events(), 0);
}
