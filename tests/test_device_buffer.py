"""Device.buffer: one call makes an allocation that owns its block and frees it when collected;
it stands for its pointer wherever one is taken, a plain free of it is refused, and on the host
backend it exports its bytes through the buffer protocol."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import npumem
from npumem import MemoryFreeError, UnsupportedError


def test_buffer_frees_its_block_when_collected():
    dev = npumem.Device("64MiB")
    buf = dev.buffer(4096)
    assert len(buf) == buf.nbytes == 4096 and int(buf) == buf.ptr
    assert dev.stats()["live_count"] == 1
    del buf
    assert dev.stats()["live_count"] == 0
    # One block each, on the stream given, freed in any order.
    s = dev.create_stream()
    bufs = [dev.buffer(n, stream=s) for n in (1, 4096, 3 << 20)]
    assert [dev.allocation(b)["stream"] for b in bufs] == [s] * 3
    bufs.reverse()
    del bufs
    gc.collect()
    assert dev.stats()["live_count"] == 0


def test_buffer_goes_where_a_pointer_does():
    dev = npumem.Device("64MiB")
    buf = dev.buffer(64)
    dev.write(buf, b"abc")
    assert dev.read(buf, 3) == b"abc"
    dev.memset(buf, 64, 7, 64)
    assert (dev.to_numpy(buf, 64) == 7).all()
    other = dev.malloc(64)
    dev.memcpy(other, 64, buf, 64)
    assert dev.read(other, 1) == b"\x07"
    dev.free(other)


def test_a_plain_free_of_a_buffer_is_refused():
    dev = npumem.Device("64MiB")
    buf = dev.buffer(4096)
    with pytest.raises(MemoryFreeError, match="held by 1"):
        dev.free(buf)
    with pytest.raises(MemoryFreeError):
        dev.free_many([int(buf)])
    assert dev.stats()["live_count"] == 1
    del buf
    assert dev.stats()["live_count"] == 0


def test_buffer_checks_its_arguments():
    dev = npumem.Device("64MiB")
    with pytest.raises(npumem.InvalidParamError):
        dev.buffer(-1)
    with pytest.raises(npumem.OutOfMemoryError):
        dev.buffer(1 << 30)
    with pytest.raises(npumem.InvalidParamError):
        dev.buffer(8, stream=99)
    assert dev.stats()["live_count"] == 0


def test_buffer_protocol_on_the_host_backend_only():
    sim = npumem.Device("64MiB")
    with pytest.raises(UnsupportedError, match="backend"):
        memoryview(sim.buffer(16))
    try:
        host = npumem.Device("64MiB", backend="host")
    except npumem.AclError as e:  # a machine without the host backend's mappings
        pytest.skip(f"host backend unavailable: {e}")
    buf = host.buffer(4096)
    arr = np.frombuffer(buf, dtype=np.uint8)
    arr[:4] = [1, 2, 3, 4]
    assert host.read(buf, 4) == b"\x01\x02\x03\x04"
    del buf  # the array keeps the block
    assert host.stats()["live_count"] == 1
    del arr
    assert host.stats()["live_count"] == 0
