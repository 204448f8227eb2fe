"""Device.buffer (one owning allocation, freed when collected) against np.empty + del, in the
same run: ns of CPU time per create+drop, best of many interleaved rounds, and the
ratios.

Rows: ``Device.buffer(4096)`` on the simulator and on the host backend; the two-call
``free(malloc(4096))`` it replaces; ``np.empty(4096)`` (32 KiB of float64, the issue's peer) and
``np.empty(4096, np.uint8)`` (the same 4 KiB). Goal: Device.buffer cheaper than np.empty(4096).

Each round times every case once (``--number`` calls each, thread CPU time, so time this
process waits for a core on a loaded machine is not counted), in turn, so load that comes and
goes hits every case alike; each case keeps its best round.

Run: make bench B=buffer   (or: .venv/bin/python benches/bench_buffer.py [--rounds N] [--number N])
"""

from __future__ import annotations

import argparse
import os
import time
import timeit

import numpy as np

import npumem

PEER = "np.empty(4096)"
SUBJECT = "Device.buffer(4096), sim"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=21)
    ap.add_argument("--number", type=int, default=50_000)
    args = ap.parse_args()
    sim = npumem.Device("1GiB")
    cases = {
        SUBJECT: lambda: sim.buffer(4096),
        "free(malloc(4096)), sim": lambda: sim.free(sim.malloc(4096)),
        PEER: lambda: np.empty(4096),
        "np.empty(4096, np.uint8)": lambda: np.empty(4096, np.uint8),
    }
    try:
        host = npumem.Device("1GiB", backend="host")
        cases["Device.buffer(4096), host"] = lambda: host.buffer(4096)
    except npumem.AclError as e:
        print(f"(host backend unavailable: {e})")
    best = dict.fromkeys(cases, float("inf"))
    load = os.getloadavg()[0]
    for _ in range(args.rounds):  # interleaved, so load on the machine hits every case alike
        for name, fn in cases.items():
            fn()
            ns = timeit.timeit(fn, number=args.number, timer=time.thread_time) / args.number * 1e9
            best[name] = min(best[name], ns)
    load = max(load, os.getloadavg()[0])
    peer = best[PEER]
    print(f"{'case':<28} {'ns/op (CPU)':>12} {'vs ' + PEER:>20}")
    for name, ns in best.items():
        print(f"{name:<28} {ns:12.1f} {ns / peer:19.2f}x")
    verdict = "met" if best[SUBJECT] < peer else "not met"
    print(f"goal ({SUBJECT} cheaper than {PEER}): {verdict}; load average up to {load:.1f}")


if __name__ == "__main__":
    main()
