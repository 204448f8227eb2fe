"""Fuzzes npumem's Python file readers with atheris: ``npumem.plan.Problem.from_csv`` (MiniMalloc
CSV) and ``npumem.graph.Graph.load`` (graph JSON, plain or gzip-compressed).

The first byte of an input picks the reader and the file kind; the rest is the file. Checked:
a reader either returns or raises one of npumem's documented errors (an ``npumem.AclError``
other than ``InternalError``, which means a bug, or a ``TypeError`` / ``ValueError``) — never
anything else (``KeyError``, ``IndexError``, ``RecursionError``, ``OverflowError``, ...); and what
a reader accepts is what the file says and is usable: a problem plans with every plan
validating; a graph is the document it was read from (its ``to_dict`` equals the file's
``format``, ``alignment``, ``tensors`` and ``ops``: nothing coerced), survives a ``to_dict`` /
``from_dict`` round trip, and plans — or the planner refuses it with an ``AclError`` that says
why (never a ``TypeError`` or other exception from deep inside).

Run: ``python fuzz/readers.py [corpus dirs] [libFuzzer flags]`` (``make fuzz`` does, with atheris
from fuzz/requirements.txt). ``check`` is also what tests/test_fuzz_readers.py replays, for every
input kept under fuzz/regressions/readers, without atheris.
"""

from __future__ import annotations

import atexit
import gzip
import importlib
import json
import os
import shutil
import sys
import tempfile

KINDS = (".csv", ".json", ".json.gz")
MAX_BODY = 1 << 16
_DIR = tempfile.mkdtemp(prefix="npumem-readers-")
atexit.register(shutil.rmtree, _DIR, True)


def _write(kind: str, body: bytes) -> str:
    path = os.path.join(_DIR, "input" + kind)
    with open(path, "wb") as f:
        f.write(gzip.compress(body, mtime=0) if kind.endswith(".gz") else body)
    return path


def check(data: bytes) -> None:
    """Runs one input; raises (AssertionError or the escaped exception) on a finding."""
    from npumem.errors import AclError, InternalError
    from npumem.graph import Graph
    from npumem.plan import Problem

    if not data:
        return
    kind = KINDS[data[0] % len(KINDS)]
    path = _write(kind, data[1 : 1 + MAX_BODY])
    try:
        if kind == ".csv":
            loaded = Problem.from_csv(path, alignment=1 << (data[0] // 3 % 10))
        else:
            loaded = Graph.load(path)
    except InternalError:
        raise
    except (AclError, TypeError, ValueError):
        return
    if isinstance(loaded, Problem):
        for strategy in ("naive", "npumem"):
            plan = loaded.solve(strategy, time_limit=0)
            assert loaded.validate(plan.offsets) == plan.peak, f"{strategy}: the plan does not validate"
    else:
        d = loaded.to_dict()
        doc = json.loads(gzip.decompress(open(path, "rb").read()) if kind.endswith(".gz") else open(path, "rb").read())
        for key in ("format", "alignment", "tensors", "ops"):
            assert doc[key] == d[key], f"{key}: read {doc[key]!r} as {d[key]!r}"
        again = Graph.from_dict(json.loads(json.dumps(d))).to_dict()
        assert again == d, f"the graph changed in a to_dict/from_dict round trip: {d!r} -> {again!r}"
        try:
            # Unlimited, then under a limit that calls for moves (which price transfers and
            # recomputes from the ops' durations).
            plan = loaded.plan(time_limit=0)
            loaded.plan(time_limit=0, mem_limit=plan.peak_memory // 2)
        except InternalError:
            raise
        except AclError:
            pass


def main() -> None:
    import atheris

    # Imported first under instrumentation, for coverage feedback from npumem's own code.
    with atheris.instrument_imports(include=["npumem"]):
        for module in ("npumem.graph", "npumem.plan"):
            importlib.import_module(module)

    atheris.Setup(sys.argv, check)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
