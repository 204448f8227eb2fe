"""``npumem tlb validate``: the TLB model held against this machine's pointer chase, out of sample.

Rules:

- The chase: one 64-byte line in each 4 KiB page of the footprint, the pages in one random cycle
  (:func:`npumem.patterns.pointer_chase`), timed by the native dependent-load loop
  (:func:`npumem._native.chase`). Footprints run at ``per_octave`` points an octave.
- Guest 4 KiB pages: an anonymous mapping advised ``MADV_NOHUGEPAGE``. Guest 2 MiB pages:
  transparent huge pages made synchronous with ``MADV_COLLAPSE`` (no hugetlb reservation), and
  hugetlb pages (``MAP_HUGETLB``) where the kernel has enough free. What backs each mapping is
  read from ``/proc/self/smaps``; a series whose pages are not what it says is refused.
- Rounds interleave every footprint and series, each round over fresh mappings; each point is
  the quickest sample of all rounds (a shared machine's slow spells hit every series alike, and
  no one placement of frames decides). The load average is read before and after.
- The costs are fitted on the 4 KiB series only (:func:`npumem.tlb.fit_chase`); every other point
  is a prediction (:func:`npumem.tlb.predict_chase`) with the geometry from CPUID.
"""

from __future__ import annotations

import json
import math
import mmap
import os
import re
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import _args, _files, _native
from ._optional import require
from .chase_model import MAX_FOOTPRINT, PAGE, PAGE_POLICIES
from .errors import invalid_param
from .patterns import pointer_chase
from .tlb import chase_features, fit_chase, predict_chase

HUGE = 2 << 20
MADV_COLLAPSE = 25  # linux/mman.h (Linux 6.1)
MAP_HUGETLB = 0x40000  # linux/mman.h (x86, Arm)
#: Timed steps of one sample; short, so that some samples of a loaded machine run undisturbed.
SAMPLE_STEPS = 200_000
#: The validation's bounds: every point, and the 4K-2M difference from 12 MiB.
POINT_TOL, POINT_FLOOR_NS = 0.15, 0.5
DIFF_TOL, DIFF_FLOOR_NS, DIFF_FROM = 0.25, 2.0, 12 << 20


def grid(lo: int = 64 << 10, hi: int = 64 << 20, per_octave: int = 4) -> list[int]:
    """Footprints from ``lo`` to ``hi``, ``per_octave`` an octave, each a whole number of pages."""
    lo = _args.size(lo, "lo", PAGE)
    hi = _args.size(hi, "hi", lo, 4 << 30)
    per_octave = _args.integer(per_octave, "per_octave", 1, 64)
    n = round(math.log2(hi / lo) * per_octave)
    return sorted({max(PAGE, round(lo * 2 ** (i / per_octave)) // PAGE * PAGE) for i in range(n + 1)})


def smaps_backing(start: int, nbytes: int) -> dict[str, int]:
    """kB of ``[start, start + nbytes)``'s mappings by kind, from /proc/self/smaps: ``Rss``,
    ``AnonHugePages`` (THP) and ``Hugetlb``, and the largest ``KernelPageSize``."""
    out = {"Rss": 0, "AnonHugePages": 0, "Hugetlb": 0, "KernelPageSize": 0}
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = re.match(r"^([0-9a-f]+)-([0-9a-f]+) ", line)
            if head:
                inside = int(head[1], 16) < start + nbytes and start < int(head[2], 16)
                continue
            if inside:
                key, _, value = line.partition(":")
                if not value.strip().endswith("kB"):
                    continue
                kb = int(value.split()[0])
                if key == "KernelPageSize":
                    out[key] = max(out[key], kb)
                elif key in ("Rss", "AnonHugePages"):
                    out[key] += kb
                elif key in ("Private_Hugetlb", "Shared_Hugetlb"):
                    out["Hugetlb"] += kb
    return out


@dataclass
class Series:
    """One mapping the chase runs over: its label, guest page size, memory, and how smaps says
    it is backed."""

    label: str
    page_size: int
    memory: np.ndarray
    backing: str
    keep: Any  # the mmap object owning ``memory``

    @property
    def base(self) -> int:
        return int(self.memory.ctypes.data)


def _mapping(nbytes: int, flags: int = 0) -> tuple[mmap.mmap, np.ndarray]:
    """An anonymous private mapping with a 2 MiB-aligned view of ``nbytes``."""
    m = mmap.mmap(-1, nbytes + HUGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | flags)
    whole = np.frombuffer(m, np.uint8)
    skip = -whole.ctypes.data % HUGE
    return m, whole[skip : skip + nbytes]


def small_series(nbytes: int) -> Series:
    m, view = _mapping(nbytes)
    m.madvise(mmap.MADV_NOHUGEPAGE)
    view[::PAGE] = 1  # fault every page in
    b = smaps_backing(view.ctypes.data, nbytes)
    if b["AnonHugePages"] or b["Hugetlb"]:
        raise invalid_param(f"the 4 KiB series is backed by huge pages ({b}); THP is forced on for all mappings")
    return Series("4KiB", PAGE, view, f"4 KiB pages (smaps KernelPageSize {b['KernelPageSize']} kB, no THP)", m)


def thp_series(nbytes: int) -> Series:
    """2 MiB transparent huge pages, collapsed synchronously (``MADV_COLLAPSE``) and verified."""
    m, view = _mapping(nbytes)
    m.madvise(mmap.MADV_HUGEPAGE)
    view[::PAGE] = 1
    start = view.ctypes.data - np.frombuffer(m, np.uint8).ctypes.data
    try:
        m.madvise(MADV_COLLAPSE, start, nbytes)
    except OSError as e:
        raise invalid_param(
            f"MADV_COLLAPSE of {nbytes >> 20} MiB failed ({e}); transparent huge pages need "
            "/sys/kernel/mm/transparent_hugepage/enabled set to madvise or always, and Linux 6.1"
        ) from e
    b = smaps_backing(view.ctypes.data, nbytes)
    if b["AnonHugePages"] * 1024 < nbytes:
        raise invalid_param(f"only {b['AnonHugePages']} kB of {nbytes >> 10} kB are THP after MADV_COLLAPSE ({b})")
    return Series("2MiB", HUGE, view, f"2 MiB THP (MADV_COLLAPSE; smaps AnonHugePages {b['AnonHugePages']} kB)", m)


def hugetlb_series(nbytes: int) -> Series | None:
    """2 MiB hugetlb pages where the kernel has ``nbytes`` of them free; None otherwise."""
    try:
        with open("/proc/meminfo") as f:
            info = {k.strip(): v.split()[0] for k, _, v in (line.partition(":") for line in f)}
        free = int(info.get("HugePages_Free", "0")) * int(info.get("Hugepagesize", "0")) * 1024
    except (OSError, ValueError):
        return None
    if free < nbytes + HUGE:
        return None
    m = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | MAP_HUGETLB)
    view = np.frombuffer(m, np.uint8)
    view[::PAGE] = 1
    b = smaps_backing(view.ctypes.data, nbytes)
    if b["Hugetlb"] * 1024 < nbytes:
        raise invalid_param(f"only {b['Hugetlb']} kB of {nbytes >> 10} kB are hugetlb pages ({b})")
    return Series("2MiB hugetlb", HUGE, view, f"2 MiB hugetlb (smaps Hugetlb {b['Hugetlb']} kB)", m)


def _cycle(s: Series, footprint: int, seed: int) -> tuple[np.ndarray, int]:
    """Links one random cycle over the first ``footprint`` bytes; returns the index view and the
    start."""
    pages = footprint // PAGE
    addrs = pointer_chase(s.base, footprint, pages + 1, seed=seed)
    nxt = s.memory[:footprint].view(np.uint64)
    nxt.fill(0)  # a larger cycle's links must not point past this one
    idx = (addrs - np.uint64(s.base)) // np.uint64(8)
    nxt[idx[:-1]] = idx[1:]
    return nxt, int(idx[0])


def make_series(nbytes: int, hugetlb: bool = True) -> list[Series]:
    """Fresh mappings of ``nbytes`` for every series: 4 KiB pages, 2 MiB THP, and 2 MiB hugetlb
    pages where ``hugetlb`` and the kernel has them free."""
    series = [small_series(nbytes), thp_series(nbytes)]
    extra = hugetlb_series(nbytes) if hugetlb else None
    return series if extra is None else [*series, extra]


def measure(
    make: Callable[[], list[Series]], footprints: Sequence[int], rounds: int, seed: int = 0, samples: int = 3
) -> tuple[dict[str, list[float]], list[Series]]:
    """ns per access of each series at each footprint: the quickest sample of ``rounds``
    interleaved rounds (every footprint, every series, in turn), ``samples`` samples a visit.
    Every round maps its series afresh (``make``), so no one placement of physical frames decides
    a point. Returns the times and the last round's series."""
    best: dict[str, list[float]] = {}
    series: list[Series] = []
    for _ in range(rounds):
        series = make()
        for s in series:
            best.setdefault(s.label, [math.inf] * len(footprints))
        for i, fp in enumerate(footprints):
            for s in series:
                nxt, at = _cycle(s, fp, seed)
                at, _ = _native.chase(nxt, fp // PAGE, at)  # warm: one lap
                for _ in range(samples):
                    at, ns = _native.chase(nxt, max(SAMPLE_STEPS, fp // PAGE), at)
                    best[s.label][i] = min(best[s.label][i], ns)
    return best, series


def knees(footprints: Sequence[int], ns: Sequence[float]) -> tuple[int | None, int | None]:
    """The L1 knee (the first footprint at twice the smallest one's time) and the L2 onset (the
    first footprint from sixteen times the L1 knee, past the data's L1-cache step, at 1.25 times
    the lowest time since then)."""
    l1 = next((f for f, y in zip(footprints, ns, strict=True) if y >= 2 * ns[0]), None)
    if l1 is None:
        return None, None
    low = math.inf
    for f, y in zip(footprints, ns, strict=True):
        if f < 16 * l1:
            continue
        low = min(low, y)
        if y >= 1.25 * low:
            return l1, f
    return l1, None


def _within(pred: float, meas: float, tol: float, floor: float) -> bool:
    return abs(pred - meas) <= max(tol * meas, floor)


def validate(
    footprints: Sequence[int] | None = None,
    *,
    rounds: int = 5,
    host_page_size: int | None = PAGE,
    preset: str = "cpuid",
    seed: int = 0,
    hugetlb: bool = True,
) -> dict[str, Any]:
    """Measures the chase over every series, fits the costs on the 4 KiB one, predicts every
    point, and checks the validation's bounds; returns a JSON-able dict (see :func:`format_table`)."""
    footprints = grid() if footprints is None else [_args.size(f, "footprints", PAGE, 1 << 30) for f in footprints]
    if not footprints:
        raise invalid_param("footprints is empty; give at least one size")
    footprints = sorted(set(footprints))
    rounds = _args.integer(rounds, "rounds", 1, 1000)
    host_page_size, preset = _model_args(host_page_size, preset)
    load_before = os.getloadavg()
    biggest = -(-max(footprints) // HUGE) * HUGE
    t0 = time.perf_counter()
    measured, series = measure(lambda: make_series(biggest, hugetlb), footprints, rounds, seed)
    series = [s for s in series if all(math.isfinite(v) for v in measured[s.label])]
    elapsed = time.perf_counter() - t0
    load_after = os.getloadavg()
    points = {s.label: (s.page_size, s.backing, measured[s.label]) for s in series}
    meta = {
        "rounds": rounds,
        "seconds": round(elapsed, 1),
        "load_average": {"before": list(load_before), "after": list(load_after)},
    }
    return assess(footprints, points, host_page_size=host_page_size, preset=preset, meta=meta)


def _model_args(host_page_size: Any, preset: Any) -> tuple[int | None, str]:
    """The host page and preset, checked (by building the TLB) before anything is measured."""
    from .device import Device
    from .tlb import Tlb, host_page

    host_page_size = None if host_page_size is None else host_page(host_page_size, "host_page_size")
    preset = _args.text(preset, "preset")
    Tlb.preset(preset, Device("64MiB"), host_page_size=host_page_size)
    return host_page_size, preset


def assess(
    footprints: Sequence[int],
    points: dict[str, tuple[int, str, Sequence[float]]],
    *,
    host_page_size: int | None,
    preset: str,
    meta: dict[str, Any],
) -> dict[str, Any]:
    """Fits the costs on the ``"4KiB"`` series of ``points`` (label -> (guest page size, backing,
    ns per access at each footprint)), predicts every series and checks the bounds; ``meta``
    (rounds, seconds, load_average) describes the measurement."""
    costs = fit_chase(footprints, points["4KiB"][2], page_size=PAGE, host_page_size=host_page_size, preset=preset)
    out: dict[str, Any] = {
        "preset": preset,
        "host_page_size": host_page_size,
        "costs": costs,
        "fitted_on": "4KiB",
        **meta,
        "footprints": list(footprints),
        "series": {},
    }
    for label, (page_size, backing, meas) in points.items():
        pred = predict_chase(footprints, page_size, host_page_size=host_page_size, preset=preset, costs=costs)
        feats = chase_features(footprints, page_size, host_page_size=host_page_size, preset=preset)
        out["series"][label] = {
            "backing": backing,
            "page_size": page_size,
            "measured_ns": [round(v, 3) for v in meas],
            "predicted_ns": [round(v, 3) for v in pred],
            "reads_per_access": [round(r["reads"], 3) for r in feats],
            "knees_measured": knees(footprints, meas),
            "knees_predicted": knees(footprints, pred),
            "within": [_within(p, m, POINT_TOL, POINT_FLOOR_NS) for p, m in zip(pred, meas, strict=True)],
        }
    out["checks"] = _checks(out)
    return out


#: ``host_page_size`` of :func:`revalidate`: the one the stored measurement was assessed with.
FROM_FILE = "file"


def load_measured(path: Any) -> tuple[list[int], dict[str, tuple[int, str, list[float]]], dict[str, Any]]:
    """The footprints, series (label -> (guest page size, backing, ns)) and measurement details
    (rounds, seconds, load_average, host_page_size, preset) of a stored validation JSON
    (:func:`write_json`'s output)."""
    name = _files.path_arg(path)
    doc = _files.read_json(name, "a validation JSON (npumem tlb validate --json)")

    def bad(what: str) -> Exception:
        return invalid_param(f"{name} is not a validation JSON (npumem tlb validate --json): {what}")

    if not isinstance(doc, dict):
        raise bad(f"the document is a {type(doc).__name__}, not an object")
    for key, kind in (("footprints", list), ("series", dict)):
        if not isinstance(doc.get(key), kind):
            raise bad(f"{key!r} is {_args.show(doc.get(key))}, expected a JSON {kind.__name__}")
    footprints = [
        _args.size(f, f"{name}: footprints[{i}]", PAGE, MAX_FOOTPRINT) for i, f in enumerate(doc["footprints"])
    ]
    if not footprints or footprints != sorted(set(footprints)):
        raise bad("'footprints' must be a non-empty increasing list of sizes")
    points: dict[str, tuple[int, str, list[float]]] = {}
    for label, s in doc["series"].items():
        where = f"{name}: series[{label!r}]"
        if not isinstance(s, dict):
            raise bad(f"series[{label!r}] is {_args.show(s)}, expected an object")
        page_size = _args.size(s.get("page_size"), f"{where}.page_size")
        if page_size not in PAGE_POLICIES:
            raise bad(f"series[{label!r}].page_size {page_size} is not a guest page (4096, 2MiB or 1GiB)")
        ns = s.get("measured_ns")
        if not isinstance(ns, list) or len(ns) != len(footprints):
            raise bad(f"series[{label!r}].measured_ns must list one time per footprint ({len(footprints)})")
        ns = [_args.real(v, f"{where}.measured_ns[{i}]", 1e-3, 1e6, unit="ns") for i, v in enumerate(ns)]
        points[str(label)] = (page_size, str(s.get("backing", "stored measurement")), ns)
    if "4KiB" not in points or "2MiB" not in points:
        raise bad(f"it holds the series {sorted(points)}; the model is fitted on '4KiB' and checked on '2MiB'")
    meta = {k: doc[k] for k in ("rounds", "seconds", "load_average", "host_page_size", "preset") if k in doc}
    return footprints, points, meta


def revalidate(path: Any, *, host_page_size: Any = FROM_FILE, preset: str | None = None) -> dict[str, Any]:
    """Re-fits and re-predicts the measurement stored in ``path`` (a validation JSON) without
    measuring: the model's host page and preset are the file's unless given (``host_page_size``
    None: a native machine)."""
    footprints, points, meta = load_measured(path)
    stored_host, stored_preset = meta.get("host_page_size", PAGE), meta.get("preset", "cpuid")
    keep_host = isinstance(host_page_size, str) and host_page_size == FROM_FILE
    host, preset = _model_args(
        stored_host if keep_host else host_page_size, stored_preset if preset is None else preset
    )
    meta = {
        "rounds": meta.get("rounds", 0),
        "seconds": meta.get("seconds", 0.0),
        "load_average": _load_average(meta.get("load_average")),
        "measured_from": _files.path_arg(path),
    }
    return assess(footprints, points, host_page_size=host, preset=preset, meta=meta)


def _load_average(la: Any) -> dict[str, list[float]]:
    """A stored load average, or NaNs where the file has none."""
    try:
        return {k: [float(v) for v in la[k]] for k in ("before", "after")}
    except (KeyError, TypeError, ValueError):
        return {"before": [math.nan] * 3, "after": [math.nan] * 3}


def _checks(out: dict[str, Any]) -> dict[str, bool]:
    """The validation's bounds: knees in the same grid interval, every point within ±15% (±0.5 ns),
    the 4K-2M difference within ±25% (±2 ns) from 12 MiB."""
    fps = out["footprints"]
    checks = {}
    for label, s in out["series"].items():
        checks[f"{label}: knees in the measured grid interval"] = s["knees_measured"] == s["knees_predicted"]
        checks[f"{label}: every point within 15% or 0.5 ns"] = all(s["within"])
    small, huge = out["series"]["4KiB"], out["series"]["2MiB"]
    diffs = [
        _within(ps - ph, ms - mh, DIFF_TOL, DIFF_FLOOR_NS)
        for f, ms, mh, ps, ph in zip(
            fps, small["measured_ns"], huge["measured_ns"], small["predicted_ns"], huge["predicted_ns"], strict=True
        )
        if f >= DIFF_FROM
    ]
    if diffs:  # no footprint from 12 MiB: nothing to check
        checks["4KiB-2MiB difference within 25% or 2 ns from 12 MiB"] = all(diffs)
    return checks


def _fmt(n: int) -> str:
    return (
        f"{n >> 20} MiB"
        if n >= 1 << 20 and n % (1 << 20) == 0
        else f"{n / (1 << 20):.2f} MiB"
        if n >= 1 << 20
        else f"{n >> 10} KiB"
    )


def rows(result: dict[str, Any]) -> Iterator[list[str]]:
    """The table's rows: footprint, then per series measured, predicted, error."""
    labels = list(result["series"])
    yield ["footprint"] + [f"{lab} {k}" for lab in labels for k in ("measured", "model", "error")]
    for i, fp in enumerate(result["footprints"]):
        row = [_fmt(fp)]
        for lab in labels:
            s = result["series"][lab]
            m, p = s["measured_ns"][i], s["predicted_ns"][i]
            mark = "" if s["within"][i] else " !"
            row += [f"{m:.2f}", f"{p:.2f}", f"{(p - m) / m * 100:+.0f}%{mark}" if m else "-"]
        yield row


def format_table(result: dict[str, Any]) -> str:
    """The validation as text: the answer first, then the setting, the table and the checks."""
    lines = [summary(result), ""]
    la = result["load_average"]
    lines.append(
        f"preset {result['preset']}, host pages {result['host_page_size']}, costs fitted on 4KiB only: "
        + ", ".join(f"{k} {v:.3g}" for k, v in result["costs"].items())
    )
    lines.append(
        f"best of {result['rounds']} interleaved rounds ({result['seconds']} s); load average "
        f"before {la['before'][0]:.2f}, after {la['after'][0]:.2f}"
        + (f"; stored in {result['measured_from']}, not measured again" if "measured_from" in result else "")
    )
    for lab, s in result["series"].items():
        lines.append(f"  {lab}: {s['backing']}; knees measured {s['knees_measured']}, model {s['knees_predicted']}")
    table = list(rows(result))
    widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
    lines.append("")
    for r in table:
        lines.append("  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)))
    lines.append("")
    for name, ok in result["checks"].items():
        lines.append(f"{'PASS' if ok else 'FAIL'}  {name}")
    return "\n".join(lines)


def summary(result: dict[str, Any]) -> str:
    """Which page size wins where, and whether the host's pages limit the gain."""
    fps = result["footprints"]
    small, huge = result["series"]["4KiB"]["measured_ns"], result["series"]["2MiB"]["measured_ns"]
    gains = [(f, s - h) for f, s, h in zip(fps, small, huge, strict=True)]
    wins = [f for f, g in gains if g > max(0.5, 0.05 * small[fps.index(f)])]
    host = result["host_page_size"]
    limited = host is not None and host < HUGE
    head = (
        f"2 MiB pages win from {_fmt(wins[0])} (saving {gains[fps.index(wins[0])][1]:.1f} ns an access there, "
        f"{gains[-1][1]:.1f} ns at {_fmt(fps[-1])}); below that the two are alike."
        if wins
        else "2 MiB pages save nothing measurable at these footprints."
    )
    if limited:
        head += (
            f" The host's {host >> 10} KiB pages limit the gain: a TLB entry maps 4 KiB either way (same knees),"
            " 2 MiB guest pages only shorten the walk."
        )
    return head


def write_json(result: dict[str, Any], path: str) -> None:
    path = _files.path_arg(path)
    with open(path, "w") as f:
        json.dump(result, f, indent=1)


def plot(result: dict[str, Any], path: str) -> None:
    """Measured points and the model's lines, ns per access against footprint (needs
    matplotlib)."""
    path = _files.path_arg(path)
    require("matplotlib", "drawing the validation plot").use("Agg")
    import matplotlib.pyplot as plt

    fps = [f / (1 << 20) for f in result["footprints"]]
    fig, ax = plt.subplots(figsize=(7, 4))
    for lab, s in result["series"].items():
        (line,) = ax.plot(fps, s["predicted_ns"], label=f"{lab} model")
        ax.plot(fps, s["measured_ns"], "o", ms=3, color=line.get_color(), label=f"{lab} measured")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("footprint (MiB)")
    ax.set_ylabel("ns per access")
    ax.set_title("pointer chase: measured vs model (costs fitted on 4KiB)", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


__all__ = [
    "assess",
    "format_table",
    "grid",
    "knees",
    "load_measured",
    "make_series",
    "measure",
    "plot",
    "revalidate",
    "smaps_backing",
    "summary",
    "validate",
    "write_json",
]
