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
    args = parser.parse_args(argv)
    if args.command == "demo":
        if args.plot:
            import os

            os.makedirs(os.path.dirname(args.plot) or ".", exist_ok=True)
        demo.run(capacity=args.capacity, seed=args.seed, out=sys.stdout, plot_path=args.plot or None)
    elif args.command == "tlb":
        return _tlb_sweep(args)
    return 0


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
