"""Fuzzes npumem's trace readers with atheris: every reader of ``npumem.formats`` (RMM CSV, npz,
PyTorch snapshot pickles through the restricted unpickler, torch.profiler JSON, compact JSON plain
and gzip-compressed) and ``formats.load``, which tells them apart.

The first byte of an input picks the reader (and the file's name); the rest is the file. Checked:
a reader either returns a :class:`npumem.formats.Trace` or raises one of npumem's documented
errors (an ``npumem.AclError`` other than ``InternalError``, a ``TypeError`` or ``ValueError``) —
never anything else (``KeyError``, ``IndexError``, ``RecursionError``, ``OverflowError``,
``MemoryError``, a crash or a hang); the snapshot unpickler refuses or loads plain data only; and
what a reader accepts round-trips: every writer's output (npz, RMM CSV, torch.profiler JSON) reads
back as the same events (each allocation numbered in order, as the text readers number them).

Run: ``python fuzz/trace_readers.py [corpus dirs] [libFuzzer flags]`` (``make fuzz`` does, with
atheris from fuzz/requirements.txt). ``check`` is also what tests/test_fuzz_readers.py replays, for
every input kept under fuzz/regressions/trace_readers, without atheris.
"""

from __future__ import annotations

import atexit
import gzip
import importlib
import os
import shutil
import sys
import tempfile

KINDS = ("rmm.csv", "trace.npz", "snap.pickle", "prof.json", "compact.json", "compact.json.gz", "any", "unpickle")
MAX_BODY = 1 << 16
_DIR = tempfile.mkdtemp(prefix="npumem-trace-readers-")
atexit.register(shutil.rmtree, _DIR, True)


def _write(name: str, body: bytes) -> str:
    path = os.path.join(_DIR, name)
    with open(path, "wb") as f:
        f.write(gzip.compress(body, mtime=0) if name.endswith(".gz") else body)
    return path


def _per_alloc(trace) -> list[tuple[str, int, int]]:
    """The events with each allocation numbered in order (its free takes its number), as the
    text readers number blocks."""
    count, live, out = 0, {}, []
    for a, i, s in trace.events():
        if a == "alloc":
            live[i], count = count, count + 1
        out.append((a, live.pop(i) if a == "free" else live[i], s))
    return out


def check(data: bytes) -> None:
    """Runs one input; raises (AssertionError or the escaped exception) on a finding."""
    from npumem import _files, formats
    from npumem.errors import AclError, InternalError

    if not data:
        return
    kind = KINDS[data[0] % len(KINDS)]
    path = _write("input." + ("bin" if kind in ("any", "unpickle") else kind), data[1 : 1 + MAX_BODY])
    readers = {
        "rmm.csv": formats.read_rmm_csv,
        "trace.npz": formats.read_npz,
        "snap.pickle": formats.load,
        "prof.json": lambda p: formats.Trace.from_events(formats._profiler_events(p)),
        "compact.json": lambda p: formats.Trace.from_events(formats._compact_events(p)),
        "compact.json.gz": lambda p: formats.Trace.from_events(formats._compact_events(p)),
        "any": formats.load,
        "unpickle": _files.read_snapshot,
    }
    try:
        loaded = readers[kind](path)
    except InternalError:
        raise
    except (AclError, TypeError, ValueError):
        return
    if kind == "unpickle":
        _plain(loaded)
        return
    assert isinstance(loaded, formats.Trace), f"{kind} returned {type(loaded).__name__}"
    events = _per_alloc(loaded)
    back = os.path.join(_DIR, "back")
    formats.write_npz(loaded, back + ".npz")
    again = formats.read_npz(back + ".npz")
    assert again.events() == loaded.events(), "npz round trip changed the events"
    assert again.failed_allocs == loaded.failed_allocs
    formats.write_rmm_csv(loaded, back + ".csv")
    assert _per_alloc(formats.read_rmm_csv(back + ".csv")) == events, "RMM CSV round trip changed the events"
    if len(loaded):  # a trace without events has no [memory] events to read back
        formats.write_profiler_trace(loaded, back + ".json")
        assert _per_alloc(formats.load(back + ".json")) == events, "profiler round trip changed the events"


_PLAIN = (dict, list, tuple, set, frozenset, str, bytes, bytearray, int, float, bool, type(None))


def _plain(value) -> None:
    """Everything the unpickler built is plain data (walked without recursion)."""
    todo, seen = [value], set()
    while todo:
        v = todo.pop()
        assert type(v) in _PLAIN, f"the unpickler built a {type(v).__name__}"
        if id(v) in seen or not isinstance(v, (dict, list, tuple, set, frozenset)):
            continue
        seen.add(id(v))
        todo.extend(v.values() if isinstance(v, dict) else v)
        if isinstance(v, dict):
            todo.extend(v)


def main() -> None:
    import atheris

    # Imported first under instrumentation, for coverage feedback from npumem's own code.
    with atheris.instrument_imports(include=["npumem"]):
        for module in ("npumem.formats", "npumem._files", "npumem._snapshot_pickle"):
            importlib.import_module(module)

    atheris.Setup(sys.argv, check)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
