"""``npumem report``: one self-contained HTML file from a sweep's results folder.

The file holds everything it shows: plots as PNGs embedded in ``data:`` URIs (matplotlib), the
tables as HTML, inline CSS, no script and no reference to anything outside it, so it opens
offline and can be mailed. Sections, each present when the sweep has its data:

- TLB: page walks and translation cycles per access against footprint, one line per page size,
  one panel per (pattern, preset); cycles per access against the mapping's internal waste;
- the page-size study: for the GEMM tile, conv window and Zipf gather patterns, which page size
  has the fewest cycles per access at each footprint, with the host measurements of
  ``benches/bench_pagesize.py --json`` (``make bench B=pagesize``: the same three patterns read from
  4 KiB and 2 MiB pages of real memory, a pointer chase and GEMM kernels) beside the model where
  given;
- allocators: the smallest capacity per allocator (and ``alloc_conf``) per workload, relative to
  the workload's peak live bytes; live, allocated and reserved bytes over each replay;
- the tables, the sweep's config, the commands that made the results and this report, and the
  versions of npumem and its libraries.

Invariants: the report is written whole or not at all (a temporary file renamed); a missing
matplotlib leaves the tables and a note in place of each plot, and :func:`write` returns the
one-line hint; reading the tables needs pyarrow (``npumem[sweep]``).
"""

from __future__ import annotations

import base64
import html
import io
import os
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from . import _args, _files
from ._optional import MissingDependencyError, require
from .errors import invalid_param
from .units import fmt

#: The page-size study's patterns, as the TLB sweep names them, and how the report names them.
STUDY_PATTERNS = {
    "gemm": "GEMM tiles (64x64x64, fp16)",
    "conv": "conv 3x3 windows (NC1HWC0)",
    "gather": "Zipf(1.2) gather",
}
#: Page sizes in order.
PAGES = ("4KiB", "64KiB", "2MiB", "1GiB")
#: A page size whose translation cycles per access are within this share of the best, or within
#: TIE_CYCLES of it, does as well: the study's winner is the smallest such page (it wastes least).
TIE = 0.05
TIE_CYCLES = 0.05

_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;margin:2em auto;max-width:1250px;color:#1b1b1b;
background:#fff;line-height:1.45;padding:0 1em}
h1{font-size:1.6em;border-bottom:2px solid #333}h2{margin-top:2em;border-bottom:1px solid #aaa}
table{border-collapse:collapse;margin:.6em 0;font-size:.85em}td,th{border:1px solid #ccc;padding:2px 7px;
text-align:right}th{background:#eef}td.l,th.l{text-align:left}img{max-width:100%;display:block;margin:.5em 0}
pre{background:#f4f4f4;padding:.6em;overflow-x:auto;font-size:.85em}.note{color:#555;font-style:italic}
.win{font-weight:bold;background:#e3f5e1}details{margin:.5em 0}summary{cursor:pointer;font-weight:bold}
"""


#: Columns the report reads from each table.
_COLUMNS = {
    "tlb": {"preset", "page", "pattern", "footprint", "accesses", "walks", "cycles_per_access", "internal_waste"},
    "alloc": {"workload", "allocator", "alloc_conf", "capacity_spec", "capacity", "peak_live", "capacity_vs_live"},
    "timelines": {"workload", "allocator", "alloc_conf", "capacity_spec", "event", "live", "reserved"},
}


_TEXT, _INT, _NUMBER = "a string", "an int", "a number"
#: What each column the report reads holds (a row with a null or another type is refused).
_KINDS = {
    **dict.fromkeys(("preset", "page", "pattern", "workload", "allocator", "alloc_conf", "capacity_spec"), _TEXT),
    **dict.fromkeys(("footprint", "accesses", "walks", "capacity", "peak_live", "event", "live", "reserved"), _INT),
    **dict.fromkeys(("cycles_per_access", "internal_waste", "capacity_vs_live"), _NUMBER),
}


def _check_kind(value: Any, kind: str) -> bool:
    if kind == _TEXT:
        return isinstance(value, str)
    if isinstance(value, bool):
        return False
    return isinstance(value, int) if kind == _INT else isinstance(value, (int, float))


def _rows(folder: str, name: str) -> list[dict[str, Any]]:
    path = os.path.join(folder, f"{name}.parquet")
    if not os.path.exists(path):
        if os.path.exists(os.path.join(folder, f"{name}.csv")):
            raise invalid_param(
                f"{folder} has {name}.csv but no {name}.parquet: the sweep ran without pyarrow; "
                "install npumem[sweep] and run it again (its cells are cached)"
            )
        return []
    pq = require("pyarrow.parquet", "reading the sweep's tables for the report")
    try:
        table = pq.read_table(path)
    except Exception as e:  # pyarrow's ArrowInvalid and friends: not a Parquet file
        raise invalid_param(f"{path}: not a Parquet table ({e})") from None
    missing = _COLUMNS[name] - set(table.column_names)
    if missing:
        raise invalid_param(f"{path}: not a sweep's {name} table (no column {', '.join(sorted(missing))})")
    rows = table.to_pylist()
    for i, row in enumerate(rows):
        for col in sorted(_COLUMNS[name]):
            if not _check_kind(row[col], _KINDS[col]):
                raise invalid_param(f"{path}: row {i}: {col} is {_args.show(row[col])}, not {_KINDS[col]}")
    return rows


#: The manifest's fields the report shows, and what each must be when present.
_MANIFEST = {"name": (str,), "cells": (int,), "computed": (int,), "cached": (int,), "seconds": (int, float)}
_MANIFEST |= {"failed": (dict,), "versions": (dict,)}


def _check_manifest(manifest: Any, path: str) -> dict[str, Any]:
    if not isinstance(manifest, dict):
        raise invalid_param(f"{path}: not a sweep manifest (a JSON object), got {_args.show(manifest)}")
    for key, kinds in _MANIFEST.items():
        v = manifest.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, kinds)):
            want = " or ".join(k.__name__ for k in kinds)
            raise invalid_param(f"{path}: {key} is {_args.show(v)}, not {want}")
    for key in ("failed", "versions"):
        for k, v in (manifest.get(key) or {}).items():
            if not isinstance(v, str):
                raise invalid_param(f"{path}: {key}[{k!r}] is {_args.show(v)}, not a string")
    return manifest


def load(folder: Any) -> dict[str, Any]:
    """The results of a sweep folder: ``manifest`` (sweep.json), ``tlb``, ``alloc`` and
    ``timelines`` rows."""
    folder = _files.path_arg(folder, "dir")
    manifest_path = os.path.join(folder, "sweep.json")
    if not os.path.exists(manifest_path):
        raise invalid_param(f"{folder}: no sweep.json; give a folder written by npumem sweep --out")
    manifest = _check_manifest(_files.read_json(manifest_path, "a sweep manifest (sweep.json)"), manifest_path)
    return {"manifest": manifest, **{n: _rows(folder, n) for n in ("tlb", "alloc", "timelines")}}


# -- plots -----------------------------------------------------------------------------------------


class _Plots:
    """Draws figures into PNG data URIs; without matplotlib, each plot is a note and the hint
    is kept."""

    def __init__(self) -> None:
        try:
            self.mpl = require("matplotlib", "the report's plots (the tables are written)")
            self.mpl.use("Agg")
            self.missing: str | None = None
        except MissingDependencyError as e:
            self.mpl, self.missing = None, str(e)

    def figure(self, draw: Callable[[Any], None], rows: int, cols: int, w: float, h: float, title: str) -> str:
        if self.mpl is None:
            return f'<p class="note">[{html.escape(title)}: no plot, {html.escape(self.missing or "")}]</p>'
        import matplotlib.pyplot as plt
        from matplotlib.ticker import NullLocator

        fig, axes = plt.subplots(rows, cols, figsize=(w * cols, h * rows), squeeze=False, layout="constrained")
        draw(axes)
        for ax in axes.flat:  # symlog and log minor ticks are most of the drawing time
            ax.xaxis.set_minor_locator(NullLocator())
            ax.yaxis.set_minor_locator(NullLocator())
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=80)
        plt.close(fig)
        data = base64.b64encode(buf.getvalue()).decode("ascii")
        return f'<img alt="{html.escape(title)}" src="data:image/png;base64,{data}">'


def _mean(values: Iterable[float]) -> float:
    v = list(values)
    return sum(v) / len(v) if v else float("nan")


def _pages(rows: Iterable[dict[str, Any]]) -> list[str]:
    got = {r["page"] for r in rows}
    return [p for p in PAGES if p in got] + sorted(got - set(PAGES))


def _grid_plot(
    plots: _Plots, tlb: list[dict[str, Any]], y: Callable[[dict[str, Any]], float], ylabel: str, title: str
) -> str:
    """One panel per (pattern, preset), one line per page size: y (mean over seeds) against footprint."""
    patterns = sorted({r["pattern"] for r in tlb})
    presets = sorted({r["preset"] for r in tlb})
    pages = _pages(tlb)
    series: dict[tuple[str, str, str], dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in tlb:
        series[r["pattern"], r["preset"], r["page"]][r["footprint"]].append(y(r))

    def draw(axes: Any) -> None:
        for i, pattern in enumerate(patterns):
            for j, preset in enumerate(presets):
                ax = axes[i][j]
                for page in pages:
                    pts = sorted(series[pattern, preset, page].items())
                    if pts:
                        ax.plot([f / (1 << 20) for f, _ in pts], [_mean(v) for _, v in pts], marker="o", label=page)
                ax.set_xscale("log")
                ax.set_yscale("symlog", linthresh=0.01)
                ax.set_ylim(bottom=0)
                ax.set_title(f"{pattern} / {preset}", fontsize=9)
                ax.set_xlabel("footprint (MiB)", fontsize=8)
                ax.set_ylabel(ylabel, fontsize=8)
                ax.tick_params(labelsize=7)
                ax.grid(alpha=0.3)
                ax.legend(fontsize=7)

    return plots.figure(draw, len(patterns), len(presets), 3.6, 2.7, title)


def _waste_plot(plots: _Plots, tlb: list[dict[str, Any]]) -> str:
    patterns = sorted({r["pattern"] for r in tlb})
    presets = sorted({r["preset"] for r in tlb})

    def draw(axes: Any) -> None:
        for i, pattern in enumerate(patterns):
            for j, preset in enumerate(presets):
                ax = axes[i][j]
                for page in _pages(tlb):
                    sel = [r for r in tlb if (r["pattern"], r["preset"], r["page"]) == (pattern, preset, page)]
                    ax.scatter(
                        [max(r["internal_waste"], 1) for r in sel],
                        [r["cycles_per_access"] for r in sel],
                        s=14,
                        label=page,
                    )
                ax.set_xscale("log")
                ax.set_yscale("symlog", linthresh=0.01)
                ax.set_title(f"{pattern} / {preset}", fontsize=9)
                ax.set_xlabel("internal waste of the mapping (B)", fontsize=8)
                ax.set_ylabel("cycles per access", fontsize=8)
                ax.tick_params(labelsize=7)
                ax.grid(alpha=0.3)
                ax.legend(fontsize=7)

    return plots.figure(draw, len(patterns), len(presets), 3.6, 2.7, "cycles per access vs internal waste")


def _label(r: dict[str, Any]) -> str:
    return r["allocator"] + (f" [{r['alloc_conf']}]" if r["alloc_conf"] else "")


def _capacity_plot(plots: _Plots, alloc: list[dict[str, Any]]) -> str:
    mins = [r for r in alloc if r["capacity_spec"] == "min"]
    workloads = list(dict.fromkeys(r["workload"] for r in mins))
    labels = list(dict.fromkeys(_label(r) for r in mins))
    value = {(r["workload"], _label(r)): r["capacity_vs_live"] for r in mins}

    def draw(axes: Any) -> None:
        ax = axes[0][0]
        width = 0.8 / max(len(labels), 1)
        for k, label in enumerate(labels):
            xs = [i + k * width for i, w in enumerate(workloads) if (w, label) in value]
            ys = [value[w, label] for w in workloads if (w, label) in value]
            ax.bar(xs, [y - 1 for y in ys], width, bottom=1, label=label)
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(workloads))], workloads, fontsize=8)
        ax.axhline(1, color="k", lw=0.8)
        ax.set_ylabel("min capacity / peak live bytes")
        ax.set_ylim(bottom=min([1.0, *value.values()]) - 0.01)
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=7, ncol=2)

    return plots.figure(draw, 1, 1, max(7.0, 1.6 * len(workloads) + 2), 4.0, "min capacity per allocator per workload")


def _timeline_plot(plots: _Plots, timelines: list[dict[str, Any]]) -> str:
    runs: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for p in timelines:
        runs[p["workload"], p["capacity_spec"]].append(p)
    keys = list(runs)  # grid order: workloads, then capacities as the config lists them

    def draw(axes: Any) -> None:
        for ax, key in zip((row[0] for row in axes), keys, strict=True):
            by: dict[str, list[dict[str, Any]]] = defaultdict(list)
            for p in runs[key]:
                by[_label(p)].append(p)
            live_drawn = False
            for label, pts in by.items():
                pts.sort(key=lambda p: p["event"])
                ax.plot(
                    [p["event"] for p in pts], [p["reserved"] / (1 << 20) for p in pts], lw=1, label=f"{label} reserved"
                )
                if not live_drawn:
                    ax.plot(
                        [p["event"] for p in pts],
                        [p["live"] / (1 << 20) for p in pts],
                        "k--",
                        lw=1,
                        label="live (requested)",
                    )
                    live_drawn = True
            ax.set_title(f"{key[0]}, capacity {key[1]}", fontsize=9)
            ax.set_xlabel("event", fontsize=8)
            ax.set_ylabel("MiB", fontsize=8)
            ax.tick_params(labelsize=7)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=6, ncol=2)

    return plots.figure(draw, len(keys), 1, 11.0, 2.8, "reserved bytes over the replay")


# -- tables ----------------------------------------------------------------------------------------


def _cell(v: Any, key: str = "") -> str:
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v + 0.0:.4g}"  # + 0.0: no "-0"
    if isinstance(v, int) and key in {"footprint", "capacity", "peak_live", "peak_allocated", "peak_reserved"}:
        return fmt(v)
    return html.escape(str(v))


def _table(rows: Sequence[dict[str, Any]], columns: Sequence[str] | None = None, left: int = 1) -> str:
    if not rows:
        return '<p class="note">(no rows)</p>'
    cols = list(columns or [k for k in rows[0] if k != "cell"])
    head = "".join(f'<th class="{"l" if i < left else ""}">{html.escape(c)}</th>' for i, c in enumerate(cols))
    body = "".join(
        "<tr>"
        + "".join(f'<td class="{"l" if i < left else ""}">{_cell(r.get(c, ""), c)}</td>' for i, c in enumerate(cols))
        + "</tr>"
        for r in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


# -- the page-size study ---------------------------------------------------------------------------


def study(tlb: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """For each (pattern, preset, footprint) of the study's patterns: translation cycles per access
    and internal waste per page size (means over seeds), the page sizes that do as well as the
    best (within TIE or TIE_CYCLES of its cycles) and the winner, the smallest of those (larger
    pages only waste more memory once translation costs next to nothing)."""
    acc: dict[tuple[str, str, int], dict[str, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for r in tlb:
        if r["pattern"] in STUDY_PATTERNS:
            acc[r["pattern"], r["preset"], r["footprint"]][r["page"]].append(r)
    out = []
    order = list(STUDY_PATTERNS)
    for (pattern, preset, footprint), per in sorted(acc.items(), key=lambda kv: (order.index(kv[0][0]), kv[0][1:])):
        pages = _pages([{"page": p} for p in per])
        cycles = {p: _mean(r["cycles_per_access"] for r in per[p]) for p in pages}
        waste = {p: _mean(r["internal_waste"] for r in per[p]) for p in pages}
        good = _as_good(cycles)
        out.append(
            {
                "pattern": pattern,
                "preset": preset,
                "footprint": footprint,
                "cycles": cycles,
                "waste": waste,
                "as_good": good,
                "winner": good[0],
            }
        )
    return out


def answer(tlb: list[dict[str, Any]]) -> str:
    """The study's answer in one paragraph: per pattern and preset, from which footprint a page
    larger than 4 KiB wins, and, for presets that model a guest over small host pages, that the
    host's pages limit the gain (an entry maps the host's page whatever the guest maps)."""
    from .device import Device
    from .errors import AclError
    from .tlb import Tlb

    rows = study(tlb)
    if not rows:
        return ""
    said = []
    for pattern in STUDY_PATTERNS:
        for preset in sorted({r["preset"] for r in rows if r["pattern"] == pattern}):
            runs = [r for r in rows if (r["pattern"], r["preset"]) == (pattern, preset)]
            big = next((r for r in runs if r["winner"] != "4KiB"), None)
            said.append(
                f"{pattern} on {preset}: "
                + (f"{big['winner']} from {fmt(big['footprint'])}" if big else "4 KiB pages at every footprint")
            )
    limited = []
    for preset in sorted({r["preset"] for r in rows}):
        try:
            host = Tlb.preset(preset, Device("64MiB")).config["host"]
        except AclError:  # a preset this build does not know: nothing to say of its host
            continue
        if host and host["page_size"] < (2 << 20):
            limited.append(f"{preset} (host {fmt(host['page_size'])} pages)")
    text = "Which page size wins: " + "; ".join(said) + "."
    if limited:
        text += (
            " The host's pages limit the gain for "
            + ", ".join(limited)
            + ": a guest's huge page is cached as the host's small pages, so it only shortens the walk."
        )
    else:
        text += " No preset here models a guest over small host pages, so nothing limits the gain but the TLB."
    return text


def _as_good(cycles: dict[str, float]) -> list[str]:
    """The page sizes (in size order) whose cycles are within TIE or TIE_CYCLES of the best."""
    pages = _pages([{"page": p} for p in cycles])
    best = min(cycles.values())
    return [p for p in pages if cycles[p] <= max(best * (1 + TIE), best + TIE_CYCLES)]


def _study_html(tlb: list[dict[str, Any]], host: dict[str, Any] | None, host_source: str) -> str:
    rows = study(tlb)
    if not rows:
        return '<p class="note">The sweep has none of the study\'s patterns (gemm, conv, gather) in a [tlb] grid.</p>'
    parts = [
        f"<p><b>{html.escape(answer(tlb))}</b></p>",
        "<p>Translation cycles per access in the TLB model for each page size, and the internal waste of "
        "mapping the footprint with it. The winner, highlighted, is the smallest page size whose cycles are "
        f"within {100 * TIE:.0f}% or {TIE_CYCLES} cycles per access of the best: beyond that point a larger "
        "page only wastes more memory.</p>",
    ]
    for pattern, title in STUDY_PATTERNS.items():
        sel = [r for r in rows if r["pattern"] == pattern]
        if not sel:
            continue
        pages = _pages([{"page": p} for r in sel for p in r["cycles"]])
        presets = sorted({r["preset"] for r in sel})
        parts.append(f"<h3>{html.escape(title)}</h3>")
        summary = []
        for preset in presets:
            runs = [r for r in sel if r["preset"] == preset]
            spans: list[tuple[str, int, int]] = []
            for r in runs:
                w = r["winner"]
                if spans and spans[-1][0] == w:
                    spans[-1] = (w, spans[-1][1], r["footprint"])
                else:
                    spans.append((w, r["footprint"], r["footprint"]))
            said = "; ".join(f"{w} at {fmt(a)}" + (f" to {fmt(b)}" if b != a else "") for w, a, b in spans)
            summary.append(f"<li><b>{html.escape(preset)}</b>: {html.escape(said)}</li>")
        parts.append("<ul>" + "".join(summary) + "</ul>")
        head = "<tr><th>footprint</th>" + "".join(
            f'<th colspan="{len(pages)}">{html.escape(p)}: cycles/access</th>' for p in presets
        )
        head += f'<th colspan="{len(pages)}">internal waste</th>'
        head += "</tr><tr><th></th>" + "".join(f"<th>{html.escape(pg)}</th>" for _ in [*presets, 0] for pg in pages)
        head += "</tr>"
        body = []
        for fp in sorted({r["footprint"] for r in sel}):
            cells = [f"<td>{fmt(fp)}</td>"]
            for preset in presets:
                r = next((x for x in sel if x["preset"] == preset and x["footprint"] == fp), None)
                for pg in pages:
                    c = r["cycles"].get(pg) if r else None
                    cls = ' class="win"' if r and pg == r["winner"] else ""
                    cells.append(f"<td{cls}>{'' if c is None else f'{c:.3f}'}</td>")
            waste = next(x["waste"] for x in sel if x["footprint"] == fp)
            cells += [f"<td>{fmt(int(waste[pg])) if pg in waste else ''}</td>" for pg in pages]
            body.append("<tr>" + "".join(cells) + "</tr>")
        parts.append(f"<table>{head}{''.join(body)}</table>")
        parts.append(_host_pattern_html(host, pattern, sel, presets))
    parts.append(_host_html(host, host_source))
    return "\n".join(parts)


#: The page sizes the host measurement compares (bench_pagesize.py: 4 KiB against 2 MiB pages).
HOST_PAGES = ("4KiB", "2MiB")


def host_study(host: dict[str, Any] | None, pattern: str, sel: list[dict[str, Any]], presets: list[str]) -> list:
    """The host's rows for ``pattern`` (``benches/bench_pagesize.py --json``: ``patterns``), each
    with ``model winner (PRESET)`` added for every preset of the sweep that has the footprint:
    the model's winner between the two page sizes the host compares (the study's rule)."""
    rows = [r for r in (host or {}).get("patterns", []) if isinstance(r, dict) and r.get("pattern") == pattern]
    out = []
    for r in sorted(rows, key=lambda r: r.get("footprint", 0)):
        row = {k: v for k, v in r.items() if k != "pattern"}
        for preset in presets:
            m = next((x for x in sel if x["preset"] == preset and x["footprint"] == r.get("footprint")), None)
            pair = {p: c for p, c in (m["cycles"] if m else {}).items() if p in HOST_PAGES}
            row[f"model winner ({preset})"] = _as_good(pair)[0] if len(pair) == len(HOST_PAGES) else ""
        out.append(row)
    return out


def _host_pattern_html(host: dict[str, Any] | None, pattern: str, sel: list[dict[str, Any]], presets: list[str]) -> str:
    rows = host_study(host, pattern, sel, presets)
    if not rows:
        return ""
    return (
        "<p><b>On this machine</b> (host backend, 4 KiB against 2 MiB pages: <code>make bench B=pagesize</code>): "
        "ns per access of the same pattern read from real memory, the page size that wins there (the smallest "
        f"within {100 * TIE:.0f}% of the best time), the sweep's winner between the same two page sizes for each "
        "preset at that footprint, and the host preset's predicted saving (translation cycles, as published and "
        "calibrated to the machine's pointer chase). The reads are independent loads, so the CPU overlaps "
        "their misses and walks; in a virtual machine each walk is two-dimensional (guest and host tables), "
        "which the model does not represent, so a walk that misses the caches costs far more than it "
        "predicts.</p>" + _table(rows, left=0)
    )


def _host_html(host: dict[str, Any] | None, source: str) -> str:
    if host is None:
        return (
            '<p class="note">No host measurement given: <code>make bench B=pagesize</code> measures 4 KiB against '
            "2 MiB pages on this machine's memory (a pointer chase, tiled GEMMs and the study's patterns) and writes "
            "<code>target/bench-pagesize.json</code>; pass it with <code>npumem report DIR --host-pagesize "
            "target/bench-pagesize.json</code> to set it beside the model here.</p>"
        )
    p = [
        f"<h3>Host measurement ({html.escape(source)})</h3>",
        f"<p>{html.escape(str(host.get('cpu', '')))}; 4 KiB side: {html.escape(str(host.get('small', '')))}; "
        f"2 MiB side: {html.escape(str(host.get('big', '')))}. Model columns: the "
        f"<code>{html.escape(str(host.get('preset', '')))}</code> preset as published and calibrated to this "
        "machine, on the same addresses. GEMM tiles, conv windows and Zipf gathers as the sweep models them: "
        f"beside each pattern's table above.{_load(host)}</p>",
    ]
    if host.get("gemm"):
        p.append("<p><b>GEMM tiles</b>: time saved by 2 MiB pages, measured and predicted.</p>")
        p.append(_table(host["gemm"], left=2))
    if host.get("chase"):
        p.append("<p><b>Pointer chase</b> (one line per 4 KiB page): ns per dependent load.</p>")
        p.append(_table(host["chase"]))
    return "\n".join(p)


def _load(host: dict[str, Any]) -> str:
    load = host.get("loadavg")
    if not isinstance(load, list) or not load:
        return ""
    return (
        f" Load average when the run ended: {html.escape(' / '.join(str(x) for x in load))} (1 / 5 / 15 min); "
        "on a busy machine the measurements are noisy (compare the paired rounds' ranges)."
    )


def _read_host(path: str | None) -> dict[str, Any] | None:
    if path is None:
        return None
    doc = _files.read_json(path, "host page-size measurements (benches/bench_pagesize.py --json)")
    if (
        not isinstance(doc, dict)
        or not isinstance(doc.get("chase", []), list)
        or not isinstance(doc.get("gemm", []), list)
        or not isinstance(doc.get("patterns", []), list)
    ):
        raise invalid_param(f"{path}: not the JSON benches/bench_pagesize.py --json writes")
    return doc


# -- the document ----------------------------------------------------------------------------------


def render(
    results: dict[str, Any], *, host: dict[str, Any] | None = None, host_source: str = "", command: str = ""
) -> tuple[str, list[str]]:
    """The HTML of the report, and the hints for missing optional dependencies."""
    m = results["manifest"]
    tlb, alloc, timelines = results["tlb"], results["alloc"], results["timelines"]
    plots = _Plots()
    title = m.get("name") or "npumem sweep"
    body = [f"<h1>{html.escape(title)}</h1>"]
    body.append(
        f"<p>{m.get('cells', '?')} cells ({m.get('computed', '?')} computed, {m.get('cached', '?')} from the cache, "
        f"{len(m.get('failed', {}))} failed) on {html.escape(str(m.get('cluster', '?')))}, "
        f"{m.get('seconds', 0):.1f} s, finished {html.escape(str(m.get('finished', '')))}.</p>"
    )
    lead = answer(tlb) if tlb else ""
    if lead:
        body.append(f'<p class="lead"><b>{html.escape(lead)}</b></p>')
    if tlb:
        body.append("<h2>TLB model</h2>")
        body.append("<h3>Page walks per 1000 accesses vs footprint</h3>")
        body.append(
            _grid_plot(
                plots, tlb, lambda r: 1000 * r["walks"] / max(r["accesses"], 1), "walks / 1000 acc", "walks per access"
            )
        )
        body.append("<h3>Translation cycles per access vs footprint</h3>")
        body.append(_grid_plot(plots, tlb, lambda r: r["cycles_per_access"], "cycles / access", "cycles per access"))
        body.append("<h3>Cycles per access vs internal waste</h3>")
        body.append(
            "<p>Each point is one (page size, footprint): larger pages cut translation cycles and waste the tail "
            "of their last page.</p>"
        )
        body.append(_waste_plot(plots, tlb))
        body.append("<h2>Page-size study: which page size wins at which footprint</h2>")
        body.append(_study_html(tlb, host, host_source))
    if alloc:
        body.append("<h2>Allocators</h2>")
        if any(r["capacity_spec"] == "min" for r in alloc):
            body.append("<h3>Minimum capacity per allocator per workload</h3>")
            body.append(_capacity_plot(plots, alloc))
            mins = [r for r in alloc if r["capacity_spec"] == "min"]
            body.append(
                _table(
                    mins,
                    [
                        "workload",
                        "allocator",
                        "alloc_conf",
                        "peak_live",
                        "capacity",
                        "capacity_vs_live",
                        "peak_reserved",
                        "physical_allocs",
                        "cache_hit_rate",
                    ],
                    left=3,
                )
            )
        if timelines:
            body.append("<h3>Timelines: reserved bytes over each replay</h3>")
            body.append(_timeline_plot(plots, timelines))
    body.append("<h2>Tables</h2>")
    if tlb:
        body.append(f"<details><summary>TLB cells ({len(tlb)} rows)</summary>{_table(tlb, left=3)}</details>")
    if alloc:
        body.append(f"<details><summary>Allocator cells ({len(alloc)} rows)</summary>{_table(alloc, left=4)}</details>")
    if m.get("failed"):
        body.append(
            "<h3>Failed cells</h3>"
            + _table([{"cell": k, "error": v} for k, v in m["failed"].items()], ["cell", "error"], left=2)
        )
    body.append("<h2>How these results were made</h2>")
    body.append(f"<p>Sweep:</p><pre>{html.escape(str(m.get('command', '')))}</pre>")
    if command:
        body.append(f"<p>This report:</p><pre>{html.escape(command)}</pre>")
    where = html.escape(str(m.get("config_path") or ""))
    body.append(f"<p>Config ({where}):</p><pre>{html.escape(str(m.get('config', '')))}</pre>")
    versions = m.get("versions", {})
    body.append(_table([{"component": k, "version": v} for k, v in versions.items()], ["component", "version"], left=2))
    body.append(f'<p class="note">Report made {html.escape(time.strftime("%Y-%m-%d %H:%M:%S %Z"))}.</p>')
    doc = (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{html.escape(title)}</title><style>{_CSS}</style></head><body>\n"
        + "\n".join(body)
        + "\n</body></html>\n"
    )
    return doc, [plots.missing] if plots.missing else []


def write(folder: Any, out: Any, *, host_pagesize: Any = None, command: str = "") -> list[str]:
    """Writes the report of the sweep folder ``folder`` to ``out``; returns the hints for missing
    optional dependencies (empty when every plot was drawn). ``host_pagesize``: the JSON of
    ``benches/bench_pagesize.py --json`` (default: ``folder/host_pagesize.json`` when present)."""
    results = load(folder)
    out = _files.path_arg(out, "out")
    if host_pagesize is None:
        default = os.path.join(_files.path_arg(folder, "dir"), "host_pagesize.json")
        host_pagesize = default if os.path.exists(default) else None
    source = None if host_pagesize is None else _files.path_arg(host_pagesize, "host_pagesize")
    host = _read_host(source)
    doc, missing = render(results, host=host, host_source=source or "", command=command)
    tmp = f"{out}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(doc)
    os.replace(tmp, out)
    return missing


__all__ = ["STUDY_PATTERNS", "host_study", "load", "render", "study", "write"]
