"""Real model graphs (imported from PyTorch by benches/record_torch_graphs.py, stored in
benches/graphs/) planned by every strategy, and the training graphs under a memory limit.
Prints markdown tables (docs/benchmarks.md). Run: make bench B=plan.

Table 1: the activation arena of each strategy above the arena's max-live lower bound.
Table 2: npumem under ``mem_limit`` = a fraction of the unconstrained peak (weights + I/O +
arena): what was moved (weights offloaded, activations offloaded, activations recomputed), the
transfer and recompute time on the ascend910b cost model, and whether it fits.
"""

from __future__ import annotations

import glob
import os
import sys

from npumem.graph import Graph
from npumem.plan import STRATEGIES

HERE = os.path.join(os.path.dirname(__file__), "graphs")
MIB = 1 << 20


def main() -> int:
    files = sorted(glob.glob(os.path.join(HERE, "*.json.gz")))
    header = ["graph", "tensors", "ops", "buffers", "naive MiB", "bound MiB", *STRATEGIES, "npumem s"]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    graphs = {}
    for path in files:
        name = os.path.basename(path).removesuffix(".json.gz")
        g = graphs[name] = Graph.load(path)
        plans = {s: g.plan(s) for s in STRATEGIES}
        r = plans["npumem"].report()
        cells = [f"+{100 * (p.arena.peak / p.arena.lower_bound - 1):.2f}%" for p in plans.values()]
        row = [name, str(len(g)), str(len(g.ops)), str(r["buffers"]), f"{r['naive_activation_memory'] / MIB:.2f}"]
        row += [f"{r['lower_bound'] / MIB:.2f}", *cells, f"{r['solve_seconds']:.3f}"]
        print("| " + " | ".join(row) + " |", flush=True)
    print()
    header = ["graph", "limit", "peak MiB", "moves", "weights off MiB", "acts off MiB", "recomputed MiB"]
    header += ["transfer ms", "recompute ms", "fits", "s"]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for name, g in graphs.items():
        if "train" not in name:
            continue
        free = g.plan().peak_memory
        for frac in (0.9, 0.75, 0.6):
            p = g.plan(mem_limit=int(free * frac))
            r = p.report()
            row = [name, f"{frac:.0%} of {free / MIB:.0f} MiB", f"{p.peak_memory / MIB:.1f}", str(r["moves"])]
            row += [f"{r[k] / MIB:.1f}" for k in ("offloaded_weight_bytes", "offloaded_activation_bytes")]
            row += [f"{r['recomputed_bytes'] / MIB:.1f}", f"{1e3 * r['transfer_seconds']:.2f}"]
            row += [f"{1e3 * r['recompute_seconds']:.2f}", "yes" if p.fits else "no", f"{r['solve_seconds']:.2f}"]
            print("| " + " | ".join(row) + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
