"""npumem.acl, the pyACL-compatible layer: every call's return shape and codes, the behaviours
pyACL programs rely on (ascendcl-api §3.5), several devices in one address space, peer copies,
IPC, the VMM calls and the leak report."""

from __future__ import annotations

import ctypes
import sys

import numpy as np
import pytest

import npumem.acl as acl
from npumem.acl._runtime import LOCK, RT

MiB = 1 << 20
H2H, H2D, D2H, D2D = 0, 1, 2, 3
HUGE_FIRST, NORMAL_ONLY = 0, 2


def reset() -> None:
    with LOCK:
        RT.forget()


@pytest.fixture
def system():
    """A fresh 4-device system of 1 GiB devices, initialised, device 0 current."""
    reset()
    acl.configure(devices=4, capacity="1GiB")
    assert acl.init() == 0
    assert acl.rt.set_device(0) == 0
    yield acl
    reset()


def dev_bytes(ptr: int, n: int) -> bytes:
    out = np.zeros(n, np.uint8)
    assert acl.rt.memcpy(out.ctypes.data, n, ptr, n, D2H) == 0
    return out.tobytes()


def put(ptr: int, data: bytes) -> None:
    src = np.frombuffer(data, np.uint8).copy()
    assert acl.rt.memcpy(ptr, len(data), src.ctypes.data, len(data), H2D) == 0


# ----- init, devices, contexts -----


def test_init_finalize_codes():
    reset()
    acl.configure(devices=2, capacity="256MiB")
    assert acl.init() == 0
    assert acl.init() == 100002
    assert "REPEAT_INITIALIZE" in acl.get_recent_err_msg()
    assert acl.finalize() == 0
    assert acl.finalize() == 100037
    reset()


def test_malloc_without_device_is_context_null():
    reset()
    acl.configure(devices=2, capacity="256MiB")
    assert acl.rt.malloc(1024, HUGE_FIRST) == (0, 107002)
    assert acl.rt.get_device() == (0, 107002)
    assert acl.rt.get_mem_info(1) == (0, 0, 107002)
    assert acl.rt.create_stream() == (0, 107002)
    reset()


def test_init_default_device(tmp_path):
    reset()
    acl.configure(devices=2, capacity="256MiB")
    conf = tmp_path / "acl.json"
    conf.write_text('{"defaultDevice": {"default_device": "1"}}')
    assert acl.init(str(conf)) == 0
    ptr, ret = acl.rt.malloc(64, HUGE_FIRST)
    assert ret == 0 and acl.rt.get_device() == (1, 0)
    assert acl.rt.free(ptr) == 0
    assert acl.finalize() == 0
    assert acl.init(str(tmp_path / "missing.json")) == 100000
    reset()


def test_devices_and_contexts(system):
    assert acl.rt.get_device_count() == (4, 0)
    assert acl.rt.set_device(4) == 107001
    assert acl.rt.set_device(-1) == 107001
    assert acl.rt.get_device() == (0, 0)
    ctx0, ret = acl.rt.get_context()
    assert ret == 0 and ctx0
    ctx, ret = acl.rt.create_context(2)
    assert ret == 0 and ctx != ctx0
    assert acl.rt.get_device() == (2, 0) and acl.rt.get_context() == (ctx, 0)
    assert acl.rt.set_context(ctx0) == 0 and acl.rt.get_device() == (0, 0)
    assert [c["context"] for c in acl.report()["contexts"]] == [ctx]
    assert acl.rt.destroy_context(ctx) == 0
    assert acl.report()["contexts"] == []
    assert acl.rt.destroy_context(ctx) == 107000
    assert acl.rt.set_context(ctx) == 107000
    assert acl.rt.destroy_context(ctx0) == 107000  # a default context goes with reset_device
    assert acl.rt.get_run_mode() == (1, 0)


def test_reset_device_is_reference_counted(system):
    assert acl.rt.set_device(0) == 0  # two references now
    s, _ = acl.rt.create_stream()
    assert acl.rt.reset_device(0) == 0
    assert acl.rt.get_device() == (0, 0)  # still set: one reference left
    assert acl.rt.synchronize_stream(s) == 0
    assert acl.rt.reset_device(0) == 0
    assert acl.rt.get_device() == (0, 107002)
    assert acl.rt.synchronize_stream(s) == 107000  # the stream went with the default context
    assert acl.report()["streams"] == []


def test_current_device_is_per_thread(system):
    import threading

    seen = {}

    def worker():
        seen["before"] = acl.rt.get_device()
        acl.rt.set_device(3)
        seen["after"] = acl.rt.get_device()

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert seen == {"before": (0, 107002), "after": (3, 0)}
    assert acl.rt.get_device() == (0, 0)


# ----- memory -----


def test_malloc_free_shapes_and_codes(system):
    ptr, ret = acl.rt.malloc(1000, HUGE_FIRST)
    assert ret == 0 and ptr % 64 == 0
    assert acl.rt.malloc(0, HUGE_FIRST) == (0, 100000)
    p32, ret = acl.rt.malloc_align32(33, NORMAL_ONLY)
    assert ret == 0
    pc, ret = acl.rt.malloc_cached(100, HUGE_FIRST)
    assert ret == 0
    assert acl.rt.malloc_cached(100, 3) == (0, 100000)  # cached takes 0, 1, 2, 6 only
    pb, ret = acl.rt.malloc(64, 0x1000 | HUGE_FIRST)  # bandwidth bits are accepted
    assert ret == 0
    pw, ret = acl.rt.malloc_with_cfg(64, HUGE_FIRST, {})
    assert ret == 0 and acl.rt.free(pw) == 0
    with pytest.raises(TypeError):
        acl.rt.malloc_with_cfg(64, HUGE_FIRST, None)
    assert acl.rt.malloc(2 << 40, HUGE_FIRST) == (0, 207001)
    for p in (ptr, p32, pc, pb):
        assert acl.rt.free(p) == 0
    assert acl.rt.free(ptr) == 207002
    assert acl.rt.free(0) == 100000
    assert acl.rt.free(12345) == 207002
    with pytest.raises(TypeError):
        acl.rt.malloc("1KiB", 0)
    with pytest.raises(TypeError):
        acl.rt.malloc(1024)  # policy is required, as in pyACL
    with pytest.raises(OverflowError):
        acl.rt.malloc(1024, 1 << 40)


def test_malloc_host_is_real_memory(system):
    ptr, ret = acl.rt.malloc_host(256)
    assert ret == 0 and ptr % 64 == 0
    ctypes.memmove(ptr, b"hello npu", 9)
    assert ctypes.string_at(ptr, 9) == b"hello npu"
    dev, _ = acl.rt.malloc(256, HUGE_FIRST)
    assert acl.rt.memcpy(dev, 256, ptr, 9, H2D) == 0
    assert dev_bytes(dev, 9) == b"hello npu"
    assert acl.rt.memset(ptr, 256, 7, 256) == 0  # memset on host memory (§3.5)
    assert ctypes.string_at(ptr, 4) == b"\x07" * 4
    s, _ = acl.rt.create_stream()
    assert acl.rt.memset_async(ptr, 256, 9, 16, s) == 0
    assert acl.rt.synchronize_stream(s) == 0
    assert ctypes.string_at(ptr, 17) == b"\x09" * 16 + b"\x07"
    assert acl.rt.malloc_host(0) == (0, 100000)
    assert acl.rt.free_host(ptr) == 0
    assert acl.rt.free_host(ptr) == 207002
    assert acl.rt.free_host(0) == 100000
    assert acl.rt.free(dev) == 0 and acl.rt.destroy_stream(s) == 0


def test_memcpy_rules(system):
    dev, _ = acl.rt.malloc(64, HUGE_FIRST)
    host = np.arange(64, dtype=np.uint8)
    hp = host.ctypes.data
    assert acl.rt.memcpy(dev, 64, hp, 0, H2D) == 0  # count 0: nothing, even with NULL
    assert acl.rt.memcpy(0, 0, 0, 0, H2D) == 0
    assert acl.rt.memcpy(dev, 32, hp, 64, H2D) == 107000  # count > dest_max
    assert acl.rt.memcpy(dev, 64, hp, 64, 6) == 100000  # kinds 0-5 only
    assert acl.rt.memcpy(dev, 64, 0, 64, H2D) == 100000
    assert acl.rt.memcpy(dev, 64, hp, 65, H2D) == 107000  # past the allocation
    assert acl.rt.memcpy(dev, 64, dev, 64, D2D) == 0  # dst == src
    assert acl.rt.memcpy(dev, 64, hp, 64, 4) == 0
    assert dev_bytes(dev, 64) == host.tobytes()
    assert acl.rt.memcpy(dev, 64, 0x10, 64, H2D) == 107000  # unmapped host address
    assert acl.rt.free(dev) == 0
    assert acl.rt.memcpy(hp, 64, dev, 64, D2H) == 107000  # use after free


def test_kind_leniency(system):
    """Official samples copy host to host with ACL_MEMCPY_DEVICE_TO_HOST: it must work (§3.5)."""
    host_buffer, _ = acl.rt.malloc_host(32)
    ctypes.memmove(host_buffer, b"x" * 32, 32)
    out = np.zeros(32, np.uint8)
    assert acl.rt.memcpy(out.ctypes.data, 32, host_buffer, 32, D2H) == 0
    assert out.tobytes() == b"x" * 32
    dev, _ = acl.rt.malloc(32, HUGE_FIRST)
    assert acl.rt.memcpy(dev, 32, host_buffer, 32, D2H) == 0  # really H2D, queued natively
    assert dev_bytes(dev, 32) == b"x" * 32
    found = acl.report()
    assert found["kind_mismatches"] == 2 and found["misuse"] == []  # legal: counted, not misuse
    acl.rt.free(dev)
    acl.rt.free_host(host_buffer)


def test_bytes_to_ptr_is_a_copy_target(system):
    assert "bytes_to_ptr" in dir(acl.util)
    dev, _ = acl.rt.malloc(16, HUGE_FIRST)
    put(dev, bytes(range(16)))
    data = bytes(16)
    ptr = acl.util.bytes_to_ptr(data)
    assert acl.rt.memcpy(ptr, 16, dev, 16, D2H) == 0
    assert data == bytes(range(16))
    assert np.frombuffer(data, np.uint8)[15] == 15
    assert acl.util.ptr_to_bytes(ptr, 4) == bytes(range(4))
    with pytest.raises(ValueError):
        acl.util.bytes_to_ptr(bytearray(4))
    acl.rt.free(dev)


def test_util_numpy(system):
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    with pytest.warns(Warning):
        p = acl.util.numpy_to_ptr(a)
    view = acl.util.ptr_to_numpy(p, (3, 4), 11)
    assert view.dtype == np.float32 and np.array_equal(view, a)
    view[0, 0] = 42  # zero-copy and writeable
    assert a[0, 0] == 42
    q, arr = acl.util.numpy_contiguous_to_ptr(a.T)
    assert arr.flags.c_contiguous and acl.util.ptr_to_numpy(q, (4, 3), 11)[0, 1] == 4
    assert acl.util.ptr_to_numpy(p, (2,), 23).dtype == np.float16
    with pytest.raises(ValueError):
        acl.util.ptr_to_numpy(p, (2,), 99)
    dev, _ = acl.rt.malloc(16, HUGE_FIRST)
    with pytest.raises(ValueError, match="device memory"):
        acl.util.ptr_to_numpy(dev, (4,), 11)
    acl.rt.free(dev)


def test_memcpy2d(system):
    rows = np.arange(4 * 8, dtype=np.uint8).reshape(4, 8)
    dev, _ = acl.rt.malloc(4 * 6, HUGE_FIRST)
    # 4 rows of 6 bytes out of 8-byte rows, packed on the device.
    assert acl.rt.memcpy2d(dev, 6, rows.ctypes.data, 8, 6, 4, H2D) == 0
    assert dev_bytes(dev, 24) == rows[:, :6].tobytes()
    assert acl.rt.memcpy2d(dev, 6, rows.ctypes.data, 8, 7, 4, H2D) == 100000  # width > dpitch
    assert acl.rt.memcpy2d(dev, 6, rows.ctypes.data, 8, 0, 4, H2D) == 0
    packed = np.arange(24, dtype=np.uint8) + 100  # pitches equal to the width: one copy
    assert acl.rt.memcpy2d(dev, 6, packed.ctypes.data, 6, 6, 4, H2D) == 0
    assert dev_bytes(dev, 24) == packed.tobytes()
    assert acl.rt.memcpy2d(dev, 1, packed.ctypes.data, 1, 1, 1 << 40, H2D) == 107000  # checked, not looped
    assert acl.rt.memcpy2d(dev, 6, rows.ctypes.data, 8, 6, 4, H2D) == 0
    assert acl.rt.memcpy2d(dev, 6, rows.ctypes.data, 8, 6, 5, H2D) == 107000  # past the allocation
    out = np.zeros((4, 8), np.uint8)
    s, _ = acl.rt.create_stream()
    assert acl.rt.memcpy2d_async(out.ctypes.data, 8, dev, 6, 6, 4, D2H, s) == 0
    assert np.array_equal(out[:, :6], rows[:, :6])
    acl.rt.free(dev)
    acl.rt.destroy_stream(s)


# ----- async copies, streams, events -----


def test_async_from_pageable_completes_before_return(system):
    s, ret = acl.rt.create_stream()
    assert ret == 0 and s
    dev, _ = acl.rt.malloc(MiB, HUGE_FIRST)
    host = np.full(MiB, 3, np.uint8)
    e0, _ = acl.rt.create_event()
    e1, _ = acl.rt.create_event()
    assert acl.rt.record_event(e0, s) == 0
    assert acl.rt.memcpy_async(dev, MiB, host.ctypes.data, MiB, H2D, s) == 0
    host[:] = 4  # the copy has completed: changing the source now changes nothing
    assert acl.rt.record_event(e1, s) == 0
    assert acl.rt.query_event(e1) == (0, 0)  # nothing left queued behind it
    ms, _ = acl.rt.event_elapsed_time(e0, e1)
    assert ms > 0  # the copy took its time on the stream
    assert acl.rt.synchronize_stream(s) == 0
    assert dev_bytes(dev, 8) == b"\x03" * 8
    acl.rt.free(dev)
    for e in (e0, e1):
        acl.rt.destroy_event(e)
    acl.rt.destroy_stream(s)


def test_async_from_pinned_is_queued(system):
    s, _ = acl.rt.create_stream()
    dev, _ = acl.rt.malloc(8 * MiB, HUGE_FIRST)
    pinned, _ = acl.rt.malloc_host(8 * MiB)
    ctypes.memset(pinned, 5, 8 * MiB)
    ev, _ = acl.rt.create_event()
    assert acl.rt.memcpy_async(dev, 8 * MiB, pinned, 8 * MiB, H2D, s) == 0
    assert acl.rt.record_event(ev, s) == 0
    assert acl.rt.query_event(ev) == (1, 0)  # NOT_READY: queued behind 8 MiB over PCIe
    assert acl.rt.query_event_status(ev) == (0, 0)
    assert acl.rt.synchronize_event(ev) == 0
    assert acl.rt.query_event(ev) == (0, 0) and acl.rt.query_event_status(ev) == (1, 0)
    assert dev_bytes(dev, 4) == b"\x05" * 4
    start, _ = acl.rt.create_event()
    assert acl.rt.record_event(start, s) == 0
    assert acl.rt.memcpy_async(dev, 8 * MiB, pinned, 8 * MiB, H2D, s) == 0
    assert acl.rt.record_event(ev, s) == 0
    ms, ret = acl.rt.event_elapsed_time(start, ev)
    assert ret == 0 and isinstance(ms, float) and ms > 0
    s2, _ = acl.rt.create_stream()
    assert acl.rt.stream_wait_event(s2, ev) == 0
    assert acl.rt.synchronize_device() == 0
    for e in (ev, start):
        assert acl.rt.destroy_event(e) == 0
    assert acl.rt.destroy_event(ev) == 107000
    assert acl.rt.query_event(ev) == (1, 107000)
    for x in (s, s2):
        assert acl.rt.destroy_stream(x) == 0
    assert acl.rt.destroy_stream(s) == 107000
    assert acl.rt.synchronize_stream(0) == 0  # the default stream
    acl.rt.free(dev)
    acl.rt.free_host(pinned)


def test_stream_of_another_device(system):
    s, _ = acl.rt.create_stream()
    ev, _ = acl.rt.create_event()
    acl.rt.set_device(1)
    dev, _ = acl.rt.malloc(64, HUGE_FIRST)
    host = np.zeros(64, np.uint8)
    assert acl.rt.memcpy_async(dev, 64, host.ctypes.data, 64, H2D, s) == 107003
    ev1, _ = acl.rt.create_event()
    assert acl.rt.record_event(ev1, 0) == 0
    acl.rt.set_device(0)
    assert acl.rt.record_event(ev1, s) == 107003
    assert acl.rt.stream_wait_event(s, ev1) == 0  # another device's event: waited on the host
    assert acl.rt.event_elapsed_time(ev, ev1) == (0.0, 107000)
    for e in (ev, ev1):
        acl.rt.destroy_event(e)
    acl.rt.destroy_stream(s)
    acl.rt.free(dev)


# ----- several devices in one address space -----


def test_pointers_name_their_device(system):
    ptrs = []
    for d in range(4):
        acl.rt.set_device(d)
        p, ret = acl.rt.malloc(4096, HUGE_FIRST)
        assert ret == 0
        ptrs.append(p)
        attrs, ret = acl.rt.pointer_get_attributes(p)
        assert ret == 0 and attrs["location"] == {"id": d, "type": 1} and attrs["page_size"] in (4096, 2 * MiB)
    assert len(set(ptrs)) == 4
    host, _ = acl.rt.malloc_host(64)
    assert acl.rt.pointer_get_attributes(host)[0]["location"]["type"] == 0
    arr = np.zeros(4)
    assert acl.rt.pointer_get_attributes(arr.ctypes.data)[0]["location"]["type"] == 2
    assert acl.rt.pointer_get_attributes(0)[1] == 100000
    for d, p in enumerate(ptrs):
        acl.rt.set_device(d)
        assert acl.rt.free(p) == 0  # free finds the device from the pointer


def test_mem_info_per_device(system):
    free0, total0, ret = acl.rt.get_mem_info(1)
    assert ret == 0 and total0 == 1 << 30
    acl.rt.set_device(1)
    p, _ = acl.rt.malloc(64 * MiB, HUGE_FIRST)
    free1, total1, _ = acl.rt.get_mem_info(1)
    assert total1 == total0 and free1 <= free0 - 64 * MiB
    acl.rt.set_device(0)
    assert acl.rt.get_mem_info(1)[0] == free0
    assert acl.rt.get_mem_info(18) == (0, 0, 100000)
    acl.rt.free(p)


def test_peer_copy_needs_peer_access(system):
    a, _ = acl.rt.malloc(MiB, HUGE_FIRST)
    put(a, b"\xab" * MiB)
    acl.rt.set_device(1)
    b, _ = acl.rt.malloc(MiB, HUGE_FIRST)
    assert acl.rt.memcpy(b, MiB, a, MiB, D2D) == 107000
    assert "peer access" in acl.get_recent_err_msg()
    assert acl.rt.device_can_access_peer(1, 0) == (1, 0)
    assert acl.rt.device_can_access_peer(1, 1) == (0, 0)
    assert acl.rt.device_can_access_peer(1, 9) == (0, 107001)
    assert acl.rt.device_enable_peer_access(0, 1) == 100000
    assert acl.rt.device_enable_peer_access(1, 0) == 107000
    assert acl.rt.device_enable_peer_access(0, 0) == 0
    assert acl.rt.memcpy(b, MiB, a, MiB, D2D) == 0
    assert dev_bytes(b, 4) == b"\xab" * 4
    # Async, on a stream of device 1, timed at the P2P bandwidth.
    s, _ = acl.rt.create_stream()
    e0, _ = acl.rt.create_event()
    e1, _ = acl.rt.create_event()
    put(a, b"\xcd" * MiB)
    acl.rt.record_event(e0, s)
    assert acl.rt.memcpy_async(b, MiB, a, MiB, D2D, s) == 0
    acl.rt.record_event(e1, s)
    assert acl.rt.synchronize_stream(s) == 0
    ms, _ = acl.rt.event_elapsed_time(e0, e1)
    cost = RT.sys().device(1).cost_model()
    transfer = MiB / cost["p2p_bandwidth"] * 1e3  # ms, after the launch's host-side cost
    assert transfer <= ms <= transfer + 2 * cost["launch_ns"] / 1e6
    assert dev_bytes(b, 4) == b"\xcd" * 4
    assert acl.rt.device_disable_peer_access(0) == 0
    assert acl.rt.device_disable_peer_access(0) == 107000
    assert acl.rt.memcpy(b, MiB, a, MiB, D2D) == 107000
    for e in (e0, e1):
        acl.rt.destroy_event(e)
    acl.rt.destroy_stream(s)
    acl.rt.free(b)
    acl.rt.set_device(0)
    acl.rt.free(a)


def test_sanitizer_follows_cross_device_copies(system):
    acl.rt.set_device(1)
    assert acl.rt.device_enable_peer_access(0, 0) == 0
    b, _ = acl.rt.malloc(4 * MiB, HUGE_FIRST)
    s, _ = acl.rt.create_stream()
    acl.rt.set_device(0)
    a, _ = acl.rt.malloc(4 * MiB, HUGE_FIRST)
    acl.rt.set_device(1)
    assert acl.rt.memcpy_async(b, 4 * MiB, a, 4 * MiB, D2D, s) == 0
    acl.rt.set_device(0)
    assert acl.rt.free(a) == 0  # the source, freed while the copy is still queued
    misuse = acl.report()["misuse"]
    assert any(m.startswith("device 0: use_after_free") and "test_pyacl.py" in m for m in misuse), misuse
    acl.rt.set_device(1)
    acl.rt.synchronize_stream(s)
    # The destination, freed while a copy into it is queued, on device 1's side this time.
    acl.rt.set_device(0)
    a, _ = acl.rt.malloc(4 * MiB, HUGE_FIRST)
    acl.rt.set_device(1)
    assert acl.rt.memcpy_async(b, 4 * MiB, a, 4 * MiB, D2D, s) == 0
    before = len(acl.report()["misuse"])
    assert acl.rt.free(b) == 0
    misuse = acl.report()["misuse"][before:]
    assert any(m.startswith("device 1: use_after_free") for m in misuse), misuse
    acl.rt.synchronize_stream(s)
    acl.rt.destroy_stream(s)
    acl.rt.set_device(0)
    acl.rt.free(a)


# ----- VMM -----


def test_vmm_flow(system):
    prop = {"handleType": 0, "allocationType": 0, "memAttr": 13, "location": {"id": 0, "type": 1}, "reserve": 0}
    g, ret = acl.rt.mem_get_allocation_granularity(prop, 0)
    assert ret == 0 and g == 2 * MiB
    va, ret = acl.rt.reserve_mem_address(4 * g, 0, 0, 0)
    assert ret == 0 and acl.rt.pointer_get_attributes(va)[1] != 0  # nothing mapped yet
    h, ret = acl.rt.malloc_physical(g, prop, 0)
    assert ret == 0
    assert acl.rt.map_mem(va, g, 0, h, 0) == 0
    put(va + 100, b"vmm")
    assert dev_bytes(va + 100, 3) == b"vmm"
    assert acl.rt.release_mem_address(va) == 107000  # still mapped
    assert acl.rt.unmap_mem(va) == 0
    assert acl.rt.free_physical(h) == 0
    assert acl.rt.free_physical(h) == 107017
    assert acl.rt.release_mem_address(va) == 0
    assert acl.rt.malloc_physical(g, dict(prop, handleType=2), 0) == (0, 100000)
    assert acl.rt.malloc_physical(g, dict(prop, location={"id": 7, "type": 1}), 0) == (0, 107001)
    # A handle of device 1 cannot be mapped in device 0's addresses.
    h1, _ = acl.rt.malloc_physical(g, dict(prop, location={"id": 1, "type": 1}), 0)
    va, _ = acl.rt.reserve_mem_address(g, 0, 0, 0)
    assert acl.rt.map_mem(va, g, 0, h1, 0) == 107000
    assert acl.rt.free_physical(h1) == 0 and acl.rt.release_mem_address(va) == 0
    with pytest.raises(TypeError):
        acl.rt.malloc_physical(g, [], 0)


# ----- IPC -----


def test_ipc_export_import(system):
    big, _ = acl.rt.malloc(4 * MiB, HUGE_FIRST)
    key, ret = acl.rt.ipc_mem_get_export_key(big, 4 * MiB, 65, 0)
    assert ret == 0 and isinstance(key, str) and 0 < len(key) < 65
    acl.rt.set_device(1)
    assert acl.rt.ipc_mem_import_by_key(key, 0) == (0, 207006)  # pid not whitelisted
    pid, _ = acl.rt.device_get_bare_tgid()
    assert acl.rt.ipc_mem_set_import_pid(key, [pid]) == 0
    imported, ret = acl.rt.ipc_mem_import_by_key(key, 1)
    assert ret == 0 and imported != big  # a second mapping of the same pages
    assert acl.rt.pointer_get_attributes(imported)[0]["location"] == {"id": 0, "type": 1}
    dev0 = RT.sys().device(0)
    assert dev0.translate(imported)[0] == dev0.translate(big)[0]
    put(imported, b"shared")  # written through the importer's pointer
    acl.rt.set_device(0)
    assert dev_bytes(big, 6) == b"shared"  # seen by the exporter
    put(big + 6, b"!")
    assert dev_bytes(imported, 7) == b"shared!"  # and back
    assert acl.rt.ipc_mem_close(key) == 0  # importer first: its mapping goes
    assert acl.rt.memcpy(np.zeros(1).ctypes.data, 1, imported, 1, D2H) == 107000
    assert acl.rt.ipc_mem_close(key) == 0  # then the exporter
    assert acl.rt.ipc_mem_close(key) == 107000
    assert acl.rt.free(big) == 0
    assert acl.rt.ipc_mem_import_by_key("nope", 0) == (0, 107000)
    assert acl.rt.ipc_mem_get_export_key(big, 64, 10, 0) == ("", 100000)


def test_ipc_import_outlives_the_exporters_free(system):
    buf, _ = acl.rt.malloc(2 * MiB, HUGE_FIRST)
    put(buf, b"kept")
    key, _ = acl.rt.ipc_mem_get_export_key(buf, 2 * MiB, 65, 1)  # no pid check
    imported, ret = acl.rt.ipc_mem_import_by_key(key, 0)
    assert ret == 0
    assert acl.rt.free(buf) == 0  # wrong order: the exporter frees before the importer closes
    assert dev_bytes(imported, 4) == b"kept"  # the importer's mapping keeps the pages
    assert any("freed while its IPC key" in m for m in acl.report()["misuse"])
    assert acl.rt.ipc_mem_close(key) == 0 and acl.rt.ipc_mem_close(key) == 0
    assert acl.report()["ipc_keys"] == []


def test_ipc_small_carved_blocks_fail_the_export_check(system):
    ptrs = [acl.rt.malloc(100, HUGE_FIRST)[0] for _ in range(4)]
    carved = [p for p in ptrs if p % 4096]
    assert carved, "small blocks share pages"
    assert acl.rt.ipc_mem_get_export_key(carved[0], 100, 65, 0) == ("", 107000)
    assert "carved" in acl.get_recent_err_msg()
    for p in ptrs:
        acl.rt.free(p)


# ----- DVPP -----


def test_dvpp_malloc(system):
    p, ret = acl.media.dvpp_malloc(1000)
    assert ret == 0 and p % 128 == 0
    put(p, b"\x01" * 1000)
    assert dev_bytes(p + 996, 4) == b"\x01" * 4
    assert acl.rt.free(p) == 207002  # DVPP memory goes back through dvpp_free
    assert acl.media.dvpp_free(p) == 0
    assert acl.media.dvpp_free(p) == 207002
    assert acl.media.dvpp_malloc(0) == (0, 100000)


# ----- the leak and misuse report -----


def test_leak_report_names_call_sites(system, capsys):
    line = sys._getframe().f_lineno + 1
    p, _ = acl.rt.malloc(1000, HUGE_FIRST)
    s, _ = acl.rt.create_stream()
    host, _ = acl.rt.malloc_host(4 * MiB)
    dev, _ = acl.rt.malloc(4 * MiB, HUGE_FIRST)
    assert acl.rt.memcpy_async(dev, 4 * MiB, host, 4 * MiB, H2D, s) == 0
    assert acl.rt.free_host(host) == 0  # while the queued copy still reads it
    found = acl.report()
    assert [a["site"] for a in found["allocations"] if a["ptr"] == p] == [f"{__file__}:{line}"]
    assert [x["stream"] for x in found["streams"]] == [s]
    # The finding names the block's call site and the stream as the program knows them.
    (finding,) = [m for m in found["misuse"] if "use_after_free" in m]
    assert f"malloc_host block at {host:#x} (allocated at {__file__}:{line + 2})" in finding
    assert f"while stream {s:#x} still used it" in finding
    assert acl.finalize() == 0
    err = capsys.readouterr().err
    assert "leak and misuse report" in err and f"test_pyacl.py:{line}" in err and "never destroyed" in err
    assert RT.last_report is not None and RT.last_report["allocations"]


def test_clean_program_reports_nothing(system, capsys):
    p, _ = acl.rt.malloc(64, HUGE_FIRST)
    acl.rt.free(p)
    assert acl.rt.reset_device(0) == 0
    assert acl.finalize() == 0
    assert capsys.readouterr().err == ""


# ----- configuration and drop-in use -----


def test_configure_errors():
    reset()
    with pytest.raises(acl.ConfigError, match="devices"):
        acl.configure(devices=0)
    with pytest.raises(acl.ConfigError, match="at most"):
        acl.configure(devices=8, capacity="1TiB")
    with pytest.raises(acl.ConfigError, match="sim, host"):
        acl.configure(backend="gpu")
    with pytest.raises(acl.ConfigError, match="alloc_conf"):
        acl.configure(allocator="pytorch", alloc_conf="bogus:1")
    env = {"NPUMEM_DEVICES": "x"}
    with pytest.raises(acl.ConfigError, match=r"NPUMEM_DEVICES='x'"):
        acl._config.from_env(env)
    with pytest.raises(acl.ConfigError, match=r"NPUMEM_ALLOCATOR='tf'.*npumem, direct"):
        acl._config.from_env({"NPUMEM_ALLOCATOR": "tf"})
    assert acl._config.from_env({"NPUMEM_DEVICES": " ", "NPUMEM_CAPACITY": "2GiB"}).capacity == 2 << 30
    reset()


def test_install_makes_import_acl_resolve():
    import importlib

    layer = importlib.import_module("npumem.acl")
    layer.install()
    try:
        plain = importlib.import_module("acl")
        rt = importlib.import_module("acl.rt")
        assert plain is layer and rt is layer.rt
        assert "bytes_to_ptr" in dir(plain.util)
    finally:
        layer.uninstall()
    assert "acl" not in sys.modules


# ----- more calls, and the host backend -----


def test_more_calls(system):
    ev, ret = acl.rt.create_event_with_flag(0x8)
    assert ret == 0
    s, _ = acl.rt.create_stream()
    assert acl.rt.synchronize_stream_with_timeout(s, 1000) == 0
    dev, _ = acl.rt.malloc(256, HUGE_FIRST)
    assert acl.rt.memset_async(dev, 256, 0x5A, 256, s) == 0
    other, _ = acl.rt.malloc(256, HUGE_FIRST)
    assert acl.rt.memcpy_async(other, 256, dev, 256, D2D, s) == 0
    assert acl.rt.record_event(ev, s) == 0
    assert acl.rt.synchronize_event(ev) == 0
    assert dev_bytes(other, 4) == b"\x5a" * 4
    a, b = np.arange(8, dtype=np.uint8), np.zeros(8, np.uint8)
    assert acl.rt.memcpy_async(b.ctypes.data, 8, a.ctypes.data, 8, H2H, s) == 0  # pageable H2H
    assert np.array_equal(a, b)
    # A malloc_host block of device 0 copied to device 1 (pinned memory is any device's host memory).
    host, _ = acl.rt.malloc_host(64)
    ctypes.memset(host, 0x11, 64)
    acl.rt.set_device(1)
    d1, _ = acl.rt.malloc(64, HUGE_FIRST)
    assert acl.rt.memcpy(d1, 64, host, 64, H2D) == 0
    assert dev_bytes(d1, 2) == b"\x11\x11"
    assert acl.rt.free(d1) == 0
    assert acl.rt.reset_device_force(1) == 0
    assert acl.rt.get_device() == (0, 107002)
    acl.rt.set_device(0)
    assert acl.rt.destroy_event(ev) == 0 and acl.rt.destroy_stream(s) == 0
    for p in (dev, other):
        assert acl.rt.free(p) == 0
    assert acl.rt.free_host(host) == 0
    assert acl.rt.memset(0, 8, 0, 8) == 100000
    assert acl.rt.memset(dev, 4, 0, 8) == 107000
    assert acl.rt.memset(dev, 8, 0, 0) == 0
    assert acl.rt.device_get_bare_tgid()[1] == 0
    assert acl.get_recent_err_msg()  # the last failure's message
    assert acl.report()["allocations"] == []


def test_host_backend_system():
    reset()
    try:
        acl.configure(devices=2, capacity="256MiB", backend="host")
        assert acl.init() == 0
        assert acl.rt.set_device(1) == 0
        p, ret = acl.rt.malloc(4096, HUGE_FIRST)
        assert ret == 0
        assert acl.rt.pointer_get_attributes(p)[0]["location"] == {"id": 1, "type": 1}
        put(p, b"real")
        assert dev_bytes(p, 4) == b"real"
        assert acl.util.ptr_to_bytes(p, 4) == b"real"  # host-backend device memory is process memory
        assert acl.rt.free(p) == 0
        assert acl.finalize() == 0
    finally:
        reset()


def test_threads_share_the_system(system):
    """Four threads, each on its own device, allocate, copy and free at once; every pointer
    lands in its device's slice and every byte arrives."""
    from conftest import run_in_threads

    def worker(i: int) -> None:
        assert acl.rt.set_device(i) == 0
        data = np.full(4096, i + 1, np.uint8)
        out = np.zeros(4096, np.uint8)
        for _ in range(50):
            p, ret = acl.rt.malloc(4096, HUGE_FIRST)
            assert ret == 0 and acl.rt.pointer_get_attributes(p)[0]["location"]["id"] == i
            assert acl.rt.memcpy(p, 4096, data.ctypes.data, 4096, H2D) == 0
            assert acl.rt.memcpy(out.ctypes.data, 4096, p, 4096, D2H) == 0
            assert np.array_equal(out, data)
            assert acl.rt.free(p) == 0
        assert acl.rt.reset_device(i) == 0

    assert run_in_threads(worker, 4) == []
    assert acl.report()["allocations"] == []
