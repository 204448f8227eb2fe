"""One reader and the deprecated trace names.

- ``npumem.formats.load`` reads every format :data:`npumem.formats.FORMATS` names (and loaded
  PyTorch dicts) as a :class:`npumem.formats.Trace`, the events of the trace written.
- ``npumem.traces`` and ``npumem.importers`` are aliases: each call warns with a
  ``DeprecationWarning`` naming the new name, and returns what it always returned (event
  lists, the file's own ids).
"""

from __future__ import annotations

import gzip
import json
import pickle

import pytest

import npumem
from npumem import formats, importers, traces, workloads
from npumem.formats import FORMATS, Trace

EVENTS = [("alloc", 0, 4096), ("alloc", 1, 512), ("free", 0, 4096), ("alloc", 2, 8192), ("free", 1, 512)]


def _written(tmp_path) -> dict[str, tuple[str, list]]:
    """A file of each format, holding EVENTS: {format: (path, the events a load gives)}."""
    t = Trace.from_events(EVENTS)
    out = {}
    formats.write_rmm_csv(t, tmp_path / "t.csv")
    out["rmm-csv"] = (tmp_path / "t.csv", EVENTS)
    formats.write_npz(t, tmp_path / "t.npz")
    out["npz"] = (tmp_path / "t.npz", EVENTS)
    formats.write_profiler_trace(t, tmp_path / "p.json.gz")
    out["profiler"] = (tmp_path / "p.json.gz", EVENTS)
    (tmp_path / "c.json").write_text(json.dumps({"events": [list(e) for e in EVENTS]}))
    out["compact-json"] = (tmp_path / "c.json", EVENTS)
    dev = npumem.Device("1GiB", allocator="pytorch")
    dev.record_memory_history()
    ptrs = {}
    for action, i, size in EVENTS:
        if action == "alloc":
            ptrs[i] = dev.malloc(size)
        else:
            dev.free(ptrs.pop(i))
    formats.write_snapshot(dev, tmp_path / "s.pickle")
    # The snapshot records the blocks the allocator granted (512-byte multiples): these sizes.
    out["snapshot"] = (tmp_path / "s.pickle", EVENTS)
    return out


def test_load_reads_every_format(tmp_path):
    files = _written(tmp_path)
    assert set(files) == set(FORMATS)
    for kind, (path, events) in files.items():
        assert formats.detect(path) == kind
        trace = formats.load(path)
        assert isinstance(trace, Trace) and trace.source == str(path), kind
        assert trace.events() == events, kind
        assert trace.peak_live() == npumem.replay.peak_live_bytes(events) == 4096 + 512 + 8192 - 4096


def test_load_reads_loaded_pytorch_dicts(tmp_path):
    files = _written(tmp_path)
    profiler = json.loads(gzip.open(files["profiler"][0]).read())
    snapshot = pickle.loads(files["snapshot"][0].read_bytes())
    compact = json.loads(files["compact-json"][0].read_text())
    for loaded in (profiler, snapshot, compact):
        trace = formats.load(loaded)
        assert trace.events() == EVENTS and trace.source == "the trace"
    with pytest.raises(npumem.InvalidParamError, match="without traceEvents"):
        formats.load({"rows": []})


def test_load_options_belong_to_their_format(tmp_path):
    files = _written(tmp_path)
    assert formats.load(files["profiler"][0], device_type=0).events() == EVENTS
    assert formats.load(files["snapshot"][0], device=0).events() == EVENTS
    with pytest.raises(npumem.InvalidParamError, match=r"device_type applies to torch\.profiler traces"):
        formats.load(files["npz"][0], device_type=0)
    with pytest.raises(npumem.InvalidParamError, match="device applies to memory snapshots"):
        formats.load(files["compact-json"][0], device=1)
    with pytest.raises(npumem.InvalidParamError, match="device 1 is not one"):
        formats.load(files["snapshot"][0], device=1)


def test_load_of_a_compact_trace_is_the_trace_of_its_events(tmp_path):
    path = tmp_path / "c.json"
    events = [["alloc", [16, 0], 100], ["alloc", "b", 7], ["free", [16, 0], 100], ["free", "b", 7]]
    path.write_text(json.dumps({"events": events}))
    assert formats.load(path).events() == [("alloc", 0, 100), ("alloc", 1, 7), ("free", 0, 100), ("free", 1, 7)]


# -- the deprecated names ------------------------------------------------------------------------


def _warns(name: str):
    return pytest.warns(DeprecationWarning, match=rf"^npumem\.{name} is deprecated; use npumem\.")


def test_traces_load_warns_and_returns_the_files_events(tmp_path):
    path = tmp_path / "c.json"
    events = [["alloc", [16, 0], 100], ["alloc", "b", 7], ["free", [16, 0]], ["free", "b", 7]]
    path.write_text(json.dumps({"events": [e + [0] * (3 - len(e)) for e in events]}))
    with _warns("traces.load"):
        got = traces.load(str(path))
    assert got == [("alloc", (16, 0), 100), ("alloc", "b", 7), ("free", (16, 0), 0), ("free", "b", 7)]
    assert formats.Trace.from_events(got).events() == formats.load(path).events()


def test_traces_generators_warn_and_return_the_workloads_events():
    kw = {"layers": 2, "hidden": 256, "vocab": 1000, "steps": 2}
    with _warns("traces.transformer_training"):
        assert traces.transformer_training(**kw) == workloads.transformer_training(**kw)
    with _warns("traces.random_churn"):
        assert traces.random_churn(500, seed=3) == workloads.random_churn(500, seed=3)
    churn = workloads.random_churn(50, seed=1, max_live=4)  # the events npumem.traces gave
    first = [("alloc", 0, 15087), ("alloc", 1, 6779956), ("free", 1), ("alloc", 3, 400497), ("free", 0)]
    assert churn[:5] == first
    assert all(len(e) == 2 for e in churn if e[0] == "free")


def memory_event(ts, addr, nbytes, device_type=0):
    return {
        "name": "[memory]",
        "ph": "i",
        "ts": ts,
        "args": {"Addr": addr, "Bytes": nbytes, "Device Type": device_type},
    }


def test_importers_warn_and_return_events_with_address_ids(tmp_path):
    trace = {
        "traceEvents": [
            memory_event(3.0, 0x1000, -64),
            memory_event(1.0, 0x1000, 4096),
            memory_event(4.0, 0x1000, -4096),
            memory_event(5.0, 0x1000, 8192),
            memory_event(6.0, 0x9000, 100, device_type=1),
        ]
    }
    with _warns("importers.profiler_trace"):
        events = importers.profiler_trace(trace)
    assert events == [("alloc", (0x1000, 0), 4096), ("free", (0x1000, 0), 4096), ("alloc", (0x1000, 1), 8192)]
    with _warns("importers.profiler_trace"):
        assert importers.profiler_trace(trace, device_type=1) == [("alloc", (0x9000, 0), 100)]
    snap = {"device_traces": [[], [{"action": "alloc", "addr": 64, "size": 512}]]}
    with _warns("importers.snapshot_trace"):
        assert importers.snapshot_trace(snap, device=1) == [("alloc", (64, 0), 512)]
    assert formats.load(snap, device=1).events() == [("alloc", 0, 512)]


def test_importers_point_compact_traces_at_their_reader(tmp_path):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"events": []}))
    with _warns("importers.profiler_trace"), pytest.raises(npumem.InvalidParamError, match=r"npumem\.traces\.load"):
        importers.profiler_trace(str(path))
    assert len(formats.load(path)) == 0
