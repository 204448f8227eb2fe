//! The `Device` calls a program makes most, as C-API methods (`fastcall`): `malloc(size)`,
//! `free(ptr)` and `buffer(nbytes)` with one exact int each go straight to the device; every
//! other call is PyO3's method's (same checks, same errors).

use npumem_core::Policy;
use pyo3::prelude::*;
use pyo3::types::{PyInt, PyType};

use super::PyDevice;
use crate::fastcall::{self, FastMethod, entry, exact_u64};

static MALLOC: FastMethod = FastMethod::new(c"malloc", |py, slf, args| {
    let [size] = args else { return None };
    let size = exact_u64(*size)?;
    // SAFETY: `slf` is a `Device` (see `fastcall::Serve`).
    let dev = unsafe { slf.cast_unchecked::<PyDevice>() }.get();
    Some(dev.run(py, |d| d.malloc_on(size, Policy::HugeFirst, true, 0)).map(|p| PyInt::new(py, p).into_any()))
});

static FREE: FastMethod = FastMethod::new(c"free", |py, slf, args| {
    let [ptr] = args else { return None };
    let ptr = exact_u64(*ptr)?;
    // SAFETY: `slf` is a `Device` (see `fastcall::Serve`).
    let dev = unsafe { slf.cast_unchecked::<PyDevice>() }.get();
    Some(dev.run(py, |d| d.free_on(ptr, None)).map(|()| py.None().into_bound(py)))
});

static BUFFER: FastMethod = FastMethod::new(c"buffer", |py, slf, args| {
    let [nbytes] = args else { return None };
    let nbytes = exact_u64(*nbytes)?;
    // SAFETY: `slf` is a `Device` (see `fastcall::Serve`).
    let dev = unsafe { slf.cast_unchecked::<PyDevice>() }.get();
    Some(dev.make_buffer(py, nbytes, Policy::HugeFirst, 0))
});

entry!(malloc_entry, MALLOC);
entry!(free_entry, FREE);
entry!(buffer_entry, BUFFER);

/// Installs the three over PyO3's methods of `Device`.
pub fn install(ty: &Bound<'_, PyType>) -> PyResult<()> {
    fastcall::install(ty, &MALLOC, malloc_entry)?;
    fastcall::install(ty, &FREE, free_entry)?;
    fastcall::install(ty, &BUFFER, buffer_entry)
}
