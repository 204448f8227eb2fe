"""Device.buffer: one call makes an allocation that owns its block and frees it when collected;
it stands for its pointer wherever one is taken, a plain free of it is refused, and on the host
backend it exports its bytes through the buffer protocol."""

from __future__ import annotations

import gc
import operator
import threading
import weakref

import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

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


def test_reused_buffer_objects_are_each_a_new_allocation():
    """Dropped buffers' objects are kept and made again (more at once than are kept, across
    devices): each made one holds its own block with its own size and device, and is freed
    by its own deallocation."""
    a, b = npumem.Device("64MiB"), npumem.Device("64MiB")
    for rounds in range(3):
        bufs = [(a if i % 2 else b).buffer(64 + i) for i in range(200)]
        assert len({(dev, int(buf)) for dev, buf in zip([b, a] * 100, bufs, strict=True)}) == 200
        assert [len(buf) for buf in bufs] == [64 + i for i in range(200)]
        assert a.stats()["live_count"] == b.stats()["live_count"] == 100
        for i, buf in enumerate(bufs):
            assert (a if i % 2 else b).allocation(buf)["size"] >= 64 + i
        with pytest.raises(MemoryFreeError):
            a.free(bufs[1])  # still held by its object
        del buf
        del bufs[::2]
        assert b.stats()["live_count"] == 0 and a.stats()["live_count"] == 100
        del bufs
        assert a.stats()["live_count"] == 0, f"round {rounds}"
    dev = npumem.Device("64MiB")
    gone = weakref.ref(dev)
    kept = dev.buffer(4096)
    del dev
    assert gone() is None
    buf = a.buffer(4096)  # the memory of an object of `dev` may come back for `a`
    assert a.stats()["live_count"] == 1 and len(kept) == 4096
    del buf, kept
    assert a.stats()["live_count"] == 0


def test_buffer_outlives_its_device_object():
    """A buffer shares the core device, not the Device object: the object goes when its last
    reference does (even one held through the buffer, a cycle no collector needs to see), and
    the buffer's block stays valid and usable until the buffer goes."""
    dev = npumem.Device("64MiB")
    buf = dev.buffer(4096)
    dev.keep = dev.buffer(64)  # a buffer reachable from its own Device object
    gone = weakref.ref(dev)
    del dev
    assert gone() is None  # no collection needed: nothing the buffers hold points back
    assert int(buf) == buf.ptr and len(buf) == 4096
    del buf
    try:
        host = npumem.Device("64MiB", backend="host")
    except npumem.AclError as e:  # a machine without the host backend's mappings
        pytest.skip(f"host backend unavailable: {e}")
    buf = host.buffer(16)
    del host
    gc.collect()
    view = memoryview(buf)
    view[:3] = b"xyz"
    assert bytes(memoryview(buf)[:3]) == b"xyz"
    del buf  # the view still pins the block
    assert view[:3] == b"xyz"
    view.release()


def test_a_buffer_is_made_only_by_device_buffer():
    """The type cannot be instantiated or subclassed from Python (an object not made by
    Device.buffer would own no block), and its fields are read-only."""
    dev = npumem.Device("64MiB")
    buf = dev.buffer(8)
    with pytest.raises(TypeError):
        npumem._native.DeviceBuffer()
    with pytest.raises(TypeError):
        type(buf)()
    with pytest.raises(TypeError):
        type("Sub", (npumem._native.DeviceBuffer,), {})
    with pytest.raises(AttributeError):
        buf.ptr = 0
    with pytest.raises((AttributeError, TypeError)):
        buf.extra = 1
    assert repr(buf) == f"DeviceBuffer(ptr={buf.ptr:#x}, nbytes=8)"
    assert operator.index(buf) == int(buf) == buf.ptr and buf.nbytes == 8
    assert type(buf) is npumem._native.DeviceBuffer and type(buf).__module__ == "npumem._native"


def test_buffers_made_and_dropped_on_several_threads():
    """Threads make and drop buffers of one device while others copy through it without the
    GIL (2 MiB writes) and while the Device object itself goes: every block is freed once, and
    the last buffer to go takes the shared device with it."""
    dev = npumem.Device("256MiB")
    big = dev.malloc(2 << 20)
    payload = bytes(2 << 20)
    kept: list[list] = [[] for _ in range(4)]

    def work(i, dev):
        for n in range(300):
            buf = dev.buffer(64 + 512 * (n % 7))
            if n % 3 == 0:
                kept[i].append(buf)  # dropped later, on another thread
            if n % 50 == 0:
                dev.write(big, payload)
            del buf

    threads = [threading.Thread(target=work, args=(i, dev)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    del threads, t
    assert dev.stats()["live_count"] == 1 + sum(map(len, kept))
    dropper = threading.Thread(target=lambda: [k.clear() for k in kept[:2]])
    dropper.start()
    dropper.join()
    assert dev.stats()["live_count"] == 1 + sum(map(len, kept))
    dev.free(big)
    survivors = [b for k in kept for b in k]
    kept.clear()
    gone = weakref.ref(dev)
    del dev
    assert gone() is None
    last = threading.Thread(target=survivors.clear)
    last.start()
    last.join()
    assert not survivors


@pytest.mark.parametrize("nbytes", [0, 1, 4096, 3 << 20, 1 << 40, -1, 1 << 64, (1 << 64) - 1, True, np.uint32(64)])
def test_one_int_argument_acts_as_every_other_call(nbytes):
    """`dev.buffer(n)` with one int takes a shorter path than a call with keywords: both give
    the same block (and the same error, in the same words) for any value."""
    outcomes = []
    for call in (lambda d: d.buffer(nbytes), lambda d: d.buffer(nbytes=nbytes, policy=None, stream=None)):
        dev = npumem.Device("64MiB")
        try:
            buf = call(dev)
        except (npumem.AclError, TypeError, OverflowError) as e:
            outcomes.append((type(e), str(e), dev.stats()["live_count"]))
        else:
            outcomes.append((type(buf), int(buf), len(buf), dev.allocations()))
    assert outcomes[0] == outcomes[1]


@pytest.mark.parametrize("value", [0, 1, 4096, 1 << 40, -1, 1 << 64, True, np.uint32(64), "4KiB"])
def test_malloc_and_free_with_one_int_act_as_every_other_call(value):
    """`malloc(n)` and `free(p)` with one int are served by C-API methods, other calls by
    PyO3's: the same pointers, the same errors in the same words."""
    outcomes = []
    for malloc, free in (
        (lambda d: d.malloc(value), lambda d, p: d.free(p)),
        (lambda d: d.malloc(value, None, None, None), lambda d, p: d.free(ptr=p, stream=None)),
    ):
        dev = npumem.Device("64MiB")
        got = []
        for step in ("malloc", "free the value", "free a block"):
            try:
                if step == "malloc":
                    got.append(malloc(dev))
                else:
                    got.append(free(dev, value if step == "free the value" else dev.malloc(4096)))
            except (npumem.AclError, TypeError, OverflowError) as e:
                got.append((type(e), str(e)))
        outcomes.append((got, dev.allocations(), dev.stats()["live_count"]))
    assert outcomes[0] == outcomes[1]


class BufferAgainstMallocFree(RuleBasedStateMachine):
    """Device.buffer against its model, malloc + free at collection: a random program of
    buffers (on streams, under queued work, with host writes the sanitizer judges) run on one
    device, and the same program with plain malloc / free on a twin, leave both devices alike
    after every step — the same addresses, live blocks, deferred frees, clock and sanitizer
    verdicts — and a plain free of a live buffer is refused without changing anything."""

    @initialize()
    def setup(self):
        self.a, self.b = (npumem.Device("64MiB") for _ in range(2))
        self.streams = [None] + [(self.a.create_stream(), self.b.create_stream()) for _ in range(2)]
        self.bufs: list[tuple[npumem.DeviceBuffer, int]] = []

    def _stream(self, i):
        return self.streams[i] or (None, None)

    def _pick(self, data) -> int:
        """The index of a live buffer (drawn as an index: hypothesis keeps what it draws)."""
        return data.draw(st.integers(0, len(self.bufs) - 1))

    @rule(size=st.integers(1, 3 << 20), policy=st.sampled_from([0, 2]), s=st.integers(0, 2))
    def make(self, size, policy, s):
        sa, sb = self._stream(s)
        try:
            ptr = self.b.malloc(size, policy, stream=sb)
        except npumem.OutOfMemoryError:
            with pytest.raises(npumem.OutOfMemoryError):
                self.a.buffer(size, policy=policy, stream=sa)
            return
        buf = self.a.buffer(size, policy=policy, stream=sa)
        assert int(buf) == ptr and len(buf) == size
        self.bufs.append((buf, ptr))

    @rule(data=st.data())
    def drop(self, data):
        if self.bufs:
            buf, ptr = self.bufs.pop(self._pick(data))
            del buf
            self.b.free(ptr)
            assert self.a.allocation(ptr) is None

    @rule(data=st.data(), s=st.integers(1, 2), us=st.floats(1, 500), write=st.booleans())
    def launch(self, data, s, us, write):
        if self.bufs:
            ptr = self.bufs[self._pick(data)][1]
            for dev, stream in zip((self.a, self.b), self.streams[s], strict=True):
                dev.launch(stream, us, writes=[ptr] if write else None, reads=None if write else [ptr])

    @rule(data=st.data())
    def host_write(self, data):
        if self.bufs:
            ptr = self.bufs[self._pick(data)][1]
            for dev in (self.a, self.b):
                dev.write(ptr, b"x")

    @rule(data=st.data())
    def plain_free_is_refused(self, data):
        if self.bufs:
            buf = self.bufs[self._pick(data)][0]
            before = self.a.allocations()
            with pytest.raises(MemoryFreeError, match="held by 1"):
                self.a.free(buf)
            with pytest.raises(MemoryFreeError):
                self.a.free_many([int(buf)])
            assert self.a.allocations() == before
            # A call settles completed work first, refused or not: so does the twin's.
            self.b.free_many([])

    @rule()
    def synchronize(self):
        self.a.synchronize_device()
        self.b.synchronize_device()

    @invariant()
    def devices_agree(self):
        a, b = self.a, self.b
        assert a.allocations() == b.allocations()
        sa, sb = a.stats(), b.stats()
        for key in ("live_count", "deferred_frees", "pending_frees"):
            assert sa[key] == sb[key], key
        assert a.now_us() == b.now_us()
        assert a.sanitizer_counts() == b.sanitizer_counts()
        assert a.memory_stats() == b.memory_stats()


TestBufferAgainstMallocFree = BufferAgainstMallocFree.TestCase
TestBufferAgainstMallocFree.settings = settings(max_examples=30, stateful_step_count=30, deadline=None)


def test_device_subclasses_dispatch_native_methods_as_their_own():
    """`Device` and its subclasses call the native methods through descriptors of their own
    (which CPython specialises), and keep every method they override."""
    assert npumem.Device.__dict__["buffer"].__objclass__ is npumem.Device

    class Counting(npumem.Device):
        def malloc(self, size, *args, **kwargs):
            self.calls = getattr(self, "calls", 0) + 1
            return super().malloc(size, *args, **kwargs)

    assert Counting.__dict__["free"].__objclass__ is Counting
    assert Counting.__dict__["malloc"].__qualname__.endswith("Counting.malloc")
    dev = Counting("64MiB")
    dev.free(dev.malloc(64))
    assert dev.calls == 1 and dev.stats()["live_count"] == 0
    with pytest.raises(TypeError):
        Counting.free(npumem.Device("64MiB"), 1)  # a descriptor of Counting takes only Countings
    with pytest.raises(TypeError, match="subclass"):
        npumem._native._bind_methods(int)
