"""Importers: allocation traces from PyTorch, as npumem replay events.

- ``profiler_trace``: a Chrome trace exported by ``torch.profiler`` with ``profile_memory=True``
  (``prof.export_chrome_trace(path)``). Its ``[memory]`` instant events carry ``Addr`` and
  ``Bytes`` (positive for an allocation, negative for a free) per device; they are the real
  alloc/free sequence of the profiled program, on the CPU as on an accelerator.
- ``snapshot_trace``: the ``device_traces`` of a PyTorch memory snapshot
  (``torch.cuda.memory._snapshot()`` or a pickle from ``_dump_snapshot``), or of npumem's own
  ``Device.memory_snapshot()``.

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

import gzip
import json
import pickle
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from .errors import invalid_param

Event = tuple[str, Any, int]


def _load_json(source: str | Path | Mapping[str, Any]) -> Mapping[str, Any]:
    if isinstance(source, Mapping):
        return source
    path = Path(source)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return json.load(f)


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
    trace = _load_json(source)
    records: dict[int, list[tuple[int, int, int]]] = {}
    for ev in trace.get("traceEvents", []):
        if ev.get("name") != "[memory]":
            continue
        args = ev.get("args", {})
        try:
            addr, delta = int(args["Addr"]), int(args["Bytes"])
        except (KeyError, TypeError, ValueError):
            continue
        ts = int(float(ev.get("ts", 0)) * 1000)
        records.setdefault(int(args.get("Device Type", 0)), []).append((ts, addr, delta))
    if not records:
        raise invalid_param(
            "the trace has no [memory] events; record it with torch.profiler.profile(profile_memory=True)"
        )
    kind = device_type if device_type is not None else max(records, key=lambda k: len(records[k]))
    if kind not in records:
        raise invalid_param(f"the trace has no memory events for device type {kind}; it has {sorted(records)}")
    return _pair(records[kind])


def snapshot_trace(source: str | Path | Mapping[str, Any], *, device: int = 0) -> list[Event]:
    """Alloc/free events from the ``device_traces`` of a PyTorch (or npumem) memory snapshot:
    the dict, or the path of a pickle written by ``_dump_snapshot``."""
    if isinstance(source, Mapping):
        snap = source
    else:
        with open(source, "rb") as f:
            snap = pickle.load(f)
    traces = snap.get("device_traces") or []
    if device >= len(traces):
        raise invalid_param(f"the snapshot has traces for {len(traces)} devices; device {device} is not one")
    raw = []
    for n, ev in enumerate(traces[device]):
        action = ev.get("action")
        if action == "alloc":
            raw.append((n, int(ev["addr"]), int(ev["size"])))
        elif action == "free_completed":
            raw.append((n, int(ev["addr"]), -int(ev["size"])))
    return _pair(raw)
