"""Storages of ``npu`` tensors: npumem allocations handed to PyTorch through DLPack.

Rules:
- Every byte of an ``npu`` storage is one npumem allocation of exactly the storage's size
  (``Device.malloc(nbytes)``); a storage of 0 bytes has no allocation and a null pointer, as on
  PyTorch's caching allocators.
- The allocation is freed when PyTorch drops the storage (the DLPack deleter), never before:
  :data:`_LIVE` keeps each capsule's C structures alive until then.
- :func:`host_alias` views an ``npu`` tensor's bytes as a CPU tensor without copying; it is
  valid only on the host backend (real pointers) and only while the ``npu`` tensor lives.
- Nothing here asks an ``npu`` tensor for its Python storage object (``untyped_storage()``):
  PyTorch keeps such an object alive with the storage, which raises the storage's use count, and
  autograd accumulates a gradient in place only when that count is 1. :func:`storage_ptr` and
  :func:`storage_nbytes` answer from the tensor and :data:`_NBYTES`, so the allocations are a
  device's, op for op.

Note [DLPack storages]: ``torch.from_dlpack`` maps ``kDLExtDev`` to PrivateUse1 and builds the
tensor with ``at::from_blob`` and a deleter that calls the capsule's, so the tensor's data
pointer is npumem's address and its death frees it, with no C++ compiled against torch. The
capsule is built with ctypes (the DLPack 0.x ``DLManagedTensor``, which PyTorch still reads).
"""

from __future__ import annotations

import ctypes
import itertools
import threading
from typing import Any

import torch

#: DLPack's device type for a device outside its list: PyTorch reads it as PrivateUse1.
_KDL_EXT_DEV = 12
_KDL_UINT = 1


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class _DLManagedTensor(ctypes.Structure):
    pass


_DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(_DLManagedTensor))
_DLManagedTensor._fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", _DELETER)]

_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]

#: Capsule key -> (managed tensor, its shape array, device, pointer): alive until PyTorch's deleter.
_LIVE: dict[int, tuple[Any, Any, Any, int]] = {}
#: Pointer of a live npu storage -> its bytes.
_NBYTES: dict[int, int] = {}
_LOCK = threading.Lock()
_KEYS = itertools.count(1)


@_DELETER
def _delete(managed: Any) -> None:
    key = managed.contents.manager_ctx
    with _LOCK:
        entry = _LIVE.pop(key, None)
        if entry is not None:
            _NBYTES.pop(entry[3], None)
    if entry is not None and entry[3]:
        entry[2].free(entry[3])


#: DLPack's (type code, bits) of the dtypes it names; any other dtype is made as bytes and viewed.
_DL_TYPES = {
    torch.float16: (2, 16),
    torch.float32: (2, 32),
    torch.float64: (2, 64),
    torch.bfloat16: (4, 16),
    torch.int8: (0, 8),
    torch.int16: (0, 16),
    torch.int32: (0, 32),
    torch.int64: (0, 64),
    torch.uint8: (_KDL_UINT, 8),
    torch.uint16: (_KDL_UINT, 16),
    torch.uint32: (_KDL_UINT, 32),
    torch.uint64: (_KDL_UINT, 64),
    torch.bool: (6, 8),
    torch.complex64: (5, 64),
    torch.complex128: (5, 128),
}


def has_dl_type(dtype: torch.dtype) -> bool:
    return dtype in _DL_TYPES


def new_tensor(
    device: Any, nbytes: int, size: list[int], stride: list[int], dtype: Any, index: int = 0, stream: int | None = None
) -> torch.Tensor:
    """An ``npu:index`` tensor of ``size``, ``stride`` and ``dtype`` (one DLPack names) over a
    fresh npumem allocation of ``nbytes`` (the storage those need) from ``device``, which raises
    npumem's ``OutOfMemoryError`` when it cannot; on the npumem ``stream`` (None: the default)."""
    ptr = device.malloc(nbytes, stream=stream) if nbytes else 0
    ndim = len(size)
    dims = (ctypes.c_int64 * (2 * ndim))(*size, *stride)
    managed = _DLManagedTensor()
    t = managed.dl_tensor
    t.data = ptr or None
    t.device = _DLDevice(_KDL_EXT_DEV, index)
    t.ndim = ndim
    t.dtype = _DLDataType(*_DL_TYPES[dtype], 1)
    t.shape = ctypes.cast(dims, ctypes.POINTER(ctypes.c_int64))
    t.strides = ctypes.cast(ctypes.byref(dims, 8 * ndim), ctypes.POINTER(ctypes.c_int64))
    key = next(_KEYS)
    managed.manager_ctx = key
    managed.deleter = _delete
    with _LOCK:
        _LIVE[key] = (managed, dims, device, ptr)
        if ptr:
            _NBYTES[ptr] = nbytes
    try:
        return torch._C._from_dlpack(_capsule_new(ctypes.addressof(managed), b"dltensor", None))
    except BaseException:
        with _LOCK:
            _LIVE.pop(key, None)
            _NBYTES.pop(ptr, None)
        if ptr:
            device.free(ptr)
        raise


def live_allocations() -> int:
    """How many npumem allocations ``npu`` storages hold now."""
    with _LOCK:
        return sum(1 for entry in _LIVE.values() if entry[3])


_CPU = torch.device("cpu")


def storage_ptr(tensor: torch.Tensor) -> int:
    """The address of the tensor's storage (0 for a storage of no bytes)."""
    return tensor.data_ptr() - tensor.storage_offset() * tensor.element_size()


def storage_nbytes(tensor: torch.Tensor) -> int:
    """The bytes of an ``npu`` tensor's storage."""
    ptr = storage_ptr(tensor)
    return _NBYTES.get(ptr, 0) if ptr else 0


def host_alias(tensor: torch.Tensor) -> torch.Tensor:
    """A CPU tensor over the same bytes as the ``npu`` ``tensor`` (same dtype, sizes, strides,
    offset): no copy."""
    offset, item = tensor.storage_offset(), tensor.element_size()
    reach = 1 + sum((s - 1) * st for s, st in zip(tensor.size(), tensor.stride(), strict=True))
    nbytes = (offset + reach) * item if tensor.numel() else 0
    cpu = torch._C._construct_storage_from_data_pointer(storage_ptr(tensor), _CPU, nbytes)
    return torch.empty(0, dtype=tensor.dtype).set_(cpu, offset, tensor.size(), tensor.stride())
