"""A property test of npumem.acl: random programs of acl.rt calls over two devices against an
independent model of what each call returns and what the memory then holds.

The model knows only pyACL's rules (return codes, per-thread current device with reference
counts, peer access gating cross-device copies, direction from the addresses) and keeps every
buffer's bytes, -1 for bytes never written; every read compares the bytes the model knows."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, invariant, rule

import npumem.acl as acl
from npumem.acl._runtime import LOCK, RT

DEVICES = 2
SCRATCH = 8192


def reset() -> None:
    with LOCK:
        RT.forget()


class Program(RuleBasedStateMachine):
    device_bufs = Bundle("device_bufs")
    host_bufs = Bundle("host_bufs")

    def __init__(self) -> None:
        super().__init__()
        reset()
        acl.configure(devices=DEVICES, capacity="256MiB")
        assert acl.init() == 0
        self.current: int | None = None
        self.refs = [0] * DEVICES
        self.peers: set[tuple[int, int]] = set()
        #: ptr -> (device or -1 for malloc_host, bytes: int16, -1 unknown)
        self.mem: dict[int, tuple[int, np.ndarray]] = {}
        self.scratch = np.zeros(SCRATCH, np.uint8)
        #: live stream -> its device (all made in a device's default context)
        self.streams: dict[int, int] = {}

    def teardown(self) -> None:
        reset()

    # ----- devices -----

    @rule(d=st.integers(0, DEVICES))
    def set_device(self, d):
        ret = acl.rt.set_device(d)
        if d >= DEVICES:
            assert ret == 107001
            return
        assert ret == 0
        self.current = d
        self.refs[d] += 1

    @rule(d=st.integers(0, DEVICES - 1))
    def reset_device(self, d):
        assert acl.rt.reset_device(d) == 0
        if self.refs[d]:
            self.refs[d] -= 1
            if self.refs[d] == 0:
                # The default context goes, and the streams made in it.
                self.streams = {h: x for h, x in self.streams.items() if x != d}
                if self.current == d:
                    self.current = None

    @rule(p=st.integers(0, DEVICES))
    def enable_peer(self, p):
        ret = acl.rt.device_enable_peer_access(p, 0)
        if self.current is None:
            assert ret == 107002
        elif p >= DEVICES:
            assert ret == 107001
        elif p == self.current:
            assert ret == 107000
        else:
            assert ret == 0
            self.peers.add((self.current, p))

    @invariant()
    def current_device(self):
        got = acl.rt.get_device()
        assert got == ((self.current, 0) if self.current is not None else (0, 107002))

    @invariant()
    def leak_books(self):
        """The report lists exactly the live allocations, host blocks and streams."""
        found = acl.report()
        assert {a["ptr"] for a in found["allocations"]} == {p for p, (d, _) in self.mem.items() if d >= 0}
        assert {b["ptr"] for b in found["host_blocks"]} == {p for p, (d, _) in self.mem.items() if d < 0}
        assert {s["stream"]: s["device"] for s in found["streams"]} == self.streams

    # ----- streams -----

    @rule()
    def create_stream(self):
        s, ret = acl.rt.create_stream()
        if self.current is None:
            assert (s, ret) == (0, 107002)
        else:
            assert ret == 0 and s not in self.streams
            self.streams[s] = self.current

    @rule(data=st.data())
    def destroy_stream(self, data):
        handle = data.draw(st.sampled_from([*self.streams, 12345]))
        ret = acl.rt.destroy_stream(handle)
        if handle in self.streams:
            assert ret == 0
            del self.streams[handle]
        else:
            assert ret == 107000

    # ----- memory -----

    @rule(target=device_bufs, size=st.integers(0, 6000), policy=st.sampled_from([0, 1, 2, 9, 0x1000]))
    def malloc(self, size, policy):
        ptr, ret = acl.rt.malloc(size, policy)
        if self.current is None:
            assert (ptr, ret) == (0, 107002)
            return 0
        if size == 0:
            assert (ptr, ret) == (0, 100000)
            return 0
        assert ret == 0 and ptr % 64 == 0 and ptr not in self.mem
        attrs, ret = acl.rt.pointer_get_attributes(ptr)
        assert ret == 0 and attrs["location"] == {"id": self.current, "type": 1}
        self.mem[ptr] = (self.current, np.full(size, -1, np.int16))
        return ptr

    @rule(target=host_bufs, size=st.integers(1, 6000))
    def malloc_host(self, size):
        ptr, ret = acl.rt.malloc_host(size)
        assert ret == 0 and ptr % 64 == 0
        self.mem[ptr] = (-1, np.full(size, -1, np.int16))
        return ptr

    @rule(ptr=consumes(device_bufs))
    def free(self, ptr):
        ret = acl.rt.free(ptr)
        entry = self.mem.get(ptr)
        if ptr == 0:
            assert ret == 100000
        elif entry is None or entry[0] < 0:
            assert ret == 207002
        else:
            assert ret == 0
            del self.mem[ptr]

    @rule(ptr=device_bufs)
    def double_free(self, ptr):
        if ptr and ptr not in self.mem:
            assert acl.rt.free(ptr) == 207002

    @rule(ptr=consumes(host_bufs))
    def free_host(self, ptr):
        assert acl.rt.free_host(ptr) == 0
        del self.mem[ptr]

    # ----- copies and fills -----

    def _off(self, ptr: int, off: int) -> int:
        """Offsets into malloc_host blocks stay inside them: past its end lies other process
        memory, which the layer takes as pageable host memory (as pyACL would)."""
        entry = self.mem.get(ptr)
        return min(off, len(entry[1]) - 1) if entry is not None and entry[0] < 0 else off

    def _range_ok(self, ptr: int, off: int, count: int) -> bool:
        entry = self.mem.get(ptr)
        return entry is not None and off + count <= len(entry[1])

    @rule(
        ptr=st.one_of(device_bufs, host_bufs),
        off=st.integers(0, 100),
        count=st.integers(0, 3000),
        slack=st.integers(-1, 1),
        seed=st.integers(0, 255),
        kind=st.sampled_from([1, 2, 4, 0, 7]),
    )
    def write(self, ptr, off, count, slack, seed, kind):
        off = self._off(ptr, off)
        """memcpy from pageable memory (a numpy array) into a buffer, any kind (leniency)."""
        data = (np.arange(count, dtype=np.uint32) * 7 + seed).astype(np.uint8)
        self.scratch[:count] = data
        dmax = max(count + slack, 0)
        ret = acl.rt.memcpy(ptr + off if ptr else 0, dmax, self.scratch.ctypes.data, count, kind)
        if kind == 7:
            assert ret == 100000
        elif count == 0:
            assert ret == 0
        elif count > dmax:
            assert ret == 107000
        elif ptr == 0:
            assert ret == 100000
        elif not self._range_ok(ptr, off, count):
            assert ret == 107000
        else:
            assert ret == 0
            self.mem[ptr][1][off : off + count] = data

    @rule(ptr=st.one_of(device_bufs, host_bufs), off=st.integers(0, 100), count=st.integers(1, 3000))
    def read(self, ptr, off, count):
        off = self._off(ptr, off)
        self.scratch[:] = 0
        ret = acl.rt.memcpy(self.scratch.ctypes.data, SCRATCH, ptr + off if ptr else 0, count, 2)
        if ptr == 0:
            assert ret == 100000
        elif not self._range_ok(ptr, off, count):
            assert ret == 107000
        else:
            assert ret == 0
            want = self.mem[ptr][1][off : off + count]
            known = want >= 0
            assert np.array_equal(self.scratch[:count][known], want[known].astype(np.uint8))

    @rule(
        ptr=st.one_of(device_bufs, host_bufs),
        off=st.integers(0, 64),
        count=st.integers(0, 3000),
        value=st.integers(-300, 300),
    )
    def memset(self, ptr, off, count, value):
        off = self._off(ptr, off)
        ret = acl.rt.memset(ptr + off if ptr else 0, count, value, count)
        if count == 0:
            assert ret == 0
        elif ptr == 0:
            assert ret == 100000
        elif not self._range_ok(ptr, off, count):
            assert ret == 107000
        else:
            assert ret == 0
            self.mem[ptr][1][off : off + count] = value & 0xFF

    @rule(dst=device_bufs, src=device_bufs, count=st.integers(1, 2000))
    def copy_d2d(self, dst, src, count):
        ret = acl.rt.memcpy(dst, count, src, count, 3)
        if dst == 0 or src == 0:
            assert ret == 100000
            return
        if dst == src:
            assert ret == 0
            return
        d_entry, s_entry = self.mem.get(dst), self.mem.get(src)
        live = d_entry is not None and s_entry is not None
        if live and d_entry[0] != s_entry[0]:
            if self.current is None:
                assert ret == 107002
                return
            others = {d_entry[0], s_entry[0]} - {self.current}
            if any((self.current, o) not in self.peers for o in others):
                assert ret == 107000
                return
        if not (self._range_ok(dst, 0, count) and self._range_ok(src, 0, count)):
            assert ret in (107000, 107002)
            return
        assert ret == 0
        self.mem[dst][1][:count] = self.mem[src][1][:count]

    @rule(ptr=device_bufs, count=st.integers(1, 3000), seed=st.integers(0, 255))
    def write_async_pageable(self, ptr, count, seed):
        """From pageable memory the async copy completes before it returns: the source may change
        right after."""
        data = (np.arange(count, dtype=np.uint32) + seed).astype(np.uint8)
        self.scratch[:count] = data
        ret = acl.rt.memcpy_async(ptr, count, self.scratch.ctypes.data, count, 1, 0)
        self.scratch[:count] = 0
        if self.current is None:
            assert ret == 107002
        elif ptr == 0:
            assert ret == 100000
        elif not self._range_ok(ptr, 0, count):
            assert ret == 107000
        else:
            entry = self.mem[ptr]
            if entry[0] != self.current and (self.current, entry[0]) not in self.peers:
                assert ret == 107000
                return
            assert ret == 0
            entry[1][:count] = data

    @rule(
        dst=st.one_of(device_bufs, host_bufs),
        src=st.one_of(device_bufs, host_bufs),
        count=st.integers(1, 2000),
        kind=st.sampled_from([0, 1, 2, 3, 4]),
    )
    def copy_async_then_sync(self, dst, src, count, kind):
        """memcpy_async on the default stream between any two buffers (queued where both ends
        are one device's), then synchronize_stream: the bytes have landed."""
        ret = acl.rt.memcpy_async(dst, count, src, count, kind, 0)
        if self.current is None:
            assert ret == 107002
            return
        assert acl.rt.synchronize_stream(0) == 0
        if dst == 0 or src == 0:
            assert ret == 100000
            return
        if dst == src:
            assert ret == 0
            return
        ends = [self.mem.get(dst), self.mem.get(src)]
        if any(e is None for e in ends) or not (self._range_ok(dst, 0, count) and self._range_ok(src, 0, count)):
            assert ret == 107000
            return
        devices = {e[0] for e in ends if e[0] >= 0} - {self.current}
        if any((self.current, d) not in self.peers for d in devices):
            assert ret == 107000
            return
        assert ret == 0
        self.mem[dst][1][:count] = self.mem[src][1][:count]


TestProgram = Program.TestCase
