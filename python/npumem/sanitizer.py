"""Deprecated alias of :mod:`npumem.errors` for the sanitizer's names (removed in the next release).

- ``npumem.sanitizer.Finding`` and ``npumem.sanitizer.KINDS`` are ``npumem.errors.Finding`` and
  ``npumem.errors.KINDS``; each access emits a ``DeprecationWarning``.
- Nothing inside npumem imports this module.
"""

from __future__ import annotations

import warnings
from typing import Any

from . import errors as _errors

_MOVED = ("Finding", "KINDS")

__all__ = list(_MOVED)


def __getattr__(name: str) -> Any:
    if name in _MOVED:
        warnings.warn(
            f"npumem.sanitizer.{name} is deprecated; use npumem.errors.{name}",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(_errors, name)
    raise AttributeError(f"module 'npumem.sanitizer' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_MOVED))
