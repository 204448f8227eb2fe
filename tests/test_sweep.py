"""Sweeps on Dask (npumem.sweep, npumem sweep): the grid, the cache, a worker killed mid-sweep,
and the command line's errors and hints."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import npumem
from npumem import sweep
from npumem.cli import main

pq = pytest.importorskip("pyarrow.parquet")

TRACES = os.path.join(os.path.dirname(__file__), "..", "benches", "traces")


def tlb_config(footprints=("1MiB", "4MiB"), accesses=60_000):
    return {
        "name": "tiny",
        "tlb": {
            "presets": ["zen4"],
            "pages": ["4KiB", "2MiB"],
            "patterns": ["gemm", "gather", "uniform"],
            "footprints": list(footprints),
            "accesses": accesses,
        },
    }


def alloc_config():
    return {
        "alloc": {
            "allocators": ["direct", "pytorch", "npumem"],
            "alloc_conf": {"pytorch": ["", "max_split_size_mb:64"]},
            "capacities": ["min", "1.25x"],
            "granularity": "1MiB",
            "workloads": {
                "churn": {"generator": "random_churn", "events": 400, "seed": 3},
                "convnet": {"trace": os.path.abspath(os.path.join(TRACES, "torch_cpu_convnet.json.gz"))},
            },
        }
    }


def table(out, name):
    return pq.read_table(os.path.join(out, f"{name}.parquet")).to_pylist()


# -- the grid and its keys (no cluster) --------------------------------------------------------


def test_grid_expands_every_combination_once_with_stable_keys():
    cells = sweep.expand(tlb_config())
    assert len(cells) == 1 * 2 * 3 * 2
    assert len({c.key for c in cells}) == len(cells)
    assert [c.key for c in sweep.expand(tlb_config())] == [c.key for c in cells]
    # A repeated value is one cell; sizes written either way are the same cell.
    again = sweep.expand(tlb_config(footprints=("1MiB", 1 << 20, "4MiB")))
    assert [c.key for c in again] == [c.key for c in cells]
    # The key covers every parameter and npumem's version.
    p = dict(cells[0].params)
    assert sweep.cell_key("tlb", {**p, "accesses": p["accesses"] + 1}) != cells[0].key
    alloc = sweep.expand(alloc_config())
    # direct takes no settings: one conf; pytorch two; npumem the default.
    assert len(alloc) == 2 * (1 + 2 + 1) * 2


def test_trace_workload_key_is_its_content_not_its_path(tmp_path):
    src = os.path.join(TRACES, "torch_cpu_convnet.json.gz")
    for d in ("a", "b"):
        os.makedirs(tmp_path / d)
        with open(src, "rb") as f, open(tmp_path / d / "t.json.gz", "wb") as g:
            g.write(f.read())
    cfg = {"alloc": {"allocators": ["npumem"], "workloads": {"w": {"trace": "t.json.gz"}}}}
    a = sweep.expand({**cfg, "base": str(tmp_path / "a")})
    b = sweep.expand({**cfg, "base": str(tmp_path / "b")})
    assert [c.key for c in a] == [c.key for c in b]


@pytest.mark.parametrize(
    ("patch", "words"),
    [
        ({"tlb": {"presets": ["nope"], "pages": ["4KiB"], "patterns": ["gemm"], "footprints": ["1MiB"]}}, "nope"),
        ({"tlb": {"presets": ["zen4"], "pages": ["3KiB"], "patterns": ["gemm"], "footprints": ["1MiB"]}}, "3KiB"),
        ({"tlb": {"presets": ["zen4"], "pages": ["4KiB"], "patterns": ["gemm"], "footprints": ["1PiB"]}}, "footprints"),
        ({"tlb": {"presets": ["zen4"], "pages": ["4KiB"], "patterns": ["gemm"], "footprints": []}}, "empty"),
        ({"tlb": {"presets": ["zen4"], "pages": ["4KiB"], "patterns": ["gemm"], "footprints": ["1MiB"], "x": 1}}, "x"),
        (
            {
                "alloc": {
                    "allocators": ["npumem"],
                    "capacities": ["0.5x"],
                    "workloads": {"w": {"generator": "random_churn"}},
                }
            },
            "0.5x",
        ),
        (
            {
                "alloc": {
                    "allocators": ["direct"],
                    "alloc_conf": {"direct": ["max_split_size_mb:64"]},
                    "workloads": {"w": {"generator": "random_churn"}},
                }
            },
            "no settings",
        ),
        (
            {
                "alloc": {
                    "allocators": ["pytorch"],
                    "alloc_conf": ["bogus_key:1"],
                    "workloads": {"w": {"generator": "random_churn"}},
                }
            },
            "bogus_key",
        ),
        (
            {"alloc": {"allocators": ["npumem"], "workloads": {"w": {"generator": "random_churn", "colour": 1}}}},
            "colour",
        ),
        ({"alloc": {"allocators": ["npumem"], "workloads": {"w": {"generator": "nope"}}}}, "nope"),
        ({"alloc": {"allocators": ["npumem"], "workloads": {}}}, "workloads"),
        ({}, "neither"),
    ],
)
def test_bad_configs_are_named_before_anything_runs(patch, words):
    with pytest.raises(npumem.InvalidParamError, match=words):
        sweep.expand(patch)


def test_cli_bad_config_is_one_line_exit_2(tmp_path, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_text("[tlb]\npresets = ['zen4']\npages = ['4KiB']\npatterns = ['nope']\nfootprints = ['1MiB']\n")
    assert main(["sweep", str(bad), "--out", str(tmp_path / "out"), "--workers", "0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "nope" in err
    assert not (tmp_path / "out").exists()  # nothing written for a bad config
    (tmp_path / "broken.toml").write_text("[tlb\n")
    assert main(["sweep", str(tmp_path / "broken.toml"), "--out", str(tmp_path / "o")]) == 2
    assert "not a TOML sweep config" in capsys.readouterr().err


def test_cli_missing_dask_is_a_one_line_hint_exit_3(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        textwrap.dedent("""
        [tlb]
        presets = ["zen4"]
        pages = ["4KiB"]
        patterns = ["uniform"]
        footprints = ["1MiB"]
        accesses = 1000
    """)
    )
    code = (
        "import sys; sys.modules['distributed'] = None\n"
        "from npumem.cli import main\n"
        f"sys.exit(main(['sweep', {str(cfg)!r}, '--out', {str(tmp_path / 'o')!r}]))"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 3, p.stderr
    assert p.stderr.count("\n") == 1 and "pip install 'npumem[sweep]'" in p.stderr and "--workers 0" in p.stderr


# -- running ------------------------------------------------------------------------------------


def test_in_process_sweep_caches_and_recomputes_only_what_changed(tmp_path, capsys):
    out = str(tmp_path / "out")
    cfg = {**tlb_config(), **alloc_config()}
    first = sweep.run(cfg, out, workers=0, progress=False)
    n = len(sweep.expand(cfg))
    assert (first.cells, first.computed, first.cached, first.failed) == (n, n, 0, {})
    rows = table(out, "tlb") + table(out, "alloc")
    assert sorted(r["cell"] for r in rows) == sorted(c.key for c in sweep.expand(cfg))
    alloc = table(out, "alloc")
    for r in alloc:
        assert r["completed"], r  # "min" and 1.25x of peak live both fit
        assert r["capacity"] >= r["peak_live"]
        if r["capacity_spec"] == "min":  # one granule less does not fit (the search's answer)
            assert r["capacity_vs_live"] >= 1.0
    timelines = table(out, "timelines")
    assert {t["cell"] for t in timelines} == {r["cell"] for r in alloc}
    for t in timelines:
        assert t["reserved"] >= t["allocated"] >= t["live"] >= 0
    with open(os.path.join(out, "tlb.csv")) as f:
        assert sum(1 for _ in f) == len(table(out, "tlb")) + 1

    # A rerun computes nothing and writes the same rows.
    before = {r["cell"]: r for r in table(out, "tlb")}
    again = sweep.run(cfg, out, workers=0, progress=False)
    assert (again.computed, again.cached) == (0, n)
    assert {r["cell"]: r for r in table(out, "tlb")} == before
    # One more footprint: only its cells run; the tables hold the new grid exactly.
    bigger = {**cfg, "tlb": {**cfg["tlb"], "footprints": ["1MiB", "4MiB", "8MiB"]}}
    third = sweep.run(bigger, out, workers=0, progress=False)
    assert third.computed == 1 * 2 * 3 and third.cached == n
    assert len(table(out, "tlb")) == 1 * 2 * 3 * 3
    manifest = json.load(open(os.path.join(out, "sweep.json")))
    assert manifest["versions"]["npumem"] == npumem.__version__ and manifest["computed"] == 6


def test_a_torn_cache_file_is_computed_again(tmp_path):
    out = str(tmp_path / "out")
    cfg = tlb_config(footprints=("1MiB",), accesses=5000)
    sweep.run(cfg, out, workers=0, progress=False)
    key = sweep.expand(cfg)[0].key
    with open(os.path.join(out, "cache", f"{key}.json"), "w") as f:
        f.write('{"key": "')
    r = sweep.run(cfg, out, workers=0, progress=False)
    assert r.computed == 1 and len(table(out, "tlb")) == len(sweep.expand(cfg))


def test_progress_reports_every_cell_and_an_eta(tmp_path):
    seen = []
    cfg = tlb_config(footprints=("1MiB",), accesses=5000)
    sweep.run(cfg, str(tmp_path / "o"), workers=0, progress=seen.append)
    assert [p.done for p in seen] == list(range(len(sweep.expand(cfg)) + 1))
    assert seen[-1].eta == 0.0 and "6/6 cells" in seen[-1].line()


def test_worker_killed_mid_sweep_every_cell_lands_once(tmp_path):
    """A LocalCluster of two worker processes; once some cells are done, the worker that is
    running one is killed (SIGKILL): its cell is rerun elsewhere and every cell lands once."""
    distributed = pytest.importorskip("distributed")
    cfg = tlb_config(footprints=("1MiB", "2MiB", "4MiB", "8MiB"), accesses=150_000)
    cells = sweep.expand(cfg)
    killed = []
    with (
        distributed.LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None, silence_logs=50
        ) as cluster,
        distributed.Client(cluster) as client,
    ):
        pids = client.run(os.getpid)

        def progress(p):
            if killed or p.done - p.cached < 3:
                return
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:  # the worker that is running a cell now
                busy = [w for w, keys in client.processing().items() if keys and w in pids]
                if busy:
                    os.kill(pids[busy[0]], signal.SIGKILL)
                    killed.append(busy[0])
                    return
                time.sleep(0.01)

        result = sweep.run(cfg, str(tmp_path / "out"), client=client, progress=progress)
    assert killed, "no worker was running a cell when the third one landed"
    assert result.failed == {} and result.computed == len(cells)
    keys = [r["cell"] for r in table(str(tmp_path / "out"), "tlb")]
    assert sorted(keys) == sorted(c.key for c in cells)  # each once
    assert len(os.listdir(tmp_path / "out" / "cache")) == len(cells)


def test_cli_sweep_on_a_local_cluster(tmp_path, capsys):
    pytest.importorskip("distributed")
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        textwrap.dedent("""
        name = "cli"
        [tlb]
        presets = ["zen4"]
        pages = ["4KiB", "2MiB"]
        patterns = ["conv"]
        footprints = ["1MiB", "2MiB"]
        accesses = 20000
    """)
    )
    out = tmp_path / "out"
    assert main(["sweep", str(cfg), "--out", str(out), "--workers", "2"]) == 0
    cap = capsys.readouterr()
    assert "4 cells (4 computed, 0 cached, 0 failed)" in cap.out
    assert "sweep: 4/4 cells" in cap.err and "ETA" in cap.err
    manifest = json.load(open(out / "sweep.json"))
    assert manifest["command"].startswith("npumem sweep") or "sweep" in manifest["command"]
    assert "LocalCluster of 2 worker processes" in manifest["cluster"]


def test_a_failing_cell_is_listed_not_written_and_rerun_next_time(tmp_path, monkeypatch, capsys):
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        textwrap.dedent("""
        [tlb]
        presets = ["zen4"]
        pages = ["4KiB"]
        patterns = ["uniform"]
        footprints = ["1MiB", "2MiB"]
        accesses = 2000
    """)
    )
    real = sweep._tlb_row

    def flaky(p):
        if p["footprint"] == 2 << 20:
            raise RuntimeError("simulated failure")
        return real(p)

    monkeypatch.setattr(sweep, "_tlb_row", flaky)
    out = tmp_path / "out"
    assert main(["sweep", str(cfg), "--out", str(out), "--workers", "0", "--quiet"]) == 1
    cap = capsys.readouterr()
    assert "1 failed" in cap.out and "RuntimeError: simulated failure" in cap.err
    assert [r["footprint"] for r in table(str(out), "tlb")] == [1 << 20]
    assert len(json.load(open(out / "sweep.json"))["failed"]) == 1
    monkeypatch.setattr(sweep, "_tlb_row", real)
    assert main(["sweep", str(cfg), "--out", str(out), "--workers", "0", "--quiet"]) == 0
    assert "2 cells (1 computed, 1 cached, 0 failed)" in capsys.readouterr().out


def test_sweep_on_an_existing_scheduler(tmp_path, capsys, monkeypatch):
    distributed = pytest.importorskip("distributed")
    cfg = tmp_path / "c.toml"
    cfg.write_text('[tlb]\npresets = ["zen4"]\npages = ["2MiB"]\npatterns = ["chase"]\nfootprints = ["4MiB"]\n')
    with distributed.LocalCluster(n_workers=1, processes=False, dashboard_address=None) as cluster:
        argv = ["sweep", str(cfg), "--out", str(tmp_path / "o"), "--scheduler", cluster.scheduler_address]
        assert main(argv) == 0
        assert main([*argv, "--workers", "2"]) == 2  # --workers sizes a LocalCluster: not with --scheduler
        # A worker on another npumem version would cache results under the wrong key.
        monkeypatch.setattr(sweep, "_worker_version", lambda: "0.0.0-other")
        assert main([*argv[:3], str(tmp_path / "o2"), *argv[4:]]) == 2
        assert "runs npumem 0.0.0-other" in capsys.readouterr().err
        assert not (tmp_path / "o2").exists()  # nothing written before the cluster is checked
    manifest = json.load(open(tmp_path / "o" / "sweep.json"))
    assert manifest["cluster"].startswith(f"Dask scheduler {cluster.scheduler_address}")


def test_progress_on_a_terminal_rewrites_one_line():
    import io

    class Tty(io.StringIO):
        def isatty(self):
            return True

    stream = Tty()
    printer = sweep._Printer(stream)
    printer(sweep.Progress(0, 100, 0, 0, 0.0, None))
    printer(sweep.Progress(100, 100, 90, 0, 12.0, 0.0))
    text = stream.getvalue()
    assert text.count("\r") == 2 and text.endswith("\n") and text.count("\n") == 1
    assert "100/100 cells" in text and "90 cached" in text and "ETA 0:00" in text


def test_without_pyarrow_the_csvs_are_written_then_a_hint_exit_3(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text('[tlb]\npresets = ["zen4"]\npages = ["4KiB"]\npatterns = ["uniform"]\nfootprints = ["1MiB"]\n')
    code = (
        "import sys; sys.modules['pyarrow'] = None\n"
        "from npumem.cli import main\n"
        f"sys.exit(main(['sweep', {str(cfg)!r}, '--out', {str(tmp_path / 'o')!r}, '--workers', '0', '--quiet']))"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 3, p.stderr
    assert p.stderr.count("\n") == 1 and "npumem[sweep]" in p.stderr
    assert sorted(os.listdir(tmp_path / "o")) == ["cache", "sweep.json", "tlb.csv"]


FOOTPRINTS = [f"{1 << k}MiB" for k in range(6)]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    runs=st.lists(
        st.tuples(
            st.lists(st.sampled_from(["4KiB", "2MiB", "1GiB"]), min_size=1, max_size=4),
            st.lists(st.sampled_from(FOOTPRINTS), min_size=1, max_size=6),
            st.sets(st.integers(0, 40), max_size=5),  # cache files torn before this run
        ),
        min_size=1,
        max_size=4,
    )
)
def test_reruns_compute_exactly_the_uncached_cells_property(tmp_path_factory, monkeypatch, runs):
    """Random grids run one after another into one folder, with some cache files torn between
    runs, against a model of the cache (a set of keys): each run computes exactly the grid's
    cells the model lacks, and its tables hold each cell of its grid once."""
    computed: list[str] = []

    def fake_row(p):
        computed.append(sweep.cell_key("tlb", p))
        return {"preset": p["preset"], "page": p["page"], "footprint": p["footprint"], "seed": p["seed"]}

    monkeypatch.setattr(sweep, "_tlb_row", fake_row)
    out = tmp_path_factory.mktemp("prop")
    model: set[str] = set()
    for pages, footprints, tear in runs:
        cfg = {"tlb": {"presets": ["zen4"], "pages": pages, "patterns": ["uniform"], "footprints": footprints}}
        keys = list(dict.fromkeys(c.key for c in sweep.expand(cfg)))
        for i in tear:
            cached = sorted(model)
            if i < len(cached):
                with open(out / "cache" / f"{cached[i]}.json", "w") as f:
                    f.write("{")
                model.discard(cached[i])
        computed.clear()
        r = sweep.run(cfg, str(out), workers=0, progress=False)
        assert sorted(computed) == sorted(k for k in keys if k not in model)
        assert (r.cells, r.computed, r.cached) == (len(keys), len(computed), len(keys) - len(computed))
        model |= set(keys)
        assert [row["cell"] for row in table(str(out), "tlb")] == keys


def test_an_error_in_the_progress_callback_is_not_taken_for_a_failed_cell(tmp_path):
    def progress(p):
        if p.done == 2:
            raise RuntimeError("callback broke")

    with pytest.raises(RuntimeError, match="callback broke"):
        sweep.run(tlb_config(footprints=("1MiB",), accesses=2000), str(tmp_path / "o"), workers=0, progress=progress)
    # The two cells that landed are cached; the next run computes the rest.
    r = sweep.run(tlb_config(footprints=("1MiB",), accesses=2000), str(tmp_path / "o"), workers=0, progress=False)
    assert (r.cached, r.computed, r.failed) == (2, 4, {})
