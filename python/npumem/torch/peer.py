"""Copies between two ``npu`` devices (``tensor.to("npu:1")``): npumem's peer path, the one
``acl.rt.memcpy`` between two devices takes (``Device._copy_to_peer``).

Rules:
- When source and destination have the same dtype, sizes and strides and are dense, the bytes
  move in one peer copy of that span. Otherwise the copy stages as PyTorch's copy between two
  CUDA devices does (``copy_kernel_cuda``, aten/src/ATen/native/cuda/Copy.cu): the source made
  contiguous on its own device (a temporary there unless it is already), one peer copy into the
  destination, or into a contiguous temporary of the source's dtype on the destination's device
  when the destination is not contiguous or of another dtype, which is then copied into it there
  (the dtype conversion happens on the destination's device).
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
    if _dense_alike(src, dst):
        if move_bytes and src.numel():
            a, b = runtime.device(src.device.index), runtime.device(dst.device.index)
            a._copy_to_peer(src.data_ptr(), b, dst.data_ptr(), src.numel() * src.element_size())
        return dst
    into = (
        dst
        if dst.is_contiguous() and src.dtype == dst.dtype
        else torch.empty(dst.size(), dtype=src.dtype, device=dst.device)
    )
    copy(src.expand_as(dst).contiguous(), into, move_bytes)
    if into is not dst:
        dst.copy_(into)
    return dst
