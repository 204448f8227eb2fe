"""The AscendCL and CUDA backends against the stand-in runtimes (target/stand-ins, built by
`make build`): stream-ordered reuse waits on the runtime's own events, every failure the
stand-in's fault switch injects is an AclError with a code and gives back what it took (the
stand-in's live counts), and a library that is missing or lacks a symbol is a clear error.

The allocator suite itself runs on these backends through conftest's BACKENDS; libnpumem on
them is in test_capi_accelerators.py.
"""

from __future__ import annotations

import gc
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import STAND_INS, GiB, KiB, MiB, StandIn

import npumem
from npumem import AclError

FAMILIES = ("npumem", "pytorch", "torch_npu", "direct")


def open_device(backend: str, allocator: str = "npumem") -> npumem.Device:
    return npumem.Device("256MiB", backend=backend, allocator=allocator)


def closed(stand_in: StandIn, baseline: dict[str, int]) -> None:
    """Checks that the stand-in holds what it held before the test (nothing of the test's)."""
    gc.collect()
    assert stand_in.counts().held() == baseline


# --------------------------------------------------------------------------------------------
# Streams and events: the runtime's own
# --------------------------------------------------------------------------------------------


def test_cross_stream_reuse_waits_for_the_runtimes_event(stand_in):
    baseline = stand_in.counts().held()
    d = open_device(stand_in.backend)
    s1, s2 = d.create_stream(), d.create_stream()
    assert stand_in.counts().streams == baseline["streams"] + 2, "the device's streams are the runtime's"
    size = 2 * MiB
    p = d.malloc(size, stream=s1)
    stand_in.set_delay_us(200_000)  # the memset runs 0.2 s after it is queued
    d.memset_async(p, size, 0xAB, size, stream=s1)
    d.free(p, stream=s1)
    # The simulated clock has long finished the memset; the runtime has not: another stream
    # must not get the block, its own stream may.
    q = d.malloc(size, stream=s2)
    assert q != p, "another stream got a block the runtime is still writing"
    assert d.malloc(size, stream=s1) == p, "same-stream reuse is immediate"
    stand_in.set_delay_us(0)
    d.synchronize_stream(s1)
    assert d.read(p, 16) == b"\xab" * 16, "the runtime ran the memset"
    d.free(p, stream=s1)
    d.free(q, stream=s2)
    d.synchronize_device()
    assert d.malloc(size, stream=s2) in (p, q), "after the event, any stream may reuse the block"
    d.destroy_stream(s1)
    d.destroy_stream(s2)
    del d
    closed(stand_in, baseline)


def test_events_and_waits_are_the_runtimes(stand_in):
    baseline = stand_in.counts().held()
    d = open_device(stand_in.backend)
    s1, s2 = d.create_stream(), d.create_stream()
    src, dst = d.malloc(MiB), d.malloc(MiB)
    d.write(src, b"\x5a" * MiB)
    stand_in.set_delay_us(100_000)
    d.memcpy_async(dst, MiB, src, MiB, stream=s1)
    e = d.create_event()
    d.record_event(e, stream=s1)
    assert d.query_event(e) == 1, "the runtime's copy is queued: ACL_EVENT_STATUS_NOT_READY"
    d.stream_wait_event(s2, e)
    d.memset_async(src, MiB, 0, MiB, stream=s2)  # ordered after the copy by the event
    d.synchronize_stream(s2)
    assert d.query_event(e) == 0  # ACL_EVENT_STATUS_COMPLETE
    stand_in.set_delay_us(0)
    assert d.read(dst, MiB) == b"\x5a" * MiB, "the copy read the source before the wait's memset"
    assert d.read(src, 4) == b"\0" * 4
    d.destroy_event(e)
    d.free(src)
    d.free(dst)
    del d
    closed(stand_in, baseline)


# --------------------------------------------------------------------------------------------
# Faults injected by the stand-in: errors with codes, nothing leaked
# --------------------------------------------------------------------------------------------


def workload(d: npumem.Device) -> None:
    """malloc / free / empty_cache over each page kind, with a stream-ordered free."""
    s = d.create_stream()
    ptrs = [d.malloc(size) for size in (4 * KiB, 300 * KiB, 3 * MiB, 5 * MiB, 12 * MiB)]
    ptrs.append(d.malloc(MiB, stream=s))
    d.memset_async(ptrs[-1], MiB, 1, MiB, stream=s)
    d.free(ptrs.pop(), stream=s)
    for p in ptrs[::2]:
        d.free(p)
    d.empty_cache()
    more = [d.malloc(size) for size in (2 * MiB, 64 * KiB, 7 * MiB)]
    for p in ptrs[1::2] + more:
        d.free(p)
    d.synchronize_device()
    d.empty_cache()
    d.destroy_stream(s)


#: Each fault kind and the calls of it the workload makes (the Nth of each fails in turn).
# A failing release or physical free in a segment's teardown is retried by the backend later (the
# allocators' contract says those cannot fail): nothing leaks, and the error is not the caller's
# unless the runtime still refuses at empty_cache (tested below with a runtime that keeps refusing).
FAULTS = {
    "physical": 9,
    "map": 9,
    "reserve": 4,
    "unmap": 4,
    "free_physical": 4,
    "release": 3,
    "stream": 1,
    "event": 2,
    "memset": 1,
}


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("kind", sorted(FAULTS))
def test_injected_faults_are_errors_and_leak_nothing(stand_in, family, kind):
    if stand_in.backend == "cuda" and kind in ("reserve", "release"):
        pytest.skip("the CUDA backend reserves its address window once, at open (tested below)")
    if family == "npumem" and kind == "release":
        pytest.skip("the npumem pool keeps its address ranges until the device goes")
    baseline = stand_in.counts().held()
    fired = 0
    for n in range(1, FAULTS[kind] + 1):
        d = open_device(stand_in.backend, family)
        before = stand_in.counts().faults_fired
        stand_in.fail_next(kind, n)
        try:
            workload(d)
        except AclError as e:
            assert e.code >= 100_000 and e.name.startswith("ACL_ERROR"), e
            assert str(e.code) in str(e) and e.message, e
            if kind == "physical":
                assert e.code == 207001, e
        stand_in.disarm()
        fired += stand_in.counts().faults_fired - before
        # The device is still sound: the whole workload runs after the fault.
        workload(d)
        del d
        closed(stand_in, baseline)
    assert fired > 0, f"no {kind} fault fired: the workload never reached that call"


@pytest.mark.parametrize("family", ["direct", "pytorch"])
def test_a_free_the_runtime_keeps_refusing_is_counted_warned_and_the_error_of_empty_cache(stand_in, family, caplog):
    baseline = stand_in.counts().held()
    d = open_device(stand_in.backend, family)
    p = d.malloc(3 * MiB)
    stand_in.fail_from("free_physical", 1)  # aclrtFreePhysical / cuMemRelease refuse from now on
    with caplog.at_level(logging.WARNING, logger="npumem"):
        d.free(p)  # a free is not the caller's error: the backend keeps what the runtime refused
        d.synchronize_device()
        with pytest.raises(AclError) as refused:
            d.empty_cache()
    assert refused.value.code == 207002, refused.value
    assert "still refuses to take back 1 object" in str(refused.value), refused.value
    s = d.stats()
    assert s["refused_frees"] == 1 and s["stranded_frees"] == 1 and s["stranded_bytes"] >= 3 * MiB, s
    warnings = [r for r in caplog.records if r.name == "npumem" and r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "refused to free physical allocation" in warnings[0].getMessage()
    assert stand_in.counts().handles > baseline["handles"], "the runtime still holds it"
    # The retries count no new refusal; once the runtime takes it back, everything is even.
    stand_in.disarm()
    d.empty_cache()
    s = d.stats()
    assert (s["refused_frees"], s["stranded_frees"], s["stranded_bytes"]) == (1, 0, 0), s
    assert s["physical_allocs"] == s["physical_frees"], s
    del d
    closed(stand_in, baseline)


def test_a_refusal_that_passes_is_retried_before_the_next_allocation(stand_in):
    baseline = stand_in.counts().held()
    d = open_device(stand_in.backend, "direct")
    stand_in.fail_next("free_physical", 1)  # refused once
    d.free(d.malloc(MiB))
    assert d.stats()["stranded_frees"] == 1
    d.free(d.malloc(MiB))  # the malloc asked again first
    s = d.stats()
    assert (s["refused_frees"], s["stranded_frees"]) == (1, 0) and s["physical_allocs"] == s["physical_frees"], s
    del d
    closed(stand_in, baseline)


# --------------------------------------------------------------------------------------------
# malloc_host: the runtime's page-locked host memory
# --------------------------------------------------------------------------------------------


def test_malloc_host_is_the_runtimes_page_locked_memory(stand_in):
    baseline = stand_in.counts().held()
    d = open_device(stand_in.backend)
    a = d.malloc_host(3 * KiB + 5)
    assert stand_in.counts().host_blocks == baseline["host_blocks"] + 1, "not aclrtMallocHost / cuMemAllocHost"
    assert a % 64 == 0 and d.read(a, 3 * KiB + 5) == bytes(3 * KiB + 5), "zeroed"
    d.write(a, b"pinned")
    p, s = d.malloc(KiB), d.create_stream()
    d.memcpy_async(p, KiB, a, 6, stream=s)  # from the runtime's pinned block, queued
    d.synchronize_stream(s)
    assert d.read(p, 6) == b"pinned"
    for bad in (a + 64, p, 12345):
        with pytest.raises(AclError) as e:
            d.free_host(bad)
        assert e.value.code == 207002, e.value
    assert d.stats()["host_live_count"] == 1
    d.free_host(a)
    assert stand_in.counts().host_blocks == baseline["host_blocks"]
    b = d.malloc_host(MiB)  # left live: the device gives it back to the runtime when it goes
    assert stand_in.counts().host_blocks == baseline["host_blocks"] + 1 and b % 64 == 0
    d.free(p)
    d.destroy_stream(s)
    del d
    closed(stand_in, baseline)


def test_malloc_host_errors_are_acl_codes_and_take_nothing(stand_in):
    baseline = stand_in.counts().held()
    d = open_device(stand_in.backend)
    for bad, code in ((0, 100000), (-1, 100000), (1 << 64, 100000), ((1 << 63) + 1, 100000)):
        with pytest.raises((AclError, OverflowError, ValueError)) as e:
            d.malloc_host(bad)
        if isinstance(e.value, AclError):
            assert e.value.code == code, e.value
    stand_in.fail_next("host", 1)  # the runtime's host allocation fails: out of memory
    with pytest.raises(AclError) as e:
        d.malloc_host(KiB)
    assert e.value.code == 207001 and ("aclrtMallocHost" in str(e.value) or "cuMemAllocHost" in str(e.value))
    assert stand_in.counts().host_blocks == baseline["host_blocks"] and d.stats()["host_live_count"] == 0
    d.free_host(d.malloc_host(KiB))  # sound afterwards
    with pytest.raises(AclError) as e:
        d.free_host(0)
    assert e.value.code == 100000
    del d
    closed(stand_in, baseline)


@pytest.mark.parametrize("kind", ["reserve", "mem_info", "physical"])
def test_a_failing_open_or_first_malloc_is_an_error_and_leaks_nothing(stand_in, kind):
    baseline = stand_in.counts().held()
    stand_in.fail_next(kind, 1)
    try:
        npumem.Device("256MiB", backend=stand_in.backend).malloc(MiB)
    except AclError as e:
        assert e.code >= 100_000 and str(e.code) in str(e), e
    else:
        pytest.fail(f"a failing {kind} went unnoticed")
    finally:
        stand_in.disarm()
    closed(stand_in, baseline)


def test_capacity_of_the_runtime_is_out_of_memory_207001(stand_in):
    baseline = stand_in.counts().held()
    d = open_device(stand_in.backend, "direct")
    with pytest.raises(npumem.OutOfMemoryError) as info:
        d.malloc(GiB)
    assert info.value.code == 207001
    del d
    closed(stand_in, baseline)


# --------------------------------------------------------------------------------------------
# A library that is missing, or lacks a call
# --------------------------------------------------------------------------------------------

VARS = {"acl": "NPUMEM_ACL_LIB", "cuda": "NPUMEM_CUDA_LIB"}


@pytest.mark.parametrize("backend", ["acl", "cuda"])
def test_a_missing_library_names_what_was_searched(backend, monkeypatch, tmp_path):
    missing = tmp_path / "nothing-here.so"
    monkeypatch.setenv(VARS[backend], str(missing))
    with pytest.raises(AclError) as info:
        npumem.Device("64MiB", backend=backend)
    assert info.value.code == 200006
    assert VARS[backend] in str(info.value) and str(missing) in str(info.value)


@pytest.mark.parametrize("backend", ["acl", "cuda"])
def test_a_file_that_is_no_library_is_an_error(backend, monkeypatch, tmp_path):
    junk = tmp_path / "libjunk.so"
    junk.write_bytes(b"not an ELF file\n" * 64)
    monkeypatch.setenv(VARS[backend], str(junk))
    with pytest.raises(AclError) as info:
        npumem.Device("64MiB", backend=backend)
    assert info.value.code == 200006 and str(junk) in str(info.value)


@pytest.mark.parametrize("backend", ["acl", "cuda"])
def test_a_library_without_the_runtimes_calls_names_the_missing_symbol(backend, monkeypatch):
    # libnpumem is a real shared library that exports none of the runtime's calls.
    other = Path(npumem.capi.library_path())
    monkeypatch.setenv(VARS[backend], str(other))
    with pytest.raises(AclError) as info:
        npumem.Device("64MiB", backend=backend)
    assert info.value.code == 200006
    first = "aclInit" if backend == "acl" else "cuInit"
    assert first in str(info.value) and str(other) in str(info.value)


# --------------------------------------------------------------------------------------------
# `make bench B=gpu`'s tests, on the CUDA stand-in with a GPU's 2 MiB granularity
# --------------------------------------------------------------------------------------------


def test_the_gpu_check_passes_on_the_cuda_stand_in():
    """tests/test_gpu.py as `make bench B=gpu` runs it (libcuda.so.1 from the loader path), here
    finding the stand-in, whose default granularity is a GPU's 2 MiB."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NPUMEM_")}
    env.update(NPUMEM_CHECK_GPU="1", LD_LIBRARY_PATH=str(STAND_INS))
    test = Path(__file__).with_name("test_gpu.py")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(test)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "skipped" not in proc.stdout, proc.stdout[-2000:]


# --------------------------------------------------------------------------------------------
# device_id: the runtime's device
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["acl", "cuda"])
def test_device_id_names_the_runtimes_device(backend):
    d = npumem.Device("64MiB", backend=backend, device_id=0)
    d.free(d.malloc(4096))
    with pytest.raises(AclError, match=r"aclrtSetDevice\(99\)|cuDeviceGet\(99\)"):
        npumem.Device("64MiB", backend=backend, device_id=99)
    with pytest.raises(AclError, match=r"device_id=1099511627776 is not a device of the runtime"):
        npumem.Device("64MiB", backend=backend, device_id=1 << 40)
    with pytest.raises(AclError, match=r"device_id must be an integer"):
        npumem.Device("64MiB", backend=backend, device_id=-1)


@pytest.mark.parametrize("backend", ["sim", "host"])
def test_device_id_is_0_on_the_simulator_and_host_memory(backend):
    d = npumem.Device("64MiB", backend=backend, device_id=0)
    d.free(d.malloc(4096))
    with pytest.raises(AclError, match=rf"device_id=1: the {backend} backend has one device, 0"):
        npumem.Device("64MiB", backend=backend, device_id=1)
