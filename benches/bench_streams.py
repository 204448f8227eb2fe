"""Streams on the simulated clock.

1. Double-buffered pipeline, one stream vs copy + compute streams: for kernel times from half to
   twice the copy time, the simulated time of each schedule, the cost model's prediction, and the
   speedup the overlap gives (bounded by (copy + compute) / max(copy, compute)).
2. Freeing scratch memory: synchronise-then-free vs event-driven free vs stream-ordered free
   (npumem.pipelines.scratch_loop): total time, device idle time (the bubble), host blocks, and
   peak reserved memory.

Run: make bench B=streams   (or: .venv/bin/python benches/bench_streams.py)
"""

from __future__ import annotations

import npumem
from npumem.pipelines import FREE_MODES, double_buffered, scratch_loop


def main() -> None:
    batch = 64 << 20
    for preset in ("ascend910b", "ascend310p"):
        dev = npumem.Device("2GiB", preset=preset)
        probe = double_buffered(dev, batches=1, batch_bytes=batch, kernel_us=1.0, overlap=False)
        copy = probe.copy_us
        print(f"\n{preset}: 8 batches of 64 MiB, H2D copy {copy:.0f} us each")
        print(
            f"  {'kernel/copy':>11} {'serial us':>10} {'model':>8} {'overlap us':>11} {'model':>8} "
            f"{'speedup':>8} {'bound':>6}"
        )
        for ratio in (0.5, 1.0, 2.0):
            k = ratio * copy
            s = double_buffered(dev, batches=8, batch_bytes=batch, kernel_us=k, overlap=False)
            p = double_buffered(dev, batches=8, batch_bytes=batch, kernel_us=k, overlap=True)
            bound = (copy + k) / max(copy, k)
            print(
                f"  {ratio:11.1f} {s.total_us:10.0f} {s.predicted_us:8.0f} {p.total_us:11.0f} {p.predicted_us:8.0f} "
                f"{s.total_us / p.total_us:7.2f}x {bound:5.2f}x"
            )


def frees() -> None:
    print("\nscratch loop: 50 iterations of malloc 64 MiB on a compute stream, 300 us kernel, free")
    print(f"  {'free':<36} {'total us':>9} {'busy us':>8} {'idle us':>8} {'host blocks':>11} {'peak reserved':>13}")
    runs = [(mode, mode, True) for mode in FREE_MODES] + [("event", "event, no follow-event-dependencies", False)]
    for mode, label, follow in runs:
        dev = npumem.Device("8GiB")
        dev.set_pool_attr(npumem.MemPoolAttr.REUSE_FOLLOW_EVENT_DEPENDENCIES, follow)
        r = scratch_loop(dev, iterations=50, scratch_bytes=64 << 20, kernel_us=300.0, mode=mode)
        print(
            f"  {label:<36} {r.total_us:9.0f} {r.device_busy_us:8.0f} {r.idle_us:8.0f} {r.host_blocked:11} "
            f"{r.peak_reserved >> 20:10} MiB"
        )


if __name__ == "__main__":
    main()
    frees()
