"""A malloc policy's page promise holds on every path: random programs of mallocs (single, batch,
on streams), frees (plain and stream-ordered), ``empty_cache`` and ``trim_to`` under every
policy and every allocator family, on a fragmented device, checking after each step that every
live block's pages are what its policy promises and what ``allocation()`` reports.

The promise (``npumem`` and ``direct`` honour every policy; ``pytorch`` and ``torch_npu`` map
every segment with HUGE_FIRST, so they refuse the others with ACL_ERROR_FEATURE_UNSUPPORTED):
HUGE_ONLY: only 2 MiB pages; HUGE1G_ONLY: only 1 GiB pages; NORMAL_ONLY: only normal pages;
HUGE_FIRST: any pages, reported honestly (the smallest under the block)."""

from __future__ import annotations

import random

import numpy as np
import pytest
from conftest import raises_acl
from hypothesis import given
from hypothesis import strategies as st

import npumem
from npumem import Policy

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30

CONFIGS = [
    ("npumem", ""),
    ("npumem", "large_threshold_mb:8"),  # bypass segments at test sizes
    ("direct", ""),
    ("pytorch", ""),
    ("torch_npu", ""),
    ("torch_npu", "page_size:1g"),
]
HONOURS_EVERY_POLICY = {"npumem", "direct"}


def page_sizes(dev: npumem.Device, ptr: int, size: int) -> set[int]:
    """The page sizes under ``[ptr, ptr + size)``: one translation per 2 MiB window of VA is
    enough, since a 2 MiB (or 1 GiB) page covers its whole aligned window, and normal pages of
    one device all have the device's normal page size."""
    sizes = set()
    at = ptr
    while at < ptr + size:
        page = dev.translate(at)[1]
        sizes.add(page)
        window = max(page, 2 * MiB)
        at = (at // window + 1) * window
    return sizes


#: Each policy's base policy (the P2P flag dropped).
BASE = {p: Policy(int(p) if int(p) in (0, 1, 2, 6) else {3: 0, 4: 1, 5: 2, 7: 6}[int(p)]) for p in Policy}


def promised(policy: int, page: int) -> bool:
    base = BASE[Policy(policy)]
    if base == Policy.HUGE_ONLY:
        return page == 2 * MiB
    if base == Policy.HUGE1G_ONLY:
        return page == GiB
    if base == Policy.NORMAL_ONLY:
        return page < 2 * MiB
    return True


def check_every_block(dev: npumem.Device) -> None:
    for a in dev.allocations():
        pages = page_sizes(dev, a["ptr"], a["size"])
        for page in pages:
            assert promised(a["policy"], page), f"{Policy(a['policy']).name} block on {page}-byte pages: {a}"
        assert a["page_size"] == min(pages), f"reports {a['page_size']}, maps {sorted(pages)}: {a}"


def fragmented(allocator: str, alloc_conf: str, seed: int) -> npumem.Device:
    """A device (256 MiB of frames and one giant frame) whose frames are half fragmented: 128 MiB
    filled with 4 KiB blocks, 97% of them freed, the cache emptied (the survivors pin scattered
    frames, so 2 MiB frames run out halfway)."""
    dev = npumem.Device("1280MiB", giant_frames=1, allocator=allocator, alloc_conf=alloc_conf or None)
    policy = Policy.NORMAL_ONLY if allocator in HONOURS_EVERY_POLICY else Policy.HUGE_FIRST
    ptrs = dev.malloc_many(np.full(128 * MiB // 4096, 4096 - 64, dtype=np.uint64), policy)
    rng = np.random.default_rng(seed)
    keep = rng.random(len(ptrs)) < 0.03
    dev.free_many(ptrs[~keep])
    dev.empty_cache()
    return dev


POLICIES = st.sampled_from(list(Policy))
SIZES = st.one_of(
    st.integers(1, MiB),
    st.integers(MiB + 1, 16 * MiB),
    st.integers(16 * MiB, 64 * MiB),
)
OPS = st.one_of(
    st.tuples(st.just("malloc"), SIZES, POLICIES, st.sampled_from([None, 1, 2]), st.booleans()),
    st.tuples(st.just("malloc_many"), st.lists(SIZES, min_size=1, max_size=4), POLICIES),
    st.tuples(st.just("free"), st.integers(0, 1 << 16), st.sampled_from([None, None, 1, 2])),
    st.tuples(st.just("empty_cache")),
    st.tuples(st.just("trim_to"), st.integers(0, 512 * MiB)),
    st.tuples(st.just("launch"), st.integers(0, 1 << 16), st.sampled_from([1, 2])),
    st.tuples(st.just("synchronize")),
)


@pytest.mark.parametrize(("allocator", "alloc_conf"), CONFIGS)
@given(ops=st.lists(OPS, min_size=1, max_size=30), seed=st.integers(0, 2**32 - 1))
def test_every_live_block_keeps_its_policys_page_promise(allocator, alloc_conf, ops, seed):
    dev = fragmented(allocator, alloc_conf, seed)
    streams = {1: dev.create_stream(), 2: dev.create_stream()}
    live: list[int] = []
    for op in ops:
        kind = op[0]
        if kind in ("malloc", "malloc_many"):
            policy = op[2]
            refused = allocator not in HONOURS_EVERY_POLICY and BASE[policy] != Policy.HUGE_FIRST
            try:
                if kind == "malloc":
                    _, size, _, stream, align32 = op
                    call = dev.malloc_align32 if align32 else dev.malloc
                    stream = streams.get(stream) if stream else None
                    if refused:
                        with raises_acl(npumem.UnsupportedError, 200006, match="HUGE_FIRST"):
                            call(size, policy, stream=stream)
                        continue
                    live.append(call(size, policy, stream=stream))
                else:
                    sizes = np.array(op[1], dtype=np.uint64)
                    if refused:
                        with pytest.raises(npumem.UnsupportedError):
                            dev.malloc_many(sizes, policy)
                        continue
                    live.extend(int(p) for p in dev.malloc_many(sizes, policy))
            except npumem.OutOfMemoryError:
                pass
        elif kind == "free" and live:
            ptr = live.pop(op[1] % len(live))
            dev.free(ptr, stream=streams.get(op[2]) if op[2] else None)
        elif kind == "launch" and live:
            dev.launch(streams[op[2]], 50.0, writes=[live[op[1] % len(live)]])
        elif kind == "empty_cache":
            dev.empty_cache()
        elif kind == "trim_to":
            dev.trim_to(op[1])
        elif kind == "synchronize":
            dev.synchronize_device()
        check_every_block(dev)
    random.Random(seed).shuffle(live)
    for ptr in live:
        dev.free(ptr)
    dev.synchronize_device()
    check_every_block(dev)


def test_huge_only_never_reuses_a_fallback_block():
    """The reproduction: HUGE_FIRST falls back to 4 KiB pages on a fragmented device; after its
    free, HUGE_ONLY must not be handed those pages (it gets 2 MiB pages or 207001)."""
    dev = npumem.Device("1GiB")
    ptrs = dev.malloc_many(np.full(GiB // 4096, 4096 - 64, dtype=np.uint64), Policy.NORMAL_ONLY)
    # One live 4 KiB block per 2 MiB frame: no 2 MiB frame can form.
    frames = {}
    for p in ptrs:
        frames.setdefault(dev.translate(int(p))[0] // (2 * MiB), int(p))
    keep = set(frames.values())
    dev.free_many(np.array([p for p in ptrs if int(p) not in keep], dtype=np.uint64))
    a = dev.malloc(64 * MiB, Policy.HUGE_FIRST)
    assert dev.allocation(a)["page_size"] == 4096
    dev.free(a)
    with raises_acl(npumem.OutOfMemoryError, 207001, match="HUGE_ONLY"):
        dev.malloc(64 * MiB, Policy.HUGE_ONLY)
    check_every_block(dev)
    # Once frames re-form, HUGE_ONLY gets 2 MiB pages at the same sizes.
    dev.free_many(np.array(sorted(keep), dtype=np.uint64))
    b = dev.malloc(64 * MiB, Policy.HUGE_ONLY)
    assert page_sizes(dev, b, 64 * MiB) == {2 * MiB}
    check_every_block(dev)


@pytest.mark.parametrize("allocator", ["pytorch", "torch_npu"])
@pytest.mark.parametrize("policy", [p for p in Policy if BASE[p] != Policy.HUGE_FIRST])
def test_caching_families_refuse_the_policies_they_cannot_keep(allocator, policy):
    dev = npumem.Device("4GiB", giant_frames=1, allocator=allocator)
    before = (dev.memory_stats(), dev.allocations(), dev.stats())
    with raises_acl(npumem.UnsupportedError, 200006, match="HUGE_FIRST"):
        dev.malloc(4 * MiB, policy)
    assert (dev.memory_stats(), dev.allocations(), dev.stats()) == before
    p = dev.malloc(4 * MiB, Policy.HUGE_FIRST_P2P)
    assert dev.allocation(p)["page_size"] == 2 * MiB
