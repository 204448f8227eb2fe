"""The process-wide system's settings: from ``npumem.acl.configure(...)`` or the environment.

``NPUMEM_DEVICES`` (how many devices, 1-64, default 8; each is made on first use),
``NPUMEM_CAPACITY`` (memory of each device, a size such as ``64GiB``; default 64 GiB on the
simulator, the memory available on the host backend, the device's memory on ``acl`` and ``cuda``),
``NPUMEM_BACKEND`` (``sim``, the default, ``host``, or ``acl`` / ``cuda``: AscendCL or the CUDA
driver, device i the runtime's device i), ``NPUMEM_ALLOCATOR`` (``npumem``, ``direct``, ``pytorch``, ``torch_npu``) and
``NPUMEM_ALLOC_CONF`` (the ``PYTORCH_NPU_ALLOC_CONF`` grammar). An empty variable counts as unset.

Invariant: a :class:`Config` has been checked whole — the devices fit their slices of the one
address space and the allocator accepts its settings — before any device is made from it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from .. import _native
from ..errors import ACL_ERROR_INVALID_PARAM, AclError, InvalidParamError

DEVICES = "NPUMEM_DEVICES"
CAPACITY = "NPUMEM_CAPACITY"
BACKEND = "NPUMEM_BACKEND"
ALLOCATOR = "NPUMEM_ALLOCATOR"
ALLOC_CONF = "NPUMEM_ALLOC_CONF"

#: The most devices one system holds: the device window cut in 64 slices of 128 GiB.
MAX_DEVICES = 64
BACKENDS = ("sim", "host", "acl", "cuda")
#: The backends over a real runtime (or its stand-in): device i is the runtime's device i.
RUNTIME_BACKENDS = ("acl", "cuda")
ALLOCATORS = ("npumem", "direct", "pytorch", "torch_npu")
DEFAULT_SIM_CAPACITY = 64 << 30
#: The capacities the host backend takes (its own check, made here before any device is).
HOST_MIN_CAPACITY, HOST_MAX_CAPACITY = 64 << 10, 1 << 40
#: The VA a simulated device may need per byte of memory: the npumem pool reserves 4x its
#: capacity for each of its two page pools.
VA_PER_BYTE = 8


class ConfigError(InvalidParamError):
    """A bad setting of the pyACL layer (``ACL_ERROR_INVALID_PARAM``, a ``ValueError``): the
    message names the variable (or argument), the value and what is accepted."""

    def __init__(self, message: str) -> None:
        super().__init__(ACL_ERROR_INVALID_PARAM, "ACL_ERROR_INVALID_PARAM", message)

    def __reduce__(self):  # keep pickling working: the one argument is the message
        return (type(self), (self.message,))


@dataclass(frozen=True)
class Config:
    devices: int = 8
    #: Bytes per device; None: the backend's default (host: the memory available).
    capacity: int | None = DEFAULT_SIM_CAPACITY
    backend: str = "sim"
    allocator: str = "npumem"
    alloc_conf: str = ""

    def slice_bytes(self) -> int:
        """The VA each simulated device's slice of the window holds."""
        return (_native.VA_WINDOW_END - _native.VA_WINDOW_START) // self.devices >> 30 << 30


def _devices(value: Any, name: str) -> int:
    if isinstance(value, str):
        try:
            value = int(value.strip(), 10)
        except ValueError:
            raise ConfigError(f"{name}={value!r}: expected a whole number of devices from 1 to {MAX_DEVICES}") from None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int from 1 to {MAX_DEVICES}, got {type(value).__name__} {value!r}")
    if not 1 <= value <= MAX_DEVICES:
        raise ConfigError(f"{name}={value!r}: expected a number of devices from 1 to {MAX_DEVICES}")
    return value


def _capacity(value: Any, name: str) -> int:
    if isinstance(value, str):
        try:
            value = _native.parse_size(value.strip())
        except AclError as e:
            raise ConfigError(f"{name}={value!r}: expected a size such as 64GiB or 8000000000 ({e.message})") from None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int of bytes or a size string such as '64GiB', got {value!r}")
    if value <= 0:
        raise ConfigError(f"{name}={value!r}: the capacity must be above 0 bytes")
    return value


def _choice(value: Any, name: str, options: tuple[str, ...]) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, one of {', '.join(options)}; got {value!r}")
    if value.strip() not in options:
        raise ConfigError(f"{name}={value!r}: expected one of {', '.join(options)}")
    return value.strip()


def make(
    devices: Any = None,
    capacity: Any = None,
    backend: Any = None,
    allocator: Any = None,
    alloc_conf: Any = None,
    *,
    names: dict[str, str] | None = None,
) -> Config:
    """A checked configuration; ``names`` gives the name each setting came by (a variable or an
    argument) for error messages."""
    n = {"devices": "devices", "capacity": "capacity", "backend": "backend", "allocator": "allocator"}
    n["alloc_conf"] = "alloc_conf"
    n.update(names or {})
    backend = "sim" if backend is None else _choice(backend, n["backend"], BACKENDS)
    count = 8 if devices is None else _devices(devices, n["devices"])
    if capacity is None:
        size = DEFAULT_SIM_CAPACITY if backend == "sim" else None
    else:
        size = _capacity(capacity, n["capacity"])
    allocator = "npumem" if allocator is None else _choice(allocator, n["allocator"], ALLOCATORS)
    if alloc_conf is not None and not isinstance(alloc_conf, str):
        raise TypeError(f"{n['alloc_conf']} must be a str, got {alloc_conf!r}")
    config = Config(count, size, backend, allocator, (alloc_conf or "").strip())
    if backend == "host" and size is not None and not HOST_MIN_CAPACITY <= size <= HOST_MAX_CAPACITY:
        raise ConfigError(
            f"{n['capacity']}={capacity!r}: a host-backend device holds from "
            f"{_native.format_size(HOST_MIN_CAPACITY)} to {_native.format_size(HOST_MAX_CAPACITY)}"
        )
    if backend == "sim" and size is not None and size * VA_PER_BYTE > config.slice_bytes():
        most = config.slice_bytes() // VA_PER_BYTE
        raise ConfigError(
            f"{n['capacity']}={capacity!r} with {n['devices']}={count}: each device's slice of the 8 TiB "
            f"address space holds {_native.format_size(config.slice_bytes())}, room for at most "
            f"{_native.format_size(most)} per device; use fewer devices or a smaller capacity"
        )
    try:  # the allocator checks its settings: on a tiny device, now rather than at first use
        _native.Device("64MiB", allocator=allocator, alloc_conf=config.alloc_conf)
    except AclError as e:
        raise ConfigError(f"{n['alloc_conf']}={config.alloc_conf!r}: {e.message}") from None
    return config


def from_env(environ: Any = None) -> Config:
    """The configuration the environment asks for."""
    env = os.environ if environ is None else environ

    def get(name: str) -> str | None:
        value = env.get(name)
        return value if value is not None and value.strip() else None

    return make(
        get(DEVICES),
        get(CAPACITY),
        get(BACKEND),
        get(ALLOCATOR),
        get(ALLOC_CONF),
        names={
            "devices": DEVICES,
            "capacity": CAPACITY,
            "backend": BACKEND,
            "allocator": ALLOCATOR,
            "alloc_conf": ALLOC_CONF,
        },
    )
