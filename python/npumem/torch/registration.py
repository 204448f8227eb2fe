"""Registering PyTorch's PrivateUse1 backend as ``npu``, served by npumem.

Rules:
- :func:`check_free` runs before anything is changed: PrivateUse1 must still be unnamed and
  ``torch.npu`` absent (torch_npu owns both when it is imported), and this torch must have the
  Python-backend API the route needs; otherwise :class:`~npumem.torch.errors.InstallError`.
- :func:`register` names the backend, generates ``Tensor.npu()`` / ``Module.npu()`` /
  ``Tensor.is_npu``, registers :mod:`npumem.torch.npu` as ``torch.npu`` (and
  ``torch.npu.memory``), the hooks, the device guard and the kernels (:mod:`.kernels`).
  PyTorch cannot undo a rename: a failure after it leaves the name taken.
"""

from __future__ import annotations

import sys
from typing import Any

from .errors import InstallError

#: PyTorch's name for PrivateUse1 until a backend renames it.
UNNAMED = "privateuseone"
NAME = "npu"


def check_free(torch: Any) -> None:
    name = torch._C._get_privateuse1_backend_name()
    if name != UNNAMED:
        raise InstallError(
            f"PyTorch's PrivateUse1 backend is registered already as {name!r} (by torch_npu or another "
            "extension): npumem.torch cannot install its npu device in this process; run without importing "
            "that backend (e.g. TORCH_DEVICE_BACKEND_AUTOLOAD=0 to stop torch_npu's autoload)"
        )
    if hasattr(torch, NAME) or f"torch.{NAME}" in sys.modules:
        raise InstallError(
            "torch.npu exists already (torch_npu is imported?): npumem.torch cannot install its npu device"
        )
    acc = getattr(torch._C, "_acc", None)
    if acc is None or not hasattr(acc, "register_python_privateuseone_hook"):
        raise InstallError(
            f"torch {torch.__version__} lacks the Python PrivateUse1 backend API (torch._C._acc); "
            "npumem.torch needs torch 2.15"
        )


def register(torch: Any, mode: str, devices: int = 1) -> list[Any]:
    """Registers everything, with the kernels of ``mode``; returns what must stay alive (the
    hooks, the guard, the torch.library objects)."""
    from . import engine, npu

    if devices > 1:
        engine.install(torch)

    class Hooks(torch._C._acc.PrivateUse1Hooks):
        def is_available(self) -> bool:
            return True

        def has_primary_context(self, dev_id: int) -> bool:
            return True

        def is_built(self) -> bool:
            return True

    class Guard(torch._C._acc.DeviceGuard):
        def type_(self) -> Any:
            return torch._C._autograd.DeviceType.PrivateUse1

    torch.utils.rename_privateuse1_backend(NAME)
    torch.utils.generate_methods_for_privateuse1_backend(for_tensor=True, for_module=True, for_storage=True)
    torch._register_device_module(NAME, npu)
    sys.modules[f"torch.{NAME}.memory"] = npu.memory
    hooks, guard = Hooks(), Guard()
    torch._C._acc.register_python_privateuseone_hook(hooks)
    torch._C._acc.register_python_privateuseone_device_guard(guard)
    return [hooks, guard, *_kernels(torch, mode)]


def _kernels(torch: Any, mode: str) -> list[Any]:
    """Registers the kernels of ``mode`` (``host``: CPU kernels on real memory, :mod:`.kernels`;
    ``shape``: meta kernels, :mod:`.shape`); returns the libraries, which must be kept alive (a
    registration lives as long as its library)."""
    from . import kernels

    table, every_op, kept = kernels.KERNELS, kernels.fallback, []
    if mode == "shape":
        from . import meta, shape

        table, every_op = shape.KERNELS, shape.fallback
        kept = meta.activate_cpp_meta()
    aten = torch.ops.aten
    impl = torch.library.Library("aten", "IMPL")
    from .npu import streams

    table = {"empty_strided": kernels.empty_strided, "empty.memory_format": kernels.empty_memory_format, **table}
    table["record_stream"] = streams.record_stream
    for name, fn in table.items():
        impl.impl(name, fn, "PrivateUse1")
    for name in kernels.METADATA_OPS:
        base, _, overload = name.partition(".")
        op = getattr(getattr(aten, base), overload or "default")
        impl.impl(name, kernels.redispatch_to_cpu(op), "PrivateUse1")
    for name in kernels.cpu_kernel_ops():
        impl.impl(name, kernels.on_cpu(name, every_op), "PrivateUse1")
    every = torch.library.Library("_", "IMPL")
    every.fallback(every_op, dispatch_key="PrivateUse1")
    # torch.autocast("npu") passes ops through unchanged (no per-op cast policy).
    every.fallback(torch.library.fallthrough_kernel, dispatch_key="AutocastPrivateUse1")
    return [impl, every, *kept]
