"""The Device contract: construction, the aclrtMalloc booking and page rules, memory information,
frees, out-of-memory and fragmentation, host memory, copies, and a model-checked state machine."""

from __future__ import annotations

import ctypes
import itertools
import random

import pytest
from conftest import (
    BOTH_BACKENDS,
    GiB,
    KiB,
    MiB,
    align_up,
    booked,
    fragment,
    held_memory,
    raises_acl,
    run_in_threads,
    snapshot,
    unchanged,
)
from hypothesis import event, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

import npumem
from npumem import (
    VA_WINDOW_END,
    VA_WINDOW_START,
    Device,
    InvalidParamError,
    MemAttr,
    MemcpyKind,
    MemoryFreeError,
    OutOfMemoryError,
    Policy,
    UnsupportedError,
)

P2P_OF = {
    Policy.HUGE_FIRST: Policy.HUGE_FIRST_P2P,
    Policy.HUGE_ONLY: Policy.HUGE_ONLY_P2P,
    Policy.NORMAL_ONLY: Policy.NORMAL_ONLY_P2P,
    Policy.HUGE1G_ONLY: Policy.HUGE1G_ONLY_P2P,
}
pytestmark = BOTH_BACKENDS

NON_GIANT_POLICIES = [p for p in Policy if p not in (Policy.HUGE1G_ONLY, Policy.HUGE1G_ONLY_P2P)]


def walk(dev, va: int) -> tuple[int, int, int] | None:
    """`dev.walk(va)` on the simulator; elsewhere the walk is refused (the OS or driver maps the
    pages) and this checks the refusal, returning None."""
    if dev.backend == "sim":
        return dev.walk(va)
    # Not raises_acl: its kept traceback would hold `dev` (and its address window) past the test.
    try:
        dev.walk(va)
    except UnsupportedError as e:
        assert e.code == 200006 and f"the {dev.backend} backend has no page-table walk" in str(e)
        return None
    raise AssertionError(f"walk() on the {dev.backend} backend did not refuse")


def fresh_frame_stats(capacity: int, frame: int = 4 * KiB) -> dict:
    """frame_stats() of a fresh device whose capacity is a power of two of at most 1 GiB."""
    orders = (GiB // frame).bit_length()
    blocks = [0] * orders
    blocks[(capacity // frame).bit_length() - 1] = 1
    return {
        "frame_size": frame,
        "buddy_bytes": capacity,
        "free_bytes": capacity,
        "block_sizes": [frame << k for k in range(orders)],
        "free_blocks": blocks,
        "free_bytes_by_order": [n * (frame << k) for k, n in enumerate(blocks)],
        "largest_free_block": capacity,
        "free_in_huge_blocks": capacity if capacity >= 2 * MiB else 0,
        "giant_total": 0,
        "giant_free": 0,
    }


EMPTY_PAGE_TABLE = {
    "pages": {"4KiB": 0, "64KiB": 0, "2MiB": 0, "1GiB": 0},
    "leaf_entries": {"4KiB": 0, "64KiB": 0, "2MiB": 0, "1GiB": 0},
    "tables": [1, 0, 0, 0],
    "table_bytes": 4096,
    "mapped_bytes": 0,
}


# --------------------------------------------------------------------------------------------
# Module surface and enumerations
# --------------------------------------------------------------------------------------------


def test_module_exports():
    for name in npumem.__all__:
        assert hasattr(npumem, name), name
    assert VA_WINDOW_START == 0x1000_0000_0000 == 16 << 40
    assert VA_WINDOW_END == 0x1800_0000_0000 == 24 << 40
    assert isinstance(npumem.__version__, str) and npumem.__version__
    assert issubclass(Device, npumem._native.Device)


def test_enums_have_the_acl_values():
    assert issubclass(Policy, int) and issubclass(MemAttr, int) and issubclass(MemcpyKind, int)
    assert {p.name: p.value for p in Policy} == {
        "HUGE_FIRST": 0,
        "HUGE_ONLY": 1,
        "NORMAL_ONLY": 2,
        "HUGE_FIRST_P2P": 3,
        "HUGE_ONLY_P2P": 4,
        "NORMAL_ONLY_P2P": 5,
        "HUGE1G_ONLY": 6,
        "HUGE1G_ONLY_P2P": 7,
    }
    assert {a.name: a.value for a in MemAttr} == {
        "DDR": 0,
        "HBM": 1,
        "DDR_HUGE": 2,
        "DDR_NORMAL": 3,
        "HBM_HUGE": 4,
        "HBM_NORMAL": 5,
        "DDR_P2P_HUGE": 6,
        "DDR_P2P_NORMAL": 7,
        "HBM_P2P_HUGE": 8,
        "HBM_P2P_NORMAL": 9,
        "HBM_HUGE1G": 10,
        "HBM_P2P_HUGE1G": 11,
        "MEM_NORMAL": 12,
        "MEM_HUGE": 13,
        "MEM_HUGE1G": 14,
        "MEM_P2P_NORMAL": 15,
        "MEM_P2P_HUGE": 16,
        "MEM_P2P_HUGE1G": 17,
    }
    assert {k.name: k.value for k in MemcpyKind} == {
        "HOST_TO_HOST": 0,
        "HOST_TO_DEVICE": 1,
        "DEVICE_TO_HOST": 2,
        "DEVICE_TO_DEVICE": 3,
        "DEFAULT": 4,
        "HOST_TO_BUF_TO_DEVICE": 5,
        "INNER_DEVICE_TO_DEVICE": 6,
        "INTER_DEVICE_TO_DEVICE": 7,
    }


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("4096", 4096),
        (4096, 4096),
        ("4KiB", 4 * KiB),
        (" 64 kb ", 64 * KiB),
        ("2M", 2 * MiB),
        ("2mib", 2 * MiB),
        ("32GiB", 32 * GiB),
        ("1.5GiB", 3 * GiB // 2),
        ("1_000", 1000),
        ("1T", 1 << 40),
    ],
)
def test_parse_size(text, value):
    assert npumem.parse_size(text) == value


@pytest.mark.parametrize("text", ["", "GiB", "12 parsecs", "-1", "1.3B", "99999999999TiB", "nan", -1, 2**64])
def test_parse_size_rejects(text):
    with raises_acl(InvalidParamError, 100000):
        npumem.parse_size(text)


def test_format_size():
    assert npumem.format_size(512) == "512 B"
    assert npumem.format_size(2 * MiB) == "2 MiB"
    assert npumem.format_size(3 * GiB // 2) == "1.50 GiB"


# --------------------------------------------------------------------------------------------
# Construction
# --------------------------------------------------------------------------------------------


@pytest.mark.sim_only("the default device is the simulated 32 GiB one")
def test_default_device():
    d = Device(allocator="direct")
    assert (d.capacity, d.normal_page, d.giant_frames, d.backend, d.allocator) == (32 * GiB, 4096, 0, "sim", "direct")
    assert d.mem_info() == (32 * GiB, 32 * GiB)
    assert repr(d) == 'Device(capacity="32GiB", normal_page="4KiB", giant_frames=0, backend="sim", allocator="direct")'


@pytest.mark.sim_only("64 KiB normal pages, frames and page table are the simulator's")
@pytest.mark.parametrize("capacity", [64 * MiB, "64MiB", "64 MiB", "64m", "65536KiB", "0.0625GiB"])
@pytest.mark.parametrize("normal_page", [None, 4096, "4KiB", 64 * KiB, "64KiB", "64 kib"])
def test_config_spellings(capacity, normal_page):
    kwargs = {} if normal_page is None else {"normal_page": normal_page}
    d = Device(capacity, **kwargs, allocator="direct")
    page = 4096 if normal_page is None else npumem.parse_size(normal_page)
    assert d.capacity == 64 * MiB
    assert d.normal_page == page
    assert d.mem_info(MemAttr.HBM) == (64 * MiB, 64 * MiB)
    assert d.frame_stats() == fresh_frame_stats(64 * MiB, page)
    assert d.page_table_stats() == EMPTY_PAGE_TABLE
    assert all(v == 0 for v in d.stats().values())
    assert d.allocations() == []
    assert eval(repr(d), {"Device": Device}).capacity == d.capacity


@pytest.mark.sim_only("the buddy allocator's frames")
def test_capacity_is_rounded_down_to_whole_frames():
    d = Device(64 * MiB + 12 * KiB + 100, allocator="direct")
    fs = d.frame_stats()
    assert fs["buddy_bytes"] == fs["free_bytes"] == 64 * MiB + 12 * KiB
    assert fs["free_blocks"][:3] == [1, 1, 0]  # 4 KiB + 8 KiB after the 64 MiB block
    assert fs["free_blocks"][14] == 1
    assert d.mem_info() == (64 * MiB + 12 * KiB, 64 * MiB + 12 * KiB)


@pytest.mark.sim_only("giant frames are set aside in the simulator")
def test_giant_reserve_at_start():
    d = Device("2GiB", giant_frames=1, allocator="direct")
    assert d.giant_frames == 1
    assert d.mem_info(MemAttr.HBM) == (2 * GiB, 2 * GiB)
    assert d.mem_info(MemAttr.HBM_NORMAL) == (GiB, GiB)
    assert d.mem_info(MemAttr.HBM_HUGE) == (GiB, GiB)
    assert d.mem_info(MemAttr.HBM_HUGE1G) == (GiB, GiB)
    fs = d.frame_stats()
    assert (fs["giant_total"], fs["giant_free"], fs["buddy_bytes"]) == (1, 1, GiB)


def test_device_arguments_are_keyword_only():
    with pytest.raises(TypeError):
        Device("64MiB", "4KiB", allocator="direct")


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"capacity": "64MiB", "backend": "tpu"}, "backend"),
        ({"capacity": "64MiB", "backend": ""}, "backend"),
        ({"capacity": "64MiB", "allocator": "caching"}, "allocator"),
        ({"capacity": "64MiB", "normal_page": "8KiB"}, "normal_page"),
        ({"capacity": "64MiB", "normal_page": "2MiB"}, "normal_page"),
        ({"capacity": "64MiB", "normal_page": "1GiB"}, "normal_page"),
        ({"capacity": "64MiB", "normal_page": 0}, "normal_page"),
        ({"capacity": "64MiB", "normal_page": 4095}, "normal_page"),
        ({"capacity": "64MiB", "normal_page": -4096}, "normal_page"),
        ({"capacity": "64MiB", "normal_page": "big"}, "size"),
        ({"capacity": "2GiB", "giant_frames": 3}, "giant"),
        ({"capacity": "1GiB", "giant_frames": 2}, "giant"),
        ({"capacity": "512MiB", "giant_frames": 1}, "giant"),
        ({"capacity": 0}, "capacity"),
        ({"capacity": 4095}, "capacity"),
        pytest.param(
            {"capacity": "32KiB", "normal_page": "64KiB"},
            "capacity",
            marks=pytest.mark.sim_only("64 KiB normal pages"),
        ),
        ({"capacity": -1}, "capacity"),
        ({"capacity": -(2**70)}, "capacity"),
        ({"capacity": 2**64}, "capacity"),
        ({"capacity": "lots"}, "size"),
        ({"capacity": "-1GiB"}, "size"),
    ],
)
def test_bad_config(kwargs, match):
    kwargs = dict(kwargs)  # shared by the runs on each backend
    capacity = kwargs.pop("capacity")
    with raises_acl(InvalidParamError, 100000, match=match) as info:
        Device(capacity, **{"allocator": "direct", **kwargs})
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("giant_frames", [-1, 2**64])
def test_giant_frames_out_of_range_is_invalid_param(giant_frames):
    with raises_acl(InvalidParamError, 100000):
        Device("64MiB", giant_frames=giant_frames, allocator="direct")


@pytest.mark.parametrize(("kwargs"), [{"capacity": 1.5}, {"capacity": b"64MiB"}, {"normal_page": 4096.0}])
def test_wrong_config_types_raise_type_error(kwargs):
    kwargs = {"capacity": "64MiB", **kwargs}  # the dict is shared by the runs on each backend
    capacity = kwargs.pop("capacity")
    with pytest.raises(TypeError):
        Device(capacity, **kwargs, allocator="direct")


# --------------------------------------------------------------------------------------------
# malloc: booking, pages, alignment, policies
# --------------------------------------------------------------------------------------------


def expected_page(policy: Policy, size: int, normal: int = 4 * KiB) -> int:
    base = Policy(policy % 3) if policy < 6 else Policy.HUGE1G_ONLY
    if base == Policy.HUGE1G_ONLY:
        return GiB
    if base == Policy.NORMAL_ONLY or (base == Policy.HUGE_FIRST and size <= MiB):
        return normal
    return 2 * MiB


def check_allocation(d: Device, ptr: int, size: int, policy: Policy, *, padded: bool = True):
    page = expected_page(policy, size, d.normal_page)
    b = booked(size, policy, padded=padded)
    a = d.allocation(ptr)
    assert a == {
        "ptr": ptr,
        "size": size,
        "booked": b,
        "granted": align_up(b, page),
        "policy": int(policy),
        "page_size": page,
        "stream": 0,
    }
    assert VA_WINDOW_START <= ptr and ptr + a["granted"] <= VA_WINDOW_END
    assert ptr % 64 == 0 and ptr % page == 0
    for off in {0, size - 1, a["granted"] - 1}:
        assert d.translate(ptr + off)[1] == page
        assert d.page_of(ptr + off) == page
    return a


@pytest.mark.parametrize(
    ("size", "malloc_booked", "align32_booked"),
    [(1, 64, 32), (31, 64, 32), (32, 64, 32), (33, 96, 64), (64, 96, 64), (100, 160, 128), (4064, 4096, 4064)],
)
def test_booking_is_align32_plus_pad(dev, size, malloc_booked, align32_booked):
    p = dev.malloc(size)
    q = dev.malloc_align32(size)
    assert dev.allocation(p)["booked"] == malloc_booked
    assert dev.allocation(q)["booked"] == align32_booked
    assert dev.allocation(p)["granted"] == dev.allocation(q)["granted"] == 4096


def test_booking_crosses_a_page_because_of_the_pad(dev):
    # 4065 bytes: align_up(4065, 32) + 32 = 4128 > 4096, so malloc needs two pages; align32 too.
    assert dev.allocation(dev.malloc(4064))["granted"] == 4096
    assert dev.allocation(dev.malloc(4065))["granted"] == 8192
    assert dev.allocation(dev.malloc_align32(4096))["granted"] == 4096
    assert dev.allocation(dev.malloc_align32(4097))["granted"] == 8192


@pytest.mark.parametrize(
    ("size", "policy", "page", "granted"),
    [
        (MiB, Policy.HUGE_FIRST, 4 * KiB, MiB + 4 * KiB),
        (MiB - 64, Policy.HUGE_FIRST, 4 * KiB, MiB),
        (MiB + 1, Policy.HUGE_FIRST, 2 * MiB, 2 * MiB),
        (2 * MiB - 64, Policy.HUGE_FIRST, 2 * MiB, 2 * MiB),
        (2 * MiB, Policy.HUGE_FIRST, 2 * MiB, 4 * MiB),
        (3 * MiB, Policy.HUGE_FIRST_P2P, 2 * MiB, 4 * MiB),
        (1, Policy.HUGE_ONLY, 2 * MiB, 2 * MiB),
        (1, Policy.HUGE_ONLY_P2P, 2 * MiB, 2 * MiB),
        (5 * MiB, Policy.NORMAL_ONLY, 4 * KiB, 5 * MiB + 4 * KiB),
        (5 * MiB - 64, Policy.NORMAL_ONLY_P2P, 4 * KiB, 5 * MiB),
    ],
)
def test_page_rules(dev, size, policy, page, granted):
    p = dev.malloc(size, policy)
    a = check_allocation(dev, p, size, policy)
    assert (a["page_size"], a["granted"]) == (page, granted)
    assert dev.stats()["huge_fallbacks"] == 0
    w = walk(dev, p)
    assert w is None or w[1:] == (page, 4 if page < 2 * MiB else 3)


def test_malloc_align32_on_huge_pages(dev):
    p = dev.malloc_align32(2 * MiB, Policy.HUGE_FIRST)
    assert dev.allocation(p)["granted"] == 2 * MiB
    q = dev.malloc_align32(2 * MiB + 1, Policy.HUGE_ONLY)
    assert dev.allocation(q)["granted"] == 4 * MiB


def test_sizes_as_strings_and_enum_or_int_policies(dev):
    p = dev.malloc("2MiB", 1)
    assert dev.allocation(p)["size"] == 2 * MiB
    assert dev.allocation(p)["policy"] == Policy.HUGE_ONLY
    q = dev.malloc(100, policy=Policy.NORMAL_ONLY_P2P)
    assert dev.allocation(q)["policy"] == 5
    r = dev.malloc(100, None)
    assert dev.allocation(r)["policy"] == Policy.HUGE_FIRST


@pytest.mark.huge_pages
@pytest.mark.parametrize("base", [Policy.HUGE_FIRST, Policy.HUGE_ONLY, Policy.NORMAL_ONLY])
@pytest.mark.parametrize("size", [1, 100, MiB, MiB + 1, 3 * MiB + 5])
def test_p2p_policies_behave_like_their_base(base, size):
    d1, d2 = Device("64MiB", allocator="direct"), Device("64MiB", allocator="direct")
    a = d1.allocation(d1.malloc(size, base))
    b = d2.allocation(d2.malloc(size, P2P_OF[base]))
    assert b["policy"] == P2P_OF[base]
    a.pop("policy"), b.pop("policy"), a.pop("ptr"), b.pop("ptr")
    assert a == b
    assert held_memory(d1) == held_memory(d2)
    if d1.backend == "sim":
        assert d1.page_table_stats() == d2.page_table_stats()


@pytest.mark.sim_only("64 KiB normal pages and the page table")
@settings(max_examples=60)
@given(
    size=st.one_of(st.integers(1, 8 * KiB), st.integers(MiB - 2, MiB + 2), st.integers(1, 6 * MiB)),
    policy=st.sampled_from(NON_GIANT_POLICIES),
    padded=st.booleans(),
    normal=st.sampled_from([4 * KiB, 64 * KiB]),
)
def test_malloc_rules_property(size, policy, padded, normal):
    d = Device("32MiB", normal_page=normal, allocator="direct")
    p = d.malloc(size, policy) if padded else d.malloc_align32(size, policy)
    a = check_allocation(d, p, size, policy, padded=padded)
    assert d.mem_info() == (32 * MiB - a["granted"], 32 * MiB)
    s = d.stats()
    assert (s["mallocs"], s["live_count"], s["live_requested"], s["live_granted"]) == (1, 1, size, a["granted"])
    pt = d.page_table_stats()
    assert pt["mapped_bytes"] == a["granted"]
    label = {4 * KiB: "4KiB", 64 * KiB: "64KiB", 2 * MiB: "2MiB"}[a["page_size"]]
    assert pt["pages"][label] == a["granted"] // a["page_size"]
    d.free(p)
    assert d.frame_stats() == fresh_frame_stats(32 * MiB, normal)
    assert d.page_table_stats() == EMPTY_PAGE_TABLE


def test_translate_and_walk(dev):
    p = dev.malloc(3 * 4096 - 64, Policy.NORMAL_ONLY)
    h = dev.malloc(3 * MiB, Policy.HUGE_ONLY)
    for off in (0, 1, 4095):
        pa, page = dev.translate(p + off)
        assert page == 4096 and pa % 4096 == off
        assert walk(dev, p + off) in (None, (pa, 4096, 4))
    base = dev.translate(h)[0]
    assert base % (2 * MiB) == 0
    for off in (1, 12345, 2 * MiB - 1):
        assert dev.translate(h + off) == (base + off, 2 * MiB)
        assert walk(dev, h + off) in (None, (base + off, 2 * MiB, 3))
    assert dev.translate(h + 2 * MiB)[0] % (2 * MiB) == 0
    # Distinct pages map distinct frames.
    frames = {dev.translate(p + k * 4096)[0] for k in range(3)}
    frames |= {dev.translate(h + k * 2 * MiB)[0] for k in range(2)}
    assert len(frames) == 5


@pytest.mark.sim_only("buddy and page-table counts")
def test_fresh_allocation_stats_are_exact(dev):
    p = dev.malloc(100)
    assert dev.mem_info(MemAttr.HBM) == (64 * MiB - 4 * KiB, 64 * MiB)
    assert dev.mem_info(MemAttr.HBM_NORMAL) == (64 * MiB - 4 * KiB, 64 * MiB)
    # The 64 MiB block split down to 4 KiB: one free block of every order below 64 MiB.
    assert dev.mem_info(MemAttr.HBM_HUGE) == (62 * MiB, 64 * MiB)
    fs = dev.frame_stats()
    assert fs["free_blocks"] == [1] * 14 + [0] * 5
    assert fs["largest_free_block"] == 32 * MiB
    assert fs["free_in_huge_blocks"] == 62 * MiB
    pt = dev.page_table_stats()
    assert pt["pages"] == {"4KiB": 1, "64KiB": 0, "2MiB": 0, "1GiB": 0}
    assert pt["leaf_entries"] == pt["pages"]
    assert pt["tables"] == [1, 1, 1, 1]
    assert pt["table_bytes"] == 4 * 4096
    assert pt["mapped_bytes"] == 4096
    s = dev.stats()
    assert s == {
        "mallocs": 1,
        "frees": 0,
        "failed_mallocs": 0,
        "huge_fallbacks": 0,
        "kind_mismatches": 0,
        "lost_effects": 0,
        "deferred_frees": 0,
        "pending_frees": 0,
        "sync_reclaims": 0,
        "same_stream_reuses": 0,
        "event_dependency_reuses": 0,
        "internal_dependency_reuses": 0,
        "live_count": 1,
        "live_requested": 100,
        "live_granted": 4096,
        "peak_granted": 4096,
        "reserves": 1,
        "releases": 0,
        "physical_allocs": 1,
        "physical_frees": 0,
        "maps": 1,
        "unmaps": 0,
        "pages_mapped": 1,
        "pages_unmapped": 0,
        "bytes_read": 0,
        "bytes_written": 0,
        "refused_frees": 0,
        "stranded_frees": 0,
        "stranded_bytes": 0,
        "host_live_bytes": 0,
        "host_live_count": 0,
    }
    dev.free(p)
    s = dev.stats()
    assert (s["frees"], s["live_count"], s["live_requested"], s["live_granted"], s["peak_granted"]) == (
        1,
        0,
        0,
        0,
        4096,
    )
    assert (s["releases"], s["physical_frees"], s["unmaps"], s["pages_unmapped"]) == (1, 1, 1, 1)


@pytest.mark.sim_only("the buddy allocator's free blocks")
def test_mem_info_attributes(dev):
    dev.malloc(100, Policy.NORMAL_ONLY)
    dev.malloc(3 * MiB, Policy.HUGE_ONLY)
    hbm = dev.mem_info(MemAttr.HBM)
    normal = dev.mem_info(MemAttr.HBM_NORMAL)
    huge = dev.mem_info(MemAttr.HBM_HUGE)
    giant = dev.mem_info(MemAttr.HBM_HUGE1G)
    assert hbm == normal == (64 * MiB - 4 * KiB - 4 * MiB, 64 * MiB)
    assert huge == (dev.frame_stats()["free_in_huge_blocks"], 64 * MiB)
    assert huge[0] % (2 * MiB) == 0 and huge[0] <= normal[0]
    assert giant == (0, 0)
    groups = {
        (0, 0): [MemAttr.DDR, MemAttr.DDR_HUGE, MemAttr.DDR_NORMAL, MemAttr.DDR_P2P_HUGE, MemAttr.DDR_P2P_NORMAL],
        normal: [MemAttr.HBM_NORMAL, MemAttr.HBM_P2P_NORMAL, MemAttr.MEM_NORMAL, MemAttr.MEM_P2P_NORMAL],
        huge: [MemAttr.HBM_HUGE, MemAttr.HBM_P2P_HUGE, MemAttr.MEM_HUGE, MemAttr.MEM_P2P_HUGE],
        giant: [MemAttr.HBM_HUGE1G, MemAttr.HBM_P2P_HUGE1G, MemAttr.MEM_HUGE1G, MemAttr.MEM_P2P_HUGE1G],
    }
    for expected, attrs in groups.items():
        for attr in attrs:
            assert dev.mem_info(attr) == expected, attr.name
            assert dev.mem_info(int(attr)) == expected
    assert dev.mem_info() == hbm


def test_allocations_listing(dev):
    ptrs = [dev.malloc(s, pol) for s, pol in [(100, 0), (3 * MiB, 1), (5000, 2), (MiB, 0)]]
    listing = dev.allocations()
    assert [a["ptr"] for a in listing] == sorted(ptrs)
    assert listing == [dev.allocation(p) for p in sorted(ptrs)]
    for a, b in itertools.pairwise(listing):
        assert a["ptr"] + a["granted"] <= b["ptr"]
    assert dev.allocation(ptrs[0] + 64) is None
    assert dev.allocation(0) is None
    assert dev.allocation(VA_WINDOW_END - 64) is None


# --------------------------------------------------------------------------------------------
# free
# --------------------------------------------------------------------------------------------


def test_free_everything_restores_the_device():
    dev = Device("256MiB", allocator="direct")
    fs0 = held_memory(dev)
    rng = random.Random(1)
    ptrs = []
    for _ in range(60):
        size = rng.choice([1, 100, 4096, 5000, 70 * KiB, MiB, MiB + 1, 3 * MiB])
        ptrs.append(dev.malloc(size, rng.choice(NON_GIANT_POLICIES)))
    assert dev.mem_info()[0] < 256 * MiB
    rng.shuffle(ptrs)
    for p in ptrs:
        dev.free(p)
    assert held_memory(dev) == fs0
    if dev.backend == "sim":
        assert dev.page_table_stats() == EMPTY_PAGE_TABLE
    assert dev.mem_info() == (256 * MiB, 256 * MiB)
    assert dev.allocations() == []
    s = dev.stats()
    assert (s["mallocs"], s["frees"], s["live_count"], s["live_granted"]) == (60, 60, 0, 0)
    assert s["reserves"] == s["releases"] == s["physical_allocs"] == s["physical_frees"] == 60
    assert s["pages_mapped"] == s["pages_unmapped"]


def test_double_free(dev):
    p = dev.malloc(100)
    dev.free(p)
    with unchanged(dev), raises_acl(MemoryFreeError, 207002, match="double free"):
        dev.free(p)


def test_interior_and_unknown_frees(dev):
    p = dev.malloc(100)
    with unchanged(dev):
        for bad in (p + 64, p + 100, p + 4095):
            with raises_acl(MemoryFreeError, 207002, match=f"{bad - p} bytes into"):
                dev.free(bad)
        for bad in (p + 4096, VA_WINDOW_START + GiB, 12345):
            with raises_acl(MemoryFreeError, 207002, match="not a live device allocation"):
                dev.free(bad)
        with raises_acl(InvalidParamError, 100000, match="NULL"):
            dev.free(0)
    dev.free(p)


def test_free_returns_memory_for_reuse(dev):
    for _ in range(3):
        p = dev.malloc_align32(64 * MiB, Policy.HUGE_ONLY)
        assert dev.mem_info() == (0, 64 * MiB)
        dev.free(p)
        assert dev.mem_info() == (64 * MiB, 64 * MiB)


# --------------------------------------------------------------------------------------------
# Out of memory and fragmentation
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("policy", NON_GIANT_POLICIES)
def test_whole_device_exactly(policy):
    d = Device("16MiB", allocator="direct")
    p = d.malloc_align32(16 * MiB, policy)
    assert d.mem_info() == (0, 16 * MiB)
    for size in (1, 16 * MiB):
        with unchanged(d, failed_mallocs=1), raises_acl(OutOfMemoryError, 207001):
            d.malloc(size, policy)
    d.free(p)
    # malloc pads by 32 bytes: the whole device no longer fits.
    with unchanged(d, failed_mallocs=1), raises_acl(OutOfMemoryError, 207001) as info:
        d.malloc(16 * MiB, policy)
    assert isinstance(info.value, MemoryError)
    assert "16 MiB" in info.value.message


@pytest.mark.parametrize("size", [64 * MiB + 1, 65 * MiB, GiB, 2**40, 2**63, 2**64 - 2**32])
@pytest.mark.parametrize("policy", NON_GIANT_POLICIES)
def test_larger_than_the_device(dev, size, policy):
    with unchanged(dev, failed_mallocs=1), raises_acl(OutOfMemoryError, 207001):
        dev.malloc(size, policy)


@pytest.mark.sim_only("a fragmented buddy (fragment())")
@pytest.mark.parametrize("capacity", ["64MiB", "128MiB"])
def test_fragmentation_story(capacity):
    d = Device(capacity, allocator="direct")
    cap = d.capacity
    fs0 = d.frame_stats()
    kept = fragment(d)
    free, total = d.mem_info(MemAttr.HBM)
    assert total == cap
    assert free == cap - len(kept) * 4096 > cap * 0.99
    assert d.mem_info(MemAttr.HBM_HUGE) == (0, cap)
    fs = d.frame_stats()
    assert fs["largest_free_block"] == MiB < 2 * MiB
    assert fs["free_in_huge_blocks"] == 0
    # HUGE_ONLY fails although almost everything is free; the state is untouched.
    for size in (1, 2 * MiB - 64, 4 * MiB):
        for policy in (Policy.HUGE_ONLY, Policy.HUGE_ONLY_P2P):
            with unchanged(d, failed_mallocs=1), raises_acl(OutOfMemoryError, 207001, match="HUGE_FIRST") as e:
                d.malloc(size, policy)
            assert "fragmentation" in e.value.message
    # HUGE_FIRST succeeds with 4 KiB pages and counts the fallback.
    p = d.malloc(4 * MiB, Policy.HUGE_FIRST)
    a = d.allocation(p)
    assert (a["page_size"], a["granted"]) == (4096, 4 * MiB + 4096)
    assert d.stats()["huge_fallbacks"] == 1
    assert d.page_table_stats()["pages"]["4KiB"] == len(kept) + (4 * MiB + 4096) // 4096
    q = d.malloc(3 * MiB, Policy.HUGE_FIRST_P2P)
    assert d.allocation(q)["page_size"] == 4096
    assert d.stats()["huge_fallbacks"] == 2
    # Requests of at most 1 MiB take normal pages anyway: no fallback is counted.
    r = d.malloc(MiB, Policy.HUGE_FIRST)
    assert d.stats()["huge_fallbacks"] == 2
    # Data written through the fallback mapping reads back.
    payload = bytes(random.Random(3).randbytes(4 * MiB))
    d.write(p, payload)
    assert d.read(p, 4 * MiB) == payload
    for ptr in (p, q, r, *kept):
        d.free(ptr)
    assert d.frame_stats() == fs0
    assert d.page_table_stats()["mapped_bytes"] == 0
    # Huge frames re-form once the memory is free.
    h = d.malloc(4 * MiB, Policy.HUGE_ONLY)
    assert d.allocation(h)["page_size"] == 2 * MiB


@pytest.mark.sim_only("a fragmented buddy (fragment())")
def test_huge_first_oom_when_nothing_fits():
    d = Device("16MiB", allocator="direct")
    fragment(d)
    with unchanged(d, failed_mallocs=1), raises_acl(OutOfMemoryError, 207001):
        d.malloc(16 * MiB, Policy.HUGE_FIRST)
    assert d.stats()["huge_fallbacks"] == 0


# --------------------------------------------------------------------------------------------
# Giant (1 GiB) and 64 KiB pages
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("policy", [Policy.HUGE1G_ONLY, Policy.HUGE1G_ONLY_P2P])
def test_huge1g_needs_giant_frames(dev, policy):
    for size in (1, 100, GiB):
        with unchanged(dev, failed_mallocs=1), raises_acl(OutOfMemoryError, 207001, match="giant_frames"):
            dev.malloc(size, policy)


@pytest.mark.sim_only("giant frames are set aside in the simulator")
@pytest.mark.parametrize("policy", [Policy.HUGE1G_ONLY, Policy.HUGE1G_ONLY_P2P])
def test_huge1g_pages(policy):
    d = Device("2GiB", giant_frames=1, allocator="direct")
    p = d.malloc(1000, policy)
    a = check_allocation(d, p, 1000, policy)
    assert (a["booked"], a["granted"], a["page_size"]) == (1024, GiB, GiB)  # no 32-byte pad
    assert p % GiB == 0
    assert d.translate(p) == (GiB, GiB)  # the reserve is the top 1 GiB frame
    assert d.walk(p + GiB - 1) == (2 * GiB - 1, GiB, 2)
    assert d.mem_info(MemAttr.HBM_HUGE1G) == (0, GiB)
    assert d.mem_info(MemAttr.HBM) == (GiB, 2 * GiB)
    assert d.mem_info(MemAttr.HBM_NORMAL) == (GiB, GiB)
    fs = d.frame_stats()
    assert (fs["giant_total"], fs["giant_free"], fs["free_bytes"]) == (1, 0, GiB)
    pt = d.page_table_stats()
    assert pt["pages"] == {"4KiB": 0, "64KiB": 0, "2MiB": 0, "1GiB": 1}
    assert pt["tables"] == [1, 1, 0, 0]
    assert pt["mapped_bytes"] == GiB
    with unchanged(d, failed_mallocs=1), raises_acl(OutOfMemoryError, 207001, match="0 of 1 giant frames are free"):
        d.malloc(1, policy)
    d.free(p)
    assert d.mem_info(MemAttr.HBM_HUGE1G) == (GiB, GiB)
    assert d.page_table_stats() == EMPTY_PAGE_TABLE
    # Exactly 1 GiB fits (no pad); one byte more needs a second giant frame.
    q = d.malloc(GiB, policy)
    assert d.allocation(q)["granted"] == GiB
    d.free(q)
    q = d.malloc_align32(GiB - 31, policy)
    assert d.allocation(q)["booked"] == GiB
    d.free(q)
    with unchanged(d, failed_mallocs=1), raises_acl(OutOfMemoryError, 207001):
        d.malloc(GiB + 1, policy)


@pytest.mark.sim_only("giant frames are set aside in the simulator")
def test_two_giant_pages():
    d = Device("3GiB", giant_frames=2, allocator="direct")
    p = d.malloc(GiB + 1, Policy.HUGE1G_ONLY)
    assert d.allocation(p)["granted"] == 2 * GiB
    assert {d.translate(p)[0], d.translate(p + GiB)[0]} == {GiB, 2 * GiB}
    assert d.mem_info(MemAttr.HBM_HUGE1G) == (0, 2 * GiB)
    # Normal memory is untouched by giant allocations.
    assert d.mem_info(MemAttr.HBM_NORMAL) == (GiB, GiB)


@pytest.mark.sim_only("64 KiB normal pages")
def test_64k_normal_pages():
    d = Device("64MiB", normal_page="64KiB", allocator="direct")
    assert d.normal_page == 64 * KiB
    p = d.malloc(100, Policy.NORMAL_ONLY)
    a = check_allocation(d, p, 100, Policy.NORMAL_ONLY)
    assert (a["granted"], a["page_size"]) == (64 * KiB, 64 * KiB)
    assert d.walk(p)[1:] == (64 * KiB, 4)
    pt = d.page_table_stats()
    assert pt["pages"]["64KiB"] == 1 and pt["leaf_entries"]["64KiB"] == 16
    assert pt["mapped_bytes"] == 64 * KiB
    q = d.malloc(200 * KiB, Policy.HUGE_FIRST)
    assert d.allocation(q)["granted"] == 256 * KiB
    assert d.page_table_stats()["leaf_entries"]["64KiB"] == 5 * 16
    h = d.malloc(100, Policy.HUGE_ONLY)
    assert d.allocation(h)["page_size"] == 2 * MiB
    assert d.mem_info() == (64 * MiB - 5 * 64 * KiB - 2 * MiB, 64 * MiB)
    assert d.frame_stats()["frame_size"] == 64 * KiB
    for ptr in (p, q, h):
        d.free(ptr)
    assert d.frame_stats() == fresh_frame_stats(64 * MiB, 64 * KiB)


# --------------------------------------------------------------------------------------------
# read / write / memset / memcpy semantics
# --------------------------------------------------------------------------------------------


def test_write_read_kinds_of_buffers(dev):
    p = dev.malloc(64)
    dev.write(p, b"hello")
    dev.write(p + 5, bytearray(b" world"))
    dev.write(p + 11, memoryview(b"!!"))
    assert dev.read(p, 13) == b"hello world!!"
    assert dev.read(p + 6, "5") == b"world"
    out = bytearray(5)
    dev.read_into(p, out)
    assert out == b"hello"
    dev.read_into(p + 6, memoryview(out)[1:3])
    assert out == b"hwolo"
    # Zero-length transfers are no-ops, even at NULL.
    dev.write(p, b"")
    dev.write(0, b"")
    assert dev.read(p, 0) == b""
    assert dev.read(0, 0) == b""
    dev.read_into(0, bytearray())
    s = dev.stats()
    assert (s["bytes_written"], s["bytes_read"]) == (13, 13 + 5 + 5 + 2)


def test_failed_write_changes_nothing(dev):
    p = dev.malloc(100)
    dev.write(p, bytes(range(100)))
    for off, n in [(0, 101), (50, 51), (99, 2)]:
        with unchanged(dev), raises_acl(InvalidParamError, 107000, match="past the end"):
            dev.write(p + off, b"\xff" * n)
    with unchanged(dev), raises_acl(InvalidParamError, 107000):
        dev.memset(p + 50, 1000, 0xEE, 51)
    assert dev.read(p, 100) == bytes(range(100))


def test_memset(dev, host):
    p = dev.malloc(300)
    dev.memset(p, 300, 0x5A, 300)
    assert dev.read(p, 300) == b"\x5a" * 300
    for value, byte in [(-1, 0xFF), (256, 0), (0x1234, 0x34), (2**31 - 1, 0xFF), (-(2**31), 0)]:
        dev.memset(p + 10, 290, value, 7)
        assert dev.read(p + 9, 9) == b"\x5a" + bytes([byte]) * 7 + b"\x5a"
    dev.memset(0, 0, 1, 0)  # count 0: no-op
    h = host(64)
    dev.memset(h, 64, 7, 64)
    assert ctypes.string_at(h, 64) == b"\x07" * 64
    with unchanged(dev), raises_acl(InvalidParamError, 107000, match="dst_max"):
        dev.memset(p, 10, 0, 11)


@pytest.mark.parametrize("value", [2**31, -(2**31) - 1, 2**64])
def test_memset_value_out_of_range_is_invalid_param(dev, value):
    p = dev.malloc(16)
    with raises_acl(InvalidParamError, 100000):
        dev.memset(p, 16, value, 16)


def test_memcpy_directions(dev, host):
    a = dev.malloc(1000)
    b = dev.malloc(1000, Policy.NORMAL_ONLY)
    h1, h2 = host(1000), host(1000)
    data = bytes(random.Random(5).randbytes(1000))
    ctypes.memmove(h1, data, 1000)
    dev.memcpy(a, 1000, h1, 1000)  # H2D
    assert dev.read(a, 1000) == data
    dev.memcpy(b, 1000, a, 1000, MemcpyKind.DEVICE_TO_DEVICE)  # D2D
    assert dev.read(b, 1000) == data
    dev.memcpy(h2, 1000, b, 1000, MemcpyKind.DEVICE_TO_HOST)  # D2H
    assert ctypes.string_at(h2, 1000) == data
    ctypes.memset(h2, 0, 1000)
    dev.memcpy(h2 + 10, 990, h1, 500, MemcpyKind.HOST_TO_HOST)  # H2H
    assert ctypes.string_at(h2, 520) == bytes(10) + data[:500] + bytes(10)
    dev.memcpy(a, 1000, a, 1000)  # dst == src: no-op
    assert dev.read(a, 1000) == data
    assert dev.stats()["kind_mismatches"] == 0


def test_memcpy_kind_is_advisory(dev, host):
    d1, d2 = dev.malloc(64), dev.malloc(64)
    h1, h2 = host(64), host(64)
    ctypes.memmove(h1, b"x" * 64, 64)
    cases = [
        # (dst, src, kind, mismatch)
        (d1, h1, MemcpyKind.HOST_TO_DEVICE, 0),
        (d1, h1, MemcpyKind.HOST_TO_BUF_TO_DEVICE, 0),
        (d1, h1, MemcpyKind.DEFAULT, 0),
        (d1, h1, MemcpyKind.DEVICE_TO_HOST, 1),
        (d2, d1, MemcpyKind.DEVICE_TO_DEVICE, 0),
        (d2, d1, MemcpyKind.HOST_TO_HOST, 1),
        (h2, d2, MemcpyKind.DEVICE_TO_HOST, 0),
        (h2, d2, MemcpyKind.HOST_TO_DEVICE, 1),
        (h2, h1, MemcpyKind.HOST_TO_HOST, 0),
        (h2, h1, MemcpyKind.DEVICE_TO_DEVICE, 1),
        (h2, h1, 4, 0),
    ]
    expected = 0
    for dst, src, kind, mismatch in cases:
        dev.memcpy(dst, 64, src, 64, kind)
        expected += mismatch
        assert dev.stats()["kind_mismatches"] == expected, (kind, mismatch)
    assert ctypes.string_at(h2, 64) == b"x" * 64


@pytest.mark.parametrize("kind", [6, 7, 8, 100, 2**32, -1])
def test_memcpy_rejects_kinds_outside_0_to_5(dev, host, kind):
    d, h = dev.malloc(64), host(64)
    with unchanged(dev), raises_acl(InvalidParamError, 100000):
        dev.memcpy(d, 64, h, 64, kind)
    with unchanged(dev), raises_acl(InvalidParamError, 100000):
        dev.memcpy(0, 0, 0, 0, kind)


def test_memcpy_count_zero_is_a_noop(dev):
    with unchanged(dev):
        dev.memcpy(0, 0, 0, 0)
        dev.memcpy(0, 0, 12345, 0, MemcpyKind.HOST_TO_DEVICE)
        dev.memcpy(VA_WINDOW_START, 0, 0, 0)


def test_memcpy_overlapping_is_memmove(dev, host):
    p = dev.malloc(10_000)
    data = bytes(i % 251 for i in range(10_000))
    dev.write(p, data)
    dev.memcpy(p + 1000, 9000, p, 8000)
    assert dev.read(p, 10_000) == data[:1000] + data[:8000] + data[9000:]
    dev.write(p, data)
    dev.memcpy(p, 10_000, p + 1000, 8000)
    assert dev.read(p, 10_000) == data[1000:9000] + data[8000:]
    h = host(100)
    ctypes.memmove(h, bytes(range(100)), 100)
    dev.memcpy(h + 10, 90, h, 50)
    assert ctypes.string_at(h, 100) == bytes(range(10)) + bytes(range(50)) + bytes(range(60, 100))


def test_large_device_to_device_copy(dev):
    # Over 1 MiB: the copy releases the GIL; 2 MiB pages, crossing page boundaries.
    a = dev.malloc(5 * MiB, Policy.HUGE_ONLY)
    b = dev.malloc(5 * MiB, Policy.NORMAL_ONLY)
    data = random.Random(9).randbytes(5 * MiB)
    dev.write(a, data)
    dev.memcpy(b, 5 * MiB, a, 5 * MiB)
    assert dev.read(b, 5 * MiB) == data
    dev.memcpy(a + 1, 5 * MiB - 1, b + 2 * MiB - 7, 3 * MiB)
    assert dev.read(a, 5 * MiB) == data[:1] + data[2 * MiB - 7 : 5 * MiB - 7] + data[3 * MiB + 1 :]


def test_large_overlapping_copy_within_one_allocation(dev):
    a = dev.malloc(6 * MiB, Policy.HUGE_ONLY)
    data = random.Random(10).randbytes(6 * MiB)
    dev.write(a, data)
    dev.memcpy(a + 3, 6 * MiB - 3, a, 4 * MiB)  # forward overlap, over 1 MiB
    assert dev.read(a, 6 * MiB) == data[:3] + data[: 4 * MiB] + data[4 * MiB + 3 :]
    dev.write(a, data)
    dev.memcpy(a, 6 * MiB, a + 2 * MiB + 1, 4 * MiB - 1)  # backward overlap, across huge pages
    assert dev.read(a, 6 * MiB) == data[2 * MiB + 1 :] + data[4 * MiB - 1 :]


def test_empty_cache_is_a_noop_for_the_direct_allocator(dev):
    p = dev.malloc(100)
    with unchanged(dev):
        dev.empty_cache()
    dev.free(p)
    with unchanged(dev):
        dev.empty_cache()


def test_concurrent_malloc_and_free():
    import threading

    # Room for every thread's worst case (up to 150 live blocks of 2 MiB each), so that no
    # interleaving of the threads runs it out of 2 MiB frames.
    d = Device("2GiB", allocator="direct")
    fs0 = held_memory(d)
    seen: list[tuple[int, int]] = []
    lock = threading.Lock()

    def worker(seed: int):
        rng = random.Random(seed)
        mine = []
        for _ in range(150):
            if mine and rng.random() < 0.4:
                p, tag = mine.pop(rng.randrange(len(mine)))
                assert d.read(p, 8) == tag
                d.free(p)
            else:
                size = rng.choice([64, 4000, 70 * KiB, MiB + 1])
                p = d.malloc(size, rng.choice(NON_GIANT_POLICIES))
                tag = rng.randbytes(8)
                d.write(p, tag)
                mine.append((p, tag))
                with lock:
                    seen.append((p, d.allocation(p)["granted"]))
        for p, tag in mine:
            assert d.read(p, 8) == tag
            d.free(p)

    errors = run_in_threads(worker, 4)
    assert errors == []
    assert d.allocations() == []
    assert held_memory(d) == fs0
    if d.backend == "sim":
        assert d.page_table_stats() == EMPTY_PAGE_TABLE
    s = d.stats()
    assert s["mallocs"] == s["frees"] == len(seen)


# --------------------------------------------------------------------------------------------
# Host memory
# --------------------------------------------------------------------------------------------


def test_malloc_host_is_real_memory(dev):
    sizes = [1, 63, 64, 100, 4096, 3 * MiB]
    ptrs = [dev.malloc_host(s) for s in sizes]
    for p, s in zip(ptrs, sizes, strict=True):
        assert p % 64 == 0
        assert not (VA_WINDOW_START <= p < VA_WINDOW_END)
        assert ctypes.string_at(p, s) == bytes(s)  # zero-initialised
    spans = sorted((p, p + s) for p, s in zip(ptrs, sizes, strict=True))
    for (_, end), (start, _) in itertools.pairwise(spans):
        assert end <= start
    s = dev.stats()
    assert (s["host_live_bytes"], s["host_live_count"]) == (sum(sizes), len(sizes))
    h = ptrs[3]
    ctypes.memmove(h, b"from ctypes", 11)
    assert dev.read(h, 11) == b"from ctypes"
    dev.write(h + 20, b"from npumem")
    assert ctypes.string_at(h + 20, 11) == b"from npumem"
    d = dev.malloc(100)
    dev.memcpy(d, 100, h, 31)
    assert dev.read(d, 31) == ctypes.string_at(h, 31)
    big = ptrs[-1]
    payload = random.Random(2).randbytes(3 * MiB)
    ctypes.memmove(big, payload, len(payload))
    dd = dev.malloc(3 * MiB)
    dev.memcpy(dd, 3 * MiB, big, 3 * MiB)
    ctypes.memset(big, 0, 3 * MiB)
    dev.memcpy(big, 3 * MiB, dd, 3 * MiB)
    assert ctypes.string_at(big, 3 * MiB) == payload
    for p in ptrs:
        dev.free_host(p)
    s = dev.stats()
    assert (s["host_live_bytes"], s["host_live_count"]) == (0, 0)


def test_host_errors(dev, host):
    h = host(256)
    d = dev.malloc(100)
    with unchanged(dev):
        with raises_acl(InvalidParamError, 100000, match="NULL"):
            dev.free_host(0)
        for bad in (h + 64, d, 4096):
            with raises_acl(MemoryFreeError, 207002):
                dev.free_host(bad)
        with raises_acl(MemoryFreeError, 207002):
            dev.free(h)
        for size in (0, -1, 2**64, 2**63):
            with raises_acl(InvalidParamError, 100000):
                dev.malloc_host(size)
        with raises_acl(InvalidParamError, 107000, match="past the end"):
            dev.memcpy(h + 200, 100, d, 57)
        with raises_acl(InvalidParamError, 107000, match="past the end"):
            dev.write(h + 255, b"ab")
    dev.free_host(h)
    with raises_acl(MemoryFreeError, 207002):
        dev.free_host(h)
    # Freed host memory is no longer accepted: npumem never touches memory it does not own.
    with raises_acl(InvalidParamError, 107000, match="malloc_host"):
        dev.memcpy(d, 100, h, 10)
    with raises_acl(InvalidParamError, 107000, match="malloc_host"):
        dev.read(h, 1)


def test_host_buffers_survive_the_device():
    d = Device("16MiB", allocator="direct")
    h = d.malloc_host(100)
    ctypes.memmove(h, b"abc", 3)
    assert d.read(h, 3) == b"abc"
    del d  # the heap frees its blocks; nothing to check but that nothing crashes


# --------------------------------------------------------------------------------------------
# Model-based state machine
# --------------------------------------------------------------------------------------------

# 8 MiB that 2 MiB pages can use plus a 1.5 MiB tail that only normal pages can: HUGE_FIRST falls
# back to the tail once the huge frames are gone.
SM_CAPACITY = 9 * MiB + 512 * KiB
SM_POLICIES = [
    Policy.HUGE_FIRST,
    Policy.HUGE_ONLY,
    Policy.NORMAL_ONLY,
    Policy.HUGE_FIRST_P2P,
    Policy.HUGE_ONLY_P2P,
    Policy.NORMAL_ONLY_P2P,
]


class DeviceMachine(RuleBasedStateMachine):
    """Random mallocs, frees, writes, reads and copies against a Python model of the device."""

    @initialize()
    def setup(self):
        self.d = Device(SM_CAPACITY, allocator="direct")
        self.frames0 = self.d.frame_stats()
        self.model: dict[int, dict] = {}
        self.data: dict[int, bytearray] = {}
        self.freed: set[int] = set()
        self.fallbacks = 0
        self.peak = 0

    def _pick(self, data) -> int | None:
        """A live pointer, or None when nothing is live (rules then do nothing)."""
        if not self.model:
            return None
        return data.draw(st.sampled_from(sorted(self.model)))

    def _pick_range(self, data) -> tuple[int, int, int] | None:
        """A live pointer, an offset into it and a length of at most 64 KiB that stays inside."""
        ptr = self._pick(data)
        if ptr is None:
            return None
        size = self.model[ptr]["size"]
        off = data.draw(st.integers(0, size - 1))
        return ptr, off, data.draw(st.integers(1, min(size - off, 64 * KiB)))

    @rule(
        size=st.one_of(
            st.integers(1, 8 * KiB),
            st.integers(MiB - 2, MiB + 2),
            st.integers(MiB + 1, MiB + 400 * KiB),
            st.integers(1, 3 * MiB),
        ),
        policy=st.sampled_from(SM_POLICIES),
        padded=st.booleans(),
        fill=st.integers(0, 255),
    )
    def malloc(self, size, policy, padded, fill):
        d = self.d
        b = booked(size, policy, padded=padded)
        normal_free = d.mem_info(MemAttr.HBM_NORMAL)[0]
        huge_free = d.mem_info(MemAttr.HBM_HUGE)[0]
        base = policy % 3
        if base == Policy.NORMAL_ONLY or (base == Policy.HUGE_FIRST and size <= MiB):
            plan = [4 * KiB]
        elif base == Policy.HUGE_ONLY:
            plan = [2 * MiB]
        else:
            plan = [2 * MiB, 4 * KiB]
        expected = None
        for page in plan:
            if align_up(b, page) <= (huge_free if page == 2 * MiB else normal_free):
                expected = page
                break
        call = d.malloc if padded else d.malloc_align32
        if expected is None:
            event("malloc: out of memory")
            with unchanged(d, failed_mallocs=1), raises_acl(OutOfMemoryError, 207001):
                call(size, policy)
            return
        ptr = call(size, policy)
        granted = align_up(b, expected)
        a = d.allocation(ptr)
        assert a == {
            "ptr": ptr,
            "size": size,
            "booked": b,
            "granted": granted,
            "policy": int(policy),
            "page_size": expected,
            "stream": 0,
        }
        assert VA_WINDOW_START <= ptr < ptr + granted <= VA_WINDOW_END
        assert ptr % 64 == 0
        for other in self.model.values():
            assert ptr + granted <= other["ptr"] or other["ptr"] + other["granted"] <= ptr
        if base == Policy.HUGE_FIRST and size > MiB and expected == 4 * KiB:
            self.fallbacks += 1
            event("malloc: HUGE_FIRST fell back to normal pages")
        event(f"malloc: {expected // KiB} KiB pages")
        self.model[ptr] = a
        d.memset(ptr, size, fill, size)
        self.data[ptr] = bytearray([fill]) * size
        self.freed.discard(ptr)
        self.peak = max(self.peak, sum(m["granted"] for m in self.model.values()))

    @rule(fill=st.integers(0, 255))
    def take_every_huge_frame(self, fill):
        """One HUGE_ONLY allocation of all free 2 MiB frames: later HUGE_FIRST requests fall back."""
        huge_free = self.d.mem_info(MemAttr.HBM_HUGE)[0]
        if huge_free:
            self.malloc(huge_free, Policy.HUGE_ONLY, False, fill)

    @rule(size=st.integers(MiB + 1, MiB + 400 * KiB), p2p=st.booleans())
    def huge_first_medium(self, size, p2p):
        """A HUGE_FIRST request just over 1 MiB: 2 MiB pages, or the normal-page fallback."""
        self.malloc(size, Policy.HUGE_FIRST_P2P if p2p else Policy.HUGE_FIRST, True, 0x3C)

    @rule(data=st.data())
    def free(self, data):
        ptr = self._pick(data)
        if ptr is None:
            return
        self.d.free(ptr)
        del self.model[ptr], self.data[ptr]
        self.freed.add(ptr)

    @rule(data=st.data())
    def double_free(self, data):
        dead = sorted(self.freed - set(self.model))
        if not dead:
            return
        ptr = data.draw(st.sampled_from(dead))
        inside = any(m["ptr"] <= ptr < m["ptr"] + m["granted"] for m in self.model.values())
        with unchanged(self.d), raises_acl(MemoryFreeError, 207002) as info:
            self.d.free(ptr)
        if not inside:
            assert "double free" in info.value.message

    @rule(data=st.data(), seed=st.integers(0, 2**32))
    def write(self, data, seed):
        picked = self._pick_range(data)
        if picked is None:
            return
        ptr, off, n = picked
        payload = random.Random(seed).randbytes(n)
        self.d.write(ptr + off, payload)
        self.data[ptr][off : off + n] = payload

    @rule(data=st.data())
    def read(self, data):
        picked = self._pick_range(data)
        if picked is None:
            return
        ptr, off, n = picked
        assert self.d.read(ptr + off, n) == bytes(self.data[ptr][off : off + n])

    @rule(data=st.data())
    def copy(self, data):
        src, dst = self._pick(data), self._pick(data)
        if src is None:
            return
        ssize, dsize = self.model[src]["size"], self.model[dst]["size"]
        so = data.draw(st.integers(0, ssize - 1))
        do = data.draw(st.integers(0, dsize - 1))
        n = data.draw(st.integers(1, min(ssize - so, dsize - do, 64 * KiB)))
        self.d.memcpy(dst + do, dsize - do, src + so, n)
        chunk = bytes(self.data[src][so : so + n])
        self.data[dst][do : do + n] = chunk

    @rule(data=st.data(), extra=st.integers(1, 5000))
    def write_past_the_end(self, data, extra):
        ptr = self._pick(data)
        if ptr is None:
            return
        size = self.model[ptr]["size"]
        # Start inside the block: a write that starts at its end may start the next allocation
        # (an unpadded block of whole pages has its neighbour right there), which is valid.
        off = data.draw(st.integers(0, size - 1))
        with unchanged(self.d), raises_acl(InvalidParamError, 107000):
            self.d.write(ptr + off, b"\xa5" * (size - off + extra))

    @invariant()
    def matches_model(self):
        d = self.d
        granted = sum(m["granted"] for m in self.model.values())
        assert d.allocations() == [self.model[p] for p in sorted(self.model)]
        s = d.stats()
        assert s["live_count"] == len(self.model)
        assert s["live_requested"] == sum(m["size"] for m in self.model.values())
        assert s["live_granted"] == granted
        assert s["peak_granted"] == self.peak
        assert s["huge_fallbacks"] == self.fallbacks
        assert d.mem_info() == (SM_CAPACITY - granted, SM_CAPACITY)
        assert d.page_table_stats()["mapped_bytes"] == granted

    def teardown(self):
        if not hasattr(self, "d"):
            return
        for ptr in list(self.model):
            self.d.free(ptr)
        assert self.d.frame_stats() == self.frames0
        assert self.d.page_table_stats() == EMPTY_PAGE_TABLE
        assert self.d.mem_info() == (SM_CAPACITY, SM_CAPACITY)


DeviceMachine.TestCase.settings = settings(max_examples=40, stateful_step_count=40, deadline=None)
TestDeviceMachine = DeviceMachine.TestCase


def test_snapshot_helper_sees_changes(dev):
    """The ``unchanged`` helper used throughout must notice a real change."""
    before = snapshot(dev)
    dev.free(dev.malloc(100))
    assert snapshot(dev) != before
