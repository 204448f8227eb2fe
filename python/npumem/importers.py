"""Importers: allocation traces from PyTorch, as npumem replay events.

- ``profiler_trace``: a Chrome trace exported by ``torch.profiler`` with ``profile_memory=True``
  (``prof.export_chrome_trace(path)``). Its ``[memory]`` instant events carry ``Addr`` and
  ``Bytes`` (positive for an allocation, negative for a free) per device; they are the real
  alloc/free sequence of the profiled program, on the CPU as on an accelerator.
- ``snapshot_trace``: the ``device_traces`` of a PyTorch memory snapshot
  (``torch.cuda.memory._snapshot()`` or a pickle from ``_dump_snapshot``), or of npumem's own
  ``Device.memory_snapshot()``. Pickles are loaded with a restricted unpickler that admits only
  plain data (dicts, lists, tuples, strings, numbers, booleans, None): a crafted file cannot run
  code; one that refers to anything else is refused with InvalidParamError.

Malformed input (a trace that is not an object, events of the wrong shape, non-integer
addresses or sizes, JSON nested past the parser's depth) raises InvalidParamError naming the
file and the event; a file that cannot be opened raises OSError. The compact traces in
``benches/traces/`` (``{"events": [...]}``, as ``benches/record_torch_traces.py`` saves them) are
read by :func:`npumem.traces.load`, not here.

Both return ``[("alloc", id, size) | ("free", id, size)]`` for :func:`npumem.replay.replay`. Ids
are ``(address, n)``: the n-th allocation at that address, so reuse of an address is kept apart.
Frees of memory allocated before the trace began are dropped; allocations still live at the end
stay live (replay frees them).

How to record one on the CPU (no accelerator needed)::

    import torch
    from torch.profiler import profile, ProfilerActivity
    model = torch.nn.TransformerEncoder(torch.nn.TransformerEncoderLayer(256, 4), 4)
    opt = torch.optim.Adam(model.parameters())
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        for _ in range(3):
            loss = model(torch.randn(64, 16, 256)).square().mean()
            loss.backward(); opt.step(); opt.zero_grad()
    prof.export_chrome_trace("trace.json")

then ``events = npumem.importers.profiler_trace("trace.json")``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from . import _args, _files
from .errors import invalid_param

Event = tuple[str, Any, int]


def _load_json(source: str | Path | Mapping[str, Any]) -> tuple[Mapping[str, Any], str]:
    """The trace and how to name it in messages."""
    if isinstance(source, Mapping):
        return source, "the trace"
    name = _files.path_arg(source, "source")
    trace = _files.read_json(name, "a torch.profiler Chrome trace")
    if not isinstance(trace, Mapping):
        raise invalid_param(f"{name}: a Chrome trace is a JSON object, got {type(trace).__name__}")
    return trace, name


def _compact_hint(trace: Mapping[str, Any], where: str) -> None:
    """Points at npumem.traces.load for the compact traces that benches/record_torch_traces.py saves."""
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


def _pair(raw: Iterable[tuple[int, int, int]]) -> list[Event]:
    """(timestamp, address, signed bytes) records → alloc/free events with unique ids."""
    events: list[Event] = []
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


def profiler_trace(source: str | Path | Mapping[str, Any], *, device_type: int | None = None) -> list[Event]:
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


def snapshot_trace(source: str | Path | Mapping[str, Any], *, device: int = 0) -> list[Event]:
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
