//! `ReentrantLock`: npumem.acl's one lock, taken by its Python code (`with LOCK:`) and by the
//! native hot calls alike.
//!
//! - Reentrant per thread, as `threading.RLock`: the holder may take it again and releases it
//!   as often as it took it.
//! - A thread that has to wait for it detaches from the interpreter while it waits, so the
//!   holder can run Python code meanwhile.
//! - `release` by a thread that does not hold it raises `RuntimeError`, as `RLock`'s does.

use std::time::Duration;

use parking_lot::lock_api::RawReentrantMutex;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;

type Raw = RawReentrantMutex<parking_lot::RawMutex, parking_lot::RawThreadId>;

#[pyclass(module = "npumem._native", frozen)]
pub struct ReentrantLock {
    raw: Raw,
}

/// The lock held by this thread until dropped.
pub struct Held<'a>(&'a ReentrantLock);

impl Held<'_> {
    /// Whether this is a hold of `lock`.
    pub fn of(&self, lock: &ReentrantLock) -> bool {
        std::ptr::eq(self.0, lock)
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        // SAFETY: a `Held` exists only while this thread holds the lock once for it.
        unsafe { self.0.raw.unlock() }
    }
}

impl ReentrantLock {
    /// Takes the lock, detached from the interpreter while it waits for another thread.
    pub fn hold(&self, py: Python<'_>) -> Held<'_> {
        if !self.raw.try_lock() {
            py.detach(|| self.raw.lock());
        }
        Held(self)
    }
}

#[pymethods]
impl ReentrantLock {
    #[new]
    fn new() -> Self {
        ReentrantLock { raw: Raw::INIT }
    }

    /// Takes the lock, as `threading.RLock.acquire`: waits (at most `timeout` seconds, -1: no
    /// limit) when `blocking`, and says whether it was taken.
    #[pyo3(signature = (blocking = true, timeout = -1.0))]
    fn acquire(&self, py: Python<'_>, blocking: bool, timeout: f64) -> PyResult<bool> {
        if !blocking {
            if timeout != -1.0 {
                return Err(PyValueError::new_err("can't specify a timeout for a non-blocking call"));
            }
            return Ok(self.raw.try_lock());
        }
        if timeout == -1.0 {
            std::mem::forget(self.hold(py));
            return Ok(true);
        }
        if !(timeout >= 0.0 && timeout.is_finite()) {
            return Err(PyValueError::new_err(format!(
                "timeout={timeout}: the timeout must be a non-negative number of seconds, or -1 (no limit)"
            )));
        }
        let limit = Duration::try_from_secs_f64(timeout).unwrap_or(Duration::MAX);
        Ok(self.raw.try_lock() || py.detach(|| self.raw.try_lock_for(limit)))
    }

    /// Gives the lock back once (a thread that does not hold it gets `RuntimeError`).
    fn release(&self) -> PyResult<()> {
        if !self.raw.is_owned_by_current_thread() {
            return Err(PyRuntimeError::new_err("cannot release un-acquired lock"));
        }
        // SAFETY: this thread holds the lock (checked just above).
        unsafe { self.raw.unlock() };
        Ok(())
    }

    fn __enter__(&self, py: Python<'_>) -> bool {
        std::mem::forget(self.hold(py));
        true
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, _exc: &Bound<'_, pyo3::types::PyTuple>) -> PyResult<()> {
        self.release()
    }

    /// Whether this thread holds the lock (`threading.Condition` asks so).
    fn _is_owned(&self) -> bool {
        self.raw.is_owned_by_current_thread()
    }

    /// Whether any thread holds the lock.
    fn locked(&self) -> bool {
        self.raw.is_locked()
    }

    fn __repr__(&self) -> String {
        let state = if self.raw.is_locked() { "locked" } else { "unlocked" };
        format!("<npumem._native.ReentrantLock {state}>")
    }
}
