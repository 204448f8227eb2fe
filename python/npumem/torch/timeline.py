"""What ``npumem fit`` shows besides its answer: a progress line while the script runs, and
``--plot``'s timeline of each device's memory.

Rules:
- The progress line goes to stderr only: rewritten in place at most twice a second on a
  terminal, else one line every :data:`PLAIN_EVERY_S` seconds (none for a short run), so that
  logs stay small and stdout is the answer alone. It reads the devices' counters, nothing else.
- The plot is drawn from the memory history ``npumem fit`` records from the start: per device,
  allocated (solid) and reserved (dashed) bytes after each event, the capacity, and the event
  where the script ran out of memory. Without matplotlib it raises ``MissingDependencyError``.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any, TextIO

from .oom import format_size

TTY_EVERY_S = 0.5
PLAIN_EVERY_S = 10.0


class Progress:
    """A daemon thread writing the progress line from :meth:`begin` until :meth:`stop`."""

    def __init__(self, devices: list[Any], out: TextIO | None = None) -> None:
        self.devices = devices
        self.out = sys.stderr if out is None else out
        self.tty = bool(getattr(self.out, "isatty", lambda: False)())
        self.start = time.monotonic()
        self._done = threading.Event()
        self._shown = False
        self._thread = threading.Thread(target=self._run, name="npumem-fit-progress", daemon=True)

    def line(self) -> str:
        allocated = sum(d.memory_allocated() for d in self.devices)
        reserved = sum(d.memory_reserved() for d in self.devices)
        peak = sum(d.max_memory_reserved() for d in self.devices)
        return (
            f"npumem fit: {time.monotonic() - self.start:.0f} s, allocated {format_size(allocated)}, reserved "
            f"{format_size(reserved)} (peak {format_size(peak)})"
        )

    def _run(self) -> None:
        every = TTY_EVERY_S if self.tty else PLAIN_EVERY_S
        while not self._done.wait(every):
            if self.tty:
                self.out.write("\r\x1b[K" + self.line())
            else:
                self.out.write(self.line() + "\n")
            self.out.flush()
            self._shown = True

    def begin(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._done.set()
        self._thread.join()
        if self.tty and self._shown:
            self.out.write("\r\x1b[K")
            self.out.flush()


def _series(events: list[dict[str, Any]]) -> tuple[list[int], list[int]]:
    allocated, reserved, a, r = [], [], 0, 0
    for e in events:
        action, size = e["action"], e["size"]
        if action == "alloc":
            a += size
        elif action == "free_completed":
            a -= size
        elif action == "segment_alloc":
            r += size
        elif action == "segment_free":
            r -= size
        allocated.append(a)
        reserved.append(r)
    return allocated, reserved


def plot(devices: list[Any], path: str, title: str, oom_device: int | None) -> None:
    """Writes the PNG at ``path``: each device's allocated and reserved bytes over its events."""
    from .._optional import require

    require("matplotlib", "npumem fit --plot")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 5))
    for i, dev in enumerate(devices):
        events = dev.memory_snapshot()["device_traces"][0]
        allocated, reserved = _series(events)
        x = range(len(events))
        ax.plot(x, [b / 2**30 for b in allocated], color=f"C{i}", lw=1.2, label=f"npu:{i} allocated")
        ax.plot(x, [b / 2**30 for b in reserved], color=f"C{i}", lw=1.2, ls="--", label=f"npu:{i} reserved")
        if i == oom_device and events:
            ax.axvline(len(events) - 1, color="red", lw=1, label=f"npu:{i} out of memory")
    ax.axhline(devices[0].capacity / 2**30, color="0.4", lw=1, ls=":", label="capacity")
    ax.set_xlabel("allocator event")
    ax.set_ylabel("GiB")
    ax.set_title(title)
    ax.legend(fontsize=8, ncol=2)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
