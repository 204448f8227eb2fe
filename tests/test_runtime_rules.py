"""What the real AscendCL and CUDA driver require of npumem, against the stand-in runtimes made
as strict as the real ones on each point (docs/architecture.md, "Runtime rules npumem relies
on"):

- every entry point (`Device` calls, libnpumem) leaves the calling thread's current device
  (AscendCL) or context (CUDA) as it found it: 4 threads on 2 devices, each working on one
  device and allocating on the other;
- the AscendCL backend opens on a CANN release before 8.5, whose physical memory takes only the
  `ACL_HBM_MEM_*` attributes (`NPUMEM_FAKE_CANN=8.3`);
- `free_physical` of a mapped handle never reaches `aclrtFreePhysical` (which refuses it);
- CUDA's synchronous memset is complete, for npumem's non-blocking streams too, when
  `Device.memset` returns;
- a never-recorded event reads as each runtime answers (AscendCL: not ready; CUDA: complete);
- the stand-ins refuse count-0 copies as AscendCL does, keep CUDA's legacy and per-thread
  default streams apart, and refuse a stream of another device;
- the CUDA backend's mappings are granted to the peers that can access the device's memory;
- `npumem.acl` runs on the `acl` and `cuda` backends, device i the runtime's device i.
"""

from __future__ import annotations

import ctypes
import gc
import threading
import time

import pytest
from conftest import STAND_INS, MiB, StandIn
from test_capi import run

import npumem
from npumem import AclError, MemAttr

#: The calls a scenario uses to read and set the thread's current device, per runtime.
CURRENT = {
    "acl": """
rt = ctypes.CDLL(LIB)
rt.aclrtSetDevice.argtypes = [ctypes.c_int]
rt.aclrtGetDevice.argtypes = [ctypes.POINTER(ctypes.c_int)]

def bind(device):
    assert rt.aclrtSetDevice(device) == 0

def current():
    d = ctypes.c_int(-1)
    return d.value if rt.aclrtGetDevice(ctypes.byref(d)) == 0 else None
""",
    "cuda": """
rt = ctypes.CDLL(LIB)
vp = ctypes.c_void_p
rt.cuDevicePrimaryCtxRetain.argtypes = [ctypes.POINTER(vp), ctypes.c_int]
rt.cuCtxSetCurrent.argtypes = [vp]
rt.cuCtxGetCurrent.argtypes = [ctypes.POINTER(vp)]
assert rt.cuInit(0) == 0
CTX = []
for _d in range(2):
    _c = vp()
    assert rt.cuDevicePrimaryCtxRetain(ctypes.byref(_c), _d) == 0
    CTX.append(_c.value)

def bind(device):
    assert rt.cuCtxSetCurrent(CTX[device] if device is not None else None) == 0

def current():
    c = vp()
    assert rt.cuCtxGetCurrent(ctypes.byref(c)) == 0
    return CTX.index(c.value) if c.value else None
""",
}

#: 4 threads, each bound to one device, allocating, writing and freeing on the other.
THREADS = """
errors = []

def worker(t, work):
    try:
        mine = t % 2
        bind(mine)
        for i in range(10):
            work(1 - mine, i)
            if current() != mine:
                errors.append(f"thread {t} round {i}: device {current()} is current, not {mine}")
                bind(mine)
    except Exception as e:  # noqa: BLE001 - reported by the parent
        errors.append(f"thread {t}: {e!r}")

threads = [threading.Thread(target=worker, args=(t, WORK)) for t in range(4)]
for th in threads:
    th.start()
for th in threads:
    th.join()
"""

DEVICE_SCENARIO = (
    """
import npumem
devices = [npumem.Device("64MiB", backend=BACKEND, device_id=i) for i in range(2)]

def WORK(device, i):
    d = devices[device]
    p = d.malloc((i + 1) << 16)
    d.memset(p, 4096, 0x40 + device, 4096)
    assert d.read(p, 4) == bytes([0x40 + device]) * 4
    s = d.create_stream()
    d.free(p, stream=s)
    d.synchronize_stream(s)
    d.destroy_stream(s)
"""
    + THREADS
)

CAPI_SCENARIO = (
    """
lib.npumem_init(2); ok("init")

def WORK(device, i):
    n = (i + 1) << 16
    p = lib.npumem_malloc(n, device, NULL); ok("malloc")
    lib.npumem_free(p, n, device, NULL); ok("free")
    lib.npumem_empty_cache(); ok("empty_cache")
"""
    + THREADS
)


def two_devices(backend: str) -> dict[str, str]:
    return {
        "NPUMEM_BACKEND": backend,
        "NPUMEM_ACL_LIB": str(STAND_INS / "libascendcl.so"),
        "NPUMEM_CUDA_LIB": str(STAND_INS / "libcuda.so"),
        "NPUMEM_CAPACITY": "64MiB",
        "NPUMEM_FAKE_GRANULARITY": "4KiB",
        "NPUMEM_FAKE_DEVICES": "2",
    }


#: What a scenario prints last, unless it prints its own.
REPORT = 'print(json.dumps({"errors": errors, "main": current()}))\n'


def scenario(backend: str, body: str, report: str = REPORT, helpers: bool = True) -> str:
    lib = STAND_INS / ("libascendcl.so" if backend == "acl" else "libcuda.so")
    head = f"LIB = {str(lib)!r}\nBACKEND = {backend!r}\n" + (CURRENT[backend] if helpers else "")
    return head + body + report


@pytest.mark.parametrize("backend", ["acl", "cuda"])
def test_device_calls_leave_each_threads_device_as_they_found_it(backend):
    out = run(scenario(backend, DEVICE_SCENARIO), env=two_devices(backend))
    assert out["errors"] == []


@pytest.mark.parametrize("backend", ["acl", "cuda"])
def test_libnpumem_leaves_each_threads_device_as_it_found_it(backend):
    # torch_npu and PyTorch's pluggable allocators call free with the block's device and no
    # guard of their own, from a thread working on another device.
    out = run(scenario(backend, CAPI_SCENARIO), env=two_devices(backend))
    assert out["errors"] == []


def test_a_cuda_thread_without_a_context_has_none_after_a_call():
    body = """
import npumem
d = npumem.Device("64MiB", backend="cuda")
bind(None)
d.free(d.malloc(1 << 20))
errors = [] if current() is None else [f"context of device {current()} left current"]
"""
    out = run(scenario("cuda", body), env=two_devices("cuda"))
    assert out["errors"] == [] and out["main"] is None


OLD_CANN = """
import npumem
d = npumem.Device("64MiB", backend="acl")
prop = (ctypes.c_uint32 * 8)(0, 0, 12, 0, 1, 0, 0, 0)  # ACL_MEM_NORMAL on device 0
g = ctypes.c_size_t()
refused = rt.aclrtMemGetAllocationGranularity(prop, 0, ctypes.byref(g))
p = d.malloc(3 << 20)
d.write(p, b"old cann")
errors = [] if d.read(p, 8) == b"old cann" else ["the bytes did not come back"]
print(json.dumps({"refused": refused, "page": d.normal_page, "errors": errors}))
"""


def test_the_acl_backend_opens_on_a_cann_release_before_8_5():
    env = {**two_devices("acl"), "NPUMEM_FAKE_CANN": "8.3"}
    out = run(scenario("acl", OLD_CANN, report=""), env=env)
    assert out["refused"] == 100000, "the stand-in did not behave as CANN 8.3 (ACL_MEM_NORMAL accepted)"
    assert out["errors"] == []
    assert out["page"] == 2 * MiB, "ACL_HBM_MEM_NORMAL is allocated as huge pages"


def test_a_mapped_free_physical_waits_for_the_unmap(stand_in: StandIn):
    baseline = stand_in.counts().held()
    d = npumem.Device("64MiB", backend=stand_in.backend)
    g = d.mem_get_allocation_granularity(MemAttr.MEM_NORMAL)
    va = d.reserve_mem_address(2 * g)
    h = d.malloc_physical(g, MemAttr.MEM_NORMAL)
    d.map_mem(va, h)
    d.free_physical(h)  # mapped: the runtime's free waits (aclrtFreePhysical refuses it)
    d.write(va, b"still mapped")
    assert d.read(va, 12) == b"still mapped"
    held = stand_in.counts()
    assert held.handles == baseline["handles"] + 1, "the runtime still holds the mapped memory"
    d.unmap_mem(va)
    assert stand_in.counts().handles == baseline["handles"], "the last unmap freed it in the runtime"
    d.release_mem_address(va)
    with pytest.raises(AclError):
        d.free_physical(h)
    del d
    gc.collect()
    assert stand_in.counts().held() == baseline


def test_cuda_memset_is_complete_for_npumems_streams():
    s = StandIn("cuda")
    try:
        d = npumem.Device("64MiB", backend="cuda")
        stream = d.create_stream()  # non-blocking: it does not wait for the legacy stream
        p, q = d.malloc(MiB), d.malloc(MiB)
        d.memset(p, MiB, 0, MiB)
        d.memset(q, MiB, 0, MiB)
        s.set_delay_us(200_000)
        d.memset(p, MiB, 0x5A, MiB)
        time.sleep(0.02)  # (a memset still queued would be the legacy stream's by now)
        s.set_delay_us(0)
        d.memcpy_async(q, MiB, p, MiB, stream=stream)
        d.synchronize_stream(stream)
        assert d.read(q, 16) == b"\x5a" * 16, "the copy on npumem's stream ran before the memset"
        d.memcpy(q, MiB, p, 16)
        assert d.read(q, 16) == b"\x5a" * 16
        d.free(p)
        d.free(q)
        d.destroy_stream(stream)
    finally:
        s.set_delay_us(0)


@pytest.mark.parametrize(("backend", "fresh"), [("acl", 1), ("cuda", 0)])
def test_a_never_recorded_event_reads_as_the_runtime_answers(backend, fresh):
    # 0: ACL_EVENT_STATUS_COMPLETE, 1: NOT_READY. AscendCL's events start in their initial state
    # (not ready); CUDA's query of a never-recorded event succeeds.
    d = npumem.Device("64MiB", backend=backend)
    s = d.create_stream()
    e = d.create_event()
    assert d.query_event(e) == fresh
    d.record_event(e, stream=s)
    d.synchronize_event(e)
    assert d.query_event(e) == 0
    d.destroy_event(e)
    again = d.create_event()  # the backend may hand out a recorded one again: it reads as new
    assert d.query_event(again) == fresh
    d.destroy_event(again)
    d.destroy_stream(s)


def test_acl_refuses_count_0_copies():
    rt = StandIn("acl").lib
    buf = ctypes.create_string_buffer(16)
    assert rt.aclrtSetDevice(0) == 0
    assert rt.aclrtMemcpy(buf, 16, buf, 0, 0) == 107000
    assert rt.aclrtMemcpy(buf, 0, buf, 0, 0) == 107000
    # npumem never hands the runtime a copy of nothing.
    d = npumem.Device("64MiB", backend="acl")
    p = d.malloc(4096)
    d.memcpy(p, 4096, p, 0)
    d.memcpy_async(p, 4096, p, 0)
    d.synchronize_device()
    d.free(p)


def test_cuda_legacy_and_per_thread_streams_are_distinct():
    s = StandIn("cuda")
    rt = s.lib
    vp = ctypes.c_void_p
    rt.cuDevicePrimaryCtxRetain.argtypes = [ctypes.POINTER(vp), ctypes.c_int]
    rt.cuCtxSetCurrent.argtypes = [vp]
    rt.cuStreamQuery.argtypes = [vp]
    rt.cuMemsetD8Async.argtypes = [ctypes.c_uint64, ctypes.c_ubyte, ctypes.c_size_t, vp]
    rt.cuStreamSynchronize.argtypes = [vp]
    d = npumem.Device("64MiB", backend="cuda")
    p = d.malloc(MiB)
    ctx = vp()
    assert rt.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0) == 0
    assert rt.cuCtxSetCurrent(ctx) == 0
    try:
        s.set_delay_us(100_000)
        assert rt.cuMemsetD8Async(p, 1, 4096, vp(2)) == 0  # CU_STREAM_PER_THREAD
        assert rt.cuStreamQuery(vp(2)) == 600, "the per-thread stream has the queued memset"
        assert rt.cuStreamQuery(vp(1)) == 0, "the legacy stream is another stream"
        assert rt.cuStreamQuery(None) == 0
        other = []
        t = threading.Thread(target=lambda: (rt.cuCtxSetCurrent(ctx), other.append(rt.cuStreamQuery(vp(2)))))
        t.start()
        t.join()
        assert other == [0], "another thread's per-thread stream is its own"
        assert rt.cuStreamSynchronize(vp(2)) == 0
    finally:
        s.set_delay_us(0)
    d.free(p)


PEERS = """
import npumem
d = npumem.Device("64MiB", backend="cuda", device_id=0)
p = d.malloc(1 << 20)
d.write(p, b"peer")
rt.cuMemcpyDtoH_v2.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_size_t]
buf = ctypes.create_string_buffer(4)
bind(1)  # a kernel or copy of device 1 on device 0's memory
code = rt.cuMemcpyDtoH_v2(buf, p, 4)
print(json.dumps({"code": code, "bytes": buf.raw.decode(errors="replace")}))
"""


def test_cuda_peers_are_granted_access_to_the_backends_mappings():
    out = run(scenario("cuda", PEERS, report=""), env=two_devices("cuda"))
    assert out == {"code": 0, "bytes": "peer"}, "device 1 (a peer) was not granted access"


PYACL = """
import npumem.acl as acl
import numpy as np
assert acl.init() == 0
n, ret = acl.rt.get_device_count()
ptrs, errors = [], []
for d in range(2):
    assert acl.rt.set_device(d) == 0
    p, ret = acl.rt.malloc(1 << 20, 0)
    assert ret == 0, ret
    src = np.full(1 << 20, 0x30 + d, np.uint8)
    assert acl.rt.memcpy(p, 1 << 20, src.ctypes.data, 1 << 20, 1) == 0
    ptrs.append(p)
assert acl.rt.set_device(0) == 0
out = np.zeros(4, np.uint8)
assert acl.rt.memcpy(out.ctypes.data, 4, ptrs[1], 4, 2) == 0  # device 1's block, from device 0
assert acl.rt.device_can_access_peer(0, 1) == (1, 0)
assert acl.rt.device_enable_peer_access(1, 0) == 0
code = acl.rt.memcpy(ptrs[0], 4, ptrs[1], 4, 3)  # a peer copy
assert code == 0, (code, acl.get_recent_err_msg())
back = np.zeros(4, np.uint8)
assert acl.rt.memcpy(back.ctypes.data, 4, ptrs[0], 4, 2) == 0
for d, p in enumerate(ptrs):
    assert acl.rt.set_device(d) == 0
    assert acl.rt.free(p) == 0
assert acl.rt.reset_device(0) == 0 and acl.rt.reset_device(1) == 0
assert acl.finalize() == 0
print(json.dumps({"count": n, "read": out.tolist(), "peer": back.tolist(), "errors": errors}))
"""


#: Device 1 of a runtime that has one: the runtime itself refuses it.
PYACL_ONE_DEVICE = """
import npumem.acl as acl
assert acl.init() == 0
ret = acl.rt.set_device(1)
print(json.dumps({"ret": ret, "message": acl.get_recent_err_msg()}))
"""


@pytest.mark.parametrize("backend", ["acl", "cuda"])
def test_pyacl_on_the_runtime_backends_each_device_its_own(backend):
    env = {**two_devices(backend), "NPUMEM_DEVICES": "2"}
    out = run(scenario(backend, PYACL, report=""), env=env)
    assert out == {"count": 2, "read": [0x31] * 4, "peer": [0x31] * 4, "errors": []}
    env["NPUMEM_FAKE_DEVICES"] = "1"
    out = run(scenario(backend, PYACL_ONE_DEVICE, report="", helpers=False), env=env)
    runtime_says = "107001" if backend == "acl" else "CUDA_ERROR_INVALID_DEVICE"
    assert out["ret"] != 0 and runtime_says in out["message"], out


STREAMS_OF_A_DEVICE = """
vp = ctypes.c_void_p
if BACKEND == "acl":
    assert rt.aclInit(None) in (0, 100002)
    create = lambda out: rt.aclrtCreateStream(ctypes.byref(out))
    sync, destroy = rt.aclrtSynchronizeStream, rt.aclrtDestroyStream
else:
    create = lambda out: rt.cuStreamCreate(ctypes.byref(out), 1)
    sync, destroy = rt.cuStreamSynchronize, rt.cuStreamDestroy_v2
sync.argtypes = destroy.argtypes = [vp]
bind(0)
s = vp()
assert create(s) == 0
bind(1)
other = sync(s)
bind(0)
mine = sync(s)
assert destroy(s) == 0
print(json.dumps({"other": other, "mine": mine}))
"""


@pytest.mark.parametrize(("backend", "code"), [("acl", 107003), ("cuda", 201)])
def test_a_stream_belongs_to_its_device(backend, code):
    # ACL_ERROR_RT_STREAM_CONTEXT, CUDA_ERROR_INVALID_CONTEXT
    out = run(scenario(backend, STREAMS_OF_A_DEVICE, report=""), env=two_devices(backend))
    assert out == {"other": code, "mine": 0}
