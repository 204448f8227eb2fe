"""libnpumem: npumem's allocators as a C library, for frameworks that load a pluggable allocator.

``make build`` builds ``libnpumem.so`` and puts it, with its header ``npumem.h``, inside this
package. Switching PyTorch to npumem is then::

    import torch, npumem
    a = torch.cuda.memory.CUDAPluggableAllocator(npumem.capi.library_path(), "npumem_malloc", "npumem_free")
    torch.cuda.memory.change_current_allocator(a)

(torch_npu: ``torch_npu.npu.NPUPluggableAllocator(...)`` and
``torch_npu.npu.memory.change_current_allocator(a)``.) The library reads ``NPUMEM_BACKEND``
(``host``, the default: real memory; ``sim``: simulated addresses that must not be
dereferenced), ``NPUMEM_ALLOCATOR``, ``NPUMEM_ALLOC_CONF`` and ``NPUMEM_CAPACITY`` from the
environment at its first call; the header documents every function.

:func:`load` opens the library with ctypes, every prototype declared, for C-level use from
Python; :func:`device_stats` reads a device's statistics under ``memory_stats()``'s keys and
:func:`check` raises the calling thread's last error as an :class:`npumem.AclError`.
"""

from __future__ import annotations

import ctypes
import functools
import re
from pathlib import Path

from . import _args
from .errors import _from_native

LIBRARY_NAME = "libnpumem.so"
HEADER_NAME = "npumem.h"
#: Device indices the library accepts: ``0 .. MAX_DEVICES - 1`` (``NPUMEM_MAX_DEVICES``).
MAX_DEVICES = 64

_HERE = Path(__file__).resolve().parent


def _shipped(name: str) -> str:
    path = _HERE / name
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: `make build` builds libnpumem and copies it into the package")
    return str(path)


def library_path() -> str:
    """The path of ``libnpumem.so``, for ``CUDAPluggableAllocator(path, "npumem_malloc", "npumem_free")``."""
    return _shipped(LIBRARY_NAME)


def header_path() -> str:
    """The path of ``npumem.h``, the library's C header."""
    return _shipped(HEADER_NAME)


class Stat(ctypes.Structure):
    """``npumem_stat_t`` (PyTorch's ``Stat``)."""

    _fields_ = [(part, ctypes.c_int64) for part in ("current", "peak", "allocated", "freed")]


#: The ``StatArray`` fields of ``npumem_device_stats_t``, in order; index 0 all, 1 small pool, 2 large pool.
STAT_ARRAYS = (
    "allocation",
    "segment",
    "active",
    "inactive_split",
    "allocated_bytes",
    "reserved_bytes",
    "active_bytes",
    "inactive_split_bytes",
    "requested_bytes",
)
POOLS = ("all", "small_pool", "large_pool")


class DeviceStats(ctypes.Structure):
    """``npumem_device_stats_t``: PyTorch's ``DeviceStats`` fields, then npumem's own."""

    _fields_ = [
        *((name, Stat * 3) for name in STAT_ARRAYS),
        ("num_alloc_retries", ctypes.c_int64),
        ("num_ooms", ctypes.c_int64),
        ("oversize_allocations", Stat),
        ("oversize_segments", Stat),
        ("num_sync_all_streams", ctypes.c_int64),
        ("num_device_alloc", ctypes.c_int64),
        ("num_device_free", ctypes.c_int64),
        ("num_oom_rejections", ctypes.c_int64),
        ("max_split_size", ctypes.c_int64),
        ("num_cache_misses", ctypes.c_int64),
    ]

    def as_dict(self) -> dict[str, int]:
        """The figures under ``Device.memory_stats()``'s (PyTorch's) keys."""
        out: dict[str, int] = {}

        def put(prefix: str, s: Stat) -> None:
            for part in ("current", "peak", "allocated", "freed"):
                out[f"{prefix}.{part}"] = getattr(s, part)

        for name in STAT_ARRAYS:
            for i, pool in enumerate(POOLS):
                put(f"{name}.{pool}", getattr(self, name)[i])
        put("oversize_allocations", self.oversize_allocations)
        put("oversize_segments", self.oversize_segments)
        for name in (
            "num_alloc_retries",
            "num_ooms",
            "num_sync_all_streams",
            "num_device_alloc",
            "num_device_free",
            "num_cache_misses",
            "max_split_size",
        ):
            out[name] = getattr(self, name)
        return out


_PROTOTYPES: dict[str, tuple[object, list[object]]] = {
    "npumem_malloc": (ctypes.c_void_p, [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]),
    "npumem_free": (None, [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]),
    "npumem_record_stream": (None, [ctypes.c_void_p, ctypes.c_void_p]),
    "npumem_init": (None, [ctypes.c_int]),
    "npumem_empty_cache": (None, []),
    "npumem_reset": (None, [ctypes.c_bool]),
    "npumem_set_memory_fraction": (None, [ctypes.c_double, ctypes.c_int]),
    "npumem_get_device_stats": (ctypes.c_int, [ctypes.c_int, ctypes.POINTER(DeviceStats), ctypes.c_size_t]),
    "npumem_reset_peak_stats": (None, [ctypes.c_int8]),
    "npumem_last_error": (ctypes.c_char_p, []),
    "npumem_last_error_code": (ctypes.c_int, []),
}


def load(path: str | None = None) -> ctypes.CDLL:
    """Opens libnpumem (the shipped one unless ``path`` is given) with every function's
    ``argtypes`` and ``restype`` set. A process holds one copy of the library, configured by the
    environment at its first call."""
    return _load(library_path() if path is None else _args.text(path, "path"))


@functools.cache
def _load(path: str) -> ctypes.CDLL:
    lib = ctypes.CDLL(path)
    for name, (restype, argtypes) in _PROTOTYPES.items():
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes
    return lib


_CODE_NAME = re.compile(r"(ACL_ERROR_[A-Z0-9_]+) \(\d+\): ")


def check(lib: ctypes.CDLL) -> None:
    """Raises the calling thread's last libnpumem error as the matching :class:`npumem.AclError`
    subclass (``MemoryFreeError``, ``OutOfMemoryError``, ...); returns if the last call succeeded."""
    text = lib.npumem_last_error()
    if text is None:
        return
    message = text.decode("utf-8", "replace")
    found = _CODE_NAME.search(message)
    name = found.group(1) if found else "ACL_ERROR"
    if found:
        message = message[: found.start()] + message[found.end() :]
    raise _from_native(lib.npumem_last_error_code(), name, message)


def device_stats(lib: ctypes.CDLL, device: int = 0) -> dict[str, int]:
    """Device ``device``'s statistics through ``npumem_get_device_stats``, under
    ``memory_stats()``'s keys."""
    device = _args.integer(device, "device", 0, MAX_DEVICES - 1)
    stats = DeviceStats()
    if lib.npumem_get_device_stats(device, ctypes.byref(stats), ctypes.sizeof(stats)) != 0:
        check(lib)
    return stats.as_dict()
