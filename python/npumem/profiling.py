"""A memory profiler for a :class:`~npumem.Device`: per function and per named block, the calls,
the peak and the total bytes allocated (as RMM's ``rmm.statistics.profiler`` reports them), an
ALLOC/FREE log with call sites, and a leak finder.

``with npumem.profiler(dev) as prof:`` records every ``malloc``, ``malloc_align32``,
``malloc_many``, ``free`` and ``free_many`` made on ``dev`` (and what goes through them:
``from_numpy``) until the block ends; ``@npumem.profile`` (or ``@npumem.profile(name=...)``)
marks a function and ``with npumem.profile("name"):`` a block as a record of every active
profiler. A record's *total* is the bytes allocated while it was running (nested records'
included), its *peak* the most bytes it held at once counted from its entry (the largest
over its calls), its *calls* how many times it ran. The *call site* of an allocation is the
first frame outside the npumem package. ``prof.leaks()`` groups the allocations never freed by
call site; ``prof.table()``, ``prof.to_csv()``, ``prof.to_json()`` and ``prof.log_csv()`` give the
results. Invariants: the device is unwrapped when the ``with`` block ends, even on an error; a
call that raises records nothing; the profiler's counts are of requested bytes.
"""

from __future__ import annotations

import csv
import functools
import io
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from types import CodeType, FrameType
from typing import Any, TypeVar

from . import _args, _files

F = TypeVar("F", bound=Callable[..., Any])

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
#: Profilers inside their ``with`` block, innermost last.
_ACTIVE: list[Profiler] = []
_ACTIVE_LOCK = threading.Lock()

#: The name of allocations made outside any record.
TOP = "<top>"


@dataclass
class Record:
    """One function or named block: how often it ran and what it allocated."""

    name: str
    calls: int = 0
    allocs: int = 0
    frees: int = 0
    total_bytes: int = 0
    peak_bytes: int = 0


@dataclass
class LogEntry:
    """One ALLOC or FREE: relative time (s), pointer, requested bytes, call site, record."""

    op: str
    time: float
    ptr: int
    size: int
    site: str
    record: str


@dataclass
class Leak:
    """Allocations from one call site (within one record) that were never freed."""

    site: str
    record: str
    count: int
    bytes: int
    ptrs: list[int] = field(default_factory=list)


@dataclass
class _Scope:
    name: str
    current: int = 0
    peak: int = 0
    total: int = 0


#: Whether a code object is npumem's own (cached: the path test is the costly part of a site).
_OURS: dict[CodeType, bool] = {}


def _call_site() -> str:
    """``file:line (function)`` of the innermost frame outside the npumem package."""
    f: FrameType | None = sys._getframe(2)
    while f is not None:
        code = f.f_code
        ours = _OURS.get(code)
        if ours is None:
            ours = _OURS[code] = os.path.dirname(os.path.abspath(code.co_filename)) == _PACKAGE_DIR
        if not ours:
            return f"{code.co_filename}:{f.f_lineno} ({getattr(code, 'co_qualname', code.co_name)})"
        f = f.f_back
    return "<unknown>"


class Profiler:
    """Records the allocations made on ``device`` inside its ``with`` block (see the module doc).
    ``call_sites=False`` skips the frame walk (cheaper; sites then read ``<off>``)."""

    def __init__(self, device: Any, *, call_sites: bool = True) -> None:
        from .device import Device

        if not isinstance(device, Device):
            raise _args.type_error("device", device, "an npumem.Device")
        self.device = device
        self.call_sites = _args.flag(call_sites, "call_sites")
        self.records: dict[str, Record] = {}
        self._log: list[tuple[str, float, int, int, str, str]] = []  # LogEntry fields, made on demand
        self._live: dict[int, tuple[int, str, str]] = {}  # ptr -> (size, site, record)
        self._scopes = threading.local()
        self._lock = threading.Lock()
        self._t0 = 0.0
        self._wrapped: list[tuple[str, Any]] = []  # (method, what the instance had before)
        self._top = _Scope(TOP)

    # -- the with block ----------------------------------------------------------------------

    def __enter__(self) -> Profiler:
        if self._wrapped:
            raise RuntimeError("this profiler is already recording; use one with block at a time")
        self._t0 = time.perf_counter()
        dev = self.device
        for name in ("malloc", "malloc_align32"):
            self._wrap(name, self._malloc_wrapper(getattr(dev, name)))
        self._wrap("malloc_many", self._malloc_many_wrapper(dev.malloc_many))
        self._wrap("free", self._free_wrapper(dev.free))
        self._wrap("free_many", self._free_many_wrapper(dev.free_many))
        with _ACTIVE_LOCK:
            _ACTIVE.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        with _ACTIVE_LOCK:
            if self in _ACTIVE:
                _ACTIVE.remove(self)
        for name, before in reversed(self._wrapped):
            if before is None:
                self.device.__dict__.pop(name, None)
            else:
                self.device.__dict__[name] = before  # an enclosing profiler's wrapper
        self._wrapped = []
        self._finish(self._top)

    def _wrap(self, name: str, wrapper: Callable[..., Any]) -> None:
        self._wrapped.append((name, self.device.__dict__.get(name)))
        self.device.__dict__[name] = wrapper

    # -- records -------------------------------------------------------------------------------

    def _stack(self) -> list[_Scope]:
        stack = getattr(self._scopes, "stack", None)
        if stack is None:  # every thread's records sit on the shared top scope
            stack = self._scopes.stack = [self._top]
        return stack

    def _push(self, name: str) -> None:
        self._stack().append(_Scope(name))

    def _pop(self) -> None:
        stack = self._stack()
        if len(stack) < 2:
            return
        inner = stack.pop()
        outer = stack[-1]
        with self._lock:
            outer.peak = max(outer.peak, outer.current + inner.peak)
            outer.current += inner.current
            outer.total += inner.total
            self._finish_locked(inner)

    def _finish(self, scope: _Scope) -> None:
        with self._lock:
            self._finish_locked(scope)

    def _finish_locked(self, scope: _Scope) -> None:
        rec = self._record(scope.name)
        rec.calls += 1
        rec.peak_bytes = max(rec.peak_bytes, scope.peak)
        rec.total_bytes += scope.total

    def block(self, name: str) -> Any:
        """A named block of this profiler only (``npumem.profile(name)`` marks every active one)."""
        name = _args.text(name, "name")
        return _scoped([self], name)

    # -- recording -----------------------------------------------------------------------------

    def _record(self, name: str) -> Record:
        rec = self.records.get(name)
        if rec is None:
            rec = self.records[name] = Record(name)
        return rec

    def _on_alloc(self, ptrs: list[int], sizes: list[int]) -> None:
        site = _call_site() if self.call_sites else "<off>"
        scope = self._stack()[-1]
        now = time.perf_counter() - self._t0
        with self._lock:
            rec = self._record(scope.name)
            for ptr, size in zip(ptrs, sizes, strict=True):
                self._live[ptr] = (size, site, scope.name)
                self._log.append(("ALLOC", now, ptr, size, site, scope.name))
                rec.allocs += 1
                scope.current += size
                scope.total += size
                scope.peak = max(scope.peak, scope.current)

    def _on_free(self, ptrs: list[int]) -> None:
        site = _call_site() if self.call_sites else "<off>"
        scope = self._stack()[-1]
        now = time.perf_counter() - self._t0
        with self._lock:
            rec = self._record(scope.name)
            for ptr in ptrs:
                size, _, _ = self._live.pop(ptr, (0, "", ""))
                self._log.append(("FREE", now, ptr, size, site, scope.name))
                rec.frees += 1
                scope.current -= size

    def _malloc_wrapper(self, inner: Callable[..., int]) -> Callable[..., int]:
        @functools.wraps(inner)
        def malloc(size: Any, *args: Any, **kwargs: Any) -> int:
            ptr = inner(size, *args, **kwargs)
            self._on_alloc([ptr], [size if type(size) is int else _args.size(size, "size")])
            return ptr

        return malloc

    def _malloc_many_wrapper(self, inner: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(inner)
        def malloc_many(sizes: Any, *args: Any, **kwargs: Any) -> Any:
            sizes = _args.uint64_array(sizes, "sizes")
            ptrs = inner(sizes, *args, **kwargs)
            self._on_alloc(ptrs.tolist(), sizes.tolist())
            return ptrs

        return malloc_many

    def _free_wrapper(self, inner: Callable[..., None]) -> Callable[..., None]:
        @functools.wraps(inner)
        def free(ptr: Any, *args: Any, **kwargs: Any) -> None:
            inner(ptr, *args, **kwargs)
            self._on_free([int(ptr)])

        return free

    def _free_many_wrapper(self, inner: Callable[..., None]) -> Callable[..., None]:
        @functools.wraps(inner)
        def free_many(ptrs: Any, *args: Any, **kwargs: Any) -> None:
            ptrs = _args.uint64_array(ptrs, "ptrs")
            inner(ptrs, *args, **kwargs)
            self._on_free(ptrs.tolist())

        return free_many

    # -- results -------------------------------------------------------------------------------

    @property
    def log(self) -> list[LogEntry]:
        """The ALLOC/FREE log so far, oldest first."""
        with self._lock:
            return [LogEntry(*e) for e in self._log]

    def leaks(self) -> list[Leak]:
        """The allocations not freed (so far), grouped by call site and record, most bytes first."""
        with self._lock:
            return self._leaks_locked()

    def _leaks_locked(self) -> list[Leak]:
        groups: dict[tuple[str, str], Leak] = {}
        for ptr, (size, site, rec) in self._live.items():
            leak = groups.get((site, rec))
            if leak is None:
                leak = groups[site, rec] = Leak(site, rec, 0, 0)
            leak.count += 1
            leak.bytes += size
            leak.ptrs.append(ptr)
        return sorted(groups.values(), key=lambda k: (-k.bytes, k.site))

    def report(self) -> dict[str, Any]:
        """Records (most total bytes first) and leaks, as plain data."""
        with self._lock:
            records = sorted(self.records.values(), key=lambda r: (-r.total_bytes, r.name))
            return {"records": [asdict(r) for r in records], "leaks": [asdict(k) for k in self._leaks_locked()]}

    def table(self) -> str:
        """The records and the leaks as a text table."""
        from .units import fmt

        rep = self.report()
        lines = [f"{'record':<40} {'calls':>7} {'allocs':>8} {'frees':>8} {'total':>12} {'peak':>12}"]
        for r in rep["records"]:
            lines.append(
                f"{r['name'][:40]:<40} {r['calls']:>7} {r['allocs']:>8} {r['frees']:>8} "
                f"{fmt(r['total_bytes']):>12} {fmt(r['peak_bytes']):>12}"
            )
        if rep["leaks"]:
            lines.append("never freed:")
            for k in rep["leaks"]:
                lines.append(f"  {k['count']:>6} x {fmt(k['bytes']):>10}  {k['site']}  [{k['record']}]")
        else:
            lines.append("never freed: nothing")
        return "\n".join(lines)

    def to_csv(self, path: str | None = None) -> str:
        """The records as CSV (name,calls,allocs,frees,total_bytes,peak_bytes); written to
        ``path`` when given. Returns the text."""
        out = io.StringIO()
        w = csv.writer(out, lineterminator="\n")
        w.writerow(["name", "calls", "allocs", "frees", "total_bytes", "peak_bytes"])
        for r in self.report()["records"]:
            w.writerow([r["name"], r["calls"], r["allocs"], r["frees"], r["total_bytes"], r["peak_bytes"]])
        return _written(out.getvalue(), path)

    def to_json(self, path: str | None = None) -> str:
        """:meth:`report` as JSON; written to ``path`` when given. Returns the text."""
        return _written(json.dumps(self.report(), indent=2), path)

    def log_csv(self, path: str | None = None) -> str:
        """The ALLOC/FREE log as CSV (op,time,ptr,size,site,record; pointers in hex)."""
        out = io.StringIO()
        w = csv.writer(out, lineterminator="\n")
        w.writerow(["op", "time", "ptr", "size", "site", "record"])
        with self._lock:
            for op, t, ptr, size, site, rec in self._log:
                w.writerow([op, f"{t:.9f}", hex(ptr), size, site, rec])
        return _written(out.getvalue(), path)


def _written(text: str, path: str | None) -> str:
    if path is not None:
        with open(_files.path_arg(path), "w", encoding="utf-8") as f:
            f.write(text)
    return text


@contextmanager
def _scoped(profilers: list[Profiler], name: str) -> Iterator[None]:
    for p in profilers:
        p._push(name)
    try:
        yield
    finally:
        for p in reversed(profilers):
            p._pop()


def _active() -> list[Profiler]:
    with _ACTIVE_LOCK:
        return list(_ACTIVE)


def profiler(device: Any, *, call_sites: bool = True) -> Profiler:
    """``with npumem.profiler(dev) as prof:`` — a :class:`Profiler` of ``device``."""
    return Profiler(device, call_sites=call_sites)


class _Profile:
    """``npumem.profile("name")``: a named block (``with``) or a decorator naming a record."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._open: list[Any] = []

    def __enter__(self) -> None:
        cm = _scoped(_active(), self.name)
        cm.__enter__()
        self._open.append(cm)

    def __exit__(self, *exc: Any) -> None:
        self._open.pop().__exit__(*exc)

    def __call__(self, func: F) -> F:
        return _decorate(func, self.name)


def _decorate(func: F, name: str) -> F:
    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        active = _active()
        if not active:
            return func(*args, **kwargs)
        with _scoped(active, name):
            return func(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


def profile(target: Any = None, *, name: str | None = None) -> Any:
    """``@npumem.profile`` (the record is the function's qualified name),
    ``@npumem.profile(name="x")``, or ``with npumem.profile("block"):``. Without an active
    profiler, the function runs unwrapped (one list check per call)."""
    if callable(target):
        label = name if name is not None else f"{target.__module__}.{target.__qualname__}"
        return _decorate(target, _args.text(label, "name"))
    if target is not None and name is not None:
        raise TypeError("profile takes a name or name=, not both")
    label = target if target is not None else name
    if label is None:
        return lambda func: profile(func)
    return _Profile(_args.text(label, "name"))
