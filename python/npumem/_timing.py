"""Best-of timing for the demo and the benchmark scripts (one helper, so all time alike)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping


def best_of(cases: Mapping[str, Callable[[], object]], n: int | Mapping[str, int], rounds: int = 5) -> dict[str, float]:
    """Seconds per call of each case: the best of ``rounds`` rounds, each timing ``n`` calls of
    every case in turn (``n`` may give each case its own count, so that cases thousands of times
    apart each run for a similar time), so that a slow spell of a shared machine hits all cases
    alike and the ratios between them stay fair."""
    calls = n if isinstance(n, Mapping) else dict.fromkeys(cases, n)
    best = dict.fromkeys(cases, float("inf"))
    for _ in range(rounds):
        for name, fn in cases.items():
            t0 = time.perf_counter()
            for _ in range(calls[name]):
                fn()
            best[name] = min(best[name], time.perf_counter() - t0)
    return {name: t / calls[name] for name, t in best.items()}


def calls_for(fn: Callable[[], object], seconds: float, most: int = 100_000) -> int:
    """How many calls of ``fn`` take about ``seconds`` (from the quicker of two timed calls after
    a first, warming one; at least 1, at most ``most``)."""
    fn()
    once = float("inf")
    for _ in range(2):
        t0 = time.perf_counter()
        fn()
        once = min(once, time.perf_counter() - t0)
    return max(1, min(most, int(seconds / max(once, 1e-9))))


def per_call(fn: Callable[[], object], n: int, rounds: int = 5) -> float:
    """Seconds per call of ``fn``: the best of ``rounds`` runs of ``n`` calls."""
    return best_of({"": fn}, n, rounds)[""]
