"""Stream pipelines on the simulated clock.

``double_buffered`` runs the classic input pipeline: while batch ``i`` is being computed on the
compute stream, batch ``i + 1`` is copied from pinned host memory on the copy stream, with two
device buffers and events ordering each buffer's copy before its compute and its compute before
its next copy. With ``overlap=False`` everything runs on one stream, one step after another. The
result carries the simulated time and the time the cost model predicts for each schedule.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .device import Device
from .enums import MemcpyKind, Policy


@dataclass
class PipelineResult:
    batches: int
    copy_us: float
    compute_us: float
    total_us: float
    predicted_us: float
    timeline: list[dict[str, Any]] = field(repr=False)

    @property
    def efficiency(self) -> float:
        """Predicted over simulated time (1.0 = the schedule reached the model's bound)."""
        return self.predicted_us / self.total_us


def double_buffered(
    dev: Device, *, batches: int = 8, batch_bytes: int = 64 << 20, kernel_us: float = 1500.0, overlap: bool = True
) -> PipelineResult:
    host = dev.malloc_host(batch_bytes)
    bufs = [dev.malloc(batch_bytes, Policy.HUGE_FIRST) for _ in range(2)]
    copy_stream = dev.create_stream() if overlap else 0
    compute_stream = dev.create_stream() if overlap else 0
    copied = [dev.create_event() for _ in range(2)]
    consumed = [dev.create_event() for _ in range(2)]
    dev.synchronize_device()
    t0 = dev.now_us()
    first = len(dev.timeline())
    for i in range(batches):
        b = i % 2
        if overlap and i >= 2:
            dev.stream_wait_event(copy_stream, consumed[b])  # the buffer's previous batch is done
        dev.memcpy_async(bufs[b], batch_bytes, host, batch_bytes, MemcpyKind.HOST_TO_DEVICE, copy_stream)
        dev.record_event(copied[b], copy_stream)
        if overlap:
            dev.stream_wait_event(compute_stream, copied[b])
        dev.launch(compute_stream, kernel_us, reads=[bufs[b]], writes=[bufs[b]])
        dev.record_event(consumed[b], compute_stream)
    dev.synchronize_device()
    total = dev.now_us() - t0
    spans = dev.timeline()[first:]
    copy_us = next(s["end_us"] - s["start_us"] for s in spans if s["label"] == "copy H2D")
    launch_us = dev.cost_model()["launch_ns"] / 1e3
    if overlap:
        # The first copy, then each step bounded by the slower of copy and compute, then the
        # last compute.
        predicted = launch_us + copy_us + (batches - 1) * max(copy_us, kernel_us) + kernel_us
    else:
        predicted = launch_us + batches * (copy_us + kernel_us)
    for e in copied + consumed:
        dev.destroy_event(e)
    for s in {copy_stream, compute_stream} - {0}:
        dev.destroy_stream(s)
    for buf in bufs:
        dev.free(buf)
    dev.free_host(host)
    return PipelineResult(batches, copy_us, kernel_us, total, predicted, spans)


def render_timeline(spans: list[dict[str, Any]], width: int = 80) -> str:
    """A text Gantt chart of the spans, one row per stream."""
    if not spans:
        return ""
    t0 = min(s["start_us"] for s in spans)
    t1 = max(s["end_us"] for s in spans)
    scale = (width - 1) / max(t1 - t0, 1e-9)
    rows: dict[int, list[str]] = {}
    for s in spans:
        row = rows.setdefault(s["stream"], [" "] * width)
        a = int((s["start_us"] - t0) * scale)
        b = max(a + 1, int((s["end_us"] - t0) * scale))
        mark = "C" if s["label"].startswith("copy") else "K" if s["label"] == "kernel" else "M"
        for k in range(a, min(b, width)):
            row[k] = mark
    lines = [f"  stream {sid:>2} |{''.join(row)}|" for sid, row in sorted(rows.items())]
    lines.append(f"  {'':9} 0{'':>{width - 12}}{t1 - t0:9.0f} us")
    return "\n".join(lines)


@dataclass
class FreeResult:
    iterations: int
    mode: str
    total_us: float
    device_busy_us: float
    host_blocked: int
    peak_reserved: int

    @property
    def idle_us(self) -> float:
        """Device time spent waiting for the host (the synchronisation bubble)."""
        return self.total_us - self.device_busy_us


FREE_MODES = ("sync", "event", "stream")


def scratch_loop(
    dev: Device, *, iterations: int = 20, scratch_bytes: int = 32 << 20, kernel_us: float = 200.0, mode: str
) -> FreeResult:
    """Each iteration allocates a scratch buffer on a compute stream, runs a kernel on it and
    frees it, in one of three ways:

    - ``"sync"``: synchronise the stream, then free. The host blocks until the kernel is done,
      so the next launch comes late and the device idles (the bubble).
    - ``"event"``: record an event after the kernel, make a free stream wait on it and free on
      that stream. The host never blocks. The free's point follows the kernel, which the compute
      stream follows too, so with ``REUSE_FOLLOW_EVENT_DEPENDENCIES`` (the default) the next
      malloc on the compute stream reuses the block; without it, each iteration takes a new
      block until the free stream passes its event.
    - ``"stream"``: free at once; the block waits for its own stream, and the next malloc on
      that stream reuses it immediately (stream order makes it safe): no bubble, one block."""
    if mode not in FREE_MODES:
        raise ValueError(f"mode must be one of {FREE_MODES}")
    compute = dev.create_stream()
    free_stream = dev.create_stream()
    done = dev.create_event()
    # Warm the pool (its first malloc pays the driver: physical allocations and maps) so that
    # the loop measures the steady state.
    dev.free(dev.malloc(scratch_bytes, Policy.HUGE_FIRST, compute))
    dev.synchronize_device()
    dev.reset_peak_memory_stats()
    t0 = dev.now_us()
    first = len(dev.timeline())
    blocked = 0
    for _ in range(iterations):
        x = dev.malloc(scratch_bytes, Policy.HUGE_FIRST, compute)
        dev.launch(compute, kernel_us, reads=[x], writes=[x])
        if mode == "event":
            dev.record_event(done, compute)
            dev.stream_wait_event(free_stream, done)
            dev.free(x, stream=free_stream)
        elif mode == "sync":
            dev.synchronize_stream(compute)
            blocked += 1
            dev.free(x)
        else:
            dev.free(x)
    dev.synchronize_device()
    total = dev.now_us() - t0
    busy = sum(s["end_us"] - s["start_us"] for s in dev.timeline()[first:] if s["stream"] == compute)
    peak = dev.max_memory_reserved()
    dev.destroy_event(done)
    dev.destroy_stream(compute)
    dev.destroy_stream(free_stream)
    return FreeResult(iterations, mode, total, busy, blocked, peak)
