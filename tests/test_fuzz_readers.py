"""Replays the inputs kept under fuzz/regressions/readers (found by `make fuzz`, or written as
seeds) through the Python readers' fuzz check (fuzz/readers.py), without atheris: a reader
raises only npumem's documented errors, and what it accepts is what the file says and plans."""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
INPUTS = sorted((ROOT / "fuzz" / "regressions" / "readers").iterdir())


@functools.cache
def _readers():
    spec = importlib.util.spec_from_file_location("fuzz_readers", ROOT / "fuzz" / "readers.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_inputs_are_kept():
    assert len(INPUTS) >= 4, "fuzz/regressions/readers holds at least the seeds"


@pytest.mark.parametrize("path", INPUTS, ids=[p.name for p in INPUTS])
def test_reader_input(path: Path):
    _readers().check(path.read_bytes())
