//! Static memory planning: buffers with fixed lifetimes get fixed offsets in one arena, as graph
//! compilers (TFLite, TVM, XLA, CANN's graph engine) plan activations offline.
//!
//! Independent of the device stack: it depends on npumem-base only (its errors). Invariants of a
//! [`Plan`] (checked by [`Problem::validate`] in every test and by the Python API on request):
//! any two buffers whose half-open lifetimes `[lower, upper)` intersect get disjoint byte ranges
//! `[offset, offset + size)`; every offset is a multiple of the problem's alignment; `peak` is the
//! largest `offset + size` with sizes rounded up to the alignment; and `peak >= lower_bound()`.

mod bound;
mod exact;
mod graph;
mod graph_plan;
mod improve;
mod limit;
mod problem;
mod schedule;
mod shared;
mod strategy;

pub use graph::{Graph, GraphBuffer, Liveness, Op, Role, Tensor};
pub use graph_plan::{GraphOptions, GraphPlan, ScheduledOrder};
pub use limit::{Move, MoveKind, MoveOptions, Reduced, reduce};
pub use problem::{Buffer, Problem};
pub use schedule::{Candidate, DEFAULT_SCHEDULE_WORK, Schedule, ScheduleOptions, Scheduler};
pub use strategy::{ExactOutcome, Plan, PlanOptions, Strategy};
