"""The sanitizer judged by an independent, deliberately simple happens-before model.

Random multi-stream programs (mallocs on streams, launches with declared reads and writes, async
copies and memsets, pageable copies on a stream, events and waits, synchronisation, record_stream,
stream-ordered and plain frees, host reads, writes and copies, accesses through freed or dangling
pointers) run on a device and, step by step, on the model below. The model keeps every operation
as a node of a graph whose edges are the orderings the runtime promises:

- program order: the host's calls form one chain; each stream's operations form a chain;
- an operation queued on a stream follows the host call that queued it;
- ``record_event(e, s)`` marks the last node of ``s``; ``stream_wait_event(t, e)`` adds a node to
  ``t`` after that mark; ``synchronize_*`` adds a host node after the stream's last node, the
  event's mark, or every stream's last node.

A happens before B iff B's ancestors contain A (computed by walking predecessors; no vector
clocks). An access conflicts with an earlier access to overlapping bytes of the same memory when
one of them writes and the earlier does not happen before it; a host read of that kind is a
``pending_write_read``, anything else a ``race``. A free is a ``use_after_free`` hazard when a
stream other than those the free waits for (the block's own stream and recorded streams, or the
stream of a stream-ordered free) accessed the memory without that access happening before the
free. A block that a malloc takes back from a pending free (the device says so in its reuse
counters) keeps its earlier accesses. Refused accesses (no live allocation: ``use_after_free``;
past the requested size: ``out_of_bounds``) and frees of freed pointers (``double_free``) are
findings too.

The device's findings after every step must equal the model's (no misses, no false alarms), and
on a program without findings every byte the host reads back is the one the model predicts (no
queued effect lost).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import npumem

HOST = -1
N_STREAMS = 3
N_EVENTS = 2
REUSE_COUNTERS = ("same_stream_reuses", "event_dependency_reuses", "internal_dependency_reuses")


class Graph:
    """Operations and the orderings between them; ``before(a, b)``: a happens before b."""

    def __init__(self) -> None:
        self.preds: list[tuple[int, ...]] = []
        self._ancestors: dict[int, frozenset[int]] = {}

    def node(self, *preds: int | None) -> int:
        self.preds.append(tuple(p for p in preds if p is not None))
        return len(self.preds) - 1

    def ancestors(self, n: int) -> frozenset[int]:
        if n not in self._ancestors:
            seen, todo = {n}, [n]
            while todo:
                for p in self.preds[todo.pop()]:
                    if p not in seen:
                        seen.add(p)
                        todo.append(p)
            self._ancestors[n] = frozenset(seen)
        return self._ancestors[n]

    def before(self, a: int, b: int) -> bool:
        return a in self.ancestors(b)


class Memory:
    """One allocation (device or malloc_host) in the model: its accesses and known bytes."""

    def __init__(self, ptr: int, size: int, granted: int, stream: int | None, host: bool) -> None:
        self.ptr, self.size, self.granted, self.stream, self.host = ptr, size, granted, stream, host
        self.live = True
        self.uses: set[int] = set()  # record_stream
        self.accesses: list[tuple[int, int, int, int, bool]] = []  # (node, actor, lo, hi, write)
        self.data = np.zeros(size, dtype=np.uint8)
        self.known = np.zeros(size, dtype=bool)


class Model:
    def __init__(self, streams: list[int], raise_mode: bool) -> None:
        self.g = Graph()
        self.raise_mode = raise_mode
        self.host_last = self.g.node()
        self.stream_last: dict[int, int | None] = dict.fromkeys(streams)
        self.marks: dict[int, int | None] = {}
        self.memories: list[Memory] = []
        self.freed_ptrs: set[int] = set()
        self.findings: list[tuple] = []

    # ----- orderings -----
    def host_node(self, *extra: int | None) -> int:
        self.host_last = self.g.node(self.host_last, *extra)
        return self.host_last

    def stream_node(self, s: int, *extra: int | None) -> int:
        enqueue = self.host_node()
        n = self.g.node(self.stream_last[s], enqueue, *extra)
        self.stream_last[s] = n
        return n

    # ----- addresses -----
    def live(self) -> list[Memory]:
        return [m for m in self.memories if m.live]

    def classify(self, addr: int, length: int) -> tuple[Memory | None, str | None]:
        """The live memory holding [addr, addr + length), or the finding a refusal makes."""
        for m in self.live():
            if m.ptr <= addr < m.ptr + m.size:
                return (m, None) if addr + length <= m.ptr + m.size else (None, "out_of_bounds")
        for m in self.live():
            if not m.host and m.ptr <= addr < m.ptr + m.granted:
                return None, "out_of_bounds"
        is_device = npumem.VA_WINDOW_START <= addr < npumem.VA_WINDOW_END
        return None, ("use_after_free" if is_device else None)

    def refuse(self, kind: str | None) -> None:
        if kind is not None:
            self.findings.append((kind, None, ()))

    def check_ranges(self, ranges: list[tuple[int, int]]) -> list[Memory] | None:
        """Classifies each range in turn; the first refusal makes the (one) finding."""
        out = []
        for addr, length in ranges:
            m, why = self.classify(addr, length)
            if m is None:
                self.refuse(why)
                return None
            out.append(m)
        return out

    # ----- the sanitizer's verdicts -----
    def conflicts(self, node: int, actor: int, m: Memory, lo: int, hi: int, write: bool) -> list[int]:
        others = {
            a
            for (n, a, alo, ahi, awrite) in m.accesses
            if a != actor and (awrite or write) and alo < hi and lo < ahi and not self.g.before(n, node)
        }
        return sorted(others)

    def access(self, node: int, actor: int, touches: list[tuple[Memory, int, int, bool]]) -> bool:
        """Judges one operation's accesses; False if raise mode refuses it (nothing recorded)."""
        hazards = []
        for m, lo, hi, write in touches:
            others = self.conflicts(node, actor, m, lo, hi, write)
            if others:
                kind = "pending_write_read" if actor == HOST and not write else "race"
                hazards.append((kind, m.ptr, (*others, actor)))
        self.findings.extend(hazards)
        if hazards and self.raise_mode:
            return False
        for m, lo, hi, write in touches:
            m.accesses.append((node, actor, lo, hi, write))
        return True

    def free_hazard(self, m: Memory, node: int, actor: int, waited: set[int]) -> bool:
        unordered = {a for (n, a, *_) in m.accesses if a not in waited and not self.g.before(n, node)}
        others = sorted(unordered - {HOST, actor})
        if others:
            self.findings.append(("use_after_free", m.ptr, (*others, actor)))
            return self.raise_mode
        return False

    # ----- bytes (applied in issue order: exact for programs without findings) -----
    @staticmethod
    def put(m: Memory, off: int, data: np.ndarray, known: np.ndarray) -> None:
        m.data[off : off + len(data)] = data
        m.known[off : off + len(data)] = known

    @staticmethod
    def get(m: Memory, off: int, n: int) -> tuple[np.ndarray, np.ndarray]:
        return m.data[off : off + n].copy(), m.known[off : off + n].copy()


OPS = st.lists(
    st.tuples(
        st.sampled_from(
            [
                "malloc",
                "malloc",
                "malloc_host",
                "launch",
                "launch",
                "copy_async",
                "copy_async",
                "memset_async",
                "host_write",
                "host_read",
                "host_copy",
                "write_on_stream",
                "record_event",
                "wait_event",
                "sync_stream",
                "sync_event",
                "sync_device",
                "record_stream",
                "free",
                "free",
                "free_on_stream",
                "free_host",
                "reuse",
                "reuse",
            ]
        ),
        st.integers(0, 1 << 16),
        st.integers(0, 1 << 16),
        st.integers(0, 1 << 16),
        st.integers(0, 1 << 16),
    ),
    min_size=5,
    max_size=50,
)


def run_program(dev: npumem.Device, program, raise_mode: bool) -> None:
    streams = [0] + [dev.create_stream() for _ in range(N_STREAMS - 1)]
    events = [dev.create_event() for _ in range(N_EVENTS)]
    model = Model(streams, raise_mode)
    model.marks = dict.fromkeys(events)
    rng = np.random.default_rng(len(program))
    sizes = [1500, 4000]
    # Two device blocks on two streams and a pinned buffer to start with.
    for stream in streams[1:3]:
        ptr = dev.malloc(sizes[0], stream=stream)
        model.memories.append(Memory(ptr, sizes[0], dev.allocation(ptr)["granted"], stream, host=False))
        model.host_node()
    model.memories.append(Memory(dev.malloc_host(4096), 4096, 4096, None, host=True))
    model.host_node()

    def pick(i: int, host: bool | None = None, live_only: bool = False) -> Memory | None:
        pool = [m for m in model.memories if (host is None or m.host == host) and (m.live or not live_only)]
        return pool[i % len(pool)] if pool else None

    def span(m: Memory, a: int, b: int) -> tuple[int, int]:
        """A range starting inside ``m``; now and then running past its end."""
        off = a % m.size
        n = 1 + b % (m.size - off + (8 if b % 5 == 0 else 0))
        return m.ptr + off, n

    def expect(call, *, hazard_ok: bool = True):
        """Runs a device call; returns True if it ran (errors are the model's business)."""
        try:
            call()
            return True
        except npumem.SanitizerError:
            assert raise_mode and hazard_ok
            return False
        except (npumem.InvalidParamError, npumem.MemoryFreeError):
            return False

    def do(step: int, op: str, a: int, b: int, c: int, d: int) -> None:
        s = streams[a % N_STREAMS]
        if op == "malloc":
            size, stream = sizes[b % len(sizes)], streams[c % N_STREAMS]
            counters = [dev.stats()[k] for k in REUSE_COUNTERS]
            ptr = dev.malloc(size, stream=stream)
            info = dev.allocation(ptr)
            m = Memory(ptr, size, info["granted"], stream, host=False)
            if [dev.stats()[k] for k in REUSE_COUNTERS] != counters:
                # Taken back from a pending free: the block's earlier accesses come with it.
                source = [x for x in model.memories if not x.live and not x.host and x.ptr == ptr][-1]
                m.accesses = list(source.accesses)
            model.memories.append(m)
            model.host_node()
        elif op == "reuse":
            # Free a block and malloc its size on its stream at once (PyTorch's churn).
            m = pick(b, host=False, live_only=True)
            if m is None:
                return
            index = [x for x in model.memories if not x.host].index(m)
            do(step, "free_on_stream" if c % 2 else "free", streams.index(m.stream), index, 0, 0)
            do(step, "malloc", 0, sizes.index(m.size), streams.index(m.stream), 0)
        elif op == "malloc_host":
            ptr = dev.malloc_host(4096)
            model.memories.append(Memory(ptr, 4096, 4096, None, host=True))
            model.host_node()
        elif op == "launch":
            args = [pick(x, host=False) for x in (b, c)]
            if args[0] is None:
                return
            reads = [args[0].ptr] if d % 2 else []
            writes = [args[1].ptr] if d % 3 else []
            duration = float(d % 7) * 100.0
            ran = expect(lambda: dev.launch(s, duration, reads=reads, writes=writes))
            checked = model.check_ranges([(p, 1) for p in reads + writes])
            if checked is not None:
                touched: dict[int, tuple[Memory, bool]] = {}
                for mem, w in zip(checked, [False] * len(reads) + [True] * len(writes), strict=True):
                    touched[mem.ptr] = (mem, touched.get(mem.ptr, (mem, False))[1] or w)
                node = model.stream_node(s)
                touches = [(mem, mem.ptr, mem.ptr + mem.size, w) for _, (mem, w) in sorted(touched.items())]
                assert ran == model.access(node, s, touches), (step, op)
        elif op in ("copy_async", "host_copy"):
            dst, src = pick(b), pick(c)
            if dst is None or src is None:
                return
            dst_at, n = span(dst, d, a)
            src_at = src.ptr + (d // 7) % src.size
            if op == "copy_async":
                ran = expect(lambda: dev.memcpy_async(dst_at, n, src_at, n, npumem.MemcpyKind.DEFAULT, s))
            else:
                ran = expect(lambda: dev.memcpy(dst_at, n, src_at, n, npumem.MemcpyKind.DEFAULT))
            checked = model.check_ranges([(dst_at, n), (src_at, n)])
            if checked is not None and dst_at != src_at:
                dm, sm = checked
                node = model.stream_node(s) if op == "copy_async" else model.host_node()
                actor = s if op == "copy_async" else HOST
                touches = [(sm, src_at, src_at + n, False), (dm, dst_at, dst_at + n, True)]
                ok = model.access(node, actor, touches)
                assert ran == ok, (step, op)
                if ok:
                    model.put(dm, dst_at - dm.ptr, *model.get(sm, src_at - sm.ptr, n))
            elif checked is not None:
                assert ran
        elif op == "memset_async":
            m = pick(b)
            if m is None:
                return
            at, n = span(m, c, d)
            ran = expect(lambda: dev.memset_async(at, n, a % 256, n, s))
            checked = model.check_ranges([(at, n)])
            if checked is not None:
                ok = model.access(model.stream_node(s), s, [(checked[0], at, at + n, True)])
                assert ran == ok, (step, op)
                if ok:
                    model.put(checked[0], at - checked[0].ptr, np.full(n, a % 256, np.uint8), np.ones(n, bool))
        elif op in ("host_write", "write_on_stream"):
            m = pick(b, host=False if op == "write_on_stream" else None)
            if m is None:
                return
            at, n = span(m, c, d)
            data = rng.integers(0, 256, n, dtype=np.uint8)
            on_stream = op == "write_on_stream"
            ran = expect(lambda: dev.write(at, data.tobytes(), stream=s if on_stream else None))
            checked = model.check_ranges([(at, n)])
            if checked is not None:
                node = model.stream_node(s) if on_stream else model.host_node()
                ok = model.access(node, s if on_stream else HOST, [(checked[0], at, at + n, True)])
                assert ran == ok, (step, op)
                if ok:
                    if on_stream:
                        model.host_node(node)  # the host waits for the pageable copy
                    model.put(checked[0], at - checked[0].ptr, data, np.ones(n, bool))
        elif op == "host_read":
            m = pick(b)
            if m is None:
                return
            at, n = span(m, c, d)
            out = []
            ran = expect(lambda: out.append(dev.read(at, n)))
            checked = model.check_ranges([(at, n)])
            if checked is not None:
                ok = model.access(model.host_node(), HOST, [(checked[0], at, at + n, False)])
                assert ran == ok, (step, op)
                if ok and not model.findings:
                    want, known = model.get(checked[0], at - checked[0].ptr, n)
                    got = np.frombuffer(out[0], dtype=np.uint8)
                    assert np.array_equal(got[known], want[known]), f"step {step}: bytes differ"
        elif op == "record_event":
            e = events[b % N_EVENTS]
            dev.record_event(e, s)
            model.marks[e] = model.stream_last[s]
            model.host_node()
        elif op == "wait_event":
            e = events[b % N_EVENTS]
            dev.stream_wait_event(s, e)
            model.host_node()
            model.stream_last[s] = model.g.node(model.stream_last[s], model.marks[e])
        elif op == "sync_stream":
            dev.synchronize_stream(s)
            model.host_node(model.stream_last[s])
        elif op == "sync_event":
            e = events[b % N_EVENTS]
            dev.synchronize_event(e)
            model.host_node(model.marks[e])
        elif op == "sync_device":
            dev.synchronize_device()
            model.host_node(*model.stream_last.values())
        elif op == "record_stream":
            m = pick(b, host=False)
            if m is None:
                return
            ran = expect(lambda: dev.record_stream(m.ptr, s))
            target = next((x for x in model.live() if not x.host and x.ptr == m.ptr), None)
            assert ran == (target is not None), (step, op)
            if target is not None and s != target.stream:
                target.uses.add(s)
            model.host_node()
        elif op in ("free", "free_on_stream"):
            m = pick(b, host=False)
            if m is None:
                return
            on = s if op == "free_on_stream" else None
            ran = expect(lambda: dev.free(m.ptr, stream=on))
            target = next((x for x in model.live() if not x.host and x.ptr == m.ptr), None)
            if target is None:
                if m.ptr in model.freed_ptrs:
                    model.findings.append(("double_free", m.ptr, ()))
                assert not ran, (step, op)
                model.host_node()
            else:
                if on is None:
                    node, actor, waited = model.host_node(), HOST, {target.stream} | target.uses
                else:
                    node, actor, waited = model.stream_node(on), on, {on}
                refused = model.free_hazard(target, node, actor, waited)
                assert ran == (not refused), (step, op)
                if not refused:
                    target.live = False
                    model.freed_ptrs.add(target.ptr)
        elif op == "free_host":
            m = pick(b, host=True, live_only=True)
            if m is None:
                return
            ran = expect(lambda: dev.free_host(m.ptr))
            refused = model.free_hazard(m, model.host_node(), HOST, set())
            assert ran == (not refused), (step, op)
            if not refused:
                m.live = False

    seen = 0
    for step, (op, a, b, c, d) in enumerate(program):
        before = len(dev.sanitizer_reports())
        do(step, op, a, b, c, d)
        got = [(f.kind, f.allocation, tuple(f.streams)) for f in dev.sanitizer_reports()[before:]]
        want, seen = model.findings[seen:], len(model.findings)
        assert got == want, f"step {step} {op}: device {got}, model {want}"
    dev.synchronize_device()
    if not model.findings:
        assert dev.stats()["lost_effects"] == 0, "a correct program lost a queued effect"
    for m in model.live():
        if m.host:
            dev.free_host(m.ptr)


@pytest.mark.parametrize("allocator", ["npumem", "pytorch", "direct"])
@given(program=OPS)
def test_findings_equal_the_happens_before_model(allocator, program):
    dev = npumem.Device("64MiB", allocator=allocator)
    run_program(dev, program, raise_mode=False)


@given(program=OPS)
def test_raise_mode_refuses_exactly_the_hazards(program):
    dev = npumem.Device("64MiB", sanitizer="raise")
    run_program(dev, program, raise_mode=True)
