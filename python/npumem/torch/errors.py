"""Errors of the ``npu`` device's set-up (its run-time out-of-memory error is PyTorch's own
``torch.OutOfMemoryError``, worded by :mod:`.oom`)."""

from __future__ import annotations


class InstallError(RuntimeError):
    """The ``npu`` device cannot be installed: the name is taken, or it is installed already
    with other settings."""
