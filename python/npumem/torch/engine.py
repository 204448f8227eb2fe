"""Autograd on ``npu:1`` and above, through PyTorch's compiled autograd.

Rules:
- PyTorch's Python device guard for PrivateUse1 reports one device (``deviceCount()`` is ``1``
  in ``torch/csrc/acc/Module.cpp``), and the autograd engine makes its device worker queues for
  the largest ``deviceCount()`` of the registered guards (``Engine::start_device_threads`` in
  ``torch/csrc/autograd/engine.cpp``), then asserts ``device_index < device_ready_queues_.size()``
  when it queues a node of ``npu:1``. Python cannot change that count.
- Compiled autograd takes a backward pass before the engine queues anything: it traces the
  autograd graph into an FX graph and runs that graph on the calling thread. So :func:`install`
  (only with more than one device) wraps ``torch.autograd.backward`` and ``torch.autograd.grad``:
  a pass whose graph touches ``npu:1`` or above (its roots, or any node's inputs) runs under
  compiled autograd with the eager compiler (the traced graph as it is, the very ops the engine
  would run, so losses and gradients equal the CPU run's); any other pass is the engine's, as
  before. Each new graph is traced once (about a second), then its cached graph runs.
- A pass compiled autograd cannot take (``create_graph=True``, anomaly detection) that reaches the
  engine's assertion reads as what it is: :class:`DeviceAutogradError`, an AscendCL-style
  ``ACL_ERROR_FEATURE_UNSUPPORTED`` ``RuntimeError``. Any other error passes unchanged.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Iterable
from typing import Any

from ..errors import ACL_ERROR_FEATURE_UNSUPPORTED, AclError

#: Words of the engine's assertion when a device index has no worker queue.
_NO_QUEUE = "device_ready_queues_"


class DeviceAutogradError(AclError, RuntimeError):
    """A backward pass over tensors on ``npu:1`` or above that compiled autograd cannot take."""


def _above_npu0(device: Any) -> bool:
    return getattr(device, "type", None) == "npu" and (device.index or 0) > 0


def _roots(value: Any) -> Iterable[Any]:
    if value is None:
        return ()
    return (value,) if hasattr(value, "grad_fn") else tuple(value)


def touches_other_devices(roots: Iterable[Any]) -> bool:
    """Whether the autograd graph behind ``roots`` has a tensor on ``npu:1`` or above."""
    seen: set[int] = set()
    todo = []
    for t in roots:
        if _above_npu0(getattr(t, "device", None)):
            return True
        if getattr(t, "grad_fn", None) is not None:
            todo.append(t.grad_fn)
    while todo:
        node = todo.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if any(_above_npu0(getattr(m, "device", None)) for m in getattr(node, "_input_metadata", ())):
            return True
        todo.extend(n for n, _ in node.next_functions if n is not None and id(n) not in seen)
    return False


def _eager(graph: Any) -> Any:
    """Compiled autograd's compiler: the traced graph, run as it is."""
    return graph


def _wrap(fn: Any) -> Any:
    signature = inspect.signature(fn)

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            bound = signature.bind(*args, **kwargs).arguments
            # backward's roots are ``tensors``, grad's ``outputs``
            roots = bound.get("tensors", bound.get("outputs"))
            import torch

            # compiled autograd refuses both (engine.cpp's TORCH_CHECKs): the engine's path then
            # ends in the clear error below
            unsupported = bound.get("create_graph") or torch.is_anomaly_enabled()
            if unsupported or not touches_other_devices(_roots(roots)):
                return fn(*args, **kwargs)
            from torch._dynamo import compiled_autograd

            with compiled_autograd._enable(_eager):
                return fn(*args, **kwargs)
        except RuntimeError as e:
            if _NO_QUEUE not in str(e):
                raise
            raise DeviceAutogradError(
                ACL_ERROR_FEATURE_UNSUPPORTED,
                "ACL_ERROR_FEATURE_UNSUPPORTED",
                "this backward over tensors on npu:1 or above is not supported: PyTorch's Python device guard "
                "for the npu backend reports one device, so its autograd engine has a worker for npu:0 only, "
                "and compiled autograd (which npumem.torch runs such passes with) does not take this one "
                "(create_graph=True, anomaly detection). Run it on npu:0",
            ) from None

    call.__wrapped_by_npumem__ = True  # type: ignore[attr-defined]
    return call


def install(torch: Any) -> None:
    """Wraps ``torch.autograd.backward`` and ``torch.autograd.grad`` (once)."""
    for name in ("backward", "grad"):
        fn = getattr(torch.autograd, name)
        if not getattr(fn, "__wrapped_by_npumem__", False):
            setattr(torch.autograd, name, _wrap(fn))
