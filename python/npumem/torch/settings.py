"""The settings of the ``npu`` device: from :func:`npumem.torch.install`'s arguments or the
environment.

Rules:
- An argument given to ``install`` wins; an argument left ``None`` comes from its variable
  (``NPUMEM_CAPACITY``, ``NPUMEM_ALLOCATOR``, ``NPUMEM_ALLOC_CONF``, ``NPUMEM_DEVICES``,
  ``NPUMEM_BACKEND``, ``NPUMEM_TORCH_MODE``; ``PYTORCH_NPU_ALLOC_CONF`` when
  ``NPUMEM_ALLOC_CONF`` is unset), then from the default. An empty variable counts as unset.
- A :class:`Settings` has been checked whole (the allocator accepted its ``alloc_conf``) before
  any device is made from it; a bad value is a :class:`ConfigError` naming the argument or
  variable, the value and what is accepted.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..acl import _config
from ..acl._config import ConfigError

MODE = "NPUMEM_TORCH_MODE"
TORCH_ALLOC_CONF = "PYTORCH_NPU_ALLOC_CONF"

#: ``host``: real memory, PyTorch's CPU kernels. ``shape``: simulated memory, meta kernels.
MODES = ("host", "shape")
#: Where each mode's memory is (npumem's ``Device(backend=...)``).
BACKEND_OF_MODE = {"host": "host", "shape": "sim"}
WHY_BACKEND = {
    "host": "host mode runs PyTorch's CPU kernels on the device's memory",
    "shape": "shape mode has no bytes behind its memory (a simulated device)",
}
#: torch_npu's own caching allocator: what a torch_npu program gets by default.
DEFAULT_ALLOCATOR = "torch_npu"


@dataclass(frozen=True)
class Settings:
    """What the ``npu`` device is made of (see :func:`npumem.torch.install`)."""

    mode: str = "host"
    backend: str = "host"
    #: Bytes per device; None: the host backend's default (the memory available).
    capacity: int | None = None
    allocator: str = DEFAULT_ALLOCATOR
    alloc_conf: str = ""
    devices: int = 1


def resolve(
    capacity: Any = None,
    allocator: Any = None,
    alloc_conf: Any = None,
    mode: Any = None,
    devices: Any = None,
    backend: Any = None,
    environ: Mapping[str, str] | None = None,
) -> Settings:
    """Checked settings from the arguments, falling back to ``environ`` (``os.environ``)."""
    env = os.environ if environ is None else environ
    names = {"capacity": "capacity", "allocator": "allocator", "alloc_conf": "alloc_conf"}
    names |= {"mode": "mode", "devices": "devices", "backend": "backend"}

    def pick(value: Any, key: str, *variables: str) -> Any:
        if value is not None:
            return value
        for var in variables:
            raw = env.get(var)
            if raw is not None and raw.strip():
                names[key] = var
                return raw
        return None

    mode = pick(mode, "mode", MODE)
    mode = "host" if mode is None else _config._choice(mode, names["mode"], MODES)
    backend = pick(backend, "backend", _config.BACKEND)
    wanted = BACKEND_OF_MODE[mode]
    if backend is not None and _config._choice(backend, names["backend"], _config.BACKENDS) != wanted:
        raise ConfigError(
            f"{names['backend']}={backend!r} with mode={mode!r}: {WHY_BACKEND[mode]}, which needs backend={wanted!r}"
        )
    devices = pick(devices, "devices", _config.DEVICES)
    count = 1 if devices is None else _config._devices(devices, names["devices"])
    capacity = pick(capacity, "capacity", _config.CAPACITY)
    allocator = pick(allocator, "allocator", _config.ALLOCATOR)
    allocator = (
        DEFAULT_ALLOCATOR if allocator is None else _config._choice(allocator, names["allocator"], _config.ALLOCATORS)
    )
    alloc_conf = pick(alloc_conf, "alloc_conf", _config.ALLOC_CONF, TORCH_ALLOC_CONF)
    # The pyACL layer's checks: the allocator accepts its settings, the capacity fits the window.
    checked = _config.make(count, capacity, wanted, allocator, alloc_conf, names=names)
    return Settings(mode, wanted, checked.capacity, checked.allocator, checked.alloc_conf, count)
