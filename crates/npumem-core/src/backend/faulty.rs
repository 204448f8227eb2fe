//! `FaultyBackend`: any backend with driver failures injected on demand, to test that every
//! allocator survives them: the Nth physical allocation, map or unmap from now fails, as a
//! real driver's `aclrtMallocPhysical` / `aclrtMapMem` / `aclrtUnmapMem` can.
//!
//! A physical allocation fails with out-of-memory (207001) or, when asked, with a driver error
//! (507899); a map or unmap fails with a driver error. A failed call reaches nothing below: the
//! wrapped backend is left exactly as it was, so the caller sees a clean failure it must undo
//! its own steps after.
//!
//! Invariants: each armed countdown fires once (at its Nth call, counting calls of its kind
//! from when it was armed) and then disarms; the other calls pass through unchanged; `injected`
//! counts what fired. The countdowns live in a [`FaultInjector`] the wrapper shares with whoever
//! made it (the device keeps one to arm and read them): the [`Backend`] trait knows nothing of
//! faults.

use std::sync::Arc;

use parking_lot::Mutex;

use super::{Backend, BackendCounters, PhysHandle};
use crate::acl::MemScope;
use crate::error::{AclError, ErrorCode, Result};
use crate::vm::{FrameStats, PageKind, PageSize, PageTableStats, Translation};

/// Which calls fail: `Some(n)` makes the nth call of that kind from now fail (1 = the next).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FaultPlan {
    pub physical_alloc: Option<u64>,
    pub map: Option<u64>,
    pub unmap: Option<u64>,
    /// A failed physical allocation reports a driver error instead of out-of-memory.
    pub driver_error: bool,
}

/// Faults injected so far, by kind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FaultCounts {
    pub physical_alloc: u64,
    pub map: u64,
    pub unmap: u64,
}

#[derive(Default)]
struct FaultState {
    plan: FaultPlan,
    injected: FaultCounts,
}

/// A handle on the countdowns of one [`FaultyBackend`]: clones share them.
#[derive(Clone, Default)]
pub struct FaultInjector(Arc<Mutex<FaultState>>);

pub struct FaultyBackend {
    inner: Box<dyn Backend>,
    injector: FaultInjector,
}

/// Counts a call down; true when it is the one that fails.
fn fires(countdown: &mut Option<u64>) -> bool {
    match countdown {
        Some(1) => {
            *countdown = None;
            true
        }
        Some(n) => {
            *n -= 1;
            false
        }
        None => false,
    }
}

impl FaultInjector {
    /// Arms the countdowns of `plan` (replacing those armed before).
    pub fn arm(&self, plan: FaultPlan) -> Result<()> {
        for (what, n) in [("physical_alloc", plan.physical_alloc), ("map", plan.map), ("unmap", plan.unmap)] {
            if n == Some(0) {
                return Err(AclError::invalid_param(format!(
                    "{what}=0: the countdown names the call that fails, 1 for the next one; pass None for never"
                )));
            }
        }
        self.0.lock().plan = plan;
        Ok(())
    }

    /// The countdowns still armed.
    pub fn plan(&self) -> FaultPlan {
        self.0.lock().plan
    }

    pub fn injected(&self) -> FaultCounts {
        self.0.lock().injected
    }
}

impl FaultyBackend {
    pub fn new(inner: Box<dyn Backend>) -> Self {
        FaultyBackend { inner, injector: FaultInjector::default() }
    }

    /// The handle that arms and reads this backend's countdowns.
    pub fn injector(&self) -> FaultInjector {
        self.injector.clone()
    }
}

impl Backend for FaultyBackend {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn page_size(&self, kind: PageKind) -> PageSize {
        self.inner.page_size(kind)
    }

    fn reserve(&mut self, size: u64, align: u64, hint: Option<u64>) -> Result<u64> {
        self.inner.reserve(size, align, hint)
    }

    fn release(&mut self, va: u64) -> Result<()> {
        self.inner.release(va)
    }

    fn create_physical(&mut self, size: u64, kind: PageKind) -> Result<PhysHandle> {
        let mut state = self.injector.0.lock();
        if fires(&mut state.plan.physical_alloc) {
            state.injected.physical_alloc += 1;
            let what =
                format!("injected fault: the physical allocation of {size} bytes ({} pages) failed", kind.label());
            return Err(if state.plan.driver_error {
                AclError::new(ErrorCode::RtDrvInternal, what)
            } else {
                AclError::oom(what)
            });
        }
        drop(state);
        self.inner.create_physical(size, kind)
    }

    fn free_physical(&mut self, handle: PhysHandle) -> Result<()> {
        self.inner.free_physical(handle)
    }

    fn map(&mut self, va: u64, handle: PhysHandle) -> Result<()> {
        let mut state = self.injector.0.lock();
        if fires(&mut state.plan.map) {
            state.injected.map += 1;
            return Err(AclError::new(
                ErrorCode::RtDrvInternal,
                format!("injected fault: mapping handle {handle} at {va:#x} failed"),
            ));
        }
        drop(state);
        self.inner.map(va, handle)
    }

    fn unmap(&mut self, va: u64) -> Result<()> {
        let mut state = self.injector.0.lock();
        if fires(&mut state.plan.unmap) {
            state.injected.unmap += 1;
            return Err(AclError::new(ErrorCode::RtDrvInternal, format!("injected fault: unmapping {va:#x} failed")));
        }
        drop(state);
        self.inner.unmap(va)
    }

    fn read(&mut self, va: u64, out: &mut [u8]) -> Result<()> {
        self.inner.read(va, out)
    }

    fn write(&mut self, va: u64, data: &[u8]) -> Result<()> {
        self.inner.write(va, data)
    }

    fn fill(&mut self, va: u64, value: u8, count: u64) -> Result<()> {
        self.inner.fill(va, value, count)
    }

    fn copy(&mut self, dst: u64, src: u64, count: u64) -> Result<()> {
        self.inner.copy(dst, src, count)
    }

    fn mem_info(&self, scope: MemScope) -> (u64, u64) {
        self.inner.mem_info(scope)
    }

    fn translate(&self, va: u64) -> Result<Translation> {
        self.inner.translate(va)
    }

    fn counters(&self) -> BackendCounters {
        self.inner.counters()
    }

    fn mapping_containing(&self, va: u64) -> Option<(u64, PhysHandle, u64)> {
        self.inner.mapping_containing(va)
    }

    fn window(&self) -> (u64, u64) {
        self.inner.window()
    }

    fn owns(&self, va: u64) -> bool {
        self.inner.owns(va)
    }

    fn holds(&self, va: u64) -> bool {
        self.inner.holds(va)
    }

    fn host_accessible(&self) -> bool {
        self.inner.host_accessible()
    }

    fn streams(&mut self) -> &mut dyn crate::stream::RuntimeStreams {
        self.inner.streams()
    }

    fn driver_calls(&self) -> u64 {
        self.inner.driver_calls()
    }

    fn stranded(&self) -> (u64, u64) {
        self.inner.stranded()
    }

    fn reclaim_stranded(&mut self) -> Result<()> {
        self.inner.reclaim_stranded()
    }

    fn take_warnings(&mut self) -> Vec<String> {
        self.inner.take_warnings()
    }

    fn malloc_host(&mut self, size: u64) -> Option<Result<u64>> {
        self.inner.malloc_host(size)
    }

    fn free_host(&mut self, addr: u64) -> Result<()> {
        self.inner.free_host(addr)
    }

    fn frame_stats(&self) -> Option<FrameStats> {
        self.inner.frame_stats()
    }

    fn page_table_stats(&self) -> Option<PageTableStats> {
        self.inner.page_table_stats()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{SimBackend, SimConfig};
    use crate::units::MIB;

    #[test]
    fn the_nth_call_fails_once_and_changes_nothing_below() {
        let sim = SimBackend::new(SimConfig { capacity: 64 * MIB, ..Default::default() }).unwrap();
        let mut b = FaultyBackend::new(Box::new(sim));
        let faults = b.injector();
        faults.arm(FaultPlan { physical_alloc: Some(2), map: Some(1), ..Default::default() }).unwrap();
        let h = b.create_physical(2 * MIB, PageKind::Huge).unwrap();
        let err = b.create_physical(2 * MIB, PageKind::Huge).unwrap_err();
        assert!(err.code.is_out_of_memory() && err.message.contains("injected"));
        let va = b.reserve(2 * MIB, 2 * MIB, None).unwrap();
        let before = b.counters();
        assert_eq!(b.map(va, h).unwrap_err().code, ErrorCode::RtDrvInternal);
        assert_eq!(b.counters(), before, "the failed map reached nothing");
        b.map(va, h).unwrap();
        assert_eq!(faults.injected(), FaultCounts { physical_alloc: 1, map: 1, unmap: 0 });
        assert_eq!(faults.plan(), FaultPlan::default(), "fired countdowns disarm");
        assert!(faults.arm(FaultPlan { unmap: Some(0), ..Default::default() }).is_err());
        faults.arm(FaultPlan { unmap: Some(1), ..Default::default() }).unwrap();
        assert!(b.unmap(va).is_err());
        b.unmap(va).unwrap();
        b.free_physical(h).unwrap();
        b.release(va).unwrap();
        assert_eq!(b.mem_info(MemScope::All).0, 64 * MIB);
    }
}
