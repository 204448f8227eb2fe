"""Validates the TLB model against this machine: pointer-chase latency knees vs predicted knees.

Runs `cargo run --release -p npumem-core --example host_chase` (one line per 4 KiB page in a
random cycle, footprints doubling from 64 KiB, 4 KiB pages and transparent huge pages), finds the
latency knees (a step of at least 1.6x between consecutive footprints), and compares the 4 KiB
knees with the footprints at which the model's L1 and L2 TLBs stop holding the chase:

- with the `zen5` preset as published (96-entry L1, 4096-entry L2), and
- calibrated from the measurement (entries = knee footprint / 4 KiB), since a virtual machine
  hides the real TLB geometry and adds a nested walk.

Run: make bench B=validate-tlb   (or: .venv/bin/python benches/validate_tlb.py [max_footprint_mib])
"""

from __future__ import annotations

import csv
import io
import itertools
import subprocess
import sys

import npumem
from npumem import Policy
from npumem.patterns import pointer_chase
from npumem.tlb import Tlb
from npumem.units import fmt

KNEE = 1.6


def measure(max_mib: int) -> dict[str, list[tuple[int, float]]]:
    out = subprocess.run(
        ["cargo", "run", "--release", "-q", "-p", "npumem-core", "--example", "host_chase", str(max_mib)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    series: dict[str, list[tuple[int, float]]] = {}
    for row in csv.DictReader(io.StringIO(out)):
        series.setdefault(row["page"], []).append((int(row["footprint_bytes"]), float(row["ns_per_access"])))
    return series


def knees(points: list[tuple[int, float]]) -> list[int]:
    """Footprints at which the metric jumps by at least KNEE over the previous footprint."""
    return [b for (_, ya), (b, yb) in itertools.pairwise(points) if ya > 0 and yb / ya >= KNEE]


def model_knees(footprints: list[int], overrides: dict) -> tuple[int | None, int | None]:
    """The first footprints at which the model's L1 and L2 miss on most chase steps."""
    dev = npumem.Device(max(footprints) + (64 << 20), allocator="direct")
    l1 = l2 = None
    for fp in footprints:
        ptr = dev.malloc(fp, Policy.NORMAL_ONLY)
        tlb = Tlb.preset("zen5", dev, **overrides)
        addrs = pointer_chase(ptr, fp, 3 * (fp // 4096), seed=1)
        tlb.run(addrs[: fp // 4096])  # warm up one cycle
        tlb.reset_stats()
        st = tlb.run(addrs[fp // 4096 :])
        if l1 is None and st.levels[0].miss_rate > 0.5:
            l1 = fp
        if l2 is None and st.levels[1].lookups and st.levels[1].misses / st.levels[1].lookups > 0.5:
            l2 = fp
        dev.free(ptr)
    return l1, l2


def main() -> None:
    max_mib = int(sys.argv[1]) if len(sys.argv) > 1 else 512
    series = measure(max_mib)
    for page, pts in series.items():
        print(f"host, {page} pages: " + ", ".join(f"{fmt(f)} {ns:.1f} ns" for f, ns in pts))
        print(f"  knees (>= {KNEE}x): {[fmt(k) for k in knees(pts)]}")
    small = series["4KiB"]
    measured = knees(small)
    footprints = [f for f, _ in small]
    l1, l2 = model_knees(footprints, {})
    print(f"\nmodel zen5 (96-entry L1, 4096-entry L2): L1 knee {fmt(l1 or 0)}, L2 knee {fmt(l2 or 0)}")
    if len(measured) >= 2:
        k1 = measured[0]
        k2 = next((k for k in measured if k > 16 * k1), measured[-1])
        e1, e2 = k1 // 4096, k2 // 4096
        # Calibrated: the entry counts just below the measured knees (a power of two of ways).
        cal = {"0.0.entries": e1 // 2, "0.0.ways": e1 // 2, "1.0.entries": e2 // 2, "1.0.ways": 16}
        c1, c2 = model_knees(footprints, cal)
        print(f"calibrated (L1 {e1 // 2} entries, L2 {e2 // 2}): L1 knee {fmt(c1 or 0)}, L2 knee {fmt(c2 or 0)}")
        print(f"measured 4 KiB knees: first {fmt(k1)}, TLB-L2 candidate {fmt(k2)}")


if __name__ == "__main__":
    main()
