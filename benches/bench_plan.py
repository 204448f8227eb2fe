"""Every planning strategy on every input of benches/dsa/: arena above the max-live lower bound and
solve time, as a markdown table (docs/benchmarks.md). Run: make bench B=plan.

Columns: the baselines and npumem's greedy portfolio (no exact search); npumem with the exact
search minimising the peak for up to LIMIT seconds (gap, how it ended, seconds); and on
MiniMalloc's challenging suite A-K (capacity 1,048,576) the seconds npumem needs to place all
buffers within the capacity, next to MiniMalloc's published times (slide 22 of its ASPLOS'23 talk;
a different machine). Greedy heuristics land 12-40% above the capacity there.
"""

from __future__ import annotations

import glob
import os
import sys

from npumem.plan import STRATEGIES, Problem

DSA = os.path.join(os.path.dirname(__file__), "dsa")
LIMIT = float(os.environ.get("NPUMEM_PLAN_LIMIT", "10"))
CAPACITY = 1_048_576
MINIMALLOC_MS = {"A": 4910, "B": 3661, "C": 637, "D": 2674, "E": 3717, "F": 5358}
MINIMALLOC_MS |= {"G": 1181, "H": 1808, "I": 3908, "J": 883, "K": 628}


def main() -> int:
    files = sorted(glob.glob(os.path.join(DSA, "minimalloc", "*.csv")))
    files += sorted(glob.glob(os.path.join(DSA, "somas", "*.csv")))
    files += sorted(glob.glob(os.path.join(DSA, "iopddl", "*.csv")))
    greedy = [s if s != "npumem" else "npumem greedy" for s in STRATEGIES]
    header = ["input", "buffers", *greedy, "greedy s", f"npumem exact ({LIMIT:g} s)", "ended", "s"]
    header += ["fit 1 MiB: s", "MiniMalloc s", "valid"]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for path in files:
        problem = Problem.from_csv(path)
        name = os.path.basename(path).removesuffix(".csv").removesuffix(".1048576")
        cells = []
        valid = True
        for s in STRATEGIES:
            plan = problem.solve(s, time_limit=0)
            valid &= problem.validate(plan.offsets) == plan.peak
            cells.append(f"+{100 * plan.gap:.1f}%")
        cells.append(f"{plan.solve_seconds:.2f}")
        exact = problem.solve(time_limit=LIMIT)
        valid &= problem.validate(exact.offsets) == exact.peak
        cells += [f"+{100 * exact.gap:.2f}%", exact.exact, f"{exact.solve_seconds:.2f}"]
        if name in MINIMALLOC_MS:
            fit = problem.solve(capacity=CAPACITY, time_limit=LIMIT)
            valid &= problem.validate(fit.offsets) == fit.peak <= CAPACITY
            cells += [f"{fit.solve_seconds:.2f} ({fit.exact})", f"{MINIMALLOC_MS[name] / 1000:.2f}"]
        else:
            cells += ["", ""]
        row = [name, f"{len(problem):,}", *cells, "yes" if valid else "NO"]
        print("| " + " | ".join(row) + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
