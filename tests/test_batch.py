"""Batch APIs: many mallocs or frees in one call over numpy arrays."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import run_in_threads

import npumem

MiB = 1 << 20


@pytest.mark.parametrize("allocator", ["npumem", "pytorch", "direct"])
def test_malloc_many_and_free_many(allocator):
    dev = npumem.Device("256MiB", allocator=allocator)
    sizes = np.array([64, 4096, 3 * MiB, 100], dtype=np.uint64)
    ptrs = dev.malloc_many(sizes)
    assert ptrs.dtype == np.uint64 and len(ptrs) == 4
    assert [dev.allocation(int(p))["size"] for p in ptrs] == sizes.tolist()
    dev.write(int(ptrs[2]), b"abc")
    assert dev.read(int(ptrs[2]), 3) == b"abc"
    dev.free_many(ptrs)
    assert dev.stats()["live_count"] == 0


def test_batches_are_all_or_nothing():
    dev = npumem.Device("64MiB")
    with pytest.raises(npumem.OutOfMemoryError, match="size #1"):
        dev.malloc_many(np.array([4096, 1 << 40], dtype=np.uint64))
    assert dev.stats()["live_count"] == 0
    ptrs = dev.malloc_many(np.array([4096, 4096], dtype=np.uint64))
    with pytest.raises(npumem.MemoryFreeError, match="twice"):
        dev.free_many(np.array([ptrs[0], ptrs[0]], dtype=np.uint64))
    with pytest.raises(npumem.MemoryFreeError, match="nothing was freed"):
        dev.free_many(np.array([ptrs[0], 12345], dtype=np.uint64))
    assert dev.stats()["live_count"] == 2
    with pytest.raises(ValueError, match="contiguous"):
        dev.free_many(np.repeat(ptrs, 2)[::2])
    with pytest.raises(npumem.InvalidParamError):
        dev.malloc_many(np.array([0], dtype=np.uint64))
    dev.free_many(ptrs)


def test_batch_on_a_stream_and_threads():
    import itertools

    dev = npumem.Device("1GiB")
    s = dev.create_stream()
    ptrs = dev.malloc_many(np.full(100, 8192, dtype=np.uint64), stream=s)
    assert {dev.allocation(int(p))["stream"] for p in ptrs} == {s}
    dev.free_many(ptrs)

    def worker(_: int):
        for _ in range(20):
            got = dev.malloc_many(np.full(50, 4096, dtype=np.uint64))
            ranges = sorted((int(p), int(p) + 4096) for p in got)
            assert all(a[1] <= b[0] for a, b in itertools.pairwise(ranges))
            dev.free_many(got)

    errors = run_in_threads(worker, 4)
    assert errors == [] and dev.stats()["live_count"] == 0
