"""The out-of-memory message of the ``npu`` device, worded as torch_npu's caching allocator's.

Rules:
- The message reads like torch_npu's ("NPU out of memory. Tried to allocate ... (NPU 0; ...
  total capacity; ... already allocated; ... current active; ... free; ... reserved in total by
  PyTorch)"), sizes in PyTorch's format (``20.00 MiB``), then npumem's own diagnosis.
- Building it only reads the device's counters.
"""

from __future__ import annotations

from typing import Any


def format_size(nbytes: int) -> str:
    """A size as PyTorch's allocators print it: bytes, then KiB/MiB/GiB with two decimals."""
    if nbytes < 1 << 10:
        return f"{nbytes} bytes"
    for unit, shift in (("KiB", 10), ("MiB", 20)):
        if nbytes < 1 << (shift + 10):
            return f"{nbytes / (1 << shift):.2f} {unit}"
    return f"{nbytes / (1 << 30):.2f} GiB"


def message(device: Any, index: int, nbytes: int, error: Exception) -> str:
    """torch_npu's wording for a failed allocation of ``nbytes`` on ``npu:index``."""
    stats = device.memory_stats()
    free, total = device.mem_info()
    detail = getattr(error, "message", str(error))
    return (
        f"NPU out of memory. Tried to allocate {format_size(nbytes)} (NPU {index}; "
        f"{format_size(total)} total capacity; {format_size(stats['allocated_bytes.all.current'])} already "
        f"allocated; {format_size(stats['active_bytes.all.current'])} current active; {format_size(free)} free; "
        f"{format_size(stats['reserved_bytes.all.current'])} reserved in total by PyTorch) If reserved memory is "
        ">> allocated memory try setting max_split_size_mb to avoid fragmentation. "
        f"npumem ({device.allocator} allocator): {detail}"
    )
