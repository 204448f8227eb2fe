"""Static memory planning: every strategy gives valid plans; baselines match published figures."""

from __future__ import annotations

import glob
import os

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from npumem import InvalidParamError, cli
from npumem.plan import DEFAULT_STRATEGY, DEFAULT_WORK_LIMIT, STRATEGIES, Problem, solve

DSA = os.path.join(os.path.dirname(__file__), "..", "benches", "dsa")
CHALLENGING = sorted(glob.glob(os.path.join(DSA, "minimalloc", "*.csv")))
RESNET = os.path.join(DSA, "somas", "resnet50.csv")
CAPACITY = 1_048_576
#: Exact searches in these tests are bounded by work (search nodes per portfolio thread), not
#: by time: their outcome is the same on a loaded CI machine as on a quiet one.
WORK = {"time_limit": None, "work_limit": 2_000_000}


def check(problem: Problem, plan) -> None:
    assert problem.validate(plan.offsets) == plan.peak
    assert plan.peak >= problem.lower_bound
    assert np.all(plan.offsets % problem.alignment == 0)


def test_strategies_are_named_and_default_is_npumem():
    assert STRATEGIES == (
        "naive",
        "tflite_greedy_by_size",
        "tvm_greedy_by_size",
        "tvm_greedy_by_conflicts",
        "best_fit_in_order",
        "tflite_greedy_by_breadth",
        "npumem",
    )
    assert DEFAULT_STRATEGY == "npumem"


def test_docstring_example():
    p = Problem.from_buffers([(0, 2, 100), (1, 3, 50), (2, 4, 100)])
    plan = p.solve()
    assert (plan.peak, plan.lower_bound, plan.gap) == (150, 150, 0.0)
    check(p, plan)


@pytest.mark.parametrize("path", CHALLENGING, ids=lambda p: os.path.basename(p)[0])
def test_challenging_instances_every_strategy_valid(path):
    assert len(CHALLENGING) == 11
    p = Problem.from_csv(path)
    plans = {s: p.solve(s, time_limit=0) for s in STRATEGIES}
    for plan in plans.values():
        check(p, plan)
        assert plan.exact == "not run"
    assert plans["naive"].peak == p.naive_total
    # The greedy part of the default never loses to a baseline, and beats the best one here
    # (improvement phase); greedy orders land 12-45% above capacity on this suite, it 7-36%.
    best_baseline = min(plan.peak for s, plan in plans.items() if s != "npumem")
    assert plans["npumem"].peak < best_baseline
    assert 0.05 <= plans["npumem"].gap <= 0.36
    # With the defaults (no time limit, DEFAULT_WORK_LIMIT nodes), the exact search places every
    # instance within MiniMalloc's capacity: the same answer on a loaded machine as on a quiet one.
    exact = p.solve(capacity=CAPACITY)
    assert 0 < exact.search_nodes <= DEFAULT_WORK_LIMIT
    check(p, exact)
    assert exact.peak <= CAPACITY and exact.fits
    assert exact.exact == "reached capacity"


@pytest.mark.parametrize("name", ["A", "C"])
def test_exact_search_proves_optimality_without_a_capacity(name):
    # A's bound equals the capacity; C's bound (1,039,360) is below it and is reached too; the
    # default work limit suffices (A's proof at the bound takes 18,777 nodes of its half).
    p = Problem.from_csv(next(c for c in CHALLENGING if os.path.basename(c)[0] == name))
    plan = p.solve()
    check(p, plan)
    assert plan.optimal and plan.exact == "optimal"
    assert plan.peak == plan.bound == p.lower_bound
    r = plan.report()
    assert r["optimal"] is True and r["proven_bound"] == p.lower_bound and r["reach_theory_rate"] == 1.0


def test_exact_search_outcomes_and_bad_limits():
    p = Problem.from_buffers([(0, 2, 8), (1, 3, 8)])
    assert p.solve().exact == "not run"  # the greedy plan is at the bound
    below = p.solve(capacity=15)
    assert (below.exact, below.bound, below.fits) == ("infeasible", 16, False)
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(InvalidParamError, match="time_limit"):
            p.solve(time_limit=bad)
    with pytest.raises(InvalidParamError, match=r"time_limit None .* needs a work_limit"):
        p.solve(time_limit=None, work_limit=None)
    with pytest.raises(InvalidParamError, match="work_limit"):
        p.solve(work_limit=-1)
    with pytest.raises(InvalidParamError, match="capacity"):
        p.solve(capacity=-5)
    for bad in (1.5, True):
        with pytest.raises(TypeError, match="capacity"):
            p.solve(capacity=bad)


def test_capacity_below_the_bound_reports_the_best_plan_found():
    # C's optimum is its max-live bound, 1,039,360 B: a capacity 360 B below it is impossible, and
    # the plan says so with the bound and the best plan the exact search found, not the greedy one.
    c = Problem.from_csv(next(p for p in CHALLENGING if os.path.basename(p)[0] == "C"))
    plan = c.solve(capacity=1_039_000, **WORK)
    check(c, plan)
    assert (plan.exact, plan.peak, plan.bound, plan.optimal, plan.fits) == (
        "infeasible",
        1_039_360,
        1_039_360,
        True,
        False,
    )
    assert "impossible: 1,039,360 B are live at once" in plan.verdict
    assert "best plan found 1,039,360 B (360 B over, optimal)" in plan.verdict
    # The work limit makes the search repeatable: the same plan and node count every time, and
    # "work limit reached" (not "timed out") when it is too small.
    again = c.solve(capacity=1_039_000, **WORK)
    assert np.array_equal(again.offsets, plan.offsets) and again.search_nodes == plan.search_nodes > 0
    short = c.solve(time_limit=None, work_limit=10)
    assert (short.exact, short.optimal, short.search_nodes) == ("work limit reached", False, 10)
    assert short.report()["search_nodes"] == 10


def test_resnet50_matches_published_baselines():
    # Measured by the team: TVM greedy_by_size +19.9%, greedy_by_conflicts +11.7% on SOMAS ResNet-50.
    p = Problem.from_csv(RESNET)
    assert len(p) == 1042
    gaps = {s: p.solve(s).gap for s in STRATEGIES}
    assert round(100 * gaps["tvm_greedy_by_size"], 1) == 19.9
    assert round(100 * gaps["tvm_greedy_by_conflicts"], 1) == 11.7
    assert gaps["npumem"] <= min(g for s, g in gaps.items() if s != "npumem")
    assert gaps["npumem"] < 0.005


@given(
    st.lists(
        st.tuples(st.integers(0, 30), st.integers(1, 10), st.integers(1, 10_000)),
        min_size=1,
        max_size=60,
    ),
    st.sampled_from([1, 8, 64, 512]),
)
def test_random_problems_every_strategy_valid(rows, alignment):
    p = Problem.from_buffers([(lo, lo + d, s) for lo, d, s in rows], alignment=alignment)
    for s in STRATEGIES:
        plan = solve(p, s, time_limit=None, work_limit=20_000)
        check(p, plan)
        assert plan.lower_bound <= plan.bound <= plan.peak
        assert plan.optimal == (plan.peak == plan.bound)


def test_csv_round_trip_and_report(tmp_path):
    p = Problem.from_csv(CHALLENGING[0])
    plan = p.solve(capacity=CAPACITY, time_limit=0)
    out = tmp_path / "plan.csv"
    plan.to_csv(out)
    back = Problem.from_csv(out)
    assert back.ids == p.ids and back.offsets is not None
    assert np.array_equal(back.offsets, plan.offsets)
    assert back.validate(back.offsets) == plan.peak
    r = plan.report()
    assert r["buffers"] == 154 and r["lower_bound"] == 1_048_576 and r["fits"] is False
    assert r["reach_theory_rate"] == pytest.approx(1_048_576 / plan.peak)
    assert r["reuse_ratio"] == pytest.approx(1 - plan.peak / p.naive_total)


def test_validate_names_overlapping_buffers():
    p = Problem.from_buffers([(0, 2, 64), (1, 3, 64)], ids=["x", "y"], alignment=64)
    assert p.validate([0, 64]) == 128
    with pytest.raises(InvalidParamError, match=r"buffer 'y' \(offset 0\) and 'x' .*overlap in address"):
        p.validate([0, 0])
    with pytest.raises(InvalidParamError, match="multiple of the alignment"):
        p.validate([0, 96])
    with pytest.raises(InvalidParamError, match="one offset per buffer"):
        p.validate([0])


@pytest.mark.parametrize(
    ("rows", "alignment", "match"),
    [
        ([(3, 3, 8)], 1, "is empty"),
        ([(0, 1, 0)], 1, "size is 0"),
        ([(0, 1, 8)], 3, "power of two"),
        ([(0, 1, 8)], 0, "alignment must be an int from 1"),
        ([(0, 1, -8)], 1, r"size\[0\] must be an int from 0 to 2\*\*64-1, got -8"),
        ([(0, 1, 2**63), (0, 1, 2**63)], 1, "2\\^64"),
    ],
)
def test_bad_problems_raise(rows, alignment, match):
    with pytest.raises(InvalidParamError, match=match):
        Problem.from_buffers(rows, alignment=alignment)


def test_bad_csv_and_strategy_raise(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("id,lower\n0,1\n")
    with pytest.raises(InvalidParamError, match="id,lower,upper,size"):
        Problem.from_csv(bad)
    bad.write_text("id,lower,upper,size\n0,1,x,4\n")
    with pytest.raises(InvalidParamError, match=r":2: lower, upper, size \(and offset\) must be integers"):
        Problem.from_csv(bad)
    bad.write_text("id,lower,upper,size\nconv1,0,4,64\nrelu1,5,5,64\n")
    with pytest.raises(InvalidParamError, match="buffer 'relu1': lifetime \\[5, 5\\) is empty"):
        Problem.from_csv(bad)
    with pytest.raises(InvalidParamError, match=r"strategy .magic. is unknown; use one of naive"):
        Problem.from_buffers([(0, 1, 8)]).solve("magic")


def test_cli_plan(tmp_path, capsys):
    out = tmp_path / "a.csv"
    args = ["plan", CHALLENGING[0], "--strategy", "all", "--capacity", "1048576", "--out", str(out)]
    assert cli.main([*args, "--time-limit", "0"]) == 1
    text = capsys.readouterr().out
    assert "does NOT fit" in text and all(s in text for s in STRATEGIES)
    assert Problem.from_csv(out).offsets is not None
    assert cli.main([*args, "--work-limit", "2000000"]) == 0
    text = capsys.readouterr().out
    assert "exact: reached capacity" in text and "npumem fits" in text
    assert Problem.from_csv(out).validate(Problem.from_csv(out).offsets) <= CAPACITY
    assert cli.main(["plan", RESNET, "--capacity", "2GiB", "--json"]) == 0
    assert '"reach_theory_rate"' in capsys.readouterr().out
    assert cli.main(["plan", str(tmp_path / "missing.csv")]) == 2
    assert "npumem plan:" in capsys.readouterr().err


def test_from_trace_lifetimes_and_errors():
    events = [("alloc", 7, 100), ("alloc", 8, 50), ("free", 7, 100), ("alloc", 9, 100), ("free", 8, 50)]
    p = Problem.from_trace(events, alignment=1)
    assert p.ids == ("7", "8", "9")
    assert p.lower.tolist() == [0, 1, 3] and p.upper.tolist() == [2, 4, 5] and p.size.tolist() == [100, 50, 100]
    assert p.lower_bound == 150 and p.solve().peak == 150
    with pytest.raises(InvalidParamError, match="allocated twice"):
        Problem.from_trace([("alloc", 1, 8), ("alloc", 1, 8)])
    with pytest.raises(InvalidParamError, match="not live"):
        Problem.from_trace([("free", 1, 8)])
    with pytest.raises(InvalidParamError, match="neither"):
        Problem.from_trace([("malloc", 1, 8)])


def test_planning_the_demo_trace_reaches_the_bound():
    from npumem.replay import min_capacity
    from npumem.workloads import transformer_training

    trace = transformer_training(layers=4, hidden=1024, steps=2, batch=(2, 6), seq=(256, 768))
    p = Problem.from_trace(trace)
    plan = p.solve()
    check(p, plan)
    assert plan.gap < 0.001
    # Offline planning never needs more than the best online pool.
    assert plan.peak <= min_capacity(trace, {"allocator": "npumem"})


def test_plot_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "a.png"
    assert (
        cli.main(["plan", CHALLENGING[0], "--capacity", "1048576", "--plot", str(out), "--work-limit", "2000000"]) == 0
    )
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    Problem.from_csv(RESNET).solve().plot(tmp_path / "r.png")
    assert (tmp_path / "r.png").stat().st_size > 10_000


def test_shared_object_strategy_and_positional_bound():
    # Step 0 holds {100, 50}, step 1 {80, 70}: max live 150; positional maxima 100 + 70 = 170,
    # which TFLite's greedy-by-breadth reaches (objects of 100 and 70).
    p = Problem.from_buffers([(0, 1, 100), (0, 1, 50), (1, 2, 80), (1, 2, 70)])
    assert (p.lower_bound, p.positional_bound) == (150, 170)
    plan = p.solve("tflite_greedy_by_breadth")
    check(p, plan)
    assert plan.peak == 170 and plan.report()["shared_object_bound"] == 170
    assert "shared_object_bound" not in p.solve().report()
    r = Problem.from_csv(RESNET)
    assert r.positional_bound >= r.lower_bound
    assert r.solve("tflite_greedy_by_breadth").peak >= r.positional_bound


def test_sizes_up_to_2_pow_64_are_valid():
    # numpy reads [2**63, 10] as float64: each value is checked as an int instead, and kept exact.
    p = Problem.of(["a", "b"], [0, 0], [1, 1], [2**63, 10])
    assert p.size.tolist() == [2**63, 10] and p.lower_bound == 2**63 + 10
    assert Problem.of(["a"], [0], [2**64 - 1], [2**64 - 512], alignment=512).lower_bound == 2**64 - 512
