"""Replays the inputs kept under fuzz/regressions/readers and fuzz/regressions/trace_readers
(found by `make fuzz`, or written as seeds and as the crashes they stand for) through the Python
readers' fuzz checks (fuzz/readers.py, fuzz/trace_readers.py), without atheris: a reader raises
only npumem's documented errors, and what it accepts is what the file says, plans (problems and
graphs) or round-trips through every trace writer (traces)."""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TARGETS = ("readers", "trace_readers")
INPUTS = [(t, p) for t in TARGETS for p in sorted((ROOT / "fuzz" / "regressions" / t).iterdir())]


@functools.cache
def _harness(target: str):
    spec = importlib.util.spec_from_file_location(f"fuzz_{target}", ROOT / "fuzz" / f"{target}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("target", TARGETS)
def test_inputs_are_kept(target):
    kept = [p for t, p in INPUTS if t == target]
    assert len(kept) >= 4, f"fuzz/regressions/{target} holds at least the seeds"


def test_every_trace_reader_is_driven_by_a_kept_input():
    kinds = _harness("trace_readers").KINDS
    first = {p.read_bytes()[0] % len(kinds) for t, p in INPUTS if t == "trace_readers"}
    assert first == set(range(len(kinds))), [k for i, k in enumerate(kinds) if i not in first]


@pytest.mark.parametrize(("target", "path"), INPUTS, ids=[f"{t}/{p.name}" for t, p in INPUTS])
def test_reader_input(target: str, path: Path):
    _harness(target).check(path.read_bytes())
