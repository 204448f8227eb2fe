"""Every trace writer's output is read back equal by its reader, for traces drawn by hypothesis
with ids, sizes, streams and threads anywhere from 0 (1 for sizes) to 2**64-1.

- npz (``write_npz`` / ``read_npz``): the columns exactly, ids as they are, and the failed
  allocations;
- RMM CSV (``write_rmm_csv`` / ``read_rmm_csv``) and torch.profiler JSON
  (``write_profiler_trace`` / ``load``): the events exactly, each allocation numbered in order
  (the text formats name blocks by address, and the readers number them), and the RMM log's
  streams and threads. Neither format records failed allocations of a trace.
"""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from npumem import formats

U64 = 2**64 - 1


@st.composite
def traces(draw) -> formats.Trace:
    """Allocations of distinct live ids (any u64), each freed at a drawn later point or left live."""
    n = draw(st.integers(0, 24))
    ids = draw(st.lists(st.integers(0, U64), min_size=n, max_size=n, unique=True))
    reuse = draw(st.booleans()) and n > 1  # an id allocated again after its free
    sizes = draw(st.lists(st.integers(1, U64), min_size=n, max_size=n))
    events: list[tuple[int, int, int]] = []
    live: list[tuple[int, int]] = []
    for i, size in zip(ids, sizes, strict=True):
        events.append((1, i, size))
        live.append((i, size))
        while live and draw(st.booleans()):
            k = draw(st.integers(0, len(live) - 1))
            j, s = live.pop(k)
            events.append((0, j, s))
    if reuse and not live:
        events += [(1, ids[0], 7), (0, ids[0], 7)]
    m = len(events)
    streams = draw(st.none() | st.lists(st.integers(0, U64), min_size=m, max_size=m))
    threads = draw(st.none() | st.lists(st.integers(0, U64), min_size=m, max_size=m))
    return formats.Trace(
        np.array([e[0] for e in events], np.uint8),
        np.array([e[1] for e in events], np.uint64),
        np.array([e[2] for e in events], np.uint64),
        None if streams is None else np.array(streams, np.uint64),
        None if threads is None else np.array(threads, np.uint64),
        failed_allocs=draw(st.integers(0, U64)),
    )


def per_alloc(events: list[tuple[str, int, int]]) -> list[tuple[str, int, int]]:
    """The events with each allocation numbered in order (its free takes its number): how the
    text readers name blocks, by address, an address reused after a free being a new block."""
    count, live, out = 0, {}, []
    for a, i, s in events:
        if a == "alloc":
            live[i], count = count, count + 1
        out.append((a, live.pop(i) if a == "free" else live[i], s))
    return out


SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@SETTINGS
@given(traces(), st.booleans())
def test_npz_reads_back_every_column(tmp_path, trace, compress):
    path = tmp_path / "t.npz"
    formats.write_npz(trace, path, compress=compress)
    back = formats.read_npz(path)
    for name in ("is_alloc", "ids", "sizes", "streams", "threads"):
        ours, theirs = getattr(trace, name), getattr(back, name)
        assert (ours is None) == (theirs is None), name
        if ours is not None:
            assert theirs.dtype == np.uint64 or name == "is_alloc"
            assert ours.tolist() == theirs.tolist(), name
    assert back.failed_allocs == trace.failed_allocs
    assert formats.load(path).events() == trace.events()


@SETTINGS
@given(traces())
def test_rmm_csv_reads_back_the_events_streams_and_threads(tmp_path, trace):
    path = tmp_path / "t.csv"
    assert formats.write_rmm_csv(trace, path) == len(trace)
    back = formats.read_rmm_csv(path)
    assert per_alloc(back.events()) == per_alloc(trace.events())
    zeros = [0] * len(trace)
    assert back.streams.tolist() == (zeros if trace.streams is None else trace.streams.tolist())
    assert back.threads.tolist() == (zeros if trace.threads is None else trace.threads.tolist())
    assert formats.detect(path) == "rmm-csv"


@SETTINGS
@given(traces())
def test_profiler_trace_reads_back_the_events(tmp_path, trace):
    path = tmp_path / "t.json.gz"
    formats.write_profiler_trace(trace, path)
    if not len(trace):
        return  # a trace without events has no [memory] events to read (refused, by design)
    assert per_alloc(formats.load(path).events()) == per_alloc(trace.events())
