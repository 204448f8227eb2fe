//! The devices behind the C ABI: one `Device` per device index `0..MAX_DEVICES`, created on
//! first use from the environment's configuration, each behind its own mutex (calls on one
//! device are serialised; calls on different devices run in parallel), each with its table of
//! streams: every distinct opaque `void* stream` value a caller passes becomes an npumem stream
//! on first sight (NULL is the default stream).
//!
//! Invariants: a slot holds a device only once it was built successfully; no thread ever holds
//! two slot locks at once (so no call can deadlock); a slot whose lock was poisoned by a panic
//! refuses every later call with an internal error instead of using a device a panic may have
//! left half-updated; a device's stream table holds at most `MAX_STREAMS` streams.

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};

use npumem_core::backend::{Backend, HostBackend, HostConfig};
use npumem_core::sanitizer::SanitizerMode;
use npumem_core::stream::{DEFAULT_STREAM, StreamId};
use npumem_core::vm::{PageKind, PageSize};
use npumem_core::{AclError, BackendKind, Device, Result};
use rustc_hash::FxHashMap;

use crate::config::Config;

/// Device indices accepted: `0..MAX_DEVICES` (`NPUMEM_MAX_DEVICES` in npumem.h).
pub const MAX_DEVICES: usize = 64;

/// Distinct stream values one device maps before refusing new ones (a framework uses a few
/// dozen; more means the caller passes something that is not a stream).
pub const MAX_STREAMS: usize = 1 << 16;

/// One device and the streams its callers named.
pub struct Slot {
    pub device: Device,
    streams: FxHashMap<usize, StreamId>,
}

impl Slot {
    fn new(config: &Config) -> Result<Slot> {
        let normal_page = match config.backend {
            BackendKind::Host => {
                HostBackend::new(HostConfig { capacity: config.capacity })?.page_size(PageKind::Normal)
            }
            BackendKind::Sim => PageSize::Size4K,
        };
        let mut device = Device::new(config.device_config(normal_page))?;
        // The C ABI has no way to read sanitizer findings: do not collect them.
        device.set_sanitizer(SanitizerMode::Off);
        Ok(Slot { device, streams: FxHashMap::default() })
    }

    /// The npumem stream for the caller's `stream` value, created on first sight.
    pub fn stream(&mut self, stream: *mut c_void) -> Result<StreamId> {
        let key = stream.addr();
        if key == 0 {
            return Ok(DEFAULT_STREAM);
        }
        if let Some(&id) = self.streams.get(&key) {
            return Ok(id);
        }
        if self.streams.len() >= MAX_STREAMS {
            return Err(AclError::rt_param(format!(
                "stream {stream:p} would be this device's stream number {}; npumem maps at most {MAX_STREAMS} distinct \
                 stream values per device: pass the framework's stream handles (or NULL for the default stream)",
                MAX_STREAMS + 1
            )));
        }
        // The framework's stream handle is the runtime's (aclrtStream / CUstream) on an
        // accelerator backend: npumem orders its frees on it and never destroys it.
        let id = self.device.adopt_stream(key as u64);
        self.streams.insert(key, id);
        Ok(id)
    }
}

static CONFIG: OnceLock<Result<Config>> = OnceLock::new();
static SLOTS: [Mutex<Option<Slot>>; MAX_DEVICES] = [const { Mutex::new(None) }; MAX_DEVICES];
/// Bit i is set once device i exists (devices are never dropped).
static CREATED: AtomicU64 = AtomicU64::new(0);

/// The configuration, read from the environment on the first call.
pub fn config() -> Result<&'static Config> {
    CONFIG.get_or_init(Config::from_env).as_ref().map_err(Clone::clone)
}

/// Checks a caller's device index.
pub fn index(device: c_int) -> Result<usize> {
    usize::try_from(device).ok().filter(|&i| i < MAX_DEVICES).ok_or_else(|| {
        AclError::invalid_param(format!(
            "device {device} is out of range: npumem serves devices 0 to {}",
            MAX_DEVICES - 1
        ))
    })
}

fn lock(index: usize) -> Result<MutexGuard<'static, Option<Slot>>> {
    SLOTS[index].lock().map_err(|_| {
        AclError::internal(format!(
            "device {index} is unusable: an earlier call on it panicked (a bug in npumem; please report it). \
             Other devices still work"
        ))
    })
}

/// Runs `f` on device `device`, creating it first if this is its first use.
pub fn with_device<T>(device: c_int, f: impl FnOnce(&mut Slot) -> Result<T>) -> Result<T> {
    let i = index(device)?;
    let mut guard = lock(i)?;
    let slot = match guard.as_mut() {
        Some(slot) => slot,
        None => {
            let config = config()?;
            let slot = Slot::new(config).map_err(|e| {
                AclError::new(e.code, format!("cannot create device {i} with {}: {}", config.describe(), e.message))
            })?;
            CREATED.fetch_or(1 << i, Ordering::Release);
            guard.insert(slot)
        }
    };
    f(slot)
}

/// The indices of the devices created so far.
pub fn created() -> impl Iterator<Item = usize> {
    let bits = CREATED.load(Ordering::Acquire);
    (0..MAX_DEVICES).filter(move |i| bits & (1 << i) != 0)
}

/// Runs `f` on every device created so far, one lock at a time; returns the first error after
/// trying them all.
pub fn each_device(mut f: impl FnMut(usize, &mut Slot) -> Result<()>) -> Result<()> {
    let mut first = Ok(());
    for i in created() {
        let outcome = lock(i).and_then(|mut guard| match guard.as_mut() {
            Some(slot) => f(i, slot),
            None => Ok(()),
        });
        if first.is_ok() {
            first = outcome;
        }
    }
    first
}

/// The created device (other than `except`) with a live allocation starting at `ptr`.
pub fn owner_of(ptr: u64, except: Option<usize>) -> Option<usize> {
    created()
        .filter(|&i| Some(i) != except)
        .find(|&i| lock(i).is_ok_and(|guard| guard.as_ref().is_some_and(|slot| slot.device.allocation(ptr).is_some())))
}
