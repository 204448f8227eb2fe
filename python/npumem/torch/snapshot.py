"""The memory snapshot of the ``npu`` devices in PyTorch's format, one dict for all of them, as
``torch.cuda.memory._snapshot()`` gives for several GPUs.

Rules:
- Each segment's ``device`` is its ``npu`` index (an npumem ``Device`` numbers its own segments
  0); ``device_traces[i]`` is ``npu:i``'s alloc/free history, an empty list for a device left
  out, so ``torch.cuda._memory_viz`` (``stats``, ``segments``, ``trace``, ``trace_plot``) shows
  each device under its own index.
- ``allocator_settings`` are the first device's: the devices share their settings.
- The segments are copies: tagging them changes no device's own snapshot.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from . import runtime


def snapshot(indices: Sequence[int] | None = None) -> dict[str, Any]:
    """The snapshot of the devices ``indices`` (all of them by default)."""
    devices = runtime.get().devices
    chosen = range(len(devices)) if indices is None else [runtime.check_index(i) for i in indices]
    merged: dict[str, Any] = {"segments": [], "device_traces": [[] for _ in range(max(chosen, default=-1) + 1)]}
    for i in chosen:
        snap = devices[i].memory_snapshot()
        merged["segments"] += [{**seg, "device": i} for seg in snap["segments"]]
        merged["device_traces"][i] = snap["device_traces"][0]
        merged.setdefault("allocator_settings", snap["allocator_settings"])
        merged.setdefault("external_annotations", snap["external_annotations"])
    return merged


def dump(path: Any, indices: Sequence[int] | None = None) -> None:
    """Pickles :func:`snapshot` to ``path`` (checked first, in the protocol memory_viz reads)."""
    from ..formats import dump_snapshot_data

    dump_snapshot_data(snapshot(indices), path)
