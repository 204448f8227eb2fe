"""The CUDA backend on a real GPU (the AscendCL backend on a real NPU with NPUMEM_BACKEND=acl):
run by `make check-gpu` and `make bench B=gpu` (NPUMEM_CHECK_GPU=1, the vendor library from the
loader path), skipped in `make test`. Device memory is not the host's here: bytes go through
write/read and the runtime's copies.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import REAL_DEVICE, MiB

import npumem
from npumem import AclError, MemAttr

BACKEND = os.environ.get("NPUMEM_BACKEND") or "cuda"

pytestmark = pytest.mark.skipif(not REAL_DEVICE, reason="needs a GPU or NPU: run `make check-gpu`")

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


def test_memset_then_a_copy_on_a_non_blocking_stream_reads_the_new_bytes(dev):
    s = dev.create_stream()
    size = 64 * MiB
    p, q = dev.malloc(size), dev.malloc(size)
    dev.memset(p, size, 0x5A, size)
    dev.memcpy_async(q, size, p, size, stream=s)
    dev.synchronize_stream(s)
    assert dev.read(q + size - 64, 64) == b"\x5a" * 64
    dev.free(p)
    dev.free(q)


def test_a_mapped_free_physical_waits_for_the_unmap():
    d = npumem.Device("1GiB", backend=BACKEND, allocator="direct")
    g = d.mem_get_allocation_granularity(MemAttr.HBM_HUGE)
    h = d.malloc_physical(g, MemAttr.HBM_HUGE)
    va = d.reserve_mem_address(g)
    d.map_mem(va, h)
    d.free_physical(h)
    d.write(va, b"mapped")
    assert d.read(va, 6) == b"mapped"
    d.unmap_mem(va)
    d.release_mem_address(va)


#: libnpumem under the real driver (or AscendCL) from 4 threads, each bound to the device with
#: the runtime's own call, which every call must leave current.
CAPI_THREADS = r"""
import ctypes, json, os, threading
import npumem.capi as capi
lib = capi.load()
lib.npumem_init(1)
backend = os.environ["NPUMEM_BACKEND"]
if backend == "cuda":
    rt = ctypes.CDLL("libcuda.so.1")
    rt.cuDevicePrimaryCtxRetain.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int]
    rt.cuCtxSetCurrent.argtypes = [ctypes.c_void_p]
    rt.cuCtxGetCurrent.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
    assert rt.cuInit(0) == 0
    ctx = ctypes.c_void_p()
    assert rt.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0) == 0
    def bind(): assert rt.cuCtxSetCurrent(ctx) == 0
    def current():
        c = ctypes.c_void_p(); rt.cuCtxGetCurrent(ctypes.byref(c)); return c.value == ctx.value
else:
    rt = ctypes.CDLL("libascendcl.so")
    def bind(): assert rt.aclrtSetDevice(0) == 0
    def current():
        d = ctypes.c_int(-1); return rt.aclrtGetDevice(ctypes.byref(d)) == 0 and d.value == 0
errors = []
def worker(t):
    bind()
    for i in range(200):
        n = (1 + (i * 7 + t) % 64) << 16
        p = lib.npumem_malloc(n, 0, None)
        if not p:
            errors.append(lib.npumem_last_error().decode()); return
        lib.npumem_free(p, n, 0, None)
        if not current():
            errors.append(f"thread {t}: the device is no longer current"); return
threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
for th in threads: th.start()
for th in threads: th.join()
lib.npumem_empty_cache()
print(json.dumps({"errors": errors, "allocated": capi.device_stats(lib, 0)["allocation.all.allocated"]}))
"""


def test_libnpumem_from_threads_under_the_real_runtime():
    env = {k: v for k, v in os.environ.items() if not k.startswith("NPUMEM_")}
    env.update(NPUMEM_BACKEND=BACKEND, NPUMEM_CAPACITY="4GiB")
    proc = subprocess.run([sys.executable, "-c", CAPI_THREADS], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out == {"errors": [], "allocated": 800}
