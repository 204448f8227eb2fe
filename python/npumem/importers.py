"""Deprecated aliases of the PyTorch trace readers (removed in the next release):
:func:`npumem.formats.load` reads torch.profiler Chrome traces and memory snapshots (paths or
loaded dicts) as a :class:`npumem.formats.Trace`.

- ``profiler_trace(source, device_type=None)`` and ``snapshot_trace(source, device=0)`` return
  the ``[("alloc", id, size) | ("free", id, size)]`` events they always returned, with ids
  ``(address, n)``: the n-th allocation at that address.
- Each call emits a ``DeprecationWarning``.
- Nothing inside npumem imports this module.
"""

from __future__ import annotations

import warnings
from typing import Any

from . import formats

Event = tuple[str, Any, int]


def _deprecated(name: str, use: str) -> None:
    warnings.warn(f"npumem.importers.{name} is deprecated; use {use}", DeprecationWarning, stacklevel=3)


def profiler_trace(source: Any, *, device_type: int | None = None) -> list[Event]:
    """Deprecated: ``npumem.formats.load(source, device_type=...)``. Alloc/free events from a
    ``torch.profiler`` Chrome trace (a path, ``.json.gz``, or the loaded dict)."""
    _deprecated("profiler_trace", "npumem.formats.load(source, device_type=...)")
    return formats._profiler_events(source, device_type)


def snapshot_trace(source: Any, *, device: int = 0) -> list[Event]:
    """Deprecated: ``npumem.formats.load(source, device=...)``. Alloc/free events from the
    ``device_traces`` of a PyTorch (or npumem) memory snapshot (a pickle's path or the dict)."""
    _deprecated("snapshot_trace", "npumem.formats.load(source, device=...)")
    return formats._snapshot_events(source, device)
