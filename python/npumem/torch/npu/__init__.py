"""``torch.npu``: torch_npu's device module, answered by npumem (registered by
:func:`npumem.torch.install`).

Rules:
- Names and signatures are torch_npu's; only what npumem can answer truthfully is here. Streams
  and events are npumem's (:mod:`.streams`: they pick the allocator's pool and
  order its stream-ordered reuse; ops do not run on them). RNG state per device and
  ``torch.accelerator``'s memory calls are not here (the Python PrivateUse1 route has no C++
  device allocator or stream guard).
- ``npu`` random numbers come from PyTorch's CPU generator (the kernels are CPU's), so
  ``torch.manual_seed`` seeds them and a seeded CPU run draws the same numbers.
"""

from __future__ import annotations

from typing import Any

import torch

from .. import runtime
from . import memory, streams
from .memory import (
    _dump_snapshot,
    _record_memory_history,
    _snapshot,
    empty_cache,
    get_per_process_memory_fraction,
    max_memory_allocated,
    max_memory_reserved,
    mem_get_info,
    memory_allocated,
    memory_reserved,
    memory_snapshot,
    memory_stats,
    memory_summary,
    reset_max_memory_allocated,
    reset_peak_memory_stats,
    set_per_process_memory_fraction,
)
from .streams import Event, Stream, current_stream, default_stream, set_stream, stream

__all__ = [
    "Event",
    "OutOfMemoryError",
    "Stream",
    "_dump_snapshot",
    "_record_memory_history",
    "_snapshot",
    "current_device",
    "current_stream",
    "default_stream",
    "device_count",
    "empty_cache",
    "get_amp_supported_dtype",
    "get_device_name",
    "get_per_process_memory_fraction",
    "is_available",
    "is_initialized",
    "manual_seed",
    "manual_seed_all",
    "max_memory_allocated",
    "max_memory_reserved",
    "mem_get_info",
    "memory",
    "memory_allocated",
    "memory_reserved",
    "memory_snapshot",
    "memory_stats",
    "memory_summary",
    "reset_max_memory_allocated",
    "reset_peak_memory_stats",
    "set_device",
    "set_per_process_memory_fraction",
    "set_stream",
    "stream",
    "streams",
    "synchronize",
]

OutOfMemoryError = torch.OutOfMemoryError


def is_available() -> bool:
    return runtime.RUNTIME is not None


def is_initialized() -> bool:
    return runtime.RUNTIME is not None


def _is_in_bad_fork() -> bool:
    return False


def device_count() -> int:
    return len(runtime.get().devices)


def current_device() -> int:
    return runtime.current_index()


def set_device(device: Any) -> None:
    runtime.get().current = runtime.index_of(device)


def synchronize(device: Any = None) -> None:
    """Waits for the device's queued work (npumem's streams)."""
    runtime.device(runtime.index_of(device)).synchronize_device()


def get_device_name(device: Any = None) -> str:
    dev = runtime.device(runtime.index_of(device))
    return f"npumem {dev.backend} device ({dev.allocator} allocator)"


def get_amp_supported_dtype() -> list[torch.dtype]:
    return [torch.float16, torch.bfloat16]


def manual_seed(seed: int) -> None:
    """Kept for torch_npu's programs: ``npu`` ops draw from the CPU generator, which
    ``torch.manual_seed`` seeds."""


def manual_seed_all(seed: int) -> None:
    """As :func:`manual_seed`."""
