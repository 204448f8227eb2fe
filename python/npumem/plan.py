"""Static memory planning: buffers with known lifetimes get fixed offsets in one arena.

A :class:`Problem` is MiniMalloc's format: each buffer lives over the half-open step range
``[lower, upper)`` and needs ``size`` bytes. :meth:`Problem.solve` assigns offsets with a named
strategy (the published baselines, reproduced, and ``"npumem"``, the default) and returns a
:class:`Plan` with its peak, the max-live lower bound and a CANN-style report. Every plan is
validated in Rust (no two buffers live at the same step overlap in address).

>>> p = Problem.from_buffers([(0, 2, 100), (1, 3, 50), (2, 4, 100)])
>>> plan = p.solve()
>>> plan.peak, plan.lower_bound
(150, 150)
"""

from __future__ import annotations

import csv
import math
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from . import _args, _files, _native
from ._optional import require
from .errors import AclError, invalid_param

STRATEGIES: tuple[str, ...] = tuple(_native.plan_strategies())
DEFAULT_STRATEGY = "npumem"
#: Strategies that assign tensors to shared objects (their bound is ``Problem.positional_bound``).
SHARED_OBJECT = ("tflite_greedy_by_breadth",)
#: No time limit by default: the exact search is bounded by work (:data:`DEFAULT_WORK_LIMIT`), so a
#: plan is the same on a busy machine as on a quiet one.
DEFAULT_TIME_LIMIT: float | None = None
#: Search nodes (per portfolio thread) the exact search may visit by default: enough for every
#: MiniMalloc A-K instance at capacity (the most, A, takes 18,777) and, without a capacity, for
#: the first try at the bound (it gets half) to prove A, B, C, E-I and K optimal. The search only
#: runs when the greedy plan misses the bound or the capacity.
DEFAULT_WORK_LIMIT = 40_000


def _limits(time_limit: float | None, work_limit: int | None) -> tuple[float, int | None]:
    """The exact search's limits, checked: ``time_limit`` seconds (``None``: none, allowed only
    with a ``work_limit``, so that every search ends) and ``work_limit`` search nodes."""
    work = _args.optional_integer(work_limit, "work_limit")
    if time_limit is None:
        if work is None:
            raise invalid_param("time_limit None (no time limit) needs a work_limit, so that the exact search ends")
        return math.inf, work
    return _args.real(time_limit, "time_limit", 0.0, 1e9, unit=" seconds (0 disables the exact search)"), work


def _csv_int(cell: str | None, where: str, column: str) -> int:
    """A CSV cell as a non-negative int below 2**64; ``where`` is ``file:line``."""
    try:
        v = int(cell)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise invalid_param(
            f"{where}: lower, upper, size (and offset) must be integers; {column} is {_args.show(cell)}"
        ) from None
    return _args.integer(v, f"{where}: {column}")


@dataclass(frozen=True)
class Problem:
    """Buffers to place: ids, half-open lifetimes ``[lower, upper)``, sizes in bytes; offsets are
    multiples of ``alignment``. ``offsets`` holds a placement read from a solution CSV, if any."""

    ids: tuple[str, ...]
    lower: np.ndarray
    upper: np.ndarray
    size: np.ndarray
    alignment: int = 1
    offsets: np.ndarray | None = field(default=None, compare=False)

    @classmethod
    def from_buffers(
        cls, buffers: Sequence[tuple[int, int, int]], *, ids: Sequence[str] | None = None, alignment: int = 1
    ) -> Problem:
        """From ``(lower, upper, size)`` triples; ids default to "0", "1", ..."""
        if isinstance(buffers, (str, bytes)) or not isinstance(buffers, Iterable):
            raise _args.type_error("buffers", buffers, "a list of (lower, upper, size) triples")
        rows = list(buffers)
        for i, r in enumerate(rows):
            if isinstance(r, (str, bytes)) or not isinstance(r, Sequence) or len(r) != 3:
                raise invalid_param(f"buffers[{i}] is {_args.show(r)}; each buffer is a (lower, upper, size) triple")
        if ids is not None and (isinstance(ids, (str, bytes)) or not isinstance(ids, Iterable)):
            raise _args.type_error("ids", ids, "a list of buffer names")
        names = tuple(str(i) for i in (ids if ids is not None else range(len(rows))))
        if len(names) != len(rows):
            raise invalid_param(f"{len(names)} ids for {len(rows)} buffers")
        cols = list(zip(*rows, strict=True)) if rows else [(), (), ()]
        return cls.of(names, *cols, alignment=alignment)

    @classmethod
    def of(
        cls,
        ids: Sequence[str],
        lower: Iterable[int],
        upper: Iterable[int],
        size: Iterable[int],
        *,
        alignment: int = 1,
        offsets: Iterable[int] | None = None,
    ) -> Problem:
        """From columns of non-negative ints below 2**64; checks them in Rust (non-empty
        lifetimes, sizes > 0, power-of-two alignment, sums that fit in 64 bits)."""
        if isinstance(ids, (str, bytes)) or not isinstance(ids, Iterable):
            raise _args.type_error("ids", ids, "a list of buffer names")
        alignment = _args.integer(alignment, "alignment", 1, 1 << 62)
        if alignment & (alignment - 1):
            raise invalid_param(f"alignment {alignment} is not a power of two; use 1 for none or e.g. 64 or 512")
        p = cls(
            tuple(str(i) for i in ids),
            _args.uint64_array(lower, "lower"),
            _args.uint64_array(upper, "upper"),
            _args.uint64_array(size, "size"),
            alignment,
            None if offsets is None else _args.uint64_array(offsets, "offsets"),
        )
        if not (len(p.ids) == len(p.lower) == len(p.upper) == len(p.size)):
            raise invalid_param(
                f"ids, lower, upper and size must have the same length, got {len(p.ids)}, {len(p.lower)}, "
                f"{len(p.upper)} and {len(p.size)}"
            )
        if p.offsets is not None and len(p.offsets) != len(p.ids):
            raise invalid_param(f"offsets has {len(p.offsets)} entries for {len(p.ids)} buffers")
        try:
            _native.plan_lower_bound(p.lower, p.upper, p.size, p.alignment)  # checks every buffer
        except AclError as e:
            # Name the buffer by its id, not its index.
            m = re.match(r"buffer (\d+): (.*)", e.message, re.S)
            if m is None:
                raise
            raise invalid_param(f"buffer {p.ids[int(m.group(1))]!r}: {m.group(2)}") from None
        return p

    @classmethod
    def from_csv(cls, path: str | os.PathLike[str], *, alignment: int = 1) -> Problem:
        """Reads MiniMalloc's CSV (``id,lower,upper,size`` and optionally ``offset``). A file that
        is not such a CSV raises InvalidParamError naming the file and line; one that cannot be
        opened raises OSError."""
        if not isinstance(path, (str, os.PathLike)):
            raise _args.type_error("path", path, "a file path")
        name = os.fspath(path)
        try:
            with open(path, newline="", encoding="utf-8") as f:
                reader = csv.DictReader(_files.csv_lines(f, name, "a MiniMalloc CSV"))
                need = {"id", "lower", "upper", "size"}
                if reader.fieldnames is None or not need <= set(reader.fieldnames):
                    raise invalid_param(
                        f"{name}: expected a header with id,lower,upper,size (MiniMalloc CSV); got "
                        f"{_args.show(','.join(reader.fieldnames or []))}"
                    )
                has_offset = "offset" in reader.fieldnames
                ids, cols = [], ([], [], [], [])
                for line, row in enumerate(reader, start=2):
                    keys = ("lower", "upper", "size", "offset") if has_offset else ("lower", "upper", "size")
                    for c, k in zip(cols, keys, strict=False):
                        c.append(_csv_int(row.get(k), f"{name}:{line}", k))
                    ids.append(row["id"])
        except (UnicodeDecodeError, csv.Error) as e:
            raise invalid_param(f"{name}: not a MiniMalloc CSV text file ({e})") from None
        return cls.of(ids, cols[0], cols[1], cols[2], alignment=alignment, offsets=cols[3] if has_offset else None)

    @classmethod
    def from_trace(cls, events: Iterable[tuple[str, int, int]] | Any, *, alignment: int = 512) -> Problem:
        """From an alloc/free trace (``("alloc"|"free", id, size)`` events, as :mod:`npumem.workloads`
        gives, or a :class:`npumem.formats.Trace`, as :func:`npumem.formats.load` reads): each
        event is a step; a block lives from its alloc to its free, or to the end if never freed.
        What a graph compiler could plan offline for the same run."""
        from .formats import Trace, event_fields

        if isinstance(events, Trace):
            events = events.events()
        start: dict[Any, tuple[int, int]] = {}
        rows: list[tuple[int, int, int]] = []
        ids: list[str] = []
        step = -1
        if isinstance(events, (str, bytes)) or not isinstance(events, Iterable):
            raise _args.type_error("events", events, "a list of ('alloc' | 'free', id, size) events")
        for step, ev in enumerate(events):
            kind, ident, size = event_fields(ev, step)
            if kind == "alloc":
                if ident in start:
                    raise invalid_param(f"event {step}: id {ident} allocated twice without a free")
                start[ident] = (step, size)
            elif kind == "free":
                if ident not in start:
                    raise invalid_param(f"event {step}: free of id {ident}, which is not live")
                lo, sz = start.pop(ident)
                rows.append((lo, step, sz))
                ids.append(str(ident))
            else:
                raise invalid_param(f"event {step}: kind {kind!r} is neither 'alloc' nor 'free'")
        for ident, (lo, sz) in start.items():
            rows.append((lo, step + 1, sz))
            ids.append(str(ident))
        return cls.from_buffers(rows, ids=ids, alignment=alignment)

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def lower_bound(self) -> int:
        """The most aligned bytes live at one step: no plan can need less."""
        return _native.plan_lower_bound(self.lower, self.upper, self.size, self.alignment)

    @property
    def positional_bound(self) -> int:
        """The sum of positional maximums (TFLite's ``CalculatePositionalMaximums``): the least a
        shared-object plan (``tflite_greedy_by_breadth``) can need; at least ``lower_bound``."""
        return _native.plan_positional_bound(self.lower, self.upper, self.size, self.alignment)

    @property
    def naive_total(self) -> int:
        """Bytes with no reuse at all (the sum of aligned sizes)."""
        a = self.alignment
        return int(sum((int(s) + a - 1) // a * a for s in self.size))

    def validate(self, offsets: Iterable[int]) -> int:
        """Checks a placement; returns its peak or raises naming two overlapping buffers."""
        offsets = _args.uint64_array(offsets, "offsets")
        try:
            return _native.plan_validate(self.lower, self.upper, self.size, offsets, self.alignment)
        except AclError as e:
            # Name the buffers by their ids, not their indices.
            named = re.sub(r"\bbuffers? (\d+)\b", lambda m: f"buffer {self.ids[int(m.group(1))]!r}", e.message)
            named = re.sub(r"\band (\d+) \(offset", lambda m: f"and {self.ids[int(m.group(1))]!r} (offset", named)
            if named == e.message:
                raise
            raise invalid_param(named) from None

    def solve(
        self,
        strategy: str = DEFAULT_STRATEGY,
        *,
        capacity: int | None = None,
        time_limit: float | None = DEFAULT_TIME_LIMIT,
        work_limit: int | None = DEFAULT_WORK_LIMIT,
    ) -> Plan:
        """Assigns offsets with ``strategy`` (one of :data:`STRATEGIES`).

        For the default ``"npumem"`` strategy, when the greedy portfolio's plan is above the
        lower bound (or above ``capacity``), an exact branch-and-bound search runs for up to
        ``time_limit`` seconds and ``work_limit`` search nodes (per portfolio thread): with a
        capacity it stops at the first plan that fits; a capacity that it proves infeasible (or
        that is below the max-live bound) is reported as such, and the search goes on lowering
        the peak; without a capacity it searches for the optimum and stops once it is proven.
        ``time_limit=0`` or ``work_limit=0`` disables it. By default there is no time limit, only
        :data:`DEFAULT_WORK_LIMIT`: the same plan on a busy machine as on a quiet one.
        ``Plan.exact`` says how it ended, ``Plan.search_nodes`` what it cost."""
        strategy = _args.choice(strategy, "strategy", STRATEGIES)
        capacity = _args.optional_integer(capacity, "capacity")
        limit, work = _limits(time_limit, work_limit)
        r = _native.plan_offsets(self.lower, self.upper, self.size, strategy, self.alignment, capacity, limit, work)
        return Plan._from_native(self, r, capacity)


@dataclass(frozen=True)
class Plan:
    """Offsets for every buffer of ``problem`` and how good they are."""

    problem: Problem
    offsets: np.ndarray
    peak: int
    lower_bound: int
    strategy: str
    order: str
    solve_seconds: float
    capacity: int | None = None
    #: The best proven lower bound on the peak: ``lower_bound`` (max live), raised when the
    #: exact search proves a capacity infeasible.
    bound: int = 0
    #: Whether ``peak`` is proven optimal.
    optimal: bool = False
    #: How the exact search ended: "not run", "optimal", "reached capacity", "infeasible" (the
    #: capacity is proven out of reach; ``peak`` is then the best plan the search found and
    #: ``optimal`` says whether it is proven), "timed out", "work limit reached" or "too large"
    #: (over 10,000 buffers or 4 million overlapping pairs).
    exact: str = "not run"
    #: Search nodes the exact search visited (per portfolio thread, over all its tries).
    search_nodes: int = 0

    @classmethod
    def _from_native(cls, problem: Problem, r: dict[str, Any], capacity: int | None) -> Plan:
        """From the dict the native planner returns."""
        return cls(
            problem=problem,
            offsets=r["offsets"],
            peak=r["peak"],
            lower_bound=r["lower_bound"],
            strategy=r["strategy"],
            order=r["order"],
            solve_seconds=r["solve_seconds"],
            capacity=capacity,
            bound=r["bound"],
            optimal=r["optimal"],
            exact=r["exact"],
            search_nodes=r["nodes"],
        )

    @property
    def gap(self) -> float:
        """How far the peak is above the lower bound (0.0 = provably optimal)."""
        return self.peak / self.lower_bound - 1 if self.lower_bound else 0.0

    @property
    def fits(self) -> bool:
        """Whether the peak is within ``capacity`` (always true without one)."""
        return self.capacity is None or self.peak <= self.capacity

    def report(self) -> dict[str, Any]:
        """CANN-style profile: ``reuse_ratio`` is the share of the naive total saved by sharing,
        ``reach_theory_rate`` is lower_bound / peak (1.0 = at the bound)."""
        naive = self.problem.naive_total
        return {
            "strategy": self.strategy,
            "order": self.order,
            "buffers": len(self.problem),
            "peak_memory": self.peak,
            "lower_bound": self.lower_bound,
            "naive_memory": naive,
            "gap": self.gap,
            "reuse_ratio": 1 - self.peak / naive if naive else 0.0,
            "reach_theory_rate": self.lower_bound / self.peak if self.peak else 1.0,
            "proven_bound": self.bound,
            **({"shared_object_bound": self.problem.positional_bound} if self.strategy in SHARED_OBJECT else {}),
            "optimal": self.optimal,
            "exact": self.exact,
            "search_nodes": self.search_nodes,
            "capacity": self.capacity,
            "fits": self.fits,
            "solve_seconds": self.solve_seconds,
        }

    @property
    def verdict(self) -> str:
        """One line on the capacity: whether the plan fits, or what the search proved."""
        if self.capacity is None:
            return f"peak {self.peak:,} B" + (
                " (optimal)" if self.optimal else f"; proven: no plan below {self.bound:,} B"
            )
        cap = self.capacity
        if self.fits:
            return f"capacity {cap:,} B: {self.strategy} fits (peak {self.peak:,} B)"
        best = f"best plan found {self.peak:,} B ({self.peak - cap:,} B over{', optimal' if self.optimal else ''})"
        if cap < self.lower_bound:
            return f"capacity {cap:,} B: impossible: {self.lower_bound:,} B are live at once (the lower bound); {best}"
        if self.exact == "infeasible":
            return f"capacity {cap:,} B: does NOT fit: proven, no plan below {self.bound:,} B; {best}"
        how = {"not run": "exact search not run", "too large": "too large for the exact search"}.get(
            self.exact, f"exact search {self.exact}"
        )
        return f"capacity {cap:,} B: does NOT fit ({how}): {best}; proven: no plan below {self.bound:,} B"

    def to_csv(self, path: str | os.PathLike[str]) -> None:
        """Writes MiniMalloc's solution CSV: ``id,lower,upper,size,offset``."""
        p = self.problem
        with open(path, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["id", "lower", "upper", "size", "offset"])
            cols = (p.ids, p.lower.tolist(), p.upper.tolist(), p.size.tolist(), self.offsets.tolist())
            w.writerows(zip(*cols, strict=True))

    def plot(self, path: str | os.PathLike[str], *, title: str | None = None) -> None:
        """The placement as a PNG: one rectangle per buffer (x = lifetime, y = offset .. offset +
        size), with the lower bound and the capacity as lines (needs matplotlib: without it,
        :class:`npumem.MissingDependencyError`, an ImportError, says how to install it)."""
        require("matplotlib", "drawing a plan (Plan.plot)").use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.collections import PatchCollection
        from matplotlib.patches import Rectangle

        p = self.problem
        unit, label = (1 << 20, "MiB") if self.peak >= 1 << 24 else (1, "bytes")
        rects = [
            Rectangle((lo, off / unit), hi - lo, sz / unit)
            for lo, hi, sz, off in zip(
                p.lower.tolist(), p.upper.tolist(), p.size.tolist(), self.offsets.tolist(), strict=True
            )
        ]
        fig, ax = plt.subplots(figsize=(10, 5))
        ax.add_collection(PatchCollection(rects, facecolor="tab:blue", edgecolor="white", linewidth=0.2, alpha=0.8))
        ax.axhline(self.lower_bound / unit, color="tab:green", linestyle="--", label="lower bound (max live)")
        if self.capacity is not None:
            ax.axhline(self.capacity / unit, color="tab:red", label="capacity")
        ax.axhline(self.peak / unit, color="black", linewidth=0.8, label=f"peak ({100 * self.gap:+.1f}%)")
        ax.set_xlim(int(p.lower.min()) if len(p) else 0, int(p.upper.max()) if len(p) else 1)
        ax.set_ylim(0, max(self.peak, self.capacity or 0, 1) / unit * 1.05)
        ax.set_xlabel("step")
        ax.set_ylabel(f"offset ({label})")
        ax.set_title(title or f"{self.strategy}: {len(p)} buffers")
        ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)


def solve(
    problem: Problem,
    strategy: str = DEFAULT_STRATEGY,
    *,
    capacity: int | None = None,
    time_limit: float | None = DEFAULT_TIME_LIMIT,
    work_limit: int | None = DEFAULT_WORK_LIMIT,
) -> Plan:
    """``problem.solve(strategy, capacity=capacity, time_limit=time_limit, work_limit=work_limit)``."""
    if not isinstance(problem, Problem):
        raise _args.type_error("problem", problem, "a npumem.plan.Problem")
    return problem.solve(strategy, capacity=capacity, time_limit=time_limit, work_limit=work_limit)


__all__ = ["DEFAULT_STRATEGY", "DEFAULT_TIME_LIMIT", "DEFAULT_WORK_LIMIT", "STRATEGIES", "Plan", "Problem", "solve"]
