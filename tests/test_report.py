"""npumem report: one self-contained HTML file from a sweep folder, rendered in headless Chromium."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess

import numpy as np
import pytest
from conftest import missing_tool

import npumem
from npumem import report, sweep
from npumem.cli import main

pytest.importorskip("pyarrow")
pytest.importorskip("matplotlib")

TRACE = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "benches", "traces", "torch_cpu_convnet.json.gz"))

CONFIG = {
    "name": "report test",
    "tlb": {
        "presets": ["zen4"],
        "pages": ["4KiB", "2MiB"],
        "patterns": ["gemm", "conv", "gather"],
        "footprints": ["1MiB", "8MiB"],
        "accesses": 20_000,
    },
    "alloc": {
        "allocators": ["pytorch", "npumem"],
        "capacities": ["min"],
        "granularity": "1MiB",
        "workloads": {
            "churn": {"generator": "random_churn", "events": 300, "seed": 2},
            "convnet": {"trace": TRACE},
        },
    },
}

HOST = {
    "cpu": "test CPU",
    "preset": "skylake",
    "small": "4 KiB",
    "big": "2 MiB hugetlb",
    "chase": [{"footprint": 1 << 20, "4K ns": 4.0, "2M ns": 3.9}],
    "gemm": [{"n": 1024, "kernel": "gemm_tiled", "4K ms": 165.5, "2M ms": 164.3, "saved (best)": "+0.8%"}],
    # As benches/bench_pagesize.py --json writes the study patterns (measure_study).
    "patterns": [
        {"pattern": pat, "footprint": fp << 20, "accesses": 20_000, "4K ns": ns4, "2M ns": 1.25}
        | {"4K-2M ns": ns4 - 1.25, "host winner": "2MiB" if ns4 > 1.32 else "4KiB", "skylake 4K-2M ns": 0.5}
        for pat in ("conv", "gather")
        for fp, ns4 in ((1, 1.3), (8, 2.5))
    ],
}


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    out = tmp_path_factory.mktemp("sweep") / "out"
    sweep.run(CONFIG, str(out), workers=0, progress=False, command="npumem sweep test.toml --out out")
    return out


@pytest.fixture(scope="module")
def page(swept, tmp_path_factory):
    html_path = tmp_path_factory.mktemp("report") / "report.html"
    host = swept / "host_pagesize.json"
    host.write_text(json.dumps(HOST))
    assert main(["report", str(swept), "--out", str(html_path)]) == 0
    return html_path, html_path.read_text()


def test_report_is_one_self_contained_file(page):
    _, text = page
    assert text.startswith("<!DOCTYPE html>")
    # Nothing outside the file: every src is a data: URI, no link, script or external URL.
    srcs = re.findall(r'src="([^"]*)"', text)
    assert len(srcs) >= 5 and all(s.startswith("data:image/png;base64,") for s in srcs)
    assert not re.search(r"<(script|link|iframe)\b", text)
    assert not re.search(r"(?:href|src)=\"(?:https?:)?//", text)
    assert "url(" not in text


def test_report_holds_the_study_tables_commands_and_versions(page):
    _, text = page
    for words in (
        "Page walks per 1000 accesses",
        "Cycles per access vs internal waste",
        "GEMM tiles",
        "conv 3x3 windows",
        "Zipf(1.2) gather",
        "Minimum capacity per allocator per workload",
        "Timelines",
        "npumem sweep test.toml --out out",  # the sweep's command
        "npumem report",  # this report's
        f'<td class="l">npumem</td><td class="l">{npumem.__version__}</td>',
        "Host measurement",
        "gemm_tiled",
    ):
        assert words in text, words
    # Every TLB cell is in the table.
    assert text.count("<tr>") >= 12 + 4


def test_study_sets_the_host_measurements_beside_the_model(page, swept):
    _, text = page
    # Each study pattern the host measured has its table after the model's, before the next pattern.
    conv = text.index("conv 3x3 windows")
    gather = text.index("Zipf(1.2) gather", conv)
    assert text.count("On this machine") == 2
    assert conv < text.index("On this machine", conv) < gather < text.index("On this machine", gather)
    assert "model winner (zen4)" in text and "host winner" in text
    results = report.load(str(swept))
    sel = [r for r in report.study(results["tlb"]) if r["pattern"] == "gather"]
    rows = report.host_study(HOST, "gather", sel, ["zen4", "absent"])
    assert [r["footprint"] for r in rows] == [1 << 20, 8 << 20]
    assert [r["host winner"] for r in rows] == ["4KiB", "2MiB"]
    for r in rows:
        m = next(x for x in sel if x["footprint"] == r["footprint"])
        pair = {p: m["cycles"][p] for p in ("4KiB", "2MiB")}
        want = "4KiB" if pair["4KiB"] <= max(pair["2MiB"] * 1.05, pair["2MiB"] + 0.05) else "2MiB"
        assert r["model winner (zen4)"] == want
        assert r["model winner (absent)"] == ""  # a preset the sweep did not run
    assert report.host_study(None, "gather", sel, ["zen4"]) == []
    assert report.host_study(HOST, "gemm", sel, ["zen4"]) == []


def test_host_json_without_pattern_rows_is_refused(tmp_path):
    bad = tmp_path / "h.json"
    bad.write_text(json.dumps(HOST | {"patterns": {"conv": 1}}))
    with pytest.raises(npumem.InvalidParamError, match="not the JSON"):
        report._read_host(str(bad))


def test_study_winner_is_the_smallest_page_that_does_as_well_as_the_best():
    rows = [
        {"pattern": "gemm", "preset": "p", "footprint": 1, "page": pg, "cycles_per_access": c, "internal_waste": 0}
        for pg, c in (("4KiB", 3.0), ("2MiB", 0.010), ("1GiB", 0.001))
    ]
    (r,) = report.study(rows)
    assert r["winner"] == "2MiB" and r["as_good"] == ["2MiB", "1GiB"]
    rows[1]["cycles_per_access"] = 0.5  # 2 MiB pages now cost half a cycle: 1 GiB wins
    assert report.study(rows)[0]["winner"] == "1GiB"


def test_missing_matplotlib_keeps_the_tables_and_exits_3(swept, tmp_path):
    code = (
        "import sys; sys.modules['matplotlib'] = None\n"
        "from npumem.cli import main\n"
        f"sys.exit(main(['report', {str(swept)!r}, '--out', {str(tmp_path / 'r.html')!r}]))"
    )
    import sys

    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 3, p.stderr
    assert p.stderr.count("\n") == 1 and "npumem[" in p.stderr
    text = (tmp_path / "r.html").read_text()
    assert "<img" not in text and "no plot" in text and "Allocator cells" in text


def test_report_of_a_folder_without_a_sweep_is_exit_2(tmp_path, capsys):
    assert main(["report", str(tmp_path), "--out", str(tmp_path / "r.html")]) == 2
    assert "sweep.json" in capsys.readouterr().err
    assert not (tmp_path / "r.html").exists()


def _browser() -> str | None:
    return next((b for b in ("chromium", "chromium-browser", "google-chrome") if shutil.which(b)), None)


def test_report_renders_in_headless_chromium(page, tmp_path):
    """The report in a real browser, offline: every <img> decodes (a marker set by a script in a
    copy of the page once all images are complete) and the screenshot is not blank."""
    browser = _browser()
    if browser is None:
        missing_tool("no headless browser: install Debian's chromium package (apt-get install chromium)")
    path, text = page
    probe = tmp_path / "probe.html"
    script = (
        "<script>window.addEventListener('load',()=>{const im=[...document.images];"
        "const ok=im.filter(i=>i.complete&&i.naturalWidth>0).length;"
        "document.body.setAttribute('data-images',ok+'/'+im.length);});</script>"
    )
    probe.write_text(text.replace("</body>", script + "</body>"))
    flags = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", f"--user-data-dir={tmp_path}/p"]
    flags.append("--virtual-time-budget=10000")
    dom = subprocess.run([*flags, "--dump-dom", probe.as_uri()], capture_output=True, text=True, timeout=120)
    found = re.search(r'data-images="(\d+)/(\d+)"', dom.stdout)
    assert found, dom.stderr[-2000:]
    assert int(found[2]) >= 5 and found[1] == found[2], f"{found[1]} of {found[2]} images loaded"

    shot = tmp_path / "shot.png"
    subprocess.run(
        [*flags, "--hide-scrollbars", "--window-size=1200,2400", f"--screenshot={shot}", path.as_uri()],
        capture_output=True,
        timeout=120,
    )
    from PIL import Image

    pixels = np.asarray(Image.open(shot).convert("L"), dtype=np.float64)
    assert pixels.shape == (2400, 1200)
    assert pixels.std() > 20, "the screenshot is blank"
    assert (pixels < 128).mean() > 0.01  # text and plot lines, not an empty page


def test_a_table_that_is_not_the_sweeps_is_exit_2(swept, tmp_path, capsys):
    bad = tmp_path / "bad"
    shutil.copytree(swept, bad)
    (bad / "alloc.parquet").write_bytes(b"not parquet")
    assert main(["report", str(bad), "--out", str(tmp_path / "r.html")]) == 2
    assert "not a Parquet table" in capsys.readouterr().err
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"x": [1]}), bad / "alloc.parquet")
    assert main(["report", str(bad), "--out", str(tmp_path / "r.html")]) == 2
    assert "no column" in capsys.readouterr().err
    (bad / "alloc.parquet").unlink()
    assert main(["report", str(bad), "--out", str(tmp_path / "r.html")]) == 2  # alloc.csv alone
    assert "ran without pyarrow" in capsys.readouterr().err
    assert not (tmp_path / "r.html").exists()


def test_the_report_leads_with_the_answer(page):
    _, text = page
    lead = text.index("Which page size wins:")
    assert lead < text.index("<h2>TLB model")
    assert "gemm on " in text[lead : lead + 2000]


def test_the_answer_says_when_the_host_limits_the_gain():
    from npumem.report import answer

    rows = [
        {
            "preset": p,
            "page": page,
            "pattern": "gemm",
            "footprint": 64 << 20,
            "cycles_per_access": c,
            "internal_waste": 0,
        }
        for p in ("zen4", "zen4_kvm")
        for page, c in (("4KiB", 2.0), ("2MiB", 0.1 if p == "zen4" else 1.99))
    ]
    text = answer(rows)
    assert "gemm on zen4: 2MiB from 64MiB" in text, text
    assert "gemm on zen4_kvm: 4 KiB pages at every footprint" in text, text
    assert "limit the gain for zen4_kvm (host 4KiB pages)" in text, text
