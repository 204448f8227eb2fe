"""Shared helpers for the npumem test suite: sizes, small devices, state snapshots, error checks."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, settings

import npumem
from npumem import MemAttr

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30

#: The AscendCL constant name of every code the Python surface raises.
CODE_NAMES = {
    100000: "ACL_ERROR_INVALID_PARAM",
    107000: "ACL_ERROR_RT_PARAM_INVALID",
    107008: "ACL_ERROR_RT_ADDR_UNALIGNED",
    107017: "ACL_ERROR_RT_INVALID_HANDLE",
    200006: "ACL_ERROR_FEATURE_UNSUPPORTED",
    207001: "ACL_ERROR_RT_MEMORY_ALLOCATION",
    207002: "ACL_ERROR_RT_MEMORY_FREE",
    507899: "ACL_ERROR_RT_DRV_INTERNAL_ERROR",
}

settings.register_profile(
    "npumem",
    max_examples=int(os.environ.get("NPUMEM_HYPOTHESIS_EXAMPLES", "40")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    # CI replays the same examples every run (reproducible); local runs keep exploring.
    derandomize=os.environ.get("CI") == "true",
)
settings.load_profile("npumem")


def run_in_threads(worker: Callable[[int], object], n: int) -> list[BaseException]:
    """Runs ``worker(i)`` for ``i`` in ``range(n)`` on ``n`` threads at once; returns what they raised."""
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            worker(i)
        except BaseException as e:  # handed back to the test
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


def align_up(value: int, align: int) -> int:
    return (value + align - 1) // align * align


def booked(size: int, policy: int = npumem.Policy.HUGE_FIRST, *, padded: bool = True) -> int:
    """What the runtime books: align_up(size, 32) + 32; no pad for malloc_align32 and HUGE1G."""
    huge1g = policy in (npumem.Policy.HUGE1G_ONLY, npumem.Policy.HUGE1G_ONLY_P2P)
    return align_up(size, 32) + (32 if padded and not huge1g else 0)


def snapshot(dev: npumem.Device) -> dict:
    """Everything observable about a device's state (the counter of failed mallocs aside)."""
    stats = dev.stats()
    stats.pop("failed_mallocs")
    return {
        "mem_info": {attr: dev.mem_info(attr) for attr in MemAttr},
        "frames": dev.frame_stats(),
        "page_table": dev.page_table_stats(),
        "stats": stats,
        "allocations": dev.allocations(),
    }


@contextlib.contextmanager
def raises_acl(cls: type[npumem.AclError], code: int, match: str | None = None):
    """Like ``pytest.raises`` for an AclError subclass, also checking code, name and message."""
    with pytest.raises(cls, match=match) as info:
        yield info
    err = info.value
    assert type(err) is cls, f"expected exactly {cls.__name__}, got {type(err).__name__}"
    assert err.code == code, str(err)
    assert err.name == CODE_NAMES[code]
    assert isinstance(err.message, str) and len(err.message) > 10
    assert str(err) == f"{err.name} ({err.code}): {err.message}"


@contextlib.contextmanager
def unchanged(dev: npumem.Device, *, failed_mallocs: int = 0):
    """Asserts that the block leaves the device's state exactly as it was."""
    before = snapshot(dev)
    failed = dev.stats()["failed_mallocs"]
    yield
    assert snapshot(dev) == before
    assert dev.stats()["failed_mallocs"] == failed + failed_mallocs


def fragment(d: npumem.Device) -> set[int]:
    """Fills ``d`` with 4 KiB NORMAL_ONLY allocations, then frees all but one per 2 MiB frame."""
    ptrs = []
    while True:
        try:
            ptrs.append(d.malloc(4096 - 64, npumem.Policy.NORMAL_ONLY))
        except npumem.OutOfMemoryError:
            break
    assert len(ptrs) == d.capacity // 4096
    assert d.mem_info() == (0, d.capacity)
    keep: dict[int, int] = {}
    for p in ptrs:
        keep.setdefault(d.translate(p)[0] // (2 * MiB), p)
    kept = set(keep.values())
    assert len(kept) == d.capacity // (2 * MiB)
    for p in ptrs:
        if p not in kept:
            d.free(p)
    return kept


@pytest.fixture
def dev() -> npumem.Device:
    """A small, fresh device with 4 KiB normal pages."""
    return npumem.Device("64MiB", allocator="direct")


@pytest.fixture
def host(dev):
    """A factory of malloc_host buffers on ``dev``, freed at teardown."""
    live: list[int] = []

    def make(size: int) -> int:
        ptr = dev.malloc_host(size)
        live.append(ptr)
        return ptr

    yield make
    for ptr in live:
        with contextlib.suppress(npumem.MemoryFreeError):
            dev.free_host(ptr)
