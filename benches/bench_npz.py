"""npumem's compact trace format at scale: write and read an npz trace of N events
(a churn: ids in order of allocation, 8 sizes from 64 KiB to 8 MiB, about 2,000 live), its size on disk
per event, and the time to replay it on the npumem pool from the file.

Run: .venv/bin/python benches/bench_npz.py [--events N] [--compress]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import numpy as np

from npumem import formats, replay


def churn(n: int, live: int = 2000, seed: int = 7) -> formats.Trace:
    """Allocs of fresh ids and frees of the oldest live ones (a FIFO of about ``live`` blocks)."""
    rng = np.random.default_rng(seed)
    allocs = n // 2
    ids = np.arange(allocs, dtype=np.uint64)
    # Event 2k+... : alloc of id k; after `live` allocs, each alloc is followed by the free of id k - live.
    is_alloc = np.empty(n, np.uint8)
    col = np.empty(n, np.uint64)
    head = min(live, allocs)
    is_alloc[:head] = 1
    col[:head] = ids[:head]
    rest = allocs - head
    is_alloc[head : head + 2 * rest : 2] = 1
    col[head : head + 2 * rest : 2] = ids[head:]
    is_alloc[head + 1 : head + 2 * rest : 2] = 0
    col[head + 1 : head + 2 * rest : 2] = ids[:rest]
    tail = n - (head + 2 * rest)
    is_alloc[n - tail :] = 0
    col[n - tail :] = ids[rest : rest + tail]
    sizes_of = np.array([64, 192, 256, 768, 1024, 3072, 4096, 8192], np.uint64)[rng.integers(0, 8, allocs)] << 10
    sizes = sizes_of[col.astype(np.int64)]
    return formats.Trace(is_alloc, col, sizes)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=10_000_000)
    ap.add_argument("--compress", action="store_true")
    args = ap.parse_args()
    t = churn(args.events)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "trace.npz")
        t0 = time.perf_counter()
        formats.write_npz(t, path, compress=args.compress)
        t1 = time.perf_counter()
        back = formats.load(path)
        t2 = time.perf_counter()
        size = os.path.getsize(path)
        r = replay.replay(back, "npumem", capacity="64GiB")
        print(
            f"{len(t):,} events: write {t1 - t0:.2f} s, read (with pair checks) {t2 - t1:.2f} s, "
            f"{size / len(t):.1f} bytes/event ({size / 2**20:.0f} MiB); replay on npumem from the file: "
            f"{r.seconds:.2f} s ({len(t) / r.seconds / 1e6:.2f} M events/s wall), {r.allocs:,} allocs"
        )


if __name__ == "__main__":
    main()
