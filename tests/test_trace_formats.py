"""Trace formats in and out (npumem.formats), the replay's Python entry points (family names,
compare) and `npumem replay`: every writer's output read back gives the same events; an RMM log
with two threads and two streams replays with its interleaving and streams; a replay's snapshot
passes the field checks memory_viz's stats / trace / segments / trace_plot need, on the two
traces recorded from PyTorch."""

from __future__ import annotations

import json
import pickle
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import npumem
from npumem import InvalidParamError, formats, replay
from npumem.cli import main
from npumem.formats import Trace, check_snapshot

MiB = 1 << 20
RECORDED = sorted((Path(__file__).parent.parent / "benches" / "traces").glob("*.json.gz"))

# Two threads, two streams (0 and 0x5591), interleaved; one failed allocation; a pointer reused.
RMM_LOG = """Thread,Time,Action,Pointer,Size,Stream
140001,10:15:03.000001,allocate,0x7f1c2a000000,4096,0x0
140002,10:15:03.000002,allocate,0x7f1c2a100000,3145728,0x5591
140001,10:15:03.000003,allocate,0x7f1c2a200000,1048576,0x0
140002,10:15:03.000004,allocate failure,(nil),1099511627776,0x5591
140002,10:15:03.000005,free,0x7f1c2a100000,3145728,0x5591
140001,10:15:03.000006,free,0x7f1c2a000000,4096,0x0
140002,10:15:03.000007,allocate,0x7f1c2a100000,2097152,0x5591
140001,10:15:03.000008,free,0x7f1c2a200000,1048576,0x0
140002,10:15:03.000009,free,0x7f1c2a100000,2097152,0x5591
"""


def _events(t: Trace) -> list[tuple]:
    """(action, block, size, stream, thread) per event, the blocks numbered by their allocs (an
    id used again after its free is a new block)."""
    block: dict[int, int] = {}
    made = 0
    out = []
    streams = t.streams if t.streams is not None else np.zeros(len(t), np.uint64)
    threads = t.threads if t.threads is not None else np.zeros(len(t), np.uint64)
    for a, i, s, sv, th in zip(t.is_alloc, t.ids, t.sizes, streams, threads, strict=True):
        if a:
            block[int(i)] = made
            made += 1
        out.append((int(a), block[int(i)], int(s), int(sv), int(th)))
    return out


@pytest.fixture
def rmm_log(tmp_path: Path) -> Path:
    p = tmp_path / "rmm_log.csv"
    p.write_text(RMM_LOG)
    return p


def test_rmm_csv_keeps_threads_streams_and_order(rmm_log):
    t = formats.read_rmm_csv(rmm_log)
    assert formats.detect(rmm_log) == "rmm-csv"
    assert t.failed_allocs == 1
    assert _events(t) == [
        (1, 0, 4096, 0, 140001),
        (1, 1, 3 * MiB, 0x5591, 140002),
        (1, 2, MiB, 0, 140001),
        (0, 1, 3 * MiB, 0x5591, 140002),
        (0, 0, 4096, 0, 140001),
        (1, 3, 2 * MiB, 0x5591, 140002),  # the reused pointer is a new block
        (0, 2, MiB, 0, 140001),
        (0, 3, 2 * MiB, 0x5591, 140002),
    ]
    assert t.stream_values() == [0, 0x5591]


def test_rmm_log_replays_with_its_interleaving_and_streams(rmm_log):
    t = formats.read_rmm_csv(rmm_log)
    dev = npumem.Device("1GiB", allocator="pytorch")
    dev.record_memory_history()
    r = replay._replay(t, dev, 0, False)
    assert (r.allocs, r.ooms, r.peak_live) == (4, 0, 4096 + 3 * MiB + MiB)
    entries = [e for e in dev.memory_snapshot()["device_traces"][0] if e["action"] in ("alloc", "free_completed")]
    order = [(e["action"], e["size"] >= 2 * MiB, e["stream"] != 0) for e in entries]
    assert order == [
        ("alloc", False, False),
        ("alloc", True, True),
        ("alloc", False, False),
        ("free_completed", True, True),
        ("free_completed", False, False),
        ("alloc", True, True),
        ("free_completed", False, False),
        ("free_completed", True, True),
    ]
    # Written back from the device, the log reads as the same events on the same streams.
    out = rmm_log.parent / "again.csv"
    assert formats.write_rmm_csv(dev, out) == 8
    again = formats.read_rmm_csv(out)
    strip = [(a, i, s, sv != 0) for a, i, s, sv, _ in _events(again)]
    assert strip == [(a, i, s, sv != 0) for a, i, s, sv, _ in _events(t)]


traces = st.lists(st.tuples(st.booleans(), st.integers(0, 11), st.integers(1, 1 << 30), st.integers(0, 2)), max_size=60)


def _valid(raw: list[tuple]) -> Trace:
    live: dict[int, int] = {}
    a, i, s, sv = [], [], [], []
    for alloc, key, size, stream in raw:
        if key in live:
            a.append(0), i.append(key), s.append(live.pop(key)), sv.append(stream * 0x1000)
        elif alloc:
            live[key] = size
            a.append(1), i.append(key), s.append(size), sv.append(stream * 0x1000)
    return Trace(np.array(a), np.array(i), np.array(s), np.array(sv), np.arange(len(a)) % 2)


@given(traces, st.booleans())
def test_npz_and_rmm_writers_round_trip(tmp_path_factory, raw, compress):
    t = _valid(raw)
    d = tmp_path_factory.mktemp("rt")
    formats.write_npz(t, d / "t.npz", compress=compress)
    back = formats.load(d / "t.npz")
    assert _events(back) == _events(t)
    formats.write_rmm_csv(t, d / "t.csv")
    assert _events(formats.load(d / "t.csv")) == _events(t)
    if not len(t):
        return  # a profiler trace without [memory] events is refused on reading (by design)
    formats.write_profiler_trace(t, d / "t.json.gz")
    no_streams = [(a, b, s, 0, 0) for a, b, s, _, _ in _events(t)]
    assert _events(formats.load(d / "t.json.gz")) == no_streams


def test_npz_refuses_broken_pairs(tmp_path):
    t = Trace(np.array([1, 1]), np.array([0, 0]), np.array([8, 8]))
    formats.write_npz(t, tmp_path / "bad.npz")
    with pytest.raises(InvalidParamError, match="event 1: id 0 allocated twice"):
        formats.read_npz(tmp_path / "bad.npz")


def test_npz_holds_a_long_trace_compactly(tmp_path):
    n = 1_000_000
    ids = np.repeat(np.arange(n // 2, dtype=np.uint64), 2)
    t = Trace(np.tile(np.array([1, 0], np.uint8), n // 2), ids, np.full(n, 4096, np.uint64))
    formats.write_npz(t, tmp_path / "long.npz")
    assert (tmp_path / "long.npz").stat().st_size < 14 * n
    back = formats.read_npz(tmp_path / "long.npz")
    assert np.array_equal(back.ids, t.ids) and np.array_equal(back.is_alloc, t.is_alloc)
    assert replay.replay(back, "npumem").allocs == n // 2


@pytest.mark.parametrize("path", RECORDED, ids=lambda p: p.name)
@pytest.mark.parametrize("family", ["npumem", "pytorch", "torch_npu", "direct"])
def test_replay_snapshot_passes_memory_viz_checks(tmp_path, path, family):
    t = formats.load(str(path))
    dev = npumem.Device("2GiB", allocator=family)
    dev.record_memory_history()
    replay._replay(t, dev, 0, False)
    # A live block and an OOM in the history: memory_viz's trace reads device_free on it.
    keep = dev.malloc(3 * MiB)
    with pytest.raises(npumem.OutOfMemoryError):
        dev.malloc(4 << 30)
    out = tmp_path / "snap.pickle"
    formats.write_snapshot(dev, out)
    snap = pickle.loads(out.read_bytes())
    check_snapshot(snap)
    oom = [e for e in snap["device_traces"][0] if e["action"] == "oom"]
    assert len(oom) == 1 and "addr" not in oom[0] and oom[0]["device_free"] >= 0
    assert any(b["state"] == "active_allocated" for s in snap["segments"] for b in s["blocks"])
    # Read back, the snapshot's trace is the replayed events, with the blocks' granted sizes
    # (PyTorch's trace records the block's size) — and then the block still live.
    back = _events(formats.load(str(out)))
    want = _events(t)
    assert [e[:2] for e in back[: len(want)]] == [e[:2] for e in want]
    assert all(b[2] >= w[2] for b, w in zip(back, want, strict=False))
    # After it: the frees of what the trace left live (the replay frees them), then `keep`.
    assert [e[0] for e in back[len(want) :]] == [0] * (len(back) - len(want) - 1) + [1]
    dev.free(keep)


def test_check_snapshot_names_what_memory_viz_would_miss():
    dev = npumem.Device("64MiB")
    dev.record_memory_history()
    dev.free(dev.malloc(4096))
    snap = dev.memory_snapshot()
    check_snapshot(snap)
    bad = pickle.loads(pickle.dumps(snap))
    bad["device_traces"][0].append({"action": "oom", "addr": 5, "size": 8, "stream": 0, "time_us": 0, "frames": []})
    with pytest.raises(InvalidParamError, match="device_free"):
        check_snapshot(bad)
    bad = pickle.loads(pickle.dumps(snap))
    bad["segments"][0]["blocks"][0]["size"] += 512
    with pytest.raises(InvalidParamError, match="add up"):
        check_snapshot(bad)


@pytest.mark.parametrize("family", ["npumem", "pytorch", "torch_npu", "direct"])
def test_a_segment_is_released_after_the_frees_of_its_blocks(family):
    dev = npumem.Device("64MiB", allocator=family)
    dev.record_memory_history()
    s1 = dev.create_stream()
    ptrs = [dev.malloc(3 * MiB) for _ in range(3)] + [dev.malloc(3 * MiB, stream=s1)]
    dev.free(ptrs[0])
    dev.free_many(np.array(ptrs[1:3], dtype=np.uint64))  # a batch: every free before its segments
    dev.free(ptrs[3], stream=s1)
    dev.empty_cache()
    snap = dev.memory_snapshot()
    check_snapshot(snap)
    entries = snap["device_traces"][0]
    for k, e in enumerate(entries):
        if e["action"] in ("segment_free", "segment_unmap"):
            lo, hi = e["addr"], e["addr"] + e["size"]
            assert not [f for f in entries[k:] if f["action"] == "free_completed" and lo <= f["addr"] < hi]
    # The trace out of order: memory_viz's browser views would find a block outside every segment.
    k, j = next(
        (k, j)
        for k, e in enumerate(entries)
        if e["action"] in ("segment_free", "segment_unmap")
        for j in range(k - 1, -1, -1)
        if entries[j]["action"] == "free_completed" and e["addr"] <= entries[j]["addr"] < e["addr"] + e["size"]
    )
    bad = pickle.loads(pickle.dumps(snap))
    t = bad["device_traces"][0]
    t[j], t[k] = t[k], t[j]
    with pytest.raises(InvalidParamError, match=r"not inside memory mapped|no live block|still mapped"):
        check_snapshot(bad)


def test_the_segment_events_of_a_free_carry_its_stream():
    dev = npumem.Device("64MiB", allocator="direct")
    dev.record_memory_history()
    s1 = dev.create_stream()
    p = dev.malloc(3 * MiB, stream=s1)
    dev.free(p, stream=s1)
    dev.malloc(4096)
    entries = dev.memory_snapshot()["device_traces"][0]
    assert [(e["action"], e["stream"]) for e in entries[:4]] == [
        ("segment_alloc", s1),
        ("alloc", s1),
        ("free_requested", s1),
        ("free_completed", s1),
    ]
    assert (entries[4]["action"], entries[4]["stream"]) == ("segment_free", s1)


def test_check_snapshot_replays_the_trace_to_the_segments():
    dev = npumem.Device("64MiB", allocator="pytorch")
    dev.record_memory_history()
    p = dev.malloc(4096)
    snap = dev.memory_snapshot()
    check_snapshot(snap)
    bad = pickle.loads(pickle.dumps(snap))
    bad["device_traces"][0].append({"action": "free_completed", "addr": p, "size": 4096, "stream": 0} | _T)
    with pytest.raises(InvalidParamError, match="live after it is freed"):
        check_snapshot(bad)
    bad = pickle.loads(pickle.dumps(snap))
    bad["device_traces"][0].insert(0, {"action": "alloc", "addr": p + (1 << 30), "size": 8, "stream": 0} | _T)
    with pytest.raises(InvalidParamError, match="no live block"):
        check_snapshot(bad)
    seg = snap["segments"][0]
    bad = pickle.loads(pickle.dumps(snap))
    bad["device_traces"][0].append({"action": "segment_free", "addr": seg["address"], "size": 64} | _T | {"stream": 0})
    with pytest.raises(InvalidParamError, match="still mapped"):
        check_snapshot(bad)
    dev.free(p)


_T = {"time_us": 0, "frames": []}


# -- the Python entry points --------------------------------------------------------------------

EVENTS = [("alloc", 1, 3 * MiB), ("alloc", 2, 1000), ("free", 1), ("alloc", 3, 2 * MiB), ("free", 2), ("free", 3)]


def test_replay_takes_a_family_name_and_keywords():
    assert replay.replay(EVENTS, "pytorch").allocator == "pytorch"
    r = replay.replay(EVENTS, allocator="pytorch", alloc_conf="max_split_size_mb:128", capacity="1GiB")
    assert (r.allocator, r.alloc_conf, r.capacity) == ("pytorch", "max_split_size_mb:128", 1 << 30)
    with pytest.raises(InvalidParamError, match="named twice"):
        replay.replay(EVENTS, "npumem", allocator="pytorch")
    with pytest.raises(InvalidParamError, match="takes no allocator"):
        replay.replay(EVENTS, npumem.Device("1GiB"), allocator="pytorch")


def test_compare_returns_one_table():
    table = replay.compare(EVENTS, ["npumem", "pytorch"], min_capacity=True, sample_every=1)
    rows = table.rows()
    assert [r["allocator"] for r in rows] == ["npumem", "pytorch"]
    assert all(r["min_capacity"] >= 3 * MiB + 1000 and r["allocs"] == 3 for r in rows)
    text = str(table)
    assert text.splitlines()[0].split()[:3] == ["allocator", "peak", "allocated"] and "pytorch" in text
    s = table.results[0].samples
    assert list(s["event"]) == list(range(len(EVENTS)))
    assert list(s["live"]) == [3 * MiB, 3 * MiB + 1000, 1000, 1000 + 2 * MiB, 2 * MiB, 0]


# -- npumem replay ------------------------------------------------------------------------------


def test_cli_replay_table_json_snapshot_and_plot(tmp_path, capsys, rmm_log):
    snap = tmp_path / "out.pickle"
    code = main(
        [
            "replay",
            str(rmm_log),
            "--allocator",
            "npumem",
            "--allocator",
            "pytorch",
            "--min-capacity",
            "--snapshot",
            str(snap),
            "--json",
        ]
    )
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert [r["allocator"] for r in out["results"]] == ["npumem", "pytorch"]
    assert all(r["min_capacity"] for r in out["results"])
    for fam in ("npumem", "pytorch"):
        check_snapshot(pickle.loads((tmp_path / f"out.{fam}.pickle").read_bytes()))
    pytest.importorskip("matplotlib")
    png = tmp_path / "t.png"
    assert main(["replay", str(rmm_log), "--plot", str(png)]) == 0
    printed = capsys.readouterr().out
    assert "2 stream(s), 1 failed allocations" in printed and "torch_npu" in printed
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_cli_replay_errors_are_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.csv"
    bad.write_text("Thread,Time,Action,Pointer,Size,Stream\n1,00:00:00.0,allocate,0x10,lots,0x0\n")
    assert main(["replay", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "line 2: Size is 'lots'" in err and "Traceback" not in err
    assert main(["replay", str(tmp_path / "missing.csv")]) == 2
    (tmp_path / "x.txt").write_text("hello")
    assert main(["replay", str(tmp_path / "x.txt")]) == 2
    assert "not a trace npumem reads" in capsys.readouterr().err
    assert main(["replay", str(bad), "--allocator", "nope"]) == 2


def test_cli_replay_without_matplotlib_keeps_the_table(tmp_path, capsys, rmm_log, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if it were not installed
    code = main(["replay", str(rmm_log), "--allocator", "npumem", "--plot", str(tmp_path / "t.png")])
    out, err = capsys.readouterr()
    assert code == 3 and "npumem" in out and "peak allocated" in out
    assert err.strip().count("\n") == 0 and "matplotlib" in err


def test_a_progress_callback_that_raises_leaves_nothing_live():
    n = (1 << 20) + 10
    t = Trace(np.tile(np.array([1, 0], np.uint8), n // 2), np.repeat(np.arange(n // 2), 2), np.full(n, 512))
    # Ids allocated in the first chunk and freed in the second are live when the callback raises.
    t.is_alloc[: 1 << 10] = 1
    t.ids[: 1 << 10] = np.arange(1 << 10) + n
    dev = npumem.Device("1GiB")

    def stop(done, total):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        replay.replay(t, dev, progress=stop)
    assert dev.stats()["live_count"] == 0


def test_profiler_trace_from_a_device(tmp_path):
    dev = npumem.Device("1GiB", allocator="torch_npu")
    dev.record_memory_history()
    t = Trace.from_events(EVENTS)
    replay._replay(t, dev, 0, False)
    assert formats.write_profiler_trace(dev, tmp_path / "p.json") == len(EVENTS)
    assert formats.detect(tmp_path / "p.json") == "profiler"
    back = formats.load(tmp_path / "p.json")
    assert [e[:2] for e in _events(back)] == [e[:2] for e in _events(t)]


#: `[memory]` events exported by torch 2.15's profiler (`prof.export_chrome_trace`, CPU,
#: profile_memory=True: a 256x256 matmul loop), the other events left out.
TORCH_EXPORT = Path(__file__).parent / "data" / "torch_profiler_export.json.gz"


def test_profiler_writer_matches_what_torch_exports(tmp_path):
    import gzip

    real = json.loads(gzip.open(TORCH_EXPORT).read())["traceEvents"]
    trace = formats.load(str(TORCH_EXPORT))
    assert len(trace) == len(real) and int(trace.is_alloc.sum()) > 5
    dev = npumem.Device("1GiB", allocator="pytorch")
    dev.record_memory_history()
    replay._replay(trace, dev, 0, False)
    formats.write_profiler_trace(dev, tmp_path / "p.json")
    ours = json.loads((tmp_path / "p.json").read_text())["traceEvents"]
    # The same event fields and args as torch's, less its event index and the `finished` flag.
    assert {k for e in ours for k in e} == {k for e in real for k in e}
    assert {k for e in ours for k in e["args"]} == {k for e in real for k in e["args"]} - {"Ev Idx", "finished"}
    # Total Allocated runs as torch's does: the sum of the signed Bytes so far.
    totals = np.cumsum([e["args"]["Bytes"] for e in ours])
    assert [e["args"]["Total Allocated"] for e in ours] == totals.tolist()
    assert all(e["args"]["Total Reserved"] >= e["args"]["Total Allocated"] for e in ours)
    assert np.array_equal(np.cumsum([e["args"]["Bytes"] for e in real]), [e["args"]["Total Allocated"] for e in real])


def test_streams_of_mapping_events_are_kept():
    evs = [
        {"action": "alloc", "addr": 1, "size": 8, "stream": 7},
        {"action": "free_requested", "addr": 1, "size": 8, "stream": 7},
        {"action": "free_completed", "addr": 1, "size": 8, "stream": 7},
        {"action": "segment_map", "addr": 0, "size": 2 << 20, "stream": 0},
        {"action": "alloc", "addr": 2, "size": 2**63, "stream": 0},
    ]
    t = Trace.from_events(evs)
    assert t.streams.tolist() == [7, 7, 0] and t.is_alloc.tolist() == [1, 0, 1]
    assert t.peak_live() == 2**63  # past int64, no wrap-around


def test_cli_replay_says_no_when_the_capacity_is_too_small(rmm_log, capsys):
    assert main(["replay", str(rmm_log), "--allocator", "direct", "--capacity", "1MiB"]) == 1
    assert main(["replay", str(rmm_log), "--allocator", "direct", "--capacity", "1GiB"]) == 0
    big = rmm_log.parent / "big.csv"
    big.write_text("Thread,Time,Action,Pointer,Size,Stream\n1,00:00:00.0,allocate,0x10,99999999999999999999999,0x0\n")
    assert main(["replay", str(big)]) == 2
    assert "not a byte count" in capsys.readouterr().err


@pytest.mark.parametrize(
    "cols, match",
    [
        (([1], [-1], [8]), "holds -1"),
        (([1], [0], [8.5]), "float64"),
        (([1, 0], [0], [8, 8]), "has 1 entries"),
        (([[1]], [0], [8]), "2 dimensions"),
    ],
)
def test_trace_columns_are_checked(cols, match):
    with pytest.raises(InvalidParamError, match=match):
        Trace(*(np.array(c) for c in cols))
