//! C-API methods installed over PyO3's for the hottest calls: `Device.malloc`, `Device.free`,
//! `Device.buffer`, `HostPool.empty` and `HostPool.zeros`, and npumem.acl's hot calls (`acl`).
//!
//! - A fast method serves only the plainest call (positional arguments of exact types: an exact
//!   int, for `empty`/`zeros` a dtype too) and hands every other call, as it came, to PyO3's
//!   method (kept at installation): conversions, defaults and errors stay exactly that method's.
//! - A value that an exact int cannot give (negative, too large) is forwarded too, so the
//!   message is PyO3's method's.
//! - No panic crosses into Python; an error is raised as the method's would be.
//! - The documentation and text signature are PyO3's method's.

use std::ffi::CStr;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::ptr;

use pyo3::exceptions::PyRuntimeError;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyType;

/// A fast method: `serve(py, self, positional args)` gives `None` for a call it leaves to
/// PyO3's method. `self` is an instance of the type the method is installed on (the method
/// descriptor checks it before the call), so `cast_unchecked` to that class is sound.
pub type Serve =
    for<'py> fn(Python<'py>, &Bound<'py, PyAny>, &[*mut ffi::PyObject]) -> Option<PyResult<Bound<'py, PyAny>>>;

/// One installed method: its name, its fast body and PyO3's method (set at installation).
pub struct FastMethod {
    pub name: &'static CStr,
    pub serve: Serve,
    pub general: PyOnceLock<Py<PyAny>>,
}

impl FastMethod {
    pub const fn new(name: &'static CStr, serve: Serve) -> Self {
        FastMethod { name, serve, general: PyOnceLock::new() }
    }
}

/// Installs `method` (a `static`, with its C entry point `entry`) on `ty` over PyO3's method of
/// the same name.
pub fn install(
    ty: &Bound<'_, PyType>,
    method: &'static FastMethod,
    entry: ffi::PyCFunctionFastWithKeywords,
) -> PyResult<()> {
    let py = ty.py();
    let name = method.name.to_str().expect("method names are ASCII");
    let general = ty.getattr("__dict__")?.get_item(name)?;
    // SAFETY: only the type of `general` is read before its layout is relied on.
    if unsafe { ffi::Py_TYPE(general.as_ptr()) } != &raw mut ffi::PyMethodDescr_Type {
        return Err(PyRuntimeError::new_err(format!("{name} is not a method descriptor")));
    }
    // SAFETY: an object of exactly `PyMethodDescr_Type` is a `PyMethodDescrObject`, whose
    // method definition (PyO3's, kept for the process) gives the documentation.
    let doc = unsafe { (*(*general.as_ptr().cast::<ffi::PyMethodDescrObject>()).d_method).ml_doc };
    // The definition lives for the process, as the descriptors made from it may.
    let def = Box::leak(Box::new(ffi::PyMethodDef {
        ml_name: method.name.as_ptr(),
        ml_meth: ffi::PyMethodDefPointer { PyCFunctionFastWithKeywords: entry },
        ml_flags: ffi::METH_FASTCALL | ffi::METH_KEYWORDS,
        ml_doc: doc,
    }));
    method
        .general
        .set(py, general.unbind())
        .map_err(|_| PyRuntimeError::new_err(format!("{name} is installed once")))?;
    // SAFETY: `ty` is a live type object and `def` a method definition kept for the process.
    let descr = unsafe { Bound::from_owned_ptr_or_err(py, ffi::PyDescr_NewMethod(ty.as_type_ptr(), def))? };
    ty.setattr(name, descr)
}

/// The body of an entry point: serves the call with `method.serve`, or forwards it.
///
/// # Safety
/// The interpreter's arguments of a `METH_FASTCALL | METH_KEYWORDS` method, on an attached
/// thread: `nargs` positional arguments at `args` followed by one value per name in `kwnames`
/// (a tuple, or NULL).
#[inline(always)]
pub unsafe fn call(
    method: &FastMethod,
    slf: *mut ffi::PyObject,
    args: *const *mut ffi::PyObject,
    nargs: ffi::Py_ssize_t,
    kwnames: *mut ffi::PyObject,
) -> *mut ffi::PyObject {
    // SAFETY: the caller's contract.
    unsafe {
        let py = Python::assume_attached();
        if kwnames.is_null() {
            let this = Borrowed::from_ptr(py, slf);
            let positional = std::slice::from_raw_parts(args, nargs as usize);
            match catch_unwind(AssertUnwindSafe(|| (method.serve)(py, &this, positional))) {
                Ok(Some(Ok(value))) => return value.into_ptr(),
                Ok(Some(Err(e))) => {
                    e.restore(py);
                    return ptr::null_mut();
                }
                Ok(None) => {}
                Err(_) => {
                    let name = method.name.to_string_lossy();
                    PyRuntimeError::new_err(format!("npumem hit an internal error in {name}; please report it"))
                        .restore(py);
                    return ptr::null_mut();
                }
            }
        }
        let Some(general) = method.general.get(py) else {
            PyRuntimeError::new_err("npumem._native is not initialised").restore(py);
            return ptr::null_mut();
        };
        let nkw = if kwnames.is_null() { 0 } else { ffi::PyTuple_GET_SIZE(kwnames) };
        let given = std::slice::from_raw_parts(args, (nargs + nkw) as usize);
        let mut argv = Vec::with_capacity(given.len() + 1);
        argv.push(slf);
        argv.extend_from_slice(given);
        ffi::PyObject_Vectorcall(general.as_ptr(), argv.as_ptr(), (nargs + 1) as usize, kwnames)
    }
}

/// An exact int that fits `u64`, or `None` (any other object, or a value out of range: the
/// general method says why).
pub fn exact_u64(obj: *mut ffi::PyObject) -> Option<u64> {
    match exact_i64(obj) {
        Ok(v) => u64::try_from(v).ok(),
        // SAFETY: `obj` is an exact int (checked by `exact_i64`); a failed conversion's error
        // is cleared.
        Err(true) => unsafe {
            let v = ffi::PyLong_AsUnsignedLongLong(obj);
            if v == u64::MAX && !ffi::PyErr_Occurred().is_null() {
                ffi::PyErr_Clear();
                return None;
            }
            Some(v)
        },
        Err(false) => None,
    }
}

/// An exact int that fits `i32`, or `None`.
pub fn exact_i32(obj: *mut ffi::PyObject) -> Option<i32> {
    exact_i64(obj).ok().and_then(|v| i32::try_from(v).ok())
}

/// An exact int that fits `i64`; else whether it is an exact int above `i64::MAX`.
fn exact_i64(obj: *mut ffi::PyObject) -> Result<i64, bool> {
    // SAFETY: `obj` is a live argument of the call; a failed conversion's error is cleared.
    unsafe {
        if ffi::PyLong_CheckExact(obj) == 0 {
            return Err(false);
        }
        let mut overflow = 0;
        let v = ffi::PyLong_AsLongLongAndOverflow(obj, &mut overflow);
        if overflow != 0 {
            return Err(overflow > 0);
        }
        if v == -1 && !ffi::PyErr_Occurred().is_null() {
            ffi::PyErr_Clear();
            return Err(false);
        }
        Ok(v)
    }
}

/// Declares the C entry point of a `FastMethod` static.
macro_rules! entry {
    ($entry:ident, $method:path) => {
        unsafe extern "C" fn $entry(
            slf: *mut pyo3::ffi::PyObject,
            args: *const *mut pyo3::ffi::PyObject,
            nargs: pyo3::ffi::Py_ssize_t,
            kwnames: *mut pyo3::ffi::PyObject,
        ) -> *mut pyo3::ffi::PyObject {
            // SAFETY: the interpreter calls a METH_FASTCALL | METH_KEYWORDS method so.
            unsafe { $crate::fastcall::call(&$method, slf, args, nargs, kwnames) }
        }
    };
}
pub(crate) use entry;
