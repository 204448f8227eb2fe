"""Every planning strategy on every input of benches/dsa/: arena above the max-live lower bound and
solve time, as a markdown table (docs/benchmarks.md). Run: make bench-plan.

MiniMalloc's challenging suite A-K has capacity 1,048,576; its published solver places each
within capacity (0.6-5.4 s), greedy heuristics land 12-40% above.
"""

from __future__ import annotations

import glob
import os
import sys

from npumem.plan import STRATEGIES, Problem

DSA = os.path.join(os.path.dirname(__file__), "dsa")


def main() -> int:
    files = sorted(glob.glob(os.path.join(DSA, "minimalloc", "*.csv")))
    files += sorted(glob.glob(os.path.join(DSA, "somas", "*.csv")))
    files += sorted(glob.glob(os.path.join(DSA, "iopddl", "*.csv")))
    header = ["input", "buffers", *STRATEGIES, "npumem s", "valid"]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for path in files:
        problem = Problem.from_csv(path)
        cells = []
        valid = True
        for s in STRATEGIES:
            plan = problem.solve(s)
            valid &= problem.validate(plan.offsets) == plan.peak
            cells.append(f"+{100 * plan.gap:.1f}%")
        name = os.path.basename(path).removesuffix(".csv").removesuffix(".1048576")
        row = [name, f"{len(problem):,}", *cells, f"{plan.solve_seconds:.2f}", "yes" if valid else "NO"]
        print("| " + " | ".join(row) + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
