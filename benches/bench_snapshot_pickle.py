"""The snapshot-pickle admission scan against the load it guards: a PyTorch-style memory
snapshot of N trace entries (each with one frame) and 20,000 segment blocks, pickled at protocol
4; `npumem._snapshot_pickle.check` (the Rust scan) beside `pickle.loads` of the same bytes and the
scan's Python model (tests/snapshot_pickle_model.py). Least of 5 interleaved rounds.

Run: .venv/bin/python benches/bench_snapshot_pickle.py [--entries N]
"""

from __future__ import annotations

import argparse
import os
import pathlib
import pickle
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).parent.parent / "tests"))
import snapshot_pickle_model as model

from npumem import _snapshot_pickle


def snapshot(entries: int) -> bytes:
    trace = [
        {"action": "alloc", "addr": i * 512, "size": 512, "stream": 0, "time_us": i,
         "frames": [{"filename": "train.py", "line": i % 100, "name": "forward"}]}
        for i in range(entries)
    ]  # fmt: skip
    blocks = [
        {"address": i * 512, "size": 512, "state": "active_allocated", "requested_size": 500} for i in range(20000)
    ]
    segs = [{"device": 0, "address": 0, "total_size": 1 << 30, "stream": 0, "blocks": blocks}]
    return pickle.dumps({"segments": segs, "device_traces": [trace]}, protocol=4)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--entries", type=int, default=100_000)
    args = ap.parse_args()
    data = snapshot(args.entries)
    runs = {"scan (Rust)": _snapshot_pickle.check, "pickle.loads": pickle.loads, "scan model (Python)": model.check}
    best = dict.fromkeys(runs, float("inf"))
    for _ in range(5):
        for name, f in runs.items():
            t = time.perf_counter()
            f(data)
            best[name] = min(best[name], time.perf_counter() - t)
    print(f"{len(data) / 1e6:.1f} MB snapshot, {args.entries:,} entries; load average {os.getloadavg()[0]:.2f}")
    for name, t in best.items():
        print(f"  {name:<22} {t * 1e3:8.1f} ms   {t / best['pickle.loads']:6.3f}x the load")


if __name__ == "__main__":
    main()
