"""Copies between two ``npu`` devices (``tensor.to("npu:1")``): npumem's peer path, the one
``acl.rt.memcpy`` between two devices takes (``Device._copy_to_peer``).

Rules:
- When source and destination have the same dtype, sizes and strides and are dense, the bytes
  move in one peer copy of that span. Otherwise the source is first made dense in the
  destination's dtype and sizes on its own device (a temporary allocation there), and a
  destination that is not dense is written through a dense temporary on its device, as a copy
  between two CUDA devices stages through contiguous buffers.
- In shape mode no bytes move (simulated memory has none); the allocations are the same.
"""

from __future__ import annotations

import torch

from . import runtime


def _dense(t: torch.Tensor) -> bool:
    """Whether ``t``'s elements fill one span of memory exactly (any order of dimensions)."""
    if t.numel() == 0:
        return True
    step = 1
    for stride, size in sorted((st, s) for s, st in zip(t.size(), t.stride(), strict=True) if s != 1):
        if stride != step:
            return False
        step *= size
    return True


def _dense_alike(src: torch.Tensor, dst: torch.Tensor) -> bool:
    return src.dtype == dst.dtype and src.size() == dst.size() and src.stride() == dst.stride() and _dense(dst)


def copy(src: torch.Tensor, dst: torch.Tensor, move_bytes: bool) -> torch.Tensor:
    """Copies the ``npu`` tensor ``src`` into ``dst`` on another ``npu`` device."""
    if not _dense(dst):
        dense = torch.empty(dst.size(), dtype=dst.dtype, device=dst.device)
        copy(src, dense, move_bytes)
        dst.copy_(dense)
        return dst
    if not _dense_alike(src, dst):
        staged = torch.empty_strided(dst.size(), dst.stride(), dtype=dst.dtype, device=src.device)
        staged.copy_(src)
        src = staged
    if move_bytes and src.numel():
        a, b = runtime.device(src.device.index), runtime.device(dst.device.index)
        a._copy_to_peer(src.data_ptr(), b, dst.data_ptr(), src.numel() * src.element_size())
    return dst
