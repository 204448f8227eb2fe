//! Tests of the schedulers: every order valid (checked apart from `Dag`), every bound the
//! pipeline's own, and the search equal to brute force over all orders of small random graphs.

use super::super::graph::{Op, Role, Tensor};
use super::super::{Buffer, Problem};
use super::*;
use proptest::prelude::*;

fn t(size: u64, role: Role) -> Tensor {
    Tensor { size, role, alias_of: None }
}

fn op(inputs: &[usize], outputs: &[usize], workspace: u64) -> Op {
    Op { inputs: inputs.to_vec(), outputs: outputs.to_vec(), workspace }
}

/// The arena bound of `order`, from the planning pipeline itself (reorder, liveness, max live).
fn pipeline_bound(g: &Graph, order: &[usize], align: u64) -> u64 {
    let live = g.reordered(order).unwrap().liveness();
    let arena: Vec<Buffer> = live.buffers.iter().filter(|b| b.planned()).map(|b| b.buffer).collect();
    Problem::new(arena, align).unwrap().lower_bound()
}

/// Independent of `Dag`: producers before readers, and within an alias class every pair of ops
/// of which one writes the class keeps its given order.
fn valid(g: &Graph, order: &[usize]) -> bool {
    let mut pos = vec![0; order.len()];
    for (i, &o) in order.iter().enumerate() {
        pos[o] = i;
    }
    let root = |mut x: usize| {
        while let Some(b) = g.tensors()[x].alias_of {
            x = b;
        }
        x
    };
    let ops = g.ops();
    for (a, oa) in ops.iter().enumerate() {
        for (b, ob) in ops.iter().enumerate().skip(a + 1) {
            let reads = |r: &Op, w: &Op| r.inputs.iter().any(|t| w.outputs.contains(t));
            let class_write = |x: &Op, y: &Op| {
                x.outputs.iter().any(|&w| y.inputs.iter().chain(&y.outputs).any(|&u| root(u) == root(w)))
            };
            let ordered = reads(ob, oa) || class_write(oa, ob) || class_write(ob, oa);
            if ordered && pos[a] > pos[b] {
                return false;
            }
        }
    }
    true
}

/// The least bound over every valid order (the ops are few).
fn brute_force(g: &Graph, align: u64) -> u64 {
    fn go(g: &Graph, align: u64, order: &mut Vec<usize>, used: &mut Vec<bool>, best: &mut u64) {
        let n = used.len();
        if order.len() == n {
            if valid(g, order) {
                *best = (*best).min(pipeline_bound(g, order, align));
            }
            return;
        }
        for o in 0..n {
            if !used[o] {
                used[o] = true;
                order.push(o);
                go(g, align, order, used, best);
                order.pop();
                used[o] = false;
            }
        }
    }
    let n = g.ops().len();
    let mut best = u64::MAX;
    go(g, align, &mut Vec::new(), &mut vec![false; n], &mut best);
    best
}

/// A random graph: a few inputs and weights; each op reads up to three earlier tensors and
/// produces one or two results, sometimes in place over an activation it reads.
fn random_graph(seed: u64, ops: usize) -> Graph {
    let mut s = seed;
    let mut next = |m: u64| {
        s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = s;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        (z ^ (z >> 31)) % m
    };
    let mut tensors = vec![t(1 + next(64), Role::Input), t(1 + next(64), Role::Weight)];
    let mut list = Vec::new();
    let mut readable: Vec<usize> = vec![0, 1];
    for _ in 0..ops {
        let mut inputs = Vec::new();
        for _ in 0..1 + next(3) {
            let x = readable[next(readable.len() as u64) as usize];
            if !inputs.contains(&x) {
                inputs.push(x);
            }
        }
        let mut outputs = Vec::new();
        let inplace = inputs.iter().copied().find(|&x| tensors[x].role == Role::Activation);
        if let Some(base) = inplace.filter(|_| next(4) == 0) {
            tensors.push(Tensor { size: tensors[base].size, role: Role::Activation, alias_of: Some(base) });
            outputs.push(tensors.len() - 1);
        } else {
            for _ in 0..1 + next(2) {
                tensors.push(t(1 + next(100), Role::Activation));
                outputs.push(tensors.len() - 1);
            }
        }
        readable.extend(&outputs);
        list.push(op(&inputs, &outputs, if next(3) == 0 { 1 + next(50) } else { 0 }));
    }
    if next(2) == 0 {
        let last = tensors.len() - 1;
        tensors[last].role = Role::Output;
    }
    Graph::new(tensors, list).unwrap()
}

fn check(g: &Graph, s: &Schedule, align: u64) {
    let d = Dag::new(g, align);
    for c in &s.candidates {
        assert!(valid(g, &c.order), "{:?} order {:?} is not valid", c.scheduler, c.order);
        assert!(d.is_order(&c.order));
        assert_eq!(c.bound, pipeline_bound(g, &c.order, align), "{:?}", c.scheduler);
        assert!(c.bound >= s.bound, "{:?}: {} below the proven bound {}", c.scheduler, c.bound, s.bound);
    }
}

const ALL: ScheduleOptions = ScheduleOptions { scheduler: Scheduler::Npumem, work_limit: DEFAULT_SCHEDULE_WORK };

fn best(s: &Schedule) -> u64 {
    s.candidates.iter().map(|c| c.bound).min().unwrap()
}

#[test]
fn xlas_own_counterexample_is_solved_optimally() {
    // hlo_memory_scheduler.cc: A feeds B, D and E; B => C (2 units), C -> G; D, E -> F => G (2 units).
    let u = 100;
    let mut tensors = vec![t(u, Role::Input)];
    for size in [u, 2 * u, u, u, u, 2 * u, u] {
        tensors.push(t(size, Role::Activation)); // 1 a, 2 b, 3 c, 4 d, 5 e, 6 f, 7 g
    }
    tensors[7].role = Role::Output;
    let ops = vec![
        op(&[0], &[1], 0),    // A
        op(&[1], &[2], 0),    // B
        op(&[2], &[3], 0),    // C
        op(&[1], &[4], 0),    // D
        op(&[1], &[5], 0),    // E
        op(&[4, 5], &[6], 0), // F
        op(&[3, 6], &[7], 0), // G
    ];
    let g = Graph::new(tensors, ops).unwrap();
    let s = g.schedule(1, ALL);
    check(&g, &s, 1);
    let list = Dag::new(&g, 1);
    let xla_list = anchors::xla_list(&list);
    // XLA's comment: the list scheduler runs A D E F B C G (D and E tie: the later-ready E wins).
    assert_eq!((xla_list[0], &xla_list[3..]), (0, &[5, 1, 2, 6][..]), "{xla_list:?}");
    let opt = brute_force(&g, 1);
    assert!(s.exact);
    assert_eq!(best(&s), opt);
    assert_eq!(s.bound, opt);
    // With inputs live during their reader (the arena's model) both orders peak at 5 units.
    assert_eq!(list.peak(&xla_list), opt);
}

#[test]
fn a_chain_has_one_order_and_it_is_proven() {
    let mut tensors = vec![t(64, Role::Input)];
    let mut ops = Vec::new();
    for i in 0..6 {
        tensors.push(t(64 * (i + 1), Role::Activation));
        ops.push(op(&[i as usize], &[i as usize + 1], 0));
    }
    let g = Graph::new(tensors, ops).unwrap();
    let s = g.schedule(64, ALL);
    check(&g, &s, 64);
    assert!(s.exact);
    assert_eq!(best(&s), s.given_bound);
    assert_eq!(s.bound, s.given_bound);
}

#[test]
fn in_place_writes_keep_their_place() {
    // x -> a; r1 reads a; w writes a in place (b aliases a); r2 reads b. r1 must stay before w.
    let mut tensors = vec![t(8, Role::Input), t(100, Role::Activation), t(1, Role::Activation)];
    tensors.push(Tensor { size: 100, role: Role::Activation, alias_of: Some(1) });
    tensors.push(t(1, Role::Output));
    let ops = vec![op(&[0], &[1], 0), op(&[1], &[2], 0), op(&[1], &[3], 0), op(&[3, 2], &[4], 0)];
    let g = Graph::new(tensors, ops).unwrap();
    let d = Dag::new(&g, 1);
    assert!(d.preds[2].contains(&1), "the in-place write waits for the earlier reader");
    for s in Scheduler::ALL {
        let sched = g.schedule(1, ScheduleOptions { scheduler: s, work_limit: 1000 });
        check(&g, &sched, 1);
    }
    assert!(!valid(&g, &[0, 2, 1, 3]));
}

#[test]
fn a_tiny_work_limit_still_gives_a_valid_order_and_is_deterministic() {
    let g = random_graph(42, 40);
    let small = ScheduleOptions { scheduler: Scheduler::Npumem, work_limit: 50 };
    let a = g.schedule(1, small);
    let b = g.schedule(1, small);
    assert_eq!(a.candidates, b.candidates);
    check(&g, &a, 1);
    assert!(a.work <= 50 + 40 * 40, "{}", a.work);
}

#[test]
fn tensors_no_op_touches_count_at_step_zero_even_without_ops() {
    let lonely = vec![t(48, Role::Activation), t(8, Role::Input), t(16, Role::Activation)];
    let with_op = Graph::new(lonely.clone(), vec![op(&[1], &[2], 0)]).unwrap();
    let s = with_op.schedule(16, ALL);
    check(&with_op, &s, 16);
    assert_eq!(s.given_bound, 64);
    let no_ops = Graph::new(lonely, vec![]).unwrap();
    let s = no_ops.schedule(16, ALL);
    check(&no_ops, &s, 16);
    assert_eq!((s.given_bound, s.bound), (64, 64));
}

#[test]
fn names_round_trip() {
    for s in Scheduler::ALL {
        assert_eq!(Scheduler::parse(s.name()).unwrap(), s);
    }
    assert!(Scheduler::parse("random").unwrap_err().message.contains("inductor"));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]
    #[test]
    fn the_search_finds_the_brute_force_optimum(seed in any::<u64>(), ops in 1usize..7, align in prop::sample::select(vec![1u64, 16])) {
        let g = random_graph(seed, ops);
        let s = g.schedule(align, ALL);
        check(&g, &s, align);
        let opt = brute_force(&g, align);
        prop_assert!(s.exact);
        prop_assert_eq!(best(&s), opt);
        prop_assert_eq!(s.bound, opt);
    }
}
