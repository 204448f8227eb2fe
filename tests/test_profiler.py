"""The memory profiler: records per function and block (calls, allocs, total and peak bytes as
RMM's statistics profiler counts them), the ALLOC/FREE log with call sites, the leak finder,
and the table / CSV / JSON outputs; the device is unwrapped afterwards, even on an error."""

from __future__ import annotations

import csv
import io
import json

import numpy as np
import pytest
from conftest import MiB
from hypothesis import given
from hypothesis import strategies as st

import npumem
from npumem import Device
from npumem.profiling import TOP, Profiler


@npumem.profile
def _layer(dev, n):
    a = dev.malloc(n)
    b = dev.malloc(2 * n)
    dev.free(a)
    return b


def test_records_calls_total_and_peak_per_function_and_block():
    dev = Device("1GiB")
    keep = []
    with npumem.profiler(dev) as prof:
        with npumem.profile("forward"):
            for _ in range(3):
                keep.append(_layer(dev, MiB))
        ptrs = dev.malloc_many([4096] * 4)
        dev.free_many(ptrs)
    recs = {r["name"]: r for r in prof.report()["records"]}
    layer = recs[f"{__name__}._layer"]
    assert (layer["calls"], layer["allocs"], layer["frees"]) == (3, 6, 3)
    assert layer["total_bytes"] == 9 * MiB and layer["peak_bytes"] == 3 * MiB  # a + b live at once
    assert recs["forward"]["calls"] == 1 and recs["forward"]["total_bytes"] == 9 * MiB
    assert recs["forward"]["peak_bytes"] == 7 * MiB  # two b's kept, then a third layer's a + b
    assert recs[TOP]["allocs"] == 4 and recs[TOP]["total_bytes"] == 9 * MiB + 4 * 4096
    # unwrapped: the class's methods again
    assert "malloc" not in dev.__dict__ and "free_many" not in dev.__dict__
    dev.free_many(keep)


def test_leak_finder_names_the_sites_whose_frees_never_came():
    dev = Device("1GiB")
    with npumem.profiler(dev) as prof:
        for _ in range(3):
            dev.free(dev.malloc(1000))
        leaked = [dev.malloc(5000) for _ in range(2)]  # the leaking line
        arr = dev.from_numpy(np.zeros(16))
    leaks = prof.leaks()
    assert [(k.count, k.bytes) for k in leaks] == [(2, 10000), (1, 128)]
    assert "test_profiler.py" in leaks[0].site and "test_leak_finder" in leaks[0].site
    assert sorted(leaks[0].ptrs) == sorted(leaked)
    assert leaks[1].ptrs == [arr]
    log = list(csv.DictReader(io.StringIO(prof.log_csv())))
    assert [e["op"] for e in log].count("ALLOC") == 6 and [e["op"] for e in log].count("FREE") == 3
    assert all(e["site"].startswith(__file__) for e in log)
    assert "never freed:" in prof.table() and "2 x" in prof.table()
    entries = prof.log
    assert [(e.op, e.size) for e in entries[:2]] == [("ALLOC", 1000), ("FREE", 1000)]
    assert entries[0].ptr == entries[1].ptr and entries[0].time <= entries[1].time


def test_threads_share_one_profiler():
    import threading

    dev = Device("1GiB")

    def work(i):
        with npumem.profile(f"thread{i}"):
            ptrs = [dev.malloc(4096 * (i + 1)) for _ in range(50)]
            for p in ptrs:
                dev.free(p)

    with npumem.profiler(dev, call_sites=False) as prof:
        threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    recs = {r["name"]: r for r in prof.report()["records"]}
    for i in range(4):
        r = recs[f"thread{i}"]
        assert (r["allocs"], r["frees"], r["total_bytes"]) == (50, 50, 50 * 4096 * (i + 1))
        assert r["peak_bytes"] == 50 * 4096 * (i + 1)
    assert recs[TOP]["total_bytes"] == sum(50 * 4096 * (i + 1) for i in range(4))
    assert not prof.leaks() and len(prof.log) == 400


@given(st.lists(st.tuples(st.booleans(), st.integers(1, 4 * MiB)), max_size=30))
def test_peak_and_total_match_a_recount(program):
    """Top-level peak and total equal an independent recount of the program's requested bytes."""
    dev = Device("512MiB")
    live, total, peak, cur = [], 0, 0, 0
    with npumem.profiler(dev, call_sites=False) as prof:
        for is_alloc, size in program:
            if is_alloc or not live:
                live.append((dev.malloc(size), size))
                total, cur = total + size, cur + size
                peak = max(peak, cur)
            else:
                ptr, n = live.pop(0)
                dev.free(ptr)
                cur -= n
    top = next(r for r in prof.report()["records"] if r["name"] == TOP) if program else None
    if top is not None:
        assert (top["total_bytes"], top["peak_bytes"]) == (total, peak)
    assert sum(k.bytes for k in prof.leaks()) == cur


def test_outputs_csv_json_and_files(tmp_path):
    dev = Device("256MiB")
    with npumem.profiler(dev) as prof, npumem.profile("block"):
        dev.malloc(MiB)
    rows = list(csv.DictReader(io.StringIO(prof.to_csv(str(tmp_path / "p.csv")))))
    assert {r["name"] for r in rows} == {TOP, "block"}
    data = json.loads(prof.to_json(str(tmp_path / "p.json")))
    assert data["leaks"][0]["bytes"] == MiB and data["leaks"][0]["record"] == "block"
    assert (tmp_path / "p.csv").read_text().startswith("name,calls")
    prof.log_csv(str(tmp_path / "log.csv"))
    assert (tmp_path / "log.csv").read_text().count("ALLOC") == 1


def test_device_is_unwrapped_on_error_and_failed_calls_record_nothing():
    dev = Device("64MiB")
    with pytest.raises(npumem.OutOfMemoryError), npumem.profiler(dev) as prof:
        dev.malloc(MiB)
        dev.malloc(1 << 30)
    assert prof.report()["records"][0]["allocs"] == 1
    assert "malloc" not in dev.__dict__


def test_nested_profilers_and_decorator_without_profiler():
    dev = Device("64MiB")
    ptr = _layer(dev, 1024)  # no profiler: the function just runs
    dev.free(ptr)
    with npumem.profiler(dev) as outer:
        with npumem.profiler(dev) as inner:
            dev.free(dev.malloc(100))
        dev.free(dev.malloc(200))
    assert inner.report()["records"][0]["total_bytes"] == 100
    assert outer.report()["records"][0]["total_bytes"] == 300
    assert "malloc" not in dev.__dict__


@npumem.profile(name="named")
def _named(dev):
    dev.free(dev.malloc(64))


def test_named_decorator_block_and_bad_arguments():
    dev = Device("64MiB")
    with npumem.profiler(dev) as prof:
        _named(dev)
        with prof.block("mine"):
            dev.free(dev.malloc(32))
    names = {r["name"] for r in prof.report()["records"]}
    assert {"named", "mine"} <= names
    with pytest.raises(TypeError, match="device"):
        Profiler("dev")
    with pytest.raises(TypeError, match="name"):
        npumem.profile(3)
    with pytest.raises(TypeError):
        npumem.profile("a", name="b")
