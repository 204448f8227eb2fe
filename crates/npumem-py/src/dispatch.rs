//! `_bind_methods(cls)`: gives a Python subclass of `Device` (`npumem.Device`, and subclasses
//! of it) method descriptors of its own for the native methods it inherits.
//!
//! CPython specialises a call of a method descriptor (`dev.malloc(n)`) only where `type(self)`
//! is the descriptor's own class: an instance of a subclass calling the base class's descriptor
//! takes the generic call path every time (about 18 ns more a call on CPython 3.11, as much as
//! a `Device.buffer` spends in the device). A descriptor made for the subclass from the same
//! method definition (PyO3 keeps those for the life of the process) is specialised like the
//! base's on the base: the same function, argument parsing and checks, only dispatched faster.
//!
//! Invariants: only plain method descriptors of the native `Device` are copied, under their
//! own names, and only where the name still resolves to one (a method the subclass or a class
//! between overrides is left alone); the call checks, as before, that `self` is a `Device`.

use pyo3::exceptions::PyTypeError;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString, PyType};

use crate::device::PyDevice;

/// The method definition behind `obj` when it is a plain method descriptor.
fn method_def(obj: &Bound<'_, PyAny>) -> Option<*mut ffi::PyMethodDef> {
    // SAFETY: `obj` is a live object; only its type is read before the layout is relied on.
    let is_descr = unsafe { std::ptr::eq(ffi::Py_TYPE(obj.as_ptr()), &raw mut ffi::PyMethodDescr_Type) };
    // SAFETY: an object of exactly `PyMethodDescr_Type` is a `PyMethodDescrObject`.
    is_descr.then(|| unsafe { (*obj.as_ptr().cast::<ffi::PyMethodDescrObject>()).d_method })
}

/// Gives `cls`, a subclass of `Device`, its own descriptors for the native methods it inherits.
#[pyfunction]
pub fn _bind_methods(cls: &Bound<'_, PyType>) -> PyResult<()> {
    let py = cls.py();
    let base = py.get_type::<PyDevice>();
    if cls.is(&base) || !cls.is_subclass(&base)? {
        return Err(PyTypeError::new_err("_bind_methods takes a subclass of npumem._native.Device"));
    }
    let methods = base.getattr("__dict__")?.call_method0("copy")?.cast_into::<PyDict>()?;
    for (name, native) in methods.iter() {
        let Some(def) = method_def(&native) else { continue };
        let name = name.cast_into::<PyString>()?;
        // Rebound only where the name still reaches this native method (not overridden).
        if method_def(&cls.getattr(&name)?) != Some(def) {
            continue;
        }
        // SAFETY: `cls` is a live type object; `def` is PyO3's method definition for the
        // native class, kept for the life of the process.
        let descr = unsafe { Bound::from_owned_ptr_or_err(py, ffi::PyDescr_NewMethod(cls.as_type_ptr(), def))? };
        cls.setattr(name, descr)?;
    }
    Ok(())
}
