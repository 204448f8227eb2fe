"""Scheduling: ``Graph.plan(schedule=...)`` and ``npumem plan --schedule`` on the example graphs
from torch.export / make_fx (examples/graphs/) and the recorded training graphs (benches/graphs/),
every plan checked by an independent checker that reads only the graph file and the JSON plan."""

from __future__ import annotations

import gzip
import json
import os
import sys

import pytest
from conftest import require_torch
from hypothesis import given, settings
from hypothesis import strategies as st

from npumem import InvalidParamError, cli
from npumem.graph import SCHEDULERS, Graph

ROOT = os.path.join(os.path.dirname(__file__), "..")
EXAMPLES = os.path.join(ROOT, "examples", "graphs")
NAMES = ("randwire_s0", "randwire_s1", "randwire_s2", "inception", "unet", "cnn_train_sgd")


def path(name: str) -> str:
    return os.path.join(EXAMPLES, f"{name}.json")


def load_dict(p: str) -> dict:
    with (gzip.open if p.endswith(".gz") else open)(p, "rt") as f:
        return json.load(f)


def test_the_example_graphs_are_what_record_py_makes_of_models_py():
    # The fixtures are recorded, not hand-written: two of them (a torch.export inference graph and
    # the make_fx training step) are recorded again here and must be the files, op for op.
    torch = require_torch()
    sys.path.insert(0, EXAMPLES)
    try:
        from record import builders
    finally:
        sys.path.remove(EXAMPLES)
    for name in ("inception", "cnn_train_sgd"):
        torch.manual_seed(0)
        assert builders()[name]().to_dict() == load_dict(path(name)), name


def check(graph: dict, plan: dict) -> int:
    """Checks a JSON plan against its graph file without npumem: the order lists every op once,
    each op runs after the producers of what it reads, every op writing a tensor of an alias
    class keeps its program order relative to the other ops touching that class, every planned
    tensor's placement spans exactly the steps its class is live in that order, no two placements
    live at one step overlap, and the arena is the largest end. Returns the arena."""
    align = graph["alignment"]
    ops = graph["ops"]
    order = plan["order"]
    assert sorted(order) == sorted(o[0] for o in ops), "the order lists every op once"
    pos = {name: k for k, name in enumerate(order)}
    tensors = {t[0]: t for t in graph["tensors"]}

    def root(t: str) -> str:
        while tensors[t][3] is not None:
            t = tensors[t][3]
        return t

    producer = {out: o[0] for o in ops for out in o[2]}
    touching: dict[str, list[tuple[str, bool]]] = {}
    for name, ins, outs, _, _ in ops:
        for t in ins:
            if t in producer and producer[t] != name:
                assert pos[producer[t]] < pos[name], f"{name} runs before the producer of {t}"
        classes = {root(t): False for t in ins} | {root(t): True for t in outs}
        for c, writes in classes.items():
            touching.setdefault(c, []).append((name, writes))
    for c, seq in touching.items():
        for i, (a, wa) in enumerate(seq):
            for b, wb in seq[i + 1 :]:
                if wa or wb:
                    assert pos[a] < pos[b], f"{a} and {b} both touch {c}, one writes it: program order kept"
    resident = {root(t) for t, (_, _, role, _) in tensors.items() if role != "activation"}
    pieces = []
    for c, seq in touching.items():
        members = [t for t in tensors if root(t) == c]
        placed = {json.dumps(plan["tensors"][t]["placements"]) for t in members}
        assert len(placed) == 1, f"members of {c} share one placement"
        got = plan["tensors"][c]["placements"]
        if c in resident:
            assert got == [], f"{c} is resident"
            continue
        steps = [pos[name] for name, _ in seq]
        size = -(-max(tensors[t][1] for t in members) // align) * align
        assert got == [[min(steps), max(steps) + 1, got[0][2]]], f"{c}: {got} vs steps {min(steps)}..{max(steps)}"
        pieces.append((min(steps), max(steps) + 1, got[0][2], size, c))
    for name, _, _, ws, _ in ops:
        if ws:
            got = plan["workspaces"][name]
            assert got[0][:2] == [pos[name], pos[name] + 1]
            pieces.append((pos[name], pos[name] + 1, got[0][2], -(-ws // align) * align, f"workspace {name}"))
    for i, (lo, hi, off, size, who) in enumerate(pieces):
        assert off % align == 0
        for lo2, hi2, off2, size2, who2 in pieces[i + 1 :]:
            if lo < hi2 and lo2 < hi:
                assert off + size <= off2 or off2 + size2 <= off, f"{who} and {who2} overlap"
    arena = max((off + size for _, _, off, size, _ in pieces), default=0)
    assert arena == plan["report"]["activation_memory"]
    return arena


@pytest.mark.parametrize("name", NAMES)
def test_example_graphs_schedule_valid_plans_no_worse_than_any_anchor(name):
    g = Graph.load(path(name))
    p = g.plan(schedule=True)
    s = p.schedule
    assert s is not None and s.scheduler in SCHEDULERS
    arena = check(load_dict(path(name)), p.to_json())
    assert arena == p.arena.peak
    by = {c.scheduler: c for c in s.candidates}
    assert {"given", "xla", "inductor"} <= set(by)
    assert arena <= min(c.arena for c in s.candidates) and arena <= s.given_bound
    assert s.bound <= arena
    assert by["given"].bound == s.given_bound
    # The same plan on every run: the search is bounded by work, not time.
    again = g.plan(schedule=True)
    assert again.schedule.order == s.order and again.arena.peak == arena


def test_where_the_order_matters_npumem_is_strictly_below_every_anchor_and_proves_it():
    for name in ("randwire_s1", "randwire_s2"):
        s = Graph.load(path(name)).plan(schedule=True).schedule
        anchors = [c.arena for c in s.candidates if c.scheduler != "npumem"]
        assert s.scheduler == "npumem" and min(c.arena for c in s.candidates) < min(anchors), name
        assert s.optimal and s.exact, name
    # Where XLA's DFS and Inductor's LPMF already find the best order, the search proves it.
    s0 = Graph.load(path("randwire_s0")).plan(schedule=True).schedule
    assert s0.optimal and s0.bound < s0.given_bound


@pytest.mark.parametrize("name", ["inception", "unet", "cnn_train_sgd"])
def test_where_the_given_order_is_optimal_the_bound_proves_it(name):
    # The peak sits where every live tensor must be live in any order (a concatenation, the
    # decoder's last skip, the saved activations of a training step).
    p = Graph.load(path(name)).plan(schedule=True)
    assert p.schedule.optimal and p.arena.peak == p.schedule.given_bound == p.schedule.bound


def test_recorded_training_graph_is_proven_optimal_in_its_given_order():
    name = os.path.join(ROOT, "benches", "graphs", "resnet18_train_bs32.json.gz")
    p = Graph.load(name).plan(schedule=True)
    assert p.schedule.optimal and p.arena.peak == p.schedule.given_bound
    check(load_dict(name), p.to_json())


def test_one_scheduler_at_a_time_and_mem_limit_after_the_order():
    g = Graph.load(path("randwire_s2"))
    for s in ("given", "xla", "inductor"):
        p = g.plan(schedule=s)
        assert [c.scheduler for c in p.schedule.candidates] == [s]
        check(load_dict(path("randwire_s2")), p.to_json())
    best = g.plan(schedule=True)
    given = g.plan()
    # A limit the chosen order meets without moves, and the given order does not.
    limit = best.peak_memory
    assert given.peak_memory > limit
    assert g.plan(schedule=True, mem_limit=limit).moves == ()
    assert g.plan(mem_limit=limit).moves != ()


def test_cli_schedule_json_is_checkable_without_npumem(capsys):
    assert cli.main(["plan", path("randwire_s1"), "--schedule", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    check(load_dict(path("randwire_s1")), plan)
    assert plan["report"]["schedule_optimal"] is True
    assert {c["scheduler"] for c in plan["candidates"]} == {"given", "xla", "inductor", "npumem"}
    assert cli.main(["plan", path("unet"), "--schedule", "--strategy", "xla", "--work-limit", "1000"]) == 0
    out = capsys.readouterr().out
    assert "xla" in out and "any order needs" in out


def test_cli_schedule_usage_errors(capsys):
    assert cli.main(["plan", path("unet"), "--schedule", "--strategy", "tvm_greedy_by_size"]) == 2
    assert "given, xla, inductor, npumem" in capsys.readouterr().err
    csv = os.path.join(ROOT, "benches", "dsa", "minimalloc", "C.1048576.csv")
    assert cli.main(["plan", csv, "--schedule"]) == 2
    assert "--schedule applies to graphs" in capsys.readouterr().err


def test_bad_schedule_arguments_name_the_argument():
    g = Graph.load(path("unet"))
    with pytest.raises(InvalidParamError, match="schedule"):
        g.plan(schedule="random")
    with pytest.raises(TypeError, match="schedule"):
        g.plan(schedule=3)
    with pytest.raises(InvalidParamError, match="schedule_work"):
        g.plan(schedule=True, schedule_work=-1)


def test_training_step_with_sgd_from_torch_keeps_updates_after_reads():
    import torch

    from npumem.torch_graphs import from_training

    net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    g = from_training(net, torch.randn(4, 16), lr=0.1)
    updates = [o for o in g.ops if o.startswith("sub_")]
    assert len(updates) == 4, g.ops
    p = g.plan(schedule=True)
    check(g.to_dict(), p.to_json())
    with pytest.raises(InvalidParamError, match="lr"):
        from_training(net, torch.randn(4, 16), lr=-1.0)


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 2**32), st.integers(1, 12), st.sampled_from([1, 64]))
def test_random_graphs_give_plans_the_checker_accepts(seed, n_ops, alignment):
    import random

    rng = random.Random(seed)
    g = Graph(alignment=alignment)
    readable = [g.input("x", rng.randint(1, 500)), g.weight("w", rng.randint(1, 500))]
    for k in range(n_ops):
        ins = list(dict.fromkeys(rng.choice(readable) for _ in range(rng.randint(1, 3))))
        acts = [t for t in ins if g.role(t) == "activation"]
        if acts and rng.random() < 0.25:
            outs = [g.alias(f"a{k}", acts[0])]  # in place over an activation it reads
        else:
            outs = [(f"t{k}_{j}", rng.randint(1, 900)) for j in range(rng.randint(1, 2))]
        first = g.op(f"op{k}", ins, outs, workspace=rng.choice([0, 0, rng.randint(1, 300)]))
        readable += [first] + [o[0] for o in outs[1:] if isinstance(o, tuple)]
    g.mark_output(readable[-1])
    for scheduler in SCHEDULERS:
        p = g.plan(schedule=scheduler, schedule_work=5_000)
        assert check(g.to_dict(), p.to_json()) == p.arena.peak
        assert p.schedule.bound <= p.arena.peak


def test_the_checker_rejects_broken_plans():
    graph = load_dict(path("randwire_s1"))
    good = Graph.load(path("randwire_s1")).plan(schedule=True).to_json()
    check(graph, good)
    swapped = json.loads(json.dumps(good))
    swapped["order"][0], swapped["order"][-1] = swapped["order"][-1], swapped["order"][0]
    with pytest.raises(AssertionError, match=r"runs before the producer|program order"):
        check(graph, swapped)
    overlapping = json.loads(json.dumps(good))
    placed = [t for t, v in overlapping["tensors"].items() if v["placements"] and v["alias_of"] is None]
    for t in placed:  # every class at offset 0: two live at one step collide
        for v in overlapping["tensors"].values():
            if v["placements"] == good["tensors"][t]["placements"]:
                v["placements"] = [[*v["placements"][0][:2], 0]]
    with pytest.raises(AssertionError, match="overlap"):
        check(graph, overlapping)
