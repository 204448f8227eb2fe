"""The bad-input matrix: every public entry point (Device methods, planning, graphs, replay,
traces, importers, patterns, the TLB model, the host pool, units, the demo and the CLI) given
wrong types, negatives, zero, huge ints, NaN, wrong shapes, malformed files.

Each case asserts the exception type (``TypeError`` for a wrong type, ``InvalidParamError`` — or
the AscendCL error that fits, such as ``MemoryFreeError`` — for a bad value, ``OSError`` for a
file that cannot be opened), that the message names the argument and shows the value, and that
the device (its state, statistics and sanitizer findings), the graph and the host pool are
exactly as they were. CLI cases assert the exit status and that no traceback is printed. Inputs
that abort the process today run in a subprocess under a memory limit, so they cannot take the
test run down.

On every backend (the simulator, host memory, AscendCL and CUDA over the stand-ins): the Device
calls' matrix with AscendCL classes, codes and ``failed_mallocs`` deltas, wrong types, and a fuzz
of arbitrary ints into every method whose books must balance afterwards.
"""

from __future__ import annotations

import ctypes
import gzip
import itertools
import json
import os
import pickle
import resource
import subprocess
import sys
import textwrap
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
from conftest import BOTH_BACKENDS, CODE_NAMES, GiB, MiB, raises_acl, snapshot
from hypothesis import given, settings
from hypothesis import strategies as st

import npumem
from npumem import (
    VA_WINDOW_END,
    VA_WINDOW_START,
    AclError,
    Device,
    InvalidParamError,
    MemcpyKind,
    MemoryFreeError,
    MemPoolAttr,
    OutOfMemoryError,
    Policy,
    UnsupportedError,
    cli,
    formats,
    importers,
    patterns,
    plan,
    replay,
    traces,
    units,
    workloads,
)
from npumem import demo as demo_mod
from npumem import graph as graph_mod
from npumem import hostpool as hostpool_mod
from npumem import tlb as tlb_mod

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
C_CSV = os.path.join(REPO, "benches", "dsa", "minimalloc", "C.1048576.csv")


# --------------------------------------------------------------------------------------------
# The context every case runs in, and what must not change
# --------------------------------------------------------------------------------------------


@dataclass
class Ctx:
    dev: Device
    ptr: int
    host: int
    stream: int
    event: int
    graph: graph_mod.Graph
    tmp: Any
    _pool: Any = None
    files: dict[str, str] = field(default_factory=dict)

    @property
    def pool(self) -> hostpool_mod.HostPool:
        if self._pool is None:
            self._pool = hostpool_mod.HostPool("256MiB")
        return self._pool

    def file(self, name: str, content: str | bytes, compress: bool = True) -> str:
        """A file in the test's temporary folder (gzip-compressed when the name ends in .gz)."""
        path = str(self.tmp / name)
        data = content.encode() if isinstance(content, str) else content
        if compress and name.endswith(".gz"):
            data = gzip.compress(data)
        with open(path, "wb") as f:
            f.write(data)
        return path

    def state(self) -> dict[str, Any]:
        stats = self.dev.memory_stats()
        return {
            "device": snapshot(self.dev),
            "memory_stats": stats,
            "fragmentation": self.dev.fragmentation(),
            "findings": len(self.dev.sanitizer_reports()),
            "now": self.dev.now_us(),
            "graph": self.graph.to_dict(),
            "pool": None if self._pool is None else {k: v for k, v in self._pool.stats().items() if k != "base"},
        }


@pytest.fixture
def ctx(tmp_path) -> Ctx:
    dev = Device("64MiB")
    ptr = dev.malloc(4096)
    dev.write(ptr, b"\x07" * 4096)
    g = graph_mod.Graph(alignment=512)
    g.input("x", 4096)
    g.weight("w", 1024)
    g.op("mm", ["x", "w"], [("h", 8192)])
    return Ctx(
        dev=dev,
        ptr=ptr,
        host=dev.malloc_host(4096),
        stream=dev.create_stream(),
        event=dev.create_event(),
        graph=g,
        tmp=tmp_path,
    )


@dataclass(frozen=True)
class Case:
    id: str
    call: Callable[[Ctx], Any]
    exc: type[BaseException]
    words: tuple[str, ...]
    #: The sanitizer finding the rejected call adds (an out-of-bounds access is reported, by design).
    finding: str | None = None


def case(
    id: str,
    call: Callable[[Ctx], Any],
    exc: type[BaseException],
    *words: str,
    finding: str | None = None,
):
    return pytest.param(Case(id, call, exc, words, finding), id=id)


EVENTS = [("alloc", 1, 4096), ("free", 1)]
GRAPH_FORMAT = graph_mod.Graph.FORMAT


def graph_doc(**op: Any) -> dict[str, Any]:
    """A saved graph with one op, fields overridden."""
    fields = {"name": "mm", "inputs": ["a"], "outputs": ["b"], "workspace": 0, "duration_us": None} | op
    return {
        "format": GRAPH_FORMAT,
        "alignment": 512,
        "tensors": [["a", 64, "input", None], ["b", 64, "activation", None]],
        "ops": [list(fields.values())],
    }


class _Exploit:
    """Unpickling this would run a shell command."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def malicious_snapshot(c: Ctx) -> list:
    marker = str(c.tmp / "pwned")
    path = c.file("evil.pickle", pickle.dumps({"device_traces": [[_Exploit(marker)]]}))
    try:
        return formats.load(path)
    finally:
        assert not os.path.exists(marker), "the crafted pickle ran code"


def deprecated(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)``, a deprecated alias: it must warn before it runs."""
    with pytest.warns(DeprecationWarning, match="is deprecated"):
        return fn(*args, **kwargs)


def deep_json(levels: int = 100_000) -> str:
    return '{"a":' * levels + "1" + "}" * levels


def tlb(c: Ctx, **overrides: Any) -> tlb_mod.Tlb:
    return tlb_mod.Tlb.preset("zen4", c.dev, **overrides)


CASES = [
    # -- Device construction ----------------------------------------------------------------
    case("Device-capacity-negative", lambda c: Device(-1), InvalidParamError, "capacity", "-1"),
    case("Device-capacity-float", lambda c: Device(1.5), TypeError, "capacity", "float"),
    case("Device-capacity-2**64", lambda c: Device(2**64), InvalidParamError, "capacity", "18446744073709551616"),
    case("Device-capacity-too-large", lambda c: Device("2TiB"), InvalidParamError, "capacity", "2 TiB"),
    case("Device-capacity-text", lambda c: Device("lots"), InvalidParamError, '"lots"'),
    case("Device-allocator", lambda c: Device("64MiB", allocator="x"), InvalidParamError, "allocator", '"x"'),
    case("Device-preset", lambda c: Device("64MiB", preset="x"), InvalidParamError, "preset", '"x"'),
    case("Device-sanitizer", lambda c: Device("64MiB", sanitizer="x"), InvalidParamError, "sanitizer", '"x"'),
    case("Device-giant-negative", lambda c: Device("64MiB", giant_frames=-1), InvalidParamError, "giant_frames", "-1"),
    case("Device-normal-page", lambda c: Device("64MiB", normal_page=3), InvalidParamError, "normal_page", "3"),
    case(
        "Device-alloc-conf",
        lambda c: Device("64MiB", allocator="pytorch", alloc_conf="foo:1"),
        InvalidParamError,
        "alloc_conf",
        '"foo"',
    ),
    # -- Device allocation ------------------------------------------------------------------
    case("malloc-zero", lambda c: c.dev.malloc(0), InvalidParamError, "size", "0"),
    case("malloc-negative", lambda c: c.dev.malloc(-1), InvalidParamError, "size", "-1"),
    case("malloc-2**64", lambda c: c.dev.malloc(2**64), InvalidParamError, "size", "18446744073709551616"),
    case("malloc-nan", lambda c: c.dev.malloc(float("nan")), TypeError, "size", "float"),
    case("malloc-text", lambda c: c.dev.malloc("abc"), InvalidParamError, '"abc"', "size"),
    case("malloc-policy-99", lambda c: c.dev.malloc(10, 99), InvalidParamError, "policy", "99"),
    case("malloc-policy-negative", lambda c: c.dev.malloc(10, -1), InvalidParamError, "policy", "-1"),
    case("malloc-stream-unknown", lambda c: c.dev.malloc(10, stream=999), InvalidParamError, "stream 999"),
    case("malloc-tag-int", lambda c: c.dev.malloc(10, tag=5), TypeError, "tag"),
    case("malloc_host-zero", lambda c: c.dev.malloc_host(0), InvalidParamError, "malloc_host size", "0"),
    case("malloc_many-negative", lambda c: c.dev.malloc_many([4096, -1]), InvalidParamError, "sizes[1]", "-1"),
    case("malloc_many-text", lambda c: c.dev.malloc_many("abc"), TypeError, "sizes", "'abc'"),
    case("malloc_many-float", lambda c: c.dev.malloc_many([1.5]), TypeError, "sizes[0]", "1.5"),
    case(
        "malloc_many-2d",
        lambda c: c.dev.malloc_many(np.ones((2, 2), dtype=np.uint64)),
        InvalidParamError,
        "sizes",
        "(2, 2)",
    ),
    case(
        "malloc_many-zero",
        lambda c: c.dev.malloc_many([4096, 0]),
        InvalidParamError,
        "size",
    ),
    # -- Device frees -----------------------------------------------------------------------
    case("free-null", lambda c: c.dev.free(0), InvalidParamError, "free(NULL)"),
    case("free-negative", lambda c: c.dev.free(-1), InvalidParamError, "ptr", "-1"),
    case("free-none", lambda c: c.dev.free(None), TypeError, "ptr", "NoneType"),
    case("free-interior", lambda c: c.dev.free(c.ptr + 64), MemoryFreeError, hex(0x100000000040)),
    case("free-unknown", lambda c: c.dev.free(0x5000), MemoryFreeError, "0x5000"),
    case("free_many-negative", lambda c: c.dev.free_many([c.ptr, -5]), InvalidParamError, "ptrs[1]", "-5"),
    case("free_many-unknown", lambda c: c.dev.free_many([c.ptr, 12345]), MemoryFreeError, "0x3039", "nothing"),
    case("free_host-unknown", lambda c: c.dev.free_host(12345), MemoryFreeError, "0x3039"),
    case("free-stream-unknown", lambda c: c.dev.free(c.ptr, stream=999), InvalidParamError, "stream 999"),
    case("record_stream-unknown", lambda c: c.dev.record_stream(c.ptr, 999), InvalidParamError, "stream 999"),
    # -- Device copies ----------------------------------------------------------------------
    case("memcpy-count-negative", lambda c: c.dev.memcpy(c.ptr, 4096, c.ptr, -1), InvalidParamError, "count", "-1"),
    case(
        "memcpy-count-over-dst_max",
        lambda c: c.dev.memcpy(c.ptr, 4096, c.host, 8192),
        InvalidParamError,
        "count 8192",
        "dst_max 4096",
    ),
    case("memcpy-kind-99", lambda c: c.dev.memcpy(c.ptr, 4096, c.host, 16, 99), InvalidParamError, "memcpy kind", "99"),
    case(
        "memcpy_async-kind-99",
        lambda c: c.dev.memcpy_async(c.ptr, 4096, c.host, 16, 99, c.stream),
        InvalidParamError,
        "memcpy kind",
        "99",
    ),
    case("memset-count-over", lambda c: c.dev.memset(c.ptr, 4096, 0, 8192), InvalidParamError, "8192", "4096"),
    case("write-str", lambda c: c.dev.write(c.ptr, "abc"), TypeError, "buffer", "str"),
    case("write-none", lambda c: c.dev.write(c.ptr, None), TypeError, "buffer", "NoneType"),
    case(
        "write-past-end",
        lambda c: c.dev.write(c.ptr, b"x" * 8192),
        InvalidParamError,
        "8192 bytes",
        finding="out_of_bounds",
    ),
    case("write-objects", lambda c: c.dev.write(c.ptr, np.array([None])), InvalidParamError, "Python object"),
    case("read-negative", lambda c: c.dev.read(c.ptr, -1), InvalidParamError, "count", "-1"),
    case(
        "read-huge",
        lambda c: c.dev.read(c.ptr, 2**40),
        InvalidParamError,
        "1099511627776 bytes",
        finding="out_of_bounds",
    ),
    case("read_into-readonly", lambda c: c.dev.read_into(c.ptr, b"abcd"), InvalidParamError, "read-only"),
    case(
        "read_into-strided",
        lambda c: c.dev.read_into(c.ptr, np.zeros((4, 4))[:, ::2]),
        InvalidParamError,
        "C-contiguous",
    ),
    case("read_into-str", lambda c: c.dev.read_into(c.ptr, "abc"), TypeError, "buffer", "str"),
    case("read_into-numpy-scalar", lambda c: c.dev.read_into(c.ptr, np.int64(3)), InvalidParamError, "read-only"),
    case("to_numpy-negative-shape", lambda c: c.dev.to_numpy(c.ptr, (-1,)), InvalidParamError, "shape[0]", "-1"),
    case("to_numpy-huge", lambda c: c.dev.to_numpy(c.ptr, (2**40,)), InvalidParamError, "shape", "1,099,511,627,776"),
    case("to_numpy-dtype", lambda c: c.dev.to_numpy(c.ptr, (4,), "notadtype"), TypeError, "dtype", "notadtype"),
    case("to_numpy-float-shape", lambda c: c.dev.to_numpy(c.ptr, 2.5), TypeError, "shape", "2.5"),
    case("from_numpy-objects", lambda c: c.dev.from_numpy(np.array([None])), InvalidParamError, "Python object"),
    # -- Device queries and settings --------------------------------------------------------
    case("mem_info-99", lambda c: c.dev.mem_info(99), InvalidParamError, "memory attribute", "99"),
    case("translate-null", lambda c: c.dev.translate(0), InvalidParamError, "0x0"),
    case("walk-negative", lambda c: c.dev.walk(-1), InvalidParamError, "va", "-1"),
    case("allocation-negative", lambda c: c.dev.allocation(-5), InvalidParamError, "ptr", "-5"),
    case("page_of-unknown", lambda c: c.dev.page_of(5), InvalidParamError, "0x5"),
    case("set_pool_attr-99", lambda c: c.dev.set_pool_attr(99, 1), InvalidParamError, "pool attribute", "99"),
    case(
        "set_pool_attr-threshold-negative",
        lambda c: c.dev.set_pool_attr(MemPoolAttr.RELEASE_THRESHOLD, -1),
        InvalidParamError,
        "release threshold",
        "-1",
    ),
    case("set_sanitizer", lambda c: c.dev.set_sanitizer("x"), InvalidParamError, "sanitizer mode", '"x"'),
    case("use_preset", lambda c: c.dev.use_preset("x"), InvalidParamError, "preset", '"x"'),
    case("set_cost-field", lambda c: c.dev.set_cost("x", 1.0), InvalidParamError, "cost field", '"x"'),
    case("set_cost-nan", lambda c: c.dev.set_cost("launch_ns", float("nan")), InvalidParamError, "launch_ns", "NaN"),
    case(
        "set_cost-1e30",
        lambda c: c.dev.set_cost("launch_ns", 1e30),
        InvalidParamError,
        "launch_ns",
    ),
    case("trim_to-negative", lambda c: c.dev.trim_to(-1), InvalidParamError, "bytes", "-1"),
    case(
        "memory-fraction-2",
        lambda c: c.dev.set_per_process_memory_fraction(2.0),
        InvalidParamError,
        "fraction",
        "2",
    ),
    case(
        "memory-fraction-nan",
        lambda c: c.dev.set_per_process_memory_fraction(float("nan")),
        InvalidParamError,
        "fraction",
        "NaN",
    ),
    case(
        "record_memory_history-negative",
        lambda c: c.dev.record_memory_history(True, -1),
        InvalidParamError,
        "max_entries",
        "-1",
    ),
    case("record_memory_history-enabled", lambda c: c.dev.record_memory_history("yes"), TypeError, "enabled", "'yes'"),
    case("dump_snapshot-path", lambda c: c.dev.dump_snapshot(123), TypeError, "path", "123"),
    # -- Streams and events -----------------------------------------------------------------
    case("destroy_stream-unknown", lambda c: c.dev.destroy_stream(999), InvalidParamError, "stream 999"),
    case("synchronize_stream-unknown", lambda c: c.dev.synchronize_stream(999), InvalidParamError, "stream 999"),
    case("record_event-unknown", lambda c: c.dev.record_event(999), InvalidParamError, "event 999"),
    case("stream_wait_event-unknown", lambda c: c.dev.stream_wait_event(c.stream, 999), InvalidParamError, "event 999"),
    case("query_event-unknown", lambda c: c.dev.query_event(999), InvalidParamError, "event 999"),
    case(
        "event_elapsed_time-unknown",
        lambda c: c.dev.event_elapsed_time(999, c.event),
        InvalidParamError,
        "event 999",
    ),
    case("launch-nan", lambda c: c.dev.launch(c.stream, float("nan")), InvalidParamError, "duration", "NaN"),
    case("launch-negative", lambda c: c.dev.launch(c.stream, -5.0), InvalidParamError, "duration", "-5"),
    case("launch-1e300", lambda c: c.dev.launch(c.stream, 1e300), InvalidParamError, "duration"),
    case("launch-reads-str", lambda c: c.dev.launch(c.stream, 1.0, reads=["x"]), TypeError, "reads"),
    case(
        "launch-writes-negative",
        lambda c: c.dev.launch(c.stream, 1.0, writes=[-1]),
        InvalidParamError,
        "writes",
        "-1",
    ),
    case(
        "set_pool_attr-array",
        lambda c: c.dev.set_pool_attr(MemPoolAttr.REUSE_ALLOW_OPPORTUNISTIC, np.ones(2)),
        TypeError,
        "value",
    ),
    # -- Static planning --------------------------------------------------------------------
    case("Problem-buffers-str", lambda c: plan.Problem.from_buffers("abc"), TypeError, "buffers", "'abc'"),
    case(
        "Problem-buffer-pair", lambda c: plan.Problem.from_buffers([(0, 1)]), InvalidParamError, "buffers[0]", "(0, 1)"
    ),
    case(
        "Problem-alignment-3",
        lambda c: plan.Problem.from_buffers([(0, 1, 8)], alignment=3),
        InvalidParamError,
        "alignment 3",
    ),
    case(
        "Problem-alignment-float",
        lambda c: plan.Problem.from_buffers([(0, 1, 8)], alignment=2.0),
        TypeError,
        "alignment",
        "2.0",
    ),
    case(
        "Problem-size-negative",
        lambda c: plan.Problem.from_buffers([(0, 1, -8)]),
        InvalidParamError,
        "size[0]",
        "-8",
    ),
    case(
        "Problem-size-2**64",
        lambda c: plan.Problem.from_buffers([(0, 1, 2**64)]),
        InvalidParamError,
        "size[0]",
        "18446744073709551616",
    ),
    case(
        "Problem-size-float",
        lambda c: plan.Problem.of(["a"], [0], [1], [1.5]),
        TypeError,
        "size[0]",
        "1.5",
    ),
    case(
        "Problem-empty-lifetime", lambda c: plan.Problem.from_buffers([(3, 3, 8)]), InvalidParamError, "'0'", "[3, 3)"
    ),
    case(
        "Problem-lengths",
        lambda c: plan.Problem.of(["a", "b"], [0], [1], [8]),
        InvalidParamError,
        "same length",
        "2, 1",
    ),
    case("Problem-from_csv-path", lambda c: plan.Problem.from_csv(123), TypeError, "path", "123"),
    case(
        "Problem-from_csv-cell",
        lambda c: plan.Problem.from_csv(c.file("bad.csv", "id,lower,upper,size\n0,1,x,4\n")),
        InvalidParamError,
        "bad.csv:2",
        "upper",
        "'x'",
    ),
    case(
        "Problem-from_csv-2**64",
        lambda c: plan.Problem.from_csv(c.file("big.csv", f"id,lower,upper,size\n0,0,1,{2**64}\n")),
        InvalidParamError,
        "big.csv:2: size",
        "18446744073709551616",
    ),
    case(
        "Problem-from_csv-binary",
        lambda c: plan.Problem.from_csv(c.file("bin.csv", b"id,lower,upper,size\n\xff\xfe\x00\x81")),
        InvalidParamError,
        "bin.csv",
        "not a MiniMalloc CSV",
    ),
    case(
        "Problem-from_csv-missing",
        lambda c: plan.Problem.from_csv(str(c.tmp / "missing.csv")),
        FileNotFoundError,
        "missing.csv",
    ),
    case(
        "Problem-from_trace-kind",
        lambda c: plan.Problem.from_trace([("malloc", 1, 8)]),
        InvalidParamError,
        "event 0",
        "'malloc'",
    ),
    case("Problem-from_trace-str", lambda c: plan.Problem.from_trace("abc"), TypeError, "events", "'abc'"),
    case(
        "solve-strategy",
        lambda c: plan.Problem.from_buffers([(0, 1, 8)]).solve("magic"),
        InvalidParamError,
        "strategy",
        "'magic'",
    ),
    case(
        "solve-capacity-negative",
        lambda c: plan.Problem.from_buffers([(0, 1, 8)]).solve(capacity=-5),
        InvalidParamError,
        "capacity",
        "-5",
    ),
    case(
        "solve-capacity-float",
        lambda c: plan.Problem.from_buffers([(0, 1, 8)]).solve(capacity=1.5),
        TypeError,
        "capacity",
        "1.5",
    ),
    case(
        "solve-time_limit-nan",
        lambda c: plan.Problem.from_buffers([(0, 1, 8)]).solve(time_limit=float("nan")),
        InvalidParamError,
        "time_limit",
        "nan",
    ),
    case(
        "solve-no-limit",
        lambda c: plan.Problem.from_buffers([(0, 1, 8)]).solve(time_limit=None, work_limit=None),
        InvalidParamError,
        "time_limit None",
        "work_limit",
    ),
    case(
        "solve-work_limit-negative",
        lambda c: plan.Problem.from_buffers([(0, 1, 8)]).solve(work_limit=-1),
        InvalidParamError,
        "work_limit",
        "-1",
    ),
    case(
        "validate-overlap",
        lambda c: plan.Problem.from_buffers([(0, 2, 64), (1, 3, 64)], ids=["x", "y"]).validate([0, 0]),
        InvalidParamError,
        "'x'",
        "'y'",
    ),
    case("validate-str", lambda c: plan.Problem.from_buffers([(0, 1, 8)]).validate("x"), TypeError, "offsets", "'x'"),
    case("solve-not-a-problem", lambda c: plan.solve("problem"), TypeError, "problem", "'problem'"),
    # -- Graphs -----------------------------------------------------------------------------
    case("Graph-alignment-3", lambda c: graph_mod.Graph(alignment=3), InvalidParamError, "alignment", "3"),
    case("Graph-alignment-bool", lambda c: graph_mod.Graph(alignment=True), TypeError, "alignment", "True"),
    case("Graph-size-zero", lambda c: c.graph.tensor("t", 0), InvalidParamError, "'t'", "size 0"),
    case("Graph-size-float", lambda c: c.graph.tensor("t", 1.5), TypeError, "'t'", "size", "1.5"),
    case("Graph-name-empty", lambda c: c.graph.tensor("", 8), InvalidParamError, "tensor name"),
    case("Graph-name-int", lambda c: c.graph.tensor(5, 8), TypeError, "tensor name", "5"),
    case("Graph-duplicate", lambda c: c.graph.input("x", 8), InvalidParamError, "'x'", "already defined"),
    case("Graph-op-inputs-str", lambda c: c.graph.op("o", "xw", [("y", 8)]), TypeError, "inputs", "'xw'"),
    case(
        "Graph-op-duration-text",
        lambda c: c.graph.op("o", ["x"], [("y", 8)], duration_us="fast"),
        TypeError,
        "duration_us",
        "'fast'",
    ),
    case(
        "Graph-op-duration-negative",
        lambda c: c.graph.op("o", ["x"], [("y", 8)], duration_us=-5),
        InvalidParamError,
        "duration_us",
        "-5",
    ),
    case(
        "Graph-op-duration-nan",
        lambda c: c.graph.op("o", ["x"], [("y", 8)], duration_us=float("nan")),
        InvalidParamError,
        "duration_us",
        "nan",
    ),
    case(
        "Graph-op-workspace-negative",
        lambda c: c.graph.op("o", ["x"], [("y", 8)], workspace=-1),
        InvalidParamError,
        "workspace",
        "-1",
    ),
    case("Graph-op-unknown-input", lambda c: c.graph.op("o", ["nope"]), InvalidParamError, "'nope'", "op 'o'"),
    case(
        "Graph-op-output-triple",
        lambda c: c.graph.op("o", ["x"], [("y", 8, 1)]),
        InvalidParamError,
        "outputs[0]",
        "('y', 8, 1)",
    ),
    case("Graph-mark_output-unknown", lambda c: c.graph.mark_output("h", "nope"), InvalidParamError, "'nope'"),
    case("Graph-role-int", lambda c: c.graph.role(5), TypeError, "tensor name", "5"),
    case("Graph-plan-mem_limit", lambda c: c.graph.plan(mem_limit=-5), InvalidParamError, "mem_limit", "-5"),
    case("Graph-plan-strategy", lambda c: c.graph.plan("magic"), InvalidParamError, "strategy", "'magic'"),
    case("Graph-plan-preset", lambda c: c.graph.plan(preset="nope"), InvalidParamError, "preset", '"nope"'),
    case("Graph-plan-flag", lambda c: c.graph.plan(recompute="yes"), TypeError, "recompute", "'yes'"),
    case(
        "Graph-json-inputs-str",
        lambda c: graph_mod.Graph.from_dict(graph_doc(inputs="ab")),
        InvalidParamError,
        "ops[0]",
        "inputs",
        "'ab'",
    ),
    case(
        "Graph-json-duration-text",
        lambda c: graph_mod.Graph.from_dict(graph_doc(duration_us="fast")),
        InvalidParamError,
        "ops[0]",
        "duration_us",
        "'fast'",
    ),
    case(
        "Graph-json-duration-negative",
        lambda c: graph_mod.Graph.from_dict(graph_doc(duration_us=-5)),
        InvalidParamError,
        "duration_us",
        "-5",
    ),
    case(
        "Graph-json-size-2**64",
        lambda c: graph_mod.Graph.from_dict(graph_doc() | {"tensors": [["a", 2**64, "input", None]], "ops": []}),
        InvalidParamError,
        "tensors[0]",
        "18446744073709551616",
    ),
    case(
        "Graph-json-tensors-not-list",
        lambda c: graph_mod.Graph.from_dict(graph_doc() | {"tensors": "abc"}),
        InvalidParamError,
        "tensors",
        "'abc'",
    ),
    case(
        "Graph-load-deep",
        lambda c: graph_mod.Graph.load(c.file("deep.json", deep_json())),
        InvalidParamError,
        "deep.json",
        "nested too deeply",
    ),
    case(
        "Graph-load-not-gzip",
        lambda c: graph_mod.Graph.load(c.file("fake.json.gz", b"{}", compress=False)),
        InvalidParamError,
        "fake.json.gz",
        "not a gzip file",
    ),
    case(
        "Graph-load-binary",
        lambda c: graph_mod.Graph.load(c.file("bin.json", b"\xff\xfe\x00\x81")),
        InvalidParamError,
        "bin.json",
        "not valid JSON",
    ),
    case(
        "Graph-load-inputs-str",
        lambda c: graph_mod.Graph.load(c.file("g.json", json.dumps(graph_doc(inputs="ab")))),
        InvalidParamError,
        "g.json",
        "'ab'",
    ),
    # -- Replay -----------------------------------------------------------------------------
    case("replay-events-str", lambda c: replay.replay("abc", c.dev), TypeError, "events", "'abc'"),
    case(
        "replay-size-zero", lambda c: replay.replay([("alloc", 1, 0)], c.dev), InvalidParamError, "event 0", "0 bytes"
    ),
    case(
        "replay-size-2**64",
        lambda c: replay.replay([("alloc", 1, 2**64)], c.dev),
        InvalidParamError,
        "event 0",
        "18446744073709551616",
    ),
    case(
        "replay-id-unhashable",
        lambda c: replay.replay([("alloc", [1], 8)], c.dev),
        InvalidParamError,
        "event 0",
        "[1]",
    ),
    case(
        "replay-action-array",
        lambda c: replay.replay([(np.ones((2, 2)), 1, 8)], c.dev),
        InvalidParamError,
        "event 0",
        "action",
    ),
    case("replay-policy-99", lambda c: replay.replay(EVENTS, c.dev, policy=99), InvalidParamError, "policy", "99"),
    case("replay-stop_on_oom", lambda c: replay.replay(EVENTS, c.dev, stop_on_oom="yes"), TypeError, "stop_on_oom"),
    case(
        "replay-config-key",
        lambda c: replay.replay(EVENTS, {"capacit": "64MiB"}),
        InvalidParamError,
        "device_or_config",
        "capacit",
    ),
    case("replay-config-type", lambda c: replay.replay(EVENTS, 5), TypeError, "device_or_config", "5"),
    case(
        "min_capacity-granularity-0",
        lambda c: replay.min_capacity(EVENTS, granularity=0),
        InvalidParamError,
        "granularity",
        "0",
    ),
    case(
        "min_capacity-huge-trace",
        lambda c: replay.min_capacity([("alloc", 1, 2**50)]),
        InvalidParamError,
        "1,125,899,906,842,624",
    ),
    case("peak_live_bytes-unknown-free", lambda c: replay.peak_live_bytes([("free", 1)]), InvalidParamError, "event 0"),
    # -- Trace readers and generators -------------------------------------------------------
    case(
        "snapshot_trace-device-negative",
        lambda c: formats.load({"device_traces": [[]]}, device=-1),
        InvalidParamError,
        "device",
        "-1",
    ),
    case(
        "snapshot_trace-entry-without-addr",
        lambda c: formats.load({"device_traces": [[{"action": "alloc", "size": 8}]]}),
        InvalidParamError,
        "device_traces[0][0]",
        "addr",
    ),
    case(
        "snapshot_trace-size-text",
        lambda c: formats.load({"device_traces": [[{"action": "alloc", "addr": 1, "size": "x"}]]}),
        InvalidParamError,
        "size",
        "'x'",
    ),
    case(
        "snapshot_trace-traces-array",
        lambda c: formats.load({"device_traces": np.ones((2, 2))}),
        InvalidParamError,
        "device_traces",
    ),
    case("load-path-list", lambda c: formats.load([1, 2]), TypeError, "path", "[1, 2]"),
    case(
        "snapshot_trace-source-list",
        lambda c: deprecated(importers.snapshot_trace, [1, 2]),
        TypeError,
        "source",
        "[1, 2]",
    ),
    case("snapshot_trace-malicious-pickle", malicious_snapshot, InvalidParamError, "evil.pickle", "system"),
    case(
        "snapshot_trace-garbage",
        lambda c: formats.load(c.file("junk.pickle", b"\x80\x05junk")),
        InvalidParamError,
        "junk.pickle",
    ),
    case(
        "profiler_trace-events-int",
        lambda c: formats.load({"traceEvents": 5}),
        InvalidParamError,
        "traceEvents",
        "5",
    ),
    case(
        "profiler_trace-addr-text",
        lambda c: formats.load({"traceEvents": [{"name": "[memory]", "ts": 1, "args": {"Addr": "x", "Bytes": 8}}]}),
        InvalidParamError,
        "traceEvents[0]",
        "Addr",
        "'x'",
    ),
    case(
        "profiler_trace-compact-trace",
        lambda c: deprecated(
            importers.profiler_trace, os.path.join(REPO, "benches", "traces", "torch_cpu_convnet.json.gz")
        ),
        InvalidParamError,
        "torch_cpu_convnet.json.gz",
        "npumem.traces.load",
    ),
    case(
        "profiler_trace-deep",
        lambda c: formats.load(c.file("deep.json", deep_json())),
        InvalidParamError,
        "nested too deeply",
    ),
    case(
        "profiler_trace-device_type",
        lambda c: formats.load({"traceEvents": []}, device_type=-1),
        InvalidParamError,
        "device_type",
        "-1",
    ),
    case(
        "traces-load-profiler-file",
        lambda c: deprecated(traces.load, c.file("p.json", json.dumps({"traceEvents": []}))),
        InvalidParamError,
        "p.json",
        "profiler_trace",
    ),
    case(
        "traces-load-bad-event",
        lambda c: formats.load(c.file("t.json", json.dumps({"events": [["alloc", 1]]}))),
        InvalidParamError,
        "events[0]",
    ),
    case(
        "traces-load-deep",
        lambda c: formats.load(c.file("deep.json.gz", deep_json())),
        InvalidParamError,
        "nested too deeply",
    ),
    case("transformer-layers-0", lambda c: workloads.transformer_training(layers=0), InvalidParamError, "layers", "0"),
    case("transformer-batch", lambda c: workloads.transformer_training(batch=(1,)), TypeError, "batch", "(1,)"),
    case(
        "transformer-hidden-huge",
        lambda c: workloads.transformer_training(hidden=2**40),
        InvalidParamError,
        "hidden",
        "1099511627776",
    ),
    # -- Access patterns --------------------------------------------------------------------
    case("sequential-step-0", lambda c: patterns.sequential(0, 4096, 0), InvalidParamError, "step", "0"),
    case("sequential-too-many", lambda c: patterns.sequential(0, 2**40, 1), InvalidParamError, "would make", "2**28"),
    case("sequential-wraps", lambda c: patterns.sequential(2**64 - 10, 4096), InvalidParamError, "base", "2**64"),
    case(
        "pointer_chase-below-page", lambda c: patterns.pointer_chase(0, 100, 10), InvalidParamError, "footprint", "100"
    ),
    case(
        "pointer_chase-page-1000",
        lambda c: patterns.pointer_chase(0, MiB, 10, page=1000),
        InvalidParamError,
        "page 1000",
    ),
    case("uniform-footprint-0", lambda c: patterns.uniform(0, 0, 10), InvalidParamError, "footprint", "0"),
    case("strided-count-negative", lambda c: patterns.strided(0, MiB, 64, -1), InvalidParamError, "count", "-1"),
    case("gemm-tile-0", lambda c: patterns.gemm(0, 0, 0, 64, 64, 64, tile=(0, 64, 64)), InvalidParamError, "tile[0]"),
    case("gemm-order", lambda c: patterns.gemm(0, 0, 0, 64, 64, 64, order="mmk"), InvalidParamError, "order", "'mmk'"),
    case(
        "gemm-unbounded",
        lambda c: patterns.gemm(0, 0, 0, 2**20, 2**20, 2**20),
        InvalidParamError,
        "gemm",
        "limit",
    ),
    case("gather-rows-0", lambda c: patterns.gather(0, 0, 64, 10), InvalidParamError, "rows", "0"),
    case("gather-zipf-1", lambda c: patterns.gather(0, 10, 64, 10, zipf=1.0), InvalidParamError, "zipf", "1.0"),
    case("interleave-chunk-0", lambda c: patterns.interleave(np.arange(3), chunk=0), InvalidParamError, "chunk", "0"),
    case("interleave-stream-float", lambda c: patterns.interleave([0.5]), TypeError, "streams[0][0]", "0.5"),
    case("conv-kernel-too-big", lambda c: patterns.conv_nc1hwc0(0, 1, 1, 2, 2), InvalidParamError, "kernel", "2 x 2"),
    case(
        "gemm_fractal-frac-0",
        lambda c: patterns.gemm_fractal(0, 0, 0, 16, 16, 16, frac=0),
        InvalidParamError,
        "frac",
        "0",
    ),
    # -- The TLB model ----------------------------------------------------------------------
    case("Tlb-preset", lambda c: tlb_mod.Tlb.preset("nope", c.dev), InvalidParamError, "TLB preset", '"nope"'),
    case("Tlb-device", lambda c: tlb_mod.Tlb.preset("zen4", "dev"), TypeError, "device", "'dev'"),
    case("Tlb-override-negative", lambda c: tlb(c, walk_step_cycles=-1), InvalidParamError, "walk_step_cycles", "-1"),
    case("Tlb-override-unknown", lambda c: tlb(c, bogus=1), InvalidParamError, "bogus"),
    case("Tlb-run-negative", lambda c: tlb(c).run([-1]), InvalidParamError, "addresses[0]", "-1"),
    case("Tlb-run-str", lambda c: tlb(c).run("abc"), TypeError, "addresses", "'abc'"),
    case("Tlb-nominal_reach-0", lambda c: tlb(c).nominal_reach(0), InvalidParamError, "page_size", "0"),
    case(
        "Tlb-walk_step_cycles-2**64-1",
        lambda c: tlb(c, walk_step_cycles=2**64 - 1).run([c.ptr, c.ptr + 4096]),
        InvalidParamError,
        "walk_step_cycles",
    ),
    case("Tlb-host_page_size", lambda c: tlb(c, host_page_size=65536), InvalidParamError, "host_page_size", "65536"),
    case("Tlb-host-str", lambda c: tlb(c, host="4KiB"), TypeError, "host", "'4KiB'"),
    case("Tlb-host-levels", lambda c: tlb(c, host={"levels": 3}), InvalidParamError, "host.levels", "3"),
    case("Tlb-host-field", lambda c: tlb(c, host={"pages": 1}), InvalidParamError, "host field", "pages"),
    case(
        "Tlb-host-nested_tlb_entries",
        lambda c: tlb(c, host={"nested_tlb_entries": 5000}),
        InvalidParamError,
        "host.nested_tlb_entries",
        "5000",
    ),
    case(
        "predict_chase-costs",
        lambda c: tlb_mod.predict_chase([1 << 20], 4096, preset="zen4", costs={"base_ns": 1}),
        InvalidParamError,
        "costs",
        "far_ns",
    ),
    case(
        "predict_chase-page",
        lambda c: tlb_mod.predict_chase([1 << 20], 8192, preset="zen4", costs={}),
        InvalidParamError,
        "page_size",
        "8192",
    ),
    case(
        "predict_chase-caches",
        lambda c: tlb_mod.predict_chase(
            [1 << 20],
            4096,
            preset="zen4",
            costs=dict.fromkeys(("base_ns", "l2_tlb_ns", "near_ns", "far_ns"), 1.0),
            caches=(1.5, 2),
        ),
        TypeError,
        "caches[0]",
        "1.5",
    ),
    case(
        "fit_chase-length",
        lambda c: tlb_mod.fit_chase([1 << 20, 2 << 20], [1.0], preset="zen4"),
        InvalidParamError,
        "ns",
        "2 footprints",
    ),
    case(
        "fit_chase-ns-0",
        lambda c: tlb_mod.fit_chase([1 << 20], [0.0], preset="zen4"),
        InvalidParamError,
        "ns[0]",
        "0.0",
    ),
    case("fit_chase-ns-str", lambda c: tlb_mod.fit_chase([1 << 20], "1", preset="zen4"), TypeError, "ns", "'1'"),
    case("sweep-presets-str", lambda c: tlb_mod.sweep(presets="zen4"), TypeError, "presets", "'zen4'"),
    case("sweep-page", lambda c: tlb_mod.sweep(pages=["8KiB"]), InvalidParamError, "pages[0]", "'8KiB'"),
    case("sweep-footprint-0", lambda c: tlb_mod.sweep(footprints=[0]), InvalidParamError, "footprints[0]", "0"),
    case("sweep-accesses-0", lambda c: tlb_mod.sweep(accesses=0), InvalidParamError, "accesses", "0"),
    case(
        "huge_frame_rates-target",
        lambda c: tlb_mod.huge_frame_rates(target_used=2),
        InvalidParamError,
        "target_used",
        "2",
    ),
    case("write_csv-rows", lambda c: tlb_mod.write_csv([1], str(c.tmp / "t.csv")), TypeError, "rows[0]", "1"),
    # -- The host pool ----------------------------------------------------------------------
    case("HostPool-capacity", lambda c: hostpool_mod.HostPool(-1), InvalidParamError, "capacity", "-1"),
    case(
        "HostPool-huge_pages", lambda c: hostpool_mod.HostPool("64MiB", huge_pages="x"), InvalidParamError, "huge_pages"
    ),
    case("HostPool-dtype", lambda c: c.pool.array(5, "notadtype"), InvalidParamError, "dtype", "notadtype"),
    case("HostPool-shape-negative", lambda c: c.pool.array(-1, float), InvalidParamError, "shape", "-1"),
    case("HostPool-shape-float", lambda c: c.pool.empty(2.5), InvalidParamError, "shape", "2.5"),
    case("HostPool-order", lambda c: c.pool.empty(5, order="X"), InvalidParamError, "order", '"X"'),
    case("HostPool-objects", lambda c: c.pool.empty(5, dtype=object), InvalidParamError, "objects"),
    case("HostPool-buffer-negative", lambda c: c.pool.buffer(-1), InvalidParamError, "nbytes", "-1"),
    case("HostPool-churn-negative", lambda c: c.pool.churn(-1, 1), InvalidParamError, "nbytes", "-1"),
    case("HostPool-trim-negative", lambda c: c.pool.trim(-1), InvalidParamError, "min_block", "-1"),
    case("HostPool-full-value", lambda c: c.pool.full(3, "abc", dtype=float), InvalidParamError, "fill_value", "'abc'"),
    case("HostPool-handler_of", lambda c: hostpool_mod.HostPool.handler_of("x"), TypeError, "array", "'x'"),
    # -- Units, the demo, model graphs ------------------------------------------------------
    case("parse_size-text", lambda c: units.parse_size("abc"), InvalidParamError, '"abc"'),
    case("parse_size-negative", lambda c: units.parse_size(-1), InvalidParamError, "size", "-1"),
    case("format_size-float", lambda c: units.format_size(1.5), TypeError, "bytes", "float"),
    case("fmt-negative", lambda c: units.fmt(-1), InvalidParamError, "bytes", "-1"),
    case("demo-capacity", lambda c: demo_mod.run(capacity="1KiB"), InvalidParamError, "capacity", "'1KiB'"),
    case("demo-seed", lambda c: demo_mod.run(seed="x"), TypeError, "seed", "'x'"),
    case(
        "torch_graphs-alignment",
        lambda c: __import__("npumem.torch_graphs").torch_graphs.from_fx(None, alignment=3),
        InvalidParamError,
        "alignment 3",
    ),
]


# --------------------------------------------------------------------------------------------
# Trace files meant to hurt: crafted pickles, oversized fields, bombs, wrong shapes
# --------------------------------------------------------------------------------------------

DEEP = 1_000_000


def deep_tuple_key_pickle() -> bytes:
    """A dict whose key is a tuple nested 10^6 deep (hashing it overflowed the C stack)."""
    return b"\x80\x04}" + b"K\x01" + b"\x85" * DEEP + b"K\x02s."


def deep_frozenset_pickle() -> bytes:
    """A frozenset of a tuple nested 10^6 deep."""
    return b"\x80\x04(" + b"K\x01" + b"\x85" * DEEP + b"\x91."


def shared_tuple_key_pickle(levels: int = 90) -> bytes:
    """A dict key of ``levels`` tuples, each holding the one below twice (2**levels to hash)."""
    body = b"K\x01\x94"
    for i in range(levels):
        body += b"h" + bytes([i]) + b"h" + bytes([i]) + b"\x86\x94"
    return b"\x80\x04}" + body + b"K\x02s."


#: REDUCE of builtins.int(inf) and of builtins.str(b"x", "nocodec"): plain types called on bad data.
INT_INF_PICKLE = b"\x80\x02cbuiltins\nint\nG" + b"\x7f\xf0" + b"\x00" * 6 + b"\x85R."
CODEC_PICKLE = b"\x80\x03cbuiltins\nstr\nC\x01xX\x07\x00\x00\x00nocodec\x86R."
#: LONG_BINPUT at memo index 2**32-1 (the unpickler would size its memo by it).
MEMO_PICKLE = b"\x80\x04K\x01r\xff\xff\xff\xff."
#: BINUNICODE8 that claims 2**60 bytes.
CLAIM_PICKLE = b"\x80\x04\x8d" + (1 << 60).to_bytes(8, "little") + b"x."

RMM_HEAD = "Thread,Time,Action,Pointer,Size,Stream\n"


def rmm(c: Ctx, *rows: str, name: str = "t.csv") -> str:
    return c.file(name, RMM_HEAD + "".join(r + "\n" for r in rows))


def npz(c: Ctx, name: str = "t.npz", **cols: Any) -> str:
    base = {"npumem_trace": np.array([1, 0], np.uint64), "is_alloc": [1, 0], "ids": [0, 0], "sizes": [8, 8]}
    path = str(c.tmp / name)
    with open(path, "wb") as f:
        np.savez(f, **{k: np.asarray(v) for k, v in (base | cols).items()})
    return path


def npz_claiming(c: Ctx) -> str:
    """An npz whose ids member's header claims 2**40 elements and holds 2."""
    path = npz(c, "claim.npz")
    import zipfile

    with zipfile.ZipFile(path) as z:
        members = {n: z.read(n) for n in z.namelist()}
    members["ids.npy"] = members["ids.npy"].replace(b"(2,)", b"(1099511627776,)")
    with zipfile.ZipFile(path, "w") as z:
        for n, data in members.items():
            z.writestr(n, data)
    return path


def trace_of(is_alloc: list[int], ids: list[int], sizes: list[int]) -> formats.Trace:
    return formats.Trace(np.array(is_alloc), np.array(ids), np.array(sizes))


CASES += [
    # -- snapshot pickles: depth, hashing, memo and lengths bounded while loading ------------
    case(
        "snapshot-deep-tuple-key",
        lambda c: formats.load(c.file("deep.pickle", deep_tuple_key_pickle())),
        InvalidParamError,
        "deep.pickle",
        "nested more than 100",
    ),
    case(
        "snapshot-deep-frozenset",
        lambda c: deprecated(importers.snapshot_trace, c.file("fs.pickle", deep_frozenset_pickle())),
        InvalidParamError,
        "fs.pickle",
        "nested more than 100",
    ),
    case(
        "snapshot-shared-tuple-key",
        lambda c: formats.load(c.file("dag.pickle", shared_tuple_key_pickle())),
        InvalidParamError,
        "dag.pickle",
        "dict key",
    ),
    case(
        "snapshot-reduce-int-inf",
        lambda c: formats.load(c.file("inf.pickle", INT_INF_PICKLE)),
        InvalidParamError,
        "inf.pickle",
        "builtins.int",
    ),
    case(
        "snapshot-reduce-unknown-codec",
        lambda c: formats.load(c.file("codec.pickle", CODEC_PICKLE)),
        InvalidParamError,
        "codec.pickle",
        "builtins.str",
    ),
    case(
        "snapshot-memo-index-2**32",
        lambda c: formats.load(c.file("memo.pickle", MEMO_PICKLE)),
        InvalidParamError,
        "memo.pickle",
        "memo index 4294967295",
    ),
    case(
        "snapshot-length-2**60",
        lambda c: formats.load(c.file("claim.pickle", CLAIM_PICKLE)),
        InvalidParamError,
        "claim.pickle",
        "1,152,921,504,606,846,976 bytes",
    ),
    case(
        "snapshot-dev-zero",
        lambda c: deprecated(importers.snapshot_trace, "/dev/zero"),
        InvalidParamError,
        "/dev/zero",
        "not a pickle opcode",
    ),
    case("load-dev-zero", lambda c: formats.load("/dev/zero"), InvalidParamError, "/dev/zero", "not a trace"),
    case(
        "write_snapshot-None",
        lambda c: formats.write_snapshot(None, str(c.tmp / "s.pickle")),
        TypeError,
        "device",
        "None",
    ),
    # -- RMM CSV ------------------------------------------------------------------------------
    case(
        "read_rmm_csv-size-5000-digits",
        lambda c: formats.read_rmm_csv(rmm(c, "1,00:00:00.0,allocate,0x1000," + "9" * 5000 + ",0x0")),
        InvalidParamError,
        "line 2",
        "Size",
    ),
    case(
        "read_rmm_csv-size-superscript",
        lambda c: formats.read_rmm_csv(rmm(c, "1,00:00:00.0,allocate,0x1000,\u00b2,0x0")),
        InvalidParamError,
        "line 2",
        "Size",
        "'²'",
    ),
    case(
        "read_rmm_csv-thread-5000-digits",
        lambda c: formats.read_rmm_csv(rmm(c, "9" * 5000 + ",00:00:00.0,allocate,0x1000,8,0x0")),
        InvalidParamError,
        "line 2",
        "Thread",
    ),
    case(
        "read_rmm_csv-field-past-csv-limit",
        lambda c: formats.read_rmm_csv(rmm(c, '1,"' + ("x" * 60000 + "\n") * 3 + '",allocate,0x1,8,0x0')),
        InvalidParamError,
        "t.csv",
        "field limit",
    ),
    case(
        "read_rmm_csv-line-too-long",
        lambda c: formats.read_rmm_csv(rmm(c, "1," + "0" * 100_000)),
        InvalidParamError,
        "line 2",
        "65,536",
    ),
    case("read_rmm_csv-dev-zero", lambda c: formats.read_rmm_csv("/dev/zero"), InvalidParamError, "line 1"),
    case(
        "read_rmm_csv-nul",
        lambda c: formats.read_rmm_csv(rmm(c, "1,00:00:00.0,allocate,0x1\x00,8,0x0")),
        InvalidParamError,
        "line 2",
    ),
    # -- npz ----------------------------------------------------------------------------------
    case(
        "read_npz-ids-2d",
        lambda c: formats.read_npz(npz(c, ids=np.zeros((2, 1), np.uint64))),
        InvalidParamError,
        "column ids",
        "2 dimensions",
    ),
    case(
        "read_npz-head-0d",
        lambda c: formats.read_npz(npz(c, npumem_trace=np.uint64(1))),
        InvalidParamError,
        "npumem_trace",
        "shape ()",
    ),
    case(
        "read_npz-head-2d",
        lambda c: formats.read_npz(npz(c, npumem_trace=np.ones((2, 2), np.uint64))),
        InvalidParamError,
        "npumem_trace",
        "shape (2, 2)",
    ),
    case(
        "read_npz-ids-negative",
        lambda c: formats.read_npz(npz(c, ids=np.array([-1, -1], np.int64))),
        InvalidParamError,
        "column ids",
        "-1",
    ),
    case(
        "read_npz-sizes-negative",
        lambda c: formats.read_npz(npz(c, sizes=np.array([-8, -8], np.int64))),
        InvalidParamError,
        "column sizes",
        "-8",
    ),
    case(
        "read_npz-failed-negative",
        lambda c: formats.read_npz(npz(c, npumem_trace=np.array([1, -3], np.int64))),
        InvalidParamError,
        "-3 failed",
    ),
    case(
        "read_npz-header-claims-2**40",
        lambda c: formats.read_npz(npz_claiming(c)),
        InvalidParamError,
        "claim.npz",
        "1099511627776",
    ),
    case("read_npz-dev-zero", lambda c: formats.read_npz("/dev/zero"), InvalidParamError, "/dev/zero", "npz"),
    # -- Traces that do not pair up ------------------------------------------------------------
    case(
        "replay-trace-free-before-alloc",
        lambda c: replay.replay(trace_of([0, 1], [0, 0], [8, 8]), c.dev),
        InvalidParamError,
        "event 0",
        "freed while not live",
    ),
    case(
        "replay-trace-double-free",
        lambda c: replay.replay(trace_of([1, 0, 0], [0, 0, 0], [8, 8, 8]), c.dev),
        InvalidParamError,
        "event 2",
        "freed while not live",
    ),
    case(
        "min_capacity-free-size-differs",
        lambda c: replay.min_capacity(trace_of([1, 0, 1, 0], [0, 0, 1, 1], [10 * MiB, 1, 1, 1])),
        InvalidParamError,
        "event 1",
        "with 1 bytes",
        "10,485,760",
    ),
    case(
        "Trace-failed-negative",
        lambda c: formats.Trace(np.array([1]), np.array([0]), np.array([8]), failed_allocs=-1),
        InvalidParamError,
        "failed_allocs",
        "-1",
    ),
    # -- Generators and plots ---------------------------------------------------------------
    case(
        "plot_timelines-empty",
        lambda c: workloads.plot_timelines([], str(c.tmp / "t.png")),
        InvalidParamError,
        "timelines",
        "empty",
    ),
    case(
        "plot_timelines-not-timelines",
        lambda c: workloads.plot_timelines([1], str(c.tmp / "t.png")),
        TypeError,
        "timelines[0]",
    ),
    case(
        "testing-workloads-streams-negative",
        lambda c: __import__("npumem.testing").testing.workloads(streams=-1),
        InvalidParamError,
        "streams",
        "-1",
    ),
]


def test_the_matrix_is_large_and_covers_every_entry_point():
    assert len(CASES) >= 80
    groups = {p.values[0].id.split("-")[0] for p in CASES}
    for entry in ("Device", "malloc", "free", "Problem", "solve", "Graph", "replay", "snapshot_trace", "sequential"):
        assert entry in groups, entry
    assert {"Tlb", "sweep", "HostPool", "parse_size", "demo"} <= groups


@pytest.mark.parametrize("c", CASES)
def test_bad_input(ctx, c: Case):
    if c.id.startswith("HostPool"):
        assert ctx.pool.stats()["carved"] == 0  # made before the call, so its state is compared
    before = ctx.state()
    with pytest.raises(c.exc) as info:
        c.call(ctx)
    err = info.value
    if isinstance(err, npumem.AclError):
        assert err.code in (100000, 107000, 207002), err.code
    message = str(err)
    for word in c.words:
        assert word in message, f"{word!r} not in {message!r}"
    after = ctx.state()
    if c.finding:
        assert [f.kind for f in ctx.dev.sanitizer_reports()[before["findings"] :]] == [c.finding]
        after["findings"] = before["findings"]
    assert after == before
    # The device still works.
    p = ctx.dev.malloc(8192)
    ctx.dev.write(p, b"ok")
    assert ctx.dev.read(p, 2) == b"ok" and ctx.dev.read(ctx.ptr, 1) == b"\x07"
    ctx.dev.free(p)


def test_ctypes_and_other_buffer_exporters_are_taken(ctx):
    import array
    import ctypes

    data = (ctypes.c_int32 * 4)(1, 2, 3, 4)
    ctx.dev.write(ctx.ptr, data)
    back = (ctypes.c_int32 * 4)()
    ctx.dev.read_into(ctx.ptr, back)
    assert list(back) == [1, 2, 3, 4]
    ctx.dev.write(ctx.ptr, array.array("h", [7, 8]))
    assert ctx.dev.to_numpy(ctx.ptr, 2, np.int16).tolist() == [7, 8]


def test_a_real_snapshot_pickle_still_loads(ctx, tmp_path):
    ctx.dev.record_memory_history()
    p = ctx.dev.malloc(MiB)
    ctx.dev.free(p)
    path = tmp_path / "snap.pickle"
    ctx.dev.dump_snapshot(path)
    events = formats.load(path).events()
    assert [e[0] for e in events] == ["alloc", "free"] and events[0][2] == MiB


@pytest.mark.parametrize("target", ["builtins eval", "subprocess Popen", "os system", "npumem.device Device"])
def test_snapshot_unpickler_refuses_every_global_but_plain_types(tmp_path, target):
    module, name = target.split()
    # A protocol-2 pickle that calls module.name("1"): GLOBAL, a one-tuple, REDUCE.
    crafted = b"\x80\x02c" + f"{module}\n{name}\n".encode() + b"X\x01\x00\x00\x001\x85R."
    path = tmp_path / "crafted.pickle"
    path.write_bytes(crafted)
    with pytest.raises(InvalidParamError, match=f"refers to {module}.{name}"):
        formats.load(path)


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_snapshot_unpickler_loads_plain_data_of_every_protocol(tmp_path, protocol):
    shared = [1, 2]
    loop: list[Any] = ["loop"]
    loop.append(loop)
    doc = {
        "device_traces": [[{"action": "alloc", "addr": 2**63 + 5, "size": 8, "frames": shared}]],
        "plain": [None, True, False, -1, 2**70, 1.5, "é", (1, ("x", ())), shared, {7: "seven", None: 0}],
        "sets": [{1, "a"}, frozenset({2, "b"}), set()],
        "loop": loop,
    }
    if protocol >= 3:
        doc["bytes"] = b"\x00\xff"
    path = tmp_path / "plain.pickle"
    path.write_bytes(pickle.dumps(doc, protocol=protocol))
    back = npumem._files.read_snapshot(path)
    assert back["loop"][1] is back["loop"]
    del back["loop"], doc["loop"]
    assert back == doc
    if protocol >= 2:  # detect() tells a snapshot by its PROTO opcode
        assert formats.load(path).events() == [("alloc", 0, 8)]


def test_snapshot_hash_keys_are_refused_unless_safe(tmp_path):
    # A tuple as a dict key may be crafted to take forever to hash: refused, as are floats.
    for key in [(1, 2), 1.5, 2**70]:
        path = tmp_path / "k.pickle"
        path.write_bytes(pickle.dumps({"device_traces": [], key: 1}))
        with pytest.raises(InvalidParamError, match="dict key or set element"):
            formats.load(path)


def test_rmm_csv_with_a_byte_order_mark_is_read(tmp_path):
    path = tmp_path / "bom.csv"
    path.write_bytes(b"\xef\xbb\xbf" + (RMM_HEAD + "1,00:00:00.0,allocate,0x1000,64,0x0\n").encode())
    assert formats.detect(path) == "rmm-csv"
    assert formats.load(path).events() == [("alloc", 0, 64)]


_ROWS = ["1,00:00:00.000001,allocate,0x1000,64,0x0", "1,00:00:00.000002,free,0x1000,64,0x0"]
_MEMORY_EVENTS = [
    {"ph": "i", "name": "[memory]", "pid": 1, "tid": 1, "ts": t, "args": {"Addr": 4096, "Bytes": b, "Device Type": 0}}
    for t, b in ((1.0, 64), (2.0, -64))
]


@pytest.mark.parametrize(
    ("name", "data", "kind"),
    [
        ("crlf.csv", (RMM_HEAD + "".join(r + "\n" for r in _ROWS)).replace("\n", "\r\n"), "rmm-csv"),
        (
            "quoted.csv",
            "".join(",".join(f'"{f}"' for f in r.split(",")) + "\n" for r in [RMM_HEAD[:-1], *_ROWS]),
            "rmm-csv",
        ),
        ("spaced.csv", "".join(r.replace(",", ", ") + "\n" for r in [RMM_HEAD[:-1], *_ROWS]), "rmm-csv"),
        ("bom.json", "\ufeff" + json.dumps({"traceEvents": _MEMORY_EVENTS}), "profiler"),
        ("array.json", json.dumps(_MEMORY_EVENTS, indent=1), "profiler"),
        ("bom-compact.json", "\ufeff" + json.dumps({"events": [["alloc", 0, 64], ["free", 0, 64]]}), "compact-json"),
    ],
)
def test_valid_files_other_tools_write_are_read(tmp_path, name, data, kind):
    """What CSV writers (quoting, spaces, CRLF), Windows tools (a BOM) and the Trace Event
    Format's array form produce is a trace like any other."""
    path = tmp_path / name
    path.write_bytes(data.encode())
    assert formats.detect(path) == kind
    assert formats.load(path).events() == [("alloc", 0, 64), ("free", 0, 64)]


@pytest.mark.parametrize("top", [2**60, 2**64 - 1])
def test_rmm_csv_and_profiler_writers_of_huge_ids_read_back(tmp_path, top):
    trace = formats.Trace(
        np.array([1, 1, 0, 0], np.uint8), np.array([top, 3, top, 3], np.uint64), np.array([8, 2**64 - 1] * 2, np.uint64)
    )
    for write, name in ((formats.write_rmm_csv, "t.csv"), (formats.write_profiler_trace, "t.json")):
        write(trace, tmp_path / name)
        back = formats.load(tmp_path / name)
        assert back.events() == [("alloc", 0, 8), ("alloc", 1, 2**64 - 1), ("free", 0, 8), ("free", 1, 2**64 - 1)]


def test_readers_bound_what_a_bomb_makes_them_read(tmp_path, monkeypatch):
    # A gzip that decompresses past MAX_JSON_BYTES, and an npz whose columns pass MAX_NPZ_BYTES.
    monkeypatch.setattr(npumem._files, "MAX_JSON_BYTES", 1 << 20)
    bomb = tmp_path / "bomb.json.gz"
    bomb.write_bytes(gzip.compress(b'{"events": [' + b" " * (8 << 20) + b"]}"))
    with pytest.raises(InvalidParamError, match="larger than 2\\*\\*20 bytes"):
        formats.load(bomb)
    monkeypatch.setattr(formats, "MAX_NPZ_BYTES", 1 << 20)
    path = tmp_path / "bomb.npz"
    n = 1 << 20  # alloc and free of one id, over and over: 3 MiB of columns that compress to a few KiB
    formats.write_npz(
        formats.Trace(np.arange(n) % 2 == 0, np.zeros(n, np.uint8), np.ones(n, np.uint8)), path, compress=True
    )
    assert path.stat().st_size < 1 << 20
    with pytest.raises(InvalidParamError, match="more than 2\\*\\*20 bytes decompressed"):
        formats.load(path)


def test_a_large_snapshot_scans_in_proportion(tmp_path):
    # The scan before loading costs about what the load does (so snapshots stay quick to read).
    import time

    entries = [{"action": "alloc", "addr": 4096 * i, "size": 4096, "frames": []} for i in range(30_000)]
    path = tmp_path / "big.pickle"
    path.write_bytes(pickle.dumps({"device_traces": [entries]}))
    t0 = time.perf_counter()
    pickle.loads(path.read_bytes())
    load = time.perf_counter() - t0
    t0 = time.perf_counter()
    npumem._files.read_snapshot(path)
    ours = time.perf_counter() - t0
    assert ours < 10 * load + 1.0, (ours, load)


def test_kv_cache_serving_with_rare_arrivals_is_quick():
    import time

    t0 = time.perf_counter()
    events = workloads.kv_cache_serving(requests=50, arrival_rate=1e-6)
    assert time.perf_counter() - t0 < 10
    assert sum(1 for e in events if e[0] == "alloc") == sum(1 for e in events if e[0] == "free") > 50


def test_acl_init_with_a_malformed_config_is_an_error_code(tmp_path):
    from npumem import acl

    for body in [
        '{"defaultDevice": {"default_device": [1]}}',
        '{"defaultDevice": {"default_device": 1e400}}',
        "[[" * 10**5,
    ]:
        path = tmp_path / "acl.json"
        path.write_text(body)
        acl.finalize()
        assert acl.init(str(path)) == 100000


# --------------------------------------------------------------------------------------------
# Every bad call on every backend: the AscendCL class, code and message, and no change
# --------------------------------------------------------------------------------------------

#: These run on each backend (the simulator, host memory, AscendCL and CUDA over the stand-ins).
EVERY_BACKEND = BOTH_BACKENDS[0]


class CallCtx:
    """A device with a live allocation ``p`` (100 bytes), a freed one ``f``, a malloc_host block
    ``h`` (256 bytes) and ``foreign``, host memory that did not come from malloc_host."""

    def __init__(self):
        self.d = Device("64MiB", allocator="direct")
        self.p = self.d.malloc(100)
        self.f = self.d.malloc(100)
        self.d.free(self.f)
        self.h = self.d.malloc_host(256)
        self._buf = ctypes.create_string_buffer(4096)
        self.foreign = ctypes.addressof(self._buf)
        self.d.write(self.p, bytes(range(100)))
        ctypes.memmove(self.h, b"\x11" * 256, 256)


IP, RT, OOM, FREE = (
    (InvalidParamError, 100000),
    (InvalidParamError, 107000),
    (OutOfMemoryError, 207001),
    (
        MemoryFreeError,
        207002,
    ),
)

# (id, call, expected (class, code), message regex, failed_mallocs delta or None to skip the check)
#: Bad calls whose address only means something in the simulator's fixed VA window.
SIM_ONLY_CALLS = {
    "memcpy-unmapped": "an unmapped address in the simulator's VA window",
    "memcpy-window-last": "the last byte of the simulator's VA window",
}

BAD_CALLS = [
    # malloc
    ("malloc-0", lambda c: c.d.malloc(0), IP, "greater than 0", 0),
    ("malloc-0-normal", lambda c: c.d.malloc(0, Policy.NORMAL_ONLY), IP, "greater than 0", 0),
    ("malloc-0-1g", lambda c: c.d.malloc(0, Policy.HUGE1G_ONLY), IP, "greater than 0", 0),
    ("align32-0", lambda c: c.d.malloc_align32(0), IP, "greater than 0", 0),
    ("malloc-neg", lambda c: c.d.malloc(-1), IP, "2\\*\\*64", 0),
    ("malloc-2**64", lambda c: c.d.malloc(2**64), IP, "2\\*\\*64", 0),
    ("malloc-2**70", lambda c: c.d.malloc(2**70), IP, "2\\*\\*64", 0),
    ("malloc-max", lambda c: c.d.malloc(2**64 - 1), IP, "overflows", 0),
    ("malloc-pad-overflow", lambda c: c.d.malloc(2**64 - 32), IP, "overflows", 0),
    ("align32-overflow", lambda c: c.d.malloc_align32(2**64 - 31), IP, "overflows", 0),
    ("malloc-page-overflow", lambda c: c.d.malloc(2**64 - 64, Policy.NORMAL_ONLY), IP, "overflow", None),
    ("malloc-huge-overflow", lambda c: c.d.malloc(2**64 - 64), IP, "overflow", None),
    ("malloc-bad-string", lambda c: c.d.malloc("12 parsecs"), IP, "cannot read", 0),
    ("policy-8", lambda c: c.d.malloc(100, 8), IP, "ACL_MEM_MALLOC_HUGE_FIRST=0", 0),
    ("policy-neg", lambda c: c.d.malloc(100, -1), IP, "policy", 0),
    ("policy-2**32", lambda c: c.d.malloc(100, 2**32), IP, "policy", 0),
    ("align32-policy-9", lambda c: c.d.malloc_align32(100, 9), IP, "policy", 0),
    ("oom", lambda c: c.d.malloc(65 * MiB), OOM, "free of 64 MiB", 1),
    ("oom-padded", lambda c: c.d.malloc(64 * MiB, Policy.NORMAL_ONLY), OOM, "64 MiB", 1),
    ("oom-2**63", lambda c: c.d.malloc(2**63), OOM, "malloc", 1),
    ("oom-huge-only", lambda c: c.d.malloc(64 * MiB, Policy.HUGE_ONLY), OOM, "HUGE_ONLY", 1),
    ("oom-1g", lambda c: c.d.malloc(1, Policy.HUGE1G_ONLY), OOM, "giant_frames", 1),
    # free
    ("free-null", lambda c: c.d.free(0), IP, "NULL", 0),
    ("free-neg", lambda c: c.d.free(-1), IP, "ptr", 0),
    ("free-2**64", lambda c: c.d.free(2**64), IP, "ptr", 0),
    ("double-free", lambda c: c.d.free(c.f), FREE, "double free", 0),
    ("free-interior", lambda c: c.d.free(c.p + 64), FREE, "64 bytes into the allocation", 0),
    ("free-padding", lambda c: c.d.free(c.p + 100), FREE, "into the allocation", 0),
    ("free-unknown", lambda c: c.d.free(VA_WINDOW_START + GiB), FREE, "never came from malloc", 0),
    ("free-host-ptr", lambda c: c.d.free(c.h), FREE, "not a live device allocation", 0),
    ("free-window-end", lambda c: c.d.free(VA_WINDOW_END), FREE, "not a live", 0),
    # host memory
    ("free-host-null", lambda c: c.d.free_host(0), IP, "NULL", 0),
    ("free-host-device", lambda c: c.d.free_host(c.p), FREE, "malloc_host", 0),
    ("free-host-interior", lambda c: c.d.free_host(c.h + 64), FREE, "malloc_host", 0),
    ("free-host-foreign", lambda c: c.d.free_host(c.foreign), FREE, "malloc_host", 0),
    ("malloc-host-0", lambda c: c.d.malloc_host(0), IP, "greater than 0", 0),
    ("malloc-host-neg", lambda c: c.d.malloc_host(-5), IP, "size", 0),
    ("malloc-host-2**63", lambda c: c.d.malloc_host(2**63), IP, "too large", 0),
    ("malloc-host-2**64", lambda c: c.d.malloc_host(2**64), IP, "size", 0),
    # memcpy
    ("memcpy-count>dst_max", lambda c: c.d.memcpy(c.p, 10, c.h, 11), RT, "dst_max", 0),
    ("memcpy-kind-6", lambda c: c.d.memcpy(c.p, 10, c.h, 10, 6), IP, "kinds 0-5", 0),
    ("memcpy-kind-7", lambda c: c.d.memcpy(c.p, 10, c.h, 10, 7), IP, "kinds 0-5", 0),
    ("memcpy-kind-8", lambda c: c.d.memcpy(c.p, 10, c.h, 10, 8), IP, "memcpy kind", 0),
    ("memcpy-kind-neg", lambda c: c.d.memcpy(c.p, 10, c.h, 10, -1), IP, "kind", 0),
    ("memcpy-dst-past-end", lambda c: c.d.memcpy(c.p, 200, c.h, 101), RT, "1 bytes past the end", 0),
    ("memcpy-src-past-end", lambda c: c.d.memcpy(c.h, 256, c.p + 50, 60), RT, "10 bytes past the end", 0),
    (
        "memcpy-past-end-kind",
        lambda c: c.d.memcpy(c.h, 256, c.p, 101, MemcpyKind.HOST_TO_HOST),
        RT,
        "past the end",
        0,
    ),
    ("memcpy-padding", lambda c: c.d.memcpy(c.p + 100, 10, c.h, 1), RT, "padding", 0),
    ("memcpy-uaf-dst", lambda c: c.d.memcpy(c.f, 10, c.h, 10), RT, "use after free", 0),
    ("memcpy-uaf-src", lambda c: c.d.memcpy(c.h, 10, c.f, 10), RT, "use after free", 0),
    ("memcpy-unmapped", lambda c: c.d.memcpy(VA_WINDOW_START + GiB, 10, c.h, 10), RT, "not inside", 0),
    ("memcpy-window-last", lambda c: c.d.memcpy(c.h, 10, VA_WINDOW_END - 1, 1), RT, "not inside", 0),
    ("memcpy-host-past-end", lambda c: c.d.memcpy(c.h + 250, 10, c.p, 10), RT, "past the end", 0),
    ("memcpy-foreign-src", lambda c: c.d.memcpy(c.p, 10, c.foreign, 10), RT, "malloc_host", 0),
    ("memcpy-foreign-dst", lambda c: c.d.memcpy(c.foreign, 10, c.p, 10), RT, "malloc_host", 0),
    ("memcpy-small-int", lambda c: c.d.memcpy(c.p, 10, 4096, 10), RT, "malloc_host", 0),
    ("memcpy-null-dst", lambda c: c.d.memcpy(0, 10, c.p, 10), IP, "NULL", 0),
    ("memcpy-null-src", lambda c: c.d.memcpy(c.p, 10, 0, 10), IP, "NULL", 0),
    ("memcpy-dst-2**64", lambda c: c.d.memcpy(2**64, 10, c.p, 10), IP, "dst", 0),
    ("memcpy-count-neg", lambda c: c.d.memcpy(c.p, 10, c.h, -1), IP, "count", 0),
    # memset
    ("memset-count>dst_max", lambda c: c.d.memset(c.p, 10, 0, 11), RT, "dst_max", 0),
    ("memset-past-end", lambda c: c.d.memset(c.p, 1000, 0, 101), RT, "past the end", 0),
    ("memset-uaf", lambda c: c.d.memset(c.f, 10, 0, 10), RT, "use after free", 0),
    ("memset-null", lambda c: c.d.memset(0, 10, 0, 10), IP, "NULL", 0),
    ("memset-foreign", lambda c: c.d.memset(c.foreign, 10, 0, 10), RT, "malloc_host", 0),
    ("memset-host-past-end", lambda c: c.d.memset(c.h, 300, 0, 257), RT, "past the end", 0),
    # write / read / read_into
    ("write-past-end", lambda c: c.d.write(c.p, bytes(101)), RT, "past the end", 0),
    ("write-padding", lambda c: c.d.write(c.p + 100, b"x"), RT, "padding", 0),
    ("write-uaf", lambda c: c.d.write(c.f, b"x"), RT, "use after free", 0),
    ("write-null", lambda c: c.d.write(0, b"x"), IP, "NULL", 0),
    ("write-foreign", lambda c: c.d.write(c.foreign, b"x"), RT, "malloc_host", 0),
    ("write-noncontig", lambda c: c.d.write(c.p, memoryview(bytes(20))[::2]), IP, "C-contiguous", 0),
    ("read-past-end", lambda c: c.d.read(c.p, 101), RT, "past the end", 0),
    ("read-uaf", lambda c: c.d.read(c.f, 1), RT, "use after free", 0),
    ("read-null", lambda c: c.d.read(0, 1), IP, "NULL", 0),
    ("read-neg-ptr", lambda c: c.d.read(-1, 1), IP, "ptr", 0),
    ("read-neg-count", lambda c: c.d.read(c.p, -1), IP, "count", 0),
    ("read-foreign", lambda c: c.d.read(c.foreign, 1), RT, "malloc_host", 0),
    ("read-into-readonly", lambda c: c.d.read_into(c.p, bytes(10)), IP, "read-only", 0),
    ("read-into-past-end", lambda c: c.d.read_into(c.p, bytearray(101)), RT, "past the end", 0),
    ("read-into-noncontig", lambda c: c.d.read_into(c.p, np.zeros((4, 4), "u1")[:, ::2]), IP, "contiguous", 0),
    ("to-numpy-past-end", lambda c: c.d.to_numpy(c.p, (26,), np.float32), RT, "past the end", 0),
    # translate / walk / mem_info / allocation
    ("translate-null", lambda c: c.d.translate(0), RT, "not a device address", 0),
    ("translate-host", lambda c: c.d.translate(c.h), RT, "not a device address", 0),
    ("translate-window-end", lambda c: c.d.translate(VA_WINDOW_END), RT, "not a device address", 0),
    ("translate-below-window", lambda c: c.d.translate(VA_WINDOW_START - 1), RT, "not a device address", 0),
    ("translate-freed", lambda c: c.d.translate(c.f), RT, "not mapped", 0),
    ("translate-2**64", lambda c: c.d.translate(2**64), IP, "va", 0),
    ("walk-neg", lambda c: c.d.walk(-1), IP, "va", 0),
    ("mem-info-18", lambda c: c.d.mem_info(18), IP, "ACL_HBM_MEM=1", 0),
    ("mem-info-neg", lambda c: c.d.mem_info(-1), IP, "attr", 0),
    ("allocation-neg", lambda c: c.d.allocation(-1), IP, "ptr", 0),
    ("from-numpy-bad-policy", lambda c: c.d.from_numpy(np.arange(4), 9), IP, "policy", 0),
]


@EVERY_BACKEND
@pytest.mark.parametrize(
    ("call", "expected", "match", "failed"),
    [
        pytest.param(
            *c[1:], id=c[0], marks=[pytest.mark.sim_only(SIM_ONLY_CALLS[c[0]])] if c[0] in SIM_ONLY_CALLS else []
        )
        for c in BAD_CALLS
    ],
)
def test_bad_call(call, expected, match, failed):
    c = CallCtx()
    before = snapshot(c.d)
    failed_before = c.d.stats()["failed_mallocs"]
    host_before = ctypes.string_at(c.h, 256)
    cls, code = expected
    with raises_acl(cls, code, match=match):
        call(c)
    assert snapshot(c.d) == before
    if failed is not None:
        assert c.d.stats()["failed_mallocs"] == failed_before + failed
    assert c.d.read(c.p, 100) == bytes(range(100))
    assert ctypes.string_at(c.h, 256) == host_before
    # The device still works.
    q = c.d.malloc(10)
    c.d.write(q, b"0123456789")
    assert c.d.read(q, 10) == b"0123456789"


@EVERY_BACKEND
def test_walk_refusals(npumem_backend):
    """The simulator walks its page table and refuses an unmapped address; the other backends
    keep no page table (the OS or the driver maps the pages), so walk() is refused, naming the
    backend, before it looks at the address. Nothing changes either way."""
    c = CallCtx()
    before = snapshot(c.d)
    if npumem_backend == "sim":
        assert c.d.walk(c.p)[1:] == (4096, 4)
        with raises_acl(*RT, match="not mapped"):
            c.d.walk(c.f)
    else:
        for va in (c.p, c.f):
            with raises_acl(UnsupportedError, 200006, match=f"the {npumem_backend} backend has no page-table walk"):
                c.d.walk(va)
    assert snapshot(c.d) == before
    assert c.d.translate(c.p)[1] > 0  # translate() still answers


@EVERY_BACKEND
@pytest.mark.parametrize(
    "call",
    [
        lambda d: d.malloc(1.5),
        lambda d: d.malloc(None),
        lambda d: d.malloc(100, "HUGE_ONLY"),
        lambda d: d.free("0x1000"),
        lambda d: d.free(None),
        lambda d: d.read(1.0, 1),
        lambda d: d.write(d.malloc(8), "text"),
        lambda d: d.write(d.malloc(8), 12),
        lambda d: d.memcpy(None, 1, 1, 1),
        lambda d: d.mem_info(1.0),
        lambda d: d.translate("16TiB"),
        lambda d: npumem.parse_size(1.5),
    ],
)
def test_wrong_types_raise_type_error(dev, call):
    with pytest.raises(TypeError):
        call(dev)


# --------------------------------------------------------------------------------------------
# Fuzzing: arbitrary ints into every method raise AclError or succeed, and the books balance
# --------------------------------------------------------------------------------------------

FUZZ_CAPACITY = 16 * MiB


@EVERY_BACKEND
@settings(max_examples=60)
@given(data=st.data())
def test_fuzz_never_crashes(data):
    d = Device(FUZZ_CAPACITY, allocator="direct")
    live = [d.malloc(100), d.malloc(3 * MiB, Policy.HUGE_ONLY)]
    hosts = [d.malloc_host(128)]
    freed = d.malloc(5000)
    d.free(freed)

    def address():
        return data.draw(
            st.one_of(
                st.sampled_from([0, 1, 4096, VA_WINDOW_START, VA_WINDOW_END - 1, VA_WINDOW_END, 2**63, 2**64 - 1]),
                st.sampled_from(live + hosts + [freed]).flatmap(
                    lambda base: st.integers(-64, 5000).map(lambda off: base + off)
                ),
                st.integers(-(2**65), 2**65),
            )
        )

    def count(limit: int = 2**66):
        return data.draw(
            st.one_of(
                st.integers(-1, 300),
                st.sampled_from([4096, 2 * MiB, 2**63, 2**64 - 1, 2**64]),
                st.integers(-limit, limit),
            )
        )

    def enum():
        return data.draw(st.one_of(st.integers(-2, 20), st.sampled_from([2**31, 2**32, 2**64])))

    ops = {
        "malloc": lambda: live.append(d.malloc(count(), enum())),
        "malloc_align32": lambda: live.append(d.malloc_align32(count(), enum())),
        "free": lambda: d.free(address()),
        "malloc_host": lambda: hosts.append(d.malloc_host(data.draw(st.integers(-1, 4096)))),
        "free_host": lambda: d.free_host(address()),
        "memcpy": lambda: d.memcpy(address(), count(), address(), count(), enum()),
        "memset": lambda: d.memset(address(), count(), data.draw(st.integers(-(2**31), 2**31 - 1)), count()),
        # read() builds its result before it checks the range (see test_read_count_is_checked_first),
        # so keep the count small here.
        "read": lambda: d.read(address(), data.draw(st.integers(-1, 2 * MiB))),
        "read_into": lambda: d.read_into(address(), bytearray(data.draw(st.integers(0, 300)))),
        "write": lambda: d.write(address(), bytes(data.draw(st.integers(0, 300)))),
        "translate": lambda: d.translate(address()),
        "walk": lambda: d.walk(address()),
        "mem_info": lambda: d.mem_info(enum()),
        "allocation": lambda: d.allocation(address()),
    }
    for _ in range(data.draw(st.integers(1, 25))):
        name = data.draw(st.sampled_from(sorted(ops)))
        try:
            ops[name]()
        except AclError as e:
            assert e.code in CODE_NAMES and e.name == CODE_NAMES[e.code] and e.message
            assert e.code != 507899, f"{name}: internal error {e}"

    # The books balance: what the device reports matches what it says is live.
    allocs = d.allocations()
    granted = sum(a["granted"] for a in allocs)
    s = d.stats()
    assert s["live_count"] == len(allocs)
    assert s["live_granted"] == granted
    assert d.mem_info() == (FUZZ_CAPACITY - granted, FUZZ_CAPACITY)
    sim = d.backend == "sim"
    if sim:
        assert d.page_table_stats()["mapped_bytes"] == granted
    for a, b in itertools.pairwise(allocs):
        assert a["ptr"] + a["granted"] <= b["ptr"]
    for a in allocs:
        d.free(a["ptr"])
    assert d.mem_info() == (FUZZ_CAPACITY, FUZZ_CAPACITY)
    if sim:
        assert d.page_table_stats()["mapped_bytes"] == 0
        assert d.frame_stats() == Device(FUZZ_CAPACITY, allocator="direct").frame_stats()


# --------------------------------------------------------------------------------------------
# Values checked before any work, and inputs that once crashed (each in its own process)
# --------------------------------------------------------------------------------------------


@EVERY_BACKEND
@pytest.mark.parametrize("count", [2**63, 2**64 - 1])
def test_read_count_is_checked_first(dev, count):
    p = dev.malloc(100)
    with raises_acl(InvalidParamError, 107000, match="past the end"):
        dev.read(p, count)


@EVERY_BACKEND
@pytest.mark.parametrize("value", [-1, 2**64])
def test_format_size_out_of_range(value):
    with raises_acl(InvalidParamError, 100000):
        npumem.format_size(value)


def run_isolated(code: str, *, memory_limit: int | None = None, timeout: float = 30) -> subprocess.CompletedProcess:
    """Runs ``code`` in a fresh interpreter (a crash there cannot take the test run down)."""

    def limit():  # pragma: no cover - runs in the child
        if memory_limit is not None:
            import resource

            resource.setrlimit(resource.RLIMIT_AS, (memory_limit, memory_limit))

    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
        preexec_fn=limit,
        env={**os.environ, "OPENBLAS_NUM_THREADS": "1"},
    )


@EVERY_BACKEND
def test_isolated_runner_reports_success():
    r = run_isolated("import npumem; print(npumem.Device('16MiB', allocator='direct').mem_info())")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str((16 * MiB, 16 * MiB))


@EVERY_BACKEND
@pytest.mark.parametrize(
    "call",
    ["d.to_numpy(p, (4,), object)", "d.read_into(p, np.empty(4, dtype=object))"],
    ids=["to_numpy", "read_into"],
)
def test_object_arrays_are_refused(call):
    r = run_isolated(
        f"""
        import numpy as np, npumem
        d = npumem.Device("16MiB", allocator="direct")
        p = d.malloc(64)
        d.write(p, bytes(range(1, 65)))
        try:
            out = {call}
            print(repr(out))
        except (npumem.AclError, TypeError) as e:
            print("refused:", type(e).__name__)
        """
    )
    assert r.returncode == 0, f"crashed with {r.returncode}: {r.stderr[-500:]}"
    assert r.stdout.startswith("refused:")


@EVERY_BACKEND
def test_absurd_capacity_is_refused():
    r = run_isolated(
        """
        import npumem
        try:
            npumem.Device(2**64 - 1, allocator="direct")
            print("accepted")
        except npumem.InvalidParamError as e:
            print("refused", e.code)
        """,
        memory_limit=512 * MiB,
    )
    assert r.returncode == 0, f"crashed with {r.returncode}: {r.stderr[-300:]}"
    assert r.stdout.strip() == "refused 100000"


# --------------------------------------------------------------------------------------------
# Inputs that abort the process today: each in its own process, under a memory limit
# --------------------------------------------------------------------------------------------

ABORTING = {
    "walk_cache_entries-2**40": "Tlb.preset('zen4', d, walk_cache_entries=[2**40, 1, 1])",
    "entries-2**40": "Tlb.preset('skylake', d, **{'0.0.entries': 2**40})",
}


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))


@pytest.mark.parametrize("name", sorted(ABORTING))
def test_tlb_sizes_that_aborted_are_refused(name):
    code = textwrap.dedent(
        f"""
        import npumem
        from npumem.tlb import Tlb
        d = npumem.Device("64MiB")
        try:
            {ABORTING[name]}
        except npumem.InvalidParamError as e:
            print("InvalidParamError", e)
        """
    )
    r = subprocess.run(
        [sys.executable, "-c", code], preexec_fn=_limit_memory, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr[-500:]
    assert "InvalidParamError" in r.stdout and "entries" in r.stdout


ACL_HOST_POINTERS = """
import ctypes, mmap
from npumem import acl
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long)
flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
none = libc.mmap(None, 8192, 0, flags, -1, 0)  # PROT_NONE
ro = libc.mmap(None, 8192, mmap.PROT_READ, flags, -1, 0)
ok = ctypes.create_string_buffer(8192)
src = ctypes.addressof(ok)
acl.init()
print("memcpy-to-none", acl.rt.memcpy(none, 4096, src, 4096, 0))
print("memcpy-from-none", acl.rt.memcpy(src, 4096, none, 4096, 0))
print("memcpy-to-readonly", acl.rt.memcpy(ro, 4096, src, 4096, 0))
print("memcpy-from-readonly", acl.rt.memcpy(src, 4096, ro, 4096, 0))
print("memset-none", acl.rt.memset(none, 4096, 1, 4096))
print("memset-readonly", acl.rt.memset(ro, 4096, 1, 4096))
print("memcpy2d-to-readonly", acl.rt.memcpy2d(ro, 64, src, 64, 64, 4, 1))
for fn in (lambda: acl.util.ptr_to_bytes(none, 16), lambda: acl.util.ptr_to_numpy(none, (4,), 2)):
    try:
        fn()
    except ValueError as e:
        print("util", "PROT_NONE" in str(e))
view = acl.util.ptr_to_numpy(ro, (4,), 2)
print("readonly-view", view.flags.writeable, acl.util.ptr_to_bytes(ro, 4))
"""


def test_acl_host_pointers_without_access_are_error_codes_not_faults():
    r = subprocess.run([sys.executable, "-c", ACL_HOST_POINTERS], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-800:]
    lines = dict(line.split(" ", 1) for line in r.stdout.splitlines())
    for key in ("memcpy-to-none", "memcpy-from-none", "memcpy-to-readonly", "memset-none", "memset-readonly"):
        assert lines[key] == "107000", (key, r.stdout)
    assert lines["memcpy2d-to-readonly"] == "107000"
    assert lines["memcpy-from-readonly"] == "0"  # reading read-only memory is fine
    assert r.stdout.count("util True") == 2
    assert lines["readonly-view"] == "False b'\\x00\\x00\\x00\\x00'"


# --------------------------------------------------------------------------------------------
# The command line: exit status, one line, no traceback
# --------------------------------------------------------------------------------------------

GRAPH_JSON_AB = json.dumps(graph_doc(inputs="ab"))

CLI_CASES = [
    ("plan-missing-file", ["plan", "{tmp}/missing.csv"], 2, "missing.csv"),
    ("plan-strategy", ["plan", C_CSV, "--strategy", "magic"], 2, "--strategy 'magic'"),
    ("plan-capacity-text", ["plan", C_CSV, "--capacity", "abc"], 2, '"abc"'),
    ("plan-capacity-negative", ["plan", C_CSV, "--capacity", "-5"], 2, "--capacity"),
    ("plan-time-limit-nan", ["plan", C_CSV, "--time-limit", "nan"], 2, "--time-limit"),
    ("plan-time-limit-text", ["plan", C_CSV, "--time-limit", "soon"], 2, "--time-limit"),
    ("plan-work-limit-negative", ["plan", C_CSV, "--work-limit", "-3"], 2, "--work-limit"),
    ("plan-work-limit-text", ["plan", C_CSV, "--work-limit", "lots"], 2, "--work-limit"),
    ("plan-alignment-3", ["plan", C_CSV, "--alignment", "3"], 2, "alignment 3"),
    ("plan-mem-limit-on-csv", ["plan", C_CSV, "--mem-limit", "1GiB"], 2, "--mem-limit"),
    ("plan-capacity-on-graph", ["plan", "{tmp}/g.json", "--capacity", "1GiB"], 2, "--capacity"),
    ("plan-out-folder-missing", ["plan", C_CSV, "--out", "/nonexistent/x.csv"], 2, "/nonexistent"),
    ("plan-plot-is-folder", ["plan", C_CSV, "--plot", "{tmp}"], 2, "directory"),
    ("plan-not-a-csv", ["plan", "/etc/hostname"], 2, "id,lower,upper,size"),
    ("plan-binary-file", ["plan", "{tmp}/bin.csv"], 2, "not a MiniMalloc CSV"),
    ("plan-bad-json", ["plan", "{tmp}/bad.json"], 2, "not valid JSON"),
    ("plan-graph-inputs-str", ["plan", "{tmp}/g.json"], 2, "'ab'"),
    ("tlb-preset", ["tlb", "sweep", "--presets", "nope"], 2, "'nope'"),
    ("tlb-page", ["tlb", "sweep", "--pages", "8KiB"], 2, "'8KiB'"),
    ("tlb-footprint-0", ["tlb", "sweep", "--footprints", "0"], 2, "--footprints"),
    ("tlb-accesses-0", ["tlb", "sweep", "--accesses", "0"], 2, "accesses"),
    ("tlb-csv-folder", ["tlb", "sweep", "--csv", "/nonexistent/t.csv"], 2, "/nonexistent"),
    ("demo-capacity-small", ["demo", "--capacity", "1KiB"], 2, "--capacity"),
    ("demo-capacity-text", ["demo", "--capacity", "lots"], 2, '"lots"'),
    ("demo-seed-text", ["demo", "--seed", "x"], 2, "--seed"),
    ("unknown-command", ["bogus"], 2, "bogus"),
    ("no-command", [], 2, "required"),
]


@pytest.mark.parametrize(("argv", "status", "word"), [c[1:] for c in CLI_CASES], ids=[c[0] for c in CLI_CASES])
def test_cli_bad_input(tmp_path, capsys, argv, status, word):
    (tmp_path / "bin.csv").write_bytes(b"id,lower,upper,size\n\xff\xfe\x00\x81")
    (tmp_path / "bad.json").write_text('{"a":')
    (tmp_path / "g.json").write_text(GRAPH_JSON_AB)
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    assert cli.main(argv) == status
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    assert word in err
    # One line (argparse prints its usage above it).
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith(("usage:", " "))]
    assert len(lines) == 1, err


SWEEP_TLB = "[tlb]\npresets = ['zen4']\npages = ['4KiB']\npatterns = ['uniform']\nfootprints = ['1MiB']\n"
SWEEP_ALLOC = "[alloc]\nallocators = ['npumem']\n[alloc.workloads.w]\ngenerator = 'random_churn'\n"

#: (id, files to write {name: content}, argv, word in the one line); every case exits 2.
CLI_HOSTILE = [
    ("replay-deep-pickle", {"deep.pickle": deep_tuple_key_pickle()}, ["replay", "{tmp}/deep.pickle"], "nested"),
    ("replay-dag-pickle", {"dag.pickle": shared_tuple_key_pickle()}, ["replay", "{tmp}/dag.pickle"], "dict key"),
    (
        "replay-rmm-5000-digits",
        {"t.csv": RMM_HEAD + "1,0,allocate,0x1," + "9" * 5000 + ",0\n"},
        ["replay", "{tmp}/t.csv"],
        "Size",
    ),
    ("replay-dev-zero", {}, ["replay", "/dev/zero"], "not a trace"),
    ("plan-dev-zero", {}, ["plan", "/dev/zero"], "longer than"),
    ("sweep-dev-zero", {}, ["sweep", "/dev/zero"], "larger than"),
    ("sweep-binary", {"c.toml": b"\xff\xfe[tlb]"}, ["sweep", "{tmp}/c.toml"], "UTF-8"),
    ("sweep-accesses-text", {"c.toml": SWEEP_TLB + "accesses = 'many'\n"}, ["sweep", "{tmp}/c.toml"], "tlb.accesses"),
    ("sweep-tlb-int", {"c.toml": "tlb = 5\n"}, ["sweep", "{tmp}/c.toml"], "[tlb]"),
    (
        "sweep-alloc_conf-int",
        {"c.toml": SWEEP_ALLOC.replace("]\n[", "]\nalloc_conf = [1]\n[", 1)},
        ["sweep", "{tmp}/c.toml"],
        "alloc_conf[0]",
    ),
    (
        "sweep-timeline-text",
        {"c.toml": SWEEP_ALLOC.replace("]\n[", "]\ntimeline = 'yes'\n[", 1)},
        ["sweep", "{tmp}/c.toml"],
        "alloc.timeline",
    ),
    (
        "sweep-past-the-budget",
        {"c.toml": SWEEP_TLB + f"accesses = {2**28}\nseeds = {list(range(1000))}\n"},
        ["sweep", "{tmp}/c.toml"],
        "--yes",
    ),
    (
        "sweep-grid-too-large",
        {
            "c.toml": SWEEP_TLB.replace("['1MiB']", str([4096 * (i + 1) for i in range(1000)]))
            + f"seeds = {list(range(1001))}\n"
        },
        ["sweep", "{tmp}/c.toml"],
        "1,001,000 cells",
    ),
    ("report-manifest-types", {"r/sweep.json": '{"seconds": "soon"}'}, ["report", "{tmp}/r"], "seconds"),
    ("report-manifest-failed", {"r/sweep.json": '{"failed": [1]}'}, ["report", "{tmp}/r"], "failed"),
    ("report-manifest-list", {"r/sweep.json": "[1, 2]"}, ["report", "{tmp}/r"], "sweep manifest"),
    (
        "report-parquet-null",
        {"r/sweep.json": "{}", "r/alloc.parquet": "nulls"},
        ["report", "{tmp}/r"],
        "row 0: capacity",
    ),
    ("report-parquet-text", {"r/sweep.json": "{}", "r/alloc.parquet": "text"}, ["report", "{tmp}/r"], "not an int"),
]


def _alloc_table(path: str, kind: str) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    row = {"workload": "w", "allocator": "npumem", "alloc_conf": "", "capacity_spec": "min", "peak_live": 8}
    row |= {"capacity": None if kind == "nulls" else "8", "capacity_vs_live": 1.0}
    pq.write_table(pa.Table.from_pylist([row]), path)


@pytest.mark.parametrize(("files", "argv", "word"), [c[1:] for c in CLI_HOSTILE], ids=[c[0] for c in CLI_HOSTILE])
def test_cli_hostile_input(tmp_path, capsys, files, argv, word):
    for name, content in files.items():
        path = tmp_path / name
        path.parent.mkdir(exist_ok=True)
        if name.endswith(".parquet"):
            _alloc_table(str(path), content)
        else:
            path.write_bytes(content if isinstance(content, bytes) else content.encode())
    out = tmp_path / "out"
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv] + ["--out", str(out)] * (argv[0] != "replay")
    if argv[0] == "sweep":
        argv += ["--workers", "0"]
    assert cli.main(argv) == 2
    got, err = capsys.readouterr()
    assert "Traceback" not in got + err and "internal error" not in err
    assert err.count("\n") == 1 and word in err, err
    assert not out.exists()  # nothing half-written


def test_cli_sweep_past_the_budget_runs_with_yes(monkeypatch, tmp_path, capsys):
    from npumem import sweep

    monkeypatch.setattr(sweep, "WORK_BUDGET", 1000)
    (tmp_path / "c.toml").write_text(SWEEP_TLB + "accesses = 2000\n")
    argv = ["sweep", str(tmp_path / "c.toml"), "--out", str(tmp_path / "o"), "--workers", "0", "--quiet"]
    assert cli.main(argv) == 2 and "about 2,000 units of work" in capsys.readouterr().err
    assert cli.main([*argv, "--yes"]) == 0 and (tmp_path / "o" / "tlb.csv").exists()


@pytest.mark.parametrize("capacity", ["1", "2TiB"])
def test_run_with_a_host_capacity_out_of_range_is_one_line_exit_2(tmp_path, capacity):
    script = tmp_path / "s.py"
    script.write_text("import acl\nprint(acl.rt.set_device(0))\n")
    env = os.environ | {"NPUMEM_BACKEND": "host", "NPUMEM_CAPACITY": capacity}
    r = subprocess.run(
        [sys.executable, "-m", "npumem.run", str(script)], capture_output=True, text=True, env=env, timeout=120
    )
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.count("\n") == 1 and "NPUMEM_CAPACITY" in r.stderr and "64 KiB to 1 TiB" in r.stderr


def run_cli(*argv: str, block_matplotlib: bool = False, cwd: str | None = None) -> subprocess.CompletedProcess:
    """``python -m npumem ...`` in a subprocess (optionally as if matplotlib were not installed)."""
    prelude = "import sys; sys.modules['matplotlib'] = None; " if block_matplotlib else ""
    code = (
        prelude
        + "import runpy, sys; sys.argv = ['npumem', *sys.argv[1:]]; runpy.run_module('npumem', run_name='__main__')"
    )
    return subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=300, cwd=cwd)


def test_cli_version_and_python_dash_m():
    r = subprocess.run([sys.executable, "-m", "npumem", "--version"], capture_output=True, text=True, timeout=60)
    assert (r.returncode, r.stdout.strip()) == (0, f"npumem {npumem.__version__}")
    r = subprocess.run([sys.executable, "-m", "npumem", "plan"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "Traceback" not in r.stderr and "file" in r.stderr


def test_cli_plot_without_matplotlib_writes_everything_else(tmp_path):
    out, png = tmp_path / "plan.csv", tmp_path / "p.png"
    r = run_cli("plan", C_CSV, "--work-limit", "100000", "--out", str(out), "--plot", str(png), block_matplotlib=True)
    assert r.returncode == 3, r.stderr
    assert "Traceback" not in r.stderr and "pip install 'npumem[plot]'" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert out.exists() and not png.exists() and "exact: optimal" in r.stdout
    assert plan.Problem.from_csv(out).validate(plan.Problem.from_csv(out).offsets) == 1_039_360
    # The default plot of tlb sweep is skipped with the hint; the CSV is written, status 0.
    r = run_cli(
        "tlb", "sweep", "--presets", "zen4", "--pages", "4KiB", "--patterns", "sequential", "--footprints", "4MiB",
        "--accesses", "1000", block_matplotlib=True, cwd=str(tmp_path),
    )  # fmt: skip
    assert r.returncode == 0 and "Traceback" not in r.stderr and "matplotlib" in r.stderr
    assert (tmp_path / "tlb_sweep.csv").exists() and not (tmp_path / "tlb_sweep.png").exists()
    # Asked for explicitly, the missing plot is status 3.
    r = run_cli(
        "tlb", "sweep", "--presets", "zen4", "--pages", "4KiB", "--patterns", "sequential", "--footprints", "4MiB",
        "--accesses", "1000", "--plot", str(tmp_path / "t.png"), block_matplotlib=True, cwd=str(tmp_path),
    )  # fmt: skip
    assert r.returncode == 3 and "Traceback" not in r.stderr


def test_cli_capacity_below_the_bound_is_called_impossible(capsys):
    assert cli.main(["plan", C_CSV, "--capacity", "1039000", "--work-limit", "100000"]) == 1
    out = capsys.readouterr().out
    assert "impossible: 1,039,360 B are live at once (the lower bound)" in out
    assert "best plan found 1,039,360 B (360 B over, optimal)" in out and "303,464" not in out
    assert cli.main(["plan", C_CSV, "--capacity", "1039360", "--work-limit", "100000"]) == 0


def test_cli_internal_error_is_status_4_without_traceback(monkeypatch, capsys):
    def broken(*args, **kwargs):
        raise RuntimeError("simulated bug")

    monkeypatch.setattr(plan.Problem, "solve", broken)
    monkeypatch.delenv("NPUMEM_DEBUG", raising=False)
    assert cli.main(["plan", C_CSV]) == 4
    err = capsys.readouterr().err
    assert "internal error (RuntimeError: simulated bug)" in err and "Traceback" not in err
    monkeypatch.setenv("NPUMEM_DEBUG", "1")
    assert cli.main(["plan", C_CSV]) == 4
    assert "Traceback" in capsys.readouterr().err


def test_submodules_come_with_import_npumem():
    code = "import npumem; print(npumem.plan.Problem, npumem.tlb.Tlb, npumem.replay.replay, npumem.formats.load)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert isinstance(npumem.formats, types.ModuleType) and "hostpool" in dir(npumem)
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        npumem.nope  # noqa: B018
