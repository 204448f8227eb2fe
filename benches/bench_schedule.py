"""The op order chosen with the offsets (``Graph.plan(schedule=True)``) on every example graph
(examples/graphs/, from torch.export / make_fx) and recorded graph (benches/graphs/), beside the
given order and the XLA and Inductor portfolios in the same run; then MiniMalloc's A-K at capacity
with the default stop (a work limit, no time limit). Prints markdown tables (docs/benchmarks.md).
Run: make bench B=schedule.

Table 1 (arena bytes, aligned; each order's arena planned by npumem's placement): ops, the given
order's max-live bound, XLA's and Inductor's arenas (portfolio member), npumem's, the any-order
lower bound, whether npumem is proven optimal, the search's transitions, and the median wall time
of ``plan(schedule=True)`` over three runs.
Table 2: A-K, ``solve(capacity=1048576)`` with the defaults: outcome, search nodes, seconds.
"""

from __future__ import annotations

import glob
import os
import statistics
import time

from npumem.graph import Graph
from npumem.plan import DEFAULT_WORK_LIMIT, Problem

ROOT = os.path.join(os.path.dirname(__file__), "..")
KIB = 1 << 10


def main() -> None:
    files = sorted(glob.glob(os.path.join(ROOT, "examples", "graphs", "*.json")))
    files += sorted(glob.glob(os.path.join(ROOT, "benches", "graphs", "*.json.gz")))
    header = ["graph", "ops", "given KiB", "XLA KiB", "Inductor KiB", "npumem KiB", "any-order bound KiB"]
    header += ["npumem vs best anchor", "proven", "transitions", "s"]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for path in files:
        g = Graph.load(path)
        times = []
        for _ in range(3):
            t = time.perf_counter()
            p = g.plan(schedule=True)
            times.append(time.perf_counter() - t)
        s = p.schedule
        assert s is not None
        by = {c.scheduler: c for c in s.candidates}
        anchors = min(by[k].arena for k in ("given", "xla", "inductor"))
        cells = [
            os.path.basename(path).removesuffix(".json.gz"),
            f"{len(g.ops)}",
            f"{s.given_bound / KIB:,.0f}",
            f"{by['xla'].arena / KIB:,.0f} ({by['xla'].detail})",
            f"{by['inductor'].arena / KIB:,.0f} ({by['inductor'].detail})",
            f"{p.arena.peak / KIB:,.0f}",
            f"{s.bound / KIB:,.0f}",
            f"{100 * (p.arena.peak / anchors - 1):+.1f}%",
            "optimal" if s.optimal else f"{100 * (p.arena.peak / s.bound - 1):+.1f}% gap",
            f"{s.work:,}",
            f"{statistics.median(times):.2f}",
        ]
        print("| " + " | ".join(cells) + " |")
    print()
    print(
        f"MiniMalloc A-K, solve(capacity=1048576), defaults (work limit {DEFAULT_WORK_LIMIT:,} nodes, no time limit):"
    )
    print("| input | outcome | nodes | s |")
    print("|---|---|---|---|")
    for path in sorted(glob.glob(os.path.join(ROOT, "benches", "dsa", "minimalloc", "*.csv"))):
        problem = Problem.from_csv(path)
        t = time.perf_counter()
        plan = problem.solve(capacity=1_048_576)
        dt = time.perf_counter() - t
        print(f"| {os.path.basename(path)[0]} | {plan.exact} | {plan.search_nodes:,} | {dt:.2f} |")


if __name__ == "__main__":
    main()
