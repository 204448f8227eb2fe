//! The planner on arbitrary problems: `plan::Problem::new` (the reader's checks), every
//! strategy, the exact search (briefly), and `Problem::validate` against a brute-force
//! validator.
//!
//! Checked: `Problem::new` accepts exactly the problems with a power-of-two alignment, non-empty
//! lifetimes, positive sizes and aligned sizes that add up within 2^64; every strategy's plan
//! validates with its own peak; the peak is at least every bound the plan claims, and `optimal`
//! means it equals the bound; the naive plan's peak is the sum of the aligned sizes;
//! `validate` on arbitrary offsets agrees with an O(n²) check of every pair; no panic.

use arbitrary::{Arbitrary, Unstructured};
use npumem_core::plan::{Buffer, ExactOutcome, PlanOptions, Problem, Strategy};

#[derive(Arbitrary, Debug, Clone, Copy)]
pub(crate) enum Num {
    Small(u8),
    Medium(u16),
    Raw(u64),
}

impl Num {
    pub(crate) fn value(self) -> u64 {
        match self {
            Num::Small(n) => u64::from(n),
            Num::Medium(n) => u64::from(n),
            Num::Raw(n) => n,
        }
    }
}

#[derive(Arbitrary, Debug)]
pub(crate) enum Alignment {
    Power(u8),
    Raw(u64),
}

impl Alignment {
    pub(crate) fn value(&self) -> u64 {
        match *self {
            Alignment::Power(k) => 1u64 << (k % 13),
            Alignment::Raw(a) => a,
        }
    }
}

#[derive(Arbitrary, Debug)]
struct Input {
    buffers: Vec<(Num, Num, Num)>,
    alignment: Alignment,
    /// Offsets for the validator check, in units of the alignment (or raw).
    offsets: Vec<Num>,
    capacity: Option<Num>,
    exact: bool,
}

/// What `Problem::new` promises to accept.
fn acceptable(buffers: &[Buffer], alignment: u64) -> bool {
    if !alignment.is_power_of_two() {
        return false;
    }
    let mut total: u64 = 0;
    for b in buffers {
        if b.lower >= b.upper || b.size == 0 {
            return false;
        }
        match b.size.checked_next_multiple_of(alignment).and_then(|s| total.checked_add(s)) {
            Some(t) => total = t,
            None => return false,
        }
    }
    true
}

/// `validate` by brute force: the peak, or None when the offsets are not a valid placement.
fn brute_force(buffers: &[Buffer], alignment: u64, offsets: &[u64]) -> Option<u64> {
    if offsets.len() != buffers.len() {
        return None;
    }
    let mut peak = 0;
    for (b, &o) in buffers.iter().zip(offsets) {
        if o % alignment != 0 {
            return None;
        }
        peak = o.checked_add(b.size.next_multiple_of(alignment))?.max(peak);
    }
    for (i, (a, &oa)) in buffers.iter().zip(offsets).enumerate() {
        for (b, &ob) in buffers.iter().zip(offsets).skip(i + 1) {
            if a.overlaps_in_time(b) && oa < ob + b.size && ob < oa + a.size {
                return None;
            }
        }
    }
    Some(peak)
}

pub fn run(data: &[u8]) {
    let Ok(input) = Input::arbitrary_take_rest(Unstructured::new(data)) else { return };
    let buffers: Vec<Buffer> =
        input.buffers.iter().take(48).map(|(l, u, s)| Buffer::new(l.value(), u.value(), s.value())).collect();
    let alignment = input.alignment.value();
    let problem = Problem::new(buffers.clone(), alignment);
    assert_eq!(problem.is_ok(), acceptable(&buffers, alignment), "Problem::new({buffers:?}, {alignment})");
    let Ok(problem) = problem else { return };
    let lower_bound = problem.lower_bound();
    let total: u64 = buffers.iter().map(|b| b.size.next_multiple_of(alignment)).sum();
    assert!(lower_bound <= total, "the max-live bound is at most the sum of the sizes");
    for strategy in Strategy::ALL {
        let plan = problem.plan(strategy);
        check_plan(&problem, strategy, &plan);
        if strategy == Strategy::Naive {
            assert_eq!(plan.peak, total, "naive: every buffer its own range");
        }
    }
    if input.exact && buffers.len() <= 12 {
        let capacity = input.capacity.map(|c| c.value());
        let plan =
            problem.plan_with(Strategy::Npumem, PlanOptions { capacity, time_limit: 1.0, work_limit: Some(2_000) });
        check_plan(&problem, Strategy::Npumem, &plan);
        if plan.exact == ExactOutcome::ReachedCapacity {
            assert!(plan.peak <= capacity.expect("a capacity"), "reached capacity: {plan:?}");
        }
        if plan.exact == ExactOutcome::Infeasible {
            assert!(capacity.expect("a capacity") < plan.bound, "infeasible: {plan:?}");
        }
    }
    let offsets: Vec<u64> = input
        .offsets
        .iter()
        .map(|o| match o {
            Num::Raw(n) => *n,
            other => other.value().saturating_mul(alignment),
        })
        .collect();
    let got = problem.validate(&offsets).ok();
    assert_eq!(got, brute_force(&buffers, alignment, &offsets), "validate({offsets:?}) of {buffers:?}");
}

fn check_plan(problem: &Problem, strategy: Strategy, plan: &npumem_core::plan::Plan) {
    let what = format!("{}: {plan:?} of {:?}", strategy.name(), problem.buffers());
    assert_eq!(problem.validate(&plan.offsets).ok(), Some(plan.peak), "{what}");
    assert_eq!(plan.lower_bound, problem.lower_bound(), "{what}");
    assert!(plan.bound >= plan.lower_bound && plan.peak >= plan.bound, "{what}");
    assert!(!plan.optimal || plan.peak == plan.bound, "{what}");
}
