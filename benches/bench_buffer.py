"""Device.buffer (one owning allocation, freed when collected) against np.empty + del, in the
same run (issue 16): ns per create+drop, best of several interleaved rounds, and the ratios.

Rows: ``Device.buffer(4096)`` on the simulator and on the host backend; the two-call
``free(malloc(4096))`` it replaces; ``np.empty(4096)`` (32 KiB of float64, the issue's peer) and
``np.empty(4096, np.uint8)`` (the same 4 KiB). Goal: Device.buffer cheaper than np.empty(4096).

Run: make bench-buffer   (or: .venv/bin/python benches/bench_buffer.py [--rounds N])
"""

from __future__ import annotations

import argparse
import timeit

import numpy as np

import npumem


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--number", type=int, default=200_000)
    args = ap.parse_args()
    sim = npumem.Device("1GiB")
    cases = {
        "Device.buffer(4096), sim": lambda: sim.buffer(4096),
        "free(malloc(4096)), sim": lambda: sim.free(sim.malloc(4096)),
        "np.empty(4096)": lambda: np.empty(4096),
        "np.empty(4096, np.uint8)": lambda: np.empty(4096, np.uint8),
    }
    try:
        host = npumem.Device("1GiB", backend="host")
        cases["Device.buffer(4096), host"] = lambda: host.buffer(4096)
    except npumem.AclError as e:
        print(f"(host backend unavailable: {e})")
    best = dict.fromkeys(cases, float("inf"))
    for _ in range(args.rounds):  # interleaved, so load on the machine hits every case alike
        for name, fn in cases.items():
            fn()
            best[name] = min(best[name], timeit.timeit(fn, number=args.number) / args.number * 1e9)
    peer = best["np.empty(4096)"]
    print(f"{'case':<28} {'ns/op':>8} {'vs np.empty(4096)':>18}")
    for name, ns in best.items():
        print(f"{name:<28} {ns:8.1f} {ns / peer:17.2f}x")


if __name__ == "__main__":
    main()
