"""Double-buffered pipeline on the simulated clock: one stream vs copy + compute streams.

For kernel times from half to twice the copy time, prints the simulated time of the serial
schedule and of the overlapped one, the cost model's prediction for each, and the speedup the
overlap gives (bounded by (copy + compute) / max(copy, compute)).

Run: make bench-streams   (or: .venv/bin/python benches/bench_streams.py)
"""

from __future__ import annotations

import npumem
from npumem.pipelines import double_buffered


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


if __name__ == "__main__":
    main()
