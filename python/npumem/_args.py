"""Argument checks shared by the Python surface.

Every public function of the package checks its arguments with these before it acts, so that a
bad argument never reaches numpy or the native module as something they fail on in their own
words (a ``ZeroDivisionError``, an ``OverflowError``, a ``SystemError``). Invariants:

- a value of the wrong type raises ``TypeError``; a value of the right type outside what is
  accepted raises :class:`npumem.InvalidParamError` (``ACL_ERROR_INVALID_PARAM``, a ``ValueError``);
- every message names the argument, shows the value (shortened when long) and says what is
  accepted;
- nothing is allocated or changed before the checks pass; ``bool`` is never taken for an int.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Iterable, Mapping, Sequence
from enum import IntEnum
from typing import Any

import numpy as np

from ._native import DeviceBuffer
from .errors import InvalidParamError, invalid_param

U64_MAX = 2**64 - 1
#: The most addresses (or elements) a generator may build in one array without a ``limit``.
MAX_ELEMENTS = 1 << 28


def show(value: Any, limit: int = 60) -> str:
    """``repr(value)``, shortened to ``limit`` characters; a list, tuple, dict or set is written
    only as far as the limit (so a value nested or shared a million times over is cheap to show)."""
    out: list[str] = []
    try:
        _repr_into(value, out, limit + 1)
        text = "".join(out)
    except Exception:  # a broken __repr__ must not hide the real error
        text = f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


_CONTAINERS = {list: ("[", "]"), tuple: ("(", ")"), dict: ("{", "}"), set: ("{", "}"), frozenset: ("frozenset({", "})")}


def _repr_into(value: Any, out: list[str], budget: int) -> int:
    """Appends ``repr(value)`` to ``out`` until ``budget`` characters are written; returns the
    budget left (0 or less: stop)."""
    kind = type(value)
    if kind not in _CONTAINERS:
        text = repr(value)
        out.append(text)
        return budget - len(text)
    if not value:
        text = {list: "[]", tuple: "()", dict: "{}", set: "set()", frozenset: "frozenset()"}[kind]
        out.append(text)
        return budget - len(text)
    opening, closing = _CONTAINERS[kind]
    out.append(opening)
    budget -= len(opening)
    for i, item in enumerate(value):
        if budget <= 0:
            return budget
        if i:
            out.append(", ")
            budget -= 2
        if kind is dict:
            budget = _repr_into(item, out, budget)
            if budget <= 0:
                return budget
            out.append(": ")
            budget = _repr_into(value[item], out, budget - 2)
        else:
            budget = _repr_into(item, out, budget)
    if kind is tuple and len(value) == 1:
        out.append(",")
        budget -= 1
    out.append(closing)
    return budget - len(closing)


def bound(n: float) -> str:
    """A range end as people write it: ``2**64-1`` rather than 18446744073709551615."""
    if n == U64_MAX:
        return "2**64-1"
    if isinstance(n, int) and n >= 1 << 20 and n & (n - 1) == 0:
        return f"2**{n.bit_length() - 1}"
    return f"{n:,}" if isinstance(n, int) else f"{n:g}"


def type_error(name: str, value: Any, expected: str) -> TypeError:
    return TypeError(f"{name} must be {expected}, got {type(value).__name__} {show(value)}")


def is_int(value: Any) -> bool:
    """An int or a NumPy integer, not a bool (or a DeviceBuffer: it stands for its pointer)."""
    return (isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))) or type(
        value
    ) is DeviceBuffer


def integer(value: Any, name: str, lo: int = 0, hi: int = U64_MAX) -> int:
    """An int in ``[lo, hi]``."""
    if not is_int(value):
        raise type_error(name, value, "an int")
    v = operator.index(value)
    if not lo <= v <= hi:
        raise invalid_param(f"{name} must be an int from {bound(lo)} to {bound(hi)}, got {show(v)}")
    return v


def optional_integer(value: Any, name: str, lo: int = 0, hi: int = U64_MAX) -> int | None:
    return None if value is None else integer(value, name, lo, hi)


def size(value: Any, name: str, lo: int = 1, hi: int = U64_MAX) -> int:
    """A byte count in ``[lo, hi]``: an int, or a size string such as ``"2MiB"``."""
    from ._native import parse_size

    if isinstance(value, str):
        try:
            v = parse_size(value)
        except InvalidParamError as e:
            raise invalid_param(f"{name}: {e.message}") from None
    elif is_int(value):
        v = operator.index(value)
    else:
        raise type_error(name, value, 'an int of bytes or a size string such as "2MiB"')
    if not lo <= v <= hi:
        raise invalid_param(f"{name} must be from {_bytes(lo)} to {_bytes(hi)}, got {show(value)}")
    return v


def _bytes(n: int) -> str:
    """A byte count for a message: ``4 KiB``, ``2**64-1 B``."""
    from ._native import format_size

    return "2**64-1 B" if n >= U64_MAX else format_size(n)


def real(value: Any, name: str, lo: float = 0.0, hi: float = math.inf, *, unit: str = "") -> float:
    """A finite number in ``[lo, hi]`` (an int or a float; not NaN, not infinite)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise type_error(name, value, "a number")
    v = float(value)
    if math.isnan(v) or math.isinf(v) or not lo <= v <= hi:
        upto = "" if math.isinf(hi) else f" to {bound(hi)}"
        raise invalid_param(f"{name} must be a finite number from {bound(lo)}{upto}{unit}, got {show(value)}")
    return v


def flag(value: Any, name: str) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise type_error(name, value, "True or False")
    return bool(value)


def text(value: Any, name: str) -> str:
    if not isinstance(value, str):
        raise type_error(name, value, "a str")
    return value


def choice(value: Any, name: str, options: Iterable[str]) -> str:
    """One of ``options`` (strings)."""
    options = list(options)
    if not isinstance(value, str):
        raise type_error(name, value, f"a str, one of {', '.join(options)}")
    if value not in options:
        raise invalid_param(f"{name} {show(value)} is unknown; use one of {', '.join(options)}")
    return value


def choices(values: Any, name: str, options: Iterable[str]) -> list[str]:
    """A non-empty list of ``options`` (a single string is refused: it is not a list of names)."""
    options = list(options)
    if isinstance(values, str) or not isinstance(values, Iterable):
        raise type_error(name, values, f"a list of names from {', '.join(options)}")
    out = [choice(v, f"{name}[{i}]", options) for i, v in enumerate(values)]
    if not out:
        raise invalid_param(f"{name} is empty; give at least one of {', '.join(options)}")
    return out


def names(values: Any, name: str) -> list[str]:
    """A list (or tuple) of non-empty strings; a bare string is refused (it would be read as
    its characters)."""
    if isinstance(values, (str, bytes)) or not isinstance(values, (list, tuple)):
        raise type_error(name, values, "a list of names")
    for i, v in enumerate(values):
        if not isinstance(v, str):
            raise type_error(f"{name}[{i}]", v, "a non-empty str")
        if not v:
            raise invalid_param(f"{name}[{i}] is an empty name")
    return list(values)


def member(value: Any, name: str, enum: type[IntEnum]) -> IntEnum:
    """A member of an IntEnum given as the member or its int value."""
    v = integer(value, name, 0, U64_MAX) if not isinstance(value, enum) else value
    try:
        return enum(v)
    except ValueError:
        known = ", ".join(f"{m.name} ({m.value})" for m in enum)
        raise invalid_param(f"{name} {show(value)} is not a {enum.__name__}; use one of {known}") from None


def mapping(value: Any, name: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise type_error(name, value, "a dict")
    return value


def uint64_array(values: Any, name: str) -> np.ndarray:
    """A C-contiguous 1-D uint64 array of non-negative integers below 2**64 (from any array-like
    of ints; floats, bools and strings are refused)."""
    if isinstance(values, (str, bytes)):
        raise type_error(name, values, "an array or list of ints")
    if isinstance(values, np.ndarray):
        arr = values
    else:
        if not isinstance(values, Iterable):
            raise type_error(name, values, "an array or list of ints")
        items = values if isinstance(values, Sequence) else list(values)
        try:
            arr = np.asarray(items)
        except (ValueError, TypeError, OverflowError):
            arr = np.empty(0, dtype=object)
        if arr.dtype.kind not in "iu" and len(items):
            # Ints beyond int64 (numpy makes those float64 or object), or other types: each item
            # is checked, and named when it is wrong.
            out = np.empty(len(items), dtype=np.uint64)
            for i, v in enumerate(items):
                out[i] = integer(v, f"{name}[{i}]")
            return out
    if arr.ndim != 1:
        if arr.ndim == 0 or arr.size == 0:
            arr = arr.reshape(-1)
        else:
            raise invalid_param(f"{name} must be 1-dimensional, got an array of shape {arr.shape}")
    if arr.size == 0:
        return np.zeros(0, dtype=np.uint64)
    if arr.dtype.kind == "u":
        return np.ascontiguousarray(arr, dtype=np.uint64)
    if arr.dtype.kind != "i":
        raise type_error(name, values, f"ints, not {arr.dtype}")
    low = int(arr.min())
    if low < 0:
        at = int(np.argmin(arr))
        raise invalid_param(f"{name}[{at}] must be an int from 0 to 2**64-1, got {low}")
    return np.ascontiguousarray(arr, dtype=np.uint64)


def count_limit(n: int, name: str, hint: str = "") -> None:
    """Refuses to build more than :data:`MAX_ELEMENTS` elements."""
    if n > MAX_ELEMENTS:
        raise invalid_param(f"{name} would make {n:,} elements; at most {bound(MAX_ELEMENTS)}{hint}")


def address_range(base: int, extent: int, name: str) -> None:
    """``[base, base + extent)`` must stay below 2**64 (numpy's uint64 arithmetic would wrap)."""
    if base + extent > U64_MAX + 1:
        raise invalid_param(f"{name}: {base:#x} + {extent:,} bytes runs past 2**64; no address wraps around")
