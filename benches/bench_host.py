"""Allocation on real memory. Pooled malloc+free on the host backend against a fresh
mapping per call, glibc malloc and numpy, at 4 KiB, 1 MiB and 64 MiB.

Cases (one malloc + free pair each, called from Python):

- ``Device(backend="host", allocator=...)`` for each family: ``npumem`` (the VMM pool, pages kept
  mapped), ``pytorch`` and ``torch_npu`` (caching allocators), and ``direct`` (no cache: every
  call is a memfd + fallocate + mmap, and an unmap + close at free: the baseline);
- a fresh anonymous ``mmap`` + ``munmap`` per call, through Python's ``mmap`` module and through
  ctypes on libc (the seed's "every tensor allocation triggers its own device allocation", with
  real system calls); the ctypes floor (two calls of libc ``labs``) separates the binding's cost
  from the kernel's;
- glibc ``malloc`` + ``free`` (ctypes), and ``np.empty``.

Device mallocs use NORMAL_ONLY (4 KiB pages, as the mmap and malloc cases get; ``--huge-first``
for the default policy) where the family honours it; pytorch and torch_npu map every segment
HUGE_FIRST (2 MiB pages when the kernel's hugetlb pool has free ones).

Each case runs untouched and "touched": after the allocation one byte per 4 KiB page is written
through a numpy view of the memory, as a tensor's first use does. The pool's reused pages are
already mapped and do not fault; a fresh mapping faults (and the kernel zeroes) every page. The
"view + touch" floors are the same write on memory that stays mapped, through a raw numpy view
(as the mmap, malloc cases) and through the device's ``to_numpy(copy=False)`` (as the host
cases). Timing: interleaved rounds, best of each (``npumem._timing.best_of``), each case called
about 10 ms per round.

Run: make bench B=host   (or: .venv/bin/python benches/bench_host.py [--quick] [--huge-first])
"""

from __future__ import annotations

import os

# numpy's BLAS threads spin on this 2-core machine and steal time from what is measured.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse
import ctypes
import gc
import mmap
from collections.abc import Callable

import numpy as np

import npumem
from npumem import Policy
from npumem._timing import best_of, calls_for
from npumem.units import fmt

PAGE = 4096
FAMILIES = ("npumem", "pytorch", "torch_npu", "direct")
SIZES = (4 << 10, 1 << 20, 64 << 20)

libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
libc.labs.restype = ctypes.c_long
libc.labs.argtypes = [ctypes.c_long]
PROT_RW = mmap.PROT_READ | mmap.PROT_WRITE
MAP_ANON = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
MAP_FAILED = ctypes.c_void_p(-1).value


def view(addr: int, nbytes: int) -> np.ndarray:
    """A numpy uint8 view of ``nbytes`` at ``addr`` (memory the caller owns and keeps alive)."""
    return np.frombuffer((ctypes.c_uint8 * nbytes).from_address(addr), np.uint8)


def touch(a: np.ndarray) -> None:
    a[::PAGE] = 1  # one byte per 4 KiB page


def family_policy(family: str, policy: Policy) -> Policy:
    """The policy a family's mallocs use: pytorch and torch_npu map every segment HUGE_FIRST and
    refuse the others."""
    return policy if family in ("npumem", "direct") else Policy.HUGE_FIRST


def cases_for(
    size: int, touched: bool, devices: dict[str, npumem.Device], policy: Policy
) -> dict[str, Callable[[], object]]:
    cases: dict[str, Callable[[], object]] = {}
    for family, dev in devices.items():
        pol = family_policy(family, policy)
        if touched:

            def pair(dev: npumem.Device = dev, pol: Policy = pol) -> None:
                p = dev.malloc(size, pol)
                touch(dev.to_numpy(p, size, copy=False))
                dev.free(p)

        else:

            def pair(dev: npumem.Device = dev, pol: Policy = pol) -> None:
                dev.free(dev.malloc(size, pol))

        cases[f"host {family}"] = pair

    def py_mmap() -> None:
        m = mmap.mmap(-1, size)
        if touched:
            a = np.frombuffer(m, np.uint8)
            touch(a)
            del a
        m.close()

    def c_mmap() -> None:
        p = libc.mmap(None, size, PROT_RW, MAP_ANON, -1, 0)
        if p == MAP_FAILED:
            raise MemoryError(f"mmap of {size} bytes failed (errno {ctypes.get_errno()})")
        if touched:
            touch(view(p, size))
        libc.munmap(p, size)

    def glibc() -> None:
        p = libc.malloc(size)
        if not p:
            raise MemoryError(f"malloc of {size} bytes failed")
        if touched:
            touch(view(p, size))
        libc.free(p)

    def np_empty() -> None:
        a = np.empty(size, np.uint8)
        if touched:
            touch(a)

    cases["mmap module mmap+munmap"] = py_mmap
    cases["ctypes libc mmap+munmap"] = c_mmap
    cases["glibc malloc+free"] = glibc
    cases["np.empty"] = np_empty
    return cases


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer rounds, shorter runs (a smoke test)")
    ap.add_argument(
        "--huge-first",
        action="store_true",
        help="device mallocs under HUGE_FIRST (2 MiB pages above 1 MiB where the hugetlb pool has them) "
        "instead of NORMAL_ONLY (4 KiB pages, as mmap and malloc)",
    )
    args = ap.parse_args()
    rounds, budget = (2, 0.002) if args.quick else (7, 0.01)
    policy = Policy.HUGE_FIRST if args.huge_first else Policy.NORMAL_ONLY
    gc.disable()
    devices = {f: npumem.Device("2GiB", backend="host", allocator=f) for f in FAMILIES}
    held = np.zeros(max(SIZES), np.uint8)
    touch(held)  # every page mapped: the floor below never faults
    held_at = held.ctypes.data
    pinned = npumem.Device("256MiB", backend="host")
    pinned_at = pinned.malloc(max(SIZES))
    touch(pinned.to_numpy(pinned_at, max(SIZES), copy=False))

    results: dict[tuple[str, int, bool], float] = {}
    pages: dict[tuple[str, int], str] = {}
    floors: dict[tuple[str, int], float] = {}
    for size in SIZES:
        for family, dev in devices.items():
            p = dev.malloc(size, family_policy(family, policy))
            pages[family, size] = fmt(dev.translate(p)[1])
            dev.free(p)
        for touched in (False, True):
            cases = cases_for(size, touched, devices, policy)
            cases["floor: ctypes, two calls"] = lambda: (libc.labs(1), libc.labs(2))
            cases["floor: view + touch, no fault"] = lambda s=size: touch(view(held_at, s))
            cases["floor: to_numpy(copy=False) + touch, no fault"] = lambda s=size: touch(
                pinned.to_numpy(pinned_at, s, copy=False)
            )
            n = {name: calls_for(fn, budget, most=20_000) for name, fn in cases.items()}
            for name, sec in best_of(cases, n, rounds).items():
                if name.startswith("floor"):
                    floors[name, size] = sec
                else:
                    results[name, size, touched] = sec
        print(f"measured {fmt(size)}", flush=True)

    names = sorted({k[0] for k in results}, key=lambda k: list(cases_for(PAGE, False, devices, policy)).index(k))
    print()
    head = ["pair (µs, and x npumem pool)"] + [f"{fmt(s)} {t}" for s in SIZES for t in ("untouched", "touched")]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for name in names:
        cells = []
        for size in SIZES:
            for touched in (False, True):
                us = results[name, size, touched] * 1e6
                ratio = results[name, size, touched] / results["host npumem", size, touched]
                cells.append(f"{us:.2f} ({ratio:.1f}x)")
        print(f"| {name} | " + " | ".join(cells) + " |")
    for floor in sorted({k[0] for k in floors}):
        # the ctypes floor belongs beside the untouched pairs, the view floors beside the touched
        cols = (True, False) if "ctypes" in floor else (False, True)
        cells = [f"{floors[floor, s] * 1e6:.2f}" if c else "" for s in SIZES for c in cols]
        print(f"| {floor} | " + " | ".join(cells) + " |")
    print()
    print(
        f"pages in force on the host backend ({policy.name}; pytorch, torch_npu: HUGE_FIRST): "
        + "; ".join(f"{fmt(s)}: " + ", ".join(f"{f} {pages[f, s]}" for f in FAMILIES) for s in SIZES)
    )
    if policy == Policy.HUGE_FIRST and not devices["npumem"].mem_info(npumem.MemAttr.HBM_HUGE)[0]:
        print("(no free hugetlb pages: HUGE_FIRST fell back to 4 KiB pages; see /proc/sys/vm/nr_hugepages)")

    def goal(size: int, peer: str) -> str:
        return ", ".join(
            f"{'touched' if t else 'untouched'} {results[peer, size, t] / results['host npumem', size, t]:.1f}x"
            for t in (False, True)
        )

    print("\ngoals:")
    for peer in ("mmap module mmap+munmap", "ctypes libc mmap+munmap", "host direct"):
        print(f"  pool vs {peer} at 1 MiB (goal >= 50x): {goal(1 << 20, peer)}")
    print(f"  pool vs glibc malloc at 64 MiB (goal > 1x): {goal(64 << 20, 'glibc malloc+free')}")


if __name__ == "__main__":
    main()
