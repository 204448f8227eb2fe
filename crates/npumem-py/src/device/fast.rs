//! The `Device` calls a program makes most, as C-API methods (`fastcall`): `malloc(size)`,
//! `free(ptr)` and `buffer(nbytes)` with one exact int each, and `malloc(size, policy, stream,
//! tag)` with exact ints and a str (npumem.acl's call), go straight to the device; every other
//! call is PyO3's method's (same checks, same errors).

use npumem_core::Policy;
use pyo3::prelude::*;
use pyo3::types::{PyInt, PyString, PyType};

use super::PyDevice;
use crate::fastcall::{self, FastMethod, entry, exact_u64};

static MALLOC: FastMethod = FastMethod::new(c"malloc", |py, slf, args| {
    // `malloc(size)`, or `malloc(size, policy, stream, tag)` with a known policy and a str tag
    // (npumem.acl's call); a policy `from_raw` refuses goes to PyO3's method, which words it.
    let (size, policy, stream, tag) = match args {
        [size] => (exact_u64(*size)?, Policy::HugeFirst, 0, None),
        [size, policy, stream, tag] => {
            let policy = u32::try_from(exact_u64(*policy)?).ok().and_then(|p| Policy::from_raw(p).ok())?;
            // SAFETY: `tag` is a live argument of the call, borrowed for it.
            let tag = unsafe { Borrowed::from_ptr(py, *tag) }.cast_exact::<PyString>().ok()?;
            (exact_u64(*size)?, policy, exact_u64(*stream)?, Some(tag.to_str().ok()?.to_owned()))
        }
        _ => return None,
    };
    // SAFETY: `slf` is a `Device` (see `fastcall::Serve`).
    let dev = unsafe { slf.cast_unchecked::<PyDevice>() }.get();
    let ptr = dev.run(py, |d| {
        let ptr = d.malloc_on(size, policy, true, stream)?;
        if let Some(tag) = &tag {
            d.set_tag(ptr, tag)?;
        }
        Ok(ptr)
    });
    Some(ptr.map(|p| PyInt::new(py, p).into_any()))
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
