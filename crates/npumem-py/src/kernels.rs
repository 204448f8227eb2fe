//! `npumem._native.chase` and `npumem._native.gemm_tiled`: measurement kernels over numpy
//! arrays, for the page-size benchmarks (`benches/bench_pagesize.py`) run on memory the host
//! backend mapped with 4 KiB or 2 MiB pages (a zero-copy view of a device allocation).
//!
//! - `chase(next, steps, start=0)`: a dependent-load pointer chase, `i = next[i]` `steps` times;
//!   returns the final index and the nanoseconds per step.
//! - `gemm_tiled(a, b, c, tile=64)`: `c += a @ b` over C-contiguous float32 matrices, in square
//!   tiles in m-n-k order, i-k-j order inside a tile (no packing: every row of a B tile is
//!   read where it lies, so the traversal's page footprint is the matrices' own); returns the
//!   elapsed nanoseconds.
//!
//! Invariants: every argument is checked (numpy array, dtype, dimensions, C-contiguity, shapes,
//! index bounds, run length) before the first access, with a `TypeError` for a wrong type and an
//! `InvalidParamError` naming the argument and the value otherwise; the kernels touch only the
//! elements of the arrays they were given (every chase index is bounds-checked where it is
//! followed, so an array rewritten by another thread meanwhile cannot send it astray); the
//! interpreter is released while they run, and the borrowed arrays keep their memory alive.

use std::time::Instant;

use npumem_core::AclError;
use numpy::{Element, Ix1, Ix2, PyArray, PyArrayDescrMethods, PyArrayMethods, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;

use crate::errors::{catch_panics, to_py};

/// The longest chase one call runs: 2^32 steps (minutes at a DRAM miss per step).
const MAX_STEPS: u64 = 1 << 32;
/// The most multiply-adds one `gemm_tiled` call runs (m * n * k): an 8192-cube, minutes.
const MAX_GEMM_WORK: u128 = 1 << 39;
/// The largest tile side.
const MAX_TILE: u64 = 4096;

/// `obj` as a numpy array of `T` with `ndim` dimensions, C-contiguous; `what` names the
/// expected dtype in messages.
fn array_arg<'py, T: Element, D: numpy::ndarray::Dimension>(
    obj: &Bound<'py, PyAny>,
    name: &str,
    ndim: usize,
    what: &str,
) -> PyResult<Bound<'py, PyArray<T, D>>> {
    let py = obj.py();
    let expected = format!("a C-contiguous {ndim}-D numpy array of {what}");
    let Ok(untyped) = obj.cast::<PyUntypedArray>() else {
        return Err(PyTypeError::new_err(format!("{name} must be {expected}, got {}", obj.get_type().name()?)));
    };
    if untyped.ndim() != ndim || !untyped.dtype().is_equiv_to(&numpy::dtype::<T>(py)) {
        return Err(PyTypeError::new_err(format!(
            "{name} must be {expected}, got a {}-D array of {} with shape {:?}",
            untyped.ndim(),
            untyped.dtype(),
            untyped.shape()
        )));
    }
    if !untyped.is_c_contiguous() {
        return Err(to_py(
            py,
            AclError::invalid_param(format!(
                "{name} is not C-contiguous (shape {:?}); pass numpy.ascontiguousarray({name})",
                untyped.shape()
            )),
        ));
    }
    Ok(obj.cast::<PyArray<T, D>>()?.clone())
}

fn invalid(py: Python<'_>, message: String) -> PyErr {
    to_py(py, AclError::invalid_param(message))
}

/// Follows `next` from `start` for `steps` dependent loads (`i = next[i]`) and returns the final
/// index and the nanoseconds per step. `next` is a C-contiguous 1-D uint64 array whose every value
/// is an index into it; `steps` runs from 1 to 2**32.
#[pyfunction]
#[pyo3(signature = (next, steps, start = 0))]
pub fn chase(py: Python<'_>, next: &Bound<'_, PyAny>, steps: u64, start: u64) -> PyResult<(u64, f64)> {
    let array = array_arg::<u64, Ix1>(next, "next", 1, "uint64")?;
    let readonly = array.try_readonly()?;
    let next = readonly.as_slice().map_err(|e| invalid(py, format!("next: {e}")))?;
    let len = next.len() as u64;
    if len == 0 {
        return Err(invalid(py, "next is empty; pass an array with at least one index".into()));
    }
    if !(1..=MAX_STEPS).contains(&steps) {
        return Err(invalid(py, format!("steps = {steps} is out of range: accepted 1 to 2**32")));
    }
    if start >= len {
        return Err(invalid(py, format!("start = {start} is not an index of next (length {len})")));
    }
    if let Some(i) = next.iter().position(|&v| v >= len) {
        return Err(invalid(
            py,
            format!("next[{i}] = {} is not an index of next (length {len}); every value must be below it", next[i]),
        ));
    }
    py.detach(|| {
        catch_panics(|| {
            let mut at = start as usize;
            let t0 = Instant::now();
            for _ in 0..steps {
                // Checked on use as well: another thread may have rewritten the array since.
                at = match next.get(at) {
                    Some(&v) => v as usize,
                    None => return Err(AclError::invalid_param(format!("next was changed during the chase: {at}"))),
                };
            }
            let ns = t0.elapsed().as_nanos() as f64 / steps as f64;
            Ok((std::hint::black_box(at) as u64, ns))
        })
    })
    .map_err(|e| to_py(py, e))
}

/// `c += a @ b` over C-contiguous float32 matrices (a: m x k, b: k x n, c: m x n, c writable and
/// sharing no memory with a or b), in `tile` x `tile` x `tile` blocks in m-n-k order; returns
/// the elapsed nanoseconds. `tile` runs from 1 to 4096, and m * n * k up to 2**39.
#[pyfunction]
#[pyo3(signature = (a, b, c, tile = 64))]
pub fn gemm_tiled(
    py: Python<'_>,
    a: &Bound<'_, PyAny>,
    b: &Bound<'_, PyAny>,
    c: &Bound<'_, PyAny>,
    tile: u64,
) -> PyResult<f64> {
    let (a, b, c) = (
        array_arg::<f32, Ix2>(a, "a", 2, "float32")?,
        array_arg::<f32, Ix2>(b, "b", 2, "float32")?,
        array_arg::<f32, Ix2>(c, "c", 2, "float32")?,
    );
    let (&[m, k], &[k2, n], &[m2, n2]) = (a.shape(), b.shape(), c.shape()) else {
        unreachable!("two dimensions, checked")
    };
    if k2 != k || m2 != m || n2 != n {
        return Err(invalid(
            py,
            format!(
                "shapes do not chain: a is {:?}, b {:?}, c {:?}; need a (m, k), b (k, n), c (m, n)",
                a.shape(),
                b.shape(),
                c.shape()
            ),
        ));
    }
    if !(1..=MAX_TILE).contains(&tile) {
        return Err(invalid(py, format!("tile = {tile} is out of range: accepted 1 to {MAX_TILE}")));
    }
    if (m as u128) * (n as u128) * (k as u128) > MAX_GEMM_WORK {
        return Err(invalid(py, format!("a {m} x {n} x {k} product is more than 2**39 multiply-adds; split it")));
    }
    let (ar, br) = (a.try_readonly()?, b.try_readonly()?);
    let mut cw = c
        .try_readwrite()
        .map_err(|e| invalid(py, format!("c must be writable and share no memory with a or b, and is not ({e})")))?;
    let slice_error = |e: numpy::AsSliceError| invalid(py, format!("a, b and c must be C-contiguous ({e})"));
    let (av, bv) = (ar.as_slice().map_err(slice_error)?, br.as_slice().map_err(slice_error)?);
    let cv = cw.as_slice_mut().map_err(slice_error)?;
    let t = tile as usize;
    py.detach(|| {
        catch_panics(|| {
            let t0 = Instant::now();
            for i0 in (0..m).step_by(t) {
                for j0 in (0..n).step_by(t) {
                    let j1 = (j0 + t).min(n);
                    for k0 in (0..k).step_by(t) {
                        let k1 = (k0 + t).min(k);
                        for i in i0..(i0 + t).min(m) {
                            let c_row = &mut cv[i * n + j0..i * n + j1];
                            for kk in k0..k1 {
                                let aik = av[i * k + kk];
                                let b_row = &bv[kk * n + j0..kk * n + j1];
                                for (x, &y) in c_row.iter_mut().zip(b_row) {
                                    *x += aik * y;
                                }
                            }
                        }
                    }
                }
            }
            Ok(t0.elapsed().as_nanos() as f64)
        })
    })
    .map_err(|e| to_py(py, e))
}
