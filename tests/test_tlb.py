"""The TLB model over a device's page table: closed-form answers."""

from __future__ import annotations

import numpy as np
import pytest

import npumem
from npumem import Policy
from npumem.tlb import Tlb, sequential, strided, uniform

MiB = 1 << 20


@pytest.fixture(scope="module")
def dev():
    return npumem.Device("2GiB", giant_frames=1, allocator="direct")


def test_sequential_misses_once_per_page(dev):
    small = dev.malloc(64 * MiB, Policy.NORMAL_ONLY)
    huge = dev.malloc(64 * MiB, Policy.HUGE_ONLY)
    for ptr, page in [(small, 4096), (huge, 2 * MiB)]:
        tlb = Tlb.preset("zen4", dev)
        s = tlb.run(sequential(ptr, 64 * MiB, 64))
        assert s.accesses == 64 * MiB // 64
        assert s.levels[0].misses == s.levels[1].misses == s.walks == 64 * MiB // page
        assert s.levels[0].hits == s.accesses - s.walks
        assert s.faults == 0
    dev.free(small)
    dev.free(huge)


def test_within_reach_no_misses_after_warm_up(dev):
    ptr = dev.malloc(4 * MiB, Policy.NORMAL_ONLY)  # 1024 pages: inside zen4's 3072-entry L2
    tlb = Tlb.preset("zen4", dev)
    pages = sequential(ptr, 4 * MiB, 4096)
    tlb.run(pages)
    tlb.reset_stats()
    chase = np.random.default_rng(1).permutation(pages)
    s = tlb.run(np.concatenate([chase, chase]))
    assert s.walks == 0 and s.levels[1].misses == 0
    assert s.levels[0].misses > 0  # the 72-entry L1 cannot hold them all
    dev.free(ptr)


def test_giant_pages_reach_and_walk_depth(dev):
    g = dev.malloc(1 << 30, Policy.HUGE1G_ONLY)
    tlb = Tlb.preset("skylake", dev, walk_step_cycles=100)
    s = tlb.run(uniform(g, 1 << 30, 100_000, seed=3))
    assert s.walks == 1 and s.walk_steps == 2  # one 1 GiB entry, a 2-step walk
    assert s.cycles == 2 * 100
    assert tlb.nominal_reach(1 << 30)[0] == 4 << 30
    dev.free(g)


def test_faults_overrides_and_errors(dev):
    tlb = Tlb.preset(
        "champsim_default",
        dev,
        **{"1.0.entries": 3072, "1.0.ways": 16, "1.0.replacement": "plru", "walk_step_cycles": 7},
    )
    cfg = tlb.config
    assert cfg["levels"][1][0]["entries"] == 3072 and cfg["walk_step_cycles"] == 7
    s = tlb.run([12345, npumem.VA_WINDOW_START])
    assert s.faults == 2 and s.accesses == 0
    assert "ascend_like" in Tlb.presets() and "GUESS" in Tlb.preset("ascend_like", dev).config["source"]
    with pytest.raises(npumem.InvalidParamError, match="unknown TLB preset"):
        Tlb.preset("pentium", dev)
    with pytest.raises(npumem.InvalidParamError):
        Tlb.preset("zen4", dev, **{"0.0.ways": 7})
    with pytest.raises(npumem.InvalidParamError):
        Tlb.preset("zen4", dev, bogus=1)


def test_strided_over_pages_thrashes_a_small_set(dev):
    ptr = dev.malloc(64 * MiB, Policy.NORMAL_ONLY)
    tlb = Tlb.preset("skylake", dev)
    # Stride of one page + 64 over 2048 pages: more pages than L1 and STLB hold, LRU misses all.
    s = tlb.run(strided(ptr, 32 * MiB, 4096 + 64, 20_000))
    assert s.levels[0].miss_rate > 0.99 and s.levels[0].mpka > 990
    assert 0 < s.walk_cache_hit_rate < 1
    dev.free(ptr)


def test_patterns_are_in_bounds_and_shaped():
    from npumem import patterns as pt

    base, fp = 1 << 44, 64 * MiB
    for arr in [
        pt.sequential(base, fp),
        pt.strided(base, fp, 4160, 1000),
        pt.uniform(base, fp, 1000, seed=1),
        pt.pointer_chase(base, fp, 5000, seed=2),
        pt.gather(base, fp // 1024, 1024, 100, zipf=1.2),
    ]:
        assert arr.dtype == np.uint64 and arr.min() >= base and arr.max() < base + fp
    chase = pt.pointer_chase(base, fp, fp // 4096)
    assert len(np.unique(chase // 4096)) == fp // 4096  # every page once per cycle
    m = n = k = 128
    g = pt.gemm(base, base + m * k * 2, base + 2 * m * k * 2, m, n, k, elem=2, tile=(64, 64, 64))
    # 2x2x2 tiles, each touching 64 rows x 2 lines of A, B and C.
    assert len(g) == 8 * 3 * 64 * 2
    assert len(pt.gemm(base, base, base, m, n, k, limit=100)) == 100
    with pytest.raises(ValueError):
        pt.gemm(base, base, base, m, n, k, order="mmk")
    mix = pt.interleave(np.array([1, 2, 3], dtype=np.uint64), np.array([10, 20], dtype=np.uint64))
    assert mix.tolist() == [1, 10, 2, 20, 3]
    popular = pt.gather(base, 1000, 64, 10_000, zipf=2.0, seed=0)
    assert np.mean(popular == base) > 0.3  # Zipf puts row 0 first


def test_sweep_table_csv_and_plot(tmp_path):
    from npumem import tlb as tl

    rows = tl.sweep(
        presets=("zen4",),
        pages=("4KiB", "2MiB"),
        patterns=("uniform",),
        footprints=(4 * MiB, 64 * MiB),
        accesses=20_000,
    )
    assert len(rows) == 4
    by = {(r["page"], r["footprint"]): r for r in rows}
    assert by[("2MiB", 64 * MiB)]["walks"] == 32  # one walk per huge page touched
    assert by[("4KiB", 64 * MiB)]["L1_mpka"] > by[("2MiB", 64 * MiB)]["L1_mpka"]
    assert by[("4KiB", 64 * MiB)]["page_table_entries"] == 64 * MiB // 4096 + 1  # the +32 B pad costs a page
    assert all(r["accesses_per_s"] > 0 for r in rows)
    path = tmp_path / "s.csv"
    tl.write_csv(rows, str(path))
    header = path.read_text().splitlines()[0].split(",")
    assert {"preset", "page", "pattern", "footprint", "L1_mpka", "walks"} <= set(header)
    tl.plot(rows, str(tmp_path / "s.png"))
    assert (tmp_path / "s.png").read_bytes()[:4] == b"\x89PNG"
    tl.plot_tradeoff(rows, str(tmp_path / "w.png"))
    assert (tmp_path / "w.png").read_bytes()[:4] == b"\x89PNG"
    assert rows[0]["page_table_bytes"] >= 4096
    with pytest.raises(ValueError, match="unknown"):
        tl.sweep(patterns=("telepathy",))


def test_cli_tlb_sweep(tmp_path, capsys):
    from npumem.cli import main

    csv_path, png = tmp_path / "t.csv", tmp_path / "t.png"
    args = ["tlb", "sweep", "--presets", "zen4", "--pages", "4KiB", "--patterns", "sequential"]
    assert main([*args, "--footprints", "4MiB", "--accesses", "1000", "--csv", str(csv_path), "--plot", str(png)]) == 0
    assert "1 runs" in capsys.readouterr().out and csv_path.exists() and png.exists()
    assert (tmp_path / "t_tradeoff.png").exists()


def test_conv_and_fractal_patterns_and_huge_frame_rates():
    from npumem import patterns as pt
    from npumem import tlb as tl

    base = 1 << 44
    conv = pt.conv_nc1hwc0(base, 1, 2, 8, 8)
    assert len(conv) == 2 * 6 * 6 * 9  # C1 planes x output pixels x 3x3 window
    assert conv.max() < base + 2 * 8 * 8 * 32
    frac = pt.gemm_fractal(base, base + (1 << 20), base + (2 << 20), 64, 64, 64)
    assert len(frac) == 4 * 4 * (4 * 8 + 4 * 8 + 8)  # (m/16 x n/16) x (A and B k-fractals + C) x 8 lines
    with pytest.raises(ValueError):
        pt.conv_nc1hwc0(base, 1, 1, 2, 2)
    calm = tl.huge_frame_rates(capacity=64 * MiB, steps=3000, target_used=0.5)[-1]
    packed = tl.huge_frame_rates(capacity=64 * MiB, steps=3000, target_used=0.995)[-1]
    assert calm["huge_failure_rate"] == 0.0 and calm["largest_free_block"] >= 16 * MiB
    assert packed["huge_failure_rate"] > 0.5 and packed["largest_free_block"] < 2 * MiB


def test_coalescing_turns_physical_contiguity_into_reach():
    fresh = npumem.Device("256MiB", allocator="direct")
    ptr = fresh.malloc(16 * MiB, Policy.NORMAL_ONLY)  # a fresh buddy hands out contiguous frames
    tlb = Tlb.preset("zen4", fresh, coalesce=8)
    assert tlb.config["coalesce"] == 8
    s = tlb.run(sequential(ptr, 16 * MiB))
    assert s.walks == 16 * MiB // 4096 // 8  # eight pages per entry
    # Fragment the frames first: pages land scattered, coalescing finds nothing to merge.
    frag = npumem.Device("64MiB", allocator="direct")
    keep = [frag.malloc(4096, Policy.NORMAL_ONLY) for _ in range(4000)]
    for p in keep[::2]:
        frag.free(p)
    big = frag.malloc(4 * MiB, Policy.NORMAL_ONLY)
    s2 = Tlb.preset("zen4", frag, coalesce=8).run(sequential(big, 4 * MiB))
    assert s2.walks > 4 * MiB // 4096 // 8 * 2


@pytest.mark.parametrize("preset", ["skylake", "ascend_like", "gem5_gpu"])
def test_fast_model_matches_the_reference_from_python(dev, preset):
    """The fast model and the reference model give identical counters and
    reach on a mixed stream over 4 KiB and 2 MiB pages, in two runs (the second warm), with
    unmapped addresses among them."""
    small = dev.malloc(8 * MiB, Policy.NORMAL_ONLY)
    huge = dev.malloc(16 * MiB, Policy.HUGE_ONLY)
    rng = np.random.default_rng(3)
    addrs = np.concatenate(
        [
            uniform(small, 8 * MiB, 3000, seed=1),
            uniform(huge, 16 * MiB, 3000, seed=2),
            strided(small, 8 * MiB, 4160, 2000),
            np.array([12345, npumem.VA_WINDOW_START], dtype=np.uint64),
        ]
    )
    rng.shuffle(addrs)
    fast = Tlb.preset(preset, dev, walk_step_cycles=30)
    ref = Tlb.preset(preset, dev, model="reference", walk_step_cycles=30)
    for half in np.array_split(addrs, 2):
        assert fast.run(half) == ref.run(half)
        assert fast._tlb.effective_reach() == ref._tlb.effective_reach()
    with pytest.raises(npumem.InvalidParamError, match="model"):
        Tlb.preset("zen4", dev, model="slow")
    dev.free(small)
    dev.free(huge)
