//! `npumem._native.plan_offsets` / `plan_validate` / `plan_lower_bound`: the static planner of
//! npumem-core over numpy arrays of lifetimes and sizes. Planning runs detached from the
//! interpreter.

use npumem_core::AclError;
use npumem_core::plan::{
    Buffer, DEFAULT_SCHEDULE_WORK, Graph, GraphBuffer, GraphOptions, MoveOptions, Op, PlanOptions, Problem, Role,
    ScheduleOptions, Scheduler, Strategy, Tensor,
};
use numpy::{PyArray1, PyReadonlyArray1};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

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

/// The exact search's limits: `time_limit` seconds (finite and >= 0; infinite only beside a
/// `work_limit`, so that a search always ends) and `work_limit` nodes per portfolio thread.
fn check_limits(time_limit: f64, work_limit: Option<u64>) -> Result<(), AclError> {
    if time_limit.is_nan() || time_limit < 0.0 || (time_limit.is_infinite() && work_limit.is_none()) {
        return Err(AclError::invalid_param(format!(
            "time_limit {time_limit} must be a finite number of seconds >= 0 (0 disables the exact search); \
             it may be unlimited only with a work_limit"
        )));
    }
    Ok(())
}

/// Plans offsets with `strategy` (npumem: then the exact search for up to `time_limit` seconds
/// and `work_limit` nodes, stopping at `capacity` when given); returns a dict with offsets
/// (uint64 array), peak, lower_bound (max live), bound (proven), optimal, exact, nodes,
/// strategy, order and solve_seconds.
#[pyfunction]
#[pyo3(signature = (lower, upper, size, strategy, alignment, capacity=None, time_limit=0.0, work_limit=None))]
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
    work_limit: Option<u64>,
) -> PyResult<Bound<'py, PyDict>> {
    let strategy = Strategy::parse(strategy).map_err(|e| to_py(py, e))?;
    check_limits(time_limit, work_limit).map_err(|e| to_py(py, e))?;
    let problem = problem(&lower, &upper, &size, alignment).map_err(|e| to_py(py, e))?;
    let options = PlanOptions { capacity, time_limit, work_limit };
    let plan = py.detach(|| catch_panics(|| Ok(problem.plan_with(strategy, options)))).map_err(|e| to_py(py, e))?;
    let d = PyDict::new(py);
    d.set_item("peak", plan.peak)?;
    d.set_item("lower_bound", plan.lower_bound)?;
    d.set_item("bound", plan.bound)?;
    d.set_item("optimal", plan.optimal)?;
    d.set_item("exact", plan.exact.name())?;
    d.set_item("nodes", plan.nodes)?;
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

/// The sum of positional maximums: the bound of shared-object planning.
#[pyfunction]
pub fn plan_positional_bound(
    py: Python<'_>,
    lower: PyReadonlyArray1<'_, u64>,
    upper: PyReadonlyArray1<'_, u64>,
    size: PyReadonlyArray1<'_, u64>,
    alignment: u64,
) -> PyResult<u64> {
    guard(py, || Ok(problem(&lower, &upper, &size, alignment)?.positional_bound()))
}

/// The strategy names, default last.
#[pyfunction]
pub fn plan_strategies() -> Vec<&'static str> {
    Strategy::ALL.iter().map(|s| s.name()).collect()
}

/// The scheduler names, default last; and the search's default work limit.
#[pyfunction]
pub fn plan_schedulers() -> (Vec<&'static str>, u64) {
    (Scheduler::ALL.iter().map(|s| s.name()).collect(), DEFAULT_SCHEDULE_WORK)
}

fn slice<'a>(a: &'a PyReadonlyArray1<'_, u64>, what: &str) -> Result<&'a [u64], AclError> {
    a.as_slice().map_err(|_| AclError::invalid_param(format!("{what} must be a contiguous uint64 array")))
}

/// Splits a CSR pair (`ptr` of length ops + 1, `idx`) into per-op lists.
fn csr(ptr: &[u64], idx: &[u64], ops: usize, what: &str) -> Result<Vec<Vec<usize>>, AclError> {
    let bad = || AclError::invalid_param(format!("{what}: malformed op lists (ptr must rise from 0 to len(idx))"));
    if ptr.len() != ops + 1 || ptr.first() != Some(&0) || ptr.last() != Some(&(idx.len() as u64)) {
        return Err(bad());
    }
    ptr.windows(2)
        .map(|w| {
            let (a, b) = (w[0] as usize, w[1] as usize);
            if a > b { Err(bad()) } else { Ok(idx[a..b].iter().map(|&i| i as usize).collect()) }
        })
        .collect()
}

/// Plans a graph given as arrays (tensors: size, role code 0-3, alias_of or -1; ops: CSR input
/// and output lists and workspace bytes). Returns the liveness, the moves under `mem_limit`, and
/// the arena's plan as a dict. With `scheduler` ("given", "xla", "inductor" or "npumem") the
/// order is chosen first (its search bounded by `schedule_work` transitions) and the dict's
/// "schedule" entry holds the orders (original op indices) and bounds; steps are then positions
/// in the chosen order, and workspace owners and recompute ops stay original op indices.
#[pyfunction]
#[pyo3(signature = (sizes, roles, alias_of, in_ptr, in_idx, out_ptr, out_idx, workspace, alignment, strategy, time_limit, mem_limit, offload_weights, offload_activations, recompute, per_transfer=0, work_limit=None, scheduler=None, schedule_work=None))]
#[allow(clippy::too_many_arguments)]
pub fn plan_graph<'py>(
    py: Python<'py>,
    sizes: PyReadonlyArray1<'py, u64>,
    roles: Vec<String>,
    alias_of: Vec<i64>,
    in_ptr: PyReadonlyArray1<'py, u64>,
    in_idx: PyReadonlyArray1<'py, u64>,
    out_ptr: PyReadonlyArray1<'py, u64>,
    out_idx: PyReadonlyArray1<'py, u64>,
    workspace: PyReadonlyArray1<'py, u64>,
    alignment: u64,
    strategy: &str,
    time_limit: f64,
    mem_limit: Option<u64>,
    offload_weights: bool,
    offload_activations: bool,
    recompute: bool,
    per_transfer: u64,
    work_limit: Option<u64>,
    scheduler: Option<&str>,
    schedule_work: Option<u64>,
) -> PyResult<Bound<'py, PyDict>> {
    let built = (|| -> Result<(Graph, GraphOptions), AclError> {
        let sizes = slice(&sizes, "sizes")?;
        let workspace = slice(&workspace, "workspace")?;
        if roles.len() != sizes.len() || alias_of.len() != sizes.len() {
            return Err(AclError::invalid_param("sizes, roles and alias_of must have one entry per tensor"));
        }
        let ops = workspace.len();
        let inputs = csr(slice(&in_ptr, "in_ptr")?, slice(&in_idx, "in_idx")?, ops, "inputs")?;
        let outputs = csr(slice(&out_ptr, "out_ptr")?, slice(&out_idx, "out_idx")?, ops, "outputs")?;
        let mut tensors = Vec::with_capacity(sizes.len());
        for ((&size, role), &alias) in sizes.iter().zip(&roles).zip(&alias_of) {
            let alias_of = if alias < 0 { None } else { Some(alias as usize) };
            tensors.push(Tensor { size, role: Role::parse(role)?, alias_of });
        }
        let ops = inputs
            .into_iter()
            .zip(outputs)
            .zip(workspace)
            .map(|((inputs, outputs), &workspace)| Op { inputs, outputs, workspace })
            .collect();
        check_limits(time_limit, work_limit)?;
        if alignment == 0 || !alignment.is_power_of_two() {
            return Err(AclError::invalid_param(format!("alignment {alignment} is not a power of two")));
        }
        let allow = MoveOptions { weights: offload_weights, activations: offload_activations, recompute, per_transfer };
        let strategy = Strategy::parse(strategy)?;
        let schedule = match scheduler {
            None => None,
            Some(name) => Some(ScheduleOptions {
                scheduler: Scheduler::parse(name)?,
                work_limit: schedule_work.unwrap_or(DEFAULT_SCHEDULE_WORK),
            }),
        };
        let options = GraphOptions { alignment, strategy, time_limit, work_limit, mem_limit, allow, schedule };
        Ok((Graph::new(tensors, ops)?, options))
    })();
    let (graph, options) = built.map_err(|e| to_py(py, e))?;
    let gp = py.detach(|| catch_panics(|| graph.plan(options))).map_err(|e| to_py(py, e))?;
    let d = PyDict::new(py);
    let live = &gp.liveness;
    let col = |f: &dyn Fn(&GraphBuffer) -> u64| -> Vec<u64> { live.buffers.iter().map(f).collect() };
    d.set_item("buffer_of", PyArray1::from_vec(py, live.buffer_of.iter().map(|&b| b as u64).collect()))?;
    d.set_item("buffer_lower", PyArray1::from_vec(py, col(&|b| b.buffer.lower)))?;
    d.set_item("buffer_upper", PyArray1::from_vec(py, col(&|b| b.buffer.upper)))?;
    d.set_item("buffer_size", PyArray1::from_vec(py, col(&|b| b.buffer.size)))?;
    // Op indices of the reordered graph back to the caller's.
    let original = |k: usize| gp.schedule.as_ref().map_or(k, |s| s.order[k]) as u64;
    let owners = live.buffers.iter().map(|b| if b.role.is_none() { original(b.owner) } else { b.owner as u64 });
    d.set_item("buffer_owner", PyArray1::from_vec(py, owners.collect()))?;
    let roles: Vec<&str> = live.buffers.iter().map(|b| b.role.map_or("workspace", |r| r.name())).collect();
    d.set_item("buffer_role", roles)?;
    let arena = &gp.reduced.arena;
    d.set_item("arena_lower", PyArray1::from_vec(py, arena.iter().map(|b| b.lower).collect()))?;
    d.set_item("arena_upper", PyArray1::from_vec(py, arena.iter().map(|b| b.upper).collect()))?;
    d.set_item("arena_size", PyArray1::from_vec(py, arena.iter().map(|b| b.size).collect()))?;
    d.set_item("arena_owner", PyArray1::from_vec(py, gp.reduced.owner.iter().map(|&o| o as u64).collect()))?;
    d.set_item("offsets", PyArray1::from_vec(py, gp.plan.offsets.clone()))?;
    d.set_item("peak", gp.plan.peak)?;
    d.set_item("lower_bound", gp.plan.lower_bound)?;
    d.set_item("bound", gp.plan.bound)?;
    d.set_item("optimal", gp.plan.optimal)?;
    d.set_item("exact", gp.plan.exact.name())?;
    d.set_item("nodes", gp.plan.nodes)?;
    d.set_item("order", gp.plan.order)?;
    d.set_item("strategy", gp.plan.strategy.name())?;
    d.set_item("solve_seconds", gp.plan.solve_seconds)?;
    d.set_item("weights", gp.weights)?;
    d.set_item("inputs", gp.inputs)?;
    d.set_item("outputs", gp.outputs)?;
    d.set_item("fits", gp.fits)?;
    d.set_item("steps", live.steps)?;
    let moves = PyList::empty(py);
    for m in &gp.reduced.moves {
        let md = PyDict::new(py);
        md.set_item("kind", m.kind.name())?;
        md.set_item("buffer", m.buffer)?;
        md.set_item("bytes", m.bytes)?;
        md.set_item("transfers", m.transfers)?;
        md.set_item("gap", m.gap)?;
        md.set_item("op", m.op.map(original))?;
        moves.append(md)?;
    }
    d.set_item("moves", moves)?;
    if let Some(s) = &gp.schedule {
        let sd = PyDict::new(py);
        let to_u64 = |o: &[usize]| PyArray1::from_vec(py, o.iter().map(|&k| k as u64).collect());
        sd.set_item("order", to_u64(&s.order))?;
        sd.set_item("chosen", s.chosen)?;
        sd.set_item("given_bound", s.schedule.given_bound)?;
        sd.set_item("bound", s.schedule.bound)?;
        sd.set_item("exact", s.schedule.exact)?;
        sd.set_item("work", s.schedule.work)?;
        let cands = PyList::empty(py);
        for (c, arena) in s.schedule.candidates.iter().zip(&s.arenas) {
            let cd = PyDict::new(py);
            cd.set_item("scheduler", c.scheduler.name())?;
            cd.set_item("detail", c.detail)?;
            cd.set_item("order", to_u64(&c.order))?;
            cd.set_item("bound", c.bound)?;
            cd.set_item("arena", *arena)?;
            cands.append(cd)?;
        }
        sd.set_item("candidates", cands)?;
        d.set_item("schedule", sd)?;
    }
    Ok(d)
}
