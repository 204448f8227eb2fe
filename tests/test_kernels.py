"""The measurement kernels (npumem.kernels): results against numpy / plain Python on small
arrays, and every bad argument refused with a clear error before any access."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import npumem
from npumem import InvalidParamError
from npumem.kernels import chase, gemm_tiled


def walk(next_: np.ndarray, steps: int, start: int) -> int:
    at = start
    for _ in range(steps):
        at = int(next_[at])
    return at


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_chase_ends_where_a_python_walk_ends(data):
    n = data.draw(st.integers(1, 64))
    next_ = np.array(data.draw(st.lists(st.integers(0, n - 1), min_size=n, max_size=n)), dtype=np.uint64)
    steps = data.draw(st.integers(1, 300))
    start = data.draw(st.integers(0, n - 1))
    end, ns = chase(next_, steps, start)
    assert end == walk(next_, steps, start)
    assert ns >= 0.0


def test_chase_over_a_cycle_and_on_host_backend_memory():
    rng = np.random.default_rng(1)
    order = rng.permutation(1000).astype(np.uint64)
    next_ = np.empty(1000, np.uint64)
    next_[order] = np.roll(order, -1)
    assert chase(next_, 1000, int(order[0]))[0] == order[0]  # a full cycle comes back
    assert chase(next_, 3, int(order[0]))[0] == order[3]
    # The same array written into host-backend device memory and read back chases alike.
    dev = npumem.Device("64MiB", backend="host")
    ptr = dev.from_numpy(next_)
    copy = dev.to_numpy(ptr, 1000, np.uint64)
    assert chase(copy, 999, int(order[0]))[0] == order[999]
    dev.free(ptr)


@pytest.mark.parametrize("shape", [(1, 1, 1), (5, 7, 3), (64, 64, 64), (70, 33, 129)])
@pytest.mark.parametrize("tile", [1, 4, 64, 4096])
def test_gemm_tiled_matches_numpy(shape, tile):
    m, n, k = shape
    rng = np.random.default_rng(m * n * k + tile)
    a = rng.standard_normal((m, k), dtype=np.float32)
    b = rng.standard_normal((k, n), dtype=np.float32)
    c = rng.standard_normal((m, n), dtype=np.float32)
    want = c + a @ b
    ns = gemm_tiled(a, b, c, tile)
    assert ns >= 0.0
    np.testing.assert_allclose(c, want, rtol=1e-4, atol=1e-4)


def test_gemm_tiled_reads_a_and_b_only():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    b = np.ones((4, 2), np.float32)
    a0, b0 = a.copy(), b.copy()
    c = np.zeros((3, 2), np.float32)
    gemm_tiled(a, b, c, 2)
    gemm_tiled(a, b, c)
    assert (a == a0).all() and (b == b0).all()
    np.testing.assert_array_equal(c, 2 * (a @ b))


def test_bad_arguments_are_refused_before_any_access():
    ok = np.zeros(4, np.uint64)
    with pytest.raises(TypeError, match=r"next must be a C-contiguous 1-D numpy array of uint64, got list"):
        chase([0, 1], 1)
    with pytest.raises(TypeError, match=r"got a 1-D array of int64 with shape \[4\]"):
        chase(np.zeros(4, np.int64), 1)
    with pytest.raises(TypeError, match=r"got a 2-D array of uint64"):
        chase(np.zeros((2, 2), np.uint64), 1)
    with pytest.raises(InvalidParamError, match=r"next is not C-contiguous"):
        chase(np.zeros(8, np.uint64)[::2], 1)
    with pytest.raises(InvalidParamError, match=r"next is empty"):
        chase(np.zeros(0, np.uint64), 1)
    with pytest.raises(InvalidParamError, match=r"steps = 0 is out of range: accepted 1 to 2\*\*32"):
        chase(ok, 0)
    with pytest.raises(InvalidParamError, match=r"steps = 4294967297"):
        chase(ok, 2**32 + 1)
    with pytest.raises(OverflowError):
        chase(ok, -1)
    with pytest.raises(InvalidParamError, match=r"start = 4 is not an index of next \(length 4\)"):
        chase(ok, 1, 4)
    with pytest.raises(InvalidParamError, match=r"next\[2\] = 9 is not an index of next \(length 4\)"):
        chase(np.array([0, 1, 9, 0], np.uint64), 1)

    f = np.zeros((4, 4), np.float32)
    wrong_dtype = r"b must be a C-contiguous 2-D numpy array of float32, got a 2-D array of float64"
    with pytest.raises(TypeError, match=wrong_dtype):
        gemm_tiled(f, np.zeros((4, 4)), f.copy())
    with pytest.raises(TypeError, match=r"a must be .*, got tuple"):
        gemm_tiled((1,), f, f.copy())
    with pytest.raises(InvalidParamError, match=r"c is not C-contiguous"):
        gemm_tiled(f, f, np.zeros((4, 4), np.float32).T)
    with pytest.raises(InvalidParamError, match=r"shapes do not chain: a is \[4, 4\], b \[3, 4\], c \[4, 4\]"):
        gemm_tiled(f, np.zeros((3, 4), np.float32), f.copy())
    with pytest.raises(InvalidParamError, match=r"tile = 0 is out of range: accepted 1 to 4096"):
        gemm_tiled(f, f, f.copy(), 0)
    with pytest.raises(InvalidParamError, match=r"c must be writable and share no memory with a or b"):
        gemm_tiled(f, f, f)
    readonly = np.zeros((4, 4), np.float32)
    readonly.flags.writeable = False
    with pytest.raises(InvalidParamError, match=r"c must be writable"):
        gemm_tiled(f, f, readonly)
    # 8193**3 multiply-adds is past the bound (np.zeros maps lazily: no page of these is touched).
    big = np.zeros((8193, 8193), np.float32)
    with pytest.raises(InvalidParamError, match=r"a 8193 x 8193 x 8193 product is more than 2\*\*39"):
        gemm_tiled(big, big, np.zeros_like(big))
