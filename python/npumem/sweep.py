"""Sweeps on Dask: a grid of TLB-model or allocator runs, one Dask task per cell.

A sweep is a TOML file (``examples/sweeps/``) with a ``[tlb]`` table (presets x page sizes x
access patterns x footprints, each cell one :func:`npumem.tlb.sweep` run), an ``[alloc]`` table
(allocator families x ``alloc_conf`` values x workloads x capacities, each cell a replay on a
device of that capacity, or the search for the smallest one), or both. :func:`run` expands the
grid, runs the cells that are not cached on a Dask ``distributed`` cluster (a ``LocalCluster``
by default, an existing scheduler by address, or ``workers=0`` for this process alone), prints
progress (cells done, rate, ETA) and writes the results to the ``out`` folder::

    out/tlb.parquet, tlb.csv          one row per TLB cell
    out/alloc.parquet, alloc.csv      one row per allocator cell
    out/timelines.parquet, .csv       live / allocated / reserved bytes over each alloc cell's replay
    out/sweep.json                    the config, command, versions, cluster and counts
    out/cache/KEY.json                each finished cell, written as it lands

Invariants:

- every cell of the grid lands exactly once in the tables (rows are keyed by the cell's key and
  written when its task's result reaches the client; a task whose worker dies is rerun by the
  scheduler and still yields one result);
- a cell's key is the SHA-256 of its parameters (a trace file's content digest, not its path)
  and npumem's build (version and native extension digest): a rerun reads every cell whose key is
  cached and computes only the rest, and a rebuilt npumem recomputes everything;
- the whole config is checked (types, names, sizes, workloads built, ``alloc_conf`` parsed)
  before a cluster is started or a file is written: a bad config is one
  :class:`npumem.InvalidParamError` naming the key, the value and what is accepted;
- a table of the grid has at most :data:`MAX_CELLS` cells, and a sweep whose cells still to
  compute pass :data:`WORK_BUDGET` (:func:`estimate`) is refused with the estimate, before
  anything runs, unless ``yes=True`` (``npumem sweep --yes``);
- Dask (``distributed``) and pyarrow are optional (``pip install 'npumem[sweep]'``): without
  ``distributed`` only ``workers=0`` runs; without pyarrow the CSVs are written and
  :class:`npumem.MissingDependencyError` is raised afterwards for the Parquet files.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import math
import os
import platform
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from . import _args, _files
from ._optional import require
from .errors import invalid_param

#: Default number of workers of the LocalCluster (this machine has two cores).
DEFAULT_WORKERS = 2
#: Points of each alloc cell's timeline (live / allocated / reserved bytes over the replay).
TIMELINE_POINTS = 200
#: Alloc-cell capacities: "min" searches the smallest device; "1.05x" is a multiple of the
#: workload's peak live bytes; a size ("4GiB") is taken as it is.
_MIN = "min"
#: Generators a workload may name (npumem.workloads functions).
GENERATORS = ("transformer_training", "random_churn")
#: Families that take alloc_conf settings (direct has none).
_CONFIGURABLE = ("pytorch", "torch_npu", "npumem")
_FAMILIES = ("direct", "pytorch", "torch_npu", "npumem")
_TLB_KEYS = {"presets", "pages", "patterns", "footprints", "accesses", "seeds"}
_ALLOC_KEYS = {"allocators", "alloc_conf", "workloads", "capacities", "granularity", "timeline"}


@dataclass(frozen=True)
class Cell:
    """One run of the grid: ``kind`` ("tlb" or "alloc"), its parameters (what the key hashes)
    and its inputs (a workload's Trace: what the parameters name, shipped to the worker)."""

    kind: str
    params: Mapping[str, Any]
    key: str
    inputs: Any = None


@dataclass(frozen=True)
class Progress:
    """Where a running sweep stands; ``eta`` is None until a cell has been computed."""

    done: int
    total: int
    cached: int
    failed: int
    elapsed: float
    eta: float | None

    def line(self) -> str:
        pct = 100.0 * self.done / self.total if self.total else 100.0
        eta = "--:--" if self.eta is None else _clock(self.eta)
        extra = f", {self.failed} failed" if self.failed else ""
        return (
            f"sweep: {self.done}/{self.total} cells ({pct:5.1f}%, {self.cached} cached{extra}), "
            f"elapsed {_clock(self.elapsed)}, ETA {eta}"
        )


@dataclass
class SweepResult:
    """What :func:`run` did: the folder, the tables it wrote and the counts."""

    out: str
    cells: int
    computed: int
    cached: int
    failed: dict[str, str] = field(default_factory=dict)
    files: list[str] = field(default_factory=list)
    seconds: float = 0.0


def _clock(seconds: float) -> str:
    s = max(0, round(seconds))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


# -- the config ---------------------------------------------------------------------------------


def load_config(path: Any) -> dict[str, Any]:
    """The sweep config in a TOML file, with ``base`` (its folder: trace paths are relative to
    it) and ``source`` (its text) added."""
    name = _files.path_arg(path)
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        tomllib = require("tomli", "reading a sweep config on Python 3.10")
    raw = _files.read_text(name, "a TOML sweep config")
    try:
        config = tomllib.loads(raw)
    except tomllib.TOMLDecodeError as e:
        raise invalid_param(f"{name}: not a TOML sweep config ({e})") from None
    config["base"] = os.path.dirname(os.path.abspath(name))
    config["source"] = raw
    config["path"] = name
    return config


def _list(table: Mapping[str, Any], key: str, where: str, default: Any = None) -> list[Any]:
    value = table.get(key, default)
    if value is None:
        raise invalid_param(f"{where}.{key} is missing; give a list")
    if not isinstance(value, list):
        value = [value]
    if not value:
        raise invalid_param(f"{where}.{key} is empty; give at least one value")
    return value


def _unknown(table: Mapping[str, Any], known: set[str], where: str) -> None:
    extra = sorted(set(table) - known)
    if extra:
        raise invalid_param(f"{where} has unknown keys {extra}; use {', '.join(sorted(known))}")


@functools.lru_cache(maxsize=1)
def build_id() -> str:
    """npumem's version and a digest of its native extension: a rebuilt model (a development
    checkout keeps its version number from commit to commit) is a new build."""
    from . import __version__, _native

    digest = hashlib.sha256()
    with open(_native.__file__, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return f"{__version__}+{digest.hexdigest()[:16]}"


def cell_key(kind: str, params: Mapping[str, Any]) -> str:
    """The cache key of a cell: SHA-256 of its kind, parameters and npumem's build
    (:func:`build_id`)."""
    doc = json.dumps({"kind": kind, "params": params, "npumem": build_id()}, sort_keys=True, default=repr)
    return hashlib.sha256(doc.encode()).hexdigest()


def expand(config: Mapping[str, Any]) -> list[Cell]:
    """The cells of a config (a dict as :func:`load_config` returns, or written by hand), every
    value checked first: a value of the wrong type is an InvalidParamError too (the config is
    input, like a file's content)."""
    config = _args.mapping(config, "config")
    try:
        return _expand(config)
    except TypeError as e:  # _args' checks: the message names the key and the value
        where = f"{config['path']}: " if isinstance(config.get("path"), str) else ""
        raise invalid_param(f"{where}{e}") from None


def _expand(config: Mapping[str, Any]) -> list[Cell]:
    _unknown(config, {"name", "tlb", "alloc", "base", "source", "path"}, "the config")
    if "tlb" not in config and "alloc" not in config:
        raise invalid_param("the config has neither a [tlb] nor an [alloc] table; give at least one")
    cells: list[Cell] = []
    if "tlb" in config:
        cells += _tlb_cells(_args.mapping(config["tlb"], "[tlb]"))
    if "alloc" in config:
        cells += _alloc_cells(_args.mapping(config["alloc"], "[alloc]"), config.get("base") or os.getcwd())
    return cells


def _tlb_cells(t: Mapping[str, Any]) -> list[Cell]:
    from . import tlb

    _unknown(t, _TLB_KEYS, "[tlb]")
    presets = _args.choices(_list(t, "presets", "tlb"), "tlb.presets", tlb.Tlb.presets())
    pages = _args.choices(_list(t, "pages", "tlb"), "tlb.pages", tlb.PAGE_POLICIES)
    patterns = _args.choices(_list(t, "patterns", "tlb"), "tlb.patterns", tlb.PATTERNS)
    footprints = [
        _args.size(f, f"tlb.footprints[{i}]", 4096, tlb.MAX_FOOTPRINT)
        for i, f in enumerate(_list(t, "footprints", "tlb"))
    ]
    accesses = _args.integer(t.get("accesses", 1_000_000), "tlb.accesses", 1, _args.MAX_ELEMENTS)
    seeds = [_args.integer(s, f"tlb.seeds[{i}]") for i, s in enumerate(_list(t, "seeds", "tlb", [0]))]
    axes = (presets, pages, patterns, footprints, seeds)
    _grid_size("[tlb]", math.prod(len(dict.fromkeys(v)) for v in axes))
    cells = []
    for preset in dict.fromkeys(presets):
        for page in dict.fromkeys(pages):
            for pattern in dict.fromkeys(patterns):
                for footprint in dict.fromkeys(footprints):
                    for seed in dict.fromkeys(seeds):
                        p = {
                            "preset": preset,
                            "page": page,
                            "pattern": pattern,
                            "footprint": footprint,
                            "accesses": accesses,
                            "seed": seed,
                        }
                        cells.append(Cell("tlb", p, cell_key("tlb", p)))
    return cells


#: The most cells one table of a grid may have (each is a task, a cache file and a row).
MAX_CELLS = 1_000_000
#: The work a sweep runs without ``yes=True`` (``--yes``), in units of one TLB access (see
#: :func:`estimate`): about an hour of one worker's time.
WORK_BUDGET = 5_000_000_000
#: Units a worker does per second (a TLB access of the model, called from a cell, is about
#: 0.7 us on this project's two-core reference machine).
UNITS_PER_SECOND = 1_500_000
#: What an alloc cell costs per event of its workload, in those units (measured the same way):
#: a replay at a given capacity, the search for the smallest capacity (about 20 replays, each
#: on a new device), and the timeline (a replay made one call per event from Python).
_REPLAY_UNITS, _MIN_UNITS, _TIMELINE_UNITS = 10, 200, 20


def _grid_size(table: str, cells: int) -> None:
    if cells > MAX_CELLS:
        raise invalid_param(f"{table} makes a grid of {cells:,} cells; at most {MAX_CELLS:,} (use fewer values)")


def estimate(cells: list[Cell]) -> int:
    """The work of ``cells`` in units of one TLB access: a TLB cell its ``accesses``; an alloc
    cell its workload's events times the cost of a replay, or of the search for a ``min``
    capacity, plus its timeline's."""
    work = 0
    for cell in cells:
        p = cell.params
        if cell.kind == "tlb":
            work += p["accesses"]
        else:
            per_event = (_MIN_UNITS if p["capacity"] == _MIN else _REPLAY_UNITS) + (
                _TIMELINE_UNITS if p["timeline"] else 0
            )
            work += len(cell.inputs) * per_event
    return work


def _capacity(value: Any, name: str) -> str | int:
    if value == _MIN:
        return _MIN
    if isinstance(value, str) and value.endswith("x"):
        try:
            ratio = float(value[:-1])
        except ValueError:
            ratio = math.nan
        if not 1.0 <= ratio <= 64.0:
            raise invalid_param(f"{name} {value!r}: a multiple of peak live bytes is a number from 1 to 64 and 'x'")
        return f"{ratio:g}x"
    return _args.size(value, name, 1 << 20, 1 << 40)


def _workload(name: str, spec: Any, base: str) -> tuple[dict[str, Any], Any]:
    """(the parameters that identify a workload, its :class:`npumem.formats.Trace`)."""
    from . import formats, workloads

    where = f"alloc.workloads.{name}"
    spec = dict(_args.mapping(spec, where))
    if ("trace" in spec) == ("generator" in spec):
        raise invalid_param(f"{where} needs exactly one of trace = PATH or generator = NAME ({', '.join(GENERATORS)})")
    if "trace" in spec:
        if len(spec) != 1:
            raise invalid_param(f"{where}: a trace workload takes only trace = PATH, got {sorted(spec)}")
        path = os.path.join(base, _args.text(spec["trace"], f"{where}.trace"))
        digest = _files.sha256(path)
        trace = formats.load(path)
        ident = {"trace": os.path.basename(path), "sha256": digest}
    else:
        gen = _args.choice(spec.pop("generator"), f"{where}.generator", GENERATORS)
        try:
            trace = formats.as_trace(getattr(workloads, gen)(**spec))
        except TypeError as e:  # an argument the generator does not take
            raise invalid_param(f"{where}: {e}") from None
        ident = {"generator": gen, **spec}
    return ident, trace


def _alloc_cells(a: Mapping[str, Any], base: str) -> list[Cell]:
    from .device import Device

    _unknown(a, _ALLOC_KEYS, "[alloc]")
    families = _args.choices(_list(a, "allocators", "alloc"), "alloc.allocators", _FAMILIES)
    confs = a.get("alloc_conf", [""])
    if isinstance(confs, Mapping):  # per family
        per = {
            f: [_args.text(c, f"alloc.alloc_conf.{f}") for c in _list(confs, f, "alloc.alloc_conf", [""])]
            for f in families
        }
        _unknown(confs, set(_FAMILIES), "alloc.alloc_conf")
    else:
        values = [_args.text(c, f"alloc.alloc_conf[{i}]") for i, c in enumerate(_list(a, "alloc_conf", "alloc", [""]))]
        per = {f: values if f in _CONFIGURABLE else [""] for f in families}
    for family, values in per.items():
        for conf in values:
            if conf and family not in _CONFIGURABLE:
                raise invalid_param(f"alloc.alloc_conf: the {family} allocator has no settings, got {conf!r}")
            Device(64 << 20, allocator=family, alloc_conf=conf or None)  # parses it: errors name the setting
    capacities = [_capacity(c, f"alloc.capacities[{i}]") for i, c in enumerate(_list(a, "capacities", "alloc", [_MIN]))]
    granularity = _args.size(a.get("granularity", "2MiB"), "alloc.granularity", 4096, 1 << 30)
    timeline = _args.flag(a.get("timeline", True), "alloc.timeline")
    specs = _args.mapping(a.get("workloads"), "alloc.workloads")
    if not specs:
        raise invalid_param("alloc.workloads is empty; give at least one [alloc.workloads.NAME] table")
    size = len(specs) * sum(len(dict.fromkeys(per[f])) for f in dict.fromkeys(families)) * len(capacities)
    _grid_size("[alloc]", size)
    workloads = {name: _workload(name, spec, base) for name, spec in specs.items()}
    cells = []
    for name, (ident, events) in workloads.items():
        for family in dict.fromkeys(families):
            for conf in dict.fromkeys(per[family]):
                for capacity in dict.fromkeys(capacities):
                    p = {
                        "workload": name,
                        "source": ident,
                        "allocator": family,
                        "alloc_conf": conf,
                        "capacity": capacity,
                        "granularity": granularity,
                        "timeline": timeline,
                    }
                    cells.append(Cell("alloc", p, cell_key("alloc", p), events))
    return cells


# -- one cell (runs on a worker) -----------------------------------------------------------------


def run_cell(cell: Cell) -> dict[str, Any]:
    """Runs one cell; returns ``{"row": {...}, "timeline": [...]}`` (the timeline empty for TLB
    cells). The function each Dask task calls."""
    if cell.kind == "tlb":
        return {"row": _tlb_row(cell.params), "timeline": []}
    return _alloc_result(cell.params, cell.inputs)


def _tlb_row(p: Mapping[str, Any]) -> dict[str, Any]:
    from . import tlb

    (row,) = tlb.sweep([p["preset"]], [p["page"]], [p["pattern"]], [p["footprint"]], p["accesses"], p["seed"])
    row["seed"] = p["seed"]
    return row


def _alloc_result(p: Mapping[str, Any], trace: Any) -> dict[str, Any]:
    from . import replay

    config: dict[str, Any] = {"allocator": p["allocator"]}
    if p["alloc_conf"]:
        config["alloc_conf"] = p["alloc_conf"]
    peak = trace.peak_live()
    granularity = p["granularity"]
    t0 = time.perf_counter()
    if p["capacity"] == _MIN:
        capacity = replay.min_capacity(trace, config, granularity=granularity)
    elif isinstance(p["capacity"], str):  # a multiple of peak live
        capacity = -(-math.ceil(peak * float(p["capacity"][:-1])) // granularity) * granularity
    else:
        capacity = p["capacity"]
    r = replay.replay(trace, {**config, "capacity": capacity})
    row = {
        "workload": p["workload"],
        "allocator": p["allocator"],
        "alloc_conf": p["alloc_conf"],
        "capacity_spec": str(p["capacity"]),
        "capacity": capacity,
        "peak_live": peak,
        "capacity_vs_live": capacity / peak if peak else math.nan,
        "events": r.events,
        "completed": r.completed,
        "ooms": r.ooms,
        "peak_allocated": r.peak_allocated,
        "peak_reserved": r.peak_reserved,
        "device_allocs": r.device_allocs,
        "physical_allocs": r.physical_allocs,
        "maps": r.maps,
        "cache_hit_rate": r.cache_hit_rate,
        "seconds": time.perf_counter() - t0,
    }
    evs = zip(trace.is_alloc.astype(bool).tolist(), trace.ids.tolist(), trace.sizes.tolist(), strict=True)
    points = _timeline(list(evs), {**config, "capacity": capacity}) if p["timeline"] else []
    return {"row": row, "timeline": points}


def _timeline(evs: list[tuple[bool, Any, int]], config: Mapping[str, Any]) -> list[dict[str, int]]:
    """Live (requested), allocated and reserved bytes at TIMELINE_POINTS evenly spaced events of a
    replay on ``Device(**config)`` (HUGE_FIRST; an allocation that fails is skipped, as in
    :func:`npumem.replay.replay`)."""
    from .device import Device
    from .enums import Policy
    from .errors import OutOfMemoryError

    dev = Device(**config)
    every = max(1, len(evs) // TIMELINE_POINTS)
    ptrs: dict[Any, int] = {}
    live = 0
    out = []
    for i, (is_alloc, key, size) in enumerate(evs):
        if is_alloc:
            try:
                ptrs[key] = dev.malloc(size, Policy.HUGE_FIRST)
                live += size
            except OutOfMemoryError:
                pass
        elif key in ptrs:
            dev.free(ptrs.pop(key))
            live -= size
        if i % every == 0 or i == len(evs) - 1:
            s = dev.memory_stats()
            out.append(
                {
                    "event": i,
                    "live": live,
                    "allocated": s["allocated_bytes.all.current"],
                    "reserved": s["reserved_bytes.all.current"],
                }
            )
    return out


# -- running a sweep ------------------------------------------------------------------------------


def _read_cached(path: str, key: str) -> dict[str, Any] | None:
    try:
        with open(path) as f:
            doc = json.load(f)
    except (OSError, ValueError):
        return None  # absent, or a torn write: computed again
    return doc if isinstance(doc, dict) and doc.get("key") == key and "row" in doc else None


def _write_atomic(path: str, text: str) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


class _Printer:
    """Progress on stderr: one line rewritten in place on a terminal, else a line every 10% or
    30 s; always the last one."""

    def __init__(self, stream: Any = None) -> None:
        self.stream = stream or sys.stderr
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.last_time = 0.0
        self.last_tenth = -1
        self.width = 0

    def __call__(self, p: Progress) -> None:
        now = time.monotonic()
        final = p.done == p.total
        if self.tty:
            if final or now - self.last_time >= 0.2:
                line = p.line()
                print("\r" + line.ljust(self.width), end="\n" if final else "", file=self.stream, flush=True)
                self.last_time, self.width = now, len(line)
            return
        tenth = 10 * p.done // max(p.total, 1)
        if final or tenth > self.last_tenth or now - self.last_time >= 30:
            print(p.line(), file=self.stream, flush=True)
            self.last_time, self.last_tenth = now, tenth


def _versions() -> dict[str, str]:
    from importlib import metadata

    from . import __version__

    out = {"npumem": __version__, "python": platform.python_version(), "platform": platform.platform()}
    for dist in ("numpy", "dask", "distributed", "pyarrow", "matplotlib"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "not installed"
    return out


def run(
    config: Any,
    out: Any,
    *,
    scheduler: str | None = None,
    workers: int = DEFAULT_WORKERS,
    client: Any = None,
    progress: bool | Callable[[Progress], None] = True,
    command: str | None = None,
    yes: bool = False,
) -> SweepResult:
    """Runs a sweep: ``config`` is a TOML path or a dict (as :func:`load_config` returns; trace
    paths are relative to its ``base``, else to the current folder); results go to the folder
    ``out`` (created). The cells run on ``client`` (a ``distributed.Client``) when given, else on the
    scheduler at ``scheduler``, else on a new ``LocalCluster`` of ``workers`` single-threaded
    worker processes; ``workers=0`` runs them one by one in this process (no Dask).
    ``progress``: True prints to stderr, a callable gets each :class:`Progress`, False is quiet.
    ``command`` is recorded as the command that made the results (default: this call).
    Cells still to compute whose :func:`estimate` passes :data:`WORK_BUDGET` are refused
    (InvalidParamError with the estimate, before anything runs) unless ``yes``."""
    t_start = time.perf_counter()
    if not isinstance(config, Mapping):
        config = load_config(config)
    out = _files.path_arg(out, "out")
    if scheduler is not None:
        scheduler = _args.text(scheduler, "scheduler")
    workers = _args.integer(workers, "workers", 0, 512)
    yes = _args.flag(yes, "yes")
    if not callable(progress):
        progress = _Printer() if _args.flag(progress, "progress") else (lambda p: None)
    cells = expand(config)
    if os.path.exists(out) and not os.path.isdir(out):
        raise invalid_param(f"out {out!r} is a file; give a folder")
    cache = os.path.join(out, "cache")  # made when the first cell lands (nothing is written before)

    results: dict[str, dict[str, Any]] = {}
    todo: list[Cell] = []
    for cell in cells:
        if cell.key in results:
            continue  # the same cell twice in the grid (a repeated value): one row
        hit = _read_cached(os.path.join(cache, f"{cell.key}.json"), cell.key)
        if hit is None:
            todo.append(cell)
        results[cell.key] = hit or {}
    work = estimate(todo)
    if work > WORK_BUDGET and not yes:
        hours = work / UNITS_PER_SECOND / 3600 / max(1, workers)
        raise invalid_param(
            f"the sweep has {len(todo):,} cells to compute, about {work:,} units of work (a TLB access each) "
            f"(~{hours:,.1f} h on {max(1, workers)} worker(s)): more than the budget of {WORK_BUDGET:,}; "
            "use fewer cells or accesses, or pass --yes (sweep.run(..., yes=True)) to run it anyway"
        )
    unique = len(results)
    cached = unique - len(todo)
    failed: dict[str, str] = {}
    started = time.perf_counter()
    done = cached

    def landed(cell: Cell, result: dict[str, Any] | None, error: str | None) -> None:
        nonlocal done
        done += 1
        if error is not None:
            failed[cell.key] = error
        else:
            doc = {"key": cell.key, "kind": cell.kind, "params": dict(cell.params), **result}
            os.makedirs(cache, exist_ok=True)
            _write_atomic(os.path.join(cache, f"{cell.key}.json"), json.dumps(doc))
            results[cell.key] = doc
        elapsed = time.perf_counter() - started
        computed = done - cached
        eta = elapsed / computed * (unique - done) if computed else None
        progress(Progress(done, unique, cached, len(failed), elapsed, eta))

    progress(Progress(done, unique, cached, 0, 0.0, None if todo else 0.0))
    cluster_info = "this process (workers=0)"
    if todo and workers == 0 and client is None and scheduler is None:
        for cell in todo:
            try:
                result = run_cell(cell)
            except Exception as e:
                landed(cell, None, f"{type(e).__name__}: {e}")
                continue
            landed(cell, result, None)  # outside the try: an error here is not the cell's
    elif todo:
        cluster_info = _on_dask(todo, client, scheduler, workers, landed)

    os.makedirs(out, exist_ok=True)
    files = _write_tables(cells, results, out, failed)
    manifest = {
        "name": config.get("name", ""),
        "config_path": config.get("path"),
        "config": config.get("source") or json.dumps({k: v for k, v in config.items() if k != "base"}, default=str),
        "command": command or f"npumem.sweep.run({config.get('path') or '<dict>'!r}, out={out!r})",
        "versions": _versions(),
        "cluster": cluster_info,
        "cells": unique,
        "computed": unique - cached - len(failed),
        "cached": cached,
        "failed": failed,
        "seconds": round(time.perf_counter() - t_start, 3),
        "finished": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }
    _write_atomic(os.path.join(out, "sweep.json"), json.dumps(manifest, indent=2))
    result = SweepResult(out, unique, unique - cached - len(failed), cached, failed, files, manifest["seconds"])
    if not any(f.endswith(".parquet") for f in files) and files:
        require("pyarrow", f"writing the sweep's Parquet tables (the CSVs are in {out})")
    return result


def _on_dask(
    todo: list[Cell],
    client: Any,
    scheduler: str | None,
    workers: int,
    landed: Callable[[Cell, dict[str, Any] | None, str | None], None],
) -> str:
    """Runs the cells as Dask tasks; calls ``landed`` once per cell as results arrive. Returns a
    description of the cluster."""
    distributed = require("distributed", "running a sweep on Dask (or run it in this process with workers=0)")
    own_cluster = own_client = None
    if client is None:
        if scheduler is not None:
            client = own_client = distributed.Client(scheduler, timeout="30s")
        else:
            own_cluster = distributed.LocalCluster(
                n_workers=max(1, workers),
                threads_per_worker=1,
                processes=True,
                dashboard_address=None,
                silence_logs=logging.ERROR,
            )
            client = own_client = distributed.Client(own_cluster)
    try:
        _same_version(client)
        info = client.scheduler_info()
        desc = f"Dask scheduler {info.get('address', '?')} with {len(info.get('workers', {}))} workers"
        if own_cluster is not None:
            desc = f"LocalCluster of {max(1, workers)} worker processes (1 thread each); {desc}"
        by_key = {}
        for cell in todo:
            fut = client.submit(run_cell, cell, key=f"npumem-cell-{cell.kind}-{cell.key}", pure=False)
            by_key[fut.key] = (fut, cell)
        for fut in distributed.as_completed([f for f, _ in by_key.values()]):
            _, cell = by_key.pop(fut.key)
            try:
                result = fut.result()
            except Exception as e:  # the cell raised, or its task killed too many workers
                result, error = None, f"{type(e).__name__}: {e}"
            else:
                error = None
            fut.release()
            landed(cell, result, error)
        return desc
    finally:
        if own_client is not None:
            own_client.close()
        if own_cluster is not None:
            own_cluster.close()


def _worker_version() -> str:
    return build_id()


def _same_version(client: Any) -> None:
    """Every worker runs this npumem build (cells are cached under it)."""
    ours = build_id()
    try:
        versions = client.run(_worker_version)
    except ModuleNotFoundError as e:
        raise invalid_param(f"a Dask worker cannot import npumem ({e}); install npumem {ours} on the workers") from None
    other = {w: v for w, v in versions.items() if v != ours}
    if other:
        w, v = next(iter(other.items()))
        raise invalid_param(
            f"Dask worker {w} runs npumem {v}, this process {ours}; results are cached by build, "
            "so every worker must run the same one"
        )


def _write_tables(cells: list[Cell], results: dict[str, dict[str, Any]], out: str, failed: dict[str, str]) -> list[str]:
    """The tables of the grid's cells (one row each, in grid order), as CSV and, with pyarrow,
    Parquet. Returns the files written."""
    from .tlb import write_csv

    tables: dict[str, list[dict[str, Any]]] = {"tlb": [], "alloc": [], "timelines": []}
    seen: set[str] = set()
    for cell in cells:
        if cell.key in seen or cell.key in failed:
            continue
        seen.add(cell.key)
        doc = results[cell.key]
        tables[cell.kind].append({"cell": cell.key, **doc["row"]})
        for point in doc.get("timeline", []):
            r = doc["row"]
            tables["timelines"].append(
                {
                    "cell": cell.key,
                    "workload": r["workload"],
                    "allocator": r["allocator"],
                    "alloc_conf": r["alloc_conf"],
                }
                | {"capacity_spec": r["capacity_spec"], **point}
            )
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ModuleNotFoundError:
        pa = pq = None
    files = []
    for name, rows in tables.items():
        for ext in ("csv", "parquet"):
            path = os.path.join(out, f"{name}.{ext}")
            if os.path.exists(path):
                os.remove(path)  # no stale table of an earlier grid
        if not rows:
            continue
        write_csv(rows, os.path.join(out, f"{name}.csv"))
        files.append(os.path.join(out, f"{name}.csv"))
        if pq is not None:
            pq.write_table(pa.Table.from_pylist(rows), os.path.join(out, f"{name}.parquet"))
            files.append(os.path.join(out, f"{name}.parquet"))
    return files


__all__ = ["Cell", "Progress", "SweepResult", "cell_key", "estimate", "expand", "load_config", "run", "run_cell"]
