//! `npumem._native.DeviceView`: a direct view of a host-backend allocation's memory, exported
//! through the buffer protocol (`numpy.frombuffer` makes the zero-copy arrays of
//! `Device.to_numpy(..., copy=False)`).
//!
//! Invariant: while a view lives, its allocation is pinned in the device (a free is refused), so
//! the memory it exports stays mapped; the view holds its device, so the device outlives it.

use std::ffi::c_void;

use pyo3::prelude::*;

use crate::device::PyDevice;
use crate::export::{Exported, buffer_exporter};

#[pyclass(name = "DeviceView", module = "npumem._native", frozen)]
pub struct DeviceView {
    device: Py<PyDevice>,
    /// The pinned allocation's start.
    base: u64,
    ptr: u64,
    len: usize,
}

impl DeviceView {
    /// A view of `len` bytes at `ptr`, inside an allocation already pinned at `base`.
    pub fn new(device: Py<PyDevice>, base: u64, ptr: u64, len: usize) -> Self {
        DeviceView { device, base, ptr, len }
    }
}

// SAFETY: `len` bytes at `ptr` lie in a live, pinned allocation of the host backend, mapped
// read-write in this process while the pin, held until this view drops, lasts.
unsafe impl Exported for DeviceView {
    fn memory(&self) -> (*mut c_void, usize) {
        (self.ptr as *mut c_void, self.len)
    }
}

buffer_exporter!(DeviceView);

#[pymethods]
impl DeviceView {
    /// The viewed memory's address.
    #[getter]
    fn address(&self) -> u64 {
        self.ptr
    }
}

impl Drop for DeviceView {
    fn drop(&mut self) {
        self.device.get().lock_inner().unpin(self.base);
    }
}
