"""The TLB model's speed from Python on numpy input, beside the reference model.

One device holds a 1 GiB block of 2 MiB pages (``HUGE_ONLY``) and a 1 GiB block of 4 KiB pages
(``NORMAL_ONLY``). Over each, four address streams of ``--accesses`` accesses (``npumem.patterns``):
streaming (64 B steps), strided (4 KiB + 64 B: a new 4 KiB page every access), uniform random
(64 B-aligned, GUPS-like) and a Zipf gather (4 KiB rows, exponent 1.2, popular rows scattered).
Each runs through ``Tlb.run`` (the fast model) and ``Tlb(model="reference")`` (the linear-scan
model it replaced, bit-identical, which this script checks on every stream) on the skylake and
zen4 presets and zen4_kvm (zen4 as a guest over 4 KiB host pages: every walk two-dimensional), through the
device's page table.

Rates are accesses per second of wall time and of the calling thread's CPU time (steadier on a
shared machine), the best of ``--rounds`` runs on a warm TLB; the two models take turns in every
round, so a slow spell hits both and the ratio stays fair. The reference runs a quarter of the
accesses (it is slow).

Run: make bench B=tlb   (or: .venv/bin/python benches/bench_tlb.py [--accesses N] [--rounds N]
[--presets skylake,zen4] [--quick]; --presets none: the nesting rows only)
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

import npumem
from npumem import Policy
from npumem.patterns import sequential, strided, uniform
from npumem.tlb import Tlb

KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30
FOOTPRINT = GIB


def zipf_gather(base: int, footprint: int, count: int, seed: int = 0) -> np.ndarray:
    """``count`` reads of 4 KiB rows drawn Zipf(1.2) (rank 1 the most popular), the ranks
    scattered over the rows by a fixed permutation, each at a random 64 B line of its row."""
    rows = footprint // (4 * KIB)
    rng = np.random.default_rng(seed)
    rank = (rng.zipf(1.2, count).astype(np.uint64) - np.uint64(1)) % np.uint64(rows)
    row = rng.permutation(rows).astype(np.uint64)[rank]
    line = rng.integers(0, 4 * KIB // 64, count, dtype=np.uint64) * np.uint64(64)
    return np.uint64(base) + row * np.uint64(4 * KIB) + line


def streams(base: int, n: int) -> dict[str, np.ndarray]:
    return {
        "streaming": np.resize(sequential(base, min(FOOTPRINT, n * 64), 64), n),
        "strided": strided(base, FOOTPRINT, 4 * KIB + 64, n),
        "uniform random": uniform(base, FOOTPRINT, n, seed=1),
        "Zipf gather": zipf_gather(base, FOOTPRINT, n, seed=2),
    }


def timed(tlb: Tlb, addrs: np.ndarray) -> tuple[float, float]:
    """Wall and thread-CPU seconds of one run."""
    w0, c0 = time.perf_counter(), time.thread_time()
    tlb.run(addrs)
    return time.perf_counter() - w0, time.thread_time() - c0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--accesses", type=int, default=8 << 20)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--presets", default="skylake,zen4,zen4_kvm")
    ap.add_argument("--quick", action="store_true", help="1 Mi accesses, 2 rounds")
    args = ap.parse_args()
    n, rounds = (1 << 20, 2) if args.quick else (args.accesses, args.rounds)
    dev = npumem.Device(2 * GIB + 64 * MIB, allocator="direct")
    blocks = {"2MiB": dev.malloc(FOOTPRINT, Policy.HUGE_ONLY), "4KiB": dev.malloc(FOOTPRINT, Policy.NORMAL_ONLY)}
    print(f"{n} accesses a stream (the reference model: {n // 4}), best of {rounds} rounds; M accesses/s")
    print(
        f"{'preset':<8} {'pages':<5} {'stream':<15} {'fast wall':>9} {'fast CPU':>9} "
        f"{'ref wall':>9} {'ref CPU':>9} {'CPU ratio':>9}"
    )
    for preset in [p for p in args.presets.split(",") if p != "none"]:
        for page, base in blocks.items():
            for name, addrs in streams(base, n).items():
                short = addrs[: n // 4]
                # The same stream through both models: identical counters (the fast model's promise).
                a, b = Tlb.preset(preset, dev), Tlb.preset(preset, dev, model="reference")
                if a.run(short) != b.run(short):
                    raise SystemExit(f"{preset} {page} {name}: the fast model differs from the reference")
                best = {"fast": [float("inf")] * 2, "reference": [float("inf")] * 2}
                for _ in range(rounds):
                    for model, arr in (("fast", addrs), ("reference", short)):
                        tlb = Tlb.preset(preset, dev, model=model)
                        tlb.run(arr[: len(arr) // 8])  # warm
                        wall, cpu = timed(tlb, arr)
                        best[model] = [min(best[model][0], wall), min(best[model][1], cpu)]
                fw, fc = (n / s / 1e6 for s in best["fast"])
                rw, rc = (n / 4 / s / 1e6 for s in best["reference"])
                print(f"{preset:<8} {page:<5} {name:<15} {fw:9.1f} {fc:9.1f} {rw:9.1f} {rc:9.1f} {fc / rc:8.1f}x")
    nesting(dev, blocks, n, rounds)


def nesting(dev: npumem.Device, blocks: dict[str, int], n: int, rounds: int) -> None:
    """The headline stream (skylake, uniform random over 1 GiB) over 2 MiB and over 4 KiB guest
    pages, each native and as a guest over 2 MiB and 4 KiB host pages (4 KiB: every entry
    splinters, nearly every access walks in two dimensions); all six in turn every round, best
    of the rounds in M accesses/s of CPU time, the ratio to the same guest pages native, and
    the load average beside them."""
    hosts = {"native": {}, "host 2MiB": {"host_page_size": 2 * MIB}, "host 4KiB": {"host_page_size": 4 * KIB}}
    cases = [(page, label) for page in blocks for label in hosts]
    addrs = {page: uniform(base, FOOTPRINT, n, seed=1) for page, base in blocks.items()}
    best = dict.fromkeys(cases, float("inf"))
    walks = {}
    for _ in range(rounds):
        for page, label in cases:
            tlb = Tlb.preset("skylake", dev, **hosts[label])
            tlb.run(addrs[page][: n // 8])  # warm
            tlb.reset_stats()
            best[page, label] = min(best[page, label], timed(tlb, addrs[page])[1])
            st = tlb.stats()
            walks[page, label] = (st.walks / st.accesses, st.reads_per_walk)
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"\nnesting: skylake, uniform random over 1 GiB; M accesses/s CPU, best of {rounds}; load {load}")
    for page, label in cases:
        rate = n / best[page, label] / 1e6
        w, r = walks[page, label]
        print(
            f"guest {page:<5} {label:<10} {rate:8.1f}  {best[page, 'native'] / best[page, label]:5.2f}x native  "
            f"walks/access {w:.3f}  reads/walk {r:.2f}"
        )


if __name__ == "__main__":
    main()
