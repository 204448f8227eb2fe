//! `npumem._native.chase` and `npumem._native.gemm_tiled`: argument checking around
//! [`npumem_core::kernels`], for the page-size benchmarks (`benches/bench_pagesize.py`).
//!
//! - `chase(next, steps, start=0)` returns the final index and the nanoseconds per step;
//!   `gemm_tiled(a, b, c, tile=64)` runs `c += a @ b` and returns the elapsed nanoseconds.
//! - Every argument is checked (numpy array, dtype, dimensions, C-contiguity, shapes, index
//!   bounds, run length) before the first access: a `TypeError` for a wrong type, an
//!   `InvalidParamError` naming the argument and the value otherwise.
//! - The interpreter is released while a kernel runs; the borrowed arrays keep their memory alive.

use npumem_core::AclError;
use npumem_core::kernels;
use numpy::{Ix1, Ix2, PyArrayMethods, PyUntypedArrayMethods};
use pyo3::prelude::*;

use crate::args::{Array, name};
use crate::errors::{catch_panics, to_py};

/// The longest chase one call runs: 2^32 steps (minutes at a DRAM miss per step).
const MAX_STEPS: u64 = 1 << 32;
/// The most multiply-adds one `gemm_tiled` call runs (m * n * k): an 8192-cube, minutes.
const MAX_GEMM_WORK: u128 = 1 << 39;
/// The largest tile side.
const MAX_TILE: u64 = 4096;

fn invalid(py: Python<'_>, message: String) -> PyErr {
    to_py(py, AclError::invalid_param(message))
}

/// Follows `next` from `start` for `steps` dependent loads (`i = next[i]`) and returns the final
/// index and the nanoseconds per step. `next` is a C-contiguous 1-D uint64 array whose every value
/// is an index into it; `steps` runs from 1 to 2**32.
#[pyfunction]
#[pyo3(signature = (next, steps, start = 0))]
pub fn chase(py: Python<'_>, next: Array<'_, u64, Ix1, name::next>, steps: u64, start: u64) -> PyResult<(u64, f64)> {
    let readonly = next.0.try_readonly()?;
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
    py.detach(|| catch_panics(|| kernels::chase(next, start, steps))).map_err(|e| to_py(py, e))
}

/// `c += a @ b` over C-contiguous float32 matrices (a: m x k, b: k x n, c: m x n, c writable and
/// sharing no memory with a or b), in `tile` x `tile` x `tile` blocks in m-n-k order; returns
/// the elapsed nanoseconds. `tile` runs from 1 to 4096, and m * n * k up to 2**39.
#[pyfunction]
#[pyo3(signature = (a, b, c, tile = 64))]
pub fn gemm_tiled(
    py: Python<'_>,
    a: Array<'_, f32, Ix2, name::a>,
    b: Array<'_, f32, Ix2, name::b>,
    c: Array<'_, f32, Ix2, name::c>,
    tile: u64,
) -> PyResult<f64> {
    let (a, b, c) = (a.0, b.0, c.0);
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
    py.detach(|| catch_panics(|| Ok(kernels::gemm_tiled(av, bv, cv, (m, n, k), tile as usize))))
        .map_err(|e| to_py(py, e))
}
