//! `SharedDevice`: the core device behind one mutex, shared by a `Device` object and the
//! `DeviceBuffer`s it made, with the count of its holders kept under that same mutex.
//!
//! An `Arc` would cost two atomic operations per buffer (its count up when the buffer is made,
//! down when it goes) on top of the mutex that the buffer's malloc and free take anyway; here a
//! new holder is counted inside the critical section that makes the buffer (`Locked::share`)
//! and released inside the one that frees it (`SharedDevice::release_with`), so the count costs
//! no atomic of its own.
//!
//! Invariants: `holders` is the number of live `SharedDevice` values pointing at the box, read
//! and written only with the mutex held; the box is freed by the holder that takes the count to
//! zero, after unlocking, when no other holder exists to reach it. The device is only ever
//! reached through the mutex.

use std::ops::{Deref, DerefMut};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::ptr::NonNull;

use npumem_core::Device;
use parking_lot::{Mutex, MutexGuard};

struct Holders {
    device: Device,
    holders: usize,
}

/// One holder of the shared core device.
pub struct SharedDevice {
    shared: NonNull<Mutex<Holders>>,
}

// SAFETY: the device is reached only through the mutex (`Device` is `Send`), and the count that
// decides when the box is freed is kept under that mutex, so holders on any threads agree.
unsafe impl Send for SharedDevice {}
// SAFETY: as above; `&SharedDevice` gives nothing but locking.
unsafe impl Sync for SharedDevice {}

/// The device, locked; derefs to it.
pub struct Locked<'a> {
    guard: MutexGuard<'a, Holders>,
    shared: NonNull<Mutex<Holders>>,
}

impl SharedDevice {
    /// The first holder of `device`.
    pub fn new(device: Device) -> Self {
        let boxed = Box::new(Mutex::new(Holders { device, holders: 1 }));
        SharedDevice { shared: NonNull::from(Box::leak(boxed)) }
    }

    fn mutex(&self) -> &Mutex<Holders> {
        // SAFETY: the box lives while this holder, counted in it, does.
        unsafe { self.shared.as_ref() }
    }

    /// Locks the device.
    pub fn lock(&self) -> Locked<'_> {
        Locked { guard: self.mutex().lock(), shared: self.shared }
    }

    /// Runs `f` on the locked device and gives up this holder in the same critical section
    /// (freeing the device when it was the last). A panic in `f` is caught; the holder is given
    /// up all the same.
    pub fn release_with<T>(self, f: impl FnOnce(&mut Device) -> T) -> Option<T> {
        let this = std::mem::ManuallyDrop::new(self);
        // SAFETY: `this` is a live holder, given up here and never used again.
        unsafe { release(this.shared, f) }
    }
}

/// Runs `f` on the locked device, then gives up a holder (freeing the box if it was the last).
///
/// # Safety
/// `shared` belongs to a live holder that the caller gives up by this call.
unsafe fn release<T>(shared: NonNull<Mutex<Holders>>, f: impl FnOnce(&mut Device) -> T) -> Option<T> {
    let (result, last) = {
        // SAFETY: the box lives while the caller's holder, counted in it, does.
        let mut guard = unsafe { shared.as_ref() }.lock();
        let result = catch_unwind(AssertUnwindSafe(|| f(&mut guard.device))).ok();
        guard.holders -= 1;
        (result, guard.holders == 0)
    };
    if last {
        // SAFETY: the count reached zero: no other holder exists, none can be made (making one
        // needs a holder), and the lock is released; the box came from `Box::leak`.
        drop(unsafe { Box::from_raw(shared.as_ptr()) });
    }
    result
}

impl Drop for SharedDevice {
    fn drop(&mut self) {
        // SAFETY: this holder is going away.
        unsafe { release(self.shared, |_| ()) };
    }
}

impl Locked<'_> {
    /// A new holder of the device, counted under this lock.
    pub fn share(&mut self) -> SharedDevice {
        self.guard.holders += 1;
        SharedDevice { shared: self.shared }
    }
}

impl Deref for Locked<'_> {
    type Target = Device;
    fn deref(&self) -> &Device {
        &self.guard.device
    }
}

impl DerefMut for Locked<'_> {
    fn deref_mut(&mut self) -> &mut Device {
        &mut self.guard.device
    }
}
