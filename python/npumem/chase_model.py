"""The pointer-chase cost model: nanoseconds per access of a chase touching one 64-byte line in
each 4 KiB page of a footprint, the pages in one random cycle, predicted from the TLB model's
counters (:func:`npumem.tlb.predict_chase`, which runs the model) with cost constants fitted to
measured points (:func:`npumem.tlb.fit_chase`). This module holds the arithmetic; it uses no TLB.

Rules:

- The counters come from the TLB model (a preset, or ``"cpuid"``: this machine's geometry) on the
  same chase over a simulated device mapped with ``page_size`` pages (one lap warms, two count);
  ``host_page_size`` makes it a guest over host pages of that size (two-dimensional walks, an
  entry maps the smaller page).
- An access costs its data load, ``l2_tlb_ns`` for each L1 TLB miss (the L2 lookup), and each walk
  read by its tier: L1-resident (``base_ns``), near (L2-resident, ``near_ns``) or beyond
  (``far_ns``). Reads the walk caches skip cost nothing.
- Residency: upper-level walk reads and the host walks of guest table pages touch a handful of
  lines and are near. The data line and the leaf reads (a guest PTE each walk, a host PTE of the
  data each walk) share the data caches, set-associative with lines in random sets; the chase
  repeats one order, so a set holding more lines than ways misses on every one of them (LRU on a
  cyclic order; :func:`chase_weights`).
- Three cost constants are fitted (``l2_tlb_ns``, ``near_ns``, ``far_ns``, non-negative least
  squares); ``base_ns`` is the chase's floor: the mean of the measured points the model gives no
  L1 TLB miss and L1-resident data.
- What it does not represent: prefetchers, replacement other than LRU and index hashing in the
  data caches (the residency above is random placement), memory-level parallelism (a chase has
  none), and DRAM pages. Data-cache effects take over where the lap's lines leave L1 (32 KiB: 512
  lines, from a 1.4 MiB footprint on Zen 4) and L2 (1 MiB: 16,384 lines, a 64 MiB footprint):
  there the load, not the translation, sets the step.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from . import _args
from .enums import Policy
from .errors import invalid_param

LINE = 64
PAGE = 4096
#: The cost constants a prediction needs (ns); the last three are fitted.
COST_KEYS = ("base_ns", "l2_tlb_ns", "near_ns", "far_ns")
#: Guest page size -> the malloc policy mapping a footprint with it.
PAGE_POLICIES = {4096: Policy.NORMAL_ONLY, 2 << 20: Policy.HUGE_ONLY, 1 << 30: Policy.HUGE1G_ONLY}
#: The largest footprint a prediction models.
MAX_FOOTPRINT = 4 << 30
#: Laps of the chase the model counts (after one warming lap).
LAPS = 2


#: A data cache: (bytes, ways).
Cache = tuple[int, int]


def data_caches() -> tuple[Cache, Cache]:
    """The (bytes, ways) of this machine's L1 data and L2 caches (CPU 0, from sysfs); Zen 4's
    (32 KiB 8-way, 1 MiB 8-way) where sysfs does not say."""
    found: dict[int, Cache] = {}
    for i in range(8):
        base = f"/sys/devices/system/cpu/cpu0/cache/index{i}/"
        try:
            with open(base + "level") as f:
                level = int(f.read())
            with open(base + "type") as f:
                kind = f.read().strip()
            with open(base + "size") as f:
                text = f.read().strip()
            with open(base + "ways_of_associativity") as f:
                ways = int(f.read())
        except (OSError, ValueError):
            continue
        if kind in ("Data", "Unified") and text.endswith("K") and level not in found and ways > 0:
            found[level] = (int(text[:-1]) * 1024, ways)
    return found.get(1, (32 << 10, 8)), found.get(2, (1 << 20, 8))


def _caches(caches: Any) -> tuple[Cache, Cache]:
    """``caches``: None (this machine's), or (L1, L2), each bytes (8-way) or (bytes, ways)."""
    if caches is None:
        return data_caches()
    if isinstance(caches, (str, bytes)) or not isinstance(caches, Sequence) or len(caches) != 2:
        raise _args.type_error("caches", caches, "(L1 data, L2): each bytes or (bytes, ways)")
    out = []
    for name, c in zip(("caches[0]", "caches[1]"), caches, strict=True):
        if _args.is_int(c) or isinstance(c, str):
            size, ways = c, 8
        elif isinstance(c, Sequence) and len(c) == 2:
            size, ways = c
        else:
            raise _args.type_error(name, c, "bytes or (bytes, ways)")
        size = _args.size(size, name, LINE, 1 << 40)
        ways = _args.integer(ways, f"{name} ways", 1, size // LINE)
        out.append((size, ways))
    return out[0], out[1]


def _footprints(footprints: Any) -> list[int]:
    if isinstance(footprints, (str, bytes)) or not isinstance(footprints, Iterable):
        raise _args.type_error("footprints", footprints, "a list of sizes")
    out = [_args.size(f, f"footprints[{i}]", PAGE, MAX_FOOTPRINT) for i, f in enumerate(footprints)]
    if not out:
        raise invalid_param("footprints is empty; give at least one size")
    return out


def _guest_page(page_size: Any) -> int:
    size = _args.size(page_size, "page_size")
    if size not in PAGE_POLICIES:
        raise invalid_param(f"page_size {_args.show(page_size)} is not a guest page: use 4096, 2MiB or 1GiB")
    return size


def _costs(costs: Any) -> dict[str, float]:
    c = _args.mapping(costs, "costs")
    missing = [k for k in COST_KEYS if k not in c]
    unknown = [k for k in c if k not in COST_KEYS]
    if missing or unknown:
        raise invalid_param(
            f"costs must hold exactly {', '.join(COST_KEYS)} (ns); "
            f"missing {missing or 'none'}, unknown {unknown or 'none'}"
        )
    return {k: _args.real(c[k], f"costs[{k!r}]", 0.0, 1e6, unit="ns") for k in COST_KEYS}


def chase_weights(
    fp: int,
    page_size: int,
    host: int | None,
    l1_miss: float,
    walks: float,
    host_data: float,
    hot_reads: float,
    c1: Cache,
    c2: Cache,
) -> dict[str, float]:
    """The weight of each cost constant in one access of a chase of ``fp`` bytes.

    Lines a lap touches: the data's (one a page), the guest's leaf entries (eight a line) and
    the host's leaf entries of the data: eight a line under a 2 MiB or 1 GiB guest page (its
    frames are contiguous), one a line under 4 KiB guest pages (a guest's 4 KiB frames lie
    scattered). Lines land in random sets: a cache of S sets of A ways holding W/k lines (a line
    touched k times a lap counts 1/k) keeps P(L < A) of them, L ~ Poisson(λ = W/(k·S)) the other
    lines of a line's set: under LRU a set over its ways misses on every line of a cyclic order.
    The load and the leaf reads cost
    ``base_ns`` when L1-resident, ``near_ns`` when L2-resident, ``far_ns`` beyond; the other walk
    reads (upper levels, host walks of guest table pages) ``near_ns``."""
    pages = fp / PAGE
    guest_lines = max(1.0, fp / page_size / 8)
    host_lines = 0.0 if not host else pages if page_size == PAGE else max(1.0, fp / host / 8)
    touches = walks * pages
    lines = pages + min(guest_lines, touches) + (min(host_lines, touches) if host else 0.0)

    def tiers(k: float) -> np.ndarray:
        """(L1, L2, beyond) shares of a line touched ``k`` times a lap."""
        h2 = _resident(lines / k, c2)
        h1 = min(_resident(lines / k, c1), h2)
        return np.array([h1, h2 - h1, 1 - h2])

    w = tiers(1) + np.array([0.0, hot_reads, 0.0])
    if walks:
        w += walks * tiers(touches / guest_lines)
    if host_data:
        w += host_data * tiers(touches / host_lines)
    return {
        "footprint": fp,
        "l1_miss": l1_miss,
        "walks": walks,
        "reads": hot_reads + walks + host_data,
        "lines": lines,
        "w_base": float(w[0]),
        "w_l2_tlb": l1_miss,
        "w_near": float(w[1]),
        "w_far": float(w[2]),
    }


def _resident(lines: float, cache: Cache) -> float:
    """The share of ``lines`` lines, placed in random sets and touched in one repeating order,
    that ``cache`` keeps: a line hits when its set holds at most ``ways`` of them (fewer than
    ``ways`` others, Poisson with mean ``lines / sets``); a set holding more misses on every
    line, as least-recently-used replacement does on a cyclic order."""
    size, ways = cache
    lam = lines / (size / LINE / ways)
    p, kept = math.exp(-lam), 0.0
    for load in range(ways):
        kept += p
        p *= lam / (load + 1)
    return min(1.0, kept)


def predict_ns(rows: list[dict[str, float]], c: Mapping[str, float]) -> list[float]:
    return [
        r["w_base"] * c["base_ns"]
        + r["w_l2_tlb"] * c["l2_tlb_ns"]
        + r["w_near"] * c["near_ns"]
        + r["w_far"] * c["far_ns"]
        for r in rows
    ]


def nonnegative_fit(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares ``y ~ x @ c`` with every coefficient >= 0 (the best fit over the subsets of
    columns whose coefficients come out non-negative)."""
    best, best_err = np.zeros(x.shape[1]), float(np.sum(y**2))
    for mask in range(1, 1 << x.shape[1]):
        cols = [i for i in range(x.shape[1]) if mask >> i & 1]
        c, *_ = np.linalg.lstsq(x[:, cols], y, rcond=None)
        if (c >= 0).all():
            err = float(np.sum((x[:, cols] @ c - y) ** 2))
            if err < best_err:
                best, best_err = np.zeros(x.shape[1]), err
                best[cols] = c
    return best


__all__ = ["COST_KEYS", "chase_weights", "data_caches", "nonnegative_fit", "predict_ns"]
