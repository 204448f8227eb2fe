"""Deprecated aliases of trace names that live elsewhere (removed in the next release).

- ``npumem.traces.transformer_training`` and ``npumem.traces.random_churn`` are
  :func:`npumem.workloads.transformer_training` and :func:`npumem.workloads.random_churn`.
- ``npumem.traces.load(path)`` reads a compact trace (``{"events": [[action, id, size], ...]}``)
  as the list of ``(action, id, size)`` tuples in the file; :func:`npumem.formats.load` reads it
  (and every other format) as a :class:`npumem.formats.Trace`.
- Each call emits a ``DeprecationWarning`` and returns what the old name returned.
- Nothing inside npumem imports this module.
"""

from __future__ import annotations

import warnings
from typing import Any

from . import formats, workloads


def _deprecated(name: str, use: str) -> None:
    warnings.warn(f"npumem.traces.{name} is deprecated; use {use}", DeprecationWarning, stacklevel=3)


def transformer_training(**kwargs: Any) -> list[tuple[str, int, int]]:
    """Deprecated: :func:`npumem.workloads.transformer_training`."""
    _deprecated("transformer_training", "npumem.workloads.transformer_training")
    return workloads.transformer_training(**kwargs)


def random_churn(*args: Any, **kwargs: Any) -> list[tuple]:
    """Deprecated: :func:`npumem.workloads.random_churn`."""
    _deprecated("random_churn", "npumem.workloads.random_churn")
    return workloads.random_churn(*args, **kwargs)


def load(path: str) -> list[tuple[str, Any, Any]]:
    """Deprecated: :func:`npumem.formats.load`, which returns a :class:`npumem.formats.Trace`.
    The events of a compact trace file, as ``(action, id, size)`` tuples."""
    _deprecated("load", "npumem.formats.load (it returns a formats.Trace)")
    return formats._compact_events(path)
