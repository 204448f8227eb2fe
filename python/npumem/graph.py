"""Compute graphs to plan offline: ops in execution order over named tensors, with weights, graph
inputs and outputs, views and in-place results (aliases) and per-op workspaces.

    >>> from npumem.graph import Graph
    >>> g = Graph(alignment=512)
    >>> x = g.input("x", 4096)
    >>> w = g.weight("w", 1024)
    >>> h = g.op("matmul", [x, w], [("h", 8192)], workspace=2048)
    >>> r = g.op("relu_", [h], [g.alias("r", h)])          # in place: r shares h's memory
    >>> y = g.op("sum", [r], [("y", 64)])
    >>> g.mark_output(y)
    >>> plan = g.plan()
    >>> plan.report()["activation_memory"], plan.report()["weight_memory"]
    (10240, 1024)

Liveness (in Rust, ``npumem-plan`` ``graph``): op ``k`` runs at step ``k``; an activation
lives from its producer to its last reader (inclusive); weights and inputs from step 0, outputs to
the last step; a workspace for its op's step. Aliases share one buffer (the hull of their
lifetimes, the largest size). Weights, inputs and outputs are resident; activations and
workspaces are planned into one arena with any strategy of :mod:`npumem.plan`.

With ``schedule=True`` (or a scheduler name, see :data:`SCHEDULERS`) the planner first chooses
the order of the ops — any order that keeps data dependencies, and every in-place write or view
in program order relative to the other ops touching its buffer — and reports the given order's
bound, each scheduler's order and arena, and a bound no order can beat (:class:`Schedule`).

With ``mem_limit``, when weights + I/O + arena exceed it, the planner moves things out: weights
offloaded to host and prefetched before each use, activations offloaded across their longest
idle gap, or recomputed by re-running their producer — greedily, fewest bytes moved per byte
saved, each copy also charged its PCIe latency in bytes — and reports the transfer volume and
time on the device cost model (``preset``).
"""

from __future__ import annotations

import gzip
import json
import os
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import _args, _files, _native
from .errors import AclError, InvalidParamError, invalid_param
from .plan import DEFAULT_STRATEGY, DEFAULT_TIME_LIMIT, DEFAULT_WORK_LIMIT, STRATEGIES, Plan, Problem, _limits

ROLES = ("activation", "weight", "input", "output")
#: Who chooses the op order with ``plan(schedule=...)``: the given order, XLA's
#: DefaultMemoryScheduler portfolio, PyTorch Inductor's reorder_for_peak_memory portfolio, or
#: npumem (the best of those and an exact search over ready sets; the default).
SCHEDULERS: tuple[str, ...] = tuple(_native.plan_schedulers()[0])
#: Transitions (one op tried from one state) the npumem order search may evaluate by default.
DEFAULT_SCHEDULE_WORK: int = _native.plan_schedulers()[1]


@dataclass
class _Tensor:
    name: str
    size: int
    role: str
    alias_of: str | None = None


@dataclass
class _Op:
    name: str
    inputs: list[str]
    outputs: list[str]
    workspace: int
    duration_us: float | None


class Graph:
    """Ops in execution order over named tensors. Build it with :meth:`input`, :meth:`weight`,
    :meth:`tensor`, :meth:`alias`, :meth:`op` and :meth:`mark_output`, then :meth:`plan` it."""

    def __init__(self, alignment: int = 512) -> None:
        alignment = _args.integer(alignment, "alignment", 1, 1 << 40)
        if alignment & (alignment - 1):
            raise invalid_param(f"alignment {alignment!r} must be a power of two (e.g. 512, as CANN's graph engine)")
        self.alignment = alignment
        self._tensors: dict[str, _Tensor] = {}
        self._ops: list[_Op] = []

    # -- building -----------------------------------------------------------------------------

    def _check_new(self, name: Any, size: Any) -> tuple[str, int]:
        """A new tensor's name (a non-empty str, not yet defined) and size (an int from 1 to
        2**64-1 bytes)."""
        if not isinstance(name, str):
            raise _args.type_error("tensor name", name, "a non-empty str")
        if not name:
            raise invalid_param("tensor name '' must be a non-empty string")
        if name in self._tensors:
            raise invalid_param(f"tensor {name!r} is already defined; names must be unique")
        if not _args.is_int(size) or not 0 < size <= _args.U64_MAX:
            if not _args.is_int(size):
                raise _args.type_error(f"tensor {name!r}: size", size, "an int of bytes")
            raise invalid_param(f"tensor {name!r}: size {size!r} must be a positive int of bytes below 2**64")
        return name, int(size)

    def _add(self, name: str, size: int, role: str, alias_of: str | None = None) -> str:
        name, size = self._check_new(name, size)
        self._tensors[name] = _Tensor(name, size, role, alias_of)
        return name

    def input(self, name: str, size: int) -> str:
        """A graph input (provided by the caller, resident)."""
        return self._add(name, size, "input")

    def weight(self, name: str, size: int) -> str:
        """A constant parameter (resident unless offloaded under a ``mem_limit``)."""
        return self._add(name, size, "weight")

    def tensor(self, name: str, size: int) -> str:
        """An activation that some op will produce."""
        return self._add(name, size, "activation")

    def alias(self, name: str, base: str, size: int | None = None) -> str:
        """A tensor sharing ``base``'s memory: a view, an in-place result, an output that reuses
        an input. ``size`` defaults to the base's."""
        b = self._get(base, f"alias {name!r}")
        return self._add(name, b.size if size is None else size, "activation", alias_of=base)

    def op(
        self,
        name: str,
        inputs: Iterable[str] = (),
        outputs: Iterable[str | tuple[str, int]] = (),
        *,
        workspace: int = 0,
        duration_us: float | None = None,
    ) -> str:
        """Appends an op (ops run in the order they are added). ``outputs`` are tensor names or
        ``(name, size)`` pairs declaring new activations. Returns the first output's name (or the
        op's name when it has none). ``duration_us`` is the op's run time, used to price a
        recompute (default: its operand bytes at HBM bandwidth). Every argument is checked before
        the graph changes."""
        if not isinstance(name, str):
            raise _args.type_error("op name", name, "a non-empty str")
        if not name:
            raise invalid_param("op name '' must be a non-empty string")
        where = f"op {name!r}"
        ins = [self._get(t, where).name for t in _listed(inputs, f"{where}: inputs", "a list of tensor names")]
        outs: list[str] = []
        new: dict[str, int] = {}
        for i, o in enumerate(_listed(outputs, f"{where}: outputs", "a list of tensor names or (name, size) pairs")):
            if isinstance(o, tuple):
                if len(o) != 2:
                    raise invalid_param(f"{where}: outputs[{i}] {_args.show(o)} must be a (name, size) pair")
                n, size = self._check_new(*o)
                if n in new:
                    raise invalid_param(f"tensor {n!r} is already defined; names must be unique")
                new[n] = size
                outs.append(n)
            else:
                outs.append(self._get(o, where).name)
        workspace = _args.integer(workspace, f"{where}: workspace")
        if duration_us is not None:
            duration_us = _args.real(duration_us, f"{where}: duration_us", 0.0, 1e15, unit=" microseconds")
        for n, size in new.items():
            self._tensors[n] = _Tensor(n, size, "activation")
        self._ops.append(_Op(name, ins, outs, workspace, duration_us))
        return outs[0] if outs else name

    def mark_output(self, *names: str) -> None:
        """Marks tensors as graph outputs (handed back to the caller: resident, live to the end)."""
        for t in [self._get(n, "mark_output") for n in names]:
            t.role = "output"

    def _get(self, name: str, where: str) -> _Tensor:
        if not isinstance(name, str):
            raise _args.type_error(f"{where}: tensor name", name, "a str")
        t = self._tensors.get(name)
        if t is None:
            raise invalid_param(f"{where}: unknown tensor {name!r}; declare it first")
        return t

    # -- inspection ---------------------------------------------------------------------------

    @property
    def tensors(self) -> dict[str, int]:
        """Tensor names and sizes, in declaration order."""
        return {t.name: t.size for t in self._tensors.values()}

    @property
    def ops(self) -> list[str]:
        return [o.name for o in self._ops]

    def role(self, name: str) -> str:
        return self._get(name, "role").role

    def __len__(self) -> int:
        return len(self._tensors)

    # -- files --------------------------------------------------------------------------------

    FORMAT = "npumem-graph/1"

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict: ``{"format", "alignment", "tensors": [[name, size, role,
        alias_of]], "ops": [[name, inputs, outputs, workspace, duration_us]]}``."""
        return {
            "format": self.FORMAT,
            "alignment": self.alignment,
            "tensors": [[t.name, t.size, t.role, t.alias_of] for t in self._tensors.values()],
            "ops": [[o.name, o.inputs, o.outputs, o.workspace, o.duration_us] for o in self._ops],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Graph:
        """Rebuilds a graph from :meth:`to_dict`'s form, checking every entry: anything else
        (a wrong type, a missing field, a string where a list of names belongs) raises
        InvalidParamError naming the entry."""
        if not isinstance(d, Mapping) or d.get("format") != cls.FORMAT:
            raise invalid_param(f"not an npumem graph: expected format {cls.FORMAT!r}")
        shape = (
            "malformed npumem graph: tensors are [name, size, role, alias_of], ops are "
            "[name, inputs, outputs, workspace, duration_us]"
        )
        for key in ("alignment", "tensors", "ops"):
            if key not in d:
                raise invalid_param(f"{shape}; the {key!r} field is missing")
        for key in ("tensors", "ops"):
            if not isinstance(d[key], list):
                raise invalid_param(f"{shape}; {key!r} is {_args.show(d[key])}, not a list")
        with _entry(""):
            g = cls(alignment=d["alignment"])
        tensors = d["tensors"]
        for i, t in enumerate(tensors):
            with _entry(f"tensors[{i}]"):
                if not isinstance(t, list) or len(t) != 4:
                    raise invalid_param(f"{shape}; got {_args.show(t)}")
                name, size, role, alias_of = t
                if role not in ROLES:
                    raise invalid_param(f"tensor {name!r}: unknown role {role!r}; use one of {', '.join(ROLES)}")
                if alias_of is not None and not isinstance(alias_of, str):
                    raise invalid_param(f"tensor {name!r}: alias_of {_args.show(alias_of)} must be a name or null")
                g._add(name, size, role, alias_of)
        for i, (name, _, _, alias_of) in enumerate(tensors):
            if alias_of is not None:
                with _entry(f"tensors[{i}]"):
                    g._get(alias_of, f"alias {name!r}")
        for i, o in enumerate(d["ops"]):
            with _entry(f"ops[{i}]"):
                if not isinstance(o, list) or len(o) != 5:
                    raise invalid_param(f"{shape}; got {_args.show(o)}")
                name, inputs, outputs, workspace, duration_us = o
                if not isinstance(outputs, list) or not all(isinstance(x, str) for x in outputs):
                    raise invalid_param(f"op {name!r}: outputs {_args.show(outputs)} must be a list of tensor names")
                g.op(name, inputs, outputs, workspace=workspace, duration_us=duration_us)
        return g

    def save(self, path: str | os.PathLike[str]) -> None:
        """Writes :meth:`to_dict` as JSON (gzip-compressed when the name ends in ``.gz``)."""
        path = _files.path_arg(path)
        text = json.dumps(self.to_dict(), separators=(",", ":"))
        if path.endswith(".gz"):
            with gzip.open(path, "wt") as f:
                f.write(text)
        else:
            with open(path, "w") as f:
                f.write(text)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Graph:
        """Reads a graph written by :meth:`save`. A file that is not one raises
        InvalidParamError naming it; one that cannot be opened, OSError."""
        d = _files.read_json(path, f"an npumem graph ({cls.FORMAT})")
        try:
            return cls.from_dict(d)
        except InvalidParamError as e:
            raise invalid_param(f"{os.fspath(path)}: {e.message}") from None

    # -- planning -----------------------------------------------------------------------------

    def plan(
        self,
        strategy: str = DEFAULT_STRATEGY,
        *,
        time_limit: float | None = DEFAULT_TIME_LIMIT,
        mem_limit: int | None = None,
        offload_weights: bool = True,
        offload_activations: bool = True,
        recompute: bool = True,
        preset: str = "ascend910b",
        work_limit: int | None = DEFAULT_WORK_LIMIT,
        schedule: bool | str = False,
        schedule_work: int = DEFAULT_SCHEDULE_WORK,
    ) -> GraphPlan:
        """Optionally an op order (``schedule``: True for ``"npumem"``, or one of
        :data:`SCHEDULERS`; its search bounded by ``schedule_work`` transitions), then liveness,
        then (over ``mem_limit``) offload / recompute moves, then offsets for the activation
        arena with ``strategy`` (``time_limit`` and ``work_limit`` bound its exact search as in
        :meth:`npumem.plan.Problem.solve`). With a scheduler that compares orders, each is
        planned and the one that fits with the fewest bytes moved wins, then the lowest total.
        Transfer and recompute times use the ``preset`` cost model of :class:`npumem.Device`."""
        strategy = _args.choice(strategy, "strategy", STRATEGIES)
        time_limit, work_limit = _limits(time_limit, work_limit)
        if schedule is True:
            schedule = "npumem"
        if schedule is not False:
            if not isinstance(schedule, str):
                raise _args.type_error("schedule", schedule, f"a bool or one of {', '.join(SCHEDULERS)}")
            schedule = _args.choice(schedule, "schedule", SCHEDULERS)
        schedule_work = _args.integer(schedule_work, "schedule_work")
        mem_limit = _args.optional_integer(mem_limit, "mem_limit")
        offload_weights = _args.flag(offload_weights, "offload_weights")
        offload_activations = _args.flag(offload_activations, "offload_activations")
        recompute = _args.flag(recompute, "recompute")
        cost = _native.cost_preset(_args.text(preset, "preset"))
        names = list(self._tensors)
        # A copy's fixed latency, in bytes it could have moved meanwhile: tiny moves pay for it.
        per_transfer = int(cost["pcie_latency_ns"] * 1e-9 * cost["pcie_pinned_bandwidth"])
        try:
            r = self._plan_native(
                names,
                strategy,
                time_limit,
                work_limit,
                mem_limit,
                offload_weights,
                offload_activations,
                recompute,
                per_transfer,
                None if schedule is False else schedule,
                schedule_work,
            )
        except AclError as e:
            # Name tensors and ops, not indices.
            ops = self.ops
            msg = re.sub(r"\btensor (\d+)\b", lambda m: f"tensor {names[int(m.group(1))]!r}", e.message)
            msg = re.sub(r"\bop (\d+)\b", lambda m: f"op {ops[int(m.group(1))]!r}", msg)
            if msg == e.message:
                raise
            raise invalid_param(msg) from None
        return GraphPlan._build(self, names, r, mem_limit, cost)

    def _plan_native(
        self,
        names: list[str],
        strategy: str,
        time_limit: float,
        work_limit: int | None,
        mem_limit: int | None,
        offload_weights: bool,
        offload_activations: bool,
        recompute: bool,
        per_transfer: int,
        scheduler: str | None,
        schedule_work: int,
    ) -> dict[str, Any]:
        index = {n: i for i, n in enumerate(names)}
        tensors = list(self._tensors.values())

        def csr(lists: Sequence[Sequence[str]]) -> tuple[np.ndarray, np.ndarray]:
            ptr = np.zeros(len(lists) + 1, dtype=np.uint64)
            ptr[1:] = np.cumsum([len(x) for x in lists]) if lists else []
            idx = np.array([index[t] for x in lists for t in x], dtype=np.uint64)
            return ptr, idx

        in_ptr, in_idx = csr([o.inputs for o in self._ops])
        out_ptr, out_idx = csr([o.outputs for o in self._ops])
        return _native.plan_graph(
            np.array([t.size for t in tensors], dtype=np.uint64),
            [t.role for t in tensors],
            [index[t.alias_of] if t.alias_of is not None else -1 for t in tensors],
            in_ptr,
            in_idx,
            out_ptr,
            out_idx,
            np.array([o.workspace for o in self._ops], dtype=np.uint64),
            self.alignment,
            strategy,
            float(time_limit),
            mem_limit,
            bool(offload_weights),
            bool(offload_activations),
            bool(recompute),
            per_transfer,
            work_limit,
            scheduler,
            schedule_work,
        )


@dataclass(frozen=True)
class Candidate:
    """One scheduler's order: its max-live bound and the arena planned for it."""

    scheduler: str  # "given", "xla", "inductor" or "npumem" (its search)
    detail: str  # the portfolio member that won ("list", "dfs", "lpmf", "baseline", "search", ...)
    order: tuple[str, ...]  # op names in execution order
    bound: int  # the order's max-live bound (aligned bytes)
    arena: int  # the arena planned for it


@dataclass(frozen=True)
class Schedule:
    """The order a plan runs its ops in and what is proven about it."""

    scheduler: str  # the chosen candidate's
    order: tuple[str, ...]
    given_bound: int  # the given order's max-live bound
    bound: int  # no valid order's arena is below this (proven)
    exact: bool  # the search finished: no order has a lower max-live bound than the best found
    work: int  # transitions the search evaluated
    candidates: tuple[Candidate, ...]
    optimal: bool  # the planned arena equals ``bound``: no order and no placement does better

    @classmethod
    def _build(cls, graph: Graph, s: dict[str, Any], arena: int) -> Schedule:
        names = [o.name for o in graph._ops]
        cands = tuple(
            Candidate(c["scheduler"], c["detail"], tuple(names[k] for k in c["order"].tolist()), c["bound"], c["arena"])
            for c in s["candidates"]
        )
        chosen = cands[s["chosen"]]
        return cls(
            scheduler=chosen.scheduler,
            order=chosen.order,
            given_bound=s["given_bound"],
            bound=s["bound"],
            exact=s["exact"],
            work=s["work"],
            candidates=cands,
            optimal=arena == s["bound"],
        )


@dataclass(frozen=True)
class Move:
    """One thing moved out of device memory to meet ``mem_limit``."""

    kind: str  # "offload_weight", "offload_activation" or "recompute"
    tensor: str  # the buffer's representative tensor
    bytes: int  # copied (both directions) or recomputed
    transfers: int  # copies, or op re-runs
    gap: tuple[int, int] | None  # activations: last use before the gap, first use after it
    op: str | None  # the producer a recompute re-runs
    seconds: float  # on the cost model


@dataclass(frozen=True)
class GraphPlan:
    """A planned graph: where every planned tensor lives in the arena, what was moved, and a
    CANN-style profile (:meth:`report`)."""

    graph: Graph
    arena: Plan  # offsets of the arena's buffers (pieces of moved buffers, weight prefetches)
    moves: tuple[Move, ...]
    weight_memory: int
    input_memory: int
    output_memory: int
    workspace_memory: int  # the largest single workspace (it lives in the arena)
    naive_activation_memory: int  # activations + workspaces with no reuse
    mem_limit: int | None
    fits: bool
    steps: int
    _buffer_of: dict[str, int]
    _pieces: dict[int, list[tuple[int, int, int]]]  # graph buffer -> (lower, upper, offset)
    _resident: frozenset[int]  # graph buffers that stay in device memory outside the arena
    _workspaces: dict[str, int]  # op name -> its workspace's graph buffer
    schedule: Schedule | None = None  # with plan(schedule=...): the order and its bounds

    @classmethod
    def _build(cls, graph: Graph, names: list[str], r: dict[str, Any], mem_limit: int | None, cost: dict) -> GraphPlan:
        owner = r["arena_owner"].tolist()
        rep = r["buffer_owner"].tolist()
        roles = r["buffer_role"]
        count = Counter(owner)
        ids = []
        for k, b in enumerate(owner):
            label = f"workspace:{graph._ops[rep[b]].name}" if roles[b] == "workspace" else names[rep[b]]
            ids.append(label if count[b] == 1 else f"{label}#{k}")
        problem = Problem.of(ids, r["arena_lower"], r["arena_upper"], r["arena_size"], alignment=graph.alignment)
        capacity = None if mem_limit is None else max(mem_limit - r["weights"] - r["inputs"] - r["outputs"], 0)
        arena = Plan._from_native(problem, r, capacity)
        pieces: dict[int, list[tuple[int, int, int]]] = {}
        for b, lo, hi, off in zip(
            owner, r["arena_lower"].tolist(), r["arena_upper"].tolist(), r["offsets"].tolist(), strict=True
        ):
            pieces.setdefault(b, []).append((lo, hi, off))
        moves = []
        for m in r["moves"]:
            size = r["buffer_size"][m["buffer"]].item()
            op = None if m["op"] is None else graph._ops[m["op"]]
            if m["kind"] == "recompute":
                assert op is not None
                seconds = _op_seconds(graph, op, cost) * m["transfers"]
            else:
                seconds = m["transfers"] * (size / cost["pcie_pinned_bandwidth"] + cost["pcie_latency_ns"] * 1e-9)
            moves.append(
                Move(
                    kind=m["kind"],
                    tensor=names[rep[m["buffer"]]],
                    bytes=m["bytes"],
                    transfers=m["transfers"],
                    gap=None if m["gap"] is None else tuple(m["gap"]),
                    op=None if op is None else op.name,
                    seconds=seconds,
                )
            )
        align = graph.alignment
        planned = [i for i, role in enumerate(roles) if role in ("activation", "workspace")]
        naive = sum(-(-int(r["buffer_size"][i]) // align) * align for i in planned)
        ws = max((-(-o.workspace // align) * align for o in graph._ops), default=0)
        return cls(
            graph=graph,
            arena=arena,
            moves=tuple(moves),
            weight_memory=r["weights"],
            input_memory=r["inputs"],
            output_memory=r["outputs"],
            workspace_memory=ws,
            naive_activation_memory=naive,
            mem_limit=mem_limit,
            fits=r["fits"],
            steps=r["steps"],
            _buffer_of=dict(zip(names, r["buffer_of"].tolist(), strict=True)),
            _pieces=pieces,
            _workspaces={graph._ops[rep[b]].name: b for b, role in enumerate(roles) if role == "workspace"},
            _resident=frozenset(
                b
                for b, role in enumerate(roles)
                if role in ("weight", "input", "output") and b not in {m["buffer"] for m in r["moves"]}
            ),
            schedule=None if "schedule" not in r else Schedule._build(graph, r["schedule"], r["peak"]),
        )

    @property
    def peak_memory(self) -> int:
        """Device bytes at the peak: resident weights and I/O plus the arena."""
        return self.weight_memory + self.input_memory + self.output_memory + self.arena.peak

    def offset(self, tensor: str) -> int | None:
        """The tensor's arena offset, or None when it is resident (a weight, a graph input or
        output). A moved buffer has several pieces (see :meth:`placements`): this is the first."""
        pieces = self.placements(tensor)
        return None if self.resident(tensor) or not pieces else pieces[0][2]

    def resident(self, tensor: str) -> bool:
        """Whether the tensor's memory stays on the device outside the arena (a weight that was
        not offloaded, a graph input or output, or a view of one)."""
        if tensor not in self._buffer_of:
            raise invalid_param(f"unknown tensor {tensor!r}")
        return self._buffer_of[tensor] in self._resident

    def placements(self, tensor: str) -> list[tuple[int, int, int]]:
        """``(lower, upper, offset)`` of every arena piece holding the tensor's buffer (a
        prefetched weight has one per group of uses)."""
        if tensor not in self._buffer_of:
            raise invalid_param(f"unknown tensor {tensor!r}")
        return sorted(self._pieces.get(self._buffer_of[tensor], []))

    def report(self) -> dict[str, Any]:
        """CANN-style profile. ``activation_memory`` is the planned arena (activations and
        workspaces), ``io_memory`` graph inputs and outputs, ``lower_bound`` the arena's max-live
        bound, ``reuse_ratio`` the share of the naive activation total saved by sharing,
        ``reach_theory_rate`` lower_bound / arena."""
        a = self.arena
        by_kind = {
            k: [m for m in self.moves if m.kind == k] for k in ("offload_weight", "offload_activation", "recompute")
        }
        return {
            "peak_memory": self.peak_memory,
            "weight_memory": self.weight_memory,
            "activation_memory": a.peak,
            "workspace_memory": self.workspace_memory,
            "io_memory": self.input_memory + self.output_memory,
            "naive_activation_memory": self.naive_activation_memory,
            "lower_bound": a.lower_bound,
            "reuse_ratio": 1 - a.peak / self.naive_activation_memory if self.naive_activation_memory else 0.0,
            "reach_theory_rate": a.lower_bound / a.peak if a.peak else 1.0,
            "strategy": a.strategy,
            "exact": a.exact,
            "optimal": a.optimal,
            "solve_seconds": a.solve_seconds,
            "tensors": len(self.graph),
            "ops": len(self.graph.ops),
            "buffers": len(a.problem),
            "mem_limit": self.mem_limit,
            "fits": self.fits,
            "moves": len(self.moves),
            "offloaded_weight_bytes": sum(m.bytes for m in by_kind["offload_weight"]),
            "offloaded_activation_bytes": sum(m.bytes for m in by_kind["offload_activation"]),
            "recomputed_bytes": sum(m.bytes for m in by_kind["recompute"]),
            "transfer_seconds": sum((m.seconds for m in self.moves if m.kind != "recompute"), 0.0),
            "recompute_seconds": sum((m.seconds for m in by_kind["recompute"]), 0.0),
            **self._schedule_report(),
        }

    def _schedule_report(self) -> dict[str, Any]:
        s = self.schedule
        if s is None:
            return {}
        out: dict[str, Any] = {"scheduler": s.scheduler, "given_order_bound": s.given_bound}
        for c in s.candidates:
            out[f"{c.scheduler}_order_arena"] = c.arena
        out.update(any_order_bound=s.bound, schedule_optimal=s.optimal, schedule_work=s.work)
        return out

    def to_json(self) -> dict[str, Any]:
        """The plan in a form anyone can check without npumem: the report, the op order (op
        names), and for every tensor its size, role and arena placements ``[lower, upper,
        offset]`` in steps of that order (none when resident), and every workspace's
        placements by op name."""
        steps = list(self.schedule.order) if self.schedule else self.graph.ops
        tensors = {}
        for name, t in self.graph._tensors.items():
            placed = [] if self.resident(name) else [list(p) for p in self.placements(name)]
            tensors[name] = {"size": t.size, "role": t.role, "alias_of": t.alias_of, "placements": placed}
        workspaces = {op: [list(p) for p in sorted(self._pieces.get(b, []))] for op, b in self._workspaces.items()}
        out: dict[str, Any] = {"report": self.report(), "alignment": self.graph.alignment, "order": steps}
        if self.schedule:
            out["candidates"] = [
                {"scheduler": c.scheduler, "detail": c.detail, "bound": c.bound, "arena": c.arena}
                for c in self.schedule.candidates
            ]
        out.update(tensors=tensors, workspaces=workspaces)
        return out

    def table(self) -> str:
        """The report as aligned ``name  value`` lines."""
        from .units import fmt

        lines = []
        for k, v in self.report().items():
            if isinstance(v, bool) or v is None or isinstance(v, str):
                text = str(v)
            elif isinstance(v, float):
                text = f"{v:.4f}"
            elif k.endswith(("memory", "bound", "bytes", "limit")):
                text = f"{fmt(v)} ({v:,} B)"
            else:
                text = f"{v:,}"
            lines.append(f"{k:<28} {text}")
        return "\n".join(lines)


def _listed(values: Any, name: str, expected: str) -> list[Any]:
    """An iterable argument as a list; a bare string is refused (it would be read as its
    characters)."""
    if isinstance(values, (str, bytes, Mapping)) or not isinstance(values, Iterable):
        raise _args.type_error(name, values, expected)
    return list(values)


class _entry:
    """Context manager that prefixes an error raised while reading one entry of a graph file
    with the entry's place (``ops[3]: ...``) and makes a wrong type an InvalidParamError: in a
    file it is a malformed value, not a programming error."""

    def __init__(self, where: str) -> None:
        self.where = where

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None, tb: Any) -> None:
        prefix = f"{self.where}: " if self.where else ""
        if isinstance(err, AclError):
            raise invalid_param(f"{prefix}{err.message}") from None
        if isinstance(err, (TypeError, ValueError)):
            raise invalid_param(f"{prefix}{err}") from None


def _op_seconds(graph: Graph, op: _Op, cost: dict) -> float:
    if op.duration_us is not None:
        return op.duration_us * 1e-6
    touched = sum(graph._tensors[t].size for t in [*op.inputs, *op.outputs])
    return touched / cost["hbm_bandwidth"] + cost["launch_ns"] * 1e-9


__all__ = ["DEFAULT_SCHEDULE_WORK", "ROLES", "SCHEDULERS", "Candidate", "Graph", "GraphPlan", "Move", "Schedule"]
