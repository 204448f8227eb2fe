"""Block reuse in the npumem pool: freed blocks wait in exact-size stacks and come back in O(1);
the live table is a hash map with a lazily synced address index. Reuse is invisible: use-after-free
and out-of-bounds detection, interior pointers, statistics, snapshots, fragmentation, coalescing
and batch all-or-nothing."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import npumem

KiB, MiB = 1 << 10, 1 << 20


def test_a_freed_block_comes_back_for_the_same_size_and_is_dead_meanwhile():
    dev = npumem.Device("64MiB")
    p = dev.malloc(4096)
    dev.write(p, b"x" * 4096)
    dev.free(p)
    # Dead at once, although its memory waits in the pool's stack.
    with pytest.raises(npumem.AclError, match="use after free"):
        dev.write(p, b"y")
    with pytest.raises(npumem.MemoryFreeError, match="double free"):
        dev.free(p)
    q = dev.malloc(4096)
    assert q == p  # most recently freed first
    dev.write(q + 4095, b"z")
    with pytest.raises(npumem.AclError, match="past the end"):
        dev.write(q + 4090, b"123456789")
    dev.free(q)


def test_interior_pointers_are_found_after_churn():
    dev = npumem.Device("256MiB")
    rng = random.Random(1)
    live: list[tuple[int, int]] = []
    for step in range(3000):
        if live and rng.random() < 0.45:
            p, _ = live.pop(rng.randrange(len(live)))
            dev.free(p)
        else:
            size = rng.choice([512, 4096, 10_000, 70 * KiB])
            live.append((dev.malloc(size), size))
        if step % 97 == 0 and live:
            p, size = live[rng.randrange(len(live))]
            off = rng.randrange(size)
            dev.write(p + off, b"!")  # an interior pointer needs the address index
            assert dev.read(p + off, 1) == b"!"
    freed = dev.malloc(4096)
    dev.free(freed)
    with pytest.raises(npumem.AclError, match="use after free"):
        dev.write(freed + 100, b"?")
    dev.free_many(np.array([p for p, _ in live], dtype=np.uint64))
    assert dev.stats()["live_count"] == 0


def test_stats_snapshot_and_fragmentation_count_waiting_blocks_as_free():
    dev = npumem.Device("64MiB")
    ptrs = [dev.malloc_align32(4096) for _ in range(8)]
    before = dev.memory_stats()
    for p in ptrs[::2]:
        dev.free(p)
    s = dev.memory_stats()
    assert s["allocation.all.current"] == 4
    assert s["allocated_bytes.all.current"] == before["allocated_bytes.all.current"] // 2
    assert s["allocation.all.freed"] == 4
    # The snapshot shows the waiting blocks as inactive blocks between the live ones.
    (seg,) = dev.memory_snapshot()["segments"]
    allocated = [b["address"] for b in seg["blocks"] if b["state"] == "active_allocated"]
    assert allocated == sorted(ptrs[1::2])
    inactive = [b for b in seg["blocks"] if b["state"] == "inactive" and b["address"] < max(ptrs)]
    assert [b["address"] for b in inactive] == sorted(ptrs[::2])
    f = dev.fragmentation()
    assert f["allocated"] == 4 * 4096
    assert f["free"] == f["reserved"] - f["allocated"]
    # A request of another size releases the waiting blocks first: best fit then finds the
    # lowest hole, exactly as without the stacks.
    big = dev.malloc_align32(3 * 4096)
    assert big > max(ptrs)  # no hole of 12 KiB between the live 4 KiB blocks
    for p in ptrs[1::2]:
        dev.free(p)
    again = dev.malloc_align32(8 * 4096)
    assert again == min(ptrs)  # the eight blocks coalesced into one 32 KiB hole
    dev.free(big)
    dev.free(again)
    dev.empty_cache()
    assert dev.memory_stats()["reserved_bytes.all.current"] == 0


def test_empty_cache_and_trim_see_waiting_blocks():
    dev = npumem.Device("64MiB")
    ptrs = dev.malloc_many(np.full(64, 60 * KiB, dtype=np.uint64))
    dev.free_many(ptrs)
    assert dev.memory_stats()["reserved_bytes.all.current"] > 0
    dev.empty_cache()
    assert dev.memory_stats()["reserved_bytes.all.current"] == 0
    assert dev.mem_info()[0] == 64 * MiB


def test_out_of_memory_reclaims_waiting_blocks():
    dev = npumem.Device("64MiB")
    small = dev.malloc_many(np.full(900, 64 * KiB - 64, dtype=np.uint64))
    dev.free_many(small)
    # Nearly all memory is mapped under waiting small blocks; a large request must still fit.
    big = dev.malloc(48 * MiB)
    dev.free(big)


def test_free_many_is_all_or_nothing_and_leaves_no_marks():
    dev = npumem.Device("64MiB")
    ptrs = dev.malloc_many(np.full(10, 4096, dtype=np.uint64))
    bad = ptrs.copy()
    bad[7] = bad[2]
    with pytest.raises(npumem.MemoryFreeError, match=r"#7.*twice"):
        dev.free_many(bad)
    bad[7] = 0x1234
    with pytest.raises(npumem.MemoryFreeError, match="#7"):
        dev.free_many(bad)
    assert dev.stats()["live_count"] == 10
    # The failed checks left nothing behind: the same pointers free normally, one by one too.
    dev.free(int(ptrs[2]))
    dev.free_many(np.delete(ptrs, 2))
    assert dev.stats()["live_count"] == 0


@pytest.mark.parametrize("policy", [npumem.Policy.HUGE_FIRST, npumem.Policy.HUGE_ONLY, npumem.Policy.NORMAL_ONLY])
def test_policies_keep_their_pages_through_reuse(policy):
    dev = npumem.Device("256MiB")
    for size in (4096, 3 * MiB):
        p = dev.malloc(size, policy)
        page = dev.allocation(p)["page_size"]
        dev.free(p)
        q = dev.malloc(size, policy)
        assert dev.allocation(q)["page_size"] == page
        if policy == npumem.Policy.HUGE_ONLY:
            assert page == 2 * MiB
        if policy == npumem.Policy.NORMAL_ONLY:
            assert page < 2 * MiB
        dev.free(q)


def test_free_many_mixes_immediate_and_stream_ordered_frees():
    dev = npumem.Device("256MiB")
    s, other = dev.create_stream(), dev.create_stream()
    busy = dev.malloc_many(np.full(3, 8192, dtype=np.uint64), stream=s)
    idle = dev.malloc_many(np.full(4, 8192, dtype=np.uint64))
    shared = dev.malloc(8192)
    dev.launch(s, 1000.0, writes=[int(p) for p in busy])
    dev.launch(other, 2000.0, reads=[shared])
    dev.record_stream(shared, other)
    batch = np.concatenate([idle[:2], busy, [shared], idle[2:]]).astype(np.uint64)
    dev.free_many(batch)
    st = dev.stats()
    assert st["live_count"] == 0 and st["frees"] == 8
    # The blocks the kernels still use wait for them; the idle ones were freed at once.
    assert (st["deferred_frees"], st["pending_frees"]) == (4, 4)
    for p in batch:
        with pytest.raises(npumem.AclError, match="use after free"):
            dev.write(int(p), b"x")
    # Same-stream reuse still works for the stream-ordered ones.
    again = dev.malloc(8192, stream=s)
    assert again in set(int(p) for p in busy)
    dev.free(again)
    dev.synchronize_device()
    assert dev.stats()["pending_frees"] == 0
    assert dev.memory_stats()["allocated_bytes.all.current"] == 0


def test_batches_and_single_calls_leave_the_same_statistics():
    sizes = np.array([512, 4096, 4096, 70_000, 3 * MiB, 600 * MiB, 4096, 100], dtype=np.uint64)
    one, many = npumem.Device("2GiB"), npumem.Device("2GiB")
    for _ in range(3):
        ptrs_one = [one.malloc(int(s)) for s in sizes]
        ptrs_many = many.malloc_many(sizes)
        assert ptrs_one == ptrs_many.tolist()
        assert one.memory_stats() == many.memory_stats()
        for p in ptrs_one[::-1]:
            one.free(p)
        many.free_many(ptrs_many[::-1].copy())
        assert one.memory_stats() == many.memory_stats()
        assert one.stats() == many.stats()
        assert one.memory_snapshot()["segments"] == many.memory_snapshot()["segments"]


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.booleans(),
            st.lists(st.sampled_from([512, 4096, 5000, 70_000, 2 * MiB, 3 * MiB]), min_size=1, max_size=12),
            st.randoms(use_true_random=False),
        ),
        min_size=1,
        max_size=12,
    )
)
def test_batches_behave_like_single_calls(steps):
    """Random rounds of allocations and frees, made one call at a time on one device and as
    batches on another: the same pointers, statistics and snapshots after every round."""
    one, many = npumem.Device("1GiB"), npumem.Device("1GiB")
    live: list[int] = []
    for alloc, sizes, rnd in steps:
        if alloc or not live:
            got_one = [one.malloc(s) for s in sizes]
            got_many = many.malloc_many(np.array(sizes, dtype=np.uint64)).tolist()
            assert got_one == got_many
            live += got_one
        else:
            rnd.shuffle(live)
            k = rnd.randint(1, len(live))
            batch, live = live[:k], live[k:]
            for p in batch:
                one.free(p)
            many.free_many(np.array(batch, dtype=np.uint64))
        assert one.memory_stats() == many.memory_stats()
        assert one.stats() == many.stats()
        assert one.memory_snapshot()["segments"] == many.memory_snapshot()["segments"]
        assert one.fragmentation() == many.fragmentation()
