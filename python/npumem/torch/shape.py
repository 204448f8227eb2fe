"""Shape mode's kernels: ops compute only shapes; the memory is a simulated device's.

Rules:
- An ``npu`` storage is an allocation of an npumem simulated device: no host memory is behind
  it and nothing here reads or writes its bytes (its pointer is never dereferenced).
- An op runs its meta kernel on meta twins of its ``npu`` arguments (same sizes, strides and
  dtype). An output that is an argument (in-place, ``out=``) comes back as that ``npu`` tensor,
  on a fresh allocation when the meta kernel resized it past its storage; an output on a twin's
  storage (a view) is an ``npu`` view of the argument's storage; a new output is a fresh ``npu``
  allocation, made while the inputs are alive, as in host mode.
- An op that needs values (``.item()``, ``nonzero``, printing, copying to the CPU) raises
  :class:`~npumem.torch.errors.ShapeModeError` naming the op, never a made-up value. Any other
  error (mismatched sizes) is the meta kernel's, which reads as the CPU kernel's.
- Copying into ``npu`` memory (``tensor.npu()``, ``model.npu()``) checks the shapes and moves no
  bytes.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import torch

from . import peer
from .errors import shape_mode_error
from .kernels import (
    empty_strided,
    map_args,
    map_leaves,
    move_onto,
    resize_geometry,
    resize_strides,
    set_geometry,
    share,
)
from .storage import storage_nbytes

_META = torch.device("meta")
_aten = torch.ops.aten

#: What a meta kernel says when it would need values: such errors become ShapeModeError.
_NEEDS_DATA = ("cannot be called on meta tensors", "no data", "meta kernel", "data-independent", "Meta tensors")

_TENSOR_STR = os.path.join("torch", "_tensor_str.py")

#: What each data-needing entry point is to a user.
_DATA_USES = {
    "aten::_local_scalar_dense": "Tensor.item(), float(t), int(t), bool(t) and `if t:` read a value",
    "aten::_copy_from": "copying to the CPU (.cpu(), .to('cpu'), .tolist()) reads them",
}


def _no_batch_stats(training_at: int | None) -> Any:
    """BatchNorm out of training: PyTorch's CPU kernel returns no saved mean and inverse std
    (tensors of size 0, no allocation), where the meta kernel (a decomposition) gives them ``C``
    elements."""

    def fix(args: tuple, kwargs: dict, out: Any) -> Any:
        if training_at is not None and kwargs.get("training", args[training_at] if len(args) > training_at else False):
            return out
        return (out[0], out[1].new_empty((0,)), out[2].new_empty((0,)))

    return fix


#: Ops whose meta kernel's outputs differ from the CPU kernel's: the CPU kernel's shapes win, so
#: that shape mode makes host mode's allocations.
_AS_ON_CPU = {
    _aten.native_batch_norm.default: _no_batch_stats(5),
    _aten._native_batch_norm_legit.default: _no_batch_stats(5),
    _aten._native_batch_norm_legit_no_training.default: _no_batch_stats(None),
}


def _twin(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_strided(x.size(), x.stride(), dtype=x.dtype, device=_META)


def _printing() -> bool:
    """Whether PyTorch's tensor printing (``repr``, ``str``, ``print``) is on the stack: its
    formatting calls ops (``masked_select``, ``.item()``) the user never wrote. Looked at only on
    the way to an error."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_filename.endswith(_TENSOR_STR):
            return True
        frame = frame.f_back
    return False


def _data_error(name: str, why: str) -> Exception:
    if _printing():
        return shape_mode_error(f"printing a tensor ({name})", "print(), str() and repr() format its values")
    return shape_mode_error(name, why)


def _needs_data(name: str, e: Exception) -> Exception:
    if isinstance(e, NotImplementedError) or any(s in str(e) for s in _NEEDS_DATA):
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        return _data_error(name, _DATA_USES.get(name, f"its result depends on them (PyTorch: {first[:160]})"))
    return e


def fallback(op, *args, **kwargs):
    """Any op: its meta kernel on twins of the ``npu`` arguments; outputs as the rules say."""
    twins: dict[int, torch.Tensor] = {}
    storages: dict[int, torch.Tensor] = {}
    first: list[torch.Tensor] = []

    def to_meta(x: torch.Tensor) -> torch.Tensor:
        t = _twin(x)
        twins[id(t)] = x
        storages[t.untyped_storage()._cdata] = x
        if not first:
            first.append(x)
        return t

    meta_args, meta_kwargs = map_args(args, kwargs, to_meta, _META)
    try:
        out = op(*meta_args, **meta_kwargs)
    except (NotImplementedError, RuntimeError) as e:
        raise _needs_data(f"aten::{op._schema.name.split('::')[-1]}", e) from None
    fix = _AS_ON_CPU.get(op)
    if fix is not None:
        out = fix(meta_args, meta_kwargs or {}, out)

    def to_device(o: Any) -> Any:
        if not isinstance(o, torch.Tensor) or o.device.type != "meta":
            return o
        same = twins.get(id(o))
        if same is not None:  # in-place or out=: the argument, resized as the meta kernel did
            if same.size() != o.size() or same.stride() != o.stride():
                _resize_geometry(same, list(o.size()), list(o.stride()))
            return same
        base = storages.get(o.untyped_storage()._cdata)
        if base is not None:  # a view of an argument's storage (the twin starts at its offset)
            start = base.storage_offset() * base.element_size() + o.storage_offset() * o.element_size()
            return share(base, o.dtype, o.size(), o.stride(), start // o.element_size())
        dev = first[0].device if first else None
        return empty_strided(list(o.size()), list(o.stride()), o.dtype, device=dev)

    return map_leaves(to_device, out)


def _resize_geometry(t: torch.Tensor, size: list[int], stride: list[int]) -> None:
    """Gives ``t`` this geometry, on a fresh allocation when its storage is too small."""
    offset = t.storage_offset()
    needed = resize_geometry(size, stride, offset, t.element_size())
    if needed > storage_nbytes(t):
        move_onto(t, size, stride, offset, needed, keep_bytes=False)
    else:
        set_geometry(t, size, stride, offset)


def copy_from(src, dst, non_blocking=False):
    """``_copy_from``: into ``npu`` memory, a shape check and no bytes; out of it, an error."""
    if dst.device.type != "npu":
        raise _data_error("aten::_copy_from", _DATA_USES["aten::_copy_from"])
    # copy_'s own checks (broadcastable shapes, dtypes): the meta kernel's, on twins
    source = _twin(src) if src.device.type == "npu" else src.to(_META)
    _twin(dst).copy_(source)
    if src.device != dst.device and src.device.type == "npu":
        peer.copy(src, dst, move_bytes=False)  # its staging allocations, as in host mode
    return dst


def copy_from_and_resize(self, dst):
    if dst.size() != self.size():
        resize_(dst, self.size())
    return copy_from(self, dst)


def resize_(self, size, memory_format=None):
    """``resize_`` without bytes: a fresh allocation when the storage is too small."""
    size = list(size)
    _resize_geometry(self, size, resize_strides(size, memory_format))
    return self


def local_scalar_dense(self):
    raise _data_error("aten::_local_scalar_dense", _DATA_USES["aten::_local_scalar_dense"])


#: The kernels shape mode puts in place of host mode's (see :mod:`npumem.torch.registration`).
KERNELS = {
    "_copy_from": copy_from,
    "_copy_from_and_resize": copy_from_and_resize,
    "resize_": resize_,
    "_local_scalar_dense": local_scalar_dense,
}
