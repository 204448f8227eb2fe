//! `npumem._native.DeviceBuffer`: an allocation that owns its block, made by `Device.buffer` in
//! one call and freed when the object is collected (like `HostPool.buffer`, or `np.empty`).
//!
//! Invariants: while the object lives, its allocation is held in the device (a plain `free` of
//! its pointer is refused), so the block is freed exactly once, by the object's destructor, and
//! never after its address was reused; the object holds its device, so the device outlives it.
//! It converts to its pointer (`int(buf)`, `operator.index`), so it goes wherever a pointer
//! does; on a backend whose memory is this process's (`backend="host"`) it exports its bytes
//! through the buffer protocol (each export pins the block too).

use std::ffi::{c_int, c_void};

use pyo3::ffi;
use pyo3::prelude::*;

use crate::device::PyDevice;
use crate::errors::to_py;
use crate::export::fill_buffer;

// No PyO3 free list: its mutex costs more than CPython's own small-object allocator.
#[pyclass(name = "DeviceBuffer", module = "npumem._native", frozen)]
pub struct DeviceBuffer {
    device: Py<PyDevice>,
    ptr: u64,
    len: u64,
}

impl DeviceBuffer {
    /// Owns the live allocation of `len` bytes at `ptr`, already held in `device`.
    pub fn new(device: Py<PyDevice>, ptr: u64, len: u64) -> Self {
        DeviceBuffer { device, ptr, len }
    }
}

#[pymethods]
impl DeviceBuffer {
    unsafe fn __getbuffer__(slf: Bound<'_, Self>, view: *mut ffi::Py_buffer, flags: c_int) -> PyResult<()> {
        let (ptr, len) = (slf.get().ptr, slf.get().len);
        let py = slf.py();
        let size = usize::try_from(len)
            .map_err(|_| to_py(py, npumem_core::AclError::invalid_param("the buffer is larger than memory")))?;
        // Refused (with the reason) where the memory is not this process's (the simulator).
        slf.get().device.get().lock_inner().pin(ptr, len).map_err(|e| to_py(py, e))?;
        // SAFETY: `size` bytes at `ptr` are a live allocation of the host backend, mapped
        // read-write in this process while this exporter (which the view references) holds it.
        let filled = unsafe { fill_buffer(slf.as_any(), view, ptr as *mut c_void, size, flags) };
        if filled.is_err() {
            slf.get().device.get().lock_inner().unpin(ptr);
        }
        filled
    }

    unsafe fn __releasebuffer__(&self, _view: *mut ffi::Py_buffer) {
        self.device.get().lock_inner().unpin(self.ptr);
    }

    fn __len__(&self) -> usize {
        usize::try_from(self.len).unwrap_or(usize::MAX)
    }

    fn __index__(&self) -> u64 {
        self.ptr
    }

    fn __int__(&self) -> u64 {
        self.ptr
    }

    fn __repr__(&self) -> String {
        format!("DeviceBuffer(ptr={:#x}, nbytes={})", self.ptr, self.len)
    }

    /// The block's device pointer.
    #[getter]
    fn ptr(&self) -> u64 {
        self.ptr
    }

    /// Bytes asked for.
    #[getter]
    fn nbytes(&self) -> u64 {
        self.len
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        // A destructor cannot raise: a free the driver refuses leaves the block to the device's
        // leak report (the device counts it live).
        let _ = self.device.get().lock_inner().free_held(self.ptr);
    }
}
