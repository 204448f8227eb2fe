"""Driver failures injected into random workloads on every allocator family
(``Device(faults=True)``, ``inject_faults``): every failed call leaves no leak, the statistics
equal a recount, the bytes of live blocks survive, and the device keeps working."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import raises_acl
from hypothesis import given
from hypothesis import strategies as st

import npumem
from npumem import Policy

KiB, MiB = 1 << 10, 1 << 20
CAPACITY = 96 * MiB
FAMILIES = [("npumem", ""), ("npumem", "large_threshold_mb:4"), ("pytorch", ""), ("torch_npu", ""), ("direct", "")]


def check(dev: npumem.Device, data: dict[int, bytes]) -> None:
    """Statistics against a recount, physical memory against what the allocator says it holds,
    and every live block's bytes (after a synchronisation, whose reaping of stream-ordered frees
    may meet an armed fault too)."""
    dev.synchronize_device()
    allocations = dev.allocations()
    stats, pool = dev.stats(), dev.memory_stats()
    assert sorted(a["ptr"] for a in allocations) == sorted(data)
    assert stats["live_count"] == len(allocations)
    assert stats["live_granted"] == sum(a["granted"] for a in allocations)
    if stats["pending_frees"] == 0:  # else a failed reap keeps a freed block for the next try
        assert pool["allocated_bytes.all.current"] == sum(a["granted"] for a in allocations)
        assert pool["requested_bytes.all.current"] == sum(a["size"] for a in allocations)
    # Every frame in use belongs to the allocator's reservation: nothing leaked below it.
    free, total = dev.mem_info()
    assert total - free == pool["reserved_bytes.all.current"], (total - free, pool["reserved_bytes.all.current"])
    segments = dev.memory_snapshot()["segments"]
    assert sum(s["allocated_size"] for s in segments) == pool["allocated_bytes.all.current"]
    assert stats["lost_effects"] == 0
    assert dev.page_table_stats()["mapped_bytes"] <= pool["reserved_bytes.all.current"]
    for ptr, payload in data.items():
        assert dev.read(ptr, len(payload)) == payload


OPS = st.lists(
    st.tuples(
        st.sampled_from(
            ["malloc", "malloc", "malloc_many", "free", "free", "free_many", "empty_cache", "trim_to", "launch"]
        ),
        st.integers(1, 24 * MiB),
        st.sampled_from([Policy.HUGE_FIRST, Policy.HUGE_FIRST, Policy.NORMAL_ONLY, Policy.HUGE_ONLY]),
        st.integers(0, 1 << 16),
        # The fault to arm before the step: which call and when (none half the time).
        st.sampled_from([None, None, "physical_alloc", "physical_alloc_driver", "map", "unmap"]),
        st.sampled_from([1, 1, 2, 3]),
    ),
    min_size=1,
    max_size=40,
)


@pytest.mark.parametrize(("allocator", "alloc_conf"), FAMILIES)
@given(ops=OPS)
def test_failed_driver_calls_leave_no_leak_and_the_device_working(allocator, alloc_conf, ops):
    dev = npumem.Device(CAPACITY, allocator=allocator, alloc_conf=alloc_conf or None, faults=True)
    honours = allocator in ("npumem", "direct")
    data: dict[int, bytes] = {}
    rng = np.random.default_rng(len(ops))
    stream = dev.create_stream()

    def stamp(ptr: int) -> None:
        payload = rng.integers(0, 256, min(16, dev.allocation(ptr)["size"]), dtype=np.uint8).tobytes()
        dev.write(ptr, payload)
        data[ptr] = payload

    for kind, size, policy, pick, fault, nth in ops:
        policy = policy if honours else Policy.HUGE_FIRST
        if fault == "physical_alloc_driver":
            dev.inject_faults(physical_alloc=nth, driver_error=True)
        elif fault:
            dev.inject_faults(**{fault: nth})
        try:
            if kind == "malloc":
                stamp(dev.malloc(size if pick % 4 else size % (64 * KiB) + 1, policy))
            elif kind == "malloc_many":
                sizes = np.array([size // (i + 1) + 1 for i in range(1 + pick % 4)], dtype=np.uint64)
                for p in dev.malloc_many(sizes, policy):
                    stamp(int(p))
            elif kind == "free" and data:
                ptr = sorted(data)[pick % len(data)]
                dev.free(ptr, stream=stream if pick % 3 == 0 else None)
                del data[ptr]
            elif kind == "launch" and data:
                # Queued work: the block's free waits for it (a deferred free, reaped later).
                dev.launch(stream, 100.0, writes=[sorted(data)[pick % len(data)]])
            elif kind == "free_many" and data:
                ptrs = sorted(data)[pick % len(data) :][:3]
                try:
                    dev.free_many(np.array(ptrs, dtype=np.uint64))
                finally:
                    # A driver failure part way leaves the pointers not yet freed live.
                    for p in ptrs:
                        if dev.allocation(p) is None:
                            del data[p]
            elif kind == "empty_cache":
                dev.empty_cache()
            elif kind == "trim_to":
                dev.trim_to(size)
        except (npumem.OutOfMemoryError, npumem.InternalError) as e:
            # Only the injected failures, or running out of memory for real.
            assert isinstance(e, npumem.OutOfMemoryError) or "injected" in e.message, e
            assert "panic" not in e.message and "please report" not in e.message, e
        check(dev, data)
    # Disarmed, the device gives everything back and keeps working.
    dev.inject_faults()
    dev.free_many(np.array(sorted(data), dtype=np.uint64))
    dev.synchronize_device()
    assert dev.stats()["pending_frees"] == 0
    dev.empty_cache()
    assert dev.mem_info() == (CAPACITY, CAPACITY)
    assert dev.page_table_stats()["mapped_bytes"] == 0
    stats = dev.stats()
    assert stats["physical_allocs"] == stats["physical_frees"] and stats["maps"] == stats["unmaps"]
    p = dev.malloc(8 * MiB)
    dev.write(p + 8 * MiB - 1, b"\x01")
    dev.free(p)


def test_faults_are_armed_counted_and_validated():
    dev = npumem.Device("64MiB", allocator="direct", faults=True)
    dev.inject_faults(physical_alloc=2)
    p = dev.malloc(4 * MiB)
    # HUGE_FIRST would fall back to normal pages; HUGE_ONLY reports the failure.
    with raises_acl(npumem.OutOfMemoryError, 207001, match="injected"):
        dev.malloc(4 * MiB, Policy.HUGE_ONLY)
    dev.inject_faults(map=1, driver_error=True)
    with raises_acl(npumem.InternalError, 507899, match="injected"):
        dev.malloc(4 * MiB)
    dev.inject_faults(unmap=1)
    with raises_acl(npumem.InternalError, 507899, match="injected"):
        dev.free(p)
    assert dev.allocation(p) is not None, "a free that failed frees nothing"
    dev.free(p)
    assert dev.faults() == {
        "injected": {"physical_alloc": 1, "map": 1, "unmap": 1},
        "armed": {"physical_alloc": None, "map": None, "unmap": None},
    }
    assert dev.mem_info() == (64 * MiB, 64 * MiB)
    with raises_acl(npumem.InvalidParamError, 100000, match="map=0"):
        dev.inject_faults(map=0)
    with raises_acl(npumem.UnsupportedError, 200006, match="faults=True"):
        npumem.Device("64MiB").inject_faults(map=1)


def test_a_stream_ordered_free_the_driver_fails_is_retried():
    dev = npumem.Device("64MiB", allocator="direct", faults=True)
    s = dev.create_stream()
    p = dev.malloc(MiB, stream=s)
    dev.launch(s, 100.0, writes=[p])
    dev.free(p)
    assert dev.stats()["pending_frees"] == 1
    dev.inject_faults(unmap=1)
    dev.synchronize_device()  # the reap's unmap fails: the block stays pending
    assert dev.stats()["pending_frees"] == 1 and dev.memory_allocated() > 0
    dev.synchronize_device()
    assert dev.stats()["pending_frees"] == 0 and dev.memory_allocated() == 0
    assert dev.mem_info() == (64 * MiB, 64 * MiB)
