"""``torch.npu.memory``: torch_npu's memory API, answered by the npumem device behind ``npu``.

Rules:
- Every function takes ``device`` as torch_npu does (``None`` for the current device, an int, a
  ``torch.device`` or a string) and reads or changes only that device.
- Values are npumem's own counters: ``memory_allocated`` is the bytes of live blocks as the
  chosen allocator rounds them, ``memory_reserved`` the bytes it holds from the device.
- ``memory_stats`` has torch_npu's keys (``allocated_bytes.all.current``, ``num_ooms``, ...),
  sorted, as torch_npu flattens them.
- Snapshots cover every device, as torch_npu's and PyTorch's do (:mod:`..snapshot`: each
  segment tagged with its device, ``device_traces[i]`` for ``npu:i``); ``memory_snapshot`` is the
  ``segments``; ``_snapshot(device)`` with a device given is that device's alone.
"""

from __future__ import annotations

import collections
from typing import Any

from .. import runtime
from .. import snapshot as _snapshots

__all__ = [
    "_dump_snapshot",
    "_record_memory_history",
    "_snapshot",
    "empty_cache",
    "get_per_process_memory_fraction",
    "max_memory_allocated",
    "max_memory_reserved",
    "mem_get_info",
    "memory_allocated",
    "memory_reserved",
    "memory_snapshot",
    "memory_stats",
    "memory_summary",
    "reset_max_memory_allocated",
    "reset_peak_memory_stats",
    "set_per_process_memory_fraction",
]

_FRACTION: dict[int, float] = {}


def _dev(device: Any = None) -> Any:
    return runtime.device(runtime.index_of(device))


def memory_stats(device: Any = None) -> dict[str, int]:
    """The allocator's statistics, torch_npu's keys, sorted."""
    return collections.OrderedDict(sorted(_dev(device).memory_stats().items()))


def memory_allocated(device: Any = None) -> int:
    return _dev(device).memory_allocated()


def max_memory_allocated(device: Any = None) -> int:
    return _dev(device).max_memory_allocated()


def memory_reserved(device: Any = None) -> int:
    return _dev(device).memory_reserved()


def max_memory_reserved(device: Any = None) -> int:
    return _dev(device).max_memory_reserved()


def reset_peak_memory_stats(device: Any = None) -> None:
    _dev(device).reset_peak_memory_stats()


def reset_max_memory_allocated(device: Any = None) -> None:
    _dev(device).reset_peak_memory_stats()


def empty_cache() -> None:
    """Returns the cached, unused blocks of every device to it."""
    for dev in runtime.get().devices:
        dev.empty_cache()


def mem_get_info(device: Any = None) -> tuple[int, int]:
    """``(free, total)`` bytes of the device."""
    free, total = _dev(device).mem_info()
    return free, total


def set_per_process_memory_fraction(fraction: float, device: Any = None) -> None:
    """Caps what the allocator may reserve at ``fraction`` of the capacity (0 to 1)."""
    index = runtime.index_of(device)
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 <= fraction <= 1:
        raise ValueError(f"fraction={fraction!r}: expected a number from 0 to 1")
    runtime.device(index).set_per_process_memory_fraction(float(fraction))
    _FRACTION[index] = float(fraction)


def get_per_process_memory_fraction(device: Any = None) -> float:
    return _FRACTION.get(runtime.index_of(device), 1.0)


def memory_summary(device: Any = None, abbreviated: bool = False) -> str:
    """A readable table of the allocator's state (npumem's ``Device.memory_summary``)."""
    return _dev(device).memory_summary()


def memory_snapshot(mempool_id: Any = None) -> list[dict[str, Any]]:
    """Every device's segments with their blocks (PyTorch's snapshot schema)."""
    if mempool_id is not None:
        raise ValueError(f"mempool_id={mempool_id!r}: memory pools are not supported by npumem.torch")
    return _snapshots.snapshot()["segments"]


def _record_memory_history(
    enabled: str | None = "all", context: Any = "all", stacks: str = "all", max_entries: int = 1_000_000, device=None
) -> None:
    """Starts (``enabled`` not ``None``) or stops recording alloc/free events for ``_snapshot``'s
    ``device_traces`` (no stack frames are recorded)."""
    if enabled not in (None, "state", "all"):
        raise ValueError(f"enabled={enabled!r}: expected None, 'state' or 'all'")
    _dev(device).record_memory_history(enabled is not None, max_entries)


def _snapshot(device: Any = None) -> dict[str, Any]:
    """The whole snapshot (``segments``, ``device_traces``, ...) memory_viz reads: every
    device's, or ``device``'s alone."""
    return _snapshots.snapshot(None if device is None else [runtime.index_of(device)])


def _dump_snapshot(filename: str = "dump_snapshot.pickle") -> None:
    """Pickles every device's :func:`_snapshot` to ``filename`` for PyTorch's memory_viz."""
    _snapshots.dump(filename)
