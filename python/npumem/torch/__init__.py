"""``npumem.torch``: a PyTorch ``npu`` device whose every tensor lives in npumem's memory.

``npumem.torch.install()`` registers PyTorch's PrivateUse1 backend under torch_npu's name
``npu``: after it, ``torch.zeros(3, device="npu")``, ``tensor.npu()``, ``model.npu()`` and
``torch.npu.memory_summary()`` work as with torch_npu, and every ``npu`` storage is an allocation
of an npumem :class:`~npumem.Device` with the chosen allocator (torch_npu's by default). In
``host`` mode the memory is real (the host backend) and ops run PyTorch's CPU kernels on it, so
results equal a CPU run's; in ``shape`` mode the memory is a simulated device's and ops run meta
kernels (shapes only), so a model far larger than the machine takes its steps in seconds, with
the allocations host mode would make.

Rules:
- Installing is once per process: a second ``install`` with the same settings returns the same
  device; with other settings, or when another backend (torch_npu) already owns PrivateUse1 or
  ``torch.npu``, it raises :class:`InstallError` and changes nothing.
- Settings are checked whole before PyTorch is touched (:mod:`npumem.torch.settings`).

Note [Route]: the backend is Python only: DLPack hands npumem's pointers to PyTorch as
PrivateUse1 storages (:mod:`.storage`), ``torch.library`` registers the allocation, copy and
metadata kernels and a fallback that runs CPU kernels on the same memory (:mod:`.kernels`), and
PyTorch's Python-backend hooks and device guard stand for C++. No compiler is needed and the
allocator is the very npumem ``Device`` Python holds, so snapshots, summaries and the
fragmentation view come from it. The cost: about 0.1 ms of Python per op, autograd on
``npu:1`` and above through compiled autograd (PyTorch's Python device guard reports one
device, so its engine has no worker for them; :mod:`.engine`), kernels that run when issued
rather than on streams (streams and events order only npumem's own queued work and the
allocator's reuse), and ``torch.accelerator.memory_*`` (which needs a C++ ``DeviceAllocator``)
does not answer. The
devices are ``npumem.acl``'s (:mod:`.system`); shape mode's kernels are :mod:`.shape`.
"""

from __future__ import annotations

from typing import Any

from .._optional import require
from ..acl._config import ConfigError
from . import runtime
from .engine import DeviceAutogradError
from .errors import InstallError, ShapeModeError
from .settings import Settings, resolve

__all__ = [
    "ConfigError",
    "DeviceAutogradError",
    "InstallError",
    "Settings",
    "ShapeModeError",
    "device",
    "install",
    "installed",
]


def installed() -> Settings | None:
    """The settings of the installed ``npu`` device, or ``None``."""
    return None if runtime.RUNTIME is None else runtime.RUNTIME.settings


def device(index: int | None = None) -> Any:
    """The npumem :class:`~npumem.Device` behind ``npu:index`` (the current device by default)."""
    return runtime.device(index)


def install(
    capacity: Any = None,
    allocator: Any = None,
    alloc_conf: Any = None,
    mode: Any = None,
    devices: Any = None,
    backend: Any = None,
) -> Settings:
    """Registers the ``npu`` device and returns its settings.

    ``capacity`` (bytes or a size such as ``"16GiB"``; default: the host memory available, 64
    GiB in shape mode), ``allocator`` (``torch_npu`` by default, ``pytorch``, ``npumem``,
    ``direct``), ``alloc_conf`` (``PYTORCH_NPU_ALLOC_CONF``'s grammar), ``mode`` (``host`` by
    default: real memory, CPU kernels; ``shape``: simulated memory, meta kernels), ``devices``
    (1) and ``backend`` (the mode's: ``host`` for host mode, ``sim`` for shape mode). An
    argument left ``None`` comes from its ``NPUMEM_*`` variable (``NPUMEM_TORCH_MODE`` for the
    mode; ``PYTORCH_NPU_ALLOC_CONF`` when ``NPUMEM_ALLOC_CONF`` is unset), then the default.
    """
    settings = resolve(capacity, allocator, alloc_conf, mode, devices, backend)
    if runtime.RUNTIME is not None:
        if runtime.RUNTIME.settings != settings:
            raise InstallError(
                f"npumem.torch is installed already with {runtime.RUNTIME.settings}; it cannot be installed "
                f"again with {settings} (PyTorch's PrivateUse1 backend is set once per process)"
            )
        return settings
    torch = require("torch", "npumem.torch")
    from . import registration

    registration.check_free(torch)
    from . import system

    rt = runtime.Runtime(settings, system.devices(settings))
    runtime.RUNTIME = rt
    try:
        rt.libraries = registration.register(torch, settings.mode, settings.devices)
    except BaseException:
        runtime.RUNTIME = None
        raise
    return settings
