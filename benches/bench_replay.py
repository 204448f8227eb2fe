"""Allocator families side by side on allocation traces.

For each trace and each allocator (direct, pytorch, torch_npu, npumem) it reports: peak reserved
and peak allocated on a roomy device, the smallest device capacity on which the trace completes
without OOM (binary search, 2 MiB granularity; 1 MiB for traces under 1 GiB) and its ratio to
the trace's peak live bytes,
driver-level calls (physical allocations and maps) and the cache hit rate. The last columns give
npumem's minimum capacity relative to the pytorch preset's. Wall time of each replay is printed
too (Python-driven replay: it measures the whole stack, not the pool alone).

Traces: synthetic transformer training and a random churn (npumem.workloads), and the real traces
recorded from PyTorch on the CPU in benches/traces/ (benches/record_torch_traces.py).

Run: make bench B=replay   (or: .venv/bin/python benches/bench_replay.py [--quick])
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from npumem.formats import load
from npumem.replay import min_capacity, peak_live_bytes, replay
from npumem.units import fmt
from npumem.workloads import random_churn, transformer_training

FAMILIES = ["direct", "pytorch", "torch_npu", "npumem"]


def traces(quick: bool) -> dict[str, Any]:
    t = {
        "transformer 8L h1024 b4-8 s256-768": transformer_training(),
        "transformer 12L h2048 b2-8 s128-1024": transformer_training(
            layers=12, hidden=2048, steps=8, batch=(2, 8), seq=(128, 1024), seed=3
        ),
        "transformer 6L h1536 b8 s512 (steady)": transformer_training(
            layers=6, hidden=1536, steps=6, batch=(8, 8), seq=(512, 512), seed=5
        ),
        "random churn 4KiB-64MiB": random_churn(6000 if quick else 20000),
    }
    # Real traces recorded from PyTorch on the CPU by benches/record_torch_traces.py.
    for path in sorted((Path(__file__).parent / "traces").glob("*.json.gz")):
        t[f"recorded {path.name.removesuffix('.json.gz')}"] = load(str(path))
    if quick:
        t.pop("transformer 12L h2048 b2-8 s128-1024")
    return t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    for name, events in traces(args.quick).items():
        peak = peak_live_bytes(events)
        print(f"\n{name}: {len(events)} events, peak live {fmt(peak)}")
        print(
            f"  {'allocator':<10} {'peak resv':>10} {'peak alloc':>10} {'min cap':>10} {'vs live':>8} "
            f"{'phys allocs':>11} {'maps':>7} {'hit rate':>8} {'replay s':>8}"
        )
        needs = {}
        granularity = 2 << 20 if peak > 1 << 30 else 1 << 20
        for fam in FAMILIES:
            needs[fam] = min_capacity(events, {"allocator": fam}, granularity=granularity)
            t0 = time.perf_counter()
            r = replay(events, {"capacity": 4 * needs[fam], "allocator": fam})
            dt = time.perf_counter() - t0
            print(
                f"  {fam:<10} {fmt(r.peak_reserved):>10} {fmt(r.peak_allocated):>10} {fmt(needs[fam]):>10} "
                f"{needs[fam] / peak:7.3f}x {r.physical_allocs:>11} {r.maps:>7} {r.cache_hit_rate:8.3f} {dt:8.3f}"
            )
        print(
            f"  npumem min capacity / pytorch: {needs['npumem'] / needs['pytorch']:.3f}, "
            f"/ torch_npu: {needs['npumem'] / needs['torch_npu']:.3f}, "
            f"/ peak live: {needs['npumem'] / peak:.3f}"
        )


if __name__ == "__main__":
    main()
