"""Every workload generator (npumem.workloads) on every allocator family, and per-allocation
latency as the pool grows.

Part 1: for each generator's default trace and each family, the peak reserved bytes over the peak
live bytes (roomy device) and the time per allocation in the first and the last quarter of the
trace (batch path, timed around the native calls by npumem.workloads.measure), and their ratio.

Part 2: the long-running service (npumem.workloads.long_running_service) whose cache of
long-lived blocks grows to ``--live`` entries: time per allocation per window against the live
blocks at that point, for every family, and the ratio of the last window's cost (largest pool) to
the first's. The claim under test: npumem's cost stays flat as the pool grows.

Part 3: what npumem.profiler adds to a malloc+free pair.

Single allocations and frees arrive in short runs (a request's three tensors, a tick's cache
inserts), so the figures include the binding's per-call cost (~1 us), the same for every family;
a family whose search grows with the pool shows it on top of that.

Run: make bench B=workloads   (or: .venv/bin/python benches/bench_workloads.py [--quick] [--live N])
"""

from __future__ import annotations

import argparse
import math
import statistics

from npumem import workloads
from npumem.units import fmt

FAMILIES = ["direct", "pytorch", "torch_npu", "npumem"]


def _mean(xs: list[float]) -> float:
    xs = [x for x in xs if not math.isnan(x)]
    return statistics.fmean(xs) if xs else math.nan


def part1(quick: bool) -> None:
    print("| workload | events | peak live | family | reserved / live | ns/alloc first 1/4 | last 1/4 | last/first |")
    print("|---|---:|---:|---|---:|---:|---:|---:|")
    for name in workloads.GENERATORS:
        kw = {"ticks": 1000, "cache_entries": 10000} if name == "long_running_service" else {}
        if quick and name in ("kv_cache_paged", "kv_cache_contiguous"):
            kw = {"requests": 60}
        events = workloads.generate(name, **kw)
        for fam in FAMILIES:
            tl = workloads.measure(events, fam, windows=40)
            first, last = _mean(tl.ns_per_alloc[:10]), _mean(tl.ns_per_alloc[-10:])
            print(
                f"| {name} | {len(events):,} | {fmt(tl.peak_live)} | {fam} | {tl.peak_reserved / tl.peak_live:.3f} "
                f"| {first:,.0f} | {last:,.0f} | {last / first:.2f} |"
            )


def part2(live: int, seed: int) -> None:
    ticks = max(200, live // 10)
    events = workloads.long_running_service(ticks=ticks, cache_entries=live, insert_rate=12.0, seed=seed)
    print(f"\nlong_running_service(ticks={ticks}, cache_entries={live}): {len(events):,} events")
    rows = {}
    for fam in FAMILIES:
        tl = workloads.measure(events, fam, windows=20)
        # The windows while the pool grows (before the final teardown frees everything).
        grow = [(b, ns) for b, ns in zip(tl.live_blocks, tl.ns_per_alloc, strict=True) if not math.isnan(ns)]
        rows[fam] = grow
    fams = " | ".join(FAMILIES)
    print(f"| live blocks (npumem run) | {fams} |")
    print("|---:|" + "---:|" * len(FAMILIES))
    n = min(len(r) for r in rows.values())
    for i in range(n):
        print(f"| {rows['npumem'][i][0]:,} | " + " | ".join(f"{rows[f][i][1]:,.0f}" for f in FAMILIES) + " |")
    print("| last/first | " + " | ".join(f"{rows[f][n - 1][1] / rows[f][0][1]:.2f}" for f in FAMILIES) + " |")


def part3() -> None:
    """What the profiler costs: a 4 KiB malloc+free pair from Python, without a profiler, with
    one (call sites on and off), best of 5 rounds of 20,000 pairs."""
    import time

    import npumem

    dev = npumem.Device("4GiB")

    def pair_ns() -> float:
        best = math.inf
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(20_000):
                dev.free(dev.malloc(4096))
            best = min(best, (time.perf_counter() - t0) / 20_000 * 1e9)
        return best

    base = pair_ns()
    with npumem.profiler(dev, call_sites=False):
        bare = pair_ns()
    with npumem.profiler(dev):
        sites = pair_ns()
    print("\n| malloc+free pair | ns | vs no profiler |")
    print("|---|---:|---:|")
    for label, ns in (("no profiler", base), ("profiler, call_sites=False", bare), ("profiler (call sites)", sites)):
        print(f"| {label} | {ns:,.0f} | {ns / base:.1f}x |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="smaller traces")
    ap.add_argument("--live", type=int, default=50000, help="cache entries of the service in part 2 (default 50000)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    part1(args.quick)
    part2(args.live if not args.quick else min(args.live, 10000), args.seed)
    part3()


if __name__ == "__main__":
    main()
