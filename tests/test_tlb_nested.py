"""The TLB model as a guest of a virtual machine (nested walks, splintering), its geometry from
CPUID, and the pointer-chase cost model and validation."""

from __future__ import annotations

import json
import platform
import subprocess
import sys

import numpy as np
import pytest

import npumem
from npumem import Policy
from npumem.patterns import pointer_chase
from npumem.tlb import Tlb, chase_features, fit_chase, predict_chase
from npumem.tlb_validate import grid, knees

MiB = 1 << 20


@pytest.fixture(scope="module")
def dev():
    return npumem.Device("512MiB", allocator="direct")


def chase_stats(dev, preset: str, policy: Policy, footprint: int, **kw):
    ptr = dev.malloc(footprint, policy)
    pages = footprint // 4096
    addrs = pointer_chase(ptr, footprint, 3 * pages, seed=1)
    tlb = Tlb.preset(preset, dev, **kw)
    tlb.run(addrs[:pages])
    tlb.reset_stats()
    st = tlb.run(addrs[pages:])
    dev.free(ptr)
    return st


def test_guest_huge_pages_do_not_extend_reach_over_small_host_pages(dev):
    # 8 MiB: beyond the 72-entry L1 in 4 KiB entries, inside it in 2 MiB ones.
    small = chase_stats(dev, "zen4_kvm", Policy.NORMAL_ONLY, 8 * MiB)
    huge = chase_stats(dev, "zen4_kvm", Policy.HUGE_ONLY, 8 * MiB)
    native_huge = chase_stats(dev, "zen4", Policy.HUGE_ONLY, 8 * MiB)
    assert small.levels[0].misses == huge.levels[0].misses == small.accesses  # splintered: same knee
    assert native_huge.levels[0].misses == 0
    # Over 2 MiB host pages the guest's huge pages reach again.
    over_huge = chase_stats(dev, "zen4_kvm", Policy.HUGE_ONLY, 8 * MiB, host_page_size="2MiB")
    assert over_huge.levels[0].misses == 0


def test_nested_walks_read_more_and_report_it(dev):
    # 64 MiB: beyond the L2, every access walks.
    native = chase_stats(dev, "zen4", Policy.NORMAL_ONLY, 64 * MiB)
    guest = chase_stats(dev, "zen4", Policy.NORMAL_ONLY, 64 * MiB, host_page_size=4096)
    assert native.nested_walks == native.nested_steps == 0
    assert guest.walks == native.walks > 0
    assert guest.nested_walks >= guest.walks  # the data's page at least, every walk
    assert 1.0 <= native.reads_per_walk < guest.reads_per_walk
    assert native.nested_reads_per_walk == 0
    assert guest.nested_reads_per_walk == pytest.approx(guest.reads_per_walk - guest.walk_steps / guest.walks)
    # Every cache of the host dimension off: each guest read taken adds a 4-read host walk.
    bare = chase_stats(
        dev,
        "zen4",
        Policy.NORMAL_ONLY,
        64 * MiB,
        host={"page_size": 4096, "nested_tlb_entries": 0, "walk_cache_entries": [0, 0, 0]},
    )
    assert bare.nested_steps == 4 * (bare.walk_steps + bare.walks)


def test_host_config_round_trips_and_none_is_native(dev):
    kvm = Tlb.preset("zen4_kvm", dev)
    assert kvm.config["host"] == {
        "page_size": 4096,
        "levels": 4,
        "nested_tlb_entries": 16,
        "walk_cache_entries": [8, 16, 64],
    }
    assert Tlb.preset("zen4_kvm", dev, host=None).config["host"] is None
    five = Tlb.preset("zen4", dev, host={"levels": 5, "page_size": "1GiB"}).config["host"]
    assert (five["levels"], five["page_size"]) == (5, 1 << 30)
    assert Tlb.preset("zen4", dev).config["host"] is None


def test_every_preset_names_its_source_kind(dev):
    kinds = {"vendor manual", "CPUID", "simulator config", "microbenchmark paper", "guess"}
    for name in Tlb.presets():
        cfg = Tlb.preset(name, dev).config
        assert cfg["source_kind"] in kinds, name
    assert Tlb.preset("ascend_like", dev).config["source_kind"] == "guess"


def test_from_cpuid_reads_this_machine_or_says_why_not(dev):
    if platform.machine() in ("x86_64", "AMD64", "i686"):
        tlb = Tlb.from_cpuid(dev)
        cfg = tlb.config
        assert cfg["source_kind"] == "CPUID"
        assert "family" in cfg["source"] and "guesses" in cfg["source"]
        assert cfg["levels"][0][0]["entries"] > 0
    else:
        with pytest.raises(npumem.UnsupportedError, match="not x86"):
            Tlb.from_cpuid(dev)


COSTS = {"base_ns": 1.3, "l2_tlb_ns": 2.0, "near_ns": 4.0, "far_ns": 40.0}
FOOTPRINTS = grid(64 << 10, 32 * MiB, 2)


def test_fit_recovers_the_costs_it_predicted_from():
    kw = {"page_size": 4096, "host_page_size": 4096, "preset": "zen4", "caches": ((32 << 10, 8), (1 << 20, 8))}
    ns = predict_chase(FOOTPRINTS, kw["page_size"], **{k: v for k, v in kw.items() if k != "page_size"}, costs=COSTS)
    assert ns[0] == pytest.approx(COSTS["base_ns"])
    assert ns == sorted(ns)  # a larger footprint never costs less here
    fitted = fit_chase(FOOTPRINTS, ns, **kw)
    assert fitted == pytest.approx(COSTS, rel=1e-3)


def test_huge_guest_pages_predict_shorter_walks_not_later_knees():
    kw = {"host_page_size": 4096, "preset": "zen4", "costs": COSTS, "caches": ((32 << 10, 8), (1 << 20, 8))}
    small = predict_chase(FOOTPRINTS, 4096, **kw)
    huge = predict_chase(FOOTPRINTS, 2 * MiB, **kw)
    assert knees(FOOTPRINTS, small) == knees(FOOTPRINTS, huge)
    gain = np.array(small) - np.array(huge)
    assert (gain >= -1e-9).all() and gain[-1] > 0
    # Native, 2 MiB entries reach 144 MiB: no L1 TLB miss at any of these footprints.
    native = chase_features(FOOTPRINTS, 2 * MiB, preset="zen4", caches=((32 << 10, 8), (1 << 20, 8)))
    assert all(r["l1_miss"] == 0 for r in native)


def test_cli_validate_measures_both_series_briefly(tmp_path):
    out = tmp_path / "v.json"
    args = ["tlb", "validate", "--min-footprint", "256KiB", "--max-footprint", "1MiB", "--per-octave", "1"]
    args += ["--rounds", "1", "--preset", "zen4", "--no-hugetlb", "--json", str(out)]
    r = subprocess.run([sys.executable, "-m", "npumem", *args], capture_output=True, text=True, timeout=120)
    with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
        thp = f.read()
    if "[never]" in thp:
        assert r.returncode == 2 and "MADV_COLLAPSE" in r.stderr, r.stderr
        return
    assert r.returncode == 0, r.stderr
    assert "load average" in r.stdout
    checks = [line for line in r.stdout.splitlines() if line.startswith(("PASS", "FAIL"))]
    assert any("4KiB: knees" in c for c in checks) and any("2MiB: every point" in c for c in checks)
    assert not any("difference" in c for c in checks)  # no footprint from 12 MiB: nothing to check
    result = json.loads(out.read_text())
    assert set(result["series"]) == {"4KiB", "2MiB"}
    assert "AnonHugePages 2048 kB" in result["series"]["2MiB"]["backing"]
    for s in result["series"].values():
        assert len(s["measured_ns"]) == len(s["predicted_ns"]) == len(result["footprints"]) == 3
        assert all(v > 0 for v in s["measured_ns"])


@pytest.mark.parametrize(
    "args, words",
    [
        (["--host-page-size", "8KiB"], "not a host page"),
        (["--max-footprint", "2GiB"], "--max-footprint"),
        (["--preset", "nope"], "nope"),
    ],
)
def test_cli_validate_refuses_bad_values_without_a_traceback(args, words):
    r = subprocess.run(
        [sys.executable, "-m", "npumem", "tlb", "validate", "--rounds", "1", "--max-footprint", "128KiB", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2, r.stderr
    assert words in r.stderr and "Traceback" not in r.stderr


def test_cli_presets_prints_a_source_column():
    r = subprocess.run([sys.executable, "-m", "npumem", "tlb", "presets"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    head, *lines = r.stdout.strip().splitlines()
    assert "source kind" in head and head.rstrip().endswith("source")
    assert len(lines) == len(Tlb.presets())
    kvm = next(line for line in lines if line.startswith("zen4_kvm"))
    assert "4 KiB x 4 levels" in kvm and "vendor manual" in kvm
    assert "guess" in next(line for line in lines if line.startswith("ascend_like"))
