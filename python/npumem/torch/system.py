"""The npumem devices behind ``npu:0 .. npu:N-1``: the devices of ``npumem.acl``'s system.

Rules:
- The ``npu`` devices are ``npumem.acl``'s (one :class:`~npumem.acl._runtime.System`, one
  address space): a pyACL program in the same process (``import npumem.acl``) sees the very
  memory the PyTorch program allocates, device for device.
- While the acl system has no device in use, installing configures it with the ``npu`` devices'
  settings. When it has devices in use, they are shared if their settings match (same backend,
  capacity, allocator, alloc_conf, and at least as many devices); otherwise installing is an
  :class:`~npumem.torch.errors.InstallError` that names both settings, and nothing changes.
- ``acl.finalize()`` gives acl a fresh system; the ``npu`` devices stay those made before.
"""

from __future__ import annotations

from typing import Any

from ..acl import _config
from ..acl._runtime import LOCK, RT
from .errors import InstallError
from .settings import Settings


def _same(config: _config.Config, settings: Settings) -> bool:
    mine = (settings.backend, settings.capacity, settings.allocator, settings.alloc_conf)
    return (config.backend, config.capacity, config.allocator, config.alloc_conf) == mine and (
        config.devices >= settings.devices
    )


def devices(settings: Settings) -> list[Any]:
    """The npumem ``Device`` of each ``npu`` index, made (or found) in acl's system."""
    s = settings
    config = _config.Config(s.devices, s.capacity, s.backend, s.allocator, s.alloc_conf)
    with LOCK:
        system = RT.system
        if system is not None and system.created():
            if not _same(system.config, settings):
                raise InstallError(
                    f"npumem.acl's system has devices in use with {system.config}; the npu devices would need "
                    f"{config}: configure both alike (npumem.acl.configure(...) with the same settings) or "
                    "install npumem.torch before the first acl.rt call"
                )
        else:
            RT.configure(config)
        shared = RT.sys()
        return [shared.device(i) for i in range(settings.devices)]
