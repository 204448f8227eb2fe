"""Byte-size helpers shared by the Python layer."""

from __future__ import annotations

from ._native import format_size, parse_size


def fmt(n: int) -> str:
    """A compact size: ``fmt(2097152) == '2MiB'``, ``fmt(1536) == '1.50KiB'``."""
    return format_size(n).replace(" ", "")


__all__ = ["fmt", "format_size", "parse_size"]
