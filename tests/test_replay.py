"""Trace replay: event normalisation, ReplayResult, peak live bytes, the min_capacity search, the
synthetic transformer trace, and the benchmark goal (npumem within 2% of the peak, never worse
than PyTorch's rules)."""

from __future__ import annotations

import pytest
from conftest import KiB, MiB, raises_acl
from hypothesis import given
from hypothesis import strategies as st

from npumem import Device, InvalidParamError, replay, workloads
from npumem.replay import ReplayResult, min_capacity, normalize, peak_live_bytes

ALLOCATORS = ("npumem", "direct", "pytorch", "torch_npu")
#: Page of the npumem small pool.
SMALL_PAGE = 64 * KiB

TINY = [
    ("alloc", "a", 1000),
    ("alloc", "b", 3 * MiB),
    ("free", "a"),
    ("alloc", "c", 500),
    ("free", "b", 123),
    ("free", "c"),
]

# --------------------------------------------------------------------------------------------
# normalize and peak_live_bytes
# --------------------------------------------------------------------------------------------


def test_normalize_tuples_and_lists():
    assert normalize(TINY) == [
        (True, "a", 1000),
        (True, "b", 3 * MiB),
        (False, "a", 1000),
        (True, "c", 500),
        (False, "b", 3 * MiB),  # the size of a free comes from its alloc
        (False, "c", 500),
    ]
    assert normalize([["alloc", 1, 10], ["free", 1]]) == [(True, 1, 10), (False, 1, 10)]
    assert normalize(iter([("alloc", (1, 2), 7), ("free", (1, 2))])) == [(True, (1, 2), 7), (False, (1, 2), 7)]
    assert normalize([]) == []


def test_normalize_mappings_by_id_or_addr():
    events = [
        {"action": "alloc", "id": "x", "size": 4096},
        {"action": "alloc", "addr": 0x1000, "size": 512},
        {"action": "free", "addr": 0x1000},
        {"action": "free", "id": "x", "size": 1},
    ]
    assert normalize(events) == [(True, "x", 4096), (True, 0x1000, 512), (False, 0x1000, 512), (False, "x", 4096)]


def test_ids_may_be_reused_after_a_free():
    events = [("alloc", 1, 10), ("free", 1), ("alloc", 1, 20), ("free", 1)]
    assert normalize(events) == [(True, 1, 10), (False, 1, 10), (True, 1, 20), (False, 1, 20)]


def test_pytorch_device_trace():
    # A device trace records both halves of a free: the completed one returns the memory.
    events = [
        {"action": "segment_alloc", "addr": 0x100, "size": 2 * MiB},
        {"action": "alloc", "addr": 0x100, "size": 512},
        {"action": "alloc", "addr": 0x300, "size": 1024},
        {"action": "free_requested", "addr": 0x100, "size": 512},
        {"action": "alloc", "addr": 0x700, "size": 2048},
        {"action": "free_completed", "addr": 0x100, "size": 512},
        {"action": "segment_map", "addr": 0x200000, "size": 2 * MiB},
        {"action": "segment_unmap", "addr": 0x200000, "size": 2 * MiB},
        {"action": "snapshot", "addr": 0, "size": 0},
        {"action": "oom", "addr": 0, "size": 4 * MiB},
        {"action": "free_requested", "addr": 0x300, "size": 1024},
        {"action": "free_completed", "addr": 0x300, "size": 1024},
        {"action": "segment_free", "addr": 0x100, "size": 2 * MiB},
    ]
    assert normalize(events) == [
        (True, 0x100, 512),
        (True, 0x300, 1024),
        (True, 0x700, 2048),
        (False, 0x100, 512),
        (False, 0x300, 1024),
    ]
    assert peak_live_bytes(events) == 512 + 1024 + 2048


def test_free_requested_alone_counts_as_the_free():
    events = [
        {"action": "alloc", "addr": 1, "size": 100},
        {"action": "free_requested", "addr": 1, "size": 100},
        {"action": "alloc", "addr": 1, "size": 300},
    ]
    assert normalize(events) == [(True, 1, 100), (False, 1, 100), (True, 1, 300)]
    assert peak_live_bytes(events) == 300


def test_free_completed_alone_counts_as_the_free():
    events = [{"action": "alloc", "addr": 1, "size": 100}, {"action": "free_completed", "addr": 1}]
    assert normalize(events) == [(True, 1, 100), (False, 1, 100)]


@pytest.mark.parametrize(
    "events",
    [
        [("alloc", 1)],
        [("alloc", 1, 0)],
        [("alloc", 1, -5)],
        [("alloc", 1, 1.5)],
        [("alloc", 1, "10")],
        [("alloc", 1, None)],
        [("free", 1)],
        [("free", 1, 10)],
        [("alloc", 1, 10), ("free", 1), ("free", 1)],
        [("alloc", 1, 10), ("alloc", 1, 20)],
        [("resize", 1, 10)],
        [("ALLOC", 1, 10)],
        [("alloc",)],
        [("alloc", 1, 2, 3)],
        [()],
        [42],
        [None],
        [("alloc", 1, 10), "free"],
        [{"id": 1, "size": 10}],
        [{"action": "alloc", "id": 1}],
        [{"action": "alloc", "id": 1, "size": 0}],
        [{"action": "free_requested", "addr": 5}],
        [{"action": "free_completed", "addr": 5}],
    ],
)
def test_malformed_events(events):
    with raises_acl(InvalidParamError, 100000):
        normalize(events)
    with raises_acl(InvalidParamError, 100000):
        peak_live_bytes(events)
    with raises_acl(InvalidParamError, 100000):
        replay.replay(events, {"capacity": "16MiB"})
    with raises_acl(InvalidParamError, 100000):
        min_capacity(events)


def test_malformed_event_message_names_the_event():
    with raises_acl(InvalidParamError, 100000, match="event 2"):
        normalize([("alloc", 1, 10), ("free", 1), ("free", 1)])


def test_peak_live_bytes():
    assert peak_live_bytes([]) == 0
    assert peak_live_bytes(TINY) == 1000 + 3 * MiB
    events = [("alloc", 1, 100), ("alloc", 2, 50), ("free", 1), ("alloc", 3, 120), ("free", 2), ("free", 3)]
    assert peak_live_bytes(events) == 170
    assert peak_live_bytes([("alloc", 1, 7)]) == 7  # never freed


@given(st.lists(st.tuples(st.booleans(), st.integers(1, 1 << 40), st.integers(0, 100)), max_size=60))
def test_peak_live_bytes_matches_a_running_sum(script):
    events, live, peak, n = [], {}, 0, 0
    for is_alloc, size, pick in script:
        if is_alloc or not live:
            events.append(("alloc", n, size))
            live[n] = size
            n += 1
        else:
            key = sorted(live)[pick % len(live)]
            events.append(("free", key))
            del live[key]
        peak = max(peak, sum(live.values()))
    assert peak_live_bytes(events) == peak
    assert len(normalize(events)) == len(events)


# --------------------------------------------------------------------------------------------
# replay
# --------------------------------------------------------------------------------------------


def test_replay_result_fields():
    r = replay.replay(TINY, {"capacity": "64MiB", "allocator": "pytorch"})
    assert isinstance(r, ReplayResult)
    assert r.as_dict() == {
        "allocator": "pytorch",
        "events": 6,
        "allocs": 3,
        "ooms": 0,
        "completed": True,
        "peak_live": 1000 + 3 * MiB,
        "peak_allocated": 1024 + 3 * MiB,
        # One 2 MiB small segment and one 20 MiB large segment; c reuses a's block.
        "peak_reserved": 22 * MiB,
        "device_allocs": 2,
        "device_frees": 0,
        "maps": 2,
        "physical_allocs": 2,
        "cache_hit_rate": pytest.approx(1 / 3),
        "first_oom": None,
        "driver_calls": 4,
        "seconds": pytest.approx(r.seconds),
        "ns_per_event": pytest.approx(r.ns_per_event),
        "alloc_conf": "",
        "capacity": 64 * MiB,
    }


def test_replay_on_npumem():
    r = replay.replay(TINY, {"capacity": "64MiB"})
    assert r.allocator == "npumem"
    assert (r.allocs, r.ooms, r.completed) == (3, 0, True)
    assert r.peak_allocated == 1024 + 3 * MiB
    assert r.peak_reserved == SMALL_PAGE + 2 * 2 * MiB
    assert (r.device_allocs, r.maps, r.physical_allocs, r.device_frees) == (3, 3, 3, 0)
    assert r.cache_hit_rate == pytest.approx(1 / 3)


def test_replay_on_direct():
    r = replay.replay(TINY, {"capacity": "64MiB", "allocator": "direct"})
    # 1000 and 500 bytes get a 4 KiB page each; 3 MiB + 32 gets two 2 MiB pages.
    assert r.peak_allocated == r.peak_reserved == 4 * KiB + 4 * MiB
    assert (r.device_allocs, r.device_frees, r.maps, r.physical_allocs) == (3, 3, 3, 3)
    assert r.cache_hit_rate == 0.0


OOM_TRACE = [("alloc", 1, 12 * MiB), ("alloc", 2, 8 * MiB), ("free", 2), ("alloc", 3, 2 * MiB), ("free", 1)]


def test_replay_counts_out_of_memory_and_skips_the_free():
    r = replay.replay(OOM_TRACE, {"capacity": "16MiB", "allocator": "pytorch"})
    assert (r.allocs, r.ooms, r.completed) == (3, 2, False)
    assert r.peak_live == 12 * MiB
    assert r.peak_reserved == 12 * MiB
    assert "out of memory" in r.first_oom and "8 MiB" in r.first_oom
    assert r.cache_hit_rate == 0.0


def test_replay_stop_on_oom():
    r = replay.replay(OOM_TRACE, {"capacity": "16MiB", "allocator": "pytorch"}, stop_on_oom=True)
    assert (r.allocs, r.ooms, r.completed) == (2, 1, False)


@pytest.mark.parametrize("allocator", ALLOCATORS)
def test_replay_leaves_a_passed_device_without_live_allocations(allocator):
    d = Device("64MiB", allocator=allocator)
    keep = d.malloc(1000)
    d.write(keep, b"keep")
    r = replay.replay([("alloc", 1, 3 * MiB), ("alloc", 2, 100), ("free", 2), ("alloc", 3, 5 * MiB)], d)
    assert r.completed and r.allocator == allocator
    assert [a["ptr"] for a in d.allocations()] == [keep]
    assert d.read(keep, 4) == b"keep"
    assert d.memory_stats()["requested_bytes.all.current"] == 1000
    # The device is reusable, and a second replay sees the cache the first left behind.
    r2 = replay.replay([("alloc", 1, 3 * MiB), ("free", 1)], d)
    assert r2.completed
    if allocator != "direct":
        assert r2.physical_allocs == 0 and r2.cache_hit_rate == 1.0


@pytest.mark.parametrize("allocator", ALLOCATORS)
def test_replay_peaks_are_consistent(allocator):
    events = workloads.transformer_training(layers=2, hidden=256, heads=4, vocab=2000, steps=2, seq=(32, 64))
    r = replay.replay(events, {"capacity": "1GiB", "allocator": allocator})
    assert r.completed and r.ooms == 0
    assert r.events == len(events) and r.allocs == len(events) // 2
    assert r.peak_live == peak_live_bytes(events)
    assert r.peak_reserved >= r.peak_allocated >= r.peak_live
    assert r.device_allocs >= 1 and 0.0 <= r.cache_hit_rate <= 1.0


def test_replay_with_no_config_uses_a_default_device():
    r = replay.replay([("alloc", 1, 100), ("free", 1)])
    assert r.allocator == "npumem" and r.completed


# --------------------------------------------------------------------------------------------
# min_capacity
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("allocator", "granularity", "expected"),
    [
        ("npumem", 2 * MiB, 4 * MiB),  # two 2 MiB pages
        ("npumem", 512 * KiB, 3 * MiB),  # its own segment of normal frames when two pages do not fit
        ("pytorch", 2 * MiB, 20 * MiB),  # a 20 MiB segment for a 1-10 MiB request
        ("torch_npu", 512 * KiB, 20 * MiB),
        ("direct", 2 * MiB, 4 * MiB),  # 3 MiB + 32 on huge pages
        ("direct", 512 * KiB, 3 * MiB + 512 * KiB),  # normal pages when two huge frames do not fit
    ],
)
def test_min_capacity_of_one_allocation(allocator, granularity, expected):
    events = [("alloc", 1, 3 * MiB)]
    assert min_capacity(events, {"allocator": allocator}, granularity=granularity) == expected


def test_min_capacity_ignores_a_capacity_in_the_config():
    events = [("alloc", 1, 3 * MiB)]
    assert min_capacity(events, {"allocator": "pytorch", "capacity": "1GiB"}) == 20 * MiB


def test_min_capacity_passes_the_other_device_arguments():
    events = [("alloc", 1, 3 * MiB)]
    conf = {"allocator": "pytorch", "alloc_conf": "large_segment_size_mb:12"}
    assert min_capacity(events, conf) == 12 * MiB


def test_min_capacity_when_nothing_fits():
    with raises_acl(InvalidParamError, 100000, match="does not fit"):
        min_capacity([("alloc", 1, MiB)], {"alloc_conf": "per_process_memory_fraction:0"})


def check_min_capacity(events, config: dict, granularity: int = 2 * MiB) -> int:
    """min_capacity is a multiple of the granularity, at least the peak, completes there and fails
    one granule below."""
    result = min_capacity(events, config, granularity=granularity)
    assert result % granularity == 0
    assert result >= peak_live_bytes(events)
    assert replay.replay(events, {**config, "capacity": result}, stop_on_oom=True).completed
    below = replay.replay(events, {**config, "capacity": result - granularity}, stop_on_oom=True)
    assert not below.completed and below.ooms == 1
    return result


SMALL_TRACE = {"layers": 2, "hidden": 256, "heads": 4, "vocab": 4000, "steps": 3, "batch": (2, 4), "seq": (64, 192)}


@pytest.mark.parametrize("allocator", ALLOCATORS)
@pytest.mark.parametrize("granularity", [2 * MiB, 512 * KiB])
def test_min_capacity_is_tight(allocator, granularity):
    events = workloads.transformer_training(**SMALL_TRACE)
    check_min_capacity(events, {"allocator": allocator}, granularity)


# --------------------------------------------------------------------------------------------
# The synthetic transformer trace
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("params", [{}, SMALL_TRACE, {"layers": 1, "steps": 1, "seed": 9}])
def test_transformer_training_is_a_valid_trace(params):
    events = workloads.transformer_training(**params)
    live: dict[int, int] = {}
    seen: set[int] = set()
    for action, key, size in events:
        assert type(key) is int and type(size) is int and size > 0
        if action == "alloc":
            assert key not in seen
            seen.add(key)
            live[key] = size
        else:
            assert action == "free"
            assert live.pop(key) == size
    assert live == {}, "every allocation is freed by the end"
    assert len(events) == 2 * len(seen)
    assert len(normalize(events)) == len(events)


def test_transformer_training_shape():
    layers, hidden, vocab = 3, 128, 1000
    events = workloads.transformer_training(layers=layers, hidden=hidden, heads=4, vocab=vocab, steps=2)
    params = [size for _, _, size in events[: 1 + 5 * layers]]
    assert params[0] == vocab * hidden * 2  # the embedding, in 2-byte dtype
    assert params[1:6] == [2 * n for n in (3 * hidden**2, hidden**2, 4 * hidden**2, 4 * hidden**2, 2 * hidden)]
    # Params, grads and the fp32 Adam moments (2x each, twice) are live together: 6x the params.
    assert peak_live_bytes(events) >= 6 * sum(params)


def test_transformer_training_is_deterministic():
    a = workloads.transformer_training(**SMALL_TRACE)
    assert workloads.transformer_training(**SMALL_TRACE) == a
    assert workloads.transformer_training(**{**SMALL_TRACE, "seed": 1}) != a


def test_transformer_training_grows():
    short = workloads.transformer_training(**{**SMALL_TRACE, "steps": 2})
    long = workloads.transformer_training(**{**SMALL_TRACE, "steps": 4})
    assert len(long) > len(short)
    small = peak_live_bytes(workloads.transformer_training(**{**SMALL_TRACE, "batch": (2, 2)}))
    large = peak_live_bytes(workloads.transformer_training(**{**SMALL_TRACE, "batch": (8, 8)}))
    assert large > small


# --------------------------------------------------------------------------------------------
# The benchmark goal
# --------------------------------------------------------------------------------------------

BENCHMARK_TRACES = [
    pytest.param({}, id="default"),
    pytest.param({"layers": 4, "hidden": 768, "heads": 12, "steps": 4}, id="4x768"),
    pytest.param(
        {"layers": 6, "hidden": 1024, "heads": 16, "steps": 4, "batch": (2, 6), "seq": (128, 512), "seed": 7},
        id="6x1024-seed7",
    ),
    pytest.param(
        {"layers": 12, "hidden": 2048, "heads": 16, "steps": 3, "batch": (1, 2), "seq": (512, 1024), "seed": 5},
        id="12x2048",
    ),
]


@pytest.mark.parametrize("params", BENCHMARK_TRACES)
def test_npumem_min_capacity_is_within_2_percent_of_peak(params):
    events = workloads.transformer_training(**params)
    peak = peak_live_bytes(events)
    npumem_cap = check_min_capacity(events, {"allocator": "npumem"})
    pytorch_cap = check_min_capacity(events, {"allocator": "pytorch"})
    torch_npu_cap = min_capacity(events, {"allocator": "torch_npu"})
    assert npumem_cap <= 1.02 * peak, f"npumem needs {npumem_cap / peak:.4f}x the peak"
    assert npumem_cap <= pytorch_cap
    assert npumem_cap <= torch_npu_cap


def test_npumem_is_never_worse_than_pytorch_on_a_small_trace():
    events = workloads.transformer_training(**SMALL_TRACE)
    assert min_capacity(events, {"allocator": "npumem"}) <= min_capacity(events, {"allocator": "pytorch"})
