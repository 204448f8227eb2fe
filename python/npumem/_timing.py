"""Best-of timing for the demo and the benchmark scripts (one helper, so all time alike)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping


def best_of(cases: Mapping[str, Callable[[], object]], n: int, rounds: int = 5) -> dict[str, float]:
    """Seconds per call of each case: the best of ``rounds`` rounds, each timing ``n`` calls of
    every case in turn, so that a slow spell of a shared machine hits all cases alike and the
    ratios between them stay fair."""
    best = dict.fromkeys(cases, float("inf"))
    for _ in range(rounds):
        for name, fn in cases.items():
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            best[name] = min(best[name], time.perf_counter() - t0)
    return {name: t / n for name, t in best.items()}


def per_call(fn: Callable[[], object], n: int, rounds: int = 5) -> float:
    """Seconds per call of ``fn``: the best of ``rounds`` runs of ``n`` calls."""
    return best_of({"": fn}, n, rounds)[""]
