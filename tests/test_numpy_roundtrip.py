"""Byte-exact numpy round trips through every page size (4 KiB, 64 KiB, 2 MiB, 1 GiB), across page
boundaries whose physical frames are not contiguous, plus device/host copies and threads."""

from __future__ import annotations

import ctypes

import hypothesis.extra.numpy as hnp
import numpy as np
import pytest
from conftest import GiB, KiB, MiB, raises_acl, run_in_threads
from hypothesis import given
from hypothesis import strategies as st

from npumem import Device, InvalidParamError, MemAttr, MemcpyKind, OutOfMemoryError, Policy

DTYPES = [
    np.uint8,
    np.int8,
    np.int16,
    np.uint16,
    np.int32,
    np.uint32,
    np.int64,
    np.uint64,
    np.float16,
    np.float32,
    np.float64,
    np.complex64,
    np.complex128,
    np.bool_,
    np.dtype(">i4"),
    np.dtype(">f8"),
    np.dtype("S5"),
    np.dtype("U3"),
    np.dtype([("a", "<i4"), ("b", "<f8"), ("c", "u1")]),
    np.dtype([("a", "<i2"), ("b", "<f4")], align=True),
]


def sample(shape, dtype, seed=0) -> np.ndarray:
    """Deterministic data of any dtype, with every byte pattern (NaN payloads included)."""
    dtype = np.dtype(dtype)
    n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = np.random.default_rng(seed).integers(0, 256, size=n, dtype=np.uint8)
    if dtype.kind == "b":
        raw &= 1
    if dtype.kind == "U":  # keep code points valid
        raw = raw.view("<u4") % 0x10FFFF if n else raw
        return np.ascontiguousarray(raw).view(dtype.newbyteorder("<")).astype(dtype).reshape(shape)
    return raw.view(dtype).reshape(shape)


def same_bytes(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and np.ascontiguousarray(a).tobytes() == b.tobytes()


# --------------------------------------------------------------------------------------------
# from_numpy / to_numpy
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(1,), (7,), (3, 5), (2, 3, 4), (1025,), (2, 1, 1, 3)], ids=str)
def test_round_trip_dtypes_and_shapes(dev, dtype, shape):
    a = sample(shape, dtype, seed=len(shape))
    p = dev.from_numpy(a)
    assert dev.allocation(p)["size"] == max(a.nbytes, 1)
    b = dev.to_numpy(p, shape, dtype)
    assert same_bytes(a, b)
    assert dev.read(p, a.nbytes) == a.tobytes()
    dev.free(p)


@pytest.mark.parametrize(
    "view",
    [
        lambda a: a[::2],
        lambda a: a[::-1],
        lambda a: a.T,
        lambda a: a[1:, ::3],
        lambda a: np.asfortranarray(a),
        lambda a: a[:, 5],
        lambda a: np.broadcast_to(a[0], (4, *a[0].shape)),
    ],
    ids=["step", "reversed", "transposed", "sliced", "fortran", "column", "broadcast"],
)
@pytest.mark.parametrize("dtype", [np.uint8, np.int16, np.float32, np.complex128, np.dtype(">i8")], ids=str)
def test_non_contiguous_inputs(dev, view, dtype):
    base = sample((20, 30), dtype, seed=3)
    x = view(base)
    expected = np.ascontiguousarray(x)
    p = dev.from_numpy(x)
    assert same_bytes(expected, dev.to_numpy(p, x.shape, dtype))
    q = dev.malloc(x.nbytes)
    dev.write(q, x)  # Device.write accepts any numpy layout
    assert dev.read(q, x.nbytes) == expected.tobytes()


def test_zero_dim_from_numpy(dev):
    # from_numpy makes its input at least 1-d, so a 0-d array goes in fine.
    p = dev.from_numpy(np.array(7.25, dtype=np.float64))
    assert dev.to_numpy(p, (1,), np.float64).tolist() == [7.25]


@pytest.mark.parametrize(
    "call",
    [
        lambda d, p: d.write(p, np.array(5, dtype=np.int32)),
        lambda d, p: d.write(p, np.float64(2.5)),
        lambda d, p: d.read_into(p, np.zeros((), dtype=np.int32)),
        lambda d, p: d.to_numpy(p, (), np.int32),
    ],
    ids=["write-0d-array", "write-numpy-scalar", "read_into-0d", "to_numpy-shape-()"],
)
def test_zero_dim_arrays(dev, call):
    p = dev.malloc(16)
    dev.write(p, np.arange(4, dtype=np.int32))
    call(dev, p)
    assert dev.to_numpy(p, (1,), np.int32).tolist() in ([0], [5])


@pytest.mark.parametrize("dtype", ["M8[ns]", "m8[s]"])
def test_datetime_round_trip(dev, dtype):
    a = np.arange(5).astype(dtype)
    p = dev.malloc(a.nbytes)
    dev.write(p, a.view(np.uint8))  # the bytes themselves are fine
    assert same_bytes(a, dev.to_numpy(p, a.shape, dtype))


def test_datetime_bytes_via_views(dev):
    a = np.arange(5).astype("M8[ns]")
    p = dev.from_numpy(a.view(np.int64))
    assert same_bytes(a, dev.to_numpy(p, a.shape, np.int64).view("M8[ns]"))
    before = dev.stats()["live_count"]
    q = dev.from_numpy(a)  # datetime64 moves as its bytes
    assert dev.stats()["live_count"] == before + 1
    assert same_bytes(a, dev.to_numpy(q, a.shape, "M8[ns]"))


def test_reinterpreting_reads(dev):
    a = np.arange(24, dtype=np.float32).reshape(4, 6)
    p = dev.from_numpy(a)
    assert same_bytes(a.view(np.uint8).reshape(-1), dev.to_numpy(p, a.nbytes))
    assert same_bytes(a.reshape(6, 4), dev.to_numpy(p, (6, 4), np.float32))
    assert same_bytes(a.view(np.int32)[1:3], dev.to_numpy(p + 24, (2, 6), np.int32))
    assert dev.to_numpy(p, 24, "f4").dtype == np.float32
    assert dev.to_numpy(p, (3,), np.dtype("<f8")).shape == (3,)


def test_empty_arrays(dev):
    e = np.empty((0, 5), dtype=np.float64)
    p = dev.from_numpy(e)
    assert dev.allocation(p)["size"] == 1
    out = dev.to_numpy(p, (0, 5), np.float64)
    assert out.shape == (0, 5) and out.dtype == np.float64
    assert dev.to_numpy(0, 0).shape == (0,)  # nothing to read: not even the pointer is checked


def test_from_numpy_policy_and_inputs(dev):
    a = sample((3 * MiB // 4,), np.float32)
    p = dev.from_numpy(a)  # HUGE_FIRST, over 1 MiB: 2 MiB pages
    assert dev.allocation(p)["page_size"] == 2 * MiB
    q = dev.from_numpy(a, Policy.NORMAL_ONLY)
    assert dev.allocation(q)["page_size"] == 4 * KiB
    assert dev.allocation(q)["policy"] == Policy.NORMAL_ONLY
    assert same_bytes(a, dev.to_numpy(p, a.shape, a.dtype))
    assert same_bytes(a, dev.to_numpy(q, a.shape, a.dtype))
    r = dev.from_numpy([[1, 2], [3, 4]])
    assert dev.to_numpy(r, (2, 2), np.asarray([1]).dtype).tolist() == [[1, 2], [3, 4]]


def test_read_into_writable_buffers(dev):
    a = sample((64,), np.int32)
    p = dev.from_numpy(a)
    out = np.zeros(64, dtype=np.int32)
    dev.read_into(p, out)
    assert same_bytes(a, out)
    part = np.zeros((8, 8), dtype=np.int32)
    dev.read_into(p, part[2:4])  # a contiguous slice of rows
    assert same_bytes(a[:16].reshape(2, 8), part[2:4])
    assert not part[:2].any() and not part[4:].any()
    frozen = np.zeros(4, dtype=np.int32)
    frozen.flags.writeable = False
    with raises_acl(InvalidParamError, 100000, match="read-only"):
        dev.read_into(p, frozen)
    with raises_acl(InvalidParamError, 100000, match="contiguous"):
        dev.read_into(p, np.zeros((4, 4), np.int32).T)


@given(
    arr=hnp.arrays(
        # 0-d arrays and datetime64/timedelta64 have their own tests.
        dtype=st.one_of(
            hnp.boolean_dtypes(),
            hnp.integer_dtypes(),
            hnp.unsigned_integer_dtypes(),
            hnp.floating_dtypes(),
            hnp.complex_number_dtypes(),
            hnp.byte_string_dtypes(max_len=4),
            hnp.unicode_string_dtypes(max_len=3),
        ),
        shape=hnp.array_shapes(min_dims=1, max_dims=3, min_side=0, max_side=9),
    ),
    offset=st.integers(0, 5000),
    policy=st.sampled_from([Policy.NORMAL_ONLY, Policy.HUGE_ONLY, Policy.HUGE_FIRST]),
)
def test_round_trip_property(arr, offset, policy):
    d = Device("16MiB", allocator="direct")
    p = d.malloc(offset + max(arr.nbytes, 1), policy)
    d.write(p + offset, arr)
    back = d.to_numpy(p + offset, arr.shape, arr.dtype)
    assert same_bytes(arr, back)
    q = d.from_numpy(arr)
    assert same_bytes(arr, d.to_numpy(q, arr.shape, arr.dtype))


# --------------------------------------------------------------------------------------------
# Page sizes, with page boundaries whose physical frames are not contiguous
# --------------------------------------------------------------------------------------------


def holey(d: Device, page: int, policy: Policy) -> int:
    """Fills ``d`` with one-page allocations, frees every other one, and returns an allocation of
    all the freed pages: consecutive pages of it lie in physically separate frames."""
    ptrs = []
    while True:
        try:
            ptrs.append(d.malloc_align32(page, policy))
        except OutOfMemoryError:
            break
    assert d.mem_info(MemAttr.HBM)[0] < page
    for p in ptrs[::2]:
        d.free(p)
    size = len(ptrs[::2]) * page
    p = d.malloc_align32(size, policy)
    assert d.allocation(p)["page_size"] == page
    for k in range(size // page - 1):
        here = d.translate(p + k * page)[0]
        there = d.translate(p + (k + 1) * page)[0]
        assert there != here + page, "pages should be physically discontiguous"
    return p


@pytest.mark.parametrize(
    ("capacity", "normal_page", "page", "policy"),
    [
        ("1MiB", "4KiB", 4 * KiB, Policy.NORMAL_ONLY),
        ("4MiB", "64KiB", 64 * KiB, Policy.NORMAL_ONLY),
        ("32MiB", "4KiB", 2 * MiB, Policy.HUGE_ONLY),
        ("32MiB", "64KiB", 2 * MiB, Policy.HUGE_ONLY_P2P),
    ],
    ids=["4KiB", "64KiB", "2MiB", "2MiB-over-64KiB-frames"],
)
@pytest.mark.parametrize(
    "dtype", [np.uint8, np.float32, np.complex128, np.dtype([("a", "<i2"), ("b", "<f8")])], ids=str
)
def test_data_across_discontiguous_pages(capacity, normal_page, page, policy, dtype):
    d = Device(capacity, normal_page=normal_page, allocator="direct")
    p = holey(d, page, policy)
    size = d.allocation(p)["size"]
    itemsize = np.dtype(dtype).itemsize
    # Whole-allocation round trip.
    whole = sample((size // itemsize,), dtype, seed=11)
    d.write(p, whole)
    assert same_bytes(whole, d.to_numpy(p, whole.shape, dtype))
    # Small arrays straddling each page boundary, at odd offsets.
    for k in range(1, size // page):
        for shift in (1, 3, itemsize * 5 + 1):
            at = k * page - shift
            n = min(2 * shift + 7, (size - at) // itemsize)
            piece = sample((n,), dtype, seed=k + shift)
            d.write(p + at, piece)
            assert same_bytes(piece, d.to_numpy(p + at, (n,), dtype))
            assert d.read(p + at, piece.nbytes) == piece.tobytes()


def test_64k_pages_hold_16_descriptors_of_data():
    d = Device("8MiB", normal_page="64KiB", allocator="direct")
    a = sample((300 * KiB // 8,), np.float64, seed=4)
    p = d.from_numpy(a, Policy.NORMAL_ONLY)
    assert d.allocation(p)["granted"] == 320 * KiB
    assert d.walk(p + 64 * KiB + 5)[1:] == (64 * KiB, 4)
    # Within a 64 KiB page the physical bytes are contiguous (16 contiguous 4 KiB descriptors).
    base = d.translate(p)[0]
    for off in (4095, 4096, 40000, 64 * KiB - 1):
        assert d.translate(p + off)[0] == base + off
    assert same_bytes(a, d.to_numpy(p, a.shape, a.dtype))


def test_giant_page_round_trips():
    d = Device("2GiB", giant_frames=1, allocator="direct")
    p = d.malloc(GiB, Policy.HUGE1G_ONLY)
    assert d.allocation(p)["page_size"] == GiB
    base = d.translate(p)[0]
    # Arrays straddling what would be 4 KiB, 64 KiB and 2 MiB page boundaries elsewhere.
    interesting = [0, 4 * KiB - 3, 64 * KiB - 5, 2 * MiB - 7, 64 * MiB - 1, 512 * MiB - 9, 768 * MiB + 3]
    arrays = {}
    for i, off in enumerate(interesting):
        dtype = [np.uint8, np.float32, np.int64, np.complex64][i % 4]
        a = sample((512 // np.dtype(dtype).itemsize + i,), dtype, seed=i)
        d.write(p + off, a)
        arrays[off] = a
        assert d.translate(p + off) == (base + off, GiB)
        assert d.walk(p + off)[2] == 2
    end = GiB - 1000
    tail = sample((1000,), np.uint8, seed=99)
    d.write(p + end, tail)
    arrays[end] = tail
    for off, a in arrays.items():
        assert same_bytes(a, d.to_numpy(p + off, a.shape, a.dtype)), hex(off)
    with raises_acl(InvalidParamError, 107000, match="past the end"):
        d.write(p + end, sample((1001,), np.uint8))
    # Device-to-device between the giant page and normal pages, both ways.
    q = d.malloc(3 * MiB, Policy.NORMAL_ONLY)
    d.memcpy(q, 3 * MiB, p + 2 * MiB - 7, 3 * MiB - 100)
    assert d.read(q, arrays[2 * MiB - 7].nbytes) == arrays[2 * MiB - 7].tobytes()
    d.memcpy(p + 900 * MiB, 10 * MiB, q, 3 * MiB - 100, MemcpyKind.DEVICE_TO_DEVICE)
    assert d.read(p + 900 * MiB, 3 * MiB - 100) == d.read(p + 2 * MiB - 7, 3 * MiB - 100)
    # And through a host buffer.
    h = d.malloc_host(4 * KiB)
    d.memcpy(h, 4 * KiB, p + 512 * MiB - 9, arrays[512 * MiB - 9].nbytes)
    assert ctypes.string_at(h, arrays[512 * MiB - 9].nbytes) == arrays[512 * MiB - 9].tobytes()
    d.free_host(h)
    d.free(q)
    d.free(p)
    assert d.page_table_stats()["mapped_bytes"] == 0


# --------------------------------------------------------------------------------------------
# Copies between device and host
# --------------------------------------------------------------------------------------------


def host_array(d: Device, shape, dtype) -> tuple[int, np.ndarray]:
    """A malloc_host buffer and a numpy array viewing it."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    h = d.malloc_host(nbytes)
    raw = (ctypes.c_uint8 * nbytes).from_address(h)
    return h, np.frombuffer(raw, dtype=dtype).reshape(shape)


@pytest.mark.parametrize("dtype", [np.uint8, np.int32, np.float64, np.complex64], ids=str)
@pytest.mark.parametrize("policy", [Policy.NORMAL_ONLY, Policy.HUGE_ONLY])
def test_host_device_memcpy_round_trip(dev, dtype, policy):
    shape = (300, 7)
    h1, view1 = host_array(dev, shape, dtype)
    h2, view2 = host_array(dev, shape, dtype)
    a = sample(shape, dtype, seed=21)
    view1[...] = a
    nbytes = a.nbytes
    p = dev.malloc(nbytes, policy)
    q = dev.malloc(nbytes, policy)
    dev.memcpy(p, nbytes, h1, nbytes, MemcpyKind.HOST_TO_DEVICE)
    assert same_bytes(a, dev.to_numpy(p, shape, dtype))
    dev.memcpy(q, nbytes, p, nbytes, MemcpyKind.DEVICE_TO_DEVICE)
    dev.memcpy(h2, nbytes, q, nbytes, MemcpyKind.DEVICE_TO_HOST)
    assert same_bytes(a, view2.copy())
    assert ctypes.string_at(h2, nbytes) == a.tobytes()
    # Host-to-host through npumem, then through numpy's view of the same memory.
    view1[...] = 0
    dev.memcpy(h1, nbytes, h2, nbytes, MemcpyKind.HOST_TO_HOST)
    assert same_bytes(a, view1.copy())
    assert dev.stats()["kind_mismatches"] == 0
    del view1, view2
    dev.free_host(h1)
    dev.free_host(h2)


def test_numpy_view_of_host_memory_sees_device_writes(dev):
    h, view = host_array(dev, (16,), np.int32)
    p = dev.from_numpy(np.arange(16, dtype=np.int32) * 3)
    dev.memcpy(h, 64, p, 64)
    assert view.tolist() == [3 * i for i in range(16)]
    dev.write(h, np.full(4, -1, dtype=np.int32))
    assert view[:5].tolist() == [-1, -1, -1, -1, 12]
    assert same_bytes(view.copy(), dev.to_numpy(h, (16,), np.int32))  # to_numpy reads host memory too
    del view
    dev.free_host(h)


# --------------------------------------------------------------------------------------------
# Threads: bulk transfers release the GIL; the device stays consistent
# --------------------------------------------------------------------------------------------


def test_concurrent_round_trips():
    d = Device("128MiB", allocator="direct")

    def worker(seed: int):
        for i in range(4):
            a = sample((MiB // 4 + seed * 1000 + i,), np.float32, seed=seed * 10 + i)
            p = d.from_numpy(a)
            for _ in range(2):
                b = d.to_numpy(p, a.shape, a.dtype)
                assert same_bytes(a, b)
            d.free(p)

    errors = run_in_threads(worker, 6)
    assert errors == []
    assert d.allocations() == []
    assert d.mem_info() == (128 * MiB, 128 * MiB)
    s = d.stats()
    assert s["mallocs"] == s["frees"] == 24
