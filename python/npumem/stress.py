"""Adversarial fragmentation search: short workloads that make an allocator family waste the most.

:func:`search` runs a seeded hill climb over workloads of at most ``max_allocs`` allocations:
start from a random workload, mutate it (resize a block, move a free earlier or later, add or
drop a block, swap neighbouring events) and keep the mutant when its objective is at least the
best so far (ties let the search drift across plateaus); every ``restart`` evaluations without
progress it starts again from a fresh random workload. When the budget is spent the best
workload is shrunk — blocks removed one by one and sizes rounded while the objective does not
drop — to a minimal reproducer.

Objectives (higher is worse for the allocator), against the *bound*: the peak live bytes
rounded up to 2 MiB (the smallest device :func:`npumem.replay.min_capacity` can answer, so a
workload of a few tiny blocks does not score thousands):

- ``capacity``: :func:`npumem.replay.min_capacity` (granularity 2 MiB) / bound — how much more
  device than the live data the family needs;
- ``reserved``: peak reserved bytes on a roomy device / bound;
- ``oom``: at a device of ``capacity`` bytes, ``capacity / bound`` when the workload runs out of
  memory (OOM with the least live data scores highest), ``bound / capacity`` (at most 1) when
  it completes; workloads whose live data alone exceeds ``capacity`` score 0.

Workloads whose peak live bytes are below ``min_live`` (64 MiB by default) score 0: the search
is after fragmentation, not after the rounding of a few tiny blocks to a page or a segment.

Workloads are event lists :func:`npumem.replay.replay` takes, with ints for ids; every block is
freed. Invariants: the same arguments and seed (and ``evaluations`` rather than ``budget``)
give the same result; every evaluated workload is well formed.
"""

from __future__ import annotations

import json
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from . import _args, _files
from .errors import invalid_param
from .formats import as_trace
from .replay import _replay, min_capacity, peak_live_bytes
from .workloads import churn

FAMILIES = ("npumem", "pytorch", "torch_npu", "direct")
OBJECTIVES = ("capacity", "reserved", "oom")
#: Sizes the search draws (64 KiB to 256 MiB, log-uniform), in 512 B units.
SIZE_RANGE = (64 << 10, 256 << 20)
#: The roomy device of the ``reserved`` objective and of comparisons (the simulator's largest).
ROOMY = 1 << 40

Workload = list[tuple[str, int, int]]


@dataclass
class StressResult:
    """The worst workload found for ``allocator`` and its figures."""

    allocator: str
    objective: str
    score: float
    events: Workload
    peak_live: int
    evaluations: int
    seconds: float
    seed: int
    #: Per family: min_capacity, peak_reserved (roomy device), and each over the bound.
    families: dict[str, dict[str, float]] = field(default_factory=dict)

    def report(self) -> dict[str, Any]:
        return {
            "allocator": self.allocator,
            "objective": self.objective,
            "score": self.score,
            "peak_live": self.peak_live,
            "bound": bound(self.events),
            "allocs": sum(1 for e in self.events if e[0] == "alloc"),
            "evaluations": self.evaluations,
            "seconds": self.seconds,
            "seed": self.seed,
            "families": self.families,
        }

    def save(self, path: str) -> None:
        """Writes the workload as a compact trace (``{"events": [...]}``, which
        :func:`npumem.formats.load` reads) with this report beside the events."""
        data = {"events": [list(e) for e in self.events], "npumem_stress": self.report()}
        with open(_files.path_arg(path), "w", encoding="utf-8") as f:
            json.dump(data, f)


#: What the bound rounds the peak live bytes up to (min_capacity's granularity).
GRANULE = 2 << 20


def bound(events: Workload) -> int:
    """The peak live bytes of ``events`` rounded up to :data:`GRANULE`."""
    return max(1, -(-peak_live_bytes(events) // GRANULE)) * GRANULE


def _granule(size: int) -> int:
    return max(512, -(-size // 512) * 512)


def _random_size(rng: random.Random) -> int:
    lo, hi = SIZE_RANGE
    return _granule(round(math.exp(rng.uniform(math.log(lo), math.log(hi)))))


def random_workload(rng: random.Random, max_allocs: int) -> Workload:
    """A random workload of 2 to ``max_allocs`` blocks with random lifetimes (a
    :func:`npumem.workloads.churn`), sizes drawn after the order."""
    order = churn(rng, allocs=rng.randint(2, max_allocs))
    sizes = {k: _random_size(rng) for action, k in order if action == "alloc"}
    return _events(order, sizes)


def _events(order: Sequence[tuple[str, int]], sizes: dict[int, int]) -> Workload:
    """Events with ids renumbered in allocation order."""
    ids: dict[int, int] = {}
    out: Workload = []
    for action, k in order:
        if action == "alloc":
            ids[k] = len(ids)
        out.append((action, ids[k], sizes[k]))
    return out


def _split(w: Workload) -> tuple[list[tuple[str, int]], dict[int, int]]:
    return [(a, i) for a, i, _ in w], {i: s for a, i, s in w if a == "alloc"}


def mutate(w: Workload, rng: random.Random, max_allocs: int) -> Workload:
    """One random edit of ``w`` (the result is well formed: each free after its alloc)."""
    order, sizes = _split(w)
    kind = rng.randrange(6)
    if kind == 0:  # resize a block
        k = rng.choice(list(sizes))
        sizes[k] = _random_size(rng) if rng.random() < 0.3 else _granule(int(sizes[k] * rng.uniform(0.5, 2.0)))
        sizes[k] = min(sizes[k], SIZE_RANGE[1] * 2)
    elif kind == 1:  # nudge a size by a quantum (boundary effects)
        k = rng.choice(list(sizes))
        sizes[k] = max(512, sizes[k] + rng.choice((-1, 1)) * rng.choice((512, 1 << 20, 2 << 20)))
    elif kind == 2 and len(sizes) < max_allocs:  # add a block
        k = max(sizes) + 1
        a = rng.randrange(len(order) + 1)
        order.insert(a, ("alloc", k))
        order.insert(rng.randrange(a + 1, len(order) + 1), ("free", k))
        sizes[k] = _random_size(rng)
    elif kind == 3 and len(sizes) > 2:  # drop a block
        k = rng.choice(list(sizes))
        order = [e for e in order if e[1] != k]
        del sizes[k]
    else:  # move a free (kind 4) or swap two neighbours (kind 5), keeping frees after allocs
        pos = rng.randrange(len(order))
        action, k = order[pos]
        if kind == 4 and action == "free":
            del order[pos]
            start = next(j for j, e in enumerate(order) if e == ("alloc", k)) + 1
            order.insert(rng.randrange(start, len(order) + 1), ("free", k))
        elif pos + 1 < len(order) and not (action == "alloc" and order[pos + 1] == ("free", k)):
            order[pos], order[pos + 1] = order[pos + 1], order[pos]
    return _events(order, sizes)


def _objective(
    allocator: str, objective: str, capacity: int | None, alloc_conf: str | None, min_live: int
) -> Callable[[Workload], float]:
    from .device import Device

    cfg: dict[str, Any] = {"allocator": allocator}
    if alloc_conf is not None:
        cfg["alloc_conf"] = alloc_conf

    def score(w: Workload) -> float:
        evs = as_trace(w)
        if peak_live_bytes(w) < min_live:
            return 0.0
        peak = bound(w)
        if objective == "capacity":
            return min_capacity(w, cfg) / peak
        if objective == "reserved":
            return _replay(evs, Device(ROOMY, **cfg), 0, False).peak_reserved / peak
        assert capacity is not None
        if peak > capacity:
            return 0.0
        done = _replay(evs, Device(capacity, **cfg), 0, True).completed
        return peak / capacity if done else capacity / peak

    return score


def figures(events: Workload, allocator: str, alloc_conf: str | None = None) -> dict[str, float]:
    """min_capacity and peak_reserved (roomy device) of ``events`` on ``allocator``."""
    from .device import Device

    cfg: dict[str, Any] = {"allocator": allocator}
    if alloc_conf is not None and allocator != "direct":
        cfg["alloc_conf"] = alloc_conf
    evs = as_trace(events)
    return {
        "min_capacity": min_capacity(events, cfg),
        "peak_reserved": _replay(evs, Device(ROOMY, **cfg), 0, False).peak_reserved,
    }


def search(
    allocator: str = "npumem",
    *,
    budget: float = 10.0,
    evaluations: int | None = None,
    seed: int = 0,
    max_allocs: int = 16,
    objective: str = "capacity",
    capacity: int | str | None = None,
    alloc_conf: str | None = None,
    min_live: int | str = 64 << 20,
    restart: int = 300,
    compare: Sequence[str] = FAMILIES,
    progress: Callable[[int, float], None] | None = None,
) -> StressResult:
    """Searches for ``budget`` seconds (or exactly ``evaluations`` evaluations, which makes the
    result independent of the machine's speed) for the workload maximising ``objective`` on
    ``allocator`` among those holding at least ``min_live`` bytes live at their peak (at most
    256 MiB); shrinks it; measures it on every family of ``compare``. ``progress(n, best)``
    is called after each improvement."""
    allocator = _args.choice(allocator, "allocator", FAMILIES)
    budget = _args.real(budget, "budget", 0.0, 7 * 86400.0, unit=" seconds")
    evaluations = _args.optional_integer(evaluations, "evaluations", 1, 1 << 32)
    seed = _args.integer(seed, "seed", -(2**63), 2**64 - 1)
    max_allocs = _args.integer(max_allocs, "max_allocs", 2, 1024)
    objective = _args.choice(objective, "objective", OBJECTIVES)
    restart = _args.integer(restart, "restart", 1, 1 << 32)
    min_live = _args.size(min_live, "min_live", 0, SIZE_RANGE[1])
    compare = _args.choices(list(compare), "compare", FAMILIES)
    cap: int | None = None
    if objective == "oom":
        if capacity is None:
            raise invalid_param("objective 'oom' needs a capacity (the device size to run out of)")
        cap = _args.size(capacity, "capacity", 2 << 20, 1 << 40)
    elif capacity is not None:
        raise invalid_param(f"capacity applies to objective 'oom', not {objective!r}")
    if alloc_conf is not None:
        alloc_conf = _args.text(alloc_conf, "alloc_conf")
        from .device import Device

        Device(2 << 20, allocator=allocator, alloc_conf=alloc_conf)  # checks the grammar first
    score_of = _objective(allocator, objective, cap, alloc_conf, min_live)
    rng = random.Random(seed)
    t0 = time.perf_counter()
    n = 0

    def more() -> bool:
        return n < evaluations if evaluations is not None else (n == 0 or time.perf_counter() - t0 < budget)

    best = current = random_workload(rng, max_allocs)
    best_score = current_score = score_of(current)
    n, stale = 1, 0
    while more():
        if stale >= restart:
            current = random_workload(rng, max_allocs)
            current_score = score_of(current)
            stale = 0
        else:
            cand = mutate(current, rng, max_allocs)
            s = score_of(cand)
            if s >= current_score:
                stale = 0 if s > current_score else stale + 1
                current, current_score = cand, s
            else:
                stale += 1
        n += 1
        if current_score > best_score:
            best, best_score = current, current_score
            if progress is not None:
                progress(n, best_score)
    best, best_score = shrink(best, best_score, score_of)
    limit = bound(best)
    result = StressResult(
        allocator=allocator,
        objective=objective,
        score=best_score,
        events=best,
        peak_live=peak_live_bytes(best),
        evaluations=n,
        seconds=time.perf_counter() - t0,
        seed=seed,
    )
    for fam in dict.fromkeys([allocator, *compare]):
        figs = figures(best, fam, alloc_conf if fam == allocator else None)
        figs["capacity_ratio"] = figs["min_capacity"] / limit
        figs["reserved_ratio"] = figs["peak_reserved"] / limit
        result.families[fam] = figs
    return result


def shrink(w: Workload, score: float, score_of: Callable[[Workload], float]) -> tuple[Workload, float]:
    """Removes blocks, then rounds sizes (to 2 MiB, 1 MiB, 64 KiB), while the score does not drop."""
    changed = True
    while changed:
        changed = False
        order, sizes = _split(w)
        for k in sorted(sizes, reverse=True):
            if len(sizes) <= 2:
                break
            cand_sizes = {i: s for i, s in sizes.items() if i != k}
            cand = _events([e for e in order if e[1] != k], cand_sizes)
            s = score_of(cand)
            if s >= score:
                w, score, changed = cand, s, True
                break
    for unit in (2 << 20, 1 << 20, 64 << 10):
        order, sizes = _split(w)
        for k in sorted(sizes):
            rounded = max(unit, round(sizes[k] / unit) * unit)
            if rounded == sizes[k]:
                continue
            cand = _events(order, {**sizes, k: rounded})
            s = score_of(cand)
            if s >= score:
                w, score = cand, s
                sizes[k] = rounded
    return w, score
