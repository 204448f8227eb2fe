//! Exporting memory through the buffer protocol: one `__getbuffer__` body for every exporter
//! (`HostBlock`, `DeviceView`, and the raw `DeviceBuffer` type).
//!
//! - An exporter exports `len` writable bytes at one address, valid while it lives; each view
//!   holds a reference to it, so no view outlives the memory.
//! - A pyclass exporter implements `Exported` and gets `__getbuffer__`, `__releasebuffer__` and
//!   `__len__` from `buffer_exporter!`.

use std::ffi::{c_int, c_void};

use pyo3::exceptions::PyBufferError;
use pyo3::ffi;
use pyo3::prelude::*;

/// Memory a pyclass exports through the buffer protocol.
///
/// # Safety
/// `memory()` returns `(ptr, len)` of `len` bytes that stay valid and writable while the object
/// lives, and the same pair on every call.
pub unsafe trait Exported {
    fn memory(&self) -> (*mut c_void, usize);
}

/// Gives a frozen pyclass that implements `Exported` the buffer protocol and `len()`.
macro_rules! buffer_exporter {
    ($ty:ty) => {
        // PyO3's trampolines call these `unsafe fn`s outside an `unsafe` block when the impl
        // comes from a macro; the calls are PyO3's own, made under the protocol's contract.
        #[allow(unsafe_op_in_unsafe_fn)]
        const _: () = {
            #[pyo3::pymethods]
            impl $ty {
                unsafe fn __getbuffer__(
                    slf: pyo3::Bound<'_, Self>,
                    view: *mut pyo3::ffi::Py_buffer,
                    flags: std::ffi::c_int,
                ) -> pyo3::PyResult<()> {
                    let (ptr, len) = $crate::export::Exported::memory(slf.get());
                    // SAFETY: `Exported` promises `len` writable bytes at `ptr` for the life of
                    // this exporter, which every view references.
                    unsafe { $crate::export::fill_buffer(slf.as_any(), view, ptr, len, flags) }
                }

                unsafe fn __releasebuffer__(&self, _view: *mut pyo3::ffi::Py_buffer) {}

                fn __len__(&self) -> usize {
                    $crate::export::Exported::memory(self).1
                }
            }
        };
    };
}
pub(crate) use buffer_exporter;

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
