"""libnpumem on the accelerator backends: NPUMEM_BACKEND=acl (torch_npu's NPUPluggableAllocator:
the stream is an aclrtStream) and NPUMEM_BACKEND=cuda (PyTorch's CUDAPluggableAllocator: a
cudaStream_t), against the stand-in runtimes, with stream handles the stand-in itself made
(loaded with ctypes: the same library, and state, npumem loaded), from several threads.

The stand-in's NPUMEM_FAKE_DELAY_US makes queued work slow, so a block freed under queued work
would be caught if it went to another stream before the runtime's event completed: each thread
fills its block with its own byte on its stream and reads it back after synchronising; a late
fill by the block's previous owner would show.
"""

from __future__ import annotations

import pytest
from conftest import STAND_INS
from test_capi import run

#: The runtime's calls the scenario uses, per backend, as ctypes wrappers around `rt`.
RUNTIME = {
    "acl": """
rt = ctypes.CDLL(LIB)
vp, sz = ctypes.c_void_p, ctypes.c_size_t
rt.aclrtSetDevice.argtypes = [ctypes.c_int]
rt.aclrtCreateStream.argtypes = [ctypes.POINTER(vp)]
rt.aclrtDestroyStream.argtypes = [vp]
rt.aclrtSynchronizeStream.argtypes = [vp]
rt.aclrtMemsetAsync.argtypes = [vp, sz, ctypes.c_int, sz, vp]
rt.aclrtMemcpy.argtypes = [vp, sz, vp, sz, ctypes.c_int]

def bind():
    assert rt.aclrtSetDevice(0) == 0

def new_stream():
    s = vp()
    assert rt.aclrtCreateStream(ctypes.byref(s)) == 0
    return s.value

def fill_async(p, value, n, s):
    assert rt.aclrtMemsetAsync(p, n, value, n, s) == 0

def sync(s):
    assert rt.aclrtSynchronizeStream(s) == 0

def fetch(p, n):
    buf = ctypes.create_string_buffer(n)
    assert rt.aclrtMemcpy(buf, n, p, n, 2) == 0  # ACL_MEMCPY_DEVICE_TO_HOST
    return buf.raw

def drop_stream(s):
    assert rt.aclrtDestroyStream(s) == 0
""",
    "cuda": """
rt = ctypes.CDLL(LIB)
vp, sz = ctypes.c_void_p, ctypes.c_size_t
rt.cuDevicePrimaryCtxRetain.argtypes = [ctypes.POINTER(vp), ctypes.c_int]
rt.cuCtxSetCurrent.argtypes = [vp]
rt.cuStreamCreate.argtypes = [ctypes.POINTER(vp), ctypes.c_uint]
rt.cuStreamDestroy_v2.argtypes = [vp]
rt.cuStreamSynchronize.argtypes = [vp]
rt.cuMemsetD8Async.argtypes = [ctypes.c_uint64, ctypes.c_ubyte, sz, vp]
rt.cuMemcpyDtoH_v2.argtypes = [vp, ctypes.c_uint64, sz]
CTX = vp()
assert rt.cuDevicePrimaryCtxRetain(ctypes.byref(CTX), 0) == 0

def bind():
    assert rt.cuCtxSetCurrent(CTX) == 0

def new_stream():
    s = vp()
    assert rt.cuStreamCreate(ctypes.byref(s), 1) == 0  # CU_STREAM_NON_BLOCKING
    return s.value

def fill_async(p, value, n, s):
    assert rt.cuMemsetD8Async(p, value, n, s) == 0

def sync(s):
    assert rt.cuStreamSynchronize(s) == 0

def fetch(p, n):
    buf = ctypes.create_string_buffer(n)
    assert rt.cuMemcpyDtoH_v2(buf, p, n) == 0
    return buf.raw

def drop_stream(s):
    assert rt.cuStreamDestroy_v2(s) == 0
""",
}

SCENARIO = """
rt.npumem_fake_set_delay_us.argtypes = [ctypes.c_uint64]
rt.npumem_fake_set_delay_us.restype = None
bind()
MiB = 1 << 20

# One thread: a block freed on stream A under slow queued work goes to no other stream until
# the runtime's event completes; stream A itself reuses it at once.
a, b = new_stream(), new_stream()
rt.npumem_fake_set_delay_us(300_000)
p = lib.npumem_malloc(MiB, 0, a); ok("malloc on a")
fill_async(p, 0xAB, MiB, a)
lib.npumem_free(p, MiB, 0, a); ok("free on a")
q = lib.npumem_malloc(MiB, 0, b); ok("malloc on b")
cross_stream_got_it = q == p
same_stream_got_it = lib.npumem_malloc(MiB, 0, a) == p
rt.npumem_fake_set_delay_us(0)
sync(a)
lib.npumem_free(p, MiB, 0, a); ok()
lib.npumem_free(q, MiB, 0, b); ok()
sync(a); sync(b)

# Threads, each on a stream of its own, with slow queued fills: a block's previous owner's late
# fill landing after the new owner's would show as a foreign byte.
rt.npumem_fake_set_delay_us(1500)
THREADS, ROUNDS = 4, 25
errors, handed = [], []

def worker(t):
    try:
        bind()
        s = new_stream()
        rng = random.Random(t)
        mine = 0x10 + t
        for i in range(ROUNDS):
            n = rng.choice([64 << 10, 256 << 10, MiB])
            ptr = lib.npumem_malloc(n, 0, s); ok("malloc")
            handed.append(ptr)
            fill_async(ptr, mine, n, s)
            sync(s)
            data = fetch(ptr, n)
            if data != bytes([mine]) * n:
                foreign = sorted(set(data) - {mine})
                errors.append(f"thread {t} round {i}: {ptr:#x} holds bytes {foreign} of another stream")
            fill_async(ptr, mine, n, s)  # still queued (slow) when the block is freed
            lib.npumem_free(ptr, n, 0, s); ok("free")
        sync(s)
        drop_stream(s)
    except Exception as e:  # noqa: BLE001 - reported by the parent
        errors.append(f"thread {t}: {e!r}")

threads = [threading.Thread(target=worker, args=(t,)) for t in range(THREADS)]
for th in threads:
    th.start()
for th in threads:
    th.join()
rt.npumem_fake_set_delay_us(0)
drop_stream(a); drop_stream(b)
lib.npumem_empty_cache(); ok("empty_cache")
print(json.dumps({
    "cross": cross_stream_got_it, "same": same_stream_got_it, "errors": errors,
    "reused": len(handed) - len(set(handed)), "stats": stats(),
}))
"""


def on_stand_in(backend: str, scenario: str) -> dict:
    """Runs `scenario` in a fresh interpreter with libnpumem on `backend`'s stand-in (`lib`) and
    the runtime's calls (`rt`, RUNTIME); returns the JSON object it prints last."""
    lib = STAND_INS / ("libascendcl.so" if backend == "acl" else "libcuda.so")
    env = {
        "NPUMEM_BACKEND": backend,
        "NPUMEM_ACL_LIB": str(STAND_INS / "libascendcl.so"),
        "NPUMEM_CUDA_LIB": str(STAND_INS / "libcuda.so"),
        "NPUMEM_CAPACITY": "256MiB",
        "NPUMEM_FAKE_GRANULARITY": "4KiB",
    }
    # npumem initialises the runtime (aclInit, cuInit) when it creates device 0.
    init = f"LIB = {str(lib)!r}\nlib.npumem_init(1); ok('init')\n"
    return run(init + RUNTIME[backend] + scenario, env=env)


@pytest.mark.parametrize("backend", ["acl", "cuda"])
def test_pluggable_entry_points_with_runtime_streams_from_threads(backend):
    out = on_stand_in(backend, SCENARIO)
    assert not out["cross"], "another stream got the block while the runtime's event was pending"
    assert out["same"], "the freeing stream did not reuse its block at once"
    assert out["errors"] == []
    assert out["reused"] > 0, "no block was ever reused: the scenario tested nothing"


REFUSAL = """
rt.npumem_fake_fail_from.argtypes = [ctypes.c_uint32, ctypes.c_uint64]
MiB = 1 << 20
p = lib.npumem_malloc(3 * MiB, 0, NULL); ok("malloc")
lib.npumem_free(p, 3 * MiB, 0, NULL); ok("free")
rt.npumem_fake_fail_from(7, 1)  # the runtime refuses every physical free from now on
lib.npumem_empty_cache()
refused = [lib.npumem_last_error_code(), err()]
lib.npumem_reset(True)
reset = [lib.npumem_last_error_code(), err()]
rt.npumem_fake_fail_from(7, 0)
lib.npumem_empty_cache(); ok("empty_cache once the runtime takes it back")
print(json.dumps({"refused": refused, "reset": reset}))
"""


@pytest.mark.parametrize("backend", ["acl", "cuda"])
def test_a_free_the_runtime_keeps_refusing_is_the_error_of_empty_cache_and_reset(backend):
    out = on_stand_in(backend, REFUSAL)
    for code, message in (out["refused"], out["reset"]):
        assert code == 207002 and "still refuses to take back" in message, (code, message)
