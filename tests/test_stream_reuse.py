"""Stream-ordered frees and reuse under queued work: correct programs are clean and lose nothing,
hazards are reported and never turn into early reuse."""

from __future__ import annotations

import numpy as np
import pytest

import npumem
from npumem import MemcpyKind

MiB = 1 << 20
FAMILIES = ["npumem", "pytorch", "torch_npu", "direct"]


def kinds(dev: npumem.Device) -> list[str]:
    return [f.kind for f in dev.sanitizer_reports()]


@pytest.fixture(params=FAMILIES)
def dev(request) -> npumem.Device:
    return npumem.Device("256MiB", allocator=request.param)


def staged(dev: npumem.Device, fill: int) -> int:
    """A pinned 1 MiB host buffer full of ``fill``."""
    host = dev.malloc_host(MiB)
    dev.write(host, bytes([fill]) * MiB)
    return host


def test_stream_ordered_free_after_an_async_copy_is_correct(dev):
    s = dev.create_stream()
    p = dev.malloc(MiB, stream=s)
    dev.memcpy_async(p, MiB, staged(dev, 7), MiB, MemcpyKind.HOST_TO_DEVICE, s)
    dev.memset_async(p, MiB, 9, 16, s)
    dev.free(p, stream=s)
    dev.synchronize_device()
    assert kinds(dev) == []
    assert dev.stats()["lost_effects"] == 0
    assert dev.memory_allocated() == 0


def test_record_stream_then_free_after_an_async_copy_is_correct(dev):
    s = dev.create_stream()
    p = dev.malloc(MiB)
    host = dev.malloc_host(MiB)
    dev.memcpy_async(host, MiB, p, MiB, MemcpyKind.DEVICE_TO_HOST, s)
    dev.record_stream(p, s)
    dev.free(p)
    dev.synchronize_device()
    assert kinds(dev) == []
    assert dev.stats()["lost_effects"] == 0


def test_the_copy_of_a_freed_block_lands_before_its_stream_reuses_it(dev):
    # Freed on s with a copy still queued, taken back at once by a malloc on s (stream order
    # runs the new work after the old): a later copy out on s sees the first copy's bytes.
    s = dev.create_stream()
    p = dev.malloc(MiB, stream=s)
    dev.launch(s, 500.0, writes=[p])
    dev.memcpy_async(p, MiB, staged(dev, 5), MiB, MemcpyKind.HOST_TO_DEVICE, s)
    dev.free(p, stream=s)
    q = dev.malloc(MiB, stream=s)
    out = dev.malloc_host(MiB)
    dev.memcpy_async(out, MiB, q, MiB, MemcpyKind.DEVICE_TO_HOST, s)
    dev.synchronize_stream(s)
    assert kinds(dev) == [] and dev.stats()["lost_effects"] == 0
    if q == p:
        assert dev.read(out, 4) == bytes([5] * 4)


def test_a_plain_free_under_another_streams_write_is_a_hazard_and_waits(dev):
    s1, s2 = dev.create_stream(), dev.create_stream()
    a = dev.malloc(MiB)
    dev.launch(s1, 1000.0, writes=[a])
    dev.free(a)
    (finding,) = dev.sanitizer_reports()
    assert finding.kind == "use_after_free" and finding.allocation == a
    assert finding.streams == [s1, -1]
    b = dev.malloc(MiB, stream=s2)
    assert b != a, "a's memory went to s2 while s1's write was still queued"
    dev.synchronize_device()
    assert dev.stats()["pending_frees"] == 0


def test_the_hazard_is_raised_before_the_free_in_raise_mode():
    dev = npumem.Device("64MiB", sanitizer="raise")
    s1 = dev.create_stream()
    a = dev.malloc(MiB)
    dev.launch(s1, 1000.0, writes=[a])
    with pytest.raises(npumem.SanitizerError) as info:
        dev.free(a)
    assert info.value.kind == "use_after_free"
    assert dev.allocation(a) is not None, "a refused free frees nothing"
    dev.record_stream(a, s1)
    dev.free(a)
    with pytest.raises(npumem.SanitizerError):
        b = dev.malloc(MiB)
        dev.launch(s1, 10.0, writes=[b])
        dev.free_many(np.array([b], dtype=np.uint64))
    assert dev.allocation(b) is not None, "a refused batch frees nothing"


def test_an_event_orders_the_work_before_a_free(dev):
    s1 = dev.create_stream()
    a = dev.malloc(MiB)
    dev.launch(s1, 1000.0, writes=[a])
    e = dev.create_event()
    dev.record_event(e, s1)
    dev.synchronize_event(e)
    dev.free(a)
    assert kinds(dev) == []


def test_frees_pending_on_a_destroyed_stream_complete(dev):
    s = dev.create_stream()
    p = dev.malloc(MiB, stream=s)
    dev.launch(s, 1000.0, writes=[p])
    q = dev.malloc(MiB)
    dev.memcpy_async(q, MiB, staged(dev, 3), MiB, MemcpyKind.HOST_TO_DEVICE, s)
    dev.free(p, stream=s)
    dev.destroy_stream(s)
    dev.synchronize_device()
    assert dev.stats()["pending_frees"] == 0
    assert dev.memory_allocated() == dev.allocation(q)["granted"]
    assert dev.read(q, 2) == b"\x03\x03", "the destroyed stream's copy completed"
    dev.free(q)
    dev.empty_cache()
    dev.trim_to(0)
    assert dev.memory_allocated() == 0 and dev.memory_reserved() == 0
    assert kinds(dev) == []


def test_reads_of_memory_written_on_a_destroyed_stream_need_no_extra_sync(dev):
    s = dev.create_stream()
    p = dev.malloc(MiB)
    dev.memset_async(p, MiB, 1, MiB, s)
    dev.destroy_stream(s)
    dev.synchronize_device()
    assert dev.read(p, 1) == b"\x01"
    assert kinds(dev) == []


def test_a_block_taken_back_by_another_stream_belongs_to_that_stream(dev):
    # s1's block is written by the default stream, then freed (a hazard: the default stream's
    # write is not ordered before it); the default stream follows its own write, so it may take
    # the block back at once (event dependencies) — and the block is then the default stream's.
    s1 = dev.create_stream()
    p = dev.malloc(1500, stream=s1)
    dev.launch(0, 500.0, writes=[p])
    dev.free(p)
    assert kinds(dev) == ["use_after_free"]
    q = dev.malloc(1500)
    if dev.stats()["event_dependency_reuses"] == 0:
        pytest.skip(f"the {dev.allocator} family placed the block elsewhere")
    assert q == p and dev.allocation(q)["stream"] == 0
    dev.clear_sanitizer_reports()
    dev.free(q)  # freed on its own stream, whose write it waits for: no hazard
    assert kinds(dev) == []
