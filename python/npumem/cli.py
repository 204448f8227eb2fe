"""The ``npumem`` command line (also ``python -m npumem``): ``npumem demo`` runs the main job on
the simulated device, ``npumem tlb sweep`` tabulates the TLB model, ``npumem tlb validate``
holds it against this machine's pointer chase, ``npumem plan`` plans a
problem CSV or a saved graph, ``npumem replay`` replays a trace file on allocator families side
by side, ``npumem sweep`` runs a sweep config on Dask, ``npumem report`` makes a self-contained HTML
report of its results, and ``npumem stress`` searches for the workload that fragments an allocator
family the most (:mod:`npumem.cli_stress`).

Exit status, one meaning each:
  0    done
  1    the answer is no: the plan does not fit --capacity, the graph does not meet --mem-limit, a
       replayed trace ran out of memory on --capacity, or some cells of a sweep failed (each is
       listed; the others were written)
  2    usage or input error (an unknown option, a bad value, a file that cannot be read or is not
       what the command reads); a one-line message says which
  3    a requested output (--plot, a sweep's Parquet tables or its cluster, a report's plots) needs
       an optional dependency that is not installed; a one-line hint says how to install it, and
       everything else (report, CSV) was written
  4    internal error: a bug in npumem (set NPUMEM_DEBUG=1 for the traceback; please report it)
  130  interrupted (Ctrl-C)
  141  the output pipe was closed (as in ``npumem tlb sweep | head``)
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import Any

from ._cli_base import (
    EXIT_BROKEN_PIPE,
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_MISSING_DEPENDENCY,
    EXIT_NO,
    EXIT_OK,
    EXIT_USAGE,
    UsageError,
    _output_path,
)

#: Where ``npumem demo`` writes its TLB plot when --plot is not given.
DEMO_PLOT = os.path.join("target", "npumem-demo", "tlb_sweep.png")


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the command line; returns the exit status (it never raises, never prints a traceback
    for a user's mistake)."""
    parser = _parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse: usage errors exit 2 (message printed), --help/--version 0
        return e.code if isinstance(e.code, int) else EXIT_USAGE
    command: Callable[[argparse.Namespace], int] = args.run
    args.command_line = shlex.join(["npumem", *argv])  # recorded beside results (sweep, report)
    name = f"npumem {args.command}"
    try:
        return command(args)
    except KeyboardInterrupt:
        print(f"{name}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # Nothing more can be written; keep the interpreter from complaining at exit too.
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return EXIT_BROKEN_PIPE
    except Exception as e:
        code = _classify(e)
        if code == EXIT_INTERNAL:
            print(
                f"{name}: internal error ({type(e).__name__}: {e}); this is a bug in npumem, please report it "
                "with the command line (NPUMEM_DEBUG=1 shows the traceback)",
                file=sys.stderr,
            )
            if os.environ.get("NPUMEM_DEBUG"):
                traceback.print_exc()
        else:
            print(f"{name}: {e}", file=sys.stderr)
        return code


def _classify(e: Exception) -> int:
    """The exit status of an exception that ended a command."""
    from ._optional import MissingDependencyError
    from .errors import AclError, InternalError

    if isinstance(e, MissingDependencyError):
        return EXIT_MISSING_DEPENDENCY
    if isinstance(e, (UsageError, OSError)) or (isinstance(e, AclError) and not isinstance(e, InternalError)):
        return EXIT_USAGE
    return EXIT_INTERNAL


def _parser() -> argparse.ArgumentParser:
    from . import __version__

    parser = argparse.ArgumentParser(
        prog="npumem",
        description="The memory system of an Ascend-style NPU, on a simulated device.",
        epilog=__doc__.split("\n\n", 1)[1] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"npumem {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    d = sub.add_parser("demo", help="page mix per policy and the fragmentation story, on the simulated device")
    d.add_argument(
        "--capacity", default="1GiB", help="device size for the fragmentation story (256MiB-64GiB, default 1GiB)"
    )
    d.add_argument("--seed", type=int, default=7, help="seed of the allocation churn (default 7)")
    d.add_argument(
        "--plot",
        default=None,
        help=f"where to write the TLB plot (default {DEMO_PLOT} when matplotlib is installed; '' for none)",
    )
    d.set_defaults(run=_demo)

    t = sub.add_parser("tlb", help="the TLB model")
    tsub = t.add_subparsers(dest="tlb_command", required=True)
    sw = tsub.add_parser("sweep", help="presets x page sizes x patterns x footprints into a CSV table and a PNG plot")
    sw.add_argument("--presets", default="zen4,ascend_like", help="comma-separated TLB presets (Tlb.presets())")
    sw.add_argument("--pages", default="4KiB,2MiB,1GiB", help="comma-separated page sizes: 4KiB, 2MiB, 1GiB")
    sw.add_argument("--patterns", default="sequential,uniform,chase,gemm,gather", help="comma-separated patterns")
    sw.add_argument("--footprints", default="4MiB,64MiB,256MiB,1GiB", help="comma-separated footprints (4KiB-64GiB)")
    sw.add_argument("--accesses", type=int, default=500_000, help="accesses per run (default 500000)")
    sw.add_argument("--seed", type=int, default=0)
    sw.add_argument("--csv", default="tlb_sweep.csv", help="output table (default tlb_sweep.csv)")
    sw.add_argument(
        "--plot", default=None, help="output PNG (default tlb_sweep.png when matplotlib is installed; '' for none)"
    )
    sw.set_defaults(run=_tlb_sweep)
    pr = tsub.add_parser("presets", help="the TLB presets: geometry, host, and the source of every figure")
    pr.add_argument("--cpuid", action="store_true", help="add this machine's geometry read from CPUID")
    pr.set_defaults(run=_tlb_presets)
    va = tsub.add_parser(
        "validate",
        help="this machine's pointer chase (4 KiB pages, 2 MiB THP) beside the model's prediction "
        "(costs fitted on 4 KiB)",
    )
    va.add_argument("--max-footprint", default=None, help="largest footprint (64KiB-1GiB; default 64MiB)")
    va.add_argument("--min-footprint", default=None, help="smallest footprint (default 64KiB)")
    va.add_argument("--per-octave", type=int, default=None, help="footprints an octave (default 4)")
    va.add_argument("--rounds", type=int, default=None, help="interleaved rounds; each point is the best (default 5)")
    va.add_argument(
        "--host-page-size",
        default=None,
        help="the host's page (4KiB, 2MiB, 1GiB) or 'none' for a native machine (default 4KiB, or --measured's)",
    )
    va.add_argument(
        "--preset",
        default=None,
        help="geometry: 'cpuid' (this machine's) or a preset name (default cpuid, or --measured's)",
    )
    va.add_argument(
        "--measured",
        default=None,
        metavar="FILE",
        help="re-fit and re-predict the measurement stored in FILE (a --json output) instead of measuring",
    )
    va.add_argument("--no-hugetlb", action="store_true", help="skip the hugetlb series even where pages are free")
    va.add_argument("--json", default=None, help="also write the result as JSON to this path")
    va.add_argument("--plot", default=None, help="also draw measured vs model into this PNG (needs matplotlib)")
    va.add_argument("--strict", action="store_true", help="exit 1 when a check of the validation's bounds fails")
    va.set_defaults(run=_tlb_validate)

    pl = sub.add_parser(
        "plan", help="static memory planning of a MiniMalloc CSV (id,lower,upper,size) or an npumem graph (.json[.gz])"
    )
    pl.add_argument(
        "file",
        help="problem CSV: id,lower,upper,size (half-open lifetimes [lower, upper)); or a graph saved by "
        "npumem.graph.Graph.save (.json / .json.gz)",
    )
    pl.add_argument(
        "--strategy",
        default="npumem",
        help="a strategy name, or 'all' to compare every one; with --schedule, the scheduler: given, xla, "
        "inductor or npumem (the default: compares them all and keeps the lowest arena)",
    )
    pl.add_argument(
        "--schedule",
        action="store_true",
        help="graphs: choose the order of the ops too (reports the given order's bound, each scheduler's "
        "arena and a bound no order beats; --json adds the order and every tensor's offset)",
    )
    pl.add_argument(
        "--capacity", default=None, help="CSV problems: arena size the plan must fit (e.g. 1048576 or 64MiB)"
    )
    pl.add_argument(
        "--time-limit",
        type=float,
        default=None,
        help="seconds for the exact search of the npumem strategy (default: none, the work limit alone; "
        "0 = greedy only)",
    )
    pl.add_argument(
        "--work-limit",
        type=int,
        default=None,
        help="search nodes for the exact search (per portfolio thread; default 40000) and, with --schedule, "
        "transitions for the order search (default 2000000): the same plan on every run, however busy the machine",
    )
    pl.add_argument(
        "--mem-limit",
        default=None,
        help="graphs: device bytes for weights + I/O + arena; offload / recompute moves are chosen to fit",
    )
    pl.add_argument(
        "--alignment", type=int, default=None, help="CSV problems: offset alignment in bytes (power of two, default 1)"
    )
    pl.add_argument("--out", default=None, help="write the plan as CSV (id,lower,upper,size,offset)")
    pl.add_argument("--json", action="store_true", help="print the report as JSON")
    pl.add_argument("--plot", default=None, help="write the best plan's placement (step x offset) as a PNG")
    pl.set_defaults(run=_plan)

    sp = sub.add_parser(
        "sweep",
        help="run a sweep config (TLB or allocator grid, TOML) on Dask; results as Parquet and CSV",
        description="Runs the cells of a sweep config (examples/sweeps/) on a Dask cluster, with progress; "
        "finished cells are cached in OUT/cache, so a rerun computes only what changed.",
    )
    sp.add_argument("config", help="sweep config (TOML): a [tlb] and/or an [alloc] table")
    sp.add_argument("--out", required=True, help="results folder (created): tables, cache, sweep.json")
    sp.add_argument("--scheduler", default=None, help="address of an existing Dask scheduler (tcp://host:8786)")
    sp.add_argument(
        "--workers",
        type=int,
        default=None,
        help="worker processes of the LocalCluster (default 2); 0 runs the cells in this process, without Dask",
    )
    sp.add_argument("--quiet", action="store_true", help="no progress lines")
    sp.add_argument(
        "--yes",
        action="store_true",
        help="run a grid whose estimated work passes the budget (about an hour of one worker; the refusal shows "
        "the estimate)",
    )
    sp.set_defaults(run=_sweep)

    rp = sub.add_parser(
        "report", help="one self-contained HTML file (plots, tables, commands, versions) from a sweep's --out folder"
    )
    rp.add_argument("dir", help="a folder written by npumem sweep --out")
    rp.add_argument("--out", default="report.html", help="the HTML file (default report.html)")
    rp.add_argument(
        "--host-pagesize",
        default=None,
        help="host page-size measurements (the JSON benches/bench_pagesize.py --json writes) to set beside the "
        "model (default: DIR/host_pagesize.json when present)",
    )
    rp.set_defaults(run=_report)
    from .cli_stress import add_parser as add_stress

    add_stress(sub)
    _add_replay(sub)
    from .torch.fit import add_parser as add_fit

    add_fit(sub)
    return parser


# -- helpers ----------------------------------------------------------------------------------


def _split(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def _try_plot(draw: Callable[[], None], explicit: bool) -> bool:
    """Draws a plot; a missing matplotlib is a one-line hint on stderr. Returns whether a plot
    the user asked for is missing (exit status 3)."""
    from ._optional import MissingDependencyError

    try:
        draw()
    except MissingDependencyError as e:
        print(f"npumem: no plot: {e}", file=sys.stderr)
        return explicit
    return False


# -- demo -------------------------------------------------------------------------------------


def _demo(args: argparse.Namespace) -> int:
    from . import _args, demo

    capacity = _args.size(args.capacity, "--capacity", *demo.CAPACITY_RANGE)
    plot = DEMO_PLOT if args.plot is None else args.plot
    if plot:
        if args.plot is None:
            os.makedirs(os.path.dirname(plot) or ".", exist_ok=True)
        _output_path(plot, "--plot")
    missing = demo.run(capacity=capacity, seed=args.seed, out=sys.stdout, plot_path=plot or None)
    for hint in missing:
        print(f"npumem demo: no plot: {hint}", file=sys.stderr)
    return EXIT_MISSING_DEPENDENCY if missing and args.plot else EXIT_OK


# -- tlb sweep --------------------------------------------------------------------------------


def _tlb_sweep(args: argparse.Namespace) -> int:
    from . import _args, tlb
    from .units import fmt

    footprints = [_args.size(f, "--footprints", 4096, tlb.MAX_FOOTPRINT) for f in _split(args.footprints)]
    plot = "tlb_sweep.png" if args.plot is None else args.plot
    _output_path(args.csv, "--csv")
    if plot:
        _output_path(plot, "--plot")

    rows = tlb.sweep(
        presets=_split(args.presets),
        pages=_split(args.pages),
        patterns=_split(args.patterns),
        footprints=footprints,
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
    if not plot:
        return EXIT_OK
    tradeoff = plot.removesuffix(".png") + "_tradeoff.png"

    def draw() -> None:
        tlb.plot(rows, plot)
        tlb.plot_tradeoff(rows, tradeoff)
        print(f"plots -> {plot}, {tradeoff}")

    return EXIT_MISSING_DEPENDENCY if _try_plot(draw, args.plot is not None) else EXIT_OK


# -- tlb presets ------------------------------------------------------------------------------


def _tlb_presets(args: argparse.Namespace) -> int:
    from . import tlb

    rows = tlb.preset_table(cpuid=args.cpuid)
    keys = ("name", "levels", "walk caches", "host", "source kind")
    widths = {k: max(len(k), *(len(r[k]) for r in rows)) for k in keys}
    print("  ".join(k.ljust(widths[k]) for k in keys) + "  source")
    for r in rows:
        print("  ".join(r[k].ljust(widths[k]) for k in keys) + "  " + r["source"])
    return EXIT_OK


# -- tlb validate -----------------------------------------------------------------------------


def _tlb_validate(args: argparse.Namespace) -> int:
    from . import _args, tlb, tlb_validate

    host: Any = None
    if args.host_page_size is not None and args.host_page_size.lower() != "none":
        host = tlb.host_page(args.host_page_size, "--host-page-size")
    for path, flag in ((args.json, "--json"), (args.plot, "--plot")):
        if path:
            _output_path(path, flag)
    if args.measured is not None:
        measuring = ("--min-footprint", "--max-footprint", "--per-octave", "--rounds")
        given = [f for f in measuring if getattr(args, f[2:].replace("-", "_")) is not None]
        if given or args.no_hugetlb:
            raise UsageError(
                f"{', '.join(given or ['--no-hugetlb'])} set what is measured; --measured FILE measures nothing "
                "(it re-fits the stored points): drop one or the other"
            )
        result = tlb_validate.revalidate(
            args.measured,
            host_page_size=tlb_validate.FROM_FILE if args.host_page_size is None else host,
            preset=args.preset,
        )
    else:
        lo = _args.size(args.min_footprint or "64KiB", "--min-footprint", 4096, 1 << 30)
        hi = _args.size(args.max_footprint or "64MiB", "--max-footprint", lo, 1 << 30)
        per_octave = _args.integer(4 if args.per_octave is None else args.per_octave, "--per-octave", 1, 64)
        result = tlb_validate.validate(
            tlb_validate.grid(lo, hi, per_octave),
            rounds=5 if args.rounds is None else args.rounds,
            host_page_size=4096 if args.host_page_size is None else host,
            preset=args.preset or "cpuid",
            hugetlb=not args.no_hugetlb,
        )
    print(tlb_validate.format_table(result))
    if args.json:
        tlb_validate.write_json(result, args.json)
        print(f"json -> {args.json}")
    missing = False
    if args.plot:

        def draw() -> None:
            tlb_validate.plot(result, args.plot)
            print(f"plot -> {args.plot}")

        missing = _try_plot(draw, True)
    if missing:
        return EXIT_MISSING_DEPENDENCY
    return EXIT_NO if args.strict and not all(result["checks"].values()) else EXIT_OK


# -- plan -------------------------------------------------------------------------------------


def _limits(args: argparse.Namespace) -> tuple[float | None, int | None]:
    """--time-limit and --work-limit: the work limit always applies (its default without the
    option), so the plan is the same on every run; a time limit only adds to it."""
    from .plan import DEFAULT_WORK_LIMIT

    return args.time_limit, DEFAULT_WORK_LIMIT if args.work_limit is None else args.work_limit


def _strategies(name: str) -> tuple[str, ...]:
    from .plan import STRATEGIES

    if name == "all":
        return STRATEGIES
    if name not in STRATEGIES:
        raise UsageError(f"--strategy {name!r} is not one of all, {', '.join(STRATEGIES)}")
    return (name,)


def _plan(args: argparse.Namespace) -> int:
    """Plans the file; exit status 1 when the (best) plan misses --capacity / --mem-limit."""
    from . import _args

    graph = args.file.endswith((".json", ".json.gz"))
    if graph and (args.capacity is not None or args.alignment is not None):
        raise UsageError(
            "--capacity and --alignment apply to CSV problems; a graph has --mem-limit and its own alignment"
        )
    if not graph and args.mem_limit is not None:
        raise UsageError("--mem-limit applies to graphs (.json / .json.gz); a CSV problem has --capacity")
    if args.schedule:
        if not graph:
            raise UsageError("--schedule applies to graphs (.json / .json.gz); a CSV problem has fixed lifetimes")
        from .graph import SCHEDULERS

        if args.strategy not in (*SCHEDULERS, "all"):
            raise UsageError(f"--strategy {args.strategy!r} with --schedule is not one of {', '.join(SCHEDULERS)}")
    names = ("npumem",) if args.schedule else _strategies(args.strategy)
    time_limit, work_limit = _limits(args)
    _args.optional_integer(work_limit, "--work-limit")
    if time_limit is not None:
        _args.real(time_limit, "--time-limit", 0.0, 1e9, unit=" seconds")
    for option in ("out", "plot"):
        if getattr(args, option):
            _output_path(getattr(args, option), f"--{option}")
    if graph:
        return _plan_graph(args, names, time_limit, work_limit)
    return _plan_csv(args, names, time_limit, work_limit)


def _bytes_option(value: str | None, option: str) -> int | None:
    from . import _args

    return None if value is None else _args.size(value, option, 0)


def _print_json(plans: Sequence[Any], best: Any) -> None:
    import json

    print(json.dumps([p.report() for p in plans] if len(plans) > 1 else best.report(), indent=2))


def _plan_csv(
    args: argparse.Namespace, names: tuple[str, ...], time_limit: float | None, work_limit: int | None
) -> int:
    from . import plan

    capacity = _bytes_option(args.capacity, "--capacity")
    alignment = 1 if args.alignment is None else args.alignment
    problem = plan.Problem.from_csv(args.file, alignment=alignment)
    plans = [problem.solve(s, capacity=capacity, time_limit=time_limit, work_limit=work_limit) for s in names]
    best = min(plans, key=lambda p: (p.peak, p.strategy != plan.DEFAULT_STRATEGY))
    if args.json:
        _print_json(plans, best)
    else:
        print(f"{args.file}: {len(problem)} buffers, lower bound {problem.lower_bound:,} B")
        print(f"{'strategy':<24} {'peak':>14} {'vs bound':>9} {'reuse':>7} {'seconds':>8}  order / exact search")
        for p in plans:
            r = p.report()
            how = p.order if p.exact == "not run" else f"{p.order}; exact: {p.exact} ({p.search_nodes:,} nodes)"
            print(
                f"{p.strategy:<24} {p.peak:>14,} {100 * p.gap:>8.2f}% {100 * r['reuse_ratio']:>6.1f}% "
                f"{p.solve_seconds:>8.3f}  {how}"
            )
        if capacity is not None:
            print(best.verdict)
        elif best.bound > problem.lower_bound:
            print(f"proven: no plan below {best.bound:,} B (exact search)")
    return _plan_outputs(args, best, best.fits)


def _plan_graph(
    args: argparse.Namespace, names: tuple[str, ...], time_limit: float | None, work_limit: int | None
) -> int:
    from .graph import Graph

    limit = _bytes_option(args.mem_limit, "--mem-limit")
    graph = Graph.load(args.file)
    if args.schedule:
        return _plan_scheduled(args, graph, limit, time_limit, work_limit)
    plans = [graph.plan(s, mem_limit=limit, time_limit=time_limit, work_limit=work_limit) for s in names]
    best = min(plans, key=lambda p: (p.peak_memory, p.arena.strategy != "npumem"))
    if args.json:
        _print_json(plans, best)
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
        if limit is not None:
            over = best.peak_memory - limit
            verdict = "fits" if best.fits else f"does NOT fit: peak {best.peak_memory:,} B is {over:,} B over"
            print(f"mem_limit {limit:,} B: {verdict}")
    return _plan_outputs(args, best.arena, best.fits)


def _plan_scheduled(
    args: argparse.Namespace, graph: Any, limit: int | None, time_limit: float | None, work_limit: int | None
) -> int:
    import json

    from .graph import DEFAULT_SCHEDULE_WORK

    scheduler = "npumem" if args.strategy == "all" else args.strategy
    work = DEFAULT_SCHEDULE_WORK if args.work_limit is None else work_limit
    p = graph.plan(
        mem_limit=limit, time_limit=time_limit, work_limit=work_limit, schedule=scheduler, schedule_work=work
    )
    s = p.schedule
    assert s is not None
    if args.json:
        print(json.dumps(p.to_json(), indent=1))
    else:
        print(f"{args.file}: {len(graph)} tensors, {len(graph.ops)} ops")
        print(f"  {'scheduler':<10} {'portfolio member':<16} {'order bound':>16} {'arena':>16}")
        for c in s.candidates:
            mark = "  <- chosen" if c.order == s.order and c.scheduler == s.scheduler else ""
            print(f"  {c.scheduler:<10} {c.detail:<16} {c.bound:>16,} {c.arena:>16,}{mark}")
        proof = "optimal (proven)" if s.optimal else f"{100 * (p.arena.peak / s.bound - 1):+.2f}% vs the bound"
        search = "exact" if s.exact else "bounded"
        print(
            f"given order bound {s.given_bound:,} B; any order needs >= {s.bound:,} B; arena {p.arena.peak:,} B: "
            f"{proof} ({search} search, {s.work:,} transitions)"
        )
        print(p.table())
        if limit is not None:
            over = p.peak_memory - limit
            verdict = "fits" if p.fits else f"does NOT fit: peak {p.peak_memory:,} B is {over:,} B over"
            print(f"mem_limit {limit:,} B: {verdict}")
    return _plan_outputs(args, p.arena, p.fits)


def _plan_outputs(args: argparse.Namespace, best: Any, fits: bool) -> int:
    """Writes the best plan (a :class:`npumem.plan.Plan`; a graph's arena) to --out first, then
    --plot (a missing matplotlib never costs the CSV); returns the exit status."""
    notes = sys.stderr if args.json else sys.stdout
    if args.out:
        best.to_csv(args.out)
        print(f"plan ({best.strategy}) -> {args.out}", file=notes)
    missing = False
    if args.plot:

        def draw() -> None:
            best.plot(args.plot, title=f"{os.path.basename(args.file)}: {best.strategy}")
            print(f"placement -> {args.plot}", file=notes)

        missing = _try_plot(draw, explicit=True)
    if missing:
        return EXIT_MISSING_DEPENDENCY
    return EXIT_OK if fits else EXIT_NO


# -- sweep and report ---------------------------------------------------------------------------


def _sweep(args: argparse.Namespace) -> int:
    from . import sweep

    if args.scheduler is not None and args.workers is not None:
        raise UsageError("--workers sizes the LocalCluster; with --scheduler the cluster is already there")
    workers = sweep.DEFAULT_WORKERS if args.workers is None else args.workers
    if not 0 <= workers <= 512:
        raise UsageError(f"--workers must be from 0 to 512, got {workers}")
    if args.scheduler is None and workers > 0:
        from ._optional import require

        require("distributed", "npumem sweep (or --workers 0 to run the cells in this process, without Dask)")
    config = sweep.load_config(args.config)
    result = sweep.run(
        config,
        args.out,
        scheduler=args.scheduler,
        workers=workers,
        progress=not args.quiet,
        command=args.command_line,
        yes=args.yes,
    )
    print(
        f"{result.cells} cells ({result.computed} computed, {result.cached} cached, {len(result.failed)} failed) "
        f"in {result.seconds:.1f} s -> {args.out}"
    )
    for key, error in result.failed.items():
        print(f"npumem sweep: cell {key[:12]} failed: {error}", file=sys.stderr)
    return EXIT_NO if result.failed else EXIT_OK


def _report(args: argparse.Namespace) -> int:
    from . import report

    if not os.path.isdir(args.dir):
        raise UsageError(f"{args.dir!r} is not a folder written by npumem sweep --out")
    _output_path(args.out, "--out")
    missing = report.write(args.dir, args.out, host_pagesize=args.host_pagesize, command=args.command_line)
    print(f"report -> {args.out}")
    for hint in missing:
        print(f"npumem report: {hint}", file=sys.stderr)
    return EXIT_MISSING_DEPENDENCY if missing else EXIT_OK


# -- replay -----------------------------------------------------------------------------------

#: Traces at least this long show their progress on stderr.
PROGRESS_EVENTS = 2_000_000


def _add_replay(sub: Any) -> None:
    r = sub.add_parser(
        "replay",
        help="replay a trace file (RMM log CSV, PyTorch snapshot pickle, torch.profiler JSON, npz) on allocator "
        "families side by side",
    )
    r.add_argument("trace", help="the trace file; its format is detected from its content")
    r.add_argument(
        "--allocator",
        action="append",
        default=None,
        help="an allocator family (npumem, pytorch, torch_npu, direct); repeat to compare (default: all four)",
    )
    r.add_argument(
        "--alloc-conf",
        action="append",
        default=None,
        help="allocator settings (PYTORCH_NPU_ALLOC_CONF grammar): once for every family, or once per --allocator",
    )
    size = r.add_mutually_exclusive_group()
    size.add_argument("--capacity", default=None, help="device size (default: 4x the trace's peak live bytes, >= 1GiB)")
    size.add_argument(
        "--min-capacity", action="store_true", help="also search each family's smallest device that runs the trace"
    )
    r.add_argument("--plot", default=None, help="write the timeline (allocated vs reserved per family) as a PNG")
    r.add_argument(
        "--snapshot",
        default=None,
        help="write the replay's PyTorch memory snapshot (memory_viz opens it); with several families, one file each "
        "(NAME.FAMILY.pickle)",
    )
    r.add_argument("--json", action="store_true", help="print the table as JSON")
    r.set_defaults(run=_replay)


def _snapshot_path(path: str, family: str, several: bool) -> str:
    if not several:
        return path
    stem, dot, ext = path.rpartition(".")
    return f"{stem}.{family}.{ext}" if dot and "/" not in ext else f"{path}.{family}"


def _replay(args: argparse.Namespace) -> int:
    """Replays the trace on each family; prints the table (or JSON); exit 3 when a requested plot
    needs matplotlib (everything else done)."""
    import json

    from . import _args, formats
    from .device import Device
    from .replay import Comparison, compare
    from .replay import _replay as replay_on

    families = args.allocator or ["npumem", "pytorch", "torch_npu", "direct"]
    confs = args.alloc_conf or [None]
    if len(confs) not in (1, len(families)):
        raise UsageError(f"{len(confs)} --alloc-conf for {len(families)} --allocator; give one, or one per allocator")
    for out, option in ((args.plot, "--plot"), (args.snapshot, "--snapshot")):
        if out:
            _output_path(out, option)
    capacity = None if args.capacity is None else _args.size(args.capacity, "--capacity", 1 << 20, 1 << 40)
    trace = formats.load(args.trace)
    if not len(trace):
        raise UsageError(f"{args.trace}: the trace has no alloc or free events")
    n = len(trace)
    show = n >= PROGRESS_EVENTS and not args.json

    def progress(family: str, done: int, total: int) -> None:
        print(f"\r  {family}: {done:,}/{total:,} events ({100 * done // total}%)", end="", file=sys.stderr, flush=True)
        if done == total:
            print(file=sys.stderr)

    sample_every = max(1, n // 2000) if args.plot else 0
    table: Comparison = compare(
        trace,
        families,
        alloc_conf=confs if len(confs) > 1 else confs[0],
        capacity=capacity,
        min_capacity=args.min_capacity,
        sample_every=sample_every,
        progress=progress if show else None,
    )
    if args.json:
        print(json.dumps({"trace": args.trace, "events": n, "peak_live": table.peak_live, "results": table.rows()}))
    else:
        from .units import fmt

        extra = f", {trace.failed_allocs} failed allocations in the log (not replayed)" if trace.failed_allocs else ""
        streams = trace.stream_values()
        print(f"{args.trace}: {n:,} events, peak live {fmt(table.peak_live)}, {len(streams)} stream(s){extra}")
        print(table)
    if args.snapshot:
        for r, conf in zip(table.results, confs * len(families) if len(confs) == 1 else confs, strict=True):
            dev = Device(r.capacity, allocator=r.allocator, alloc_conf=conf)
            dev.record_memory_history(True, max_entries=max(1, 8 * n))
            replay_on(trace, dev, 0, False)
            path = _snapshot_path(args.snapshot, r.allocator, len(families) > 1)
            formats.write_snapshot(dev, path)
            if not args.json:
                print(f"snapshot ({r.allocator}) -> {path}")
    # The answer is no (exit 1) when a family ran out of memory on the --capacity asked about.
    done = EXIT_NO if capacity is not None and any(r.ooms for r in table.results) else EXIT_OK
    if not args.plot:
        return done

    def draw() -> None:
        from .replay import plot_timeline

        plot_timeline(table, args.plot, title=os.path.basename(args.trace))
        if not args.json:
            print(f"timeline -> {args.plot}")

    return EXIT_MISSING_DEPENDENCY if _try_plot(draw, True) else done


if __name__ == "__main__":
    raise SystemExit(main())
