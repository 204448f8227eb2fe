"""The ``npu`` device's kernels: PyTorch's CPU kernels run on npumem's memory.

Rules:
- Every ``npu`` tensor an op creates gets its storage from :func:`empty_strided` (one npumem
  allocation each); CPU memory is never handed out as ``npu`` memory.
- Metadata ops (views, ``set_``) run CPU's kernel on the ``npu`` tensor itself: the result keeps
  the ``npu`` key set and storage.
- Every other op runs PyTorch's CPU kernel on zero-copy CPU aliases of its ``npu`` arguments
  (:func:`fallback`): an output that is an argument, or a view of an argument's storage, comes
  back as that ``npu`` tensor or an ``npu`` view of it; a new output is copied into a fresh
  ``npu`` allocation while the inputs are still alive (the order and overlap a device sees);
  an argument the CPU kernel resized onto new storage is moved onto a fresh ``npu`` allocation.
- Out of device memory is :class:`torch.OutOfMemoryError` with torch_npu's message; the device
  is unchanged by the failed allocation.

Note [CPU kernels on device memory]: on npumem's host backend a device pointer is this process's
memory, so a CPU tensor built over it (``storage.host_alias``) lets every CPU kernel compute in
place with no copy in or out; the allocations npumem sees are the ``npu`` storages PyTorch asks
for, sized as PyTorch sizes them. Kernels that keep CPU scratch memory inside one op (workspaces)
use the CPU allocator, as torch_npu's kernels use a separate workspace pool.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ..errors import OutOfMemoryError as _NpumemOOM
from . import oom, peer, runtime, storage

CPU_KEYS = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)
_CPU = torch.device("cpu")
_aten = torch.ops.aten


def map_leaves(fn: Any, x: Any) -> Any:
    """``fn`` on every leaf of ``x`` (an op's arguments or results: values, lists and tuples of
    them); the containers are rebuilt as they were."""
    if isinstance(x, (list, tuple)):
        items = [map_leaves(fn, v) for v in x]
        if type(x) in (list, tuple):
            return type(x)(items)
        return type(x)(*items) if hasattr(type(x), "_fields") else type(x)(items)  # namedtuple, structseq
    return fn(x)


def map_args(args: tuple, kwargs: dict, tensor_fn: Any, device: torch.device) -> tuple[tuple, dict]:
    """An op's arguments with every ``npu`` tensor replaced by ``tensor_fn(tensor)`` and every
    ``npu`` ``torch.device`` by ``device``."""

    def one(x: Any) -> Any:
        if isinstance(x, torch.Tensor) and x.device.type == "npu":
            return tensor_fn(x)
        if isinstance(x, torch.device) and x.type == "npu":
            return device
        return x

    return map_leaves(one, args), ({k: map_leaves(one, v) for k, v in kwargs.items()} if kwargs else kwargs)


def _nbytes(size: Any, stride: Any, itemsize: int) -> int:
    """The storage an ``empty_strided(size, stride)`` needs (PyTorch's computeStorageNbytes)."""
    if any(s == 0 for s in size):
        return 0
    return (1 + sum((s - 1) * st for s, st in zip(size, stride, strict=True))) * itemsize


def empty_strided(size, stride, dtype=None, layout=None, device=None, pin_memory=None):
    """A new ``npu`` tensor over a fresh npumem allocation."""
    dtype = torch.get_default_dtype() if dtype is None else dtype
    size, stride = list(size), list(stride)
    index = runtime.index_of(device)
    nbytes = _nbytes(size, stride, dtype.itemsize)
    dev = runtime.device(index)
    direct = storage.has_dl_type(dtype)
    stream = runtime.stream_of(index)
    try:
        if direct:
            return storage.new_tensor(dev, nbytes, size, stride, dtype, index, stream)
        base = storage.new_tensor(dev, nbytes, [nbytes], [1], torch.uint8, index, stream)
    except _NpumemOOM as e:
        runtime.LAST_OOM = (nbytes, dev.memory_reserved(), index)
        raise torch.OutOfMemoryError(oom.message(dev, index, nbytes, e)) from None
    typed = _aten.view.dtype.redispatch(CPU_KEYS, base, dtype)
    return _aten.as_strided.default.redispatch(CPU_KEYS, typed, size, stride, 0)


def empty_memory_format(size, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    if memory_format in (None, torch.contiguous_format, torch.preserve_format):
        stride = _contiguous(size)
    else:
        stride = torch.empty(size, device="meta", memory_format=memory_format).stride()
    return empty_strided(size, stride, dtype, layout, device, pin_memory)


def _contiguous(size: Any) -> list[int]:
    stride, step = [], 1
    for s in reversed(size):
        stride.append(step)
        step *= max(s, 1)
    return stride[::-1]


def _alias(t: Any) -> Any:
    return storage.host_alias(t) if isinstance(t, torch.Tensor) and t.device.type == "npu" else t


def copy_from(src, dst, non_blocking=False):
    """``_copy_from``: any copy with an ``npu`` side (dtype conversion and broadcasting are the
    CPU kernel's); between two ``npu`` devices, the peer path (:mod:`.peer`)."""
    if src.device != dst.device and src.device.type == dst.device.type:
        return peer.copy(src, dst, move_bytes=True)
    _alias(dst).copy_(_alias(src))
    return dst


def set_geometry(t: torch.Tensor, size, stride, offset: int) -> None:
    """Gives ``t`` this geometry on its own storage (CPU's metadata kernel, no bytes moved)."""
    _aten.as_strided_.default.redispatch(CPU_KEYS, t, list(size), list(stride), offset)


def share(base: torch.Tensor, dtype: Any, size, stride, offset: int) -> torch.Tensor:
    """An ``npu`` tensor of ``dtype`` over ``base``'s storage with this geometry (``offset`` in
    elements of ``dtype``): a view, made without ``base``'s Python storage object where the
    dtype is the same (see :mod:`.storage`)."""
    if dtype == base.dtype:
        return _aten.as_strided.default.redispatch(CPU_KEYS, base, list(size), list(stride), offset)
    fresh = empty_strided([0], [1], dtype, device=base.device)
    return _aten.set_.source_Storage_storage_offset.redispatch(
        CPU_KEYS, fresh, base.untyped_storage(), offset, list(size), list(stride)
    )


def move_onto(t: torch.Tensor, size, stride, offset: int, nbytes: int, keep_bytes: bool = True) -> None:
    """Puts ``t`` on a fresh allocation of ``nbytes`` with the given geometry, keeping the
    bytes its old storage had (up to the smaller size) when ``keep_bytes`` (host mode)."""
    old_ptr, old_nbytes = storage.storage_ptr(t), storage.storage_nbytes(t)
    fresh = empty_strided([nbytes], [1], torch.uint8, device=t.device)
    keep = min(old_nbytes, nbytes) if keep_bytes else 0
    if keep:
        old_bytes = torch.empty(0, dtype=torch.uint8).set_(
            torch._C._construct_storage_from_data_pointer(old_ptr, _CPU, old_nbytes), 0, [keep], [1]
        )
        storage.host_alias(fresh)[:keep].copy_(old_bytes)
    if t.dtype == torch.uint8:
        _aten.set_.source_Tensor.redispatch(CPU_KEYS, t, fresh)
    else:  # set_ takes a tensor of its own dtype: the bytes seen as that dtype
        _aten.set_.source_Tensor.redispatch(CPU_KEYS, t, _aten.view.dtype.redispatch(CPU_KEYS, fresh, t.dtype))
    set_geometry(t, size, stride, offset)


def resize_strides(size: list[int], memory_format: Any) -> list[int]:
    """The strides ``resize_(size, memory_format=...)`` gives."""
    if memory_format in (None, torch.contiguous_format, torch.preserve_format):
        return _contiguous(size)
    return list(torch.empty(size, device="meta", memory_format=memory_format).stride())


def resize_geometry(size: list[int], stride: list[int], offset: int, itemsize: int) -> int:
    """The storage bytes a tensor of this geometry at element ``offset`` needs."""
    return _nbytes(size, stride, itemsize) + (offset * itemsize if math.prod(size) else 0)


def resize_(self, size, memory_format=None):
    size = list(size)
    stride = resize_strides(size, memory_format)
    offset = self.storage_offset()
    needed = resize_geometry(size, stride, offset, self.dtype.itemsize)
    if needed > storage.storage_nbytes(self):
        move_onto(self, size, stride, offset, needed)
    else:
        set_geometry(self, size, stride, offset)
    return self


def copy_from_and_resize(self, dst):
    if dst.size() != self.size():
        resize_(dst, self.size())
    return copy_from(self, dst)


def local_scalar_dense(self):
    return storage.host_alias(self).item()


def redispatch_to_cpu(op: Any) -> Any:
    def kernel(*args, **kwargs):
        return op.redispatch(CPU_KEYS, *args, **kwargs)

    return kernel


#: Ops that only make tensor metadata: CPU's kernel, run on the ``npu`` tensor itself.
METADATA_OPS = (
    "as_strided",
    "view",
    "_reshape_alias",
    "unfold",
    "view_as_real",
    "view_as_complex",
    "set_.source_Storage",
    "set_.source_Storage_storage_offset",
    "set_.source_Tensor",
)


def fallback(op, *args, **kwargs):
    """Any other op: the CPU kernel on zero-copy aliases of the ``npu`` arguments."""
    inputs: list[tuple[torch.Tensor, torch.Tensor, int]] = []
    by_alias: dict[int, torch.Tensor] = {}
    storages: dict[int, torch.Tensor] = {}

    def to_host(x: torch.Tensor) -> torch.Tensor:
        ptr = storage.storage_ptr(x)
        # A storage of no bytes is an out= tensor to be resized (at::empty({0}) then op_out):
        # the CPU kernel gets a resizable CPU tensor, moved onto npu memory afterwards.
        alias = storage.host_alias(x) if ptr else torch.empty_strided(x.size(), x.stride(), dtype=x.dtype)
        inputs.append((x, alias, ptr))
        by_alias[id(alias)] = x
        if ptr:
            storages.setdefault(ptr, x)
        return alias

    host_args, host_kwargs = map_args(args, kwargs, to_host, _CPU)
    out = op(*host_args, **host_kwargs)
    # An argument the CPU kernel resized (an out= tensor) moved onto CPU memory: give it npu memory.
    for t, alias, ptr in inputs:
        if storage.storage_ptr(alias) != ptr and alias.untyped_storage().nbytes():
            moved = alias.untyped_storage()
            move_onto(t, alias.size(), alias.stride(), alias.storage_offset(), moved.nbytes())
            storage.host_alias(t).copy_(alias)
            by_alias[id(alias)] = t

    def to_device(o: Any) -> Any:
        if not isinstance(o, torch.Tensor) or o.device.type != "cpu":
            return o
        same = by_alias.get(id(o))
        if same is not None:
            return same
        ptr = storage.storage_ptr(o)
        base = storages.get(ptr) if ptr else None
        if base is not None:  # a view of an argument's storage
            return share(base, o.dtype, o.size(), o.stride(), o.storage_offset())
        fresh = empty_strided(list(o.size()), list(o.stride()), o.dtype, device=_device_of(inputs))
        if o.numel():
            storage.host_alias(fresh).copy_(o)
        return fresh

    return map_leaves(to_device, out)


def _device_of(inputs: list[tuple[torch.Tensor, torch.Tensor, int]]) -> torch.device:
    return inputs[0][0].device if inputs else torch.device("npu", runtime.current_index())


#: Composite ops that would pick a device-specific path on npu (convolution_overrideable): they
#: take the CPU one.
_DEVICE_PATH_OPS = ("convolution", "convolution_backward")


def cpu_kernel_ops() -> list[str]:
    """Every aten op (``name.overload``) that has a CPU kernel and no npu kernel yet, and the
    device-path composites.

    Note [CPU's dispatch on npu]: an op with a CPU kernel and a composite one (``native_layer_norm``
    has ``layer_norm_cpu`` and ``math_native_layer_norm``) would run the composite on a backend
    without its own kernel, which rounds differently. Registering the fallback for every op that
    has a CPU kernel makes the npu device take exactly CPU's path: the CPU kernel where CPU has
    one, the same composite (decomposed into npu ops) where it has not.
    """
    names = []
    for full in torch._C._dispatch_get_all_op_names():
        if not full.startswith("aten::"):
            continue
        has = torch._C._dispatch_has_kernel_for_dispatch_key
        if has(full, "CPU") and not has(full, "PrivateUse1"):
            names.append(full[len("aten::") :])
    return names + list(_DEVICE_PATH_OPS)


def on_cpu(name: str, every_op: Any) -> Any:
    """``every_op`` (the mode's fallback) for the op ``name`` (``add.Tensor``), its OpOverload
    looked up on first call."""
    base, _, overload = name.partition(".")
    op = None

    def kernel(*args, **kwargs):
        nonlocal op
        if op is None:
            op = getattr(getattr(_aten, base), overload or "default")
        return every_op(op, *args, **kwargs)

    return kernel


#: Host mode's kernels beside the fallback (shape mode has its own, :data:`.shape.KERNELS`).
KERNELS = {
    "_copy_from": copy_from,
    "_copy_from_and_resize": copy_from_and_resize,
    "resize_": resize_,
    "_local_scalar_dense": local_scalar_dense,
}
