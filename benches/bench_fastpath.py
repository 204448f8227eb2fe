"""The Python-side fast paths, measured in one run against named peers, printed as ratios.

1. One alloc+free pair of 4 KiB: a no-op PyO3 method pair (the floor of two binding calls), a
   pure-Python dict free list, ``np.empty(4096)``, the simulated ``Device`` (npumem pool),
   ``HostPool.buffer`` and ``HostPool.empty``; and the HostPool's own pair without Python
   (``churn``, Rust only).
2. Batch APIs (``Device.malloc_many`` / ``free_many``) in operations per second.
3. Large temporaries touched once (every page written): ``HostPool.zeros`` / ``HostPool.empty``
   against ``np.zeros`` / ``np.empty`` at 64 KiB, 1 MiB and 64 MiB.

Run: make bench B=fastpath   (or: .venv/bin/python benches/bench_fastpath.py [--quick])
"""

from __future__ import annotations

import os

# numpy's BLAS threads spin on this 2-core machine and steal time from what is measured.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse
import gc
import time

import numpy as np

import npumem
from npumem._timing import best_of, per_call
from npumem.hostpool import HostPool


def per_op(fn, n: int, repeat: int = 5) -> float:
    """Best of ``repeat`` runs of n calls, in nanoseconds per call."""
    return per_call(fn, n, repeat) * 1e9


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    n = 20_000 if args.quick else 200_000
    gc.disable()
    dev = npumem.Device("16GiB")
    pool = HostPool("8GiB")
    free_list: dict[int, list[int]] = {4096: list(range(64))}

    def dict_pair() -> None:
        fl = free_list[4096]
        fl.append(fl.pop())

    # Pairs call methods the way a program does (attribute lookup, then the call), so the no-op
    # pair is the floor of two method calls on the same object. The "bound" rows call methods
    # looked up once beforehand, against a no-op pair called the same way.
    noop, malloc, free = dev._noop, dev.malloc, dev.free
    pairs = {
        "no-op PyO3 method pair": lambda: (dev._noop(1), dev._noop(2)),
        "Python dict free list": dict_pair,
        "np.empty(4096)": lambda: np.empty(4096, np.uint8),
        "Device malloc+free": lambda: dev.free(dev.malloc(4096)),
        "HostPool.buffer(4096)": lambda: pool.buffer(4096),
        "HostPool.empty(4096)": lambda: pool.empty(4096, np.uint8),
        "no-op pair, bound methods": lambda: (noop(1), noop(2)),
        "Device pair, bound methods": lambda: free(malloc(4096)),
    }
    t = {name: s * 1e9 for name, s in best_of(pairs, n // 4, rounds=20).items()}
    t0 = time.perf_counter()
    pool.churn(4096, 10 * n)
    t["HostPool pair, Rust only"] = (time.perf_counter() - t0) / (10 * n) * 1e9
    npe = t["np.empty(4096)"]
    print(f"{'4 KiB alloc+free pair':<28} {'ns':>8} {'/ no-op pair':>13} {'np.empty /':>11}")
    for name, ns in t.items():
        floor = t["no-op pair, bound methods" if "bound" in name else "no-op PyO3 method pair"]
        print(f"{name:<28} {ns:8.1f} {ns / floor:12.2f}x {npe / ns:10.2f}x")
    print()

    print(f"{'batch (4 KiB blocks)':<34} {'ns/op':>7} {'Mops/s':>8}")
    for live in (1_000, 100_000):
        sizes = np.full(live, 4096, np.uint64)
        d = npumem.Device("16GiB")
        d.free_many(d.malloc_many(sizes))
        calls = max(2, 20_000 // live)  # per round; the best of 10 rounds is kept
        ns = per_op(lambda d=d, s=sizes: d.free_many(d.malloc_many(s)), calls, repeat=10) / (2 * live)
        print(f"{f'malloc_many+free_many ({live:,} live)':<34} {ns:7.1f} {1e3 / ns:8.2f}")
    print()

    head = ("touched once", "np.zeros us", "pool.zeros us", "ratio", "np.empty us", "pool.empty us", "ratio")
    print("{:<10} {:>12} {:>14} {:>6} {:>12} {:>14} {:>6}".format(*head))
    for size in (64 << 10, 1 << 20, 64 << 20):
        reps = max(5, (2000 if not args.quick else 200) * (64 << 10) // size)

        def touch(a: np.ndarray) -> None:
            a[::4096] = 1  # one write per page

        cases = {
            "np.zeros": lambda s=size: touch(np.zeros(s, np.uint8)),
            "pool.zeros": lambda s=size: touch(pool.zeros(s, np.uint8)),
            "np.empty": lambda s=size: touch(np.empty(s, np.uint8)),
            "pool.empty": lambda s=size: touch(pool.empty(s, np.uint8)),
        }
        us = {k: s * 1e6 for k, s in best_of(cases, reps, rounds=3).items()}
        print(
            f"{npumem.units.fmt(size):<10} {us['np.zeros']:12.1f} {us['pool.zeros']:14.1f} "
            f"{us['np.zeros'] / us['pool.zeros']:5.1f}x {us['np.empty']:12.1f} {us['pool.empty']:14.1f} "
            f"{us['np.empty'] / us['pool.empty']:5.1f}x"
        )
    print("\nratio > 1: the pool is faster. numpy's large arrays come from fresh mmap'd pages (a fault")
    print("and kernel zeroing per page); the pool's blocks keep their pages between uses.")


if __name__ == "__main__":
    main()
