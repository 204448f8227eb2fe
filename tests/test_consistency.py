"""Consistency: what the README promises works as written, every surface tells the same
story (segments, fragmentation figures, plan verdicts), and the docs point only inside the
repository."""

from __future__ import annotations

import io
import pathlib
import random
import re

import pytest
from conftest import MiB

import npumem
from npumem import demo, formats

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


#: The team's private reference notes: docs and code cite public sources instead.
PRIVATE_NOTES = re.compile(
    r"\.\./shared|/work/|(tlb-and-pages|ascendcl-api|caching-allocators|rmm-and-pools|static-planning|"
    r"rust-pyo3-ecosystem)\.md"
)


@pytest.mark.parametrize(
    "path",
    [*DOCS, *sorted(ROOT.glob("crates/*/src/**/*.rs")), *sorted(ROOT.glob("python/npumem/*.py"))],
    ids=lambda p: str(p.relative_to(ROOT)),
)
def test_nothing_cites_files_outside_the_repository(path):
    assert not PRIVATE_NOTES.search(path.read_text()), PRIVATE_NOTES.search(path.read_text())


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_docs_link_only_inside_the_repository(doc):
    text = doc.read_text()
    for target in re.findall(r"\]\(([^)#\s]+)", text):
        if re.match(r"[a-z]+://", target):
            continue
        assert (doc.parent / target).resolve().is_relative_to(ROOT), target
        assert (doc.parent / target).exists(), target


def test_the_bundled_traces_load_as_the_readme_says():
    trace = formats.load(ROOT / "benches" / "traces" / "torch_cpu_convnet.json.gz")
    assert len(trace) and trace.events()[0][0] == "alloc"
    assert npumem.replay.peak_live_bytes(trace) > 0


def _summary_segments(dev: npumem.Device) -> int:
    line = next(x for x in dev.memory_summary().splitlines() if x.startswith("device segments"))
    return int(line.split()[2])


@pytest.mark.parametrize("allocator", ["npumem", "pytorch", "torch_npu", "direct"])
def test_every_surface_counts_the_same_segments(allocator):
    dev = npumem.Device("256MiB", allocator=allocator)
    rng = random.Random(12)
    live: list[int] = []
    for step in range(300):
        if live and rng.random() < 0.45:
            dev.free(live.pop(rng.randrange(len(live))))
        else:
            live.append(dev.malloc(rng.choice([4096, 200_000, MiB, 3 * MiB, 5 * MiB])))
        if step % 50 == 49:
            dev.empty_cache()
        stats = dev.memory_stats()
        n = len(dev.memory_snapshot()["segments"])
        assert stats["segment.all.current"] == n == len(dev.fragmentation()["segments"]) == _summary_segments(dev)
        assert stats["segment.all.allocated"] - stats["segment.all.freed"] == n


def test_one_expandable_segment_not_four():
    # Four 3 MiB blocks on the npumem pool map six 2 MiB pages side by side: one segment.
    dev = npumem.Device("1GiB")
    for _ in range(4):
        dev.malloc(3 * MiB)
    stats = dev.memory_stats()
    assert len(dev.memory_snapshot()["segments"]) == 1 == stats["segment.all.current"] == _summary_segments(dev)
    assert stats["num_device_alloc"] == 6  # the pages, as PyTorch counts expandable-segment maps


def test_demo_fragmentation_figures_say_what_they_measure():
    out = io.StringIO()
    demo.fragmentation(out, "256MiB", 7)
    text = out.getvalue()
    physical = re.search(r"physical fragmentation of the device's free frames .*: ([\d.]+)%", text)
    assert physical and float(physical.group(1)) > 90
    # The allocator's own figure, in the OOM message, is labelled as such and explained.
    assert "external fragmentation of the free reserved memory 0.0%" in text
    assert "The free frames are what is fragmented: the physical figure above" in text


def test_demo_reports_a_missing_plot_dependency(monkeypatch, tmp_path):
    monkeypatch.setitem(__import__("sys").modules, "matplotlib", None)
    out = io.StringIO()
    missing = demo.tlb(out, str(tmp_path / "t.png"))
    assert len(missing) == 1 and "pip install 'npumem[plot]'" in missing[0]
    assert "(no plot: matplotlib is not installed)" in out.getvalue()
    assert not (tmp_path / "t.png").exists()


def test_plot_without_matplotlib_is_a_hint_not_a_crash(monkeypatch, tmp_path):
    monkeypatch.setitem(__import__("sys").modules, "matplotlib", None)
    p = npumem.plan.Problem.from_buffers([(0, 2, 100), (1, 3, 50)]).solve()
    with pytest.raises(npumem.MissingDependencyError, match=r"pip install 'npumem\[plot\]'") as info:
        p.plot(tmp_path / "p.png")
    assert isinstance(info.value, ImportError)
