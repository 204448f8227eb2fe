"""The ``npumem`` command line: ``npumem demo`` runs the main job on the simulated device."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from . import demo


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="npumem", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    d = sub.add_parser("demo", help="page mix per policy and the fragmentation story, on the simulated device")
    d.add_argument("--capacity", default="1GiB", help="device size for the fragmentation story (default 1GiB)")
    d.add_argument("--seed", type=int, default=7, help="seed of the allocation churn (default 7)")
    d.add_argument(
        "--plot", default="target/npumem-demo/tlb_sweep.png", help="where to write the TLB plot ('' for none)"
    )
    t = sub.add_parser("tlb", help="the TLB model")
    tsub = t.add_subparsers(dest="tlb_command", required=True)
    sw = tsub.add_parser("sweep", help="presets x page sizes x patterns x footprints into a CSV table and a PNG plot")
    sw.add_argument("--presets", default="zen4,ascend_like", help="comma-separated TLB presets (Tlb.presets())")
    sw.add_argument("--pages", default="4KiB,2MiB,1GiB", help="comma-separated page sizes: 4KiB, 2MiB, 1GiB")
    sw.add_argument("--patterns", default="sequential,uniform,chase,gemm,gather", help="comma-separated patterns")
    sw.add_argument("--footprints", default="4MiB,64MiB,256MiB,1GiB", help="comma-separated footprints")
    sw.add_argument("--accesses", type=int, default=500_000, help="accesses per run (default 500000)")
    sw.add_argument("--seed", type=int, default=0)
    sw.add_argument("--csv", default="tlb_sweep.csv", help="output table (default tlb_sweep.csv)")
    sw.add_argument("--plot", default="tlb_sweep.png", help="output PNG ('' for none)")
    pl = sub.add_parser(
        "plan", help="static memory planning of a MiniMalloc CSV (id,lower,upper,size) or an npumem graph (.json[.gz])"
    )
    pl.add_argument(
        "file",
        help="problem CSV: id,lower,upper,size (half-open lifetimes [lower, upper)); or a graph saved by "
        "npumem.graph.Graph.save (.json / .json.gz)",
    )
    pl.add_argument("--strategy", default="npumem", help="a strategy name, or 'all' to compare every one")
    pl.add_argument("--capacity", default=None, help="arena size the plan must fit (e.g. 1048576 or 64MiB)")
    pl.add_argument(
        "--time-limit",
        type=float,
        default=None,
        help="seconds for the exact search of the npumem strategy (default 1; 0 = greedy only)",
    )
    pl.add_argument(
        "--mem-limit",
        default=None,
        help="graphs: device bytes for weights + I/O + arena; offload / recompute moves are chosen to fit",
    )
    pl.add_argument("--alignment", type=int, default=1, help="offset alignment in bytes (power of two, default 1)")
    pl.add_argument("--out", default=None, help="write the plan as CSV (id,lower,upper,size,offset)")
    pl.add_argument("--json", action="store_true", help="print the report as JSON")
    pl.add_argument("--plot", default=None, help="write the best plan's placement (step x offset) as a PNG")
    args = parser.parse_args(argv)
    if args.command == "demo":
        if args.plot:
            import os

            os.makedirs(os.path.dirname(args.plot) or ".", exist_ok=True)
        demo.run(capacity=args.capacity, seed=args.seed, out=sys.stdout, plot_path=args.plot or None)
    elif args.command == "tlb":
        return _tlb_sweep(args)
    elif args.command == "plan":
        return _plan(args)
    return 0


def _plan(args: argparse.Namespace) -> int:
    """Plans the file; exit status 1 when a capacity is given and the (best) plan exceeds it."""
    import json
    import os

    from . import plan
    from .errors import AclError
    from .units import parse_size

    if args.file.endswith((".json", ".json.gz")):
        return _plan_graph(args)
    try:
        problem = plan.Problem.from_csv(args.file, alignment=args.alignment)
        capacity = None if args.capacity is None else parse_size(args.capacity)
        names = plan.STRATEGIES if args.strategy == "all" else (args.strategy,)
        limit = plan.DEFAULT_TIME_LIMIT if args.time_limit is None else args.time_limit
        plans = [problem.solve(s, capacity=capacity, time_limit=limit) for s in names]
    except (AclError, OSError) as e:
        print(f"npumem plan: {e}", file=sys.stderr)
        return 2
    best = min(plans, key=lambda p: (p.peak, p.strategy != plan.DEFAULT_STRATEGY))
    if args.json:
        print(json.dumps([p.report() for p in plans] if len(plans) > 1 else best.report(), indent=2))
    else:
        print(f"{args.file}: {len(problem)} buffers, lower bound {problem.lower_bound:,} B")
        print(f"{'strategy':<24} {'peak':>14} {'vs bound':>9} {'reuse':>7} {'seconds':>8}  order / exact search")
        for p in plans:
            r = p.report()
            how = p.order if p.exact == "not run" else f"{p.order}; exact: {p.exact}"
            print(
                f"{p.strategy:<24} {p.peak:>14,} {100 * p.gap:>8.2f}% {100 * r['reuse_ratio']:>6.1f}% "
                f"{p.solve_seconds:>8.3f}  {how}"
            )
        if best.bound > problem.lower_bound:
            print(f"proven: no plan below {best.bound:,} B (exact search)")
        if capacity is not None:
            verdict = "fits" if best.fits else f"does NOT fit (over by {best.peak - capacity:,} B)"
            print(f"capacity {capacity:,} B: {best.strategy} {verdict}")
    if args.plot:
        best.plot(args.plot, title=f"{os.path.basename(args.file)}: {best.strategy}")
        print(f"placement -> {args.plot}", file=sys.stderr if args.json else sys.stdout)
    if args.out:
        best.to_csv(args.out)
        print(f"plan ({best.strategy}) -> {args.out}", file=sys.stderr if args.json else sys.stdout)
    return 0 if best.fits else 1


def _plan_graph(args: argparse.Namespace) -> int:
    """Plans a saved graph; exit status 1 when a memory limit is given and not met."""
    import json

    from .errors import AclError
    from .graph import Graph
    from .plan import DEFAULT_TIME_LIMIT, STRATEGIES
    from .units import parse_size

    try:
        graph = Graph.load(args.file)
        limit = None if args.mem_limit is None else parse_size(args.mem_limit)
        names = STRATEGIES if args.strategy == "all" else (args.strategy,)
        time_limit = DEFAULT_TIME_LIMIT if args.time_limit is None else args.time_limit
        plans = [graph.plan(s, mem_limit=limit, time_limit=time_limit) for s in names]
    except (AclError, OSError) as e:
        print(f"npumem plan: {e}", file=sys.stderr)
        return 2
    best = min(plans, key=lambda p: (p.peak_memory, p.arena.strategy != "npumem"))
    if args.json:
        print(json.dumps([p.report() for p in plans] if len(plans) > 1 else best.report(), indent=2))
    else:
        print(f"{args.file}: {len(graph)} tensors, {len(graph.ops)} ops")
        if len(plans) > 1:
            for p in plans:
                print(f"  {p.arena.strategy:<26} arena {p.arena.peak:>14,} B  {100 * p.arena.gap:+.2f}% vs bound")
        print(best.table())
        for m in best.moves[:20]:
            print(f"  move: {m.kind:<18} {m.tensor:<32} {m.bytes:>14,} B  {1e3 * m.seconds:.3f} ms")
        if len(best.moves) > 20:
            print(f"  ... {len(best.moves) - 20} more moves")
    if args.plot:
        best.arena.plot(args.plot, title=f"{args.file}: {best.arena.strategy}")
    if args.out:
        best.arena.to_csv(args.out)
    return 0 if best.fits else 1


def _tlb_sweep(args: argparse.Namespace) -> int:
    from . import tlb
    from .units import fmt, parse_size

    def split(text: str) -> list[str]:
        return [x.strip() for x in text.split(",") if x.strip()]

    rows = tlb.sweep(
        presets=split(args.presets),
        pages=split(args.pages),
        patterns=split(args.patterns),
        footprints=[parse_size(f) for f in split(args.footprints)],
        accesses=args.accesses,
        seed=args.seed,
    )
    tlb.write_csv(rows, args.csv)
    print(f"{len(rows)} runs -> {args.csv}")
    print(
        f"{'preset':<12} {'page':<5} {'pattern':<10} {'footprint':>9} {'L1 MPKA':>8} {'walks/1k':>9} "
        f"{'cyc/acc':>8} {'Macc/s':>7}"
    )
    for r in rows:
        walks = 1000 * r["walks"] / max(r["accesses"], 1)
        print(
            f"{r['preset']:<12} {r['page']:<5} {r['pattern']:<10} {fmt(r['footprint']):>9} {r['L1_mpka']:8.2f} "
            f"{walks:9.2f} {r['cycles_per_access']:8.3f} {r['accesses_per_s'] / 1e6:7.1f}"
        )
    if args.plot:
        tlb.plot(rows, args.plot)
        tradeoff = args.plot.removesuffix(".png") + "_tradeoff.png"
        tlb.plot_tradeoff(rows, tradeoff)
        print(f"plots -> {args.plot}, {tradeoff}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
