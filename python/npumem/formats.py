"""Trace files in and out, and :class:`Trace`, the one form a trace takes: every reader returns
one, every replay, writer and measure takes one (or replay events, made one by :func:`as_trace`).

- :func:`load` is the one reader: any format below, told from the file's first bytes
  (:func:`detect`), or a loaded PyTorch trace (a dict).
- **RMM CSV** (``Thread,Time,Action,Pointer,Size,Stream``; actions ``allocate``,
  ``allocate failure``, ``free``; hex pointers and streams): :func:`read_rmm_csv` keeps each
  row's thread and stream and the rows' order (the original interleaving of the threads);
  ``allocate failure`` rows are counted (``Trace.failed_allocs``), not replayed, as RMM's own
  replay does. :func:`write_rmm_csv` writes a :class:`Trace`, or the history a :class:`Device`
  recorded (``record_memory_history``) on any allocator family.
- **PyTorch memory snapshots** (``_dump_snapshot`` pickles, loaded with a restricted unpickler
  that admits only plain data, so a crafted file cannot run code): their ``device_traces`` are
  read; :func:`write_snapshot` writes a device's (a replay run with ``snapshot=`` records one)
  and :func:`check_snapshot` checks every field that PyTorch's memory_viz (``stats``,
  ``trace``, ``segments``, ``trace_plot``) reads.
- **torch.profiler Chrome traces** (``profile_memory=True``, ``prof.export_chrome_trace``):
  their ``[memory]`` events (``Addr``, signed ``Bytes``) are read; :func:`write_profiler_trace`
  writes one.
- **Compact JSON** (``{"events": [[action, id, size], ...]}``, plain or ``.gz``): the traces
  ``benches/record_torch_traces.py`` saves in ``benches/traces/``.
- **npz** (:func:`write_npz` / :func:`read_npz`): the trace's columns as NumPy arrays in the
  narrowest integer types that hold them: about 10 bytes an event uncompressed, read without a
  Python object per event (10^7 events: 100 MiB, read and checked in about 2 s).
- **Replay events** (``("alloc", id, size)`` / ``("free", id)`` tuples or mappings):
  :func:`normalize` holds the free-event rules every reader shares (``free``,
  ``free_requested``, ``free_completed``; segment and snapshot events ignored).

Malformed input raises InvalidParamError naming the file and the row; a file that cannot be
opened raises OSError. What a reader reads is bounded by the file, never by a number it claims:
RMM CSV lines up to :data:`npumem._files.MAX_CSV_LINE` characters and fields up to 20 digits, npz columns up to
:data:`MAX_NPZ_BYTES` decompressed (each array header checked against its zip member first), JSON
up to ``npumem._files.MAX_JSON_BYTES``, snapshot pickles as :mod:`npumem._snapshot_pickle` says.
"""

from __future__ import annotations

import bisect
import csv
import gzip
import io
import math
import os
import pickle
import stat
import threading
import zipfile
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from . import _args, _files, _native
from .errors import InvalidParamError, invalid_param

Event = tuple[str, Any, int] | tuple[str, Any] | Mapping[str, Any]

_FREE_ACTIONS = {"free", "free_requested", "free_completed"}
# Actions of PyTorch device traces that do not change what the program holds.
_IGNORED_ACTIONS = {"segment_alloc", "segment_free", "segment_map", "segment_unmap", "snapshot", "oom"}


def event_fields(ev: Any, n: int) -> tuple[Any, Any, Any]:
    """``(action, id, size)`` of event number ``n`` (a tuple or a mapping, as the module doc
    says); the id must be hashable. The size is checked by the caller, for allocations."""
    if isinstance(ev, Mapping):
        action, key, size = ev.get("action"), ev.get("id", ev.get("addr")), ev.get("size", 0)
    elif isinstance(ev, Sequence) and not isinstance(ev, (str, bytes)) and len(ev) in (2, 3):
        action, key = ev[0], ev[1]
        size = ev[2] if len(ev) == 3 else 0
    else:
        raise invalid_param(f"event {n} is {_args.show(ev)}; use ('alloc', id, size) or ('free', id)")
    if not isinstance(action, str):
        raise invalid_param(f"event {n}: action {_args.show(action)} is not a string; use 'alloc' or 'free'")
    try:
        hash(key)
    except TypeError:
        raise invalid_param(f"event {n}: id {_args.show(key)} is not hashable; use an int, str or tuple") from None
    return action, key, size


def _events(events: Any) -> list[Any]:
    if isinstance(events, (str, bytes, Mapping)) or not isinstance(events, Iterable):
        raise _args.type_error("events", events, "a list of ('alloc', id, size) / ('free', id) events")
    return list(events)


def normalize(events: Iterable[Event]) -> list[tuple[bool, Any, int]]:
    """Events as (is_alloc, id, size) triples; raises InvalidParamError on malformed input
    (naming the event), TypeError when ``events`` is not a list of events.

    In a PyTorch device trace, which records both ``free_requested`` and ``free_completed``, the
    completed free is the one that returns memory; alone, either counts as the free."""
    return _normalize(_events(events))[0]


def _normalize(events: list[Any]) -> tuple[list[tuple[bool, Any, int]], list[int]]:
    """:func:`normalize`'s triples, and the index in ``events`` of the event each one comes from
    (the free-event rules, for every reader that keeps more of an event than its triple)."""
    completed_marks = any(isinstance(e, Mapping) and e.get("action") == "free_completed" for e in events)
    out: list[tuple[bool, Any, int]] = []
    where: list[int] = []
    sizes: dict[Any, int] = {}
    for n, ev in enumerate(events):
        action, key, size = event_fields(ev, n)
        if action == "alloc":
            if not _args.is_int(size) or not 0 < size <= _args.U64_MAX:
                raise invalid_param(
                    f"event {n}: alloc of {_args.show(size)} bytes; sizes must be ints from 1 to 2**64-1"
                )
            size = int(size)
            if key in sizes:
                raise invalid_param(f"event {n}: id {key!r} allocated twice without a free")
            sizes[key] = size
            out.append((True, key, size))
        elif action in _FREE_ACTIONS:
            if action == "free_requested" and completed_marks:
                continue
            if key not in sizes:
                raise invalid_param(f"event {n}: free of unknown id {key!r}")
            out.append((False, key, sizes.pop(key)))
        elif action in _IGNORED_ACTIONS:
            continue
        else:
            raise invalid_param(f"event {n}: unknown action {_args.show(action)}; use 'alloc' or 'free'")
        where.append(n)
    return out, where


#: The header RMM's logging_resource_adaptor writes.
RMM_HEADER = ["Thread", "Time", "Action", "Pointer", "Size", "Stream"]


@dataclass
class Trace:
    """A trace as columns: event ``k`` allocates (``is_alloc[k] != 0``) or frees the block
    ``ids[k]`` (dense ints from 0) of ``sizes[k]`` bytes, on ``streams[k]`` (the stream value
    the trace names: RMM's ``cudaStream_t``, 0 for the default stream) from thread
    ``threads[k]``. Frees name an id allocated earlier and still live."""

    is_alloc: np.ndarray
    ids: np.ndarray
    sizes: np.ndarray
    streams: np.ndarray | None = None
    threads: np.ndarray | None = None
    #: Allocations the recorded program asked for and did not get (RMM's ``allocate failure``).
    failed_allocs: int = 0
    #: Where the trace came from (a file name and format), for messages.
    source: str = "the trace"
    meta: dict[str, Any] = field(default_factory=dict)
    #: Whether the events were checked to pair up (see :func:`as_trace`).
    _paired: bool = field(default=False, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.failed_allocs = _args.integer(self.failed_allocs, "failed_allocs")
        n = None
        for name in ("is_alloc", "ids", "sizes", "streams", "threads"):
            col = getattr(self, name)
            if col is None and name in ("streams", "threads"):
                continue
            col = _column(col, name, self.source)
            if n is not None and len(col) != n:
                raise invalid_param(f"{self.source}: column {name} has {len(col)} entries, is_alloc has {n}")
            n = len(col)
            setattr(self, name, col.astype(np.uint8 if name == "is_alloc" else np.uint64, copy=False))

    def __len__(self) -> int:
        return len(self.is_alloc)

    @classmethod
    def from_events(cls, events: Iterable[Any], *, source: str = "the trace") -> Trace:
        """A trace of replay events (``("alloc", id, size)`` / ``("free", id)`` or mappings, as
        :mod:`npumem.replay` reads them; a mapping's ``stream`` is kept)."""
        events = _events(events)
        evs, where = _normalize(events)
        return cls._of(evs, _mapping_streams(events, where), source=source)

    @classmethod
    def _of(
        cls, evs: list[tuple[bool, Any, int]], streams: np.ndarray | None = None, *, source: str = "the trace"
    ) -> Trace:
        """A trace of :func:`normalize`'s triples, ids renumbered densely in order of first use."""
        index: dict[Any, int] = {}
        is_alloc = np.fromiter((a for a, _, _ in evs), dtype=np.uint8, count=len(evs))
        ids = np.fromiter((index.setdefault(k, len(index)) for _, k, _ in evs), dtype=np.uint64, count=len(evs))
        sizes = np.fromiter((s for _, _, s in evs), dtype=np.uint64, count=len(evs))
        trace = cls(is_alloc, ids, sizes, streams, source=source)
        trace._paired = True  # normalize's rules: every free names a live id, with its size
        return trace

    def events(self) -> list[tuple[str, int, int]]:
        """The events as ``("alloc", id, size)`` / ``("free", id, size)`` tuples."""
        return [
            ("alloc" if a else "free", int(i), int(s))
            for a, i, s in zip(self.is_alloc.tolist(), self.ids.tolist(), self.sizes.tolist(), strict=True)
        ]

    def stream_values(self) -> list[int]:
        """The distinct streams the trace names, in order of first use (0 first when used)."""
        if self.streams is None or not len(self.streams):
            return [0]
        values, first = np.unique(self.streams, return_index=True)
        ordered = [int(v) for _, v in sorted(zip(first.tolist(), values.tolist(), strict=True))]
        return sorted(ordered, key=lambda v: v != 0)

    def peak_live(self) -> int:
        """The largest sum of live requested bytes over the trace."""
        if not len(self):
            return 0
        if int(self.sizes.max()) >= (1 << 63) // max(1, len(self)):  # int64 sums could wrap
            live = peak = 0
            for a, s in zip(self.is_alloc.tolist(), self.sizes.tolist(), strict=True):
                live += s if a else -s
                peak = max(peak, live)
            return peak
        delta = np.where(self.is_alloc != 0, self.sizes.astype(np.int64), -self.sizes.astype(np.int64))
        return max(0, int(np.cumsum(delta).max()))


def _column(values: Any, name: str, source: str) -> np.ndarray:
    """A trace column as a 1-D C-contiguous array of non-negative integers (never wrapped)."""
    col = np.asarray(values)
    if col.ndim != 1 or (col.dtype.kind not in "ui" and not (col.dtype.kind == "b" and name == "is_alloc")):
        if not (col.size == 0 and col.ndim == 1):
            raise invalid_param(f"{source}: column {name} is {col.dtype} of {col.ndim} dimensions; use 1-D integers")
        col = col.astype(np.uint64)
    if col.dtype.kind == "i" and col.size and int(col.min()) < 0:
        raise invalid_param(f"{source}: column {name} holds {int(col.min())}; trace columns are non-negative")
    return np.ascontiguousarray(col)


def _mapping_streams(events: list[Any], where: list[int]) -> np.ndarray | None:
    """The ``stream`` of each event :func:`_normalize` keeps (``where``: their indices; 0 for a
    tuple), when any mapping event names one."""
    if not any(isinstance(e, Mapping) and "stream" in e for e in events):
        return None
    out = [
        _args.integer(events[k].get("stream", 0), f"event {k}: stream") if isinstance(events[k], Mapping) else 0
        for k in where
    ]
    return np.array(out, dtype=np.uint64)


def _unchecked(source: Any) -> Trace:
    """``source`` as a :class:`Trace` for a writer, which writes what it is given (a reader
    refuses events that do not pair up)."""
    return source if isinstance(source, Trace) else Trace.from_events(source)


def as_trace(events: Any) -> Trace:
    """``events`` as a :class:`Trace` (itself when it is one, once checked: every free names a
    live id and carries the size it was allocated with, no live id is allocated again, no
    allocation is of 0 bytes; InvalidParamError naming the event otherwise)."""
    if not isinstance(events, Trace):
        return Trace.from_events(events)
    if not events._paired:
        _check_pairs(events)
    return events


# -- RMM CSV ----------------------------------------------------------------------------------


def _hex(text: str, where: str) -> int:
    """A pointer or stream as RMM prints them: hex, with or without ``0x``; ``(nil)`` is 0."""
    t = text.strip().lower()
    if t in ("(nil)", "nil", "(null)", ""):
        return 0
    try:
        v = int(t, 16)
    except ValueError:
        raise invalid_param(f"{where} is {text.strip()!r}, not a hex pointer or stream (like 0x7f1c2a000000)") from None
    if not 0 <= v <= _args.U64_MAX:
        raise invalid_param(f"{where} is {text.strip()!r}, outside 0 to 2**64-1")
    return v


def _decimal(t: str) -> int | None:
    """An ASCII decimal of at most 20 digits (2**64-1 has 20) as an int, else None."""
    return int(t) if t.isascii() and t.isdigit() and len(t) <= 20 else None


def _thread(text: str, where: str) -> int:
    """A thread id (decimal, as spdlog's ``%t`` prints it)."""
    t = text.strip()
    if not t:
        return 0
    v = _decimal(t)
    if v is None or v > _args.U64_MAX:
        raise invalid_param(f"{where} is {_args.show(t)}, not a thread id (a decimal number)")
    return v


#: The longest line of an RMM CSV read (RMM's are under 200 characters).
def read_rmm_csv(path: Any) -> Trace:
    """A trace from RMM's ``logging_resource_adaptor`` CSV (see the module doc): rows in file
    order, with each row's thread and stream."""
    name = _files.path_arg(path)
    # utf-8-sig: a byte-order mark (what Excel and many tools write) is not part of the header.
    with open(name, newline="", encoding="utf-8-sig", errors="replace") as f:
        rows = csv.reader(_files.csv_lines(f, name, "an RMM log"))
        try:
            return _rmm_rows(rows, name)
        except csv.Error as e:  # a field past csv's limit, a NUL byte
            raise invalid_param(f"{name}: line {rows.line_num}: not an RMM log row ({e})") from None


def _rmm_rows(rows: Any, name: str) -> Trace:
    """The trace of an RMM log's rows (``rows``: a csv reader at the header)."""
    header = next(rows, None)
    if header is None or [h.strip() for h in header[:6]] != RMM_HEADER:
        raise invalid_param(
            f"{name}: not an RMM log: the header is {_args.show(header)}, expected {','.join(RMM_HEADER)}"
        )
    is_alloc: list[int] = []
    ids: list[int] = []
    sizes: list[int] = []
    streams: list[int] = []
    threads: list[int] = []
    live: dict[int, tuple[int, int]] = {}
    failed = next_key = 0
    for n, row in enumerate(rows, start=2):
        if not row or (len(row) == 1 and not row[0].strip()):
            continue
        where = f"{name}: line {n}"
        if len(row) < 6:
            raise invalid_param(f"{where} has {len(row)} fields, expected 6 ({','.join(RMM_HEADER)})")
        action = row[2].strip()
        thread = _thread(row[0], f"{where}: Thread")
        size_text = row[4].strip()
        size = _decimal(size_text)
        if size is None or size > _args.U64_MAX:
            raise invalid_param(f"{where}: Size is {_args.show(size_text)}, not a byte count (0 to 2**64-1)")
        stream = _hex(row[5], f"{where}: Stream")
        if action == "allocate failure":
            failed += 1
            continue
        ptr = _hex(row[3], f"{where}: Pointer")
        if action == "allocate":
            if size == 0:
                continue  # RMM returns nullptr for 0 bytes; nothing to replay
            if ptr in live:  # a free the log lost: close the old block first
                old, old_size = live.pop(ptr)
                is_alloc.append(0)
                ids.append(old)
                sizes.append(old_size)
                streams.append(stream)
                threads.append(thread)
            live[ptr] = (next_key, size)
            is_alloc.append(1)
            ids.append(next_key)
            sizes.append(size)
            next_key += 1
        elif action == "free":
            if ptr not in live:
                continue  # memory allocated before the log began
            key, size = live.pop(ptr)
            is_alloc.append(0)
            ids.append(key)
            sizes.append(size)
        else:
            raise invalid_param(f"{where}: Action is {action!r}; RMM logs 'allocate', 'allocate failure', 'free'")
        streams.append(stream)
        threads.append(thread)
    return Trace(
        np.array(is_alloc, dtype=np.uint8),
        np.array(ids, dtype=np.uint64),
        np.array(sizes, dtype=np.uint64),
        np.array(streams, dtype=np.uint64),
        np.array(threads, dtype=np.uint64),
        failed_allocs=failed,
        source=name,
    )


def write_rmm_csv(source: Any, path: Any) -> int:
    """Writes RMM's CSV for ``source``: a :class:`Trace` (or replay events), with each block's
    pointer made up from its id, or a :class:`npumem.Device` whose history was recorded
    (``record_memory_history``): its allocations, completed frees and out-of-memory errors on
    any allocator family, with their real pointers and streams. Returns the rows written."""
    name = _files.path_arg(path)
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow(RMM_HEADER)
    rows = 0
    if isinstance(source, _native.Device):  # npumem.Device and its subclasses
        thread = threading.get_native_id()
        for e in source.memory_snapshot()["device_traces"][0]:
            action = {"alloc": "allocate", "free_completed": "free", "oom": "allocate failure"}.get(e["action"])
            if action is None:
                continue
            ptr = "(nil)" if action == "allocate failure" else f"{e['addr']:#x}"
            w.writerow([thread, _clock(e["time_us"]), action, ptr, e["size"], f"{e['stream']:#x}"])
            rows += 1
    else:
        trace = _unchecked(source)
        streams = trace.streams if trace.streams is not None else np.zeros(len(trace), np.uint64)
        threads = trace.threads if trace.threads is not None else np.zeros(len(trace), np.uint64)
        for a, ptr, s, st, th in zip(
            trace.is_alloc.tolist(),
            _fake_pointers(trace),
            trace.sizes.tolist(),
            streams.tolist(),
            threads.tolist(),
            strict=True,
        ):
            w.writerow([th, _clock(rows), "allocate" if a else "free", f"{ptr:#x}", s, f"{st:#x}"])
            rows += 1
    with open(name, "w", encoding="utf-8", newline="") as f:
        f.write(out.getvalue())
    return rows


#: Where the made-up addresses of a trace's blocks start (RMM CSV, torch.profiler traces).
_FAKE_BASE = 0x7F0000000000


def _fake_pointers(trace: Trace) -> list[int]:
    """A made-up address per event: 256-byte-aligned from :data:`_FAKE_BASE` by id (ids are
    reused only after a free), or the id moved by that base (mod 2**64) when an id is so large
    that the aligned address would pass 2**64; distinct ids get distinct addresses either way."""
    ids = trace.ids.tolist()
    if not ids or max(ids) <= (_args.U64_MAX - _FAKE_BASE) // 256:
        return [_FAKE_BASE + 256 * i for i in ids]
    return [(_FAKE_BASE + i) & _args.U64_MAX for i in ids]


def _clock(us: int) -> str:
    """``%H:%M:%S.%f`` of a time in microseconds (RMM's Time column)."""
    s, micro = divmod(int(us), 1_000_000)
    h, rest = divmod(s, 3600)
    return f"{h % 24:02d}:{rest // 60:02d}:{rest % 60:02d}.{micro:06d}"


# -- torch.profiler Chrome traces --------------------------------------------------------------


def write_profiler_trace(source: Any, path: Any, *, device_type: int = 0) -> int:
    """Writes ``source`` as a ``torch.profiler`` Chrome trace (``[memory]`` instant events with
    ``Addr``, signed ``Bytes``, ``Total Allocated``, ``Total Reserved`` (a device's mapped
    segments; 0 for a trace), ``Device Type`` and ``Device Id``, as ``prof.export_chrome_trace``
    writes them;
    gzip-compressed when the name ends in ``.gz``): a :class:`Trace` (or replay events), with a
    made-up address per block, or a :class:`npumem.Device` whose history was recorded, with its
    real pointers. :func:`npumem.importers.profiler_trace` reads it back. Returns the events."""
    import json

    device_type = _args.integer(device_type, "device_type", 0, 2**31 - 1)
    name = _files.path_arg(path)
    # (time in µs, address, signed bytes, reserved bytes after it)
    records: list[tuple[int, int, int, int]] = []
    if isinstance(source, _native.Device):  # npumem.Device and its subclasses
        reserved = 0
        for e in source.memory_snapshot()["device_traces"][0]:
            if e["action"] in ("segment_alloc", "segment_map"):
                reserved += e["size"]
            elif e["action"] in ("segment_free", "segment_unmap"):
                reserved -= e["size"]
            elif e["action"] in ("alloc", "free_completed"):
                delta = e["size"] if e["action"] == "alloc" else -e["size"]
                records.append((e["time_us"], e["addr"], delta, reserved))
    else:
        trace = _unchecked(source)
        for k, (a, ptr, s) in enumerate(
            zip(trace.is_alloc.tolist(), _fake_pointers(trace), trace.sizes.tolist(), strict=True)
        ):
            records.append((k, ptr, s if a else -s, 0))
    events = []
    allocated = 0
    for ts, addr, delta, reserved in records:
        allocated += delta
        # The args torch.profiler writes (torch 2.15's export_chrome_trace), less its event index.
        args = {"Total Reserved": reserved, "Total Allocated": allocated, "Bytes": delta}
        args |= {"Device Id": 0, "Device Type": device_type, "Addr": addr}
        events.append(
            {"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": 0, "tid": 0}
            | {"ts": ts, "args": args}
        )
    opener = gzip.open if name.endswith(".gz") else open
    with opener(name, "wt", encoding="utf-8") as f:
        json.dump({"traceEvents": events, "displayTimeUnit": "ms"}, f)
    return len(events)


# -- npz --------------------------------------------------------------------------------------

_NPZ_VERSION = 1


def _narrow(col: np.ndarray) -> np.ndarray:
    """``col`` in the narrowest unsigned type that holds its values."""
    top = int(col.max()) if len(col) else 0
    for t in (np.uint8, np.uint16, np.uint32):
        if top <= np.iinfo(t).max:
            return col.astype(t)
    return col


def write_npz(source: Any, path: Any, *, compress: bool = False) -> None:
    """Writes ``source`` (a :class:`Trace` or replay events) as npumem's compact trace: one
    ``.npz`` of its columns in the narrowest types (zlib-compressed with ``compress``)."""
    trace = _unchecked(source)
    name = _files.path_arg(path)
    cols = {
        "npumem_trace": np.array([_NPZ_VERSION, trace.failed_allocs], dtype=np.uint64),
        "is_alloc": trace.is_alloc,
        "ids": _narrow(trace.ids),
        "sizes": _narrow(trace.sizes),
    }
    if trace.streams is not None:
        cols["streams"] = _narrow(trace.streams)
    if trace.threads is not None:
        cols["threads"] = _narrow(trace.threads)
    with open(name, "wb") as f:  # savez would add .npz to a name without it
        (np.savez_compressed if compress else np.savez)(f, **cols)


#: The most bytes the columns of one npz trace may hold once decompressed (10^9 events take
#: about 10 GiB); each column's header must also claim no more than the file holds for it.
MAX_NPZ_BYTES = 1 << 34
_NPZ_COLUMNS = ("is_alloc", "ids", "sizes", "streams", "threads")


def _npz_sizes(name: str) -> None:
    """Refuses an npz whose columns, decompressed, would pass :data:`MAX_NPZ_BYTES`, or whose
    array headers claim more elements than their members hold (before any is read)."""
    with open(name, "rb") as f:  # zipfile reads a device or a pipe to its end, looking for the index
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode) or f.read(2) != b"PK":
            raise invalid_param(f"{name}: not an npz trace (a regular zip file)")
    with zipfile.ZipFile(name) as z:
        total = 0
        for info in z.infolist():
            total += info.file_size
            if total > MAX_NPZ_BYTES:
                raise invalid_param(
                    f"{name}: the npz holds more than {_args.bound(MAX_NPZ_BYTES)} bytes decompressed; "
                    "a trace this large is not read"
                )
            with z.open(info) as f:
                version = np.lib.format.read_magic(f)
                read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else None
                if version == (2, 0):
                    read_header = np.lib.format.read_array_header_2_0
                if read_header is None:
                    raise invalid_param(
                        f"{name}: member {info.filename} is npy format {version}; npumem reads 1.0, 2.0"
                    )
                shape, _, dtype = read_header(f)
            if math.prod(shape) * dtype.itemsize > info.file_size:
                raise invalid_param(
                    f"{name}: member {info.filename} claims shape {shape} of {dtype} but holds {info.file_size:,} bytes"
                )


def read_npz(path: Any) -> Trace:
    """A trace written by :func:`write_npz`."""
    name = _files.path_arg(path)
    try:
        _npz_sizes(name)
        with np.load(name, allow_pickle=False) as z:
            if "npumem_trace" not in z.files:
                raise invalid_param(f"{name}: an .npz without npumem_trace: not a trace npumem wrote")
            head = z["npumem_trace"]
            if head.ndim != 1 or head.dtype.kind not in "ui" or len(head) < 2:
                what = f"{head.dtype} of shape {head.shape}"
                raise invalid_param(f"{name}: npumem_trace is {what}; npumem writes [version, failed allocs]")
            version, failed = (int(v) for v in head[:2])
            if version != _NPZ_VERSION:
                raise invalid_param(f"{name}: npz trace version {version}; this npumem reads {_NPZ_VERSION}")
            if failed < 0:
                raise invalid_param(f"{name}: npumem_trace counts {failed} failed allocations; counts are non-negative")
            cols = {k: z[k] for k in _NPZ_COLUMNS if k in z.files}
    except MemoryError:
        raise invalid_param(f"{name}: the npz trace does not fit in this process's memory") from None
    except Exception as e:  # zipfile's and numpy's errors on a malformed file (compression, CRC, header)
        if isinstance(e, InvalidParamError):
            raise
        if isinstance(e, OSError) and not isinstance(e, zipfile.BadZipFile) and not os.path.exists(name):
            raise
        raise invalid_param(f"{name}: not an npz trace ({type(e).__name__}: {e})") from None
    for k in ("is_alloc", "ids", "sizes"):
        if k not in cols:
            raise invalid_param(f"{name}: the npz trace has no {k} column")
    for k, col in cols.items():
        if col.ndim != 1 or col.dtype.kind not in "ui":
            raise invalid_param(f"{name}: column {k} is {col.dtype} of {col.ndim} dimensions, not integers")
    # Signed columns go to Trace as they are: it refuses a negative entry rather than wrap it.
    trace = Trace(
        cols["is_alloc"],
        cols["ids"],
        cols["sizes"],
        cols.get("streams"),
        cols.get("threads"),
        failed_allocs=failed,
        source=name,
    )
    _check_pairs(trace)
    return trace


def _check_pairs(trace: Trace) -> None:
    """Every free names a live id and no live id is allocated again (vectorised: the events of
    each id alternate alloc, free, alloc, ...)."""
    if not len(trace):
        return
    order = np.argsort(trace.ids, kind="stable")
    ids, alloc = trace.ids[order], trace.is_alloc[order] != 0
    first = np.ones(len(ids), dtype=bool)
    first[1:] = ids[1:] != ids[:-1]
    prev_alloc = np.empty(len(ids), dtype=bool)
    prev_alloc[0] = False
    prev_alloc[1:] = alloc[:-1]
    bad = (first & ~alloc) | (~first & (alloc == prev_alloc))
    if bad.any():
        k = int(order[int(np.argmax(bad))])
        what = "allocated twice without a free" if trace.is_alloc[k] else "freed while not live"
        raise invalid_param(f"{trace.source}: event {k}: id {int(trace.ids[k])} {what}")
    sizes = trace.sizes[order]
    resized = np.zeros(len(ids), dtype=bool)
    resized[1:] = ~alloc[1:] & (sizes[1:] != sizes[:-1])  # a free (never first) against its alloc
    if resized.any():
        j = int(np.argmax(resized))
        k = int(order[j])
        raise invalid_param(
            f"{trace.source}: event {k}: free of id {int(trace.ids[k])} with {int(sizes[j]):,} bytes; "
            f"it was allocated with {int(sizes[j - 1]):,}"
        )
    if (trace.sizes[trace.is_alloc != 0] == 0).any():
        k = int(np.argmax((trace.sizes == 0) & (trace.is_alloc != 0)))
        raise invalid_param(f"{trace.source}: event {k}: alloc of 0 bytes; sizes must be from 1 to 2**64-1")
    trace._paired = True


# -- PyTorch snapshots ------------------------------------------------------------------------

#: Trace actions PyTorch's snapshots use.
SNAPSHOT_ACTIONS = frozenset(
    {"alloc", "free_requested", "free_completed", "segment_alloc", "segment_free", "segment_map", "segment_unmap"}
    | {"snapshot", "oom"}
)
_BLOCK_STATES = frozenset({"active_allocated", "active_pending_free", "inactive"})
#: The pickle protocol of written snapshots: the browser viewer's unpickler (PyTorch's
#: torch/utils/viz/MemoryViz.js, behind memory_viz's trace_plot pages and its drag-and-drop
#: viewer) reads protocols 2 to 4; Python 3.14 writes 5 by default.
SNAPSHOT_PROTOCOL = 4


def write_snapshot(device: Any, path: Any) -> None:
    """Pickles ``device``'s memory snapshot (PyTorch's ``_dump_snapshot`` format), after checking
    it with :func:`check_snapshot`."""
    if not isinstance(device, _native.Device):
        raise _args.type_error("device", device, "an npumem.Device (its memory snapshot is written)")
    dump_snapshot_data(device.memory_snapshot(), path)


def dump_snapshot_data(snap: Any, path: Any) -> None:
    """Pickles the snapshot ``snap`` (a dict of PyTorch's format, e.g. several devices' merged)
    to ``path``, after checking it with :func:`check_snapshot`."""
    name = _files.path_arg(path)
    check_snapshot(snap)
    with open(name, "wb") as f:
        pickle.dump(snap, f, protocol=SNAPSHOT_PROTOCOL)


def check_snapshot(snap: Any) -> None:
    """Raises InvalidParamError naming the first field that PyTorch's memory_viz would miss or
    misread: ``stats`` (segments' ``total_size``, ``stream``, blocks' ``size``, ``state``,
    ``requested_size`` adding up to the segment), ``segments`` (``stream``, ``address``,
    blocks' ``frames``), ``trace`` (``device_traces`` entries: ``action``, ``addr`` and ``size``,
    ``device_free`` for ``oom``; segments' ``allocated_size``) and ``trace_plot`` (plain data
    that pickles, entries' ``time_us``, ``stream`` and ``frames``), following PyTorch's documented
    snapshot format (``torch.cuda.memory._snapshot``)."""
    if not isinstance(snap, Mapping):
        raise invalid_param(f"a snapshot is a dict, got {type(snap).__name__}")
    segments = snap.get("segments")
    if not isinstance(segments, list):
        raise invalid_param("snapshot['segments'] is missing or not a list")
    for i, seg in enumerate(segments):
        at = f"segments[{i}]"
        _fields(seg, at, {"device", "address", "total_size", "allocated_size", "active_size", "requested_size"})
        _fields(seg, at, {"stream"})
        if seg.get("segment_type") not in ("small", "large"):
            raise invalid_param(f"{at}: segment_type is {seg.get('segment_type')!r}, not 'small' or 'large'")
        if not isinstance(seg.get("blocks"), list) or not isinstance(seg.get("frames", []), list):
            raise invalid_param(f"{at}: blocks (and frames) must be lists")
        total = allocated = 0
        for j, b in enumerate(seg["blocks"]):
            bat = f"{at}.blocks[{j}]"
            _fields(b, bat, {"address", "size", "requested_size"})
            if b.get("state") not in _BLOCK_STATES:
                raise invalid_param(f"{bat}: state is {b.get('state')!r}, not one of {sorted(_BLOCK_STATES)}")
            if not isinstance(b.get("frames"), list):
                raise invalid_param(f"{bat}: frames must be a list (memory_viz's segments reads it)")
            if b["state"] == "active_allocated":
                if b["requested_size"] > b["size"]:
                    raise invalid_param(f"{bat}: requested_size {b['requested_size']} > size {b['size']}")
                allocated += b["size"]
            if b["address"] != seg["address"] + total:
                raise invalid_param(f"{bat}: address {b['address']:#x} is not where the blocks before it end")
            total += b["size"]
        if total != seg["total_size"]:
            raise invalid_param(f"{at}: its blocks add up to {total} bytes, total_size is {seg['total_size']}")
        if allocated != seg["allocated_size"]:
            raise invalid_param(f"{at}: allocated_size {seg['allocated_size']} != its active blocks' {allocated}")
    traces = snap.get("device_traces")
    if not isinstance(traces, list) or not all(isinstance(t, list) for t in traces):
        raise invalid_param("snapshot['device_traces'] is missing or not a list of per-device lists")
    for d, entries in enumerate(traces):
        for k, e in enumerate(entries):
            at = f"device_traces[{d}][{k}]"
            if not isinstance(e, Mapping):
                raise invalid_param(f"{at} is {type(e).__name__}, not a trace entry (a dict)")
            if e.get("action") not in SNAPSHOT_ACTIONS:
                raise invalid_param(f"{at}: action {e.get('action')!r} is not one of {sorted(SNAPSHOT_ACTIONS)}")
            _fields(e, at, {"size", "stream", "time_us"})
            _fields(e, at, {"device_free"} if e["action"] == "oom" else {"addr"})
            if e["action"] == "oom" and "addr" in e:
                raise invalid_param(f"{at}: an oom entry has device_free, not addr")
            if not isinstance(e.get("frames"), list):
                raise invalid_param(f"{at}: frames must be a list")
        _check_history(entries, [s for s in segments if s.get("device", d) == d], f"device_traces[{d}]")
    if not isinstance(snap.get("allocator_settings", {}), Mapping):
        raise invalid_param("snapshot['allocator_settings'] must be a dict")
    try:
        pickle.loads(pickle.dumps(snap))
    except Exception as e:  # trace_plot pickles the snapshot into the page
        raise invalid_param(f"the snapshot does not pickle ({e})") from None


class _Ranges:
    """Disjoint half-open address ranges, sorted (the mapped memory while a trace is undone)."""

    def __init__(self) -> None:
        self.starts: list[int] = []
        self.ends: list[int] = []

    def _at(self, addr: int) -> int:
        """Index of the range holding ``addr``, or -1."""
        i = bisect.bisect_right(self.starts, addr) - 1
        return i if i >= 0 and addr < self.ends[i] else -1

    def holds(self, lo: int, hi: int) -> bool:
        i = self._at(lo)
        return i >= 0 and hi <= self.ends[i]

    def add(self, lo: int, hi: int) -> bool:
        """Adds [lo, hi), merged with the ranges it touches; False if it overlaps one."""
        i = bisect.bisect_right(self.starts, lo)
        if (i > 0 and self.ends[i - 1] > lo) or (i < len(self.starts) and self.starts[i] < hi):
            return False
        if i > 0 and self.ends[i - 1] == lo:
            i -= 1
            lo = self.starts[i]
            del self.starts[i], self.ends[i]
        if i < len(self.starts) and self.starts[i] == hi:
            hi = self.ends[i]
            del self.starts[i], self.ends[i]
        self.starts.insert(i, lo)
        self.ends.insert(i, hi)
        return True

    def remove(self, lo: int, hi: int) -> bool:
        """Takes [lo, hi) out of the range holding it; False if no range holds it whole."""
        i = self._at(lo)
        if i < 0 or hi > self.ends[i]:
            return False
        start, end = self.starts[i], self.ends[i]
        del self.starts[i], self.ends[i]
        for a, b in ((hi, end), (start, lo)):
            if a < b:
                self.starts.insert(i, a)
                self.ends.insert(i, b)
        return True


def _check_history(entries: list, segments: list, at: str) -> None:
    """Checks that the trace leads to the segments and blocks listed, as memory_viz's browser views
    (trace_plot, segment_plot) rebuild every earlier state from them by undoing the entries from
    the last: each alloc undone is a live block, each free undone a block not live, every block
    inside memory mapped at its time, each segment alloc / map undone a mapped range holding no
    live block, each segment free / unmap undone a range not mapped."""
    mapped = _Ranges()
    live: dict[int, int] = {}
    for seg in segments:
        mapped.add(seg["address"], seg["address"] + seg["total_size"])
        for b in seg["blocks"]:
            if b["state"] != "inactive":
                live[b["address"]] = b["size"]
    order = sorted(live)  # the live blocks' addresses, to find one inside a range
    for k in range(len(entries) - 1, -1, -1):
        e = entries[k]
        action, addr, size = e["action"], e.get("addr", 0), e["size"]
        where = f"{at}[{k}] ({action} at {addr:#x}, {size} bytes)"
        if action in ("alloc", "free_requested", "free_completed"):
            if action == "free_completed":
                if addr in live:
                    raise invalid_param(f"{where}: the block is live after it is freed")
                live[addr] = size
                bisect.insort(order, addr)
            elif addr not in live:
                raise invalid_param(f"{where}: no live block there (not allocated, or freed before)")
            elif action == "alloc":
                del live[addr]
                del order[bisect.bisect_left(order, addr)]
            if addr in live and not mapped.holds(addr, addr + live[addr]):
                raise invalid_param(f"{where}: the block is not inside memory mapped at that time")
        elif action in ("segment_alloc", "segment_map"):
            i = bisect.bisect_left(order, addr)
            if i < len(order) and order[i] < addr + size:
                raise invalid_param(f"{where}: a block is live in the range before it is mapped")
            if not mapped.remove(addr, addr + size):
                raise invalid_param(f"{where}: the range is not mapped after it (a later entry unmaps it first)")
        elif action in ("segment_free", "segment_unmap") and not mapped.add(addr, addr + size):
            raise invalid_param(f"{where}: the range was still mapped (overlaps mapped memory) before it")


def _fields(d: Any, at: str, names: set[str]) -> None:
    if not isinstance(d, Mapping):
        raise invalid_param(f"{at} is {type(d).__name__}, not a dict")
    for n in sorted(names):
        v = d.get(n)
        if not (isinstance(v, int) and not isinstance(v, bool) and v >= 0):
            raise invalid_param(f"{at}: {n} is {v!r}, not a non-negative int")


# -- PyTorch traces and compact JSON ------------------------------------------------------------
#
# torch.profiler Chrome traces and snapshots' device_traces become ``("alloc", id, size)`` /
# ``("free", id, size)`` events whose ids are ``(address, n)``: the n-th allocation at that
# address, so reuse of an address is kept apart. Frees of memory allocated before the trace
# began are dropped; allocations still live at the end stay live (replay frees them).

_Pair = tuple[str, tuple[int, int], int]


def _load_json(source: Any) -> tuple[Mapping[str, Any], str]:
    """The trace and how to name it in messages."""
    if isinstance(source, Mapping):
        return source, "the trace"
    name = _files.path_arg(source, "source")
    trace = _files.read_json(name, "a torch.profiler Chrome trace")
    if isinstance(trace, list):  # the Trace Event Format's JSON Array Format: the events alone
        return {"traceEvents": trace}, name
    if not isinstance(trace, Mapping):
        raise invalid_param(
            f"{name}: a Chrome trace is a JSON object or an array of events, got {type(trace).__name__}"
        )
    return trace, name


def _compact_hint(trace: Mapping[str, Any], where: str) -> None:
    """Refuses a compact trace (``{"events": ...}``) where a Chrome trace is expected: the message
    :func:`npumem.importers.profiler_trace` gives, which reads only Chrome traces."""
    if "events" in trace and "traceEvents" not in trace:
        raise invalid_param(
            f"{where} is a compact npumem trace ({{'events': [...]}}, as benches/record_torch_traces.py saves); "
            "read it with npumem.traces.load(path)"
        )


def _int_field(value: Any, where: str, lo: int = 0, hi: int = _args.U64_MAX) -> int:
    """An integer field of an event (an int, or a string or float that holds one)."""
    if isinstance(value, bool):
        raise invalid_param(f"{where} is {value!r}, not an integer")
    try:
        v = int(value) if not isinstance(value, float) or value.is_integer() else None
    except (TypeError, ValueError, OverflowError):
        v = None
    if v is None:
        raise invalid_param(f"{where} is {_args.show(value)}, not an integer")
    if not lo <= v <= hi:
        raise invalid_param(f"{where} is {v}, outside {lo} to {_args.bound(hi)}")
    return v


def _pair(raw: Iterable[tuple[int, int, int]]) -> list[_Pair]:
    """(timestamp, address, signed bytes) records → alloc/free events with unique ids."""
    events: list[_Pair] = []
    live: dict[int, tuple[tuple[int, int], int]] = {}
    generation: dict[int, int] = {}
    for _, addr, delta in sorted(raw, key=lambda r: r[0]):
        if delta > 0:
            if addr in live:  # a free we never saw: close the old one first
                key, size = live.pop(addr)
                events.append(("free", key, size))
            n = generation.get(addr, 0)
            generation[addr] = n + 1
            key = (addr, n)
            live[addr] = (key, delta)
            events.append(("alloc", key, delta))
        elif delta < 0 and addr in live:
            key, size = live.pop(addr)
            events.append(("free", key, size))
    return events


def _profiler_events(source: Any, device_type: int | None = None) -> list[_Pair]:
    """Alloc/free events from a ``torch.profiler`` Chrome trace (path, ``.json.gz``, or the loaded
    dict). ``device_type`` keeps one device type (0 = CPU, 1 = CUDA, PrivateUse1 for NPUs);
    by default the type with the most memory events is kept."""
    device_type = _args.optional_integer(device_type, "device_type", 0, 2**31 - 1)
    trace, where = _load_json(source)
    _compact_hint(trace, where)
    events = trace.get("traceEvents", [])
    if not isinstance(events, list):
        raise invalid_param(f"{where}: traceEvents is {_args.show(events)}, not a list of events")
    records: dict[int, list[tuple[int, int, int]]] = {}
    for n, ev in enumerate(events):
        if not isinstance(ev, Mapping):
            raise invalid_param(f"{where}: traceEvents[{n}] is {_args.show(ev)}, not an event object")
        if ev.get("name") != "[memory]":
            continue
        args = ev.get("args")
        if not isinstance(args, Mapping) or "Addr" not in args or "Bytes" not in args:
            raise invalid_param(f"{where}: traceEvents[{n}] is a [memory] event without args.Addr and args.Bytes")
        at = f"{where}: traceEvents[{n}]"
        addr = _int_field(args["Addr"], f"{at}: args.Addr")
        delta = _int_field(args["Bytes"], f"{at}: args.Bytes", -_args.U64_MAX, _args.U64_MAX)
        ts_raw = ev.get("ts", 0)
        try:
            ts = int(float(ts_raw) * 1000)
        except (TypeError, ValueError, OverflowError):
            raise invalid_param(f"{at}: ts is {_args.show(ts_raw)}, not a time in microseconds") from None
        kind = _int_field(args.get("Device Type", 0), f"{at}: args['Device Type']", 0, 2**31 - 1)
        records.setdefault(kind, []).append((ts, addr, delta))
    if not records:
        raise invalid_param(
            f"{where} has no [memory] events; record it with torch.profiler.profile(profile_memory=True)"
        )
    kind = device_type if device_type is not None else max(records, key=lambda k: len(records[k]))
    if kind not in records:
        raise invalid_param(f"the trace has no memory events for device type {kind}; it has {sorted(records)}")
    return _pair(records[kind])


def _snapshot_events(source: Any, device: int = 0) -> list[_Pair]:
    """Alloc/free events from the ``device_traces`` of a PyTorch (or npumem) memory snapshot:
    the dict, or the path of a pickle written by ``_dump_snapshot`` (loaded with a restricted
    unpickler that admits only plain data, so a crafted file cannot run code)."""
    device = _args.integer(device, "device", 0, 2**31 - 1)
    if isinstance(source, Mapping):
        snap, where = source, "the snapshot"
    else:
        where = _files.path_arg(source, "source")
        snap = _files.read_snapshot(where)
        if not isinstance(snap, Mapping):
            raise invalid_param(f"{where}: a memory snapshot is a dict, got {type(snap).__name__}")
    traces = snap.get("device_traces")
    traces = [] if traces is None else traces
    if not isinstance(traces, list) or not all(isinstance(t, list) for t in traces):
        raise invalid_param(f"{where}: device_traces is not a list of per-device lists of trace entries")
    if device >= len(traces):
        raise invalid_param(f"the snapshot has traces for {len(traces)} devices; device {device} is not one")
    raw = []
    for n, ev in enumerate(traces[device]):
        at = f"{where}: device_traces[{device}][{n}]"
        if not isinstance(ev, Mapping):
            raise invalid_param(f"{at} is {_args.show(ev)}, not a trace entry (a dict)")
        action = ev.get("action")
        if action not in ("alloc", "free_completed"):
            continue
        if "addr" not in ev or "size" not in ev:
            raise invalid_param(f"{at}: an {action!r} entry needs addr and size")
        addr = _int_field(ev["addr"], f"{at}: addr")
        size = _int_field(ev["size"], f"{at}: size", 1 if action == "alloc" else 0)
        raw.append((n, addr, size if action == "alloc" else -size))
    return _pair(raw)


def _compact_events(path: Any) -> list[tuple[str, Any, Any]]:
    """Events from a compact trace file (``.json`` or ``.json.gz``) holding
    ``{"events": [[action, id, size], ...]}``, as ``benches/record_torch_traces.py`` writes (the
    bundled ``benches/traces/*.json.gz``), in the file's order with the file's ids and sizes
    (lists as tuples). Anything else raises InvalidParamError naming the file and the event."""
    name = _files.path_arg(path)
    return _compact_of(_files.read_json(name, 'a compact trace ({"events": [[action, id, size], ...]})'), name)


def _compact_of(data: Any, name: str) -> list[tuple[str, Any, Any]]:
    """The events of a loaded compact trace (see :func:`_compact_events`)."""
    if not isinstance(data, dict) or not isinstance(data.get("events"), list):
        hint = (
            " (a torch.profiler trace: read it with npumem.importers.profiler_trace)"
            if (isinstance(data, dict) and "traceEvents" in data)
            else ""
        )
        raise invalid_param(f'{name}: expected {{"events": [[action, id, size], ...]}}{hint}')
    out = []
    for n, ev in enumerate(data["events"]):
        if not isinstance(ev, list) or len(ev) != 3 or not isinstance(ev[0], str):
            raise invalid_param(f"{name}: events[{n}] is {_args.show(ev)}, not [action, id, size]")
        action, key, size = ev
        out.append((action, tuple(key) if isinstance(key, list) else key, size))
    return out


# -- any format -------------------------------------------------------------------------------

#: The formats :func:`load` tells apart.
FORMATS = ("rmm-csv", "npz", "snapshot", "profiler", "compact-json")


_BOM = b"\xef\xbb\xbf"


def _rmm_header(head: bytes) -> bool:
    """Whether the first line of ``head`` is an RMM log's header (``Thread,Time,Action,...``),
    however a CSV writer spells it: quoted fields, spaces after the commas."""
    line = head.split(b"\n", 1)[0].rstrip(b"\r")
    if b"Thread" not in line:
        return False
    try:
        fields = next(csv.reader([line.decode("utf-8", "replace")], skipinitialspace=True), [])
    except csv.Error:  # a stray carriage return or NUL: not a CSV header
        return False
    return [f.strip() for f in fields[:3]] == ["Thread", "Time", "Action"]


def detect(path: Any) -> str:
    """The format of the trace file at ``path`` (one of :data:`FORMATS`), from its first bytes.
    A UTF-8 byte-order mark is allowed before a CSV or JSON document, and a torch.profiler trace
    may be a JSON object with ``traceEvents`` or a bare array of events (the Trace Event Format's
    two forms)."""
    name = _files.path_arg(path)
    with open(name, "rb") as f:
        head = f.read(512)
    if head.startswith(b"PK"):
        return "npz"
    if head[:1] == b"\x80":
        return "snapshot"
    if _rmm_header(head.removeprefix(_BOM)):
        return "rmm-csv"
    if head.startswith(b"\x1f\x8b"):
        try:
            with gzip.open(name, "rb") as f:
                head = f.read(1 << 16)
        except (OSError, EOFError, zlib.error) as e:
            raise invalid_param(f"{name}: a broken gzip file ({e})") from None
    start = head.removeprefix(_BOM).lstrip()[:1]
    if start == b"{":
        return "profiler" if b'"traceEvents"' in head else "compact-json"
    if start == b"[":
        return "profiler"
    raise invalid_param(
        f"{name}: not a trace npumem reads: expected an RMM log (CSV), an npz trace, a PyTorch memory "
        "snapshot (pickle), a torch.profiler trace or a compact trace (JSON)"
    )


#: What tells a loaded trace's kind: its key, in this order.
_MAPPING_KINDS = (("traceEvents", "profiler"), ("device_traces", "snapshot"), ("events", "compact-json"))


def load(path: Any, *, device_type: int | None = None, device: int = 0) -> Trace:
    """The trace in ``path``, whatever its format (see :func:`detect`), or a loaded PyTorch
    trace: a dict with ``traceEvents`` (a torch.profiler Chrome trace), ``device_traces`` (a
    memory snapshot) or ``events`` (a compact trace). ``device_type`` keeps one device type of a
    torch.profiler trace (0 = CPU, 1 = CUDA, PrivateUse1 for NPUs; by default the type with the
    most memory events); ``device`` picks a snapshot's device (default 0)."""
    device_type = _args.optional_integer(device_type, "device_type", 0, 2**31 - 1)
    device = _args.integer(device, "device", 0, 2**31 - 1)
    if isinstance(path, Mapping):
        name = "the trace"
        kind = next((k for key, k in _MAPPING_KINDS if key in path), None)
        if kind is None:
            raise invalid_param(
                "the trace is a dict without traceEvents (a torch.profiler trace), device_traces (a memory "
                "snapshot) or events (a compact trace)"
            )
    else:
        name = _files.path_arg(path)
        kind = detect(name)
    if device_type is not None and kind != "profiler":
        raise invalid_param(f"device_type applies to torch.profiler traces; {name} is {kind}")
    if device and kind != "snapshot":
        raise invalid_param(f"device applies to memory snapshots; {name} is {kind}")
    if kind == "rmm-csv":
        return read_rmm_csv(name)
    if kind == "npz":
        return read_npz(name)
    source = path if isinstance(path, Mapping) else name
    if kind == "snapshot":
        return Trace.from_events(_snapshot_events(source, device), source=name)
    if kind == "profiler":
        return Trace.from_events(_profiler_events(source, device_type), source=name)
    events = _compact_of(path, name) if isinstance(path, Mapping) else _compact_events(name)
    return Trace.from_events(events, source=name)
