"""Autograd on ``npu:1`` and above: PyTorch's engine cannot run it through the Python route, and
says so clearly.

Rules:
- PyTorch's Python device guard for PrivateUse1 reports one device, so the autograd engine makes
  one worker queue for it; a backward pass over tensors on ``npu:1`` and above fails inside the
  engine with an internal assertion. :func:`install` (only with more than one device) wraps
  ``torch.autograd.backward`` and ``torch.autograd.grad`` so that this failure reads as what it
  is: :class:`DeviceAutogradError`, an AscendCL-style ``ACL_ERROR_FEATURE_UNSUPPORTED``
  ``RuntimeError``. Any other error passes unchanged.
- Forward passes, inference and copies between devices work on every device.
"""

from __future__ import annotations

import functools
from typing import Any

from ..errors import ACL_ERROR_FEATURE_UNSUPPORTED, AclError

#: Words of the engine's assertion when a device index has no worker queue.
_NO_QUEUE = "device_ready_queues_"


class DeviceAutogradError(AclError, RuntimeError):
    """A backward pass over tensors on ``npu:1`` or above."""


def _clear(fn: Any) -> Any:
    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except RuntimeError as e:
            if _NO_QUEUE not in str(e):
                raise
            raise DeviceAutogradError(
                ACL_ERROR_FEATURE_UNSUPPORTED,
                "ACL_ERROR_FEATURE_UNSUPPORTED",
                "backward over tensors on npu:1 or above is not supported: PyTorch's Python device guard for "
                "the npu backend reports one device, so its autograd engine has a worker for npu:0 only. Train "
                "on npu:0; the other devices take forward passes, inference and copies (tensor.to('npu:1'))",
            ) from None

    call.__wrapped_by_npumem__ = True  # type: ignore[attr-defined]
    return call


def install(torch: Any) -> None:
    """Wraps ``torch.autograd.backward`` and ``torch.autograd.grad`` (once)."""
    for name in ("backward", "grad"):
        fn = getattr(torch.autograd, name)
        if not getattr(fn, "__wrapped_by_npumem__", False):
            setattr(torch.autograd, name, _clear(fn))
