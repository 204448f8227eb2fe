"""The CUDA backend on a real GPU (`make bench B=gpu` runs it after the GPU tests; with
``NPUMEM_BACKEND=acl`` the AscendCL backend on an Ascend NPU, against aclrtMalloc/aclrtFree).

Cases, each one malloc + free pair called from Python:

- ``Device(backend="cuda", allocator=...)`` for ``npumem`` (the VMM pool: pages stay mapped),
  ``pytorch`` (the caching allocator) and ``direct`` (no cache: cuMemCreate + cuMemMap +
  cuMemSetAccess at malloc, cuMemUnmap + cuMemRelease at free);
- ``cuMemAlloc`` + ``cuMemFree`` called directly through ctypes (what a framework without a
  caching allocator pays), and the ctypes floor (two calls of ``cuCtxGetCurrent``);

at 512 B, 64 KiB, 2 MiB and 32 MiB. Then the VMM map cost by page (allocation) size: mapping
and unmapping 512 MiB as physical allocations of 2 MiB, 32 MiB and 512 MiB (the device's own
``reserve_mem_address`` / ``malloc_physical`` / ``map_mem`` calls, straight to the driver).

It needs the real driver: ``libcuda.so.1`` from the loader path (``libascendcl.so`` from
``$ASCEND_HOME_PATH/lib64`` or the loader path) and a device. Without one it prints one line
saying why and exits 0 (``--probe``: prints only the reason, nothing when a device is there).
Timing: interleaved rounds, best of each (``npumem._timing.best_of``).

Run: make bench B=gpu   (or: .venv/bin/python benches/bench_gpu.py [--quick] [--probe])
"""

from __future__ import annotations

import argparse
import ctypes
import os
import sys

import npumem
from npumem import MemAttr
from npumem._timing import best_of, calls_for

KiB, MiB = 1 << 10, 1 << 20


#: The backend measured: "cuda" (default) or "acl" (NPUMEM_BACKEND).
BACKEND = os.environ.get("NPUMEM_BACKEND") or "cuda"


class Runtime:
    """The vendor runtime loaded with ctypes: its own malloc/free, for the baseline."""

    def __init__(self, lib: ctypes.CDLL, backend: str):
        self.lib, self.backend = lib, backend
        self.ptr = ctypes.c_uint64()
        if backend == "cuda":
            ctx = ctypes.c_void_p()
            assert lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0) == 0
            assert lib.cuCtxSetCurrent(ctx) == 0
            lib.cuMemAlloc_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t]
            lib.cuMemFree_v2.argtypes = [ctypes.c_uint64]
        else:
            assert lib.aclrtSetDevice(0) == 0
            lib.aclrtMalloc.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t, ctypes.c_int]
            lib.aclrtFree.argtypes = [ctypes.c_uint64]

    def malloc_free(self, size: int) -> None:
        if self.backend == "cuda":
            assert self.lib.cuMemAlloc_v2(ctypes.byref(self.ptr), size) == 0
            assert self.lib.cuMemFree_v2(self.ptr.value) == 0
        else:
            assert self.lib.aclrtMalloc(ctypes.byref(self.ptr), size, 0) == 0  # ACL_MEM_MALLOC_HUGE_FIRST
            assert self.lib.aclrtFree(self.ptr.value) == 0

    @property
    def name(self) -> str:
        return "cuMemAlloc" if self.backend == "cuda" else "aclrtMalloc"


def device_or_reason() -> tuple[Runtime | None, str]:
    """The real runtime with a device, or why not."""
    if BACKEND not in ("cuda", "acl"):
        return None, f"NPUMEM_BACKEND={BACKEND!r}: bench B=gpu measures 'cuda' (the default) or 'acl'"
    if BACKEND == "cuda":
        names = ["libcuda.so.1"]
    else:
        home = os.environ.get("ASCEND_HOME_PATH")
        names = ([f"{home}/lib64/libascendcl.so"] if home else []) + ["libascendcl.so"]
    lib, errors = None, []
    for name in names:
        try:
            lib = ctypes.CDLL(name)
            break
        except OSError as e:
            errors.append(str(e))
    if lib is None:
        return None, f"no {BACKEND} runtime ({'; '.join(errors)})"
    count = ctypes.c_int(0)
    if BACKEND == "cuda":
        if lib.cuInit(0) != 0:
            return None, "the CUDA driver loads but cuInit fails (no GPU, or the driver is not usable)"
        if lib.cuDeviceGetCount(ctypes.byref(count)) != 0 or count.value == 0:
            return None, "the CUDA driver reports no GPU"
    else:
        ret = lib.aclInit(None)
        if ret not in (0, 100002):
            return None, f"AscendCL loads but aclInit fails ({ret})"
        if lib.aclrtGetDeviceCount(ctypes.byref(count)) != 0 or count.value == 0:
            return None, "AscendCL reports no NPU"
    return Runtime(lib, BACKEND), ""


def fmt(size: int) -> str:
    return f"{size // MiB} MiB" if size >= MiB else f"{size // KiB} KiB" if size >= KiB else f"{size} B"


def bench_malloc(rt: Runtime, sizes: list[int], seconds: float) -> dict[int, dict[str, float]]:
    families = ("npumem", "pytorch", "direct")
    devices = {f: npumem.Device("4GiB", backend=BACKEND, allocator=f) for f in families}
    heads = (*families, rt.name)
    out: dict[int, dict[str, float]] = {}
    print(f"malloc + free pairs on {BACKEND} (us per pair)")
    print(f"{'size':>8} " + " ".join(f"{c:>12}" for c in heads))
    for size in sizes:
        cases = {family: (lambda d=d, size=size: d.free(d.malloc(size))) for family, d in devices.items()}
        cases[rt.name] = lambda size=size: rt.malloc_free(size)
        n = {name: calls_for(fn, seconds) for name, fn in cases.items()}
        t = best_of(cases, n)
        print(f"{fmt(size):>8} " + " ".join(f"{t[c] * 1e6:>12.2f}" for c in cases))
        out[size] = t
    return out


def bench_map(pages: list[int], total: int) -> dict[int, float]:
    d = npumem.Device("4GiB", backend=BACKEND, allocator="direct")
    print(f"\nmap + unmap of {fmt(total)} by physical allocation size (ms; us per allocation)")
    out: dict[int, float] = {}
    for page in pages:
        va = d.reserve_mem_address(total)
        handles = [d.malloc_physical(page, MemAttr.HBM_HUGE) for _ in range(total // page)]

        def cycle(va=va, handles=handles, page=page):
            for i, h in enumerate(handles):
                d.map_mem(va + i * page, h)
            for i in range(len(handles)):
                d.unmap_mem(va + i * page)

        t = best_of({"cycle": cycle}, 1, rounds=3)["cycle"]
        print(f"{fmt(page):>8}: {t * 1e3:8.2f} ms  ({t / len(handles) * 1e6:8.1f} us per allocation)")
        out[page] = t
        for h in handles:
            d.free_physical(h)
        d.release_mem_address(va)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="shorter rounds")
    p.add_argument("--probe", action="store_true", help="print why no device can be measured (nothing if one can)")
    args = p.parse_args()
    rt, reason = device_or_reason()
    if args.probe:
        if reason:
            print(reason)
        return 0
    if rt is None:
        print(f"bench-gpu: skipped: {reason}")
        return 0
    seconds = 0.02 if args.quick else 0.1
    pairs = bench_malloc(rt, [512, 64 * KiB, 2 * MiB, 32 * MiB], seconds)
    maps = bench_map([2 * MiB, 32 * MiB, 512 * MiB], 512 * MiB)
    at = pairs[2 * MiB]
    ours, theirs = at["npumem"], at[rt.name]
    print(
        f"summary: 2 MiB malloc+free npumem {ours * 1e6:.2f} us, {rt.name} {theirs * 1e6:.2f} us "
        f"({theirs / ours:.1f}x); map+unmap of 512 MiB in 2 MiB pages {maps[2 * MiB] * 1e3:.1f} ms, "
        f"in one 512 MiB allocation {maps[512 * MiB] * 1e3:.1f} ms"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
