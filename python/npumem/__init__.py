"""npumem: the memory system of an Ascend-style NPU (VA space, page tables, frames, allocators),
in Rust, driven from Python."""

from __future__ import annotations

from ._native import VA_WINDOW_END, VA_WINDOW_START, __version__, format_size, parse_size
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
    "OutOfMemoryError",
    "Policy",
    "SanitizerError",
    "UnsupportedError",
    "__version__",
    "format_size",
    "parse_size",
]
