//! `DeviceCell`: the core `Device` of a Python `Device`, behind a mutex that short calls made
//! with the GIL held may skip.
//!
//! Invariants: the device is reached only through this type, and only by a thread attached to
//! the interpreter (each method takes a `Python` token) or inside one of its detached sections.
//! `detached` counts the detached sections in progress; it changes only while attached. With
//! the GIL held, no detached section in progress and the mutex free, no other thread can reach
//! the device until this one releases the GIL — attached threads wait for the GIL, and a
//! detached section counts itself (under the GIL) before it detaches — so `with` runs its
//! closure without the mutex's two atomic operations. The closure is plain Rust on the device:
//! it must not run Python code (which could hand the GIL to another thread). Where the
//! interpreter has no GIL (free-threaded builds), `with` always locks.

use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

use npumem_core::Device;
use parking_lot::{Mutex, MutexGuard};
use pyo3::Python;

pub struct DeviceCell {
    inner: Mutex<Device>,
    detached: AtomicUsize,
}

/// Uncounts a detached section once the thread is attached again (also when it unwinds).
struct Uncount<'a>(&'a [&'a DeviceCell]);

impl Drop for Uncount<'_> {
    fn drop(&mut self) {
        for cell in self.0 {
            cell.detached.fetch_sub(1, Relaxed);
        }
    }
}

impl DeviceCell {
    pub fn new(device: Device) -> Self {
        DeviceCell { inner: Mutex::new(device), detached: AtomicUsize::new(0) }
    }

    /// The device, locked, for a thread attached to the interpreter.
    pub fn lock(&self, _py: Python<'_>) -> MutexGuard<'_, Device> {
        self.inner.lock()
    }

    /// Runs `f` (plain Rust: no Python code) on the device; without the mutex when the GIL
    /// alone keeps every other thread out (see the module's invariants).
    #[inline]
    pub fn with<T>(&self, _py: Python<'_>, f: impl FnOnce(&mut Device) -> T) -> T {
        #[cfg(not(Py_GIL_DISABLED))]
        if self.detached.load(Relaxed) == 0 && !self.inner.is_locked() {
            // SAFETY: this thread holds the GIL (it is attached, on an interpreter with a GIL)
            // and keeps it while `f` runs (`f` runs no Python code); no detached section is in
            // progress (they are counted under the GIL) and no attached thread holds the mutex
            // (its lock was made before it last released the GIL, which this thread took
            // since). So no other reference to the device exists until `f` returns.
            return f(unsafe { &mut *self.inner.data_ptr() });
        }
        f(&mut self.inner.lock())
    }

    /// Runs `f` on the device (and on `peer`'s, locked in a fixed order, by address, so that
    /// concurrent calls cannot deadlock), detached from the interpreter if `detach`, so other
    /// Python threads run meanwhile.
    pub fn run_detached_if<T: Send>(
        &self,
        py: Python<'_>,
        detach: bool,
        f: impl FnOnce(&mut Device) -> T + Send,
    ) -> T {
        if !detach {
            return self.with(py, f);
        }
        self.detached.fetch_add(1, Relaxed);
        let _uncount = Uncount(std::slice::from_ref(&self));
        py.detach(|| f(&mut self.inner.lock()))
    }

    /// `run_detached_if` on two devices at once (a peer copy from `self` to `peer`).
    pub fn run_pair_detached_if<T: Send>(
        &self,
        peer: &DeviceCell,
        py: Python<'_>,
        detach: bool,
        f: impl FnOnce(&mut Device, &mut Device) -> T + Send,
    ) -> T {
        let work = || {
            let (mut a, mut b) = if (self as *const Self) < (peer as *const Self) {
                let a = self.inner.lock();
                (a, peer.inner.lock())
            } else {
                let b = peer.inner.lock();
                (self.inner.lock(), b)
            };
            f(&mut a, &mut b)
        };
        if !detach {
            return work();
        }
        let cells = [self, peer];
        for cell in cells {
            cell.detached.fetch_add(1, Relaxed);
        }
        let _uncount = Uncount(&cells);
        py.detach(work)
    }
}
