"""Streams, events and async copies on the simulated clock."""

from __future__ import annotations

import numpy as np
import pytest

import npumem
from npumem import MemcpyKind
from npumem.pipelines import double_buffered, render_timeline, scratch_loop

MiB = 1 << 20


@pytest.fixture
def dev():
    return npumem.Device("512MiB")


def test_async_copy_lands_only_when_it_completes(dev):
    n = 16 * MiB
    host = dev.malloc_host(n)
    buf = dev.malloc(n)
    dev.write(host, np.full(n, 9, np.uint8))
    dev.memset(buf, n, 0, n)
    s = dev.create_stream()
    start, end = dev.memcpy_async(buf, n, host, n, MemcpyKind.HOST_TO_DEVICE, s)
    cost = dev.cost_model()
    expected = (cost["pcie_latency_ns"] + n / cost["pcie_pinned_bandwidth"] * 1e9) / 1e3
    assert end - start == pytest.approx(expected, abs=1e-3)
    assert dev.now_us() < end
    assert dev.to_numpy(buf, 4).tolist() == [0, 0, 0, 0]  # the host looks before the copy is done
    dev.synchronize_stream(s)
    assert dev.now_us() >= end
    assert dev.to_numpy(buf + n - 4, 4).tolist() == [9, 9, 9, 9]


def test_device_to_host_async_copy_into_pinned_memory(dev):
    n = MiB
    buf, host = dev.malloc(n), dev.malloc_host(n)
    dev.write(buf, np.arange(n, dtype=np.uint8))
    s = dev.create_stream()
    dev.memset_async(buf, n, 42, 16, s)
    dev.memcpy_async(host, n, buf, n, MemcpyKind.DEVICE_TO_HOST, s)
    assert dev.read(host, 16) == bytes(16)
    dev.synchronize_stream(s)
    assert dev.read(host, 17) == bytes([42] * 16) + bytes([16])


def test_events_order_streams_and_report_status(dev):
    a, b = dev.malloc(MiB), dev.malloc(MiB)
    compute, copy = dev.create_stream(), dev.create_stream()
    _, kernel_end = dev.launch(compute, 2000.0, reads=[a], writes=[a])
    done = dev.create_event()
    dev.record_event(done, compute)
    assert dev.query_event(done) == 1  # ACL_EVENT_STATUS_NOT_READY
    dev.stream_wait_event(copy, done)
    start, _ = dev.memcpy_async(b, MiB, a, MiB, MemcpyKind.DEVICE_TO_DEVICE, copy)
    assert start == pytest.approx(kernel_end)
    dev.synchronize_event(done)
    assert dev.query_event(done) == 0  # ACL_EVENT_STATUS_COMPLETE
    assert dev.now_us() == pytest.approx(kernel_end)
    begin = dev.create_event()
    dev.record_event(begin, dev.create_stream())
    assert dev.event_elapsed_time(done, begin) == pytest.approx((dev.now_us() - kernel_end) / 1e3)
    unrecorded = dev.create_event()
    assert dev.query_event(unrecorded) == 0
    with pytest.raises(npumem.InvalidParamError, match="never recorded"):
        dev.event_elapsed_time(unrecorded, done)


def test_stream_and_event_errors(dev):
    with pytest.raises(npumem.InvalidParamError, match="stream 99"):
        dev.launch(99, 1.0)
    with pytest.raises(npumem.InvalidParamError, match="event 99"):
        dev.record_event(99)
    with pytest.raises(npumem.InvalidParamError, match="default stream"):
        dev.destroy_stream(0)
    s = dev.create_stream()
    dev.destroy_stream(s)
    with pytest.raises(npumem.InvalidParamError):
        dev.synchronize_stream(s)
    with pytest.raises(npumem.InvalidParamError, match="duration"):
        dev.launch(0, -1.0)
    with pytest.raises(npumem.InvalidParamError):
        dev.launch(0, 1.0, reads=[12345])
    host = dev.malloc_host(64)
    buf = dev.malloc(64)
    with pytest.raises(npumem.InvalidParamError, match="dst_max"):
        dev.memcpy_async(buf, 10, host, 64, MemcpyKind.HOST_TO_DEVICE, 0)
    with pytest.raises(npumem.InvalidParamError):
        dev.memset_async(buf + 64, 64, 0, 1)


def test_freeing_pinned_memory_under_a_queued_copy_drops_the_effect(dev):
    host, buf = dev.malloc_host(MiB), dev.malloc(MiB)
    dev.memcpy_async(buf, MiB, host, MiB, MemcpyKind.HOST_TO_DEVICE, dev.create_stream())
    dev.free_host(host)  # aclrtFreeHost does not wait for queued work
    dev.synchronize_device()
    assert dev.stats()["lost_effects"] == 1
    assert [f.kind for f in dev.sanitizer_reports()] == ["use_after_free"]


@pytest.mark.parametrize("n", [4096, MiB])
def test_a_dropped_copy_never_lands_in_the_next_pinned_block(dev, n):
    """A D2H copy queued on a pinned block that is then freed is lost with it: it must not land
    in the next malloc_host block given the same address (it did, corrupting that block)."""
    buf = dev.malloc(n)
    dev.memset(buf, n, 0xAB, n)
    s = dev.create_stream()
    dev.launch(s, 1000.0, [buf], [buf])
    host = dev.malloc_host(n)
    dev.memcpy_async(host, n, buf, n, MemcpyKind.DEVICE_TO_HOST, s)
    dev.free_host(host)
    fresh = [dev.malloc_host(n) for _ in range(4)]
    for h in fresh:
        dev.write(h, np.zeros(n, np.uint8))
    dev.synchronize_device()
    assert dev.stats()["lost_effects"] == 1
    assert all(not dev.read(h, n).strip(b"\0") for h in fresh)


def test_cost_model_presets_and_overrides(dev):
    assert dev.cost_model()["name"] == "ascend910b"
    dev.use_preset("ascend310p")
    assert dev.cost_model()["hbm_bandwidth"] == pytest.approx(204.8e9)
    dev.set_cost("launch_ns", 0)
    s = dev.create_stream()
    assert dev.launch(s, 10.0) == pytest.approx((dev.now_us(), dev.now_us() + 10.0))
    with pytest.raises(npumem.InvalidParamError):
        dev.set_cost("hbm_bandwidth", 0)
    with pytest.raises(npumem.InvalidParamError, match="unknown cost field"):
        dev.set_cost("warp_speed", 1)
    with pytest.raises(npumem.InvalidParamError, match="preset"):
        npumem.Device("64MiB", preset="gpu9000")


def test_double_buffered_pipeline_overlaps_as_predicted():
    dev = npumem.Device("1GiB")
    serial = double_buffered(dev, batches=6, batch_bytes=32 * MiB, kernel_us=800.0, overlap=False)
    piped = double_buffered(dev, batches=6, batch_bytes=32 * MiB, kernel_us=800.0, overlap=True)
    assert serial.total_us == pytest.approx(serial.predicted_us, rel=1e-3)
    assert piped.total_us == pytest.approx(piped.predicted_us, rel=1e-3)
    assert piped.total_us < 0.65 * serial.total_us
    copy_spans = [s for s in piped.timeline if s["label"] == "copy H2D"]
    kernels = [s for s in piped.timeline if s["label"] == "kernel"]
    # Batch i+1's copy runs while batch i computes.
    assert any(c["start_us"] < k["end_us"] and k["start_us"] < c["end_us"] for c in copy_spans for k in kernels)
    chart = render_timeline(piped.timeline, 60)
    assert "C" in chart and "K" in chart and chart.count("stream") == 2
    assert dev.memory_allocated() == 0


def test_frees_wait_for_queued_work_and_the_same_stream_reuses_at_once(dev):
    s, other = dev.create_stream(), dev.create_stream()
    x = dev.malloc(8 * MiB, stream=s)
    assert dev.allocation(x)["stream"] == s
    dev.launch(s, 1000.0, reads=[x], writes=[x])
    dev.free(x)
    st = dev.stats()
    assert (st["deferred_frees"], st["pending_frees"]) == (1, 1)
    with pytest.raises(npumem.InvalidParamError, match="use after free"):
        dev.read(x, 1)
    y = dev.malloc(8 * MiB, stream=other)
    assert y != x  # another stream must wait for the kernel
    z = dev.malloc(8 * MiB, stream=s)
    assert z == x and dev.stats()["same_stream_reuses"] == 1
    dev.free(y)
    dev.free(z)
    dev.synchronize_device()
    assert dev.stats()["pending_frees"] == 0
    with pytest.raises(npumem.InvalidParamError, match="stream 77"):
        dev.malloc(16, stream=77)


def test_record_stream_holds_the_free_for_the_other_stream(dev):
    a, b = dev.create_stream(), dev.create_stream()
    x = dev.malloc(MiB, stream=a)
    dev.launch(b, 3000.0, reads=[x])
    dev.record_stream(x, b)
    dev.free(x)
    dev.synchronize_stream(a)
    assert dev.stats()["pending_frees"] == 1
    dev.synchronize_stream(b)
    assert dev.stats()["pending_frees"] == 0
    with pytest.raises(npumem.InvalidParamError, match="not a live allocation"):
        dev.record_stream(x, b)


def test_out_of_memory_waits_for_pending_frees():
    dev = npumem.Device("256MiB")
    dev.set_pool_attr(npumem.MemPoolAttr.REUSE_ALLOW_INTERNAL_DEPENDENCIES, False)
    s = dev.create_stream()
    x = dev.malloc(200 * MiB, stream=s)
    dev.launch(s, 5000.0, writes=[x])
    dev.free(x)
    y = dev.malloc(200 * MiB)
    assert dev.stats()["sync_reclaims"] == 1 and dev.now_us() >= 5000.0
    dev.free(y)


@pytest.mark.parametrize(
    ("mode", "bubble", "peak_blocks"), [("sync", True, 1), ("event", False, 1), ("stream", False, 1)]
)
def test_scratch_loop_bubble_and_memory(mode, bubble, peak_blocks):
    dev = npumem.Device("1GiB")
    r = scratch_loop(dev, iterations=20, scratch_bytes=32 * MiB, kernel_us=200.0, mode=mode)
    launch_us = dev.cost_model()["launch_ns"] / 1e3
    assert r.device_busy_us == pytest.approx(20 * 200.0)
    if bubble:
        assert r.idle_us == pytest.approx(20 * launch_us, rel=0.01)
        assert r.host_blocked == 20
    else:
        assert r.idle_us == pytest.approx(launch_us, rel=0.01)
    assert r.peak_reserved == peak_blocks * 32 * MiB
    with pytest.raises(ValueError):
        scratch_loop(dev, mode="psychic")


def test_pageable_async_copies_are_synchronous_and_stream_ordered(dev):
    s = dev.create_stream()
    buf = dev.malloc(4 * MiB)
    _, kernel_end = dev.launch(s, 3000.0, writes=[buf])
    data = np.arange(4 * MiB, dtype=np.uint8)
    dev.write(buf, data, stream=s)  # pageable: returns only when done, after the kernel
    assert dev.now_us() > kernel_end
    spans = [x for x in dev.timeline() if x["label"] == "copy H2D (pageable)"]
    assert spans and spans[-1]["start_us"] == pytest.approx(kernel_end)
    assert np.array_equal(dev.to_numpy(buf, 4 * MiB, stream=s), data)
    host = dev.malloc_host(16)
    with pytest.raises(npumem.InvalidParamError, match="host memory"):
        dev.write(host, b"x" * 16, stream=s)


def test_pool_attributes_and_reuse_policies():
    dev = npumem.Device("256MiB")
    A = npumem.MemPoolAttr
    assert [dev.get_pool_attr(a) for a in (A(1), A(2), A(3), A(4))] == [True, True, True, None]
    a, b = dev.create_stream(), dev.create_stream()
    x = dev.malloc(200 * MiB, stream=a)
    _, end = dev.launch(a, 5000.0, writes=[x])
    dev.free(x)
    y = dev.malloc(200 * MiB, stream=b)  # internal dependency: b waits for a's free
    assert y == x and dev.stats()["internal_dependency_reuses"] == 1
    assert dev.launch(b, 1.0, reads=[y])[0] >= end
    assert dev.now_us() < end
    assert dev.sanitizer_reports() == []  # the inserted dependency orders b after a
    dev.free(y)
    # Event dependencies: b follows a's free through an event.
    z = dev.malloc(MiB, stream=a)
    dev.launch(a, 100.0, writes=[z])
    dev.free(z)
    e = dev.create_event()
    dev.record_event(e, a)
    dev.stream_wait_event(b, e)
    assert dev.malloc(MiB, stream=b) == z and dev.stats()["event_dependency_reuses"] == 1
    dev.set_pool_attr(A.RELEASE_THRESHOLD, "16MiB")
    assert dev.get_pool_attr(A.RELEASE_THRESHOLD) == 16 * MiB
    dev.synchronize_device()
    assert dev.get_pool_attr(A.RESERVED_MEM_CURRENT) <= 16 * MiB
    assert dev.get_pool_attr(A.USED_MEM_HIGH) >= 200 * MiB
    with pytest.raises(npumem.InvalidParamError, match="read-only"):
        dev.set_pool_attr(A.USED_MEM_CURRENT, 1)
    with pytest.raises(npumem.InvalidParamError):
        dev.set_pool_attr(42, True)


def test_driver_calls_cost_host_time():
    dev = npumem.Device("256MiB", allocator="direct")
    cost = dev.cost_model()
    t0 = dev.now_us()
    p = dev.malloc(8 * MiB)  # one physical allocation and one map
    assert dev.now_us() - t0 == pytest.approx((cost["driver_alloc_ns"] + cost["map_ns"]) / 1e3)
    t1 = dev.now_us()
    dev.free(p)  # one unmap and one physical free
    assert dev.now_us() - t1 == pytest.approx((cost["driver_alloc_ns"] + cost["map_ns"]) / 1e3)
    pool = npumem.Device("256MiB")
    pool.free(pool.malloc(8 * MiB))
    t2 = pool.now_us()
    pool.free(pool.malloc(8 * MiB))  # served from the cache: no driver call
    assert pool.now_us() == t2


def test_pending_frees_reap_in_completion_order_without_head_of_line_blocking(dev):
    slow, fast = dev.create_stream(), dev.create_stream()
    x = dev.malloc(MiB, stream=slow)
    y = dev.malloc(MiB, stream=fast)
    dev.launch(slow, 10_000.0, writes=[x])
    _, fast_end = dev.launch(fast, 100.0, writes=[y])
    dev.free(x)  # freed first, completes last
    dev.free(y)
    assert dev.stats()["pending_frees"] == 2
    dev.synchronize_stream(fast)  # the host is now past y's work, not x's
    assert dev.now_us() == pytest.approx(fast_end)
    assert dev.stats()["pending_frees"] == 1  # y came back although x, freed before it, did not
    z = dev.malloc(MiB, stream=dev.create_stream())
    assert z == y  # a completed block is reusable by any stream, without a device sync
    dev.synchronize_device()
    assert dev.stats()["pending_frees"] == 0
