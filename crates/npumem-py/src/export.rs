//! Exporting memory through the buffer protocol: the one `__getbuffer__` body of every exporter
//! (`HostBlock`, `DeviceView`).

use std::ffi::{c_int, c_void};

use pyo3::exceptions::PyBufferError;
use pyo3::ffi;
use pyo3::prelude::*;

/// Fills `view` with `len` writable bytes at `ptr`, owned by `exporter`.
///
/// # Safety
/// `view` comes from Python's `__getbuffer__` protocol, and `len` bytes at `ptr` must stay valid
/// and writable while `exporter` lives (`PyBuffer_FillInfo` takes a reference to it for the life
/// of the buffer).
pub unsafe fn fill_buffer(
    exporter: &Bound<'_, PyAny>,
    view: *mut ffi::Py_buffer,
    ptr: *mut c_void,
    len: usize,
    flags: c_int,
) -> PyResult<()> {
    if view.is_null() {
        return Err(PyBufferError::new_err("a NULL view was passed to __getbuffer__"));
    }
    // SAFETY: the caller guarantees the memory outlives the exporter, which the view keeps.
    let rc = unsafe { ffi::PyBuffer_FillInfo(view, exporter.as_ptr(), ptr, len as isize, 0, flags) };
    if rc == -1 { Err(PyErr::fetch(exporter.py())) } else { Ok(()) }
}
