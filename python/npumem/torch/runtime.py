"""The installed ``npu`` device: its settings, its npumem devices and the current index.

Rules:
- There is at most one :class:`Runtime` per process (PyTorch's PrivateUse1 name is set once);
  :data:`RUNTIME` is ``None`` until :func:`npumem.torch.install` succeeds.
- A device index is checked on every use: an index outside ``range(device_count)`` is a
  ``ValueError`` naming it and the devices there are, never a fallback to device 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .settings import Settings


@dataclass
class Runtime:
    settings: Settings
    devices: list[Any]
    current: int = 0
    #: The torch.library registrations: alive as long as the runtime.
    libraries: list[Any] = field(default_factory=list)
    #: Device index -> its current npumem stream (absent or 0: the default stream).
    streams: dict[int, int] = field(default_factory=dict)


RUNTIME: Runtime | None = None
#: The last failed allocation: (bytes asked for, bytes reserved then, device index), for
#: ``npumem fit``.
LAST_OOM: tuple[int, int, int] | None = None


def get() -> Runtime:
    if RUNTIME is None:
        raise RuntimeError("the npu device is not installed: call npumem.torch.install() first")
    return RUNTIME


def check_index(index: Any, shown: Any = None) -> int:
    """``index`` as a valid device index of the runtime (``shown``: what the caller passed)."""
    count = len(get().devices)
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < count:
        have = ", ".join(f"npu:{i}" for i in range(count))
        what = index if shown is None else shown
        raise ValueError(f"device={what!r}: no such npu device; npumem.torch has {have}")
    return index


def index_of(device: Any) -> int:
    """The index a torch device, ``int``, device string or ``None`` (the current device) names."""
    rt = get()
    if device is None:
        return rt.current
    if isinstance(device, int) and not isinstance(device, bool):
        return check_index(device)
    import torch

    if isinstance(device, str):
        try:
            device = torch.device(device)
        except RuntimeError as e:
            raise ValueError(f"device={device!r}: {e}") from None
    if not isinstance(device, torch.device) or device.type != "npu":
        raise ValueError(f"device={device!r}: expected an npu device (npu, npu:0, 0)")
    return rt.current if device.index is None else check_index(device.index, str(device))


def stream_of(index: int) -> int | None:
    """The npumem stream new storages of ``npu:index`` are allocated on (None: the default)."""
    return get().streams.get(index) or None


def current_index() -> int:
    return get().current


def device(index: int | None = None) -> Any:
    """The npumem ``Device`` behind ``npu:index`` (the current one by default)."""
    rt = get()
    return rt.devices[rt.current if index is None else check_index(index)]
