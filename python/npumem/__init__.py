"""npumem: the memory system of an Ascend-style NPU (VA space, page tables, frames, allocators),
in Rust, driven from Python.

- ``import npumem`` loads the device and its errors; every other module loads on first attribute
  access (``npumem.plan.Problem`` works without an import of its own), as do ``npumem.profiler``
  and ``npumem.profile``, so the package stays quick to import.

Modules by purpose:

- Device and errors: ``device``, ``enums``, ``errors`` (AscendCL errors and sanitizer findings),
  ``units``, ``hostpool``, ``pipelines`` (stream pipelines), ``capi`` (the C ABI through ctypes).
- Traces: ``formats`` (``Trace``, the one form a trace takes; ``load``, the one reader; the
  writers), ``workloads`` (every trace generator), ``replay`` (replays and minimum capacity),
  ``stress`` (adversarial workload search).
- Planning and graphs: ``plan``, ``graph``, ``torch_graphs``.
- Measuring: ``profiling``, ``tlb`` and ``patterns`` (its address patterns), ``kernels``,
  ``sweep``, ``report``.
- Testing: ``testing`` (hypothesis strategies and the allocator state machine).
- Front ends: ``cli`` (``npumem ...``), ``demo``, ``acl`` (a pyACL-compatible layer,
  ``import npumem.acl as acl``; ``python -m npumem.run script.py``).
- Deprecated (removed in the next release): ``sanitizer`` (an alias of ``errors``' ``Finding``
  and ``KINDS``), ``traces`` (of ``workloads``' generators and a compact-trace reader),
  ``importers`` (of ``formats.load`` for PyTorch traces).
"""

from __future__ import annotations

import importlib
from typing import Any

from ._native import VA_WINDOW_END, VA_WINDOW_START, __version__, format_size, parse_size
from ._optional import MissingDependencyError
from .device import Device
from .enums import MemAttr, MemcpyKind, MemPoolAttr, Policy
from .errors import (
    AclError,
    InternalError,
    InvalidHandleError,
    InvalidParamError,
    MemoryFreeError,
    OutOfMemoryError,
    SanitizerError,
    UnsupportedError,
)

__all__ = [
    "VA_WINDOW_END",
    "VA_WINDOW_START",
    "AclError",
    "Device",
    "InternalError",
    "InvalidHandleError",
    "InvalidParamError",
    "MemAttr",
    "MemPoolAttr",
    "MemcpyKind",
    "MemoryFreeError",
    "MissingDependencyError",
    "OutOfMemoryError",
    "Policy",
    "SanitizerError",
    "UnsupportedError",
    "__version__",
    "format_size",
    "parse_size",
]

#: Submodules loaded on first attribute access (PEP 562).
_SUBMODULES = frozenset(
    {
        "acl",
        "capi",
        "cli",
        "demo",
        "device",
        "enums",
        "errors",
        "formats",
        "graph",
        "hostpool",
        "importers",
        "kernels",
        "patterns",
        "pipelines",
        "plan",
        "profiling",
        "replay",
        "report",
        "sanitizer",
        "stress",
        "sweep",
        "testing",
        "tlb",
        "torch_graphs",
        "traces",
        "units",
        "workloads",
    }
)

#: Functions loaded on first use from a submodule: ``npumem.profiler(dev)``, ``@npumem.profile``.
_LAZY_FUNCTIONS = {"profiler": "profiling", "profile": "profiling"}


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f".{name}", __name__)
    if name in _LAZY_FUNCTIONS:
        return getattr(importlib.import_module(f".{_LAZY_FUNCTIONS[name]}", __name__), name)
    raise AttributeError(f"module 'npumem' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | _SUBMODULES | set(_LAZY_FUNCTIONS))
