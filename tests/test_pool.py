"""The allocator layer: the PyTorch / torch_npu caching rules, the npumem VMM pool, PyTorch's
memory_stats scheme, fragmentation diagnostics, alloc_conf parsing, and the invariants every
allocator keeps (no overlap, data integrity, stats equal to a recount, everything returns)."""

from __future__ import annotations

import pytest
from conftest import BOTH_BACKENDS, GiB, KiB, MiB, align_up, booked, held_memory, raises_acl
from hypothesis import event, given
from hypothesis import strategies as st

from npumem import Device, InvalidParamError, OutOfMemoryError, Policy, UnsupportedError

pytestmark = BOTH_BACKENDS

ALLOCATORS = ("npumem", "direct", "pytorch", "torch_npu")
CACHING = ("pytorch", "torch_npu")
#: Page of the npumem large pool (one 2 MiB frame).
LARGE_PAGE = 2 * MiB
#: Page of the npumem small pool (requests of at most 1 MiB), backed by normal frames.
SMALL_PAGE = 64 * KiB

ARRAYS = (
    "allocation",
    "segment",
    "active",
    "inactive_split",
    "allocated_bytes",
    "reserved_bytes",
    "active_bytes",
    "inactive_split_bytes",
    "requested_bytes",
)
POOLS = ("all", "small_pool", "large_pool")
FIELDS = ("current", "peak", "allocated", "freed")
SCALARS = (
    "num_alloc_retries",
    "num_ooms",
    "num_sync_all_streams",
    "num_device_alloc",
    "num_device_free",
    "num_cache_misses",
    "max_split_size",
)
STAT_KEYS = (
    {f"{a}.{p}.{f}" for a in ARRAYS for p in POOLS for f in FIELDS}
    | {f"{s}.{f}" for s in ("oversize_allocations", "oversize_segments") for f in FIELDS}
    | set(SCALARS)
)


def granted(d: Device, ptr: int) -> int:
    return d.allocation(ptr)["granted"]


def grant_of(d: Device, size: int) -> int:
    """Granted bytes of one malloc(size) on d (freed again at once)."""
    p = d.malloc(size)
    g = granted(d, p)
    d.free(p)
    return g


def pattern(tag: int, n: int) -> bytes:
    return bytes((tag * 131 + i * 7 + 1) % 251 for i in range(n))


def check_stats_consistent(d: Device) -> dict:
    """The memory_stats identities that hold for every allocator at every moment."""
    s = d.memory_stats()
    assert set(s) == STAT_KEYS
    for a in ARRAYS:
        for f in ("current", "allocated", "freed"):
            assert s[f"{a}.all.{f}"] == s[f"{a}.small_pool.{f}"] + s[f"{a}.large_pool.{f}"], (a, f)
        # Peaks are reached at different times: the total's is bounded by the pools'.
        small, large = s[f"{a}.small_pool.peak"], s[f"{a}.large_pool.peak"]
        assert max(small, large) <= s[f"{a}.all.peak"] <= small + large, a
        for p in POOLS:
            k = f"{a}.{p}"
            assert s[f"{k}.current"] == s[f"{k}.allocated"] - s[f"{k}.freed"], k
            assert s[f"{k}.peak"] >= s[f"{k}.current"] >= 0, k
    for k in ("oversize_allocations", "oversize_segments"):
        assert s[f"{k}.current"] == s[f"{k}.allocated"] - s[f"{k}.freed"]
        assert s[f"{k}.peak"] >= s[f"{k}.current"] >= 0
    assert s["allocated_bytes.all.current"] == d.memory_allocated()
    assert s["allocated_bytes.all.peak"] == d.max_memory_allocated()
    assert s["reserved_bytes.all.current"] == d.memory_reserved()
    assert s["reserved_bytes.all.peak"] == d.max_memory_reserved()
    assert s["num_device_alloc"] - s["num_device_free"] >= 0
    return s


def check_recount(d: Device, live: dict[int, int]) -> None:
    """Stats and diagnostics equal a recount of the live allocations ``{ptr: requested}``."""
    s = check_stats_consistent(d)
    allocs = d.allocations()
    assert {a["ptr"]: a["size"] for a in allocs} == live
    total_granted = sum(a["granted"] for a in allocs)
    assert s["allocated_bytes.all.current"] == total_granted
    assert s["active_bytes.all.current"] == total_granted
    assert s["requested_bytes.all.current"] == sum(live.values())
    assert s["allocation.all.current"] == s["active.all.current"] == len(live)
    assert s["reserved_bytes.all.current"] >= total_granted
    # What the allocator reserves is exactly what the device has handed out.
    free, total = d.mem_info()
    assert s["reserved_bytes.all.current"] == total - free
    f = d.fragmentation()
    assert (f["requested"], f["allocated"], f["reserved"]) == (
        sum(live.values()),
        total_granted,
        s["reserved_bytes.all.current"],
    )
    assert f["internal_waste"] == f["allocated"] - f["requested"]
    assert f["reserved_unallocated"] == f["reserved"] - f["allocated"]
    assert 0 <= f["largest_free_extent"] <= f["free"] <= f["reserved_unallocated"]
    assert sum(b[2] for b in f["free_by_bucket"]) == f["free"]
    assert 0.0 <= f["external"] <= 1.0
    if f["free"]:
        assert f["external"] == pytest.approx(1 - f["largest_free_extent"] / f["free"])
    assert sum(seg["allocated"] for seg in f["segments"]) == total_granted
    if d.allocator in CACHING:
        assert f["free"] == f["reserved_unallocated"]
        assert sum(seg["size"] for seg in f["segments"]) == f["reserved"]
        assert s["segment.all.current"] == len(f["segments"])
    if d.allocator == "direct":
        assert s["reserved_bytes.all.current"] == total_granted and f["free"] == 0
    if d.allocator == "npumem":
        # Mapped pool pages and bypass mappings; cached (unmapped) pages are reserved but not shown.
        assert sum(seg["size"] for seg in f["segments"]) <= f["reserved"]
    # Every surface counts the same segments (for the npumem pool: runs of mapped pages).
    assert s["segment.all.current"] == len(f["segments"]) == len(d.memory_snapshot()["segments"])


# --------------------------------------------------------------------------------------------
# Construction and alloc_conf
# --------------------------------------------------------------------------------------------


def test_default_allocator_is_npumem():
    d = Device("64MiB")
    assert d.allocator == "npumem"
    assert d.alloc_conf == ""
    assert 'allocator="npumem"' in repr(d)


@pytest.mark.parametrize("allocator", ALLOCATORS)
def test_allocator_names(allocator):
    d = Device("64MiB", allocator=allocator)
    assert d.allocator == allocator
    assert f'allocator="{allocator}"' in repr(d)


@pytest.mark.parametrize("name", ["", "PyTorch", "cuda", "caching", "torch-npu", "npumem "])
def test_unknown_allocator(name):
    with raises_acl(InvalidParamError, 100000, match="allocator"):
        Device("64MiB", allocator=name)


@pytest.mark.parametrize(
    ("allocator", "conf"),
    [
        ("pytorch", ""),
        ("pytorch", "max_split_size_mb:21"),
        ("pytorch", " max_split_size_mb : 128 , garbage_collection_threshold : 0.6 "),
        ("pytorch", "max_non_split_rounding_mb:40,large_segment_size_mb:32"),
        ("pytorch", "segment_size_mb:64"),
        ("pytorch", "roundup_power2_divisions:4"),
        ("pytorch", "roundup_power2_divisions:[256:1,512:2,1024:4,>:8],max_split_size_mb:512"),
        ("pytorch", "per_process_memory_fraction:0.1"),
        ("pytorch", "per_process_memory_fraction:1"),
        ("pytorch", "expandable_segments:False"),
        ("pytorch", "max_split_size_mb:128,"),
        ("torch_npu", "page_size:1g"),
        ("torch_npu", "page_size:1G,max_split_size_mb:256"),
        ("torch_npu", "garbage_collection_threshold:0.99,per_process_memory_fraction:0.5"),
        ("npumem", ""),
        ("npumem", "per_process_memory_fraction:0.5"),
        ("npumem", "garbage_collection_threshold:0.8,large_threshold_mb:64"),
        ("npumem", "expandable_segments:True"),
        ("npumem", "large_threshold_mb:2"),
        ("direct", ""),
    ],
)
def test_alloc_conf_accepted(allocator, conf):
    d = Device("64MiB", allocator=allocator, alloc_conf=conf)
    assert d.alloc_conf == conf
    p = d.malloc(1000)
    d.free(p)
    if conf:
        assert f"alloc_conf={conf!r}".replace("'", '"') in repr(d)


@pytest.mark.parametrize("allocator", CACHING)
@pytest.mark.parametrize(
    "conf",
    [
        "nonsense:1",
        "max_split_size_mb",
        "max_split_size_mb:",
        "max_split_size_mb:20",
        "max_split_size_mb:10",
        "max_split_size_mb:-64",
        "max_split_size_mb:abc",
        "max_split_size_mb:nan",
        "max_split_size_mb:inf",
        "max_split_size_mb:[128]",
        "max_split_size_mb:128:256",
        "max_split_size_mb:128 garbage_collection_threshold:0.5",
        "garbage_collection_threshold:0",
        "garbage_collection_threshold:1",
        "garbage_collection_threshold:1.5",
        "per_process_memory_fraction:1.01",
        "per_process_memory_fraction:-0.5",
        "large_segment_size_mb:10",
        "large_segment_size_mb:5",
        "roundup_power2_divisions:3",
        "roundup_power2_divisions:abc",
        "roundup_power2_divisions:[256:3]",
        "roundup_power2_divisions:[300:2]",
        "roundup_power2_divisions:[256:1",
        "roundup_power2_divisions:[256-1]",
        "roundup_power2_divisions:[256:1]x",
        "expandable_segments:maybe",
        "expandable_segments:1",
        "page_size:2m",
        "large_threshold_mb:64",
        "Max_Split_Size_MB:128",
    ],
)
def test_alloc_conf_rejected(allocator, conf):
    with raises_acl(InvalidParamError, 100000):
        Device("64MiB", allocator=allocator, alloc_conf=conf)


@pytest.mark.parametrize(
    "conf",
    [
        "max_split_size_mb:128",
        "roundup_power2_divisions:4",
        "page_size:1g",
        "expandable_segments:False",
        "expandable_segments:maybe",
        "per_process_memory_fraction:1.5",
        "garbage_collection_threshold:0",
        "garbage_collection_threshold:1",
        "large_threshold_mb:1",
        "large_threshold_mb:abc",
        "bogus:1",
        "per_process_memory_fraction",
        "per_process_memory_fraction:0.5:1",
    ],
)
def test_npumem_alloc_conf_rejected(conf):
    with raises_acl(InvalidParamError, 100000):
        Device("64MiB", alloc_conf=conf)


def test_page_size_is_a_torch_npu_key():
    with raises_acl(InvalidParamError, 100000, match="page_size"):
        Device("64MiB", allocator="pytorch", alloc_conf="page_size:1g")


def test_unknown_key_error_lists_the_known_keys():
    with raises_acl(InvalidParamError, 100000) as info:
        Device("64MiB", allocator="torch_npu", alloc_conf="max_spilt_size_mb:128")
    message = info.value.message
    for key in ("max_split_size_mb", "garbage_collection_threshold", "roundup_power2_divisions", "page_size"):
        assert key in message


@pytest.mark.parametrize("allocator", CACHING)
@pytest.mark.parametrize("conf", ["expandable_segments:True", "max_split_size_mb:128,expandable_segments:true"])
def test_expandable_segments_is_unsupported_for_the_caching_families(allocator, conf):
    with raises_acl(UnsupportedError, 200006, match="expandable_segments"):
        Device("64MiB", allocator=allocator, alloc_conf=conf)


@pytest.mark.parametrize("conf", ["max_split_size_mb:128", "expandable_segments:True", "x"])
def test_direct_allocator_takes_no_alloc_conf(conf):
    with raises_acl(InvalidParamError, 100000, match="direct"):
        Device("64MiB", allocator="direct", alloc_conf=conf)


def test_blank_alloc_conf_is_fine_for_direct():
    assert Device("64MiB", allocator="direct", alloc_conf="  ").allocator == "direct"


@pytest.mark.parametrize(
    ("allocator", "conf", "value"),
    [
        ("pytorch", "", -1),
        ("torch_npu", "", -1),
        ("npumem", "", -1),
        ("direct", "", -1),
        ("pytorch", "max_split_size_mb:64", 64 * MiB),
        ("torch_npu", "max_split_size_mb:300", 300 * MiB),
    ],
)
def test_max_split_size_stat(allocator, conf, value):
    assert Device("64MiB", allocator=allocator, alloc_conf=conf).memory_stats()["max_split_size"] == value


# --------------------------------------------------------------------------------------------
# memory_stats, accessors, summary, fragmentation
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("allocator", ALLOCATORS)
def test_fresh_memory_stats(allocator):
    d = Device("64MiB", allocator=allocator)
    s = d.memory_stats()
    assert set(s) == STAT_KEYS
    assert len(s) == 123
    assert all(type(v) is int for v in s.values())
    assert {k: v for k, v in s.items() if v != 0} == {"max_split_size": -1}
    assert (d.memory_allocated(), d.max_memory_allocated(), d.memory_reserved(), d.max_memory_reserved()) == (0,) * 4
    f = d.fragmentation()
    assert set(f) == {
        "requested",
        "allocated",
        "reserved",
        "internal_waste",
        "reserved_unallocated",
        "free",
        "largest_free_extent",
        "external",
        "free_by_bucket",
        "segments",
        "summary",
    }
    assert f["segments"] == [] and f["free_by_bucket"] == [] and f["external"] == 0.0
    assert "largest free extent" in f["summary"]


@pytest.mark.parametrize("allocator", ALLOCATORS)
def test_stats_track_a_malloc_free_cycle(allocator):
    d = Device("256MiB", allocator=allocator)
    small = d.malloc(1000)
    large = d.malloc(3 * MiB)
    g_small, g_large = granted(d, small), granted(d, large)
    s = check_stats_consistent(d)
    assert s["allocation.all.current"] == 2
    assert s["allocation.small_pool.current"] == 1 and s["allocation.large_pool.current"] == 1
    assert s["allocated_bytes.small_pool.current"] == g_small
    assert s["allocated_bytes.large_pool.current"] == g_large
    assert s["requested_bytes.all.current"] == 1000 + 3 * MiB
    assert s["requested_bytes.small_pool.current"] == 1000
    d.free(small)
    s = check_stats_consistent(d)
    assert s["allocation.all.current"] == 1
    assert s["allocation.all.allocated"] == 2 and s["allocation.all.freed"] == 1
    assert s["allocated_bytes.all.peak"] == g_small + g_large
    assert s["allocated_bytes.all.freed"] == g_small
    assert s["requested_bytes.all.current"] == 3 * MiB
    d.free(large)
    s = check_stats_consistent(d)
    assert s["allocated_bytes.all.current"] == 0 and s["requested_bytes.all.current"] == 0
    assert s["allocation.all.freed"] == 2
    assert d.max_memory_allocated() == g_small + g_large


@pytest.mark.parametrize("allocator", ALLOCATORS)
def test_reset_peak_memory_stats(allocator):
    d = Device("256MiB", allocator=allocator)
    a = d.malloc(12 * MiB)
    b = d.malloc(3 * MiB)
    peak = d.max_memory_allocated()
    peak_reserved = d.max_memory_reserved()
    d.free(a)
    assert d.max_memory_allocated() == peak
    d.reset_peak_memory_stats()
    s = d.memory_stats()
    assert d.max_memory_allocated() == d.memory_allocated() == granted(d, b)
    assert d.max_memory_reserved() == d.memory_reserved() <= peak_reserved
    for a_ in ARRAYS:
        for p in POOLS:
            assert s[f"{a_}.{p}.peak"] == s[f"{a_}.{p}.current"]
    # Accumulated counters are not reset.
    assert s["allocation.all.allocated"] == 2 and s["allocation.all.freed"] == 1
    d.free(b)


@pytest.mark.parametrize("allocator", ALLOCATORS)
def test_memory_summary(allocator):
    d = Device("256MiB", allocator=allocator)
    p = d.malloc(5 * MiB)
    text = d.memory_summary()
    assert isinstance(text, str)
    assert text.startswith("npumem memory summary")
    assert f'allocator="{allocator}"' in text
    for label in ("allocated memory", "reserved memory", "requested memory", "from large pool", "allocations"):
        assert label in text
    assert d.fragmentation()["summary"] in text
    d.free(p)


@pytest.mark.parametrize("allocator", CACHING)
def test_fragmentation_of_a_caching_allocator_is_exact(allocator):
    d = Device("256MiB", allocator=allocator)
    a = d.malloc(3 * MiB)  # carves a 20 MiB segment
    b = d.malloc(16 * MiB + 512 * KiB)  # served whole from the 17 MiB remainder: 512 KiB waste
    ga, gb = granted(d, a), granted(d, b)
    assert b == a + ga
    assert ga + gb == 20 * MiB
    f = d.fragmentation()
    assert f["reserved"] == 20 * MiB and f["free"] == 0 and f["reserved_unallocated"] == 0
    assert f["internal_waste"] == 20 * MiB - 3 * MiB - (16 * MiB + 512 * KiB)
    assert f["segments"] == [{"address": a, "size": 20 * MiB, "allocated": 20 * MiB, "blocks": 2, "free_blocks": 0}]
    d.free(a)
    f = d.fragmentation()
    assert f["free"] == ga and f["largest_free_extent"] == ga
    assert f["free_by_bucket"] == [(4 * MiB, 1, ga)]
    assert f["segments"][0]["free_blocks"] == 1
    s = d.memory_stats()
    assert s["inactive_split.all.current"] == 1 and s["inactive_split_bytes.all.current"] == ga
    d.free(b)
    assert d.memory_stats()["inactive_split_bytes.all.current"] == 0


# --------------------------------------------------------------------------------------------
# PyTorch / torch_npu rules
# --------------------------------------------------------------------------------------------

PYTORCH_ROUNDING = [
    (1, 512),
    (511, 512),
    (512, 512),
    (513, 1024),
    (1000, 1024),
    (4096, 4096),
    (MiB - 1, MiB),
    (MiB, MiB),
    (MiB + 1, MiB + 512),
    (3 * MiB, 3 * MiB),
    (12 * MiB + 1, 12 * MiB + 512),
]
TORCH_NPU_ROUNDING = [
    (1, 512),
    (480, 512),
    (481, 1024),
    (512, 1024),
    (992, 1024),
    (993, 1536),
    (MiB - 32, MiB),
    (MiB - 31, MiB + 512),
    (3 * MiB, 3 * MiB + 512),
    (12 * MiB + 1, 12 * MiB + 512),
]


@pytest.mark.parametrize(
    ("allocator", "size", "expected"),
    [("pytorch", s, g) for s, g in PYTORCH_ROUNDING] + [("torch_npu", s, g) for s, g in TORCH_NPU_ROUNDING],
)
def test_round_size(allocator, size, expected):
    d = Device("256MiB", allocator=allocator)
    p = d.malloc(size)
    assert granted(d, p) == expected
    assert d.memory_stats()["requested_bytes.all.current"] == size


@pytest.mark.huge_pages
@pytest.mark.parametrize(
    ("allocator", "size", "pool", "reserved"),
    [
        ("pytorch", 1, "small_pool", 2 * MiB),
        ("pytorch", MiB, "small_pool", 2 * MiB),
        ("pytorch", MiB + 1, "large_pool", 20 * MiB),
        ("pytorch", 3 * MiB, "large_pool", 20 * MiB),
        ("pytorch", 10 * MiB - 512, "large_pool", 20 * MiB),
        ("pytorch", 10 * MiB - 511, "large_pool", 10 * MiB),
        ("pytorch", 10 * MiB, "large_pool", 10 * MiB),
        ("pytorch", 12 * MiB + 1, "large_pool", 14 * MiB),
        ("pytorch", 17 * MiB + 512, "large_pool", 18 * MiB),
        ("pytorch", 40 * MiB, "large_pool", 40 * MiB),
        ("torch_npu", MiB - 32, "small_pool", 2 * MiB),
        # The 32-byte pad pushes a 1 MiB request into the large pool.
        ("torch_npu", MiB, "large_pool", 20 * MiB),
        ("torch_npu", 10 * MiB - 544, "large_pool", 20 * MiB),
        ("torch_npu", 10 * MiB - 32, "large_pool", 10 * MiB),
        ("torch_npu", 10 * MiB, "large_pool", 12 * MiB),
    ],
)
def test_segment_size_and_pool(allocator, size, pool, reserved):
    d = Device("256MiB", allocator=allocator)
    p = d.malloc(size)
    s = d.memory_stats()
    assert s["reserved_bytes.all.current"] == reserved
    assert s[f"reserved_bytes.{pool}.current"] == reserved
    assert s[f"segment.{pool}.current"] == 1 and s["segment.all.current"] == 1
    assert s[f"allocation.{pool}.current"] == 1
    assert s["num_device_alloc"] == 1 and s["num_cache_misses"] == 1
    assert d.stats()["maps"] == 1 and d.stats()["physical_allocs"] == 1
    assert d.allocation(p)["page_size"] == 2 * MiB


@pytest.mark.parametrize("allocator", CACHING)
def test_large_segment_size_mb(allocator):
    d = Device("256MiB", allocator=allocator, alloc_conf="large_segment_size_mb:32")
    d.malloc(3 * MiB)
    assert d.memory_reserved() == 32 * MiB
    d.malloc(12 * MiB)  # from the 29 MiB remainder
    assert d.memory_reserved() == 32 * MiB


def test_large_blocks_are_not_split_for_a_remainder_of_1mib_or_less():
    # 17 MiB + 512 gets an 18 MiB segment; the remainder (1 MiB - 512) stays attached.
    d = Device("256MiB", allocator="pytorch")
    p = d.malloc(17 * MiB + 512)
    assert granted(d, p) == 18 * MiB
    assert d.fragmentation()["segments"][0]["blocks"] == 1
    # 12 MiB + 1 gets a 14 MiB segment; the 2 MiB - 512 remainder is split off.
    q = d.malloc(12 * MiB + 1)
    assert granted(d, q) == 12 * MiB + 512
    assert d.memory_stats()["inactive_split_bytes.large_pool.current"] == 2 * MiB - 512


def test_large_split_threshold_is_strictly_more_than_1mib():
    d = Device("256MiB", allocator="pytorch")
    seg = d.malloc(3 * MiB)
    d.free(seg)  # a whole cached 20 MiB segment
    p = d.malloc(19 * MiB)  # remainder exactly 1 MiB: not split
    assert p == seg and granted(d, p) == 20 * MiB
    assert d.fragmentation()["segments"][0]["blocks"] == 1
    d.free(p)
    q = d.malloc(19 * MiB - 512)  # remainder 1 MiB + 512: split
    assert q == seg and granted(d, q) == 19 * MiB - 512
    assert d.fragmentation()["segments"][0]["blocks"] == 2
    r = d.malloc(MiB + 1)  # the 1 MiB + 512 remainder serves it whole
    assert r == seg + 19 * MiB - 512 and granted(d, r) == MiB + 512
    assert d.memory_stats()["num_device_alloc"] == 1


def test_small_pool_splits_down_to_512_bytes():
    d = Device("256MiB", allocator="pytorch")
    a = d.malloc(MiB)
    b = d.malloc(MiB - 512)
    c = d.malloc(512)
    assert [granted(d, x) for x in (a, b, c)] == [MiB, MiB - 512, 512]
    assert b == a + MiB and c == b + MiB - 512
    assert d.memory_reserved() == 2 * MiB
    assert d.fragmentation()["segments"][0] == {
        "address": a,
        "size": 2 * MiB,
        "allocated": 2 * MiB,
        "blocks": 3,
        "free_blocks": 0,
    }
    e = d.malloc(1)
    assert d.memory_reserved() == 4 * MiB and not a <= e < a + 2 * MiB


def test_small_requests_share_a_segment():
    d = Device("256MiB", allocator="pytorch")
    x = d.malloc(1000)
    y = d.malloc(3000)
    assert (granted(d, x), granted(d, y)) == (1024, 3072)
    assert y == x + 1024
    s = d.memory_stats()
    assert s["segment.small_pool.current"] == 1 and s["reserved_bytes.small_pool.current"] == 2 * MiB
    assert s["inactive_split.all.current"] == 1
    assert s["inactive_split_bytes.small_pool.current"] == 2 * MiB - 4096
    d.free(x)
    s = d.memory_stats()
    assert s["inactive_split.all.current"] == 2
    assert s["inactive_split_bytes.all.current"] == 2 * MiB - 3072
    d.free(y)
    s = d.memory_stats()
    assert s["inactive_split.all.current"] == 0 and s["inactive_split_bytes.all.current"] == 0
    assert d.fragmentation()["segments"][0]["blocks"] == 1
    # Reuse costs no driver call.
    before = d.stats()
    z = d.malloc(500)
    assert z == x
    assert d.stats()["maps"] == before["maps"]
    assert d.stats()["physical_allocs"] == before["physical_allocs"]
    assert d.memory_stats()["num_cache_misses"] == 1


def test_best_fit_in_the_small_pool():
    d = Device("256MiB", allocator="pytorch")
    a = d.malloc(4 * KiB)
    d.malloc(512)
    b = d.malloc(8 * KiB)
    d.malloc(512)
    c = d.malloc(2 * KiB)
    d.malloc(512)
    for p in (a, b, c):
        d.free(p)
    assert d.malloc(2 * KiB) == c  # exact fit
    assert d.malloc(3 * KiB) == a  # 4 KiB is the smallest hole that fits; 1 KiB is split off
    assert d.malloc(5 * KiB) == b
    assert d.malloc(KiB) == a + 3 * KiB  # the split-off remainder fits exactly
    assert d.memory_reserved() == 2 * MiB


def test_best_fit_ties_go_to_the_lowest_address():
    d = Device("256MiB", allocator="pytorch")
    holes = []
    for _ in range(3):
        holes.append(d.malloc(4 * KiB))
        d.malloc(512)
    for p in reversed(holes):
        d.free(p)
    assert [d.malloc(4 * KiB) for _ in range(3)] == holes


def test_best_fit_in_the_large_pool():
    d = Device("256MiB", allocator="pytorch")
    a = d.malloc(12 * MiB)
    b = d.malloc(16 * MiB)
    c = d.malloc(14 * MiB)
    for p in (a, b, c):
        d.free(p)
    assert d.memory_reserved() == 42 * MiB
    x = d.malloc(13 * MiB)  # best fit is the 14 MiB segment; 1 MiB remainder stays attached
    assert x == c and granted(d, x) == 14 * MiB
    y = d.malloc(11 * MiB)
    assert y == a and granted(d, y) == 12 * MiB
    z = d.malloc(15 * MiB)
    assert z == b and granted(d, z) == 16 * MiB
    s = d.memory_stats()
    assert s["num_device_alloc"] == 3 and s["num_cache_misses"] == 3
    assert s["allocated_bytes.all.current"] == 42 * MiB
    assert s["requested_bytes.all.current"] == 39 * MiB


def test_freed_neighbours_merge():
    d = Device("256MiB", allocator="pytorch")
    x = d.malloc(64 * KiB)
    y = d.malloc(64 * KiB)
    z = d.malloc(64 * KiB)
    d.free(x)
    d.free(z)  # merges with the free tail of the segment
    assert d.fragmentation()["segments"][0]["free_blocks"] == 2
    assert d.memory_stats()["inactive_split.all.current"] == 2
    d.free(y)  # merges with both neighbours: the segment is one free block again
    seg = d.fragmentation()["segments"][0]
    assert (seg["blocks"], seg["free_blocks"]) == (1, 1)
    big = d.malloc(MiB)  # spans the three former blocks
    assert big == x


def test_blocks_never_merge_across_segments():
    d = Device("256MiB", allocator="pytorch")
    a = d.malloc(11 * MiB)
    b = d.malloc(11 * MiB)
    d.free(a)
    d.free(b)
    segs = d.fragmentation()["segments"]
    assert [s["size"] for s in segs] == [12 * MiB, 12 * MiB]
    c = d.malloc(20 * MiB)
    assert c not in (a, b)
    assert d.memory_stats()["num_device_alloc"] == 3
    assert d.memory_reserved() == 44 * MiB


def test_max_split_size_keeps_oversize_blocks_whole():
    d = Device("512MiB", allocator="pytorch", alloc_conf="max_split_size_mb:64")
    x = d.malloc(100 * MiB)
    s = d.memory_stats()
    assert s["oversize_allocations.current"] == 1 and s["oversize_segments.current"] == 1
    d.free(x)
    assert d.memory_stats()["oversize_allocations.current"] == 0
    # A request below max_split_size may not take an oversize block.
    y = d.malloc(30 * MiB)
    assert y != x and d.memory_reserved() == 130 * MiB
    d.free(y)
    # An oversize request may take it only if the waste is below max_non_split_rounding (20 MiB).
    z = d.malloc(80 * MiB)
    assert z != x and d.memory_reserved() == 210 * MiB
    d.free(z)
    w = d.malloc(80 * MiB + 512)  # 80 MiB is too small; 100 < 80 MiB + 512 + 20 MiB
    assert w == x and granted(d, w) == 100 * MiB
    s = d.memory_stats()
    assert s["oversize_segments.current"] == 2  # 100 MiB and 80 MiB
    assert s["oversize_allocations.current"] == 1
    assert s["max_split_size"] == 64 * MiB


def test_oversize_request_takes_an_oversize_block_whole():
    d = Device("512MiB", allocator="pytorch", alloc_conf="max_split_size_mb:64")
    x = d.malloc(100 * MiB)
    d.free(x)
    w = d.malloc(81 * MiB)  # 100 < 81 + 20: served whole, not split
    assert w == x and granted(d, w) == 100 * MiB
    assert d.fragmentation()["segments"][0]["blocks"] == 1
    assert d.memory_stats()["oversize_allocations.current"] == 1
    assert d.memory_stats()["num_device_alloc"] == 1


def test_oversize_request_from_a_new_segment_is_not_split():
    d = Device("512MiB", allocator="pytorch", alloc_conf="max_split_size_mb:64")
    x = d.malloc(70 * MiB)
    d.free(x)
    y = d.malloc(66 * MiB)  # remainder 4 MiB > 1 MiB, but oversize blocks are never split
    assert y == x and granted(d, y) == 70 * MiB


def test_blocks_below_max_split_size_still_split():
    d = Device("512MiB", allocator="pytorch", alloc_conf="max_split_size_mb:64")
    x = d.malloc(40 * MiB)
    d.free(x)
    y = d.malloc(30 * MiB)
    assert y == x and granted(d, y) == 30 * MiB


def test_max_non_split_rounding_mb():
    d = Device("512MiB", allocator="pytorch", alloc_conf="max_split_size_mb:64,max_non_split_rounding_mb:25")
    x = d.malloc(100 * MiB)
    d.free(x)
    y = d.malloc(75 * MiB)  # 100 >= 75 + 25: too much waste, a new segment
    assert y != x
    assert granted(d, y) == 76 * MiB  # its own segment, rounded to 2 MiB and not split
    z = d.malloc(75 * MiB + 512)  # 100 < 75 MiB + 512 + 25 MiB: the cached block serves it whole
    assert z == x and granted(d, z) == 100 * MiB
    assert d.memory_reserved() == 176 * MiB


def test_max_non_split_rounding_mb_has_pytorchs_floor():
    with pytest.raises(InvalidParamError, match=">= 20"):
        Device("512MiB", allocator="pytorch", alloc_conf="max_non_split_rounding_mb:5")


def test_release_ladder_frees_cached_segments_on_oom():
    d = Device("64MiB", allocator="pytorch")
    x = d.malloc(40 * MiB)
    d.free(x)
    assert d.memory_reserved() == 40 * MiB
    y = d.malloc(50 * MiB)  # does not fit beside the cached 40 MiB: the cache is released
    s = d.memory_stats()
    assert s["num_alloc_retries"] == 1 and s["num_ooms"] == 0
    assert s["reserved_bytes.all.current"] == 50 * MiB
    assert s["num_device_alloc"] == 2 and s["num_device_free"] == 1
    d.write(y + 50 * MiB - 4, b"tail")
    with raises_acl(OutOfMemoryError, 207001, match="out of memory") as info:
        d.malloc(30 * MiB)
    assert "reserved but unallocated" in info.value.message
    assert "largest free extent" in info.value.message
    s = d.memory_stats()
    assert s["num_ooms"] == 1 and s["num_alloc_retries"] == 2
    assert d.read(y + 50 * MiB - 4, 4) == b"tail"
    assert d.stats()["failed_mallocs"] == 1
    d.free(y)


def test_release_ladder_keeps_segments_with_live_blocks():
    d = Device("32MiB", allocator="pytorch")
    x = d.malloc(3 * MiB)  # carves a 20 MiB segment
    w = d.malloc(16 * MiB + 512 * KiB)  # takes the 17 MiB remainder whole
    y = d.malloc(10 * MiB)  # its own 10 MiB segment
    assert w == x + 3 * MiB and d.memory_reserved() == 30 * MiB
    d.free(x)  # a 3 MiB hole in a segment that stays in use
    d.free(y)
    z = d.malloc(12 * MiB)  # no cached block fits, 2 MiB free: only the whole 10 MiB segment goes
    s = d.memory_stats()
    assert s["num_alloc_retries"] == 1 and s["num_device_free"] == 1
    assert d.memory_reserved() == 32 * MiB
    assert sorted(seg["size"] for seg in d.fragmentation()["segments"]) == [12 * MiB, 20 * MiB]
    assert s["inactive_split_bytes.all.current"] == 3 * MiB
    assert d.malloc(3 * MiB) == x  # the hole is still there
    assert d.allocation(w) is not None and d.allocation(z) is not None


def test_release_available_cached_blocks_frees_just_one_oversize_segment():
    d = Device("160MiB", allocator="pytorch", alloc_conf="max_split_size_mb:32")
    a = d.malloc(100 * MiB)
    b = d.malloc(40 * MiB)
    d.free(a)
    d.free(b)
    c = d.malloc(30 * MiB)  # below max_split: needs a new segment; the smallest oversize one goes
    s = d.memory_stats()
    assert s["num_alloc_retries"] == 0  # no full release was needed
    assert s["num_device_free"] == 1
    assert d.memory_reserved() == 130 * MiB
    assert sorted(seg["size"] for seg in d.fragmentation()["segments"]) == [30 * MiB, 100 * MiB]
    assert c != a


def test_oom_with_nothing_cached():
    d = Device("64MiB", allocator="torch_npu")
    p = d.malloc(60 * MiB)
    with raises_acl(OutOfMemoryError, 207001) as info:
        d.malloc(8 * MiB)
    assert "torch_npu" in info.value.message
    s = d.memory_stats()
    assert s["num_ooms"] == 1 and s["num_alloc_retries"] == 1
    assert d.memory_reserved() == 62 * MiB  # 60 MiB + 32 rounds to 60 MiB + 512: a 62 MiB segment
    d.free(p)


@pytest.mark.parametrize("allocator", CACHING)
def test_per_process_memory_fraction_caps_reserved_memory(allocator):
    d = Device("128MiB", allocator=allocator, alloc_conf="per_process_memory_fraction:0.5")
    p = d.malloc(60 * MiB)
    with raises_acl(OutOfMemoryError, 207001, match="limit"):
        d.malloc(10 * MiB)
    assert d.memory_reserved() <= 64 * MiB
    assert d.mem_info()[0] >= 64 * MiB  # the device itself has room
    q = d.malloc(MiB // 2)  # a 2 MiB small segment still fits under the cap
    assert d.memory_reserved() == d.max_memory_reserved() <= 64 * MiB
    d.free(p)
    d.free(q)


@pytest.mark.parametrize("allocator", CACHING)
def test_memory_fraction_zero_refuses_everything(allocator):
    d = Device("128MiB", allocator=allocator, alloc_conf="per_process_memory_fraction:0")
    with raises_acl(OutOfMemoryError, 207001):
        d.malloc(1)
    assert d.memory_reserved() == 0


GC_CONF = "garbage_collection_threshold:0.5,per_process_memory_fraction:0.8"


def test_garbage_collection_frees_the_oldest_cached_segments():
    # Limit 80 MiB, threshold 40 MiB.
    d = Device("100MiB", allocator="pytorch", alloc_conf=GC_CONF)
    a = d.malloc(30 * MiB)
    b = d.malloc(12 * MiB)
    c = d.malloc(3 * MiB)  # 20 MiB segment
    d.free(a)
    d.malloc(2 * MiB)  # a large-pool search: ages the cached blocks
    d.free(b)
    assert d.memory_reserved() == 62 * MiB
    d.malloc(32 * MiB)  # needs a segment: 62 > 40, so GC reclaims >= 22 MiB: the older a (30 MiB)
    assert d.memory_reserved() == 64 * MiB
    assert sorted(s["size"] for s in d.fragmentation()["segments"]) == [12 * MiB, 20 * MiB, 32 * MiB]
    s = d.memory_stats()
    assert s["num_alloc_retries"] == 0 and s["num_device_free"] == 1
    assert d.allocation(c) is not None


def test_garbage_collection_needs_a_memory_fraction():
    d = Device("100MiB", allocator="pytorch", alloc_conf="garbage_collection_threshold:0.5")
    a = d.malloc(30 * MiB)
    b = d.malloc(20 * MiB)
    d.free(a)
    d.free(b)
    d.malloc(32 * MiB)
    assert d.memory_reserved() == 82 * MiB
    assert d.memory_stats()["num_device_free"] == 0


def test_garbage_collection_frees_every_block_of_at_least_mean_age():
    d = Device("100MiB", allocator="pytorch", alloc_conf=GC_CONF)
    a = d.malloc(30 * MiB)
    b = d.malloc(20 * MiB)
    d.free(a)
    d.free(b)  # same gc age as a: no get_free_block call in between
    d.malloc(32 * MiB)  # 50 MiB reserved > 40 MiB threshold: both cached segments are freed
    assert d.memory_reserved() == 32 * MiB
    assert d.memory_stats()["num_device_free"] == 2


@pytest.mark.parametrize(
    ("size", "expected"),
    [
        (1200, 1536),  # 1200 <= 512 * 4: plain 512-byte rounding
        (3000, 3072),
        (9000, 10240),  # floor 8192, step 2048
        (MiB + 1, MiB + 256 * KiB),
        (5 * MiB, 5 * MiB),
        (5 * MiB + 1, 6 * MiB),
        (8 * MiB, 8 * MiB),  # powers of two stay
        (9 * MiB, 10 * MiB),
    ],
)
def test_roundup_power2_divisions_single_value(size, expected):
    d = Device("256MiB", allocator="pytorch", alloc_conf="roundup_power2_divisions:4")
    assert grant_of(d, size) == expected


@pytest.mark.parametrize(
    ("size", "expected"),
    [
        (9000, 9216),  # intervals below 256 MiB: 1 division = plain rounding
        (300 * MiB + 1, 300 * MiB + 512),
        (600 * MiB, 768 * MiB),  # [512 MiB, 1 GiB): 2 divisions
        (512 * MiB + 1, 768 * MiB),
        (1100 * MiB, 1152 * MiB),  # [1 GiB, 2 GiB): > -> 8 divisions
        (2100 * MiB, 2304 * MiB),  # [2 GiB, 4 GiB): 8 divisions
    ],
)
def test_roundup_power2_divisions_list(size, expected):
    d = Device("4GiB", allocator="pytorch", alloc_conf="roundup_power2_divisions:[256:1,512:2,>:8]")
    assert grant_of(d, size) == expected


def test_roundup_power2_divisions_applies_after_the_torch_npu_pad():
    d = Device("256MiB", allocator="torch_npu", alloc_conf="roundup_power2_divisions:4")
    assert grant_of(d, 5 * MiB - 32) == 5 * MiB
    assert grant_of(d, 5 * MiB - 31) == 6 * MiB


@pytest.mark.sim_only("giant frames are set aside in the simulator; the host takes 1 GiB pages from hugetlb")
def test_torch_npu_page_size_1g_with_giant_frames():
    d = Device("4GiB", allocator="torch_npu", alloc_conf="page_size:1g", giant_frames=1)
    g = d.malloc(3 * MiB)
    assert d.allocation(g)["page_size"] == GiB
    assert d.page_of(g) == GiB
    assert d.memory_reserved() == GiB
    h = d.malloc(5 * MiB)  # carved from the same 1 GiB segment
    assert h == g + 3 * MiB + 512 and d.memory_reserved() == GiB
    s = d.malloc(1000)  # the small pool never uses 1 GiB pages
    assert d.page_of(s) == 2 * MiB
    assert d.memory_reserved() == GiB + 2 * MiB
    # No giant frame is left: 1 GiB-rounded segment on 2 MiB pages (HUGE_FIRST fallback).
    k = d.malloc(GiB)
    assert d.page_of(k) == 2 * MiB
    assert d.memory_reserved() == GiB + 2 * MiB + 2 * GiB
    assert d.frame_stats()["giant_free"] == 0


@pytest.mark.huge_pages
def test_torch_npu_page_size_1g_without_giant_frames_falls_back(npumem_backend):
    if npumem_backend in ("acl", "cuda"):
        pytest.skip("the runtime allocates 1 GiB pages itself: there is nothing to fall back from")
    d = Device("4GiB", allocator="torch_npu", alloc_conf="page_size:1g")
    g = d.malloc(3 * MiB)
    assert d.page_of(g) == 2 * MiB
    assert d.memory_reserved() == GiB


def test_page_size_1g_respects_the_memory_fraction():
    d = Device("4GiB", allocator="torch_npu", alloc_conf="page_size:1g,per_process_memory_fraction:0.2")
    with raises_acl(OutOfMemoryError, 207001):
        d.malloc(3 * MiB)  # would reserve 1 GiB > 819 MiB
    assert d.memory_reserved() == 0


# --------------------------------------------------------------------------------------------
# The npumem pool
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("size", "expected"),
    [(1, 512), (512, 512), (513, 1024), (1000, 1024), (MiB, MiB), (MiB + 1, MiB + 512), (3 * MiB, 3 * MiB)],
)
def test_npumem_rounds_to_512_bytes(size, expected):
    d = Device("64MiB")
    p = d.malloc(size)
    assert granted(d, p) == expected
    assert d.memory_stats()["requested_bytes.all.current"] == size


def test_npumem_pools_split_at_1mib():
    d = Device("64MiB")
    d.malloc(MiB)
    d.malloc(MiB + 1)
    s = d.memory_stats()
    assert s["allocated_bytes.small_pool.current"] == MiB
    assert s["allocated_bytes.large_pool.current"] == MiB + 512
    assert s["reserved_bytes.small_pool.current"] == MiB
    assert s["reserved_bytes.large_pool.current"] == LARGE_PAGE


@pytest.mark.huge_pages
def test_npumem_maps_large_pages_on_demand():
    d = Device("64MiB")
    x = d.malloc(3 * MiB)
    s = d.memory_stats()
    assert s["reserved_bytes.large_pool.current"] == 2 * LARGE_PAGE
    # Two pages mapped side by side: one expandable segment, as the snapshot shows it.
    assert s["segment.large_pool.current"] == 1 == len(d.memory_snapshot()["segments"])
    assert d.stats()["maps"] == 2 and d.stats()["physical_allocs"] == 2
    assert d.page_of(x) == 2 * MiB and d.page_of(x + 3 * MiB - 1) == 2 * MiB
    y = d.malloc(3 * MiB)  # packed right after x: one more page
    assert y == x + 3 * MiB
    assert d.memory_reserved() == 3 * LARGE_PAGE
    assert d.stats()["maps"] == 3
    s = d.memory_stats()
    assert s["num_device_alloc"] == 3 and s["num_cache_misses"] == 2
    assert d.mem_info()[0] == 64 * MiB - 6 * MiB


def test_npumem_packs_small_blocks_and_reuses_without_driver_calls():
    d = Device("64MiB")
    x = d.malloc(1000)
    y = d.malloc(1000)
    assert y == x + 1024
    assert d.memory_reserved() == SMALL_PAGE
    assert d.memory_stats()["num_cache_misses"] == 1
    d.free(x)
    d.free(y)
    # Idle pages stay mapped: nothing goes back to the device.
    assert d.memory_reserved() == SMALL_PAGE
    assert d.mem_info()[0] == 64 * MiB - SMALL_PAGE
    before = d.stats()
    # x and y wait in their size's stack; a miss far from the limit takes the best fit on the
    # mapped page (just past them) and leaves them waiting, instead of coalescing them first:
    # what this test pins is that the page is reused, with no driver call.
    z = d.malloc(2000)
    assert z == y + 1024
    after = d.stats()
    assert (after["maps"], after["physical_allocs"], after["unmaps"]) == (
        before["maps"],
        before["physical_allocs"],
        before["unmaps"],
    )
    assert d.memory_stats()["num_cache_misses"] == 1


def test_npumem_large_reuse_costs_no_driver_call():
    d = Device("64MiB")
    x = d.malloc(10 * MiB)
    d.free(x)
    maps, allocs = d.stats()["maps"], d.stats()["physical_allocs"]
    for size in (10 * MiB, 4 * MiB + 1, 9 * MiB):
        p = d.malloc(size)
        assert p == x
        d.free(p)
    assert d.stats()["maps"] == maps and d.stats()["physical_allocs"] == allocs
    assert d.memory_reserved() == 10 * MiB


def fill_then_free_every_other(d: Device, size: int = 2 * MiB) -> tuple[list[int], list[int]]:
    """Fills d with malloc_align32(size) blocks until OOM, tags and frees every other one;
    returns (kept, freed)."""
    ptrs = []
    while True:
        try:
            ptrs.append(d.malloc_align32(size))
        except OutOfMemoryError:
            break
    kept, freed = ptrs[1::2], ptrs[::2]
    for i, p in enumerate(kept):
        d.write(p, pattern(i, 64))
        d.write(p + size - 64, pattern(i + 1000, 64))
    for p in freed:
        d.free(p)
    return kept, freed


def test_npumem_stitches_idle_pages_into_a_large_block():
    d = Device("64MiB")
    kept, freed = fill_then_free_every_other(d)
    assert len(kept) == len(freed) == 16
    assert d.mem_info()[0] == 0
    f = d.fragmentation()
    assert f["free"] == 32 * MiB and f["largest_free_extent"] == 32 * MiB and f["external"] == 0.0
    before = d.stats()
    big = d.malloc_align32(30 * MiB)
    after = d.stats()
    assert granted(d, big) == 30 * MiB
    # The 15 pages came from idle pages elsewhere: remapped, not newly allocated.
    assert after["physical_allocs"] == before["physical_allocs"]
    assert after["maps"] - before["maps"] == 15 and after["unmaps"] - before["unmaps"] == 15
    assert d.memory_reserved() == 64 * MiB
    d.write(big, b"head")
    d.write(big + 30 * MiB - 4, b"tail")
    assert d.read(big, 4) == b"head" and d.read(big + 30 * MiB - 4, 4) == b"tail"
    for i, p in enumerate(kept):
        assert d.read(p, 64) == pattern(i, 64)
        assert d.read(p + 2 * MiB - 64, 64) == pattern(i + 1000, 64)
    check_recount(d, {**{p: 2 * MiB for p in kept}, big: 30 * MiB})


@pytest.mark.parametrize(
    ("allocator", "blocks", "largest"),
    [
        # Ten 2 MiB blocks per 20 MiB segment, three segments: every hole is one block.
        ("pytorch", 30, 2 * MiB),
        # The pad makes blocks 2 MiB + 512: nine per segment, and the freed last block of each
        # segment merges with the 2 MiB - 4.5 KiB tail.
        ("torch_npu", 27, 4 * MiB - 4 * KiB),
    ],
)
def test_caching_allocators_fail_the_stitching_pattern(allocator, blocks, largest):
    d = Device("64MiB", allocator=allocator)
    kept, freed = fill_then_free_every_other(d)
    assert len(kept) + len(freed) == blocks
    assert d.memory_reserved() == 60 * MiB
    f = d.fragmentation()
    assert f["largest_free_extent"] == largest
    assert f["external"] > 0.8
    ooms = d.memory_stats()["num_ooms"]
    with raises_acl(OutOfMemoryError, 207001):
        d.malloc_align32(30 * MiB)
    assert d.memory_stats()["num_ooms"] == ooms + 1
    for i, p in enumerate(kept):
        assert d.read(p, 64) == pattern(i, 64)


def test_direct_allocator_maps_fresh_memory_for_the_stitching_pattern():
    # Bare aclrtMalloc does not fragment on this pattern either (every block has its own mapping
    # of scattered frames), but every request costs new physical memory and a map call.
    d = Device("64MiB", allocator="direct")
    fill_then_free_every_other(d)
    before = d.stats()
    d.malloc_align32(30 * MiB)
    assert d.stats()["physical_allocs"] == before["physical_allocs"] + 1
    assert d.stats()["maps"] == before["maps"] + 1


@pytest.mark.sim_only("giant frames are set aside in the simulator; the host takes 1 GiB pages from hugetlb")
def test_npumem_bypass_prefers_giant_pages():
    d = Device("4GiB", giant_frames=1)
    g = d.malloc(GiB)
    assert d.page_of(g) == GiB and granted(d, g) == GiB
    s = d.memory_stats()
    assert s["oversize_segments.current"] == 1 and s["oversize_allocations.current"] == 1
    assert s["num_device_alloc"] == 1 and d.stats()["maps"] == 1
    assert d.frame_stats()["giant_free"] == 0
    h = d.malloc(600 * MiB)  # no giant frame left: 2 MiB pages
    assert d.page_of(h) == 2 * MiB and granted(d, h) == 600 * MiB
    assert d.memory_reserved() == GiB + 600 * MiB
    assert d.memory_stats()["reserved_bytes.large_pool.current"] == GiB + 600 * MiB
    # A bypass block is unmapped at once when freed.
    d.free(g)
    assert d.memory_reserved() == 600 * MiB
    assert d.frame_stats()["giant_free"] == 1
    assert d.memory_stats()["oversize_segments.current"] == 1
    d.free(h)
    assert d.memory_reserved() == 0 and d.mem_info()[0] == 4 * GiB


def test_npumem_bypass_threshold_is_inclusive():
    d = Device("2GiB")
    a = d.malloc(512 * MiB)  # bypass: its own mapping
    assert d.memory_stats()["oversize_segments.current"] == 1
    b = d.malloc(512 * MiB - 512)  # pooled
    assert d.memory_stats()["oversize_segments.current"] == 1
    assert granted(d, b) == 512 * MiB - 512
    d.free(a)
    d.free(b)
    assert d.memory_reserved() == 256 * LARGE_PAGE  # the pooled pages stay cached


def test_npumem_large_threshold_mb():
    d = Device("256MiB", alloc_conf="large_threshold_mb:64")
    p = d.malloc(100 * MiB)
    assert d.memory_stats()["oversize_allocations.current"] == 1
    d.free(p)
    assert d.memory_reserved() == 0
    q = d.malloc(63 * MiB)
    assert d.memory_stats()["oversize_allocations.current"] == 0
    d.free(q)
    assert d.memory_reserved() == 63 * MiB + MiB


def test_npumem_empty_cache_returns_every_frame():
    fresh = held_memory(Device("64MiB"))
    d = Device("64MiB")
    ptrs = [d.malloc(s) for s in (100, 5000, MiB, MiB + 1, 7 * MiB, 20 * MiB)]
    for p in ptrs:
        d.free(p)
    assert d.memory_reserved() > 0
    d.empty_cache()
    assert d.memory_reserved() == 0
    assert d.mem_info() == (64 * MiB, 64 * MiB)
    assert held_memory(d) == fresh
    s = d.memory_stats()
    assert s["num_device_alloc"] == s["num_device_free"]
    assert s["segment.all.current"] == 0


def test_npumem_empty_cache_keeps_live_blocks_and_their_data():
    d = Device("64MiB")
    a = d.malloc(1000)
    b = d.malloc(5 * MiB)
    c = d.malloc(3 * MiB)
    d.write(a, pattern(1, 1000))
    d.write(c, pattern(2, 4096))
    d.free(b)
    d.empty_cache()
    # Only pages under live blocks stay: c spans [5 MiB, 8 MiB) -> two large pages.
    s = d.memory_stats()
    assert s["reserved_bytes.small_pool.current"] == SMALL_PAGE
    assert s["reserved_bytes.large_pool.current"] == 2 * LARGE_PAGE
    assert d.read(a, 1000) == pattern(1, 1000)
    assert d.read(c, 4096) == pattern(2, 4096)
    check_recount(d, {a: 1000, c: 3 * MiB})


def test_npumem_oom_message_has_the_fragmentation_summary():
    d = Device("64MiB")
    kept, _ = fill_then_free_every_other(d)
    d.malloc_align32(30 * MiB)
    ooms, failed = d.memory_stats()["num_ooms"], d.stats()["failed_mallocs"]
    with raises_acl(OutOfMemoryError, 207001) as info:
        d.malloc(8 * MiB)
    message = info.value.message
    assert "largest free extent" in message
    assert "reserved but unallocated" in message
    assert "npumem" in message
    assert d.memory_stats()["num_ooms"] == ooms + 1
    assert d.stats()["failed_mallocs"] == failed + 1
    for i, p in enumerate(kept):
        assert d.read(p, 64) == pattern(i, 64)


def test_npumem_request_larger_than_the_device():
    d = Device("64MiB")
    with raises_acl(OutOfMemoryError, 207001):
        d.malloc(64 * MiB + 1)
    assert d.memory_reserved() == 0
    p = d.malloc(64 * MiB)
    assert granted(d, p) == 64 * MiB


def test_npumem_memory_fraction():
    d = Device("64MiB", alloc_conf="per_process_memory_fraction:0.5")
    a = d.malloc(30 * MiB)
    with raises_acl(OutOfMemoryError, 207001, match="limit"):
        d.malloc(4 * MiB)
    assert d.memory_reserved() == 30 * MiB  # a failure does not grow the pool
    b = d.malloc(2 * MiB)
    assert d.memory_reserved() == 32 * MiB == d.max_memory_reserved()
    d.free(a)
    d.free(b)


@pytest.mark.sim_only("giant frames are set aside in the simulator; the host takes 1 GiB pages from hugetlb")
def test_npumem_bypass_respects_the_memory_fraction():
    d = Device("4GiB", giant_frames=1, alloc_conf="per_process_memory_fraction:0.2")
    limit = int(4 * GiB * 0.2)
    d.malloc(600 * MiB)  # fits under the limit on 2 MiB pages
    assert d.memory_reserved() <= limit


def test_npumem_garbage_collection_threshold_trims_idle_pages():
    d = Device("64MiB", alloc_conf="garbage_collection_threshold:0.5")
    a = d.malloc(40 * MiB)
    d.free(a)
    assert d.memory_reserved() == 40 * MiB
    d.malloc(1000)  # 40 MiB held > 32 MiB: the coldest idle pages go back first
    s = d.memory_stats()
    assert s["reserved_bytes.large_pool.current"] == 32 * MiB
    assert s["reserved_bytes.small_pool.current"] == SMALL_PAGE
    assert s["num_device_free"] == 4


def test_npumem_small_pool_never_runs_out_of_address_space():
    d = Device("64MiB")
    pairs = []
    for _ in range(64):
        pairs.append((d.malloc_align32(MiB - 512), d.malloc_align32(512)))
    for a, _ in pairs:
        d.free(a)
    assert d.memory_allocated() == 32 * KiB
    p = d.malloc_align32(MiB)
    assert granted(d, p) == MiB


# --------------------------------------------------------------------------------------------
# Invariants of every allocator
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("allocator", ALLOCATORS)
def test_data_survives_reuse(allocator):
    d = Device("128MiB", allocator=allocator)
    base_sizes = [100, 1000, 4096, 70 * KiB, 600 * KiB, MiB, MiB + 1, 3 * MiB, 11 * MiB]
    live: dict[int, tuple[int, bytes, bytes]] = {}
    tag = 0

    def check(p: int) -> None:
        size, head, tail = live[p]
        assert d.read(p, len(head)) == head
        assert d.read(p + size - len(tail), len(tail)) == tail

    for round_ in range(3):
        for base in base_sizes:
            size = base + round_ * 512
            p = d.malloc(size)
            head, tail = pattern(tag, min(size // 2, 8 * KiB)), pattern(tag + 1, 16)
            d.write(p, head)
            d.write(p + size - 16, tail)
            live[p] = (size, head, tail)
            tag += 2
        # Free every other live block; the next round reuses the holes.
        for p in sorted(live)[::2]:
            check(p)
            d.free(p)
            del live[p]
    check_recount(d, {p: v[0] for p, v in live.items()})
    for p in live:
        check(p)
    d.empty_cache()
    for p in live:
        check(p)
        d.free(p)
    d.empty_cache()
    assert d.memory_reserved() == 0
    assert d.mem_info() == (128 * MiB, 128 * MiB)


@pytest.mark.parametrize("allocator", ALLOCATORS)
def test_free_everything_then_empty_cache_returns_the_device(allocator):
    fresh = held_memory(Device("256MiB", allocator=allocator))
    d = Device("256MiB", allocator=allocator)
    ptrs = [d.malloc(s) for s in (1, 1000, MiB, MiB + 1, 5 * MiB, 12 * MiB + 1, 64 * MiB)]
    ptrs += [d.malloc_align32(s) for s in (2 * MiB, 700 * KiB)]
    for p in ptrs:
        d.free(p)
    d.empty_cache()
    s = check_stats_consistent(d)
    assert d.memory_reserved() == 0 and d.memory_allocated() == 0
    assert d.mem_info() == (256 * MiB, 256 * MiB)
    assert held_memory(d) == fresh
    assert s["num_device_alloc"] == s["num_device_free"] > 0
    assert s["segment.all.current"] == 0
    assert d.fragmentation()["segments"] == []


def _booked_pages(size: int) -> int:
    return align_up(booked(size), 4 * KiB)


def _npumem_pinned(d: Device) -> int:
    """Bytes of the npumem pools' pages under live blocks (the rest can be reclaimed)."""
    pinned = 0
    pages: set[tuple[int, int]] = set()
    for a in d.allocations():
        if a["granted"] >= 512 * MiB:
            pinned += a["granted"]
            continue
        page = SMALL_PAGE if a["granted"] <= MiB else LARGE_PAGE
        pages |= {(page, i) for i in range(a["ptr"] // page, (a["ptr"] + a["granted"] - 1) // page + 1)}
    return pinned + sum(page for page, _ in pages)


sizes = st.one_of(
    st.integers(1, 4 * KiB),
    st.integers(4 * KiB + 1, MiB),
    st.integers(MiB + 1, 12 * MiB),
    st.sampled_from([512, MiB, 2 * MiB, 10 * MiB, 20 * MiB]),
)
ops = st.lists(
    st.one_of(
        st.tuples(st.just("alloc"), sizes),
        st.tuples(st.just("alloc"), sizes),
        st.tuples(st.just("free"), st.integers(0, 1000)),
        st.tuples(st.just("empty_cache"), st.just(0)),
    ),
    min_size=5,
    max_size=45,
)


@pytest.mark.parametrize("allocator", ALLOCATORS)
@given(ops=ops, capacity=st.sampled_from([24 * MiB, 64 * MiB]))
def test_random_malloc_free_write(allocator, ops, capacity):
    d = Device(capacity, allocator=allocator)
    fresh_frames = held_memory(d)
    live: dict[int, int] = {}
    data: dict[int, tuple[bytes, bytes]] = {}
    for n, (op, arg) in enumerate(ops):
        if op == "alloc":
            try:
                p = d.malloc(arg)
            except OutOfMemoryError:
                event("out of memory")
                if allocator == "direct":
                    assert d.mem_info()[0] < _booked_pages(arg), "spurious OOM"
                elif allocator == "npumem":
                    page = SMALL_PAGE if align_up(arg, 512) <= MiB else LARGE_PAGE
                    need = (align_up(arg, page) // page + 1) * page
                    assert _npumem_pinned(d) + need > capacity, "spurious OOM"
                continue
            a = d.allocation(p)
            assert a["size"] == arg and a["granted"] >= arg and p % 64 == 0
            for q in live:
                b = d.allocation(q)
                assert p + a["granted"] <= q or q + b["granted"] <= p, "overlap"
            head, tail = pattern(n, min(arg // 2, 48)), pattern(n + 7, min(arg // 2, 16))
            d.write(p, head)
            d.write(p + arg - len(tail), tail)
            live[p] = arg
            data[p] = (head, tail)
        elif op == "free" and live:
            p = sorted(live)[arg % len(live)]
            head, tail = data.pop(p)
            assert d.read(p, len(head)) == head
            assert d.read(p + live[p] - len(tail), len(tail)) == tail
            d.free(p)
            del live[p]
        elif op == "empty_cache":
            d.empty_cache()
            if not live:
                assert d.memory_reserved() == 0
        check_recount(d, live)
    for p, size in live.items():
        head, tail = data[p]
        assert d.read(p, len(head)) == head
        assert d.read(p + size - len(tail), len(tail)) == tail
        d.free(p)
    d.empty_cache()
    check_recount(d, {})
    assert d.memory_reserved() == 0
    assert d.mem_info() == (capacity, capacity)
    assert held_memory(d) == fresh_frames


@pytest.mark.sim_only("giant frames are set aside in the simulator; the host takes 1 GiB pages from hugetlb")
def test_npumem_pool_pages_follow_the_malloc_policy():
    d = Device("4GiB", allocator="npumem", giant_frames=1)
    cases = [
        (4 * MiB, Policy.NORMAL_ONLY, d.normal_page),
        (4 * MiB, Policy.HUGE_FIRST, 2 * MiB),
        (1000, Policy.HUGE_ONLY, 2 * MiB),
        (1000, Policy.HUGE_FIRST, d.normal_page),
        (100 * MiB, Policy.HUGE1G_ONLY, GiB),
    ]
    ptrs = []
    for size, policy, page in cases:
        p = d.malloc(size, policy)
        assert d.page_of(p) == d.allocation(p)["page_size"] == page, (size, policy)
        ptrs.append(p)
    with pytest.raises(OutOfMemoryError, match="giant_frames"):
        d.malloc(100 * MiB, Policy.HUGE1G_ONLY)
    for p in ptrs:
        d.free(p)
    d.empty_cache()
    assert d.memory_reserved() == 0
