//! npumem-fake: the engine of npumem's stand-in accelerator runtimes. `npumem-fake-acl` builds
//! it into a `libascendcl.so` and `npumem-fake-cuda` into a `libcuda.so`, each exporting the real
//! C symbols with that runtime's argument rules and error codes, so that npumem's ACL and CUDA
//! backends are tested through `dlopen` on a machine with neither runtime.
//!
//! The engine is one device over host memory ([`memory`]), streams and events run by worker
//! threads ([`streams`]), a fault switch ([`faults`]) and counts of every live object, read from
//! the environment once ([`config`]). Each library holds one [`Runtime`] for the whole process,
//! as a real runtime does; the thread-local current device (`aclrtSetDevice`, `cuCtxSetCurrent`)
//! is kept here too.
//!
//! Invariants: no exported call unwinds into its C caller ([`guard`]); a call that fails —
//! through a bad argument or the fault switch — changes nothing; the live counts are exactly the
//! objects made and not yet given back.

pub mod config;
pub mod faults;
pub mod memory;
pub mod streams;

use std::cell::Cell;
use std::panic::{AssertUnwindSafe, catch_unwind};

use parking_lot::Mutex;

pub use config::{Config, Flavor};
pub use faults::{FaultKind, Faults};
pub use memory::{LiveCounts, Memory, Placement};
pub use streams::Streams;

/// Why a call failed, before each library turns it into its runtime's code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fail {
    /// A bad argument (a zero size, a flag that must be 0, a NULL out-pointer).
    InvalidValue,
    /// A runtime-level bad value (a count above the destination's size).
    RtParam,
    /// Out of device memory (or of address space).
    OutOfMemory,
    /// An unknown or freed handle (physical allocation, stream, event).
    InvalidHandle,
    /// An address that breaks an alignment rule.
    Unaligned,
    /// A map outside every reservation.
    NotReserved,
    /// A map over a mapped range.
    AlreadyMapped,
    /// A device address that is not mapped (or not the start of a mapping).
    NotMapped,
    /// A mapping that was never made accessible (CUDA's `cuMemSetAccess`).
    NoAccess,
    /// A reservation released with mappings in it.
    InUse,
    /// No current device or context on the calling thread.
    NoContext,
    /// A stream or event of another device than the calling thread's current one.
    WrongDevice,
    /// The runtime is not initialised (`aclInit`, `cuInit`).
    NotInitialized,
    /// A device ordinal that does not exist.
    InvalidDevice,
    /// Work queued on a stream failed when it ran.
    Async,
    /// The fault switch fired for a call of this kind.
    Injected(FaultKind),
    /// A panic inside the library (a bug in the stand-in).
    Internal,
}

/// One stand-in runtime: its configuration, memory, streams, events and fault switch.
pub struct Runtime {
    pub flavor: Flavor,
    pub config: Config,
    pub memory: Mutex<Memory>,
    pub faults: Faults,
    pub streams: Streams,
}

/// The 16–24 TiB window AscendCL places VA reservations in.
pub const ACL_WINDOW: (u64, u64) = (0x1000_0000_0000, 0x1800_0000_0000);

thread_local! {
    /// The device current on this thread (`aclrtSetDevice`, `cuCtxSetCurrent`).
    static CURRENT: Cell<Option<i32>> = const { Cell::new(None) };
}

/// The device current on the calling thread, if any (what streams and events belong to).
pub fn current_device() -> Option<i32> {
    CURRENT.get()
}

impl Runtime {
    pub fn new(flavor: Flavor) -> Runtime {
        let config = Config::from_env(flavor);
        let window = (flavor == Flavor::Acl).then_some(ACL_WINDOW);
        let faults = Faults::default();
        for &(kind, n) in &config.fail {
            faults.arm(kind, n);
        }
        Runtime {
            flavor,
            memory: Mutex::new(Memory::new(window, config.capacity)),
            streams: Streams::new(config.delay_us, flavor == Flavor::Cuda),
            faults,
            config,
        }
    }

    /// Fails with the injected fault when the switch fires for `kind`.
    pub fn fault(&self, kind: FaultKind) -> Result<(), Fail> {
        if self.faults.fires(kind) { Err(Fail::Injected(kind)) } else { Ok(()) }
    }

    /// Makes `device` current on this thread.
    pub fn set_current(&self, device: i32) -> Result<(), Fail> {
        if device < 0 || device as u32 >= self.config.devices {
            return Err(Fail::InvalidDevice);
        }
        CURRENT.set(Some(device));
        Ok(())
    }

    pub fn clear_current(&self) {
        CURRENT.set(None);
    }

    /// The device current on this thread.
    pub fn current(&self) -> Result<i32, Fail> {
        CURRENT.get().ok_or(Fail::NoContext)
    }

    /// Copies `len` bytes now (after checking every device byte is mapped, and the sides
    /// `want` names).
    pub fn copy(&self, dst: u64, src: u64, len: u64, want: Option<(bool, bool)>) -> Result<(), Fail> {
        self.fault(FaultKind::Memcpy)?;
        self.memory.lock().copy(dst, src, len, want)
    }

    /// Queues a copy on `stream`: checked now, checked again and run by the stream's worker.
    pub fn copy_async(
        &'static self,
        dst: u64,
        src: u64,
        len: u64,
        want: Option<(bool, bool)>,
        stream: u64,
    ) -> Result<(), Fail> {
        self.fault(FaultKind::Memcpy)?;
        {
            let m = self.memory.lock();
            let sides = (m.check(dst, len)?, m.check(src, len)?);
            if want.is_some_and(|w| w != sides) {
                return Err(Fail::InvalidValue);
            }
        }
        self.streams
            .enqueue(stream, Box::new(move || self.memory.lock().copy(dst, src, len, None).map_err(|_| Fail::Async)))
    }

    pub fn fill(&self, dst: u64, value: u8, len: u64, device_only: bool) -> Result<(), Fail> {
        self.fault(FaultKind::Memset)?;
        self.memory.lock().fill(dst, value, len, device_only)
    }

    /// Queues a memset on `stream`: checked now, checked again and run by the stream's worker.
    pub fn fill_async(
        &'static self,
        dst: u64,
        value: u8,
        len: u64,
        device_only: bool,
        stream: u64,
    ) -> Result<(), Fail> {
        self.fault(FaultKind::Memset)?;
        if !self.memory.lock().check(dst, len)? && device_only {
            return Err(Fail::InvalidValue);
        }
        self.streams
            .enqueue(stream, Box::new(move || self.memory.lock().fill(dst, value, len, false).map_err(|_| Fail::Async)))
    }

    pub fn live_counts(&self) -> LiveCounts {
        let (streams, events) = self.streams.counts();
        LiveCounts { streams, events, faults_fired: self.faults.fired(), ..self.memory.lock().counts() }
    }
}

/// Runs the body of an exported call; a panic becomes `fallback` instead of unwinding into C.
pub fn guard<T>(fallback: T, body: impl FnOnce() -> T) -> T {
    catch_unwind(AssertUnwindSafe(body)).unwrap_or(fallback)
}

/// Writes `value` through a caller's out-pointer, or fails for NULL.
///
/// # Safety
/// `out` is NULL or valid for a write of `T`.
pub unsafe fn put<T>(out: *mut T, value: T) -> Result<(), Fail> {
    if out.is_null() {
        return Err(Fail::InvalidValue);
    }
    // SAFETY: non-null, and valid for a write by the caller's contract.
    unsafe { out.write(value) };
    Ok(())
}

/// Arms the fault switch's countdown of the raw `kind` (`persists`: every call from the `n`th
/// on fails): 0, or -1 for an unknown kind.
pub fn arm_fault(faults: &Faults, kind: u32, n: u64, persists: bool) -> std::ffi::c_int {
    match FaultKind::from_raw(kind) {
        Some(k) if persists => faults.arm_from(k, n),
        Some(k) => faults.arm(k, n),
        None => return -1,
    }
    0
}

/// Exports the test-only calls of a stand-in library built on the runtime `$rt` (a static):
///
/// - `int npumem_fake_fail_next(uint32_t kind, uint64_t n)`: the fault switch — the `n`th call
///   of `kind` from now fails (1 = the next; 0 disarms). Kinds: 0 physical allocation, 1 map,
///   2 reserve, 3 unmap, 4 memcpy, 5 memset, 6 release, 7 free physical, 8 stream creation,
///   9 event creation, 10 memory information, 11 page-locked host allocation. Returns 0, or -1
///   for an unknown kind;
/// - `int npumem_fake_fail_from(uint32_t kind, uint64_t n)`: the same, but the `n`th call and
///   every later one fail until the kind is disarmed (a runtime that keeps refusing);
/// - `int npumem_fake_live_counts(struct LiveCounts* out)`: the live objects; 0, or -1 for NULL;
/// - `void npumem_fake_set_delay_us(uint64_t us)`: the delay of each queued operation.
#[macro_export]
macro_rules! export_test_hooks {
    ($rt:path) => {
        #[unsafe(no_mangle)]
        pub extern "C" fn npumem_fake_fail_next(kind: u32, n: u64) -> std::ffi::c_int {
            $crate::guard(-1, || $crate::arm_fault(&$rt.faults, kind, n, false))
        }

        #[unsafe(no_mangle)]
        pub extern "C" fn npumem_fake_fail_from(kind: u32, n: u64) -> std::ffi::c_int {
            $crate::guard(-1, || $crate::arm_fault(&$rt.faults, kind, n, true))
        }

        #[unsafe(no_mangle)]
        pub extern "C" fn npumem_fake_live_counts(out: *mut $crate::LiveCounts) -> std::ffi::c_int {
            // SAFETY: the caller passes NULL or a valid out-pointer.
            $crate::guard(-1, || unsafe { $crate::put(out, $rt.live_counts()) }.map_or(-1, |()| 0))
        }

        #[unsafe(no_mangle)]
        pub extern "C" fn npumem_fake_set_delay_us(us: u64) {
            $crate::guard((), || $rt.streams.set_delay_us(us));
        }
    };
}
