"""Batch APIs: many mallocs or frees in one call over numpy arrays."""

from __future__ import annotations

import random

import numpy as np
import pytest
from conftest import BOTH_BACKENDS, run_in_threads

import npumem

MiB = 1 << 20


pytestmark = BOTH_BACKENDS


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
    with pytest.raises(npumem.InvalidParamError):
        dev.malloc_many(np.array([0], dtype=np.uint64))
    # A strided view (or a list) is taken too: it is copied into a contiguous uint64 array.
    dev.free_many(np.repeat(ptrs, 2)[::2])
    assert dev.stats()["live_count"] == 0
    dev.free_many(dev.malloc_many([4096, 8192]))
    assert dev.stats()["live_count"] == 0


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


def test_threads_never_get_overlapping_blocks_checked_against_a_shared_map():
    """N Python threads malloc and free random sizes on one device; every live block is entered
    in one shared, ordered map of address ranges, which must never see an overlap."""
    import bisect
    import threading

    dev = npumem.Device("2GiB")
    starts: list[int] = []
    ends: dict[int, int] = {}
    lock = threading.Lock()

    def enter(p: int, size: int) -> None:
        with lock:
            i = bisect.bisect_left(starts, p)
            assert i == len(starts) or p + size <= starts[i], f"{p:#x} overlaps the next block"
            assert i == 0 or ends[starts[i - 1]] <= p, f"{p:#x} overlaps the previous block"
            starts.insert(i, p)
            ends[p] = p + size

    def leave(p: int) -> None:
        with lock:
            starts.pop(bisect.bisect_left(starts, p))
            del ends[p]

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        mine = []
        for _ in range(400):
            if mine and rng.random() < 0.45:
                p = mine.pop(rng.randrange(len(mine)))
                leave(p)
                dev.free(p)
            elif rng.random() < 0.2:
                sizes = np.array([rng.choice([512, 4096, 40_000]) for _ in range(8)], dtype=np.uint64)
                for p, size in zip(dev.malloc_many(sizes).tolist(), sizes.tolist(), strict=True):
                    enter(p, size)
                    mine.append(p)
            else:
                size = rng.choice([64, 4096, 70_000, 1 << 20, 3 << 20])
                p = dev.malloc(size)
                enter(p, size)
                mine.append(p)
        for p in mine:
            leave(p)
            dev.free(p)

    assert run_in_threads(worker, 4) == []
    assert starts == [] and dev.stats()["live_count"] == 0
