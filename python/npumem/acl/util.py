"""``acl.util``: pointers to Python data and NumPy views of pointers, as pyACL's.

``bytes_to_ptr`` points inside the bytes object (no copy; the object must outlive the pointer,
and copies may write into it, as pyACL programs do); ``ptr_to_bytes`` copies; ``ptr_to_numpy`` is
a zero-copy, writeable view (read-only over read-only memory); ``numpy_to_ptr`` is the array's
data address. Device pointers of the simulator are not process memory: the calls that read or
view memory refuse them (ValueError) rather than touch an address that holds nothing, and so
are memory that is not mapped or may not be read (``PROT_NONE``).
"""

from __future__ import annotations

import ctypes
import warnings
from typing import Any

import numpy as np

from ._runtime import LOCK, RT, host_access, host_mapped, host_view

__all__ = ["bytes_to_ptr", "numpy_contiguous_to_ptr", "numpy_to_ptr", "ptr_to_bytes", "ptr_to_numpy"]

#: NumPy's C type numbers (``NPY_TYPES``) that ptr_to_numpy takes.
NPY_TYPES: dict[int, np.dtype] = {
    0: np.dtype(np.bool_),
    1: np.dtype(np.int8),
    2: np.dtype(np.uint8),
    3: np.dtype(np.int16),
    4: np.dtype(np.uint16),
    5: np.dtype(np.int32),
    6: np.dtype(np.uint32),
    7: np.dtype(np.int64),
    8: np.dtype(np.uint64),
    9: np.dtype(np.longlong),
    10: np.dtype(np.ulonglong),
    11: np.dtype(np.float32),
    12: np.dtype(np.float64),
    23: np.dtype(np.float16),
}


def _array(value: Any, fn: str) -> np.ndarray:
    if not isinstance(value, np.ndarray):
        raise TypeError(f"acl.util.{fn}: expected a numpy.ndarray, got {type(value).__name__}")
    return value


def numpy_to_ptr(array: Any) -> int:
    """The address of the array's data (no copy). Deprecated in pyACL, as here."""
    arr = _array(array, "numpy_to_ptr")
    warnings.warn("acl.util.numpy_to_ptr will be deprecated; use numpy_contiguous_to_ptr", Warning, stacklevel=2)
    if not arr.flags.c_contiguous:
        warnings.warn("acl.util.numpy_to_ptr: the array is not contiguous", Warning, stacklevel=2)
    return int(arr.__array_interface__["data"][0])


def numpy_contiguous_to_ptr(array: Any) -> tuple[int, np.ndarray]:
    """``(ptr, contiguous_array)``: keep the array returned as long as the pointer is used."""
    arr = np.ascontiguousarray(_array(array, "numpy_contiguous_to_ptr"))
    return int(arr.__array_interface__["data"][0]), arr


def bytes_to_ptr(data: Any) -> int:
    """The address of the bytes inside ``data`` (a bytes object), no copy."""
    if not isinstance(data, bytes):
        raise ValueError(f"acl.util.bytes_to_ptr: expected bytes, got {type(data).__name__}")
    return ctypes.cast(ctypes.c_char_p(data), ctypes.c_void_p).value or 0


def _host(ptr: Any, nbytes: int, fn: str) -> int:
    """``ptr`` as an int, once ``nbytes`` there are readable host memory (ValueError otherwise)."""
    if isinstance(ptr, bool) or not isinstance(ptr, (int, np.integer)):
        raise TypeError(f"acl.util.{fn}: ptr must be int, got {type(ptr).__name__}")
    p = int(ptr)
    with LOCK:
        d = RT.sys().locate(p) if RT.system is not None or RT.config is not None else None
        if d is not None and RT.sys().config.backend == "sim":
            raise ValueError(
                f"acl.util.{fn}: {p:#x} is device memory of simulated device {d}, not host memory; copy it to a "
                "malloc_host buffer with acl.rt.memcpy first"
            )
    if nbytes and not host_mapped(p, nbytes):
        raise ValueError(f"acl.util.{fn}: {nbytes} bytes at {p:#x} are not mapped host memory")
    if nbytes and not host_access(p, nbytes):
        raise ValueError(f"acl.util.{fn}: {nbytes} bytes at {p:#x} are mapped without read access (PROT_NONE)")
    return p


def ptr_to_bytes(ptr: Any, size: Any) -> bytes:
    """A copy of ``size`` bytes of host memory at ``ptr``."""
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 0:
        raise TypeError(f"acl.util.ptr_to_bytes: size must be a non-negative int, got {size!r}")
    p = _host(ptr, int(size), "ptr_to_bytes")
    return ctypes.string_at(p, int(size)) if size else b""


def ptr_to_numpy(ptr: Any, shape: Any, npy_type: Any) -> np.ndarray:
    """A writeable array of ``shape`` and NumPy type number ``npy_type`` over the memory at ``ptr``
    (no copy: writes land in that memory; read-only when the memory is)."""
    if not isinstance(shape, tuple) or not all(isinstance(d, (int, np.integer)) and d >= 0 for d in shape):
        raise TypeError(f"acl.util.ptr_to_numpy: shape must be a tuple of non-negative ints, got {shape!r}")
    if isinstance(npy_type, bool) or not isinstance(npy_type, (int, np.integer)):
        raise TypeError(f"acl.util.ptr_to_numpy: npy_type must be an int, got {npy_type!r}")
    dtype = NPY_TYPES.get(int(npy_type))
    if dtype is None:
        raise ValueError(f"acl.util.ptr_to_numpy: type number {npy_type} is not one of {sorted(NPY_TYPES)}")
    count = int(np.prod(shape, dtype=np.uint64)) if shape else 1
    nbytes = count * dtype.itemsize
    p = _host(ptr, nbytes, "ptr_to_numpy")
    if nbytes == 0:
        return np.empty(shape, dtype)
    view = np.frombuffer(host_view(p, nbytes), dtype=dtype, count=count).reshape(shape)
    if not host_access(p, nbytes, write=True):
        view.flags.writeable = False  # read-only memory: a write through the view would fault
    return view
