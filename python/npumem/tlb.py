"""The TLB model: page-size research on the device's real page table.

``Tlb.preset("skylake", device=dev)`` builds a TLB hierarchy of a known geometry (presets cite
their sources; ``ascend_like`` is labelled a guess) over ``dev``'s page table, and
``tlb.run(addresses)`` feeds a numpy address array through it: each address is translated by the
page table, so the page sizes the allocator mapped (4 KiB, 64 KiB, 2 MiB, 1 GiB) are what the
TLB caches. The result carries per-level hits, misses and MPKA, page walks and translation
cycles. Address arrays come from :mod:`npumem.patterns` (``sequential``, ``strided``,
``uniform``, ``pointer_chase``, ``gemm``, ``gather``, ``interleave``); :func:`sweep` runs a grid
of presets, page-size policies, patterns and footprints into a table.
"""

from __future__ import annotations

import csv
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import _args, _files, _native, chase_model
from ._optional import require
from .device import Device
from .enums import Policy
from .errors import OutOfMemoryError, invalid_param
from .patterns import conv_nc1hwc0, gather, gemm, gemm_fractal, pointer_chase, sequential, strided, uniform


@dataclass(frozen=True)
class ArrayStats:
    name: str
    lookups: int
    hits: int
    misses: int
    evictions: int


@dataclass(frozen=True)
class LevelStats:
    arrays: list[ArrayStats]
    accesses: int

    @property
    def hits(self) -> int:
        return sum(a.hits for a in self.arrays)

    @property
    def misses(self) -> int:
        return sum(a.misses for a in self.arrays)

    @property
    def lookups(self) -> int:
        return sum(a.lookups for a in self.arrays)

    @property
    def evictions(self) -> int:
        return sum(a.evictions for a in self.arrays)

    @property
    def miss_rate(self) -> float:
        return self.misses / self.lookups if self.lookups else 0.0

    @property
    def mpka(self) -> float:
        """Misses per thousand accesses (of the whole run)."""
        return 1000.0 * self.misses / self.accesses if self.accesses else 0.0


@dataclass(frozen=True)
class TlbStats:
    accesses: int
    faults: int
    walks: int
    walk_steps: int
    walk_steps_skipped: int
    cycles: int
    levels: list[LevelStats]
    #: With a host: host translations the nested TLB answered and missed, host walks, and the
    #: host table reads taken and skipped by the host walk caches.
    nested_tlb_hits: int = 0
    nested_tlb_misses: int = 0
    nested_walks: int = 0
    nested_steps: int = 0
    nested_steps_skipped: int = 0

    @property
    def reads_per_walk(self) -> float:
        """Memory reads of the average walk, both dimensions (0.0 without walks)."""
        return (self.walk_steps + self.nested_steps) / self.walks if self.walks else 0.0

    @property
    def nested_reads_per_walk(self) -> float:
        """Of those, the host dimension's (0.0 without walks or without a host)."""
        return self.nested_steps / self.walks if self.walks else 0.0

    @property
    def walk_cache_hit_rate(self) -> float:
        """Share of walk steps the page-walk caches saved."""
        total = self.walk_steps + self.walk_steps_skipped
        return self.walk_steps_skipped / total if total else 0.0

    def overhead(self, compute_cycles: float) -> float:
        """Translation cycles as a fraction of ``compute_cycles``."""
        return self.cycles / compute_cycles

    @classmethod
    def _from(cls, d: dict[str, Any]) -> TlbStats:
        levels = [LevelStats([ArrayStats(**a) for a in level], d["accesses"]) for level in d["levels"]]
        return cls(**{k: v for k, v in d.items() if k != "levels"}, levels=levels)


#: Host page sizes a nested translation accepts (bytes).
HOST_PAGE_SIZES = (4096, 2 << 20, 1 << 30)

_KEEP: Any = object()


def _host_args(host_page_size: Any, host: Any) -> dict[str, Any]:
    """The native overrides of ``host=`` (None, or a dict of page_size, levels,
    nested_tlb_entries, walk_cache_entries) and ``host_page_size=`` (None keeps the preset's)."""
    out: dict[str, Any] = {}
    if host is not _KEEP:
        if host is not None:
            host = dict(_args.mapping(host, "host"))
            for key, value in host.items():
                if key == "walk_cache_entries":
                    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
                        raise _args.type_error("host['walk_cache_entries']", value, "a list of 3 ints")
                    host[key] = [_args.integer(v, f"host['walk_cache_entries'][{i}]") for i, v in enumerate(value)]
                elif key == "page_size":
                    host[key] = host_page(value, "host['page_size']")
                elif key in ("levels", "nested_tlb_entries"):
                    host[key] = _args.integer(value, f"host[{key!r}]")
        out["host"] = host
    if host_page_size is not None:
        out["host_page_size"] = host_page(host_page_size, "host_page_size")
    return out


def host_page(value: Any, name: str) -> int:
    """A host page size: 4096, 2 MiB or 1 GiB, as an int or a size string ("2MiB")."""
    size = _args.size(value, name)
    if size not in HOST_PAGE_SIZES:
        raise invalid_param(
            f"{name} {_args.show(value)} is not a host page: use 4096, 2097152 (2MiB) or 1073741824 (1GiB)"
        )
    return size


class Tlb:
    """A TLB hierarchy over a device's page table; with a host (``host_page_size=`` or
    ``host=``), a guest of a virtual machine: every walk is two-dimensional and an entry maps the
    smaller of the guest's and the host's page."""

    def __init__(
        self,
        preset: str,
        device: Device,
        *,
        model: str = "fast",
        host_page_size: int | None = None,
        host: Any = _KEEP,
        **overrides: Any,
    ) -> None:
        """``model="reference"`` runs the model as first written (linear scans): bit-identical
        results, many times slower; for cross-checks and before/after benchmarks.
        ``host_page_size`` (4096, 2 MiB or 1 GiB) makes it a guest over host pages of that size
        (keeping the preset's host otherwise); ``host=None`` makes it native, ``host={...}``
        sets page_size, levels (4 or 5), nested_tlb_entries and walk_cache_entries."""
        preset = _args.text(preset, "preset")
        model = _args.choice(model, "model", ("fast", "reference"))
        if not isinstance(device, _native.Device):
            raise _args.type_error("device", device, "an npumem.Device")
        for key, value in overrides.items():
            if _args.is_int(value):
                _args.integer(value, key)  # counts and cycles are ints from 0 to 2**64-1
            elif isinstance(value, (bool, np.bool_)):
                raise _args.type_error(key, value, "an int or a str")
        overrides = {**_host_args(host_page_size, host), **overrides}
        self._tlb = _native.Tlb(preset, device, overrides or None, model)
        self.device = device

    @classmethod
    def preset(
        cls,
        name: str,
        device: Device,
        *,
        model: str = "fast",
        host_page_size: int | None = None,
        host: Any = _KEEP,
        **overrides: Any,
    ) -> Tlb:
        """A preset geometry (``Tlb.presets()``); overrides as ``walk_step_cycles=...`` or
        ``**{"1.0.entries": 4096}`` (level 1, array 0); ``host_page_size``/``host`` as for
        :class:`Tlb`."""
        return cls(name, device, model=model, host_page_size=host_page_size, host=host, **overrides)

    @classmethod
    def from_cpuid(
        cls, device: Device, *, host_page_size: int | None = 4096, model: str = "fast", **overrides: Any
    ) -> Tlb:
        """The geometry of the machine this runs on, from its CPUID leaves (x86: AMD 0x80000005/6/19,
        Intel 0x18); ``config["source"]`` gives the origin of every number. Where CPUID reports a
        hypervisor, the guest runs over ``host_page_size`` host pages (CPUID cannot see them;
        None: modelled native). Off x86, :class:`npumem.UnsupportedError` says why."""
        return cls("cpuid", device, model=model, host_page_size=host_page_size, **overrides)

    @staticmethod
    def presets() -> list[str]:
        return _native.Tlb.presets()

    @property
    def config(self) -> dict[str, Any]:
        return self._tlb.config()

    def run(self, addresses: Any) -> TlbStats:
        """Feeds the addresses (any array-like of non-negative ints below 2**64, any shape)
        through the TLB; counters accumulate."""
        if isinstance(addresses, np.ndarray):
            addresses = addresses.reshape(-1)
        arr = _args.uint64_array(addresses, "addresses")
        return TlbStats._from(self._tlb.run(arr))

    def stats(self) -> TlbStats:
        return TlbStats._from(self._tlb.stats())

    def reset_stats(self) -> None:
        """Clears the counters; the entries stay (a warm TLB)."""
        self._tlb.reset_stats()

    def effective_reach(self) -> list[int]:
        """Bytes the valid entries of each level map now."""
        return self._tlb.effective_reach()

    def nominal_reach(self, page_size: int) -> list[int]:
        """Bytes each level maps when every entry holds a page of ``page_size``."""
        return self._tlb.nominal_reach(_args.size(page_size, "page_size", 1, 1 << 40))


def preset_table(cpuid: bool = False) -> list[dict[str, str]]:
    """One row per preset (and, with ``cpuid``, this machine's geometry from CPUID): name, its
    levels (entries/ways per array), walk caches, host, the kind of its source (vendor manual,
    CPUID, simulator config, microbenchmark paper, guess) and the source itself."""
    dev = Device("64MiB")
    names = [*Tlb.presets(), *(["cpuid"] if _args.flag(cpuid, "cpuid") else [])]
    rows = []
    for name in names:
        c = (Tlb.from_cpuid(dev) if name == "cpuid" else Tlb(name, dev)).config
        levels = " | ".join(", ".join(f"{a['entries']}/{a['ways']}" for a in level) for level in c["levels"])
        h = c["host"]
        rows.append(
            {
                "name": name,
                "levels": levels,
                "walk caches": "/".join(map(str, c["walk_cache_entries"])),
                "host": "native" if h is None else f"{h['page_size'] >> 10} KiB x {h['levels']} levels",
                "source kind": c["source_kind"],
                "source": c["source"],
            }
        )
    return rows


#: The largest footprint :func:`sweep` maps (the simulated device keeps page tables for it).
MAX_FOOTPRINT = 64 << 30

#: Page size label -> the malloc policy that maps a footprint with pages of that size.
PAGE_POLICIES: dict[str, Policy] = {
    "4KiB": Policy.NORMAL_ONLY,
    "2MiB": Policy.HUGE_ONLY,
    "1GiB": Policy.HUGE1G_ONLY,
}


def _gemm_over(ptr: int, footprint: int, accesses: int, seed: int) -> np.ndarray:
    # Three square fp16 matrices filling the footprint, 64x64x64 tiles in m-n-k order.
    side = max(64, math.isqrt(footprint // 6) // 64 * 64)
    size = side * side * 2
    return gemm(ptr, ptr + size, ptr + 2 * size, side, side, side, elem=2, tile=(64, 64, 64), limit=accesses)


def _conv_over(ptr: int, footprint: int, accesses: int, seed: int) -> np.ndarray:
    # An NC1HWC0 fp16 activation (N=1, C0=16) filling the footprint: square images, C1 planes.
    c1 = 8
    side = max(3, math.isqrt(footprint // (c1 * 32)))
    return conv_nc1hwc0(ptr, 1, c1, side, side, limit=accesses)


def _gemm_fractal_over(ptr: int, footprint: int, accesses: int, seed: int) -> np.ndarray:
    side = max(16, math.isqrt(footprint // 6) // 16 * 16)
    size = side * side * 2
    return gemm_fractal(ptr, ptr + size, ptr + 2 * size, side, side, side, limit=accesses)


#: Pattern name -> generator(ptr, footprint, accesses, seed) of addresses inside the footprint.
PATTERNS: dict[str, Callable[[int, int, int, int], np.ndarray]] = {
    "sequential": lambda p, f, n, s: np.resize(sequential(p, f), n),
    "uniform": lambda p, f, n, s: uniform(p, f, n, seed=s),
    "chase": lambda p, f, n, s: pointer_chase(p, f, n, seed=s),
    "gemm": _gemm_over,
    "gemm_fractal": _gemm_fractal_over,
    "conv": _conv_over,
    "gather": lambda p, f, n, s: gather(p, max(1, f // 1024), 1024, max(1, n // 16), zipf=1.2, seed=s),
}


def sweep(
    presets: Sequence[str] = ("zen4",),
    pages: Sequence[str] = ("4KiB", "2MiB"),
    patterns: Sequence[str] = ("sequential", "uniform"),
    footprints: Sequence[int] = (16 << 20, 256 << 20),
    accesses: int = 1_000_000,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """Runs every combination and returns one row (a dict) per run: the TLB counters per level
    (misses, MPKA), walks, walk-cache hit rate, translation cycles per access, nominal and
    effective reach, the page-table entries and internal waste of the mapping, and the simulated
    accesses per second of the run. Every argument is checked before the first run (footprints
    from 4 KiB to 64 GiB, 1 to 2**28 accesses)."""
    presets = _args.choices(presets, "presets", Tlb.presets())
    pages = _args.choices(pages, "pages", PAGE_POLICIES)
    patterns = _args.choices(patterns, "patterns", PATTERNS)
    if isinstance(footprints, (str, bytes)) or not isinstance(footprints, Iterable):
        raise _args.type_error("footprints", footprints, "a list of sizes")
    footprints = [_args.size(f, f"footprints[{i}]", 4096, MAX_FOOTPRINT) for i, f in enumerate(footprints)]
    if not footprints:
        raise invalid_param("footprints is empty; give at least one size")
    accesses = _args.integer(accesses, "accesses", 1, _args.MAX_ELEMENTS)
    seed = _args.integer(seed, "seed", 0, _args.U64_MAX)
    rows = []
    biggest = max(footprints)
    for page in pages:
        giants = -(-biggest // (1 << 30)) if page == "1GiB" else 0
        dev = Device(biggest + giants * (1 << 30) + (64 << 20), giant_frames=giants, allocator="direct")
        for footprint in footprints:
            ptr = dev.malloc(footprint, PAGE_POLICIES[page])
            alloc = dev.allocation(ptr)
            table = dev.page_table_stats()
            entries = sum(table["leaf_entries"].values())
            for pattern in patterns:
                addresses = PATTERNS[pattern](ptr, footprint, accesses, seed)
                for preset in presets:
                    tlb = Tlb.preset(preset, dev)
                    t0 = time.perf_counter()
                    st = tlb.run(addresses)
                    elapsed = time.perf_counter() - t0
                    row: dict[str, Any] = {
                        "preset": preset,
                        "page": page,
                        "pattern": pattern,
                        "footprint": footprint,
                        "accesses": st.accesses,
                        "walks": st.walks,
                        "walk_cache_hit_rate": round(st.walk_cache_hit_rate, 4),
                        "cycles_per_access": st.cycles / max(st.accesses, 1),
                        "page_table_entries": entries,
                        "page_table_bytes": table["table_bytes"],
                        "internal_waste": alloc["granted"] - alloc["size"],
                        "accesses_per_s": st.accesses / elapsed if elapsed > 0 else float("inf"),
                    }
                    for i, level in enumerate(st.levels, 1):
                        row[f"L{i}_misses"] = level.misses
                        row[f"L{i}_mpka"] = round(level.mpka, 3)
                    for i, (nominal, effective) in enumerate(
                        zip(tlb.nominal_reach(int(alloc["page_size"])), tlb.effective_reach(), strict=True), 1
                    ):
                        row[f"L{i}_nominal_reach"] = nominal
                        row[f"L{i}_effective_reach"] = effective
                    rows.append(row)
            dev.free(ptr)
    return rows


def huge_frame_rates(
    capacity: int = 1 << 30, steps: int = 20_000, huge_every: int = 50, target_used: float = 0.85, seed: int = 0
) -> list[dict[str, Any]]:
    """Huge-frame availability under churn: a direct-allocator device takes random small
    allocations (4 KiB - 1 MiB, normal pages) until ``target_used`` of it is in use, then frees
    random ones and allocates again around that level; every ``huge_every`` steps it asks for a
    2 MiB page with HUGE_ONLY (failure rate) and for 4 MiB with HUGE_FIRST (fallback rate to
    normal pages). Returns one row per probe: step, used fraction, largest free block, and the
    cumulative failure and fallback rates."""
    import random

    capacity = _args.size(capacity, "capacity", 64 << 20, 64 << 30)
    steps = _args.integer(steps, "steps", 1, 1 << 24)
    huge_every = _args.integer(huge_every, "huge_every", 1, 1 << 24)
    target_used = _args.real(target_used, "target_used", 0.0, 1.0)
    seed = _args.integer(seed, "seed", -(2**63), _args.U64_MAX)

    rng = random.Random(seed)
    dev = Device(capacity, allocator="direct")
    live: list[int] = []
    probes = failures = fallbacks = 0
    rows = []
    for step in range(1, steps + 1):
        free_now, total = dev.mem_info()
        if live and 1 - free_now / total > target_used:
            dev.free(live.pop(rng.randrange(len(live))))
        else:
            try:
                live.append(dev.malloc(rng.choice([4, 8, 16, 32, 64, 128, 256, 512, 1024]) << 10, Policy.NORMAL_ONLY))
            except OutOfMemoryError:
                pass
        if step % huge_every == 0:
            probes += 1
            try:
                dev.free(dev.malloc(2 << 20, Policy.HUGE_ONLY))
            except OutOfMemoryError:
                failures += 1
            before = dev.stats()["huge_fallbacks"]
            try:
                dev.free(dev.malloc(4 << 20, Policy.HUGE_FIRST))
                fallbacks += dev.stats()["huge_fallbacks"] - before
            except OutOfMemoryError:
                pass
            free, total = dev.mem_info()
            rows.append(
                {
                    "step": step,
                    "used": 1 - free / total,
                    "largest_free_block": dev.frame_stats()["largest_free_block"],
                    "huge_failure_rate": failures / probes,
                    "huge_fallback_rate": fallbacks / probes,
                }
            )
    return rows


def write_csv(rows: Iterable[dict[str, Any]], path: str) -> None:
    """Writes sweep rows as a tidy CSV (one column per key, in first-seen order)."""
    path = _files.path_arg(path)
    if isinstance(rows, (str, bytes, dict)) or not isinstance(rows, Iterable):
        raise _args.type_error("rows", rows, "a list of dicts (sweep rows)")
    rows = list(rows)
    for i, r in enumerate(rows):
        if not isinstance(r, dict):
            raise _args.type_error(f"rows[{i}]", r, "a dict")
    keys: list[str] = []
    for r in rows:
        keys.extend(k for k in r if k not in keys)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)


def _panels(
    rows: Iterable[dict[str, Any]],
    path: str,
    draw: Callable[[Any, list[dict[str, Any]], str], None],
    xlabel: str,
    ylabel: str,
) -> None:
    """One panel per (preset, pattern), one series per page size drawn by ``draw(ax, rows,
    label)``, log x and symlog y axes; saved as a PNG (needs matplotlib; without it,
    :class:`npumem.MissingDependencyError` says how to install it)."""
    path = _files.path_arg(path)
    require("matplotlib", "drawing the TLB plots").use("Agg")
    import matplotlib.pyplot as plt

    rows = list(rows)
    panels = sorted({(r["preset"], r["pattern"]) for r in rows})
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.4), squeeze=False)
    for ax, (preset, pattern) in zip(axes[0], panels, strict=True):
        for page in sorted({r["page"] for r in rows}, key=list(PAGE_POLICIES).index):
            sel = [r for r in rows if (r["preset"], r["pattern"], r["page"]) == (preset, pattern, page)]
            if sel:
                draw(ax, sel, page)
        ax.set_xscale("log")
        ax.set_yscale("symlog", linthresh=0.01)
        ax.set_ylim(bottom=0)
        ax.set_title(f"{preset}: {pattern}", fontsize=10)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot(rows: Iterable[dict[str, Any]], path: str) -> None:
    """Page walks per thousand accesses against footprint (the reach knee), one line per page
    size, one panel per (preset, pattern); saved as a PNG (needs matplotlib)."""

    def draw(ax: Any, sel: list[dict[str, Any]], page: str) -> None:
        pts = sorted((r["footprint"], 1000.0 * r["walks"] / max(r["accesses"], 1)) for r in sel)
        ax.plot([p[0] / (1 << 20) for p in pts], [p[1] for p in pts], marker="o", label=f"{page} pages")

    _panels(rows, path, draw, "footprint (MiB)", "page walks per 1000 accesses")


def plot_tradeoff(rows: Iterable[dict[str, Any]], path: str) -> None:
    """The page-size tradeoff: translation cycles per access against the internal waste of the
    mapping, one point per (page size, footprint), one panel per (preset, pattern)."""

    def draw(ax: Any, sel: list[dict[str, Any]], page: str) -> None:
        ax.scatter([max(r["internal_waste"], 1) for r in sel], [r["cycles_per_access"] for r in sel], label=page)

    _panels(rows, path, draw, "internal waste of the mapping (bytes)", "translation cycles per access")


# -- The pointer-chase cost model over this module's Tlb (the arithmetic: chase_model) --------


def chase_features(
    footprints: Sequence[int],
    page_size: int = chase_model.PAGE,
    *,
    host_page_size: int | None = None,
    preset: str = "cpuid",
    caches: tuple[Any, Any] | None = None,
) -> list[dict[str, float]]:
    """Per footprint, what an access does in the model: ``l1_miss`` (L1 TLB misses), ``walks``,
    walk ``reads`` (both dimensions) per access and the ``lines`` a lap touches; then the weight
    of each cost constant (``w_base``, ``w_l2_tlb``, ``w_near``, ``w_far``)."""
    footprints = chase_model._footprints(footprints)
    page_size = chase_model._guest_page(page_size)
    host = None if host_page_size is None else host_page(host_page_size, "host_page_size")
    preset = _args.text(preset, "preset")
    c1, c2 = chase_model._caches(caches)
    biggest = max(footprints)
    giants = -(-biggest // (1 << 30)) if page_size == 1 << 30 else 0
    span = -(-biggest // page_size) * page_size
    dev = Device(span + giants * (1 << 30) + (64 << 20), giant_frames=giants, allocator="direct")
    rows = []
    for fp in footprints:
        ptr = dev.malloc(fp, chase_model.PAGE_POLICIES[page_size])
        pages = fp // chase_model.PAGE
        tlb = Tlb.preset(preset, dev, host_page_size=host) if host else Tlb.preset(preset, dev)
        laps = pointer_chase(ptr, fp, (1 + chase_model.LAPS) * pages, seed=1)
        tlb.run(laps[:pages])
        tlb.reset_stats()
        st = tlb.run(laps[pages:])
        dev.free(ptr)
        n = max(st.accesses, 1)
        l1_miss = st.levels[0].misses / n
        walks = st.walks / n
        # A guest leaf read each walk, and (with a host) a host leaf read of the data each walk;
        # host walks beyond those are of guest table pages, whose host entries are few and hot.
        host_data = walks if host else 0.0
        table_host = max(0.0, st.nested_walks / n - host_data)
        upper = (st.walk_steps + st.nested_steps) / n - walks - host_data - table_host
        hot = upper + table_host
        rows.append(chase_model.chase_weights(fp, page_size, host, l1_miss, walks, host_data, hot, c1, c2))
    return rows


def predict_chase(
    footprints: Sequence[int],
    page_size: int = chase_model.PAGE,
    *,
    host_page_size: int | None = None,
    preset: str = "cpuid",
    costs: Mapping[str, float],
    caches: tuple[Any, Any] | None = None,
) -> list[float]:
    """Nanoseconds per access the model predicts for a chase of each footprint (one 64-byte line
    in each 4 KiB page, the pages in one random cycle) over ``page_size`` guest pages;
    ``host_page_size`` (4096, 2 MiB or 1 GiB) makes the machine a guest over host pages of that
    size, ``preset`` names the geometry (``"cpuid"``: this machine's), ``costs`` holds base_ns,
    l2_tlb_ns, near_ns and far_ns (as :func:`fit_chase` returns), ``caches`` the (L1 data, L2)
    caches, each bytes (8-way) or (bytes, ways) (this machine's by default)."""
    footprints, page_size = chase_model._footprints(footprints), chase_model._guest_page(page_size)
    c = chase_model._costs(costs)
    rows = chase_features(footprints, page_size, host_page_size=host_page_size, preset=preset, caches=caches)
    return chase_model.predict_ns(rows, c)


def fit_chase(
    footprints: Sequence[int],
    ns: Sequence[float],
    *,
    page_size: int = chase_model.PAGE,
    host_page_size: int | None = None,
    preset: str = "cpuid",
    caches: tuple[Any, Any] | None = None,
) -> dict[str, float]:
    """The ``costs`` (base_ns, l2_tlb_ns, near_ns, far_ns) that fit measured ``ns`` per access at
    ``footprints`` best: base_ns the mean of the points with no L1 TLB miss and L1-resident data
    in the model (the smallest point where there is none), the other three by non-negative
    least squares on relative errors (every point weighs alike); a constant that no point
    spends a hundredth of an access on is 0."""
    footprints = chase_model._footprints(footprints)
    if isinstance(ns, (str, bytes)) or not isinstance(ns, Iterable):
        raise _args.type_error("ns", ns, "a list of nanoseconds")
    y = np.array([_args.real(v, f"ns[{i}]", 1e-3, 1e6, unit="ns") for i, v in enumerate(ns)])
    if len(y) != len(footprints):
        raise invalid_param(f"ns holds {len(y)} values for {len(footprints)} footprints; give one per footprint")
    rows = chase_features(footprints, page_size, host_page_size=host_page_size, preset=preset, caches=caches)
    floor = [i for i, r in enumerate(rows) if r["w_l2_tlb"] == 0 and r["w_near"] == 0 and r["w_far"] == 0]
    base = float(np.mean(y[floor])) if floor else float(y[int(np.argmin(footprints))])
    w = np.array([[r["w_l2_tlb"], r["w_near"], r["w_far"]] for r in rows])
    rest = y - base * np.array([r["w_base"] for r in rows])
    scale = 1 / np.maximum(y, 1e-9)
    # A constant no point spends a hundredth of an access on is not determined by these points
    # (its least-squares value could be any size): it stays 0.
    used = w.max(axis=0) >= 0.01
    c = np.zeros(3)
    c[used] = chase_model.nonnegative_fit(w[:, used] * scale[:, None], rest * scale)
    out = {"base_ns": base, "l2_tlb_ns": float(c[0]), "near_ns": float(c[1]), "far_ns": float(c[2])}
    return {k: (round(v, 4) if math.isfinite(v) else v) for k, v in out.items()}


__all__ = [
    "HOST_PAGE_SIZES",
    "PAGE_POLICIES",
    "PATTERNS",
    "ArrayStats",
    "LevelStats",
    "Tlb",
    "TlbStats",
    "chase_features",
    "fit_chase",
    "huge_frame_rates",
    "plot",
    "plot_tradeoff",
    "predict_chase",
    "preset_table",
    "sequential",
    "strided",
    "sweep",
    "uniform",
    "write_csv",
]
