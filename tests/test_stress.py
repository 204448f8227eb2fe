"""The adversarial fragmentation search (npumem.stress, `npumem stress`): well-formed mutants, a
seeded and reproducible search whose score is what a replay measures, the saved trace, the CLI's
errors and exit codes; and the regression cases the search found (tests/stress_cases)."""

from __future__ import annotations

import glob
import json
import os
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from npumem import cli, formats, stress
from npumem.replay import min_capacity, normalize, peak_live_bytes, replay

CASES = sorted(glob.glob(os.path.join(os.path.dirname(__file__), "stress_cases", "*.json")))
#: Cases on which npumem still needs more than `direct`, by one 2 MiB granule: blocks placed while
#: the device was roomy share their end pages with neighbours that die first, and those pages stay
#: pinned by a sliver of the block; the normal-frame tails of the out-of-memory path cannot undo an
#: earlier placement (docs/benchmarks.md, "Normal-frame tails"). Every other case must not lose.
KNOWN_LOSSES = {
    "npumem-capacity-s21-seed1.json",
    "npumem-capacity-s21-seed2.json",
    "npumem-capacity-tails-seed1.json",
    "npumem-capacity-tails-seed2.json",
    "npumem-capacity-tails-seed3.json",
    "npumem-capacity-tails-seed4.json",
}


def _well_formed(w):
    live = set()
    for action, i, size in w:
        assert size > 0
        if action == "alloc":
            assert i not in live
            live.add(i)
        else:
            live.remove(i)
    assert not live
    normalize(w)


@given(st.integers(0, 2**32), st.integers(2, 20), st.integers(1, 30))
def test_random_workloads_and_mutants_are_well_formed(seed, max_allocs, rounds):
    rng = random.Random(seed)
    w = stress.random_workload(rng, max_allocs)
    _well_formed(w)
    for _ in range(rounds):
        w = stress.mutate(w, rng, max_allocs)
        _well_formed(w)
        assert sum(1 for e in w if e[0] == "alloc") <= max_allocs


def test_search_is_seeded_and_its_score_is_what_a_replay_measures():
    kw = dict(evaluations=40, seed=5, max_allocs=8, compare=("npumem", "direct"))
    a = stress.search("pytorch", **kw)
    b = stress.search("pytorch", **kw)
    assert a.events == b.events and a.score == b.score and a.evaluations == 40
    _well_formed(a.events)
    assert peak_live_bytes(a.events) >= 64 << 20
    assert a.score == min_capacity(a.events, {"allocator": "pytorch"}) / stress.bound(a.events)
    assert set(a.families) == {"pytorch", "npumem", "direct"}
    assert a.families["pytorch"]["capacity_ratio"] == a.score


def test_shrinking_never_lowers_the_score():
    rng = random.Random(3)
    score_of = stress._objective("pytorch", "reserved", None, None, 0)
    w = stress.random_workload(rng, 12)
    s = score_of(w)
    small, s2 = stress.shrink(w, s, score_of)
    assert s2 >= s and len(small) <= len(w)
    _well_formed(small)


def test_oom_objective(tmp_path):
    r = stress.search("pytorch", evaluations=30, objective="oom", capacity="256MiB", seed=1, compare=("pytorch",))
    cap = 256 << 20
    done = replay(r.events, {"capacity": cap, "allocator": "pytorch"}).completed
    assert r.score == (stress.bound(r.events) / cap if done else cap / stress.bound(r.events))


def test_saved_trace_replays(tmp_path):
    r = stress.search("npumem", evaluations=20, seed=2, compare=("npumem",))
    path = tmp_path / "w.json"
    r.save(str(path))
    assert formats.load(str(path)).events() == r.events
    assert json.loads(path.read_text())["npumem_stress"]["allocator"] == "npumem"


def test_bad_arguments():
    with pytest.raises(ValueError, match="allocator"):
        stress.search("jemalloc", evaluations=1)
    with pytest.raises(ValueError, match="capacity"):
        stress.search("npumem", evaluations=1, objective="oom")
    with pytest.raises(ValueError, match="capacity"):
        stress.search("npumem", evaluations=1, capacity="1GiB")
    with pytest.raises(ValueError, match="budget"):
        stress.search("npumem", budget=-1)


# -- the command line --------------------------------------------------------------------------


def test_cli_runs_prints_and_saves(tmp_path, capsys):
    out = tmp_path / "worst.json"
    argv = ["stress", "--allocator", "torch_npu", "--evaluations", "25", "--seed", "3", "--out", str(out)]
    assert cli.main(argv) == 0
    text = capsys.readouterr().out
    assert "worst workload:" in text and "torch_npu" in text and f"trace -> {out}" in text
    assert len(formats.load(str(out)))
    assert cli.main([*argv, "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["allocator"] == "torch_npu" and rep["trace"] == str(out) and rep["evaluations"] == 25


def test_cli_oom_objective(tmp_path, capsys):
    out = tmp_path / "oom.json"
    argv = ["stress", "--allocator", "pytorch", "--objective", "oom", "--capacity", "256MiB"]
    assert cli.main([*argv, "--evaluations", "15", "--out", str(out), "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["objective"] == "oom" and rep["score"] > 0 and out.exists()


@pytest.mark.parametrize(
    ("argv", "word"),
    [
        (["--allocator", "nope"], "--allocator 'nope'"),
        (["--allocator", "npumem", "--budget", "soon"], "--budget"),
        (["--allocator", "npumem", "--budget", "0"], "--budget"),
        (["--allocator", "npumem", "--seed", "-1"], "--seed"),
        (["--allocator", "npumem", "--max-allocs", "1"], "--max-allocs"),
        (["--allocator", "npumem", "--objective", "speed"], "--objective"),
        (["--allocator", "npumem", "--objective", "oom"], "--capacity"),
        (["--allocator", "npumem", "--capacity", "1GiB"], "--capacity"),
        (["--allocator", "npumem", "--min-live", "1TiB"], "--min-live"),
        (["--allocator", "npumem", "--out", "/nonexistent/x.json"], "/nonexistent"),
        (["--allocator", "pytorch", "--alloc-conf", "bogus:1", "--evaluations", "1"], "bogus"),
        ([], "--allocator"),
    ],
)
def test_cli_errors_are_one_line_and_status_2(tmp_path, capsys, monkeypatch, argv, word):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["stress", *argv]) == 2
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err and word in err
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith(("usage:", " "))]
    assert len(lines) == 1, err


# -- regression cases: workloads where the search found npumem losing to another family ----------


@pytest.mark.parametrize("path", CASES, ids=[os.path.basename(p) for p in CASES])
def test_stress_case_npumem_does_not_regress(path):
    """Each saved case records every family's min capacity when it was found (a workload on
    which npumem lost); npumem must not need more than it did then, nor more than the best
    other family did."""
    data = json.loads(open(path).read())
    events = formats.load(path)
    recorded = data["npumem_stress"]["families"]
    now = min_capacity(events, {"allocator": "npumem"})
    assert now <= recorded["npumem"]["min_capacity"]
    best_other = min(f["min_capacity"] for fam, f in recorded.items() if fam != "npumem")
    if os.path.basename(path) in KNOWN_LOSSES:
        assert now > best_other, "npumem no longer loses here: remove the case from KNOWN_LOSSES"
        pytest.xfail(f"known loss: npumem needs {now:,} B, another family {best_other:,} B")
    assert now <= best_other, f"npumem needs {now:,} B, another family {best_other:,} B"
