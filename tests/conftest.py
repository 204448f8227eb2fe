"""Shared helpers for the npumem test suite: sizes, small devices, state snapshots, error checks."""

from __future__ import annotations

import contextlib
import ctypes
import os
import threading
from collections.abc import Callable
from pathlib import Path

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
    """Everything observable about a device's state (the counter of failed mallocs aside; frames
    and the page table where the backend has them)."""
    stats = dev.stats()
    stats.pop("failed_mallocs")
    sim = dev.backend == "sim"
    return {
        "mem_info": {attr: dev.mem_info(attr) for attr in MemAttr},
        "frames": dev.frame_stats() if sim else None,
        "page_table": dev.page_table_stats() if sim else None,
        "stats": stats,
        "allocations": dev.allocations(),
    }


def held_memory(dev: npumem.Device) -> object:
    """What a device holds below its allocator, to compare before and after: the simulator's
    frames (exact buddy state), or on other backends the memory information."""
    return dev.frame_stats() if dev.backend == "sim" else dev.mem_info()


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


# --------------------------------------------------------------------------------------------
# Every backend: a module marked `pytestmark = BOTH_BACKENDS` runs each of its tests on the
# simulator, on real host memory (`backend="host"`) and on the AscendCL and CUDA backends over
# the stand-in runtimes (`backend="acl"`, `backend="cuda"`): `Device` (imported or as
# `npumem.Device`) defaults to the backend of the run. A test of what only the simulator has
# (frames, the page table, its VA window, giant frames, a fragmented buddy) is marked
# `@pytest.mark.sim_only("why")` and skipped on the others with that reason.
# --------------------------------------------------------------------------------------------

BACKENDS = ("sim", "host", "acl", "cuda")
BOTH_BACKENDS = [pytest.mark.usefixtures("npumem_backend")]

#: The stand-in runtimes `make build` puts here (crates/npumem-fake-acl, crates/npumem-fake-cuda).
STAND_INS = Path(__file__).resolve().parent.parent / "target" / "stand-ins"
#: `make bench B=gpu` (NPUMEM_CHECK_GPU=1): tests/test_gpu.py runs on the real runtime, which the
#: stand-ins must not replace.
REAL_DEVICE = os.environ.get("NPUMEM_CHECK_GPU") == "1"
# Otherwise the accelerator backends load the stand-ins in place of AscendCL and the CUDA driver.
# Their normal granularity is 4 KiB here (a real GPU's is 2 MiB; tests of that start their own
# process), so the suite's expectations of 4 KiB normal pages hold on every backend.
if not REAL_DEVICE:
    os.environ["NPUMEM_ACL_LIB"] = str(STAND_INS / "libascendcl.so")
    os.environ["NPUMEM_CUDA_LIB"] = str(STAND_INS / "libcuda.so")
    os.environ["NPUMEM_FAKE_GRANULARITY"] = "4KiB"
for _var in ("NPUMEM_FAKE_CAPACITY", "NPUMEM_FAKE_DELAY_US", "NPUMEM_FAKE_FAIL", "NPUMEM_FAKE_DEVICES"):
    os.environ.pop(_var, None)


class LiveCounts(ctypes.Structure):
    """What a stand-in runtime holds (`npumem_fake_live_counts`)."""

    _fields_ = [
        (name, ctypes.c_uint64)
        for name in (
            "handles",
            "mappings",
            "reservations",
            "streams",
            "events",
            "host_blocks",
            "physical_bytes",
            "faults_fired",
        )
    ]

    def held(self) -> dict[str, int]:
        """Every count but the faults fired."""
        return {name: getattr(self, name) for name, _ in self._fields_ if name != "faults_fired"}


#: Fault kinds of the stand-ins' switch (`npumem_fake_fail_next`).
FAULT_KINDS = {
    "physical": 0,
    "map": 1,
    "reserve": 2,
    "unmap": 3,
    "memcpy": 4,
    "memset": 5,
    "release": 6,
    "free_physical": 7,
    "stream": 8,
    "event": 9,
    "mem_info": 10,
    "host": 11,
}


class StandIn:
    """A stand-in runtime loaded with ctypes: the same library (and state) npumem's backend
    loads, with its test-only calls."""

    def __init__(self, backend: str):
        self.backend = backend
        self.path = STAND_INS / ("libascendcl.so" if backend == "acl" else "libcuda.so")
        if not self.path.exists():
            pytest.fail(f"{self.path} is missing: run `make build` (it builds the stand-in runtimes)")
        self.lib = ctypes.CDLL(str(self.path))
        self.lib.npumem_fake_live_counts.argtypes = [ctypes.POINTER(LiveCounts)]
        self.lib.npumem_fake_fail_next.argtypes = [ctypes.c_uint32, ctypes.c_uint64]
        self.lib.npumem_fake_fail_from.argtypes = [ctypes.c_uint32, ctypes.c_uint64]
        self.lib.npumem_fake_set_delay_us.argtypes = [ctypes.c_uint64]
        self.lib.npumem_fake_set_delay_us.restype = None

    def counts(self) -> LiveCounts:
        out = LiveCounts()
        assert self.lib.npumem_fake_live_counts(ctypes.byref(out)) == 0
        return out

    def fail_next(self, kind: str, n: int) -> None:
        """Makes the `n`th call of `kind` from now fail (0 disarms)."""
        assert self.lib.npumem_fake_fail_next(FAULT_KINDS[kind], n) == 0

    def fail_from(self, kind: str, n: int) -> None:
        """Makes the `n`th call of `kind` from now and every later one fail, until disarmed."""
        assert self.lib.npumem_fake_fail_from(FAULT_KINDS[kind], n) == 0

    def disarm(self) -> None:
        for kind in FAULT_KINDS:
            self.fail_next(kind, 0)

    def set_delay_us(self, us: int) -> None:
        self.lib.npumem_fake_set_delay_us(us)


@pytest.fixture(params=["acl", "cuda"])
def stand_in(request) -> StandIn:
    """Each stand-in runtime in turn (faults disarmed and no delay afterwards)."""
    s = StandIn(request.param)
    yield s
    s.disarm()
    s.set_delay_us(0)


def pytest_configure(config):
    config.addinivalue_line("markers", "sim_only(reason): needs the simulator; skipped on the other backends")
    config.addinivalue_line(
        "markers", "huge_pages: expects 2 MiB pages; on the host backend, skipped when no hugetlb pages can be had"
    )


#: 2 MiB pages the test session reserves for the host backend (as root), given back at its end.
HUGE_PAGES_WANTED = 1024
_NR_HUGEPAGES = "/proc/sys/vm/nr_hugepages"


def free_huge_pages() -> int:
    """Free 2 MiB pages in the kernel's hugetlb pool."""
    try:
        with open("/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages") as f:
            return int(f.read())
    except OSError:
        return 0


@pytest.fixture(scope="session")
def host_huge_pages():
    """Reserves 2 MiB pages for the host backend's tests where this process may (root), and
    gives them back at the end of the session; yields how many are free."""
    added = 0
    try:
        missing = HUGE_PAGES_WANTED - free_huge_pages()
        if missing > 0:
            with open(_NR_HUGEPAGES) as f:
                before = int(f.read())
            with open(_NR_HUGEPAGES, "w") as f:
                f.write(str(before + missing))
            with open(_NR_HUGEPAGES) as f:
                added = max(int(f.read()) - before, 0)
    except (OSError, ValueError):
        pass  # not root, or no hugetlb: the tests that need huge pages skip
    try:
        yield free_huge_pages()
    finally:
        # Give back what this session added (others may have reserved pages meanwhile).
        if added:
            with contextlib.suppress(OSError, ValueError):
                with open(_NR_HUGEPAGES) as f:
                    now = int(f.read())
                with open(_NR_HUGEPAGES, "w") as f:
                    f.write(str(max(now - added, 0)))


def pytest_generate_tests(metafunc):
    if "npumem_backend" in metafunc.fixturenames:
        metafunc.parametrize("npumem_backend", BACKENDS, indirect=True)


def _device_on(backend: str) -> type[npumem.Device]:
    """`npumem.Device` with `backend` unless another is asked for."""

    class _Device(npumem.Device):
        def __new__(cls, *args, **kwargs):
            kwargs.setdefault("backend", backend)
            return super().__new__(cls, *args, **kwargs)

    _Device.__name__ = _Device.__qualname__ = "Device"
    return _Device


_DEVICES = {backend: _device_on(backend) for backend in BACKENDS[1:]}


@pytest.fixture
def npumem_backend(request, monkeypatch) -> str:
    backend = getattr(request, "param", "sim")  # unittest-style tests (state machines) run on the simulator
    if backend != "sim":
        marker = request.node.get_closest_marker("sim_only")
        if marker is not None:
            pytest.skip(f"simulator only: {marker.args[0] if marker.args else 'needs the simulator'}")
    if backend == "host":
        huge = request.getfixturevalue("host_huge_pages")
        if request.node.get_closest_marker("huge_pages") is not None and huge < HUGE_PAGES_WANTED:
            pytest.skip(
                f"needs 2 MiB huge pages: {huge} free; reserve {HUGE_PAGES_WANTED} as root with "
                f"`echo {HUGE_PAGES_WANTED} > {_NR_HUGEPAGES}`"
            )
    if backend != "sim":
        monkeypatch.setattr(npumem, "Device", _DEVICES[backend])
        if getattr(request.module, "Device", None) is not None:
            monkeypatch.setattr(request.module, "Device", _DEVICES[backend])
    return backend


@pytest.fixture
def dev(request) -> npumem.Device:
    """A small, fresh device with 4 KiB normal pages (on the run's backend in a module that runs
    on both)."""
    if "npumem_backend" in request.fixturenames:
        request.getfixturevalue("npumem_backend")
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


# --------------------------------------------------------------------------------------------
# Tools the set-up installs (torch from requirements-torch.txt, chromium under `make browser`,
# the toolchain's g++): a test without one is skipped, except under CI=true, where a missing tool
# is a failure of the set-up and must not pass as a skip.
# --------------------------------------------------------------------------------------------


def missing_tool(why: str) -> None:
    """Skips the test (or, at import, its module) saying ``why``; fails it under CI=true."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true: {why}", pytrace=False)
    pytest.skip(why, allow_module_level=True)


def require_torch():
    """The torch module; see :func:`missing_tool` when it is not installed."""
    try:
        import torch
    except ImportError as e:
        missing_tool(f"torch is not installed ({e}); pip install -r requirements-torch.txt")
    return torch


#: The `npu` device every torch test of the session shares (installing is once per process).
NPU_SETTINGS = {
    "capacity": "1GiB",
    "allocator": "torch_npu",
    "alloc_conf": "",
    "mode": "host",
    "devices": 1,
    "backend": "host",
}


@pytest.fixture(scope="session")
def npu():
    """The npumem Device behind `npu:0`, installed once for the session."""
    require_torch()
    import npumem.torch

    npumem.torch.install(**NPU_SETTINGS)
    return npumem.torch.device(0)


def run_torch_programs(tmp, program: str, envs: dict[str, dict[str, str]]) -> dict[str, dict]:
    """Runs ``program`` (Python source that writes JSON to ``sys.argv[1]``) once per entry of
    ``envs``, all at once, each in a fresh process (installing npu is once per process) with no
    NPUMEM_* or PYTORCH_NPU* variable but its own; returns each run's JSON, with ``json`` the
    path it wrote."""
    import json
    import subprocess
    import sys

    path = tmp / "program.py"
    path.write_text(program)
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("NPUMEM_", "PYTORCH_NPU"))}
    procs = {
        name: subprocess.Popen(
            [sys.executable, str(path), str(tmp / f"{name}.json")],
            env={**clean, **env},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name, env in envs.items()
    }
    results = {}
    for name, proc in procs.items():
        _, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, err
        results[name] = {**json.loads((tmp / f"{name}.json").read_text()), "json": str(tmp / f"{name}.json")}
    return results
