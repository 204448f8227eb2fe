//! Error mapping: core `AclError`s become the exception classes of `npumem.errors`, and panics
//! are caught before they reach Python.

use std::panic::{AssertUnwindSafe, catch_unwind};

use npumem_core::AclError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;

static FROM_NATIVE: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

/// Builds the Python exception for `err` (`npumem.errors._from_native(code, name, message)`).
pub fn to_py(py: Python<'_>, err: AclError) -> PyErr {
    let factory = FROM_NATIVE
        .get_or_try_init(py, || py.import("npumem.errors").and_then(|m| m.getattr("_from_native")).map(Bound::unbind));
    let args = (err.code.value(), err.code.name(), err.message.clone(), err.finding);
    match factory.and_then(|f| f.call1(py, args)) {
        Ok(exc) => PyErr::from_value(exc.into_bound(py)),
        Err(import_failure) => import_failure,
    }
}

/// Runs `f`, turning a panic into an internal `AclError` so that none crosses into Python.
pub fn catch_panics<T>(f: impl FnOnce() -> Result<T, AclError>) -> Result<T, AclError> {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|panic| {
        let what = panic
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown panic".into());
        Err(AclError::internal(format!("npumem hit an internal error ({what}); please report it")))
    })
}

/// Runs `f`, mapping its error (or panic) to a Python exception.
pub fn guard<T>(py: Python<'_>, f: impl FnOnce() -> Result<T, AclError>) -> PyResult<T> {
    catch_panics(f).map_err(|e| to_py(py, e))
}
