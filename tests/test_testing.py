"""npumem.testing: the workload strategies generate what replay takes, the allocator machine
passes npumem's families, and it catches broken allocators (the example's mutated first-fit
allocator, overlap, misalignment, lying stats)."""

from __future__ import annotations

import importlib.util
import os

import pytest
from conftest import MiB
from hypothesis import given, settings

from npumem import Device, Policy
from npumem.replay import normalize, peak_live_bytes, replay
from npumem.testing import (
    AllocatorCheckError,
    DeviceAdapter,
    allocator_machine,
    check_allocator,
    policies,
    sizes,
    workloads,
)

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "examples", "bump_allocator.py")


def _example():
    spec = importlib.util.spec_from_file_location("bump_allocator", EXAMPLE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@given(workloads(max_allocs=30, size=sizes(1, 8 * MiB)))
def test_workloads_are_well_formed_and_replay(events):
    evs = normalize(events)
    allocs = [k for a, k, _ in evs if a]
    frees = [k for a, k, _ in evs if not a]
    assert sorted(allocs) == sorted(frees) and len(set(allocs)) == len(allocs)
    r = replay(events, {"capacity": "1GiB"})
    assert r.completed and r.peak_allocated >= peak_live_bytes(events)


@given(workloads(max_allocs=20, size=sizes(1, 4 * MiB), streams=3, policy=policies("npumem")))
def test_rich_workloads_carry_streams_and_policies(events):
    assert all(isinstance(e, dict) and 0 <= e["stream"] < 3 for e in events)
    honoured = (Policy.HUGE_FIRST, Policy.HUGE_ONLY, Policy.NORMAL_ONLY)
    assert all(e["policy"] in honoured for e in events if "policy" in e)
    normalize(events)


@given(sizes(100, 5000))
def test_sizes_stay_in_range(n):
    assert 100 <= n <= 5000


@given(policies("pytorch"))
def test_policies_of_the_caching_families_are_huge_first_only(policy):
    assert policy == Policy.HUGE_FIRST


@pytest.mark.parametrize("family", ["npumem", "pytorch", "torch_npu", "direct"])
def test_machine_passes_npumem_families(family):
    pol = [Policy.HUGE_FIRST, Policy.HUGE_ONLY, Policy.NORMAL_ONLY] if family in ("npumem", "direct") else None
    check_allocator(
        lambda: DeviceAdapter(Device("256MiB", allocator=family), policies=pol, streams=1), max_examples=10, steps=30
    )


TestNpumemMachine = allocator_machine(lambda: DeviceAdapter(Device("128MiB"))).TestCase
TestNpumemMachine.settings = settings(max_examples=5, stateful_step_count=20, deadline=None)


def test_example_allocator_passes_and_its_mutant_is_caught():
    ex = _example()
    check_allocator(lambda: ex.FirstFit(), size=sizes(1, 4096), max_examples=30)
    with pytest.raises(AllocatorCheckError, match="FirstFit"):
        check_allocator(lambda: ex.FirstFit(bug=True), size=sizes(1, 4096), max_examples=200)


class _Wrapped:
    """A FirstFit with one promise broken at a time."""

    def __init__(self, how):
        self.inner = _example().FirstFit()
        self.how = how
        self.alignment = 16
        self.count = 0

    def malloc(self, size):
        self.count += 1
        ptr = self.inner.malloc(size)
        if self.how == "misaligned" and self.count == 3:
            return ptr + 8
        if self.how == "same" and self.count == 2:
            self.inner.free(ptr)
            return self.inner.base  # hands out the first block again
        return ptr

    def free(self, ptr):
        if self.how == "same" and ptr == self.inner.base and ptr not in (o + self.inner.base for o in self.inner.sizes):
            return
        self.inner.free(ptr - (8 if self.how == "misaligned" and ptr % 16 else 0))

    def stats(self):
        s = self.inner.stats()
        if self.how == "stats":
            s["live_blocks"] += 1
        return s


@pytest.mark.parametrize(
    ("how", "message"),
    # "same" hands out a block it freed: an overlap when the block is live, else stats that count
    # fewer bytes than are live (hypothesis may meet either first; its example database replays it).
    [("misaligned", "alignment 16"), ("same", "inside the live block|overlapping|stats say"), ("stats", "live blocks")],
)
def test_machine_catches_broken_promises(how, message):
    with pytest.raises(AllocatorCheckError, match=message):
        check_allocator(lambda: _Wrapped(how), size=sizes(1, 256), max_examples=100, check_data=False)


def test_machine_catches_corrupted_data():
    class Scribbler:
        """Writes over the first byte of every live block on each malloc."""

        def __init__(self):
            self.inner = _example().FirstFit()

        def malloc(self, size):
            for off in self.inner.sizes:
                self.inner.arena[off] ^= 0xFF
            return self.inner.malloc(size)

        def free(self, ptr):
            self.inner.free(ptr)

        def write(self, ptr, data):
            self.inner.write(ptr, data)

        def read(self, ptr, n):
            return self.inner.read(ptr, n)

    with pytest.raises(AllocatorCheckError, match="changed"):
        check_allocator(Scribbler, size=sizes(1, 256), max_examples=100)


def test_bad_arguments():
    with pytest.raises(TypeError, match="factory"):
        allocator_machine(42)
    with pytest.raises(TypeError, match="malloc"):
        allocator_machine(lambda: object())
    with pytest.raises(TypeError, match="device"):
        DeviceAdapter("npumem")


def test_without_hypothesis_the_import_is_a_one_line_hint():
    import subprocess
    import sys

    code = "import sys; sys.modules['hypothesis'] = None; import npumem.testing"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert "MissingDependencyError: npumem.testing needs hypothesis" in r.stderr
    assert "pip install 'npumem[testing]'" in r.stderr
