"""PyTorch traces read by npumem.formats.load (torch.profiler Chrome traces, memory snapshots),
and the recorded real traces under benches/traces."""

from __future__ import annotations

import gzip
import json
import pathlib
import pickle

import pytest

import npumem
from npumem.formats import load
from npumem.replay import min_capacity, peak_live_bytes, replay
from npumem.workloads import transformer_training

TRACES = sorted((pathlib.Path(__file__).resolve().parents[1] / "benches" / "traces").glob("*.json.gz"))
MiB = 1 << 20


def memory_event(ts, addr, nbytes, device_type=0):
    args = {"Addr": addr, "Bytes": nbytes, "Device Type": device_type}
    return {"name": "[memory]", "ph": "i", "ts": ts, "args": args}


def test_profiler_trace_pairs_allocs_and_frees_by_address(tmp_path):
    trace = {
        "traceEvents": [
            {"name": "aten::empty", "ph": "X", "ts": 0},
            memory_event(3.0, 0x1000, -64),  # free of memory from before the trace: dropped
            memory_event(1.0, 0x1000, 4096),
            memory_event(2.0, 0x2000, 512),
            memory_event(4.0, 0x1000, -4096),
            memory_event(5.0, 0x1000, 8192),  # the address is reused: a new id
            memory_event(6.0, 0x9000, 100, device_type=1),  # another device type
        ]
    }
    events = load(trace).events()
    assert events == [  # the address reused after its free is a new id
        ("alloc", 0, 4096),
        ("alloc", 1, 512),
        ("free", 0, 4096),
        ("alloc", 2, 8192),
    ]
    path = tmp_path / "t.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump(trace, f)
    assert load(path).events() == events
    assert load(trace, device_type=1).events() == [("alloc", 0, 100)]
    assert peak_live_bytes(load(trace)) == peak_live_bytes(events) == 4096 + 512 + 8192 - 4096


def test_profiler_trace_without_memory_events_is_refused():
    with pytest.raises(npumem.InvalidParamError, match="profile_memory=True"):
        load({"traceEvents": [{"name": "aten::add", "ph": "X"}]})
    with pytest.raises(npumem.InvalidParamError, match="device type 7"):
        load({"traceEvents": [memory_event(0, 1, 1)]}, device_type=7)


def test_snapshot_trace_round_trips_a_replay(tmp_path):
    trace = transformer_training(layers=2, hidden=256, vocab=1000, steps=2)
    dev = npumem.Device("4GiB", allocator="pytorch")
    dev.record_memory_history()
    replay(trace, dev)
    path = tmp_path / "snap.pickle"
    dev.dump_snapshot(str(path))
    with open(path, "rb") as f:
        snap = pickle.load(f)
    events = load(path).events()
    assert events == load(snap).events()
    allocs = [e for e in events if e[0] == "alloc"]
    assert len(allocs) == sum(1 for e in trace if e[0] == "alloc")
    # Sizes are the allocator's blocks: 512-byte multiples at least as large as the requests.
    assert sorted(s for _, _, s in allocs) >= sorted(s for a, _, s in trace if a == "alloc")
    assert all(s % 512 == 0 for _, _, s in allocs)
    with pytest.raises(npumem.InvalidParamError, match="device 3"):
        load(snap, device=3)


@pytest.mark.parametrize("path", TRACES, ids=[p.name for p in TRACES])
def test_recorded_torch_traces_meet_the_capacity_goal(path):
    events = load(str(path))
    assert len(events) > 1000 and events.source == str(path)
    peak = peak_live_bytes(events)
    ours = min_capacity(events, {"allocator": "npumem"}, granularity=MiB)
    theirs = min_capacity(events, {"allocator": "pytorch"}, granularity=MiB)
    assert ours <= theirs
    assert ours <= peak * 1.02 + MiB
    result = replay(events, {"capacity": ours, "allocator": "npumem"})
    assert result.completed and result.peak_allocated >= peak


def test_recorded_traces_are_present():
    names = {p.name for p in TRACES}
    assert {"torch_cpu_transformer.json.gz", "torch_cpu_convnet.json.gz"} <= names
