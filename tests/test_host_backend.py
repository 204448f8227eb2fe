"""The host backend (`Device(backend="host")`): real memory behind every allocator family —
pointers a program can dereference, mappings that alias, zero-copy numpy views, huge pages from
the kernel's hugetlb pool (or a clear error naming /proc/sys/vm/nr_hugepages), and the
simulator-only features refused. The allocator, statistics, snapshot and error suites run on
this backend too (the modules marked BOTH_BACKENDS)."""

from __future__ import annotations

import ctypes
import gc

import numpy as np
import pytest
from conftest import HUGE_PAGES_WANTED, GiB, MiB, free_huge_pages, raises_acl

import npumem
from npumem import MemAttr, Policy

FAMILIES = ["npumem", "pytorch", "torch_npu", "direct"]


@pytest.fixture
def huge(host_huge_pages) -> int:
    if host_huge_pages < HUGE_PAGES_WANTED:
        pytest.skip(
            f"no 2 MiB huge pages ({host_huge_pages} free): reserve some with echo N > /proc/sys/vm/nr_hugepages"
        )
    return host_huge_pages


@pytest.mark.parametrize("allocator", FAMILIES)
def test_pointers_are_real_memory(allocator):
    d = npumem.Device("256MiB", backend="host", allocator=allocator)
    assert d.backend == "host" and 'backend="host"' in repr(d)
    p = d.malloc(MiB)
    d.write(p, b"written by the device")
    # The pointer is this process's memory: ctypes reads and writes it directly.
    assert ctypes.string_at(p, 21) == b"written by the device"
    ctypes.memmove(p + 100, b"and by ctypes", 13)
    assert d.read(p + 100, 13) == b"and by ctypes"
    q = d.malloc(3 * MiB)
    d.memcpy(q, 3 * MiB, p, MiB, npumem.MemcpyKind.DEVICE_TO_DEVICE)
    assert ctypes.string_at(q + 100, 13) == b"and by ctypes"
    d.free(p)
    d.free(q)
    d.empty_cache()
    assert d.memory_reserved() == 0 and d.mem_info() == (256 * MiB, 256 * MiB)


@pytest.mark.parametrize("backend", ["host", "sim"])
def test_two_mappings_of_one_physical_allocation_alias(backend):
    d = npumem.Device("64MiB", backend=backend)
    page = d.mem_get_allocation_granularity(MemAttr.MEM_NORMAL)
    h = d.malloc_physical(4 * page, MemAttr.MEM_NORMAL)
    va = d.reserve_mem_address(16 * page)
    d.map_mem(va, h)
    d.map_mem(va + 8 * page, h)
    d.write(va + 10, b"uva")
    assert d.read(va + 8 * page + 10, 3) == b"uva"
    if backend == "host":
        assert ctypes.string_at(va + 8 * page + 10, 3) == b"uva"
    assert d.translate(va + 10)[0] == d.translate(va + 8 * page + 10)[0]
    with raises_acl(npumem.InvalidParamError, 107000, match="unmap_mem"):
        d.release_mem_address(va)
    view = d.to_numpy(va + 8 * page, 3 * page, copy=False) if backend == "host" else None
    if view is not None:
        assert bytes(view[10:13]) == b"uva"
        with raises_acl(npumem.MemoryFreeError, 207002, match="view"):
            d.unmap_mem(va + 8 * page)
        del view
        gc.collect()
    d.free_physical(h)  # still mapped: the memory stays until the last unmap
    d.unmap_mem(va)
    assert d.read(va + 8 * page + 10, 3) == b"uva"
    d.unmap_mem(va + 8 * page)
    with raises_acl(npumem.InvalidParamError, 107000, match="use after free"):
        d.read(va + 10, 1)  # the window stays the device's: an unmapped address is no one else's
    d.release_mem_address(va)
    assert d.mem_info() == (64 * MiB, 64 * MiB)


def test_vmm_calls_check_their_arguments():
    d = npumem.Device("64MiB", backend="host")
    page = d.mem_get_allocation_granularity(MemAttr.MEM_NORMAL)
    with raises_acl(npumem.InvalidParamError, 100000, match="granularity"):
        d.malloc_physical(page + 1, MemAttr.MEM_NORMAL)
    with raises_acl(npumem.InvalidParamError, 100000, match="ACL_DDR_MEM"):
        d.malloc_physical(page, MemAttr.DDR)
    with raises_acl(npumem.InvalidParamError, 100000, match="alignment"):
        d.reserve_mem_address(page, alignment=4096)
    h = d.malloc_physical(page, MemAttr.MEM_NORMAL)
    va = d.reserve_mem_address(page)
    with raises_acl(npumem.InvalidParamError, 100000, match="equal"):
        d.map_mem(va, h, size=2 * page)
    with raises_acl(npumem.InvalidParamError, 100000, match="inside one reservation"):
        d.map_mem(va + page, h)
    wide = d.reserve_mem_address(2 * page)
    with raises_acl(npumem.InvalidParamError, 107008, match="not page aligned"):
        d.map_mem(wide + 100, h)
    d.release_mem_address(wide)
    with raises_acl(npumem.InvalidHandleError, 107017):
        d.map_mem(va, h + 1000)
    d.free_physical(h)
    with raises_acl(npumem.InvalidHandleError, 107017):
        d.free_physical(h)
    d.release_mem_address(va)


@pytest.mark.parametrize("backend", ["sim", "host"])
def test_a_handle_of_another_device_is_refused(backend):
    """Handles are unique in the process: another device's handle is unknown here, never one of
    this device's own allocations, and nothing changes on either device."""
    a = npumem.Device("64MiB", backend=backend)
    b = npumem.Device("64MiB", backend=backend)
    page = a.mem_get_allocation_granularity(MemAttr.MEM_NORMAL)
    mine = b.malloc_physical(page, MemAttr.MEM_NORMAL)
    theirs = a.malloc_physical(page, MemAttr.MEM_NORMAL)
    va = b.reserve_mem_address(page)
    before = b.memory_stats()
    with raises_acl(npumem.InvalidHandleError, 107017):
        b.map_mem(va, theirs)
    with raises_acl(npumem.InvalidHandleError, 107017):
        b.free_physical(theirs)
    assert b.memory_stats() == before
    b.map_mem(va, mine)
    b.unmap_mem(va)
    for dev, h in ((b, mine), (a, theirs)):
        dev.free_physical(h)
    b.release_mem_address(va)


def test_zero_copy_views_are_the_memory_and_pin_it():
    d = npumem.Device("64MiB", backend="host")
    p = d.malloc(4 * 1024 * 4)
    a = d.to_numpy(p, (4, 1024), np.float32, copy=False)
    a[:] = np.arange(4096, dtype=np.float32).reshape(4, 1024)
    assert np.array_equal(d.to_numpy(p, (4, 1024), np.float32), a), "writes land in device memory"
    d.write(p, np.float32(-1.0))
    assert a[0, 0] == -1.0, "and the view sees the device's writes"
    with raises_acl(npumem.MemoryFreeError, 207002, match="view"):
        d.free(p)
    with raises_acl(npumem.MemoryFreeError, 207002, match="view"):
        d.free_many(np.array([p], dtype=np.uint64))
    row = a[1]
    del a
    gc.collect()
    with raises_acl(npumem.MemoryFreeError, 207002):
        d.free(p)  # a slice keeps the view alive
    del row
    gc.collect()
    d.free(p)
    sim = npumem.Device("64MiB")
    with raises_acl(npumem.UnsupportedError, 200006, match='backend="host"'):
        sim.to_numpy(sim.malloc(64), 16, copy=False)


def test_simulator_only_features_say_so():
    d = npumem.Device("64MiB", backend="host")
    for call in (d.frame_stats, d.page_table_stats):
        with raises_acl(npumem.UnsupportedError, 200006, match="host backend"):
            call()
    with raises_acl(npumem.InvalidParamError, 100000, match="giant_frames"):
        npumem.Device("4GiB", backend="host", giant_frames=1)


def test_huge_only_past_the_hugetlb_pool_names_nr_hugepages(host_huge_pages):
    # More 2 MiB pages than the kernel's pool has free (none where none are reserved).
    free = free_huge_pages()
    size = (free + 1) * 2 * MiB
    d = npumem.Device(size + 64 * MiB, backend="host", allocator="direct")
    with raises_acl(npumem.OutOfMemoryError, 207001, match="nr_hugepages"):
        d.malloc(size - 64, Policy.HUGE_ONLY)
    if free == 0:
        p = d.malloc(4 * MiB, Policy.HUGE_FIRST)  # falls back to normal pages, as on the device
        assert d.allocation(p)["page_size"] == 4096
        assert d.stats()["huge_fallbacks"] == 1


@pytest.mark.parametrize("allocator", ["npumem", "direct"])
def test_huge_pages_from_the_hugetlb_pool(huge, allocator):
    d = npumem.Device("256MiB", backend="host", allocator=allocator)
    p = d.malloc(8 * MiB, Policy.HUGE_ONLY)
    assert d.allocation(p)["page_size"] == 2 * MiB
    assert all(d.translate(p + k * 2 * MiB)[1] == 2 * MiB for k in range(4))
    view = d.to_numpy(p, 8 * MiB, np.uint8, copy=False)
    view[::4096] = 7  # every 4 KiB of every huge page is there
    assert d.read(p + 8 * MiB - 4096, 1) == b"\x07"
    del view
    gc.collect()
    d.free(p)
    with pytest.raises(npumem.OutOfMemoryError):
        npumem.Device("64GiB", backend="host", allocator="direct").malloc(8 * GiB, Policy.HUGE_ONLY)


def test_stream_ordered_frees_and_the_sanitizer_work_on_real_memory():
    d = npumem.Device("64MiB", backend="host")
    s = d.create_stream()
    p = d.malloc(MiB, stream=s)
    host = d.malloc_host(MiB)
    ctypes.memset(host, 9, MiB)
    d.memcpy_async(p, MiB, host, MiB, npumem.MemcpyKind.HOST_TO_DEVICE, s)
    d.read(p, 1)  # before the copy completes: a pending write read
    assert [f.kind for f in d.sanitizer_reports()] == ["pending_write_read"]
    d.free(p, stream=s)
    d.synchronize_device()
    assert d.stats()["lost_effects"] == 0 and d.memory_allocated() == 0
