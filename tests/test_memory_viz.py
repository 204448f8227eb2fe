"""PyTorch's own memory_viz (``torch/cuda/_memory_viz.py``) on the snapshots npumem writes.

The snapshots: a workload with two streams, a stream-ordered free still pending, an OOM and live
blocks on every allocator family (simulated and host backends), and ``npumem replay --snapshot``
of the two traces recorded from PyTorch (benches/traces). On each, memory_viz's commands run as
PyTorch ships them: ``stats``, ``trace``, ``trace_plot`` (also ``-s`` and ``-f``) and
``segment_plot`` as the command line; ``segments`` and ``memory`` as the command line when a
flamegraph script is at hand (``NPUMEM_FLAMEGRAPH``: flamegraph.pl or inferno's
``inferno-flamegraph``; memory_viz otherwise downloads flamegraph.pl, which needs a network),
else through the module's ``segments`` / ``memory`` functions with their documented
``format_flamegraph`` argument catching the folded lines; ``compare`` through its function (its
command line hands it whole snapshots where it iterates segment lists, and fails on PyTorch's own
snapshots too).

Where memory_viz is found: ``NPUMEM_MEMORY_VIZ`` (a path to ``_memory_viz.py``; ``make
check-memory-viz`` extracts it from the torch wheel on PyPI), else an installed torch's copy
(found without importing torch). Without either these tests skip, saying so. The module is run
as a script (``python .../_memory_viz.py stats FILE``): the same code as ``python -m
torch.cuda._memory_viz``, whose commands import nothing from torch.

The check that needs no torch: every snapshot pickle uses only protocol 2-4 opcodes that the
browser viewer's unpickler (``unpickle`` in PyTorch's torch/utils/viz/MemoryViz.js, which
``trace_plot``'s page and the drag-and-drop viewer load) implements.
"""

from __future__ import annotations

import base64
import importlib.util
import json
import os
import pickle
import pickletools
import re
import subprocess
import sys
from pathlib import Path

import pytest

import npumem
from npumem import formats
from npumem.cli import main

MiB = 1 << 20
RECORDED = sorted((Path(__file__).parent.parent / "benches" / "traces").glob("*.json.gz"))
FAMILIES = ("npumem", "pytorch", "torch_npu", "direct")

#: The opcodes MemoryViz.js's ``unpickle`` implements (its switch), by pickletools name.
JS_OPCODES = frozenset(
    "APPENDS BINGET BININT BININT1 BININT2 EMPTY_DICT EMPTY_LIST FRAME LONG1 LONG_BINGET MARK MEMOIZE PROTO "
    "SETITEMS SHORT_BINUNICODE STOP TUPLE2 APPEND NEWFALSE BINPUT BINUNICODE EMPTY_TUPLE NEWTRUE NONE BINFLOAT "
    "TUPLE TUPLE1 TUPLE3 LONG_BINPUT LIST DICT SETITEM".split()
)


def find_memory_viz() -> tuple[str | None, str]:
    """(path to _memory_viz.py, where it came from), or (None, why not)."""
    env = os.environ.get("NPUMEM_MEMORY_VIZ")
    if env:
        if not os.path.isfile(env):
            return None, f"NPUMEM_MEMORY_VIZ={env} is not a file"
        return env, f"NPUMEM_MEMORY_VIZ={env}"
    spec = importlib.util.find_spec("torch")
    if spec is not None and spec.submodule_search_locations:
        path = os.path.join(next(iter(spec.submodule_search_locations)), "cuda", "_memory_viz.py")
        if os.path.isfile(path):
            return path, f"torch at {path}"
    return None, (
        "PyTorch's memory_viz not found: install torch, or point NPUMEM_MEMORY_VIZ at its "
        "torch/cuda/_memory_viz.py (`make bench B=memory-viz` fetches it from PyPI)"
    )


MEMORY_VIZ, WHERE = find_memory_viz()
needs_memory_viz = pytest.mark.skipif(MEMORY_VIZ is None, reason=WHERE)


def workload_snapshot(family: str, backend: str, path: Path, *, pending: bool = False) -> dict:
    """A device's snapshot after: blocks on two streams, a free deferred behind queued work on the
    second stream (still pending when ``pending``), an OOM, then blocks left live."""
    dev = npumem.Device("256MiB", allocator=family, backend=backend)
    dev.record_memory_history()
    s1 = dev.create_stream()
    a, b = dev.malloc(3 * MiB), dev.malloc(1000)
    c, d = dev.malloc(5 * MiB, stream=s1), dev.malloc(700, stream=s1)
    dev.launch(s1, 1000.0, writes=[a])
    dev.record_stream(a, s1)
    dev.free(a)
    dev.free(b)
    if not pending:
        dev.synchronize_device()
        with pytest.raises(npumem.OutOfMemoryError):
            dev.malloc(1 << 30)
        dev.free(d, stream=s1)
        e = dev.malloc(12 * MiB)
    formats.write_snapshot(dev, path)
    dev.synchronize_device()
    for p in (c, d, e) if not pending else (c, d):
        if dev.allocation(p) is not None:
            dev.free(p)
    return pickle.loads(path.read_bytes())


def replay_snapshot(trace: Path, family: str, tmp: Path) -> Path:
    out = tmp / "replay.pickle"
    assert main(["replay", str(trace), "--allocator", family, "--snapshot", str(out)]) == 0
    return tmp / f"replay.{family}.pickle" if not out.exists() else out


def js_opcodes_ok(data: bytes) -> None:
    """Asserts the pickle is one the browser viewer's unpickler reads: protocol 2 to 4, its opcodes."""
    ops = list(pickletools.genops(data))
    assert ops[0][0].name == "PROTO" and 2 <= ops[0][1] <= 4, f"protocol {ops[0][1]}: MemoryViz.js reads 2 to 4"
    unknown = {op.name for op, _, _ in ops} - JS_OPCODES
    assert not unknown, f"opcodes MemoryViz.js's unpickler does not implement: {sorted(unknown)}"


def _viz(*args: str, home: Path | None = None) -> str:
    env = dict(os.environ)
    if home is not None:
        env["HOME"] = str(home)
    p = subprocess.run(
        [sys.executable, MEMORY_VIZ, *args], capture_output=True, text=True, timeout=120, env=env, check=False
    )
    assert p.returncode == 0 and "Traceback" not in p.stderr, f"memory_viz {args[0]} failed:\n{p.stderr[-3000:]}"
    return p.stdout


def _module():
    spec = importlib.util.spec_from_file_location("_npumem_memory_viz", MEMORY_VIZ)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _flamegraph_home(tmp: Path) -> Path | None:
    """A HOME whose ~/.cache/flamegraph.pl is NPUMEM_FLAMEGRAPH's script (memory_viz looks there)."""
    script = os.environ.get("NPUMEM_FLAMEGRAPH")
    if not script:
        return None
    (tmp / "home" / ".cache").mkdir(parents=True, exist_ok=True)
    link = tmp / "home" / ".cache" / "flamegraph.pl"
    if not link.exists():
        link.symlink_to(os.path.abspath(script))
    return tmp / "home"


def run_memory_viz(path: Path, snap: dict, tmp: Path) -> None:
    """Every memory_viz command on the snapshot file, and what each must show of it."""
    segs = snap["segments"]
    entries = snap["device_traces"][0]
    mod = _module()
    # stats: the segments and totals, and memory_viz's own accounting checks pass.
    out = _viz("stats", str(path))
    assert f"segments: {len(segs)}\n" in out
    assert f"total_reserved: {mod.Bytes(sum(s['total_size'] for s in segs))}\n" in out
    active = sum(b["requested_size"] for s in segs for b in s["blocks"] if b["state"] == "active_allocated")
    assert f"total_allocated: {mod.Bytes(active)}\n" in out
    # trace: one line per entry; OOMs with device_free. It prints the entries it has no words for
    # as dicts: PyTorch's segment_map / segment_unmap (expandable segments) among them.
    out = _viz("trace", str(path))
    if entries:
        assert f"{len(entries)} entries\n" in out and "TOTAL MEM" in out
        raw = [line for line in out.splitlines() if line.startswith("{")]
        assert len(raw) == sum(e["action"] in ("segment_map", "segment_unmap") for e in entries)
        ooms = [e for e in entries if e["action"] == "oom"]
        assert out.count("raise OutOfMemoryError") == len(ooms)
        for e in ooms:
            assert f"{mod.Bytes(e['device_free'])} free in CUDA" in out
    # trace_plot / segment_plot: a page embedding the snapshot, which the page's unpickler reads.
    for args in ([], ["-s"], ["-f"]):
        html_path = tmp / f"trace{''.join(args)}.html"
        _viz("trace_plot", str(path), "-o", str(html_path), *args)
        embedded = re.search(r"const local_files = (\[.*\])", html_path.read_text())
        assert embedded, "trace_plot's page holds no snapshot"
        data = base64.b64decode(json.loads(embedded[1])[0]["base64"]).rstrip(b"\x00")
        js_opcodes_ok(data)
        if not args:
            assert pickle.loads(data) == snap
    _viz("segment_plot", str(path), "-o", str(tmp / "segments.html"))
    # segments / memory: the flamegraph's folded lines tile every segment.
    home = _flamegraph_home(tmp)
    if home is not None and segs:  # no segment, no stack: the flamegraph script exits 2, for PyTorch's too
        for cmd in ("segments", "memory"):
            svg = tmp / f"{cmd}.svg"
            _viz(cmd, str(path), "-o", str(svg), home=home)
            assert svg.read_text().lstrip().startswith("<?xml") and "<svg" in svg.read_text()
    folded: list[str] = []
    mod.segments(snap, format_flamegraph=folded.append)
    mod.memory(snap, format_flamegraph=folded.append)
    mod.compare(segs[: len(segs) // 2], segs, format_flamegraph=folded.append)
    per_seg: dict[str, int] = {}
    for line in folded[0].splitlines():
        stack, size = line.rsplit(" ", 1)
        per_seg[stack.split(";")[1]] = per_seg.get(stack.split(";")[1], 0) + int(size)
    assert per_seg == {f"seg_{s['address']}": s["total_size"] for s in segs if s["total_size"]}


@needs_memory_viz
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("backend", ["sim", "host"])
def test_memory_viz_opens_a_workload_snapshot(tmp_path, family, backend):
    print(f"memory_viz: {WHERE}")
    path = tmp_path / "snap.pickle"
    snap = workload_snapshot(family, backend, path)
    actions = {e["action"] for e in snap["device_traces"][0]}
    assert {"alloc", "free_requested", "free_completed", "oom"} <= actions
    assert len({e["stream"] for e in snap["device_traces"][0]}) == 2
    run_memory_viz(path, snap, tmp_path)


@needs_memory_viz
@pytest.mark.parametrize("family", FAMILIES)
def test_memory_viz_opens_a_snapshot_with_a_free_pending(tmp_path, family):
    path = tmp_path / "pending.pickle"
    snap = workload_snapshot(family, "sim", path, pending=True)
    assert any(b["state"] == "active_pending_free" for s in snap["segments"] for b in s["blocks"])
    run_memory_viz(path, snap, tmp_path)


@needs_memory_viz
@pytest.mark.parametrize("trace", RECORDED, ids=lambda p: p.name)
@pytest.mark.parametrize("family", FAMILIES)
def test_memory_viz_opens_a_replay_snapshot(tmp_path, trace, family):
    path = replay_snapshot(trace, family, tmp_path)
    run_memory_viz(path, pickle.loads(path.read_bytes()), tmp_path)


@pytest.mark.parametrize("family", FAMILIES)
def test_snapshot_pickles_are_what_the_browser_viewer_reads(tmp_path, family):
    path = tmp_path / "snap.pickle"
    workload_snapshot(family, "sim", path)
    js_opcodes_ok(path.read_bytes())
    dev = npumem.Device("64MiB", allocator=family)
    dev.record_memory_history()
    dev.free(dev.malloc(4096))
    dev.dump_snapshot(str(tmp_path / "dump.pickle"))
    js_opcodes_ok((tmp_path / "dump.pickle").read_bytes())
