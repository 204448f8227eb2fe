"""libnpumem, the C ABI: the pluggable-allocator signatures called through ctypes from many
threads, a C program compiled against npumem.h, bad input, the environment's configuration.

A process holds one copy of the library, configured by the environment at its first call, so
every scenario runs in a subprocess with its own NPUMEM_* variables (which also keeps a crash,
were one possible, out of the test runner).
"""

from __future__ import annotations

import ctypes
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import missing_tool

import npumem.capi as capi
from npumem.errors import InvalidParamError

FAMILIES = ["npumem", "pytorch", "torch_npu", "direct"]

#: Helpers every scenario script starts with: the library, `err()` (the thread's last error),
#: `ok()` (asserts the last call succeeded), `stats(device)`, `held()` (memfds and their maps).
PRELUDE = """
import ctypes, json, os, random, sys, threading
import npumem.capi as capi
lib = capi.load()
NULL = None

def err():
    e = lib.npumem_last_error()
    return None if e is None else e.decode()

def ok(what=""):
    e = err()
    assert e is None, f"{what}: {e}"

def stats(device=0):
    return capi.device_stats(lib, device)

def held():
    fds = sum("memfd:npumem" in os.readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd")
              if os.path.exists(f"/proc/self/fd/{fd}"))
    maps = sum("memfd:npumem" in line for line in open("/proc/self/maps"))
    return fds, maps
"""


def run(script: str, env: dict[str, str] | None = None, timeout: float = 120) -> dict:
    """Runs PRELUDE + `script` in a fresh interpreter with only the given NPUMEM_* variables;
    returns the JSON object it prints last."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("NPUMEM_")}
    clean.update(env or {})
    proc = subprocess.run(
        [sys.executable, "-c", PRELUDE + textwrap.dedent(script)],
        env=clean,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, f"exit status {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------------------------------------
# The shipped files


def test_the_library_and_header_ship_in_the_package():
    assert Path(capi.library_path()).name == "libnpumem.so"
    assert Path(capi.header_path()).read_text().startswith("/*\n * npumem.h")


def test_a_missing_library_names_the_make_target(monkeypatch, tmp_path):
    monkeypatch.setattr(capi, "_HERE", tmp_path)
    for fn in (capi.library_path, capi.header_path):
        with pytest.raises(FileNotFoundError, match=r"missing: `make build` builds libnpumem"):
            fn()
    with pytest.raises(TypeError, match="path must be a str"):
        capi.load(3)


def header_functions() -> set[str]:
    text = Path(capi.header_path()).read_text()
    return set(re.findall(r"^[a-z][\w ]*\*?\s*(npumem_\w+)\(", text, re.M))


def test_the_header_declares_exactly_what_the_library_exports():
    declared = header_functions()
    assert declared == set(capi._PROTOTYPES), "npumem.capi.load() declares every function of the header"
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("nm (binutils) is not installed: cannot list the library's exports")
    out = subprocess.run([nm, "-D", "--defined-only", capi.library_path()], capture_output=True, text=True, check=True)
    exported = {line.split()[-1] for line in out.stdout.splitlines() if line.split()[-1].startswith("npumem_")}
    assert exported == declared


C_PROGRAM = r"""
#include "npumem.h"
#include <stddef.h>
#include <stdio.h>
#include <string.h>

/* The signatures the loaders take (PyTorch's CUDAPluggableAllocator and its hooks, torch_npu's
   NPUPluggableAllocator and its hooks), as function-pointer types the header must satisfy. */
static void* (*const alloc_fn)(ssize_t, int, void*) = npumem_malloc;
static void (*const free_fn)(void*, ssize_t, int, void*) = npumem_free;
static void (*const init_fn)(int) = npumem_init;
static void (*const reset_fn)(void) = npumem_empty_cache;
static void (*const npu_reset_fn)(bool) = npumem_reset;
static void (*const fraction_fn)(double, int) = npumem_set_memory_fraction;
static void (*const record_stream_fn)(void*, void*) = npumem_record_stream;
static void (*const reset_peak_fn)(int8_t) = npumem_reset_peak_stats;

#define CHECK(cond) do { if (!(cond)) { printf("FAILED line %d: %s (%s)\n", __LINE__, #cond, \
    npumem_last_error() ? npumem_last_error() : "no error"); return 1; } } while (0)

int main(void) {
    void* s1 = (void*)0x1000;
    init_fn(2);
    CHECK(npumem_last_error() == NULL);
    char* a = (char*)alloc_fn(3000, 0, s1);
    char* b = (char*)alloc_fn(5 << 20, 1, NULL);
    CHECK(a != NULL && b != NULL && (size_t)a % 64 == 0);
    memset(a, 'a', 3000);
    memset(b, 'b', 5 << 20);
    record_stream_fn(a, (void*)0x2000);
    CHECK(npumem_last_error() == NULL);
    CHECK(a[2999] == 'a' && b[(5 << 20) - 1] == 'b');

    free_fn(a, 2999, 0, s1);  /* wrong size: refused, nothing freed */
    CHECK(npumem_last_error_code() == NPUMEM_ACL_ERROR_RT_PARAM_INVALID);
    CHECK(strstr(npumem_last_error(), "allocated with size 3000 but is freed with size 2999") != NULL);
    CHECK(alloc_fn(-1, 0, NULL) == NULL && npumem_last_error_code() == NPUMEM_ACL_ERROR_INVALID_PARAM);
    CHECK(alloc_fn(1, NPUMEM_MAX_DEVICES, NULL) == NULL);
    CHECK(alloc_fn(0, 0, NULL) == NULL && npumem_last_error() == NULL);
    fraction_fn(1.5, 0);
    CHECK(npumem_last_error_code() == NPUMEM_ACL_ERROR_INVALID_PARAM);

    npumem_device_stats_t st;
    CHECK(npumem_get_device_stats(0, &st, sizeof st) == 0);
    CHECK(st.allocation[NPUMEM_STAT_ALL].current == 1 && st.requested_bytes[NPUMEM_STAT_ALL].current == 3000);
    CHECK(npumem_get_device_stats(0, &st, sizeof st - 8) == NPUMEM_ACL_ERROR_INVALID_PARAM);

    free_fn(a, 3000, 0, s1);
    free_fn(b, 5 << 20, 1, NULL);
    free_fn(NULL, 0, 0, NULL);
    CHECK(npumem_last_error() == NULL);
    reset_fn();
    npu_reset_fn(true);
    reset_peak_fn(0);
    CHECK(npumem_last_error() == NULL);
    for (int d = 0; d < 2; d++) {
        CHECK(npumem_get_device_stats(d, &st, sizeof st) == 0);
        CHECK(st.allocated_bytes[NPUMEM_STAT_ALL].current == 0 && st.reserved_bytes[NPUMEM_STAT_ALL].current == 0);
    }
    CHECK(st.allocated_bytes[NPUMEM_STAT_ALL].allocated >= (5 << 20));
    printf("{\"sizeof\": %zu, \"reserved_bytes\": %zu, \"num_alloc_retries\": %zu, \"oversize_segments\": %zu, "
           "\"num_oom_rejections\": %zu, \"max_split_size\": %zu, \"num_cache_misses\": %zu}\n",
           sizeof(npumem_device_stats_t), offsetof(npumem_device_stats_t, reserved_bytes),
           offsetof(npumem_device_stats_t, num_alloc_retries), offsetof(npumem_device_stats_t, oversize_segments),
           offsetof(npumem_device_stats_t, num_oom_rejections), offsetof(npumem_device_stats_t, max_split_size),
           offsetof(npumem_device_stats_t, num_cache_misses));
    return 0;
}
"""


@pytest.mark.parametrize("compiler", ["gcc", "g++"])
def test_a_c_program_built_against_the_header_runs(tmp_path, compiler):
    cc = shutil.which(compiler)
    if cc is None:
        pytest.skip(f"{compiler} is not installed")
    source = tmp_path / "use_npumem.c"
    source.write_text(C_PROGRAM)
    exe = tmp_path / "use_npumem"
    lib_dir = str(Path(capi.library_path()).parent)
    header_dir = str(Path(capi.header_path()).parent)
    flags = ["-std=c99", "-pedantic"] if compiler == "gcc" else ["-x", "c++", "-std=c++17"]
    link = [f"-L{lib_dir}", "-l:libnpumem.so", f"-Wl,-rpath,{lib_dir}"]
    command = [cc, *flags, "-Wall", "-Wextra", "-Werror", f"-I{header_dir}", str(source), "-x", "none", *link]
    build = subprocess.run([*command, "-o", str(exe)], capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    env = {k: v for k, v in os.environ.items() if not k.startswith("NPUMEM_")}
    proc = subprocess.run([str(exe)], capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    layout = json.loads(proc.stdout.strip().splitlines()[-1])
    # The ctypes mirror (npumem.capi.DeviceStats) has the header's layout.
    assert layout["sizeof"] == ctypes.sizeof(capi.DeviceStats)
    fields = ("reserved_bytes", "num_alloc_retries", "oversize_segments", "num_oom_rejections", "max_split_size")
    for field in (*fields, "num_cache_misses"):
        assert layout[field] == getattr(capi.DeviceStats, field).offset, field


TORCH_BRIDGE = r"""
#define NPUMEM_TORCH_DEVICE_STATS
#include "npumem.h"
#include <cstdio>

int main() {
    npumem_device_stats_t s{};
    int64_t* all = reinterpret_cast<int64_t*>(&s);
    for (size_t i = 0; i < sizeof s / sizeof(int64_t); i++) all[i] = 1000 + (int64_t)i;
    c10::CachingDeviceAllocator::DeviceStats t = npumem_torch_device_stats(s);
    std::printf("%lld %lld %lld %lld %lld %zu\n", (long long)t.allocation[0].current,
                (long long)t.requested_bytes[2].freed, (long long)t.oversize_segments.peak,
                (long long)t.num_oom_rejections, (long long)t.max_split_size, t.reserved_bytes_by_private_pools.size());
}
"""


def test_the_header_fills_torchs_device_stats_field_by_field(tmp_path):
    # torch (requirements-torch.txt) ships c10's headers: the bridge compiles against the torch
    # the tests run with, and each field lands where its name says.
    cc = shutil.which("g++")
    if cc is None:
        missing_tool("g++ is not installed (Debian's g++ package)")
    spec = importlib.util.find_spec("torch")
    assert spec is not None and spec.submodule_search_locations, "torch is not installed"
    torch_include = Path(next(iter(spec.submodule_search_locations))) / "include"
    source = tmp_path / "bridge.cpp"
    source.write_text(TORCH_BRIDGE)
    header_dir = str(Path(capi.header_path()).parent)
    exe = tmp_path / "bridge"
    command = [cc, "-std=c++17", "-Wall", "-Wextra", "-Werror", f"-I{header_dir}", f"-I{torch_include}"]
    build = subprocess.run([*command, str(source), "-o", str(exe)], capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    out = subprocess.run([str(exe)], capture_output=True, text=True, timeout=30, check=True).stdout.split()
    offset = {name: getattr(capi.DeviceStats, name).offset // 8 for name in ("requested_bytes", "oversize_segments")}
    expected = [
        1000,  # allocation[all].current: the first int64
        1000 + offset["requested_bytes"] + 2 * 4 + 3,  # requested_bytes[large_pool].freed
        1000 + offset["oversize_segments"] + 1,
        1000 + capi.DeviceStats.num_oom_rejections.offset // 8,
        1000 + capi.DeviceStats.max_split_size.offset // 8,
        0,
    ]
    assert [int(v) for v in out] == expected


# ---------------------------------------------------------------------------------------------
# Many threads, every family

THREADS_SCRIPT = """
THREADS, OPS = 8, 800
live = {}           # start -> (end, device, stream, size, pattern) of every block handed out and not freed
lock = threading.Lock()
failures = []

BASE = bytes(i % 251 for i in range((1 << 17) + 251))

def pattern(tag, n):
    return BASE[tag % 251 : tag % 251 + n]

def check_no_overlap(start, end):
    for s, (e, *_rest) in live.items():
        assert end <= s or e <= start, f"[{start:#x}, {end:#x}) overlaps live [{s:#x}, {e:#x})"

def write(p, size, tag):
    # The whole block up to 128 KiB, else its first and last 64 KiB.
    data = pattern(tag, size if size <= 1 << 17 else 1 << 16)
    ctypes.memmove(p, data, len(data))
    if size > len(data):
        ctypes.memmove(p + size - len(data), data, len(data))
    return data

def intact(p, size, data):
    n = len(data)
    return ctypes.string_at(p, n) == data and (size == n or ctypes.string_at(p + size - n, n) == data)

def worker(t):
    rng = random.Random(t)
    device = t % 2
    streams = [None, 0x1000 * (t + 1), 0x1000 * (t + 1) + 8]
    mine = []
    try:
        for i in range(OPS):
            r = rng.random()
            if r < 0.55 or not mine:
                size = rng.choice([rng.randint(1, 4096), rng.randint(4097, 1 << 20), rng.randint(1 << 20, 4 << 20)])
                stream = rng.choice(streams)
                p = lib.npumem_malloc(size, device, stream)
                ok(f"malloc({size})")
                assert p is not None and p % 64 == 0, p
                data = write(p, size, t * 7919 + i)
                with lock:
                    check_no_overlap(p, p + size)
                    live[p] = (p + size, device, stream, size, data)
                mine.append(p)
            elif r < 0.90:
                p = mine.pop(rng.randrange(len(mine)))
                with lock:
                    _end, dev, stream, size, data = live.pop(p)
                assert intact(p, size, data), f"bytes of block {p:#x} changed"
                lib.npumem_free(p, size, dev, stream)
                ok("free")
            elif r < 0.95:
                lib.npumem_record_stream(rng.choice(mine), rng.choice(streams))
                ok("record_stream")
            elif r < 0.97:
                lib.npumem_empty_cache()
                ok("empty_cache")
            elif r < 0.98:
                lib.npumem_set_memory_fraction(1.0, device)
                if os.environ["NPUMEM_ALLOCATOR"] == "direct":  # no cache, nothing to cap
                    assert lib.npumem_last_error_code() == 200006, err()
                else:
                    ok("set_memory_fraction")
            elif r < 0.99:
                s = stats(device)
                assert s["allocated_bytes.all.current"] <= s["reserved_bytes.all.current"]
            else:
                lib.npumem_reset_peak_stats(device)
                ok("reset_peak_stats")
        for p in mine:
            with lock:
                _end, dev, stream, size, data = live.pop(p)
            assert intact(p, size, data), f"bytes of block {p:#x} changed"
            lib.npumem_free(p, size, dev, stream)
            ok("final free")
    except BaseException as e:
        failures.append(f"thread {t}: {type(e).__name__}: {e}")

baseline = held()
lib.npumem_init(2)
ok("init")
threads = [threading.Thread(target=worker, args=(t,)) for t in range(THREADS)]
for th in threads:
    th.start()
for th in threads:
    th.join()
peak = {d: stats(d)["allocated_bytes.all.peak"] for d in (0, 1)}
lib.npumem_empty_cache()
ok("empty_cache at the end")
after = {d: stats(d) for d in (0, 1)}
for d in (0, 1):
    lib.npumem_reset_peak_stats(d)
print(json.dumps({
    "failures": failures,
    "live": len(live),
    "peak": peak,
    "after": {d: {k: v for k, v in s.items() if k.endswith(".all.current")} for d, s in after.items()},
    "mallocs": {d: s["allocation.all.allocated"] for d, s in after.items()},
    "peak_after_reset": {d: stats(d)["allocated_bytes.all.peak"] for d in (0, 1)},
    "baseline": baseline,
    "held": held(),
}))
"""


@pytest.mark.parametrize("family", FAMILIES)
def test_threads_malloc_and_free_through_the_pluggable_signatures(family):
    out = run(THREADS_SCRIPT, {"NPUMEM_ALLOCATOR": family, "NPUMEM_CAPACITY": "4GiB"})
    assert out["failures"] == []
    assert out["live"] == 0
    for d in ("0", "1"):
        assert out["mallocs"][d] > 300, "both devices served their threads"
        assert out["peak"][d] > 0
        # Shutdown leaks nothing: every block freed, every byte given back.
        current = out["after"][d]
        assert current["allocation.all.current"] == 0
        assert current["allocated_bytes.all.current"] == 0
        assert current["reserved_bytes.all.current"] == 0, current
        assert current["segment.all.current"] == 0
        assert out["peak_after_reset"][d] == 0
    # ... and the host backend closed every memfd and unmapped it.
    assert out["held"] == out["baseline"] == [0, 0]


# ---------------------------------------------------------------------------------------------
# Bad input: an error in the last error, NULL, nothing changed, no crash

BAD_INPUT_SCRIPT = """
import math
keep = lib.npumem_malloc(1000, 0, NULL)
ctypes.memmove(keep, b"k" * 1000, 1000)
other = lib.npumem_malloc(64, 1, NULL)
ok("setup")
before = {d: stats(d) for d in (0, 1)}

def stats_with(out, size):
    return lib.npumem_get_device_stats(0, out, size)

cases = {
    "malloc negative": (lambda: lib.npumem_malloc(-1, 0, NULL), 100000, "size -1 is negative"),
    "malloc device -1": (lambda: lib.npumem_malloc(8, -1, NULL), 100000, "device -1 is out of range"),
    "malloc device 64": (lambda: lib.npumem_malloc(8, 64, NULL), 100000, "device 64 is out of range"),
    "malloc too large": (lambda: lib.npumem_malloc(1 << 62, 0, NULL), 207001, "is larger than the device"),
    "malloc max": (lambda: lib.npumem_malloc(2**63 - 1, 0, NULL), None, ""),
    "free unknown": (lambda: lib.npumem_free(0x1234, 8, 0, NULL), 207002, "never came from malloc"),
    "free interior": (lambda: lib.npumem_free(keep + 64, 936, 0, NULL), 207002, "points 64 bytes into"),
    "free wrong size": (lambda: lib.npumem_free(keep, 999, 0, NULL), 107000, "allocated with size 1000"),
    "free wrong device": (lambda: lib.npumem_free(keep, 1000, 1, NULL), 207002, "live allocation of device 0"),
    "free bad device": (lambda: lib.npumem_free(keep, 1000, 99, NULL), 100000, "device 99 is out of range"),
    "free negative size": (lambda: lib.npumem_free(keep, -1, 0, NULL), 100000, "size -1 is negative"),
    "record_stream unknown": (lambda: lib.npumem_record_stream(0x1234, NULL), 107000, "not a live allocation"),
    "fraction 2": (lambda: lib.npumem_set_memory_fraction(2.0, 0), 100000, "must be in [0, 1]"),
    "fraction nan": (lambda: lib.npumem_set_memory_fraction(math.nan, 0), 100000, "must be in [0, 1]"),
    "fraction bad device": (lambda: lib.npumem_set_memory_fraction(0.5, 1000), 100000, "out of range"),
    "init negative": (lambda: lib.npumem_init(-1), 100000, "device_count -1 is out of range"),
    "init too many": (lambda: lib.npumem_init(65), 100000, "device_count 65 is out of range"),
    "stats NULL": (lambda: stats_with(None, 984), 100000, "out is NULL"),
    "stats wrong size": (lambda: stats_with(ctypes.byref(capi.DeviceStats()), 100), 100000, "out_size is 100"),
    "stats bad device": (lambda: lib.npumem_get_device_stats(-3, ctypes.byref(capi.DeviceStats()),
                                                             ctypes.sizeof(capi.DeviceStats)), 100000,
                         "device -3 is out of range"),
    "reset peak bad device": (lambda: lib.npumem_reset_peak_stats(64), 100000, "device 64 is out of range"),
}
results = {}
for name, (call, code, needle) in cases.items():
    value = call()
    results[name] = {"value": value, "code": lib.npumem_last_error_code(), "error": err(), "want": [code, needle]}

# The same last error is visible only on its own thread.
seen_elsewhere = []
lib.npumem_free(0x1234, 8, 0, NULL)
t = threading.Thread(target=lambda: seen_elsewhere.append(err()))
t.start(); t.join()
mine = err()

# check() raises the matching exception class.
raised = {}
for name, call in {"double free": lambda: lib.npumem_free(other, 64, 1, NULL),
                   "oom": lambda: lib.npumem_malloc(1 << 62, 0, NULL)}.items():
    if name == "double free":
        lib.npumem_free(other, 64, 1, NULL)
        ok("free other")
    call()
    try:
        capi.check(lib)
    except Exception as e:
        raised[name] = [type(e).__name__, e.code, str(e)]

after = {d: stats(d) for d in (0, 1)}
intact = ctypes.string_at(keep, 1000) == b"k" * 1000
lib.npumem_free(keep, 1000, 0, NULL)
ok("final free")
print(json.dumps({"results": results, "intact": intact, "before": before[0], "after": after[0],
                  "mine": mine, "elsewhere": seen_elsewhere, "raised": raised}))
"""


def test_bad_input_is_an_error_that_changes_nothing():
    out = run(BAD_INPUT_SCRIPT)
    for name, r in out["results"].items():
        code, needle = r["want"]
        assert r["value"] in (None, 0, 100000), f"{name}: a failed call returns NULL / nothing / its code"
        assert r["error"] is not None, f"{name}: no last error"
        if code is not None:
            assert r["code"] == code, f"{name}: {r['error']}"
            assert needle in r["error"], f"{name}: {r['error']}"
    assert out["results"]["stats NULL"]["value"] == 100000
    assert out["intact"]
    # The failed calls changed no figure (the successful setup calls are counted in both).
    assert out["before"] == out["after"]
    assert out["mine"].startswith("npumem_free(ptr=0x1234, size=8, device=0, stream=0x0): ACL_ERROR_RT_MEMORY_FREE")
    assert out["elsewhere"] == [None]
    assert out["raised"]["double free"][:2] == ["MemoryFreeError", 207002]
    assert "double free" in out["raised"]["double free"][2]
    assert out["raised"]["oom"][:2] == ["OutOfMemoryError", 207001]


def test_device_stats_checks_its_device_argument():
    lib = None  # the check comes first: nothing is loaded or called
    with pytest.raises(InvalidParamError, match=r"device must be an int from 0 to 63, got 64"):
        capi.device_stats(lib, 64)
    with pytest.raises(TypeError, match="device must be an int"):
        capi.device_stats(lib, "0")


# ---------------------------------------------------------------------------------------------
# Configuration from the environment


@pytest.mark.parametrize(
    ("env", "needle"),
    [
        ({"NPUMEM_BACKEND": "gpu"}, 'NPUMEM_BACKEND="gpu": unknown backend'),
        ({"NPUMEM_ALLOCATOR": "jemalloc"}, 'NPUMEM_ALLOCATOR="jemalloc": unknown allocator'),
        ({"NPUMEM_CAPACITY": "lots"}, 'NPUMEM_CAPACITY="lots": cannot read'),
        ({"NPUMEM_CAPACITY": "0"}, "the capacity must be above 0"),
        ({"NPUMEM_ALLOC_CONF": "no_such_key:1"}, "cannot create device 0 with NPUMEM_BACKEND=host"),
        ({"NPUMEM_ALLOCATOR": "direct", "NPUMEM_ALLOC_CONF": "max_split_size_mb:64"}, "direct allocator has no"),
        ({"NPUMEM_BACKEND": "sim", "NPUMEM_CAPACITY": "2TiB"}, "simulator's limit"),
    ],
)
def test_a_bad_environment_fails_every_call_without_crashing(env, needle):
    out = run(
        """
        first = lib.npumem_malloc(4096, 0, NULL), err(), lib.npumem_last_error_code()
        lib.npumem_init(1)
        init = err()
        again = lib.npumem_malloc(4096, 0, NULL), err()
        print(json.dumps({"first": first, "init": init, "again": again}))
        """,
        env,
    )
    ptr, error, code = out["first"]
    assert ptr is None and code == 100000
    assert needle in error, error
    assert needle in out["init"]
    assert out["again"] == [None, error]


def test_the_sim_backend_and_a_capacity_cap():
    out = run(
        """
        p = lib.npumem_malloc(1 << 20, 0, NULL)
        ok("sim malloc")
        counted = stats()["allocated_bytes.all.current"]
        too_big = lib.npumem_malloc(40 << 30, 0, NULL), lib.npumem_last_error_code()
        lib.npumem_free(p, 1 << 20, 0, NULL)
        ok("sim free")
        print(json.dumps({"p": p, "counted": counted, "too_big": too_big, "held": held()}))
        """,
        {"NPUMEM_BACKEND": "sim"},
    )
    assert out["p"] is not None and out["counted"] >= 1 << 20
    assert out["too_big"] == [None, 207001], "the simulator's 32 GiB default capacity"
    assert out["held"] == [0, 0], "the simulated device takes no host memory"

    out = run(
        """
        big = lib.npumem_malloc(600 << 20, 0, NULL)
        ok("600 MiB of 1 GiB")
        lib.npumem_free(big, 600 << 20, 0, NULL)
        lib.npumem_empty_cache()
        over = lib.npumem_malloc(1100 << 20, 0, NULL), lib.npumem_last_error_code()
        lib.npumem_set_memory_fraction(0.5, 0)
        ok("fraction")
        capped = lib.npumem_malloc(600 << 20, 0, NULL), lib.npumem_last_error_code()
        print(json.dumps({"over": over, "capped": capped}))
        """,
        {"NPUMEM_CAPACITY": "1GiB", "NPUMEM_ALLOCATOR": "pytorch"},
    )
    assert out["over"] == [None, 207001]
    assert out["capped"] == [None, 207001], "half of 1 GiB cannot hold 600 MiB"
