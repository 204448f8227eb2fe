"""PyTorch's own C++ meta kernels made active for shape mode.

Rules:
- :func:`activate_cpp_meta` runs once per process, only when shape mode is installed: every aten
  op that has a C++ ``Meta`` kernel (the structured kernel's ``meta()``, the very shape and stride
  logic its CPU kernel runs) gets it back; every op whose only meta kernel is PyTorch's Python one
  keeps that Python kernel, re-registered unchanged.
- Nothing else changes: ops, their CPU kernels and FakeTensor's own tables are untouched.

Note [Python meta kernels]: ``torch._meta_registrations`` registers a Python ``Meta`` kernel (a
``torch._refs`` decomposition) over the C++ one of about 650 aten ops, so that symbolic shapes
trace through them under ``torch.compile``. Called with concrete sizes they give the same shapes
but cost 40-300 us an op (an ``add`` 310 us against 5 us for the C++ kernel, measured on the
development machine), which would make shape mode slower than the CPU kernels it stands in for.
A Python ``Library`` registration cannot be withdrawn one op at a time, so the library holding
them is destroyed and the ops without a C++ kernel are registered again from PyTorch's
decomposition tables, with the precedence ``activate_meta`` uses (meta, post_autograd,
pre_autograd). The cost: symbolic-shape tracing (``torch.compile(dynamic=True)``) of those ops
fails in a shape-mode process; shape mode does not support ``torch.compile``.
"""

from __future__ import annotations

from typing import Any

import torch

_ACTIVE: list[Any] = []


def _has_cpp_meta(name: str) -> bool:
    return "Meta (inactive)" in torch._C._dispatch_dump(f"aten::{name}")


def _overload(name: str) -> Any:
    base, _, overload = name.partition(".")
    return getattr(getattr(torch.ops.aten, base), overload or "default")


def activate_cpp_meta() -> list[Any]:
    """Makes the C++ meta kernels active (once); returns the library that keeps the re-registered
    Python ones alive."""
    if _ACTIVE:
        return list(_ACTIVE)
    import torch._meta_registrations as registrations
    from torch._decomp import global_decomposition_table as tables

    python_meta = registrations._meta_lib_dont_use_me_use_register_meta
    names = [key.split("/")[1] for key in python_meta._op_impls if key.startswith("aten/")]
    keep: dict[str, Any] = {}
    for name in names:
        if _has_cpp_meta(name):
            continue
        op = _overload(name)
        fn = next((tables[kind][op] for kind in ("meta", "post_autograd", "pre_autograd") if op in tables[kind]), None)
        if fn is None:  # PyTorch registered it from elsewhere: leaving the library would lose it
            return []
        keep[name] = fn
    python_meta._destroy()
    again = torch.library.Library("aten", "IMPL", "Meta")
    for name, fn in keep.items():
        again.impl(name, fn)
    _ACTIVE.append(again)
    return [again]
