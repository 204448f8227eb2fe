"""The CUDA backend on a real GPU (the AscendCL backend on a real NPU with NPUMEM_BACKEND=acl):
run by `make bench B=gpu` (NPUMEM_CHECK_GPU=1, the vendor library from the loader path), skipped
in `make test`. Device memory is not the host's here: bytes go through write/read and the
runtime's copies.
"""

from __future__ import annotations

import os

import pytest
from conftest import REAL_DEVICE, MiB

import npumem
from npumem import AclError, MemAttr

BACKEND = os.environ.get("NPUMEM_BACKEND") or "cuda"

pytestmark = pytest.mark.skipif(not REAL_DEVICE, reason="needs a GPU or NPU: run `make bench B=gpu`")

FAMILIES = ("npumem", "pytorch", "torch_npu", "direct")


@pytest.fixture
def dev():
    return npumem.Device("1GiB", backend=BACKEND)


def test_the_runtimes_pages():
    d = npumem.Device("1GiB", backend=BACKEND, allocator="direct")
    assert d.normal_page >= 4096 and d.normal_page & (d.normal_page - 1) == 0
    assert d.mem_get_allocation_granularity(MemAttr.HBM_HUGE) % d.normal_page == 0


@pytest.mark.parametrize("family", FAMILIES)
def test_malloc_write_read_free_on_each_family(family):
    d = npumem.Device("1GiB", backend=BACKEND, allocator=family)
    sizes = [1, 512, 4096, 100_000, 3 * MiB, 17 * MiB]
    ptrs = [d.malloc(size) for size in sizes]
    for i, (p, size) in enumerate(zip(ptrs, sizes, strict=True)):
        d.write(p, bytes([i + 1]) * size)
    for i, (p, size) in enumerate(zip(ptrs, sizes, strict=True)):
        assert d.read(p, size) == bytes([i + 1]) * size
    for p in ptrs:
        d.free(p)
    d.empty_cache()
    assert d.memory_reserved() == 0


def test_streams_order_async_work_and_reuse(dev):
    s1, s2 = dev.create_stream(), dev.create_stream()
    size = 256 * MiB
    p = dev.malloc(size, stream=s1)
    dev.memset_async(p, size, 0x11, size, stream=s1)
    dev.free(p, stream=s1)
    q = dev.malloc(size, stream=s2)
    dev.memset_async(q, size, 0x22, size, stream=s2)
    dev.synchronize_device()
    assert dev.read(q, 64) == b"\x22" * 64 and dev.read(q + size - 64, 64) == b"\x22" * 64
    e = dev.create_event()
    dev.memset_async(q, size, 0x33, size, stream=s2)
    dev.record_event(e, stream=s2)
    dev.stream_wait_event(s1, e)
    dev.synchronize_stream(s1)
    assert dev.query_event(e) == 0  # ACL_EVENT_STATUS_COMPLETE
    assert dev.read(q, 64) == b"\x33" * 64
    dev.destroy_event(e)
    dev.free(q, stream=s2)
    dev.synchronize_device()


def test_two_mappings_of_one_allocation_alias():
    d = npumem.Device("1GiB", backend=BACKEND, allocator="direct")
    g = d.mem_get_allocation_granularity(MemAttr.HBM_HUGE)
    h = d.malloc_physical(g, MemAttr.HBM_HUGE)
    va = d.reserve_mem_address(2 * g)
    d.map_mem(va, h)
    d.map_mem(va + g, h)
    d.write(va, b"gpu!")
    assert d.read(va + g, 4) == b"gpu!"
    d.unmap_mem(va)
    d.unmap_mem(va + g)
    d.free_physical(h)
    d.release_mem_address(va)


def test_out_of_capacity_is_207001():
    d = npumem.Device("64MiB", backend=BACKEND, allocator="direct")
    with pytest.raises(AclError) as info:
        d.malloc(128 * MiB)
    assert info.value.code == 207001
