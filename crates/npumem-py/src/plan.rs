//! `npumem._native.plan_offsets` / `plan_validate` / `plan_lower_bound`: the static planner of
//! npumem-core over numpy arrays of lifetimes and sizes. Planning runs detached from the
//! interpreter.

use npumem_core::AclError;
use npumem_core::plan::{Buffer, PlanOptions, Problem, Strategy};
use numpy::{PyArray1, PyReadonlyArray1};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::errors::{catch_panics, guard, to_py};

fn problem(
    lower: &PyReadonlyArray1<'_, u64>,
    upper: &PyReadonlyArray1<'_, u64>,
    size: &PyReadonlyArray1<'_, u64>,
    alignment: u64,
) -> Result<Problem, AclError> {
    let (l, u, s) = (lower.as_slice(), upper.as_slice(), size.as_slice());
    let (l, u, s) = match (l, u, s) {
        (Ok(l), Ok(u), Ok(s)) if l.len() == u.len() && u.len() == s.len() => (l, u, s),
        (Ok(_), Ok(_), Ok(_)) => {
            return Err(AclError::invalid_param("lower, upper and size must have the same length"));
        }
        _ => return Err(AclError::invalid_param("lower, upper and size must be contiguous uint64 arrays")),
    };
    let buffers = l.iter().zip(u).zip(s).map(|((&lower, &upper), &size)| Buffer { lower, upper, size }).collect();
    Problem::new(buffers, alignment)
}

/// Plans offsets with `strategy` (npumem: then the exact search for up to `time_limit` seconds,
/// stopping at `capacity` when given); returns a dict with offsets (uint64 array), peak,
/// lower_bound (max live), bound (proven), optimal, exact, strategy, order and solve_seconds.
#[pyfunction]
#[pyo3(signature = (lower, upper, size, strategy, alignment, capacity=None, time_limit=0.0))]
#[allow(clippy::too_many_arguments)]
pub fn plan_offsets<'py>(
    py: Python<'py>,
    lower: PyReadonlyArray1<'py, u64>,
    upper: PyReadonlyArray1<'py, u64>,
    size: PyReadonlyArray1<'py, u64>,
    strategy: &str,
    alignment: u64,
    capacity: Option<u64>,
    time_limit: f64,
) -> PyResult<Bound<'py, PyDict>> {
    let strategy = Strategy::parse(strategy).map_err(|e| to_py(py, e))?;
    if !(time_limit.is_finite() && time_limit >= 0.0) {
        let msg =
            format!("time_limit {time_limit} must be a finite number of seconds >= 0 (0 disables the exact search)");
        return Err(to_py(py, AclError::invalid_param(msg)));
    }
    let problem = problem(&lower, &upper, &size, alignment).map_err(|e| to_py(py, e))?;
    let options = PlanOptions { capacity, time_limit };
    let (plan, bound) = py
        .detach(|| catch_panics(|| Ok((problem.plan_with(strategy, options), problem.lower_bound()))))
        .map_err(|e| to_py(py, e))?;
    let d = PyDict::new(py);
    d.set_item("peak", plan.peak)?;
    d.set_item("lower_bound", bound)?;
    d.set_item("bound", plan.bound)?;
    d.set_item("optimal", plan.optimal)?;
    d.set_item("exact", plan.exact.name())?;
    d.set_item("strategy", plan.strategy.name())?;
    d.set_item("order", plan.order)?;
    d.set_item("solve_seconds", plan.solve_seconds)?;
    d.set_item("offsets", PyArray1::from_vec(py, plan.offsets))?;
    Ok(d)
}

/// Checks a placement; returns its peak or raises naming two overlapping buffers.
#[pyfunction]
pub fn plan_validate(
    py: Python<'_>,
    lower: PyReadonlyArray1<'_, u64>,
    upper: PyReadonlyArray1<'_, u64>,
    size: PyReadonlyArray1<'_, u64>,
    offsets: PyReadonlyArray1<'_, u64>,
    alignment: u64,
) -> PyResult<u64> {
    guard(py, || {
        let problem = problem(&lower, &upper, &size, alignment)?;
        let offsets =
            offsets.as_slice().map_err(|_| AclError::invalid_param("offsets must be a contiguous uint64 array"))?;
        problem.validate(offsets)
    })
}

/// The max-live lower bound on the arena.
#[pyfunction]
pub fn plan_lower_bound(
    py: Python<'_>,
    lower: PyReadonlyArray1<'_, u64>,
    upper: PyReadonlyArray1<'_, u64>,
    size: PyReadonlyArray1<'_, u64>,
    alignment: u64,
) -> PyResult<u64> {
    guard(py, || Ok(problem(&lower, &upper, &size, alignment)?.lower_bound()))
}

/// The strategy names, default last.
#[pyfunction]
pub fn plan_strategies() -> Vec<&'static str> {
    Strategy::ALL.iter().map(|s| s.name()).collect()
}
