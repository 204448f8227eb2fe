"""``npumem stress``: the adversarial fragmentation search (:mod:`npumem.stress`) on the command
line. Exit status as the rest of the CLI (:mod:`npumem.cli`): 0 done, 2 a usage or input error.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from ._cli_base import EXIT_OK, UsageError, _output_path


def add_parser(sub: Any) -> None:
    """Adds ``stress`` to the ``npumem`` subcommands."""
    from .stress import FAMILIES, OBJECTIVES

    s = sub.add_parser(
        "stress",
        help="search for a short workload that makes an allocator family waste the most memory",
        description="A seeded search (mutation of workloads, keeping what raises the objective) for a short "
        "workload that maximises an allocator family's waste; the worst one is shrunk, compared across "
        "families and saved as a replayable trace.",
    )
    s.add_argument("--allocator", required=True, help=f"the family to attack: {', '.join(FAMILIES)}")
    s.add_argument("--budget", default="10", help="seconds of search (default 10)")
    s.add_argument("--evaluations", default=None, help="evaluate exactly this many workloads instead of a time budget")
    s.add_argument("--seed", default="0", help="seed of the search (default 0)")
    s.add_argument("--max-allocs", default="16", help="most blocks in a workload (2-1024, default 16)")
    s.add_argument(
        "--objective",
        default="capacity",
        help=f"{', '.join(OBJECTIVES)}: min capacity / bound (default), peak reserved / bound, or OOM with "
        "the least live data at --capacity; the bound is the peak live bytes rounded up to 2 MiB",
    )
    s.add_argument("--min-live", default="64MiB", help="least peak live bytes of a workload (0-256MiB, default 64MiB)")
    s.add_argument("--capacity", default=None, help="device size for --objective oom (e.g. 1GiB)")
    s.add_argument("--alloc-conf", default=None, help="PYTORCH_NPU_ALLOC_CONF-style settings of the family")
    s.add_argument(
        "--out", default=None, help="where to save the worst workload (default stress-<allocator>-<seed>.json)"
    )
    s.add_argument("--json", action="store_true", help="print the report as JSON")
    s.set_defaults(run=run)


def _int(value: str, option: str, lo: int, hi: int) -> int:
    try:
        v = int(value)
    except ValueError:
        raise UsageError(f"{option} {value!r} is not an integer") from None
    if not lo <= v <= hi:
        raise UsageError(f"{option} must be from {lo:,} to {hi:,}, got {v:,}")
    return v


def _size(value: str, option: str) -> int:
    from . import _args
    from .stress import SIZE_RANGE

    return _args.size(value, option, 0, SIZE_RANGE[1])


def run(args: argparse.Namespace) -> int:
    from . import stress
    from .units import fmt

    if args.allocator not in stress.FAMILIES:
        raise UsageError(f"--allocator {args.allocator!r} is not one of {', '.join(stress.FAMILIES)}")
    if args.objective not in stress.OBJECTIVES:
        raise UsageError(f"--objective {args.objective!r} is not one of {', '.join(stress.OBJECTIVES)}")
    try:
        budget = float(args.budget)
    except ValueError:
        raise UsageError(f"--budget {args.budget!r} is not a number of seconds") from None
    if not 0 < budget <= 7 * 86400:
        raise UsageError(f"--budget must be above 0 and at most a week (604800 s), got {args.budget}")
    evaluations = None if args.evaluations is None else _int(args.evaluations, "--evaluations", 1, 1 << 32)
    seed = _int(args.seed, "--seed", 0, 2**64 - 1)
    max_allocs = _int(args.max_allocs, "--max-allocs", 2, 1024)
    if (args.objective == "oom") != (args.capacity is not None):
        raise UsageError("--capacity goes with --objective oom (the device size to run out of), and only with it")
    min_live = _size(args.min_live, "--min-live")
    out = args.out or f"stress-{args.allocator}-{seed}.json"
    _output_path(out, "--out")
    notes = sys.stderr if args.json else sys.stdout

    last = [0.0]

    def progress(n: int, best: float) -> None:  # at most two lines a second
        now = time.monotonic()
        if now - last[0] >= 0.5:
            last[0] = now
            print(f"  evaluation {n:>7,}: worst so far {best:.3f}", file=notes, flush=True)

    what = f"{evaluations:,} evaluations" if evaluations is not None else f"{budget:g} s"
    print(f"npumem stress: {args.allocator}, objective {args.objective}, {what}, seed {seed}", file=notes)
    result = stress.search(
        args.allocator,
        budget=budget,
        evaluations=evaluations,
        seed=seed,
        max_allocs=max_allocs,
        objective=args.objective,
        capacity=args.capacity,
        alloc_conf=args.alloc_conf,
        min_live=min_live,
        progress=progress,
    )
    result.save(out)
    if args.json:
        print(json.dumps({**result.report(), "trace": out}, indent=2))
        return EXIT_OK
    rep = result.report()
    print(
        f"worst workload: {rep['allocs']} blocks, {len(result.events)} events, peak live {fmt(result.peak_live)}; "
        f"{args.objective} score {result.score:.3f} after {result.evaluations:,} evaluations "
        f"({result.seconds:.1f} s)"
    )
    for action, i, size in result.events:
        print(f"  {action:<5} {i:>4} {fmt(size):>10}")
    print(f"\n(ratios are over the bound: peak live rounded up to 2 MiB, {fmt(stress.bound(result.events))})")
    print(f"{'family':<10} {'min capacity':>13} {'/ bound':>8} {'peak reserved':>14} {'/ bound':>8}")
    for fam, f in result.families.items():
        print(
            f"{fam:<10} {fmt(int(f['min_capacity'])):>13} {f['capacity_ratio']:>8.3f} "
            f"{fmt(int(f['peak_reserved'])):>14} {f['reserved_ratio']:>8.3f}"
        )
    print(f"trace -> {out} (npumem.traces.load reads it; replay it on any family)")
    return EXIT_OK
