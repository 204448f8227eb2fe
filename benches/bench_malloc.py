"""malloc + free cost from Python, against named host peers in the same run.

Measures, per size and policy, the round trip malloc + free on the simulated device under the
direct (no-cache) allocator, which pays the full driver path each time (reserve VA, allocate
frames, write page-table entries, and the reverse), and under the default npumem pool (cached
pages: no driver call after the first round); and, as peers, numpy.empty (NumPy's host
allocator) and npumem's own malloc_host/free_host (the system allocator behind aclrtMallocHost).
Then the bandwidth of host->device writes and device->host reads against numpy's own memcpy.

Run: make bench   (or: .venv/bin/python benches/bench_malloc.py [--quick])
"""

from __future__ import annotations

import os

# numpy's BLAS threads spin on this 2-core machine and steal time from what is measured.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse

import numpy as np

import npumem
from npumem import Policy
from npumem._timing import per_call
from npumem.units import fmt


def per_op(fn, n: int) -> float:
    """Best of 3 runs of n calls, in microseconds per call."""
    return per_call(fn, n, 3) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer iterations")
    args = ap.parse_args()
    scale = 10 if args.quick else 1
    dev = npumem.Device("16GiB", allocator="direct")
    pool = npumem.Device("16GiB")
    print(f"npumem {npumem.__version__}: {dev} and {pool}")
    print()
    print(
        f"{'size':>8} {'policy':<12} {'page':>6} {'direct us':>10} {'pool us':>8} {'np.empty us':>12} "
        f"{'host us':>9} {'direct/np':>9} {'pool/np':>8}"
    )
    cases = [
        (4 << 10, Policy.HUGE_FIRST),
        (64 << 10, Policy.HUGE_FIRST),
        (1 << 20, Policy.HUGE_FIRST),
        (4 << 20, Policy.HUGE_FIRST),
        (4 << 20, Policy.NORMAL_ONLY),
        (64 << 20, Policy.HUGE_FIRST),
    ]
    for size, policy in cases:
        n = max(20, (200_000 // max(1, size >> 12)) // scale)
        page = dev.translate(p := dev.malloc(size, policy))[1]
        dev.free(p)
        t_dev = per_op(lambda s=size, pol=policy: dev.free(dev.malloc(s, pol)), n)
        t_pool = per_op(lambda s=size, pol=policy: pool.free(pool.malloc(s, pol)), n)
        t_np = per_op(lambda s=size: np.empty(s, np.uint8), n)
        t_host = per_op(lambda s=size: dev.free_host(dev.malloc_host(s)), n)
        print(
            f"{fmt(size):>8} {policy.name:<12} {fmt(page):>6} {t_dev:10.2f} {t_pool:8.2f} {t_np:12.2f} "
            f"{t_host:9.2f} {t_dev / t_np:8.1f}x {t_pool / t_np:7.1f}x"
        )
    print()
    size = 64 << 20
    data = np.random.default_rng(0).integers(0, 255, size, dtype=np.uint8)
    out = np.empty_like(data)
    ptr = dev.malloc(size, Policy.HUGE_FIRST)
    reps = 5 if args.quick else 20
    t_w = per_op(lambda: dev.write(ptr, data), reps)
    t_r = per_op(lambda: dev.read_into(ptr, out), reps)
    t_np = per_op(lambda: np.copyto(out, data), reps)
    gbps = lambda us: size / (us * 1e-6) / 1e9  # noqa: E731
    print(f"{'64MiB transfer':<22} {'GB/s':>8} {'vs numpy copy':>14}")
    print(f"{'write (host->device)':<22} {gbps(t_w):8.2f} {t_np / t_w:13.2f}x")
    print(f"{'read_into (device->host)':<22} {gbps(t_r):8.2f} {t_np / t_r:13.2f}x")
    print(f"{'numpy.copyto (peer)':<22} {gbps(t_np):8.2f} {1.0:13.2f}x")
    assert np.array_equal(out, data)
    dev.free(ptr)

    # Batch APIs: one crossing of the binding for many blocks.
    print()
    single = npumem.Device("16GiB")
    t_single = per_op(lambda: single.free(single.malloc(4096)), 100_000 // scale)
    print(f"{'4 KiB malloc+free':<30} {'us/pair':>8} {'Mpairs/s':>9}")
    print(f"{'single calls (1 live)':<30} {t_single:8.3f} {1 / t_single:9.2f}")
    for n in (1_000, 100_000 // scale):
        # n blocks live at once: the pool's trees and the live table hold n entries.
        sizes = np.full(n, 4096, np.uint64)
        batch = npumem.Device("16GiB")
        batch.free_many(batch.malloc_many(sizes))  # warm the pool
        t_batch = per_op(lambda b=batch, s=sizes: b.free_many(b.malloc_many(s)), 3) / n
        label = f"malloc_many/free_many ({n:,})"
        print(f"{label:<30} {t_batch:8.3f} {1 / t_batch:9.2f}  ({t_single / t_batch:.1f}x)")

    # The sanitizer is on by default: what does it cost a small host-visible access?
    print()
    print(f"{'64 B write+read':<22} {'us/op':>8} {'vs off':>8}")
    small = np.arange(64, dtype=np.uint8)
    times = {}
    for mode in ("off", "collect"):
        d = npumem.Device("1GiB", sanitizer=mode)
        p = d.malloc(4096)
        n = 200_000 // scale
        times[mode] = per_op(lambda d=d, p=p: (d.write(p, small), d.read(p, 64)), n)
        print(f"{'sanitizer=' + mode:<22} {times[mode]:8.3f} {times[mode] / times['off']:7.2f}x")


if __name__ == "__main__":
    main()
