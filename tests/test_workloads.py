"""Workload generators (npumem.workloads): well-formed, seeded, sized from the model's dimensions,
and showing what they are for (fragmentation of the caching families, a growing pool); measure()
and its timeline."""

from __future__ import annotations

import itertools
import math
from collections import Counter

import pytest
from conftest import MiB
from hypothesis import given
from hypothesis import strategies as st

from npumem import InvalidParamError, workloads
from npumem.formats import Trace
from npumem.replay import normalize, peak_live_bytes, replay

FAMILIES = ("npumem", "pytorch", "torch_npu", "direct")

#: Small versions of every generator (fast enough for the default test run).
SMALL = {
    "llm_training": dict(steps=3, seq=(64, 256)),
    "kv_cache_paged": dict(requests=30, prompt=(16, 256), output=(4, 64), max_new_tokens=64),
    "kv_cache_contiguous": dict(requests=30, prompt=(16, 256), output=(4, 64), max_new_tokens=64),
    "dynamic_shape_inference": dict(batches=6),
    "moe_routing": dict(steps=2, layers=2, tokens=(256, 1024)),
    "pipeline_parallel": dict(micro_batches=4, iterations=1, seq=256),
    "long_running_service": dict(ticks=200, cache_entries=1500),
}


def _fields(ev):
    if isinstance(ev, dict):
        return ev["action"], ev["id"], ev["size"]
    return ev


def assert_well_formed(events):
    """Each id allocated once, freed once after it, with the size it was allocated with; nothing
    live at the end; positive int sizes."""
    live = {}
    seen = set()
    for ev in events:
        action, i, size = _fields(ev)
        assert isinstance(i, int) and isinstance(size, int) and size > 0
        if action == "alloc":
            assert i not in seen
            seen.add(i)
            live[i] = size
        else:
            assert action == "free" and live.pop(i) == size
    assert not live and seen
    normalize(events)  # replay takes them


@pytest.mark.parametrize("name", sorted(SMALL))
def test_every_generator_is_well_formed_and_seeded(name):
    kw = SMALL[name]
    a = workloads.generate(name, seed=1, **kw)
    assert_well_formed(a)
    assert workloads.generate(name, seed=1, **kw) == a
    assert workloads.generate(name, seed=2, **kw) != a


@given(
    name=st.sampled_from(sorted(SMALL)),
    seed=st.integers(0, 2**32),
    family=st.sampled_from(FAMILIES),
)
def test_generated_traces_replay_on_every_family(name, seed, family):
    events = workloads.generate(name, seed=seed, **SMALL[name])
    assert_well_formed(events)
    peak = peak_live_bytes(events)
    r = replay(events, {"capacity": 2 * peak + 2048 * MiB, "allocator": family})
    assert r.completed and r.peak_live == peak
    assert r.peak_reserved >= r.peak_allocated >= peak


def test_kv_cache_sizes_come_from_the_model():
    m = workloads.MODELS["llama-2-7b"]
    per_token = m.kv_bytes_per_token(2)
    assert per_token == 2 * 32 * 32 * 128 * 2 == 512 * 1024
    paged = workloads.kv_cache_serving(requests=20, paged=True, block_tokens=16, **_kv_small())
    blocks = Counter(s for a, _, s in paged if a == "alloc" and s == 16 * per_token)
    assert blocks[16 * per_token] > 20  # a block per 16 tokens, all the same size
    contiguous = workloads.kv_cache_serving(requests=20, paged=False, max_new_tokens=64, **_kv_small())
    kv = [s for a, _, s in contiguous if a == "alloc" and s % per_token == 0 and s >= 64 * per_token]
    assert len(kv) == 20  # one buffer per request: prompt + max_new_tokens tokens
    assert len(set(kv)) > 5  # as varied as the prompts


def _kv_small():
    return dict(prompt=(16, 256), output=(4, 64), seed=3)


def test_pipeline_parallel_uses_two_streams_and_measure_runs_them():
    events = workloads.pipeline_parallel(micro_batches=4, iterations=1, seq=256)
    streams = Counter(ev["stream"] for ev in events)
    assert set(streams) == {workloads.COMPUTE_STREAM, workloads.COMM_STREAM}
    for ev in events:  # a block is freed on the stream it was allocated on
        assert ev["stream"] in (0, 1)
    tl = workloads.measure(events, "pytorch", windows=8)
    assert tl.ooms == 0 and tl.live_blocks[-1] == 0
    assert tl.peak_allocated >= tl.peak_live
    same = workloads.measure(Trace.from_events(events), "pytorch", windows=8)  # the streams kept
    assert (same.end, same.allocated, same.reserved, same.live_blocks) == (
        tl.end,
        tl.allocated,
        tl.reserved,
        tl.live_blocks,
    )
    assert same.peak_live == tl.peak_live


def test_dynamic_shapes_fragment_the_caching_pool_not_npumem():
    """The seed's detection network: PyTorch's rules reserve far more than the live data when
    every batch's shapes change; the npumem pool stays within a few percent of it."""
    events = workloads.dynamic_shape_inference(batches=12, seed=0)
    peak = peak_live_bytes(events)
    cfg = {"capacity": 4 * peak + 1024 * MiB}
    pytorch = replay(events, {**cfg, "allocator": "pytorch"}).peak_reserved / peak
    npumem = replay(events, {**cfg, "allocator": "npumem"}).peak_reserved / peak
    assert pytorch > 1.3 and npumem < 1.05, (pytorch, npumem)


def test_long_running_service_pool_grows():
    events = workloads.long_running_service(ticks=300, cache_entries=2000, insert_rate=12, seed=4)
    tl = workloads.measure(events, "npumem", windows=20)
    assert max(tl.live_blocks) >= 1800
    grows = tl.live_blocks[: tl.live_blocks.index(max(tl.live_blocks)) + 1]
    assert all(b >= a * 0.9 for a, b in itertools.pairwise(grows))
    assert all(a <= r for a, r in zip(tl.allocated, tl.reserved, strict=True))
    assert tl.live_blocks[-1] == 0 and tl.end[-1] == len(events)
    assert all(math.isnan(x) or x > 0 for x in tl.ns_per_alloc)


def test_measure_counts_out_of_memory_and_skips_its_free():
    events = [("alloc", 0, 300 * MiB), ("alloc", 1, 300 * MiB), ("free", 0, 0), ("free", 1, 0)]
    tl = workloads.measure(events, "direct", capacity="512MiB", windows=2)
    assert tl.ooms == 1 and tl.live_blocks == [1, 0]


def test_bad_arguments_are_named():
    with pytest.raises(InvalidParamError, match="prompt"):
        workloads.kv_cache_serving(prompt=(512, 16))
    with pytest.raises(InvalidParamError, match="model"):
        workloads.llm_training("gpt-5")
    with pytest.raises(InvalidParamError, match="no experts"):
        workloads.moe_routing("gpt2")
    with pytest.raises(InvalidParamError, match="stage"):
        workloads.pipeline_parallel(stages=2, stage=2)
    with pytest.raises(TypeError, match="batches"):
        workloads.dynamic_shape_inference(batches=2.5)
    with pytest.raises(InvalidParamError, match="1 TiB"):
        workloads.kv_cache_serving(requests=1, paged=False, prompt=(1 << 22, 1 << 22), max_new_tokens=1)
    with pytest.raises(InvalidParamError, match="name"):
        workloads.generate("nope")
    with pytest.raises(TypeError, match="events"):
        workloads.measure("trace.json")


def test_plot_timelines_draws_or_hints(tmp_path):
    pytest.importorskip("matplotlib")
    events = workloads.dynamic_shape_inference(batches=3)
    tls = [workloads.measure(events, f, windows=10) for f in ("npumem", "pytorch")]
    out = tmp_path / "t.png"
    workloads.plot_timelines(tls, str(out), title="detector")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_measure_reads_pytorch_device_traces():
    """free_requested / free_completed and segment events, as replay reads them."""
    trace = [
        {"action": "alloc", "addr": 1, "size": 3 * MiB},
        {"action": "segment_alloc", "addr": 1, "size": 20 * MiB},
        {"action": "free_requested", "addr": 1, "size": 3 * MiB},
        {"action": "free_completed", "addr": 1, "size": 3 * MiB},
        {"action": "alloc", "addr": 2, "size": MiB, "stream": 1},
        {"action": "free_requested", "addr": 2, "size": MiB},
        {"action": "free_completed", "addr": 2, "size": MiB},
    ]
    tl = workloads.measure(trace, "pytorch", windows=1)
    assert tl.events == 4 and tl.peak_live == 3 * MiB and tl.live_blocks == [0]
    only_requested = [e for e in trace if e["action"] != "free_completed"]
    assert workloads.measure(only_requested, "npumem", windows=2).live_blocks[-1] == 0


@pytest.mark.parametrize("name", sorted(SMALL))
def test_npumem_reserves_no_more_than_the_caching_families(name):
    """On every generated workload the npumem pool's peak reserved is at most PyTorch's and
    torch_npu's rules' (the caching families reserve 10-80% more on these small versions)."""
    events = workloads.generate(name, **SMALL[name])
    peak = peak_live_bytes(events)
    reserved = {
        f: replay(events, {"capacity": 4 * peak + 1024 * MiB, "allocator": f}).peak_reserved
        for f in ("npumem", "pytorch", "torch_npu")
    }
    assert reserved["npumem"] <= min(reserved["pytorch"], reserved["torch_npu"]), reserved
