"""Errors of the ``npu`` device (its out-of-memory error is PyTorch's own
``torch.OutOfMemoryError``, worded by :mod:`.oom`).

Rules:
- :class:`InstallError`: the set-up cannot happen; nothing was changed.
- :class:`ShapeModeError`: an op of a shape-mode program needs the tensors' values, which shape
  mode does not have; it is an AscendCL-style error (``ACL_ERROR_FEATURE_UNSUPPORTED``) and a
  ``RuntimeError``, as PyTorch's own kernel errors are, and it names the op.
"""

from __future__ import annotations

from ..errors import ACL_ERROR_FEATURE_UNSUPPORTED, AclError


class InstallError(RuntimeError):
    """The ``npu`` device cannot be installed: the name is taken, or it is installed already
    with other settings."""


class ShapeModeError(AclError, RuntimeError):
    """A shape-mode op that needs data (``.item()``, ``nonzero``, printing values, ``.cpu()``)."""


def shape_mode_error(op: str, why: str) -> ShapeModeError:
    """The error for the op ``op`` (``aten::nonzero``) of a shape-mode program; ``why`` says what
    needed the values."""
    return ShapeModeError(
        ACL_ERROR_FEATURE_UNSUPPORTED,
        "ACL_ERROR_FEATURE_UNSUPPORTED",
        f"{op} needs the tensors' values, and the npu device is in shape mode (simulated memory, ops compute "
        f"shapes only): {why}. Run in host mode (mode='host', NPUMEM_TORCH_MODE=host) for values",
    )
