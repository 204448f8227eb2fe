"""HostPool: real pooled host memory as numpy arrays and buffers, many threads, and NumPy's own
allocations through the NEP 49 handler."""

from __future__ import annotations

import doctest
import gc
import itertools
import threading

import numpy as np
import pytest
from conftest import GiB, KiB, MiB, run_in_threads
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

import npumem.hostpool
from npumem import InvalidParamError, OutOfMemoryError
from npumem.hostpool import HANDLER_NAME, HostPool


def addr(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


def test_module_docstring_example():
    assert doctest.testmod(npumem.hostpool).failed == 0


def test_arrays_are_correct_and_blocks_come_back():
    pool = HostPool("1GiB")
    z = pool.zeros((3, 5), dtype=np.int32)
    assert z.shape == (3, 5) and z.dtype == np.int32 and not z.any() and z.flags.writeable
    f = pool.full(7, 2.5)
    assert f.tolist() == [2.5] * 7 and f.dtype == np.float64
    fo = pool.empty((4, 6), dtype=np.float32, order="F")
    assert fo.flags.f_contiguous and fo.shape == (4, 6)
    fo[:] = np.arange(24, dtype=np.float32).reshape(4, 6)
    assert fo.sum() == sum(range(24))
    assert pool.zeros(0).shape == (0,) and pool.empty(()).shape == ()
    assert addr(pool.empty(1000)) % 64 == 0
    # A freed block's memory is handed to the next array of its size class.
    a = pool.empty((1024, 1024))
    where = addr(a)
    a[:] = 1
    del a
    gc.collect()
    b = pool.zeros((1024, 1024))
    assert addr(b) == where and not b.any(), "reused and cleared"
    # A view keeps the block alive after the array is gone.
    c = pool.empty(100)
    view = c[10:20]
    where = addr(c)
    del c
    gc.collect()
    assert addr(pool.empty(100)) != where
    view[:] = 3
    assert view.sum() == 30
    m = pool.buffer(4096)
    assert len(m) == 4096 and not m.readonly
    m[:4] = b"abcd"
    assert bytes(m[:4]) == b"abcd"


def test_bad_input_raises_clear_errors():
    with pytest.raises(InvalidParamError, match="huge_pages"):
        HostPool("1GiB", huge_pages="sometimes")
    with pytest.raises(InvalidParamError, match="capacity"):
        HostPool(0)
    with pytest.raises(InvalidParamError, match="capacity"):
        HostPool("1TiB")
    pool = HostPool("64MiB")
    with pytest.raises(InvalidParamError, match="objects"):
        pool.empty(3, dtype=object)
    with pytest.raises(InvalidParamError, match="order"):
        pool.empty(3, order="K")
    with pytest.raises(InvalidParamError, match="not a NumPy dtype"):
        pool.zeros(3, dtype="bogus")
    with pytest.raises(InvalidParamError, match="shape"):
        pool.empty((2, -1))
    with pytest.raises(OutOfMemoryError, match="capacity"):
        pool.empty(128 * MiB, dtype=np.uint8)
    blocks = [pool.buffer(8 * MiB) for _ in range(7)]
    with pytest.raises(OutOfMemoryError, match="exhausted"):
        blocks.extend(pool.buffer(8 * MiB) for _ in range(2))
    del blocks
    gc.collect()
    pool.buffer(8 * MiB)  # freed blocks are reusable after an OOM


def test_giant_pages_fail_clearly_without_reserved_hugepages():
    try:
        pool = HostPool("1GiB", huge_pages="1g")
    except OutOfMemoryError as e:
        assert "nr_hugepages" in str(e)
    else:  # the machine has 1 GiB pages reserved: they serve arrays
        assert pool.huge_pages == "1g" and pool.zeros(1 << 20).sum() == 0


def test_many_threads_never_overlap_checked_through_a_shared_bitmap():
    pool = HostPool("2GiB")
    base = pool.stats()["base"]
    owner = np.zeros((2 * GiB) // 64, dtype=np.int8)  # one slot per 64-byte unit
    lock = threading.Lock()
    sizes = [64, 200, 4 * KiB, 70 * KiB, 1 * MiB]

    def worker(t: int) -> None:
        rng = np.random.default_rng(t)
        live = []
        for step in range(3000):
            if live and rng.random() < 0.45:
                buf, lo, hi = live.pop(int(rng.integers(len(live))))
                assert buf[0] == t + 1, "someone else wrote into my block"
                with lock:
                    owner[lo:hi] = 0
                del buf
                continue
            n = int(sizes[int(rng.integers(len(sizes)))])
            buf = np.frombuffer(pool.buffer(n), dtype=np.uint8)
            lo = (addr(buf) - base) // 64
            hi = lo + (n + 63) // 64
            with lock:
                assert not owner[lo:hi].any(), f"block at {addr(buf):#x} overlaps a live one"
                owner[lo:hi] = t + 1
            buf[0] = t + 1
            live.append((buf, lo, hi))
            if step % 500 == 0:
                gc.collect()
        # What is still live is freed when the worker returns: release its slots first.
        with lock:
            for _, lo, hi in live:
                owner[lo:hi] = 0
        live.clear()

    assert run_in_threads(worker, 4) == []


def test_numpy_allocations_go_to_the_pool_inside_the_context():
    pool = HostPool("2GiB")
    assert HostPool.handler_of() != HANDLER_NAME
    x = np.linspace(0, 1, 100_000)

    def numpy_ops() -> dict[str, np.ndarray]:
        return {
            "ufunc": np.sin(x) * 2 + 1,
            "arange": np.arange(12, dtype=np.int64).reshape(3, 4).T.copy(),
            "concat": np.concatenate([x, x[::-1]]),
            "matmul": np.ones((64, 32)) @ np.ones((32, 16)),
            "zeros": np.zeros((100, 100)),
            "sort": np.sort(x[::-1]),
        }

    expected = numpy_ops()
    with pool.numpy_allocator():
        assert HostPool.handler_of() == HANDLER_NAME
        got = numpy_ops()
        grown = np.zeros(10)
        grown[:] = 7
        grown.resize(1_000_000, refcheck=False)  # realloc through the handler
    assert HostPool.handler_of() != HANDLER_NAME
    for k, v in got.items():
        assert HostPool.handler_of(v) == HANDLER_NAME, k
        np.testing.assert_array_equal(v, expected[k], err_msg=k)
    assert grown[:10].tolist() == [7.0] * 10 and grown.shape == (1_000_000,) and not grown[10:].any()
    assert HostPool.handler_of(np.ones(3)) != HANDLER_NAME
    # Freed arrays return to the pool: the next same-size array reuses the memory.
    where = addr(got["concat"])
    del got, grown
    gc.collect()
    with pool.numpy_allocator():
        again = np.empty(200_000)
    assert addr(again) == where


def test_the_handler_is_per_thread_context():
    pool = HostPool("256MiB")
    seen = {}

    def other(_: int) -> None:
        seen["other"] = HostPool.handler_of()

    with pool.numpy_allocator():
        assert run_in_threads(other, 1) == []
        assert HostPool.handler_of() == HANDLER_NAME
    assert seen["other"] != HANDLER_NAME


def test_trim_gives_pages_back_and_stats_count():
    pool = HostPool("1GiB")
    a = pool.empty(32 * MiB, dtype=np.uint8)
    a[:] = 1
    del a
    gc.collect()
    s = pool.stats()
    assert s["carved"] >= 32 * MiB and s["carves"] >= 1 and s["huge_pages"] == "transparent"
    released = pool.trim()
    assert released >= 32 * MiB - 4 * KiB
    assert pool.stats()["trimmed"] == released
    b = pool.empty(32 * MiB, dtype=np.uint8)
    assert b[4096:].max() == 0, "trimmed pages read as zero"


class HostPoolMachine(RuleBasedStateMachine):
    """Random allocations, writes and frees; every live block keeps its own pattern."""

    @initialize()
    def setup(self) -> None:
        self.pool = HostPool("512MiB")
        self.live: dict[int, tuple[np.ndarray, int]] = {}
        self.next = 1

    @rule(size=st.sampled_from([1, 63, 64, 65, 1000, 4096, 40_000, 300_000, 2 * MiB + 1]), zero=st.booleans())
    def alloc(self, size: int, zero: bool) -> None:
        a = self.pool.zeros(size, dtype=np.uint8) if zero else self.pool.empty(size, dtype=np.uint8)
        if zero:
            assert not a.any()
        tag = self.next % 251 + 1
        self.next += 1
        a[:] = tag
        self.live[self.next] = (a, tag)

    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        if self.live:
            key = data.draw(st.sampled_from(sorted(self.live)))
            del self.live[key]

    @rule()
    def collect(self) -> None:
        # The youngest generation holds what the steps just dropped; a full collection would
        # walk the whole test process's heap (seconds a step once torch and the rest are loaded).
        gc.collect(0)

    @invariant()
    def blocks_keep_their_patterns_and_never_overlap(self) -> None:
        spans = []
        for a, tag in self.live.values():
            assert (a == tag).all()
            spans.append((addr(a), addr(a) + a.nbytes))
        spans.sort()
        for (_, end), (start, _) in itertools.pairwise(spans):
            assert end <= start


HostPoolMachine.TestCase.settings = settings(max_examples=30, stateful_step_count=40, deadline=None)
TestHostPoolMachine = HostPoolMachine.TestCase


def test_pool_arrays_own_their_data_and_views_pin_it():
    pool = HostPool("256MiB")
    a = pool.empty(1000, np.uint8)
    # Built as NumPy builds its own arrays: the pool's handler owns the data, no object between.
    assert a.flags.owndata and a.base is None and HostPool.handler_of(a) == HANDLER_NAME
    where = addr(a)
    a[:] = 9
    view, mem = a[100:200], memoryview(a)
    del a
    gc.collect()
    assert addr(pool.empty(1000, np.uint8)) != where, "the views still hold the block"
    assert view.sum() == 900 and bytes(mem[:2]) == b"\t\t"
    del view, mem
    gc.collect()
    assert addr(pool.empty(1000, np.uint8)) == where, "the last view gone, the block is back"
    g = pool.zeros(10)
    g.resize(100_000, refcheck=False)  # a realloc through the pool's handler
    assert g.shape == (100_000,) and not g.any() and HostPool.handler_of(g) == HANDLER_NAME
    # The handler holds the pool: its arrays outlive the HostPool object.
    del pool
    gc.collect()
    g[:] = 5
    assert g.sum() == 500_000


@pytest.mark.parametrize("nbytes", [64, 4 * KiB, 300 * KiB, 600 * KiB, 8 * MiB + 123])
def test_zeros_read_zero_on_every_reuse_used_or_not(nbytes: int):
    # Large blocks are cleared by dropping unused pages or writing used ones (and, every few
    # used ones, dropping them to look again): every path, on the same block, reads zero.
    pool = HostPool("256MiB")
    for round in range(20):
        for make in (lambda: pool.zeros(nbytes, np.uint8), lambda: np.zeros(nbytes, np.uint8)):
            with pool.numpy_allocator():
                z = make()
            assert HostPool.handler_of(z) == HANDLER_NAME
            assert not z.any(), f"round {round}: {np.count_nonzero(z)} nonzero bytes"
            if round % 4 != 3:  # used: every page written, and the last byte
                z[::4096] = 0xA5
                z[-1] = 0x5A
            del z


def test_small_arrays_reuse_the_last_block_freed_and_read_zero():
    """Arrays up to 1 KiB take the block their class freed last (the handler's stash): zeros
    from it read zero, and a block of another class never serves them."""
    pool = HostPool("256MiB")
    with pool.numpy_allocator():
        for n in (1, 64, 100, 256, 257, 1000, 1024):
            a = np.empty(n, np.uint8)
            a[:] = 0xAB
            where = addr(a)
            del a
            z = np.zeros(n, np.uint8)
            assert addr(z) == where and not z.any(), n
            del z
            b = pool.zeros(n, np.uint8)  # the pool's own arrays share the stash
            assert addr(b) == where and not b.any(), n
            b[:] = 1
            del b
        # A block of another class (a 64-byte one) is not handed to a 1000-byte array.
        small = np.empty(64, np.uint8)
        big = np.empty(1000, np.uint8)
        del small
        big2 = np.zeros(1000, np.uint8)
        assert addr(big2) != addr(big) and not big2.any()
        # Grown by realloc past its class: the data moves, the old block is stashed for reuse.
        g = np.arange(100, dtype=np.uint8)
        g.resize(900, refcheck=False)
        assert g[:100].tolist() == list(range(100)) and not g[100:].any()


def test_small_arrays_on_many_threads_never_share_a_block():
    pool = HostPool("256MiB")

    def work(i: int) -> None:
        with pool.numpy_allocator():
            live = []
            for k in range(3000):
                n = 16 + (k * 37 + i) % 1000
                a = np.zeros(n, np.uint8)
                assert not a.any()
                a[:] = i + 1
                live.append(a)
                if len(live) > 3:
                    old = live.pop(k % 3)
                    assert (old == old[0]).all() and old[0] == i + 1, "another thread wrote into the block"

    assert run_in_threads(work, 4) == []


def test_fast_and_general_calls_of_empty_and_zeros_agree():
    # `empty(n)` / `empty(n, dtype)` are served by a C-API method; keywords, tuples and odd
    # values by PyO3's. Both give the same arrays and the same errors.
    pool = HostPool("64MiB")
    for make in (pool.empty, pool.zeros):
        for fast, general in (
            (lambda m=make: m(10), lambda m=make: m((10,))),
            (lambda m=make: m(6, np.float32), lambda m=make: m(6, dtype=np.float32)),
            (lambda m=make: m(6, "i2"), lambda m=make: m((6,), "i2", "C")),
            (lambda m=make: m(0, None), lambda m=make: m(shape=0)),
        ):
            a, b = fast(), general()
            assert (a.shape, a.dtype, a.flags.owndata) == (b.shape, b.dtype, b.flags.owndata)
        for bad in ((-1,), (10, object), (10, "no such dtype"), (2**63,)):
            with pytest.raises(InvalidParamError) as fast_error:
                make(*bad)
            with pytest.raises(InvalidParamError) as general_error:
                make(*bad[:1], **({"dtype": bad[1]} if len(bad) > 1 else {}))
            assert str(fast_error.value) == str(general_error.value)
