"""Errors: classes and codes, pickling, actionable messages, and that every bad call raises an
AclError (never crashes) and leaves the device exactly as it was."""

from __future__ import annotations

import copy
import ctypes
import itertools
import os
import pickle
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from conftest import BOTH_BACKENDS, CODE_NAMES, GiB, MiB, fragment, raises_acl, run_in_threads, snapshot, unchanged
from hypothesis import given, settings
from hypothesis import strategies as st

import npumem
from npumem import (
    VA_WINDOW_END,
    VA_WINDOW_START,
    AclError,
    Device,
    InternalError,
    InvalidHandleError,
    InvalidParamError,
    MemcpyKind,
    MemoryFreeError,
    OutOfMemoryError,
    Policy,
    UnsupportedError,
)
from npumem import errors as errmod

# --------------------------------------------------------------------------------------------
# Classes, codes, pickling
# --------------------------------------------------------------------------------------------

pytestmark = BOTH_BACKENDS

HIERARCHY = [
    (InvalidParamError, ValueError),
    (OutOfMemoryError, MemoryError),
    (MemoryFreeError, ValueError),
    (InvalidHandleError, ValueError),
    (UnsupportedError, NotImplementedError),
    (InternalError, RuntimeError),
]


@pytest.mark.parametrize(("cls", "builtin"), HIERARCHY)
def test_hierarchy(cls, builtin):
    assert issubclass(cls, AclError)
    assert issubclass(cls, builtin)
    assert issubclass(AclError, Exception)


def test_codes_map_to_classes():
    expected = {
        100000: InvalidParamError,
        107000: InvalidParamError,
        107008: InvalidParamError,
        107017: InvalidHandleError,
        200006: UnsupportedError,
        207001: OutOfMemoryError,
        207002: MemoryFreeError,
        507899: InternalError,
    }
    assert set(expected) == set(CODE_NAMES)
    for code, cls in expected.items():
        err = errmod._from_native(code, CODE_NAMES[code], "what to do")
        assert type(err) is cls
        assert (err.code, err.name, err.message) == (code, CODE_NAMES[code], "what to do")
        assert str(err) == f"{CODE_NAMES[code]} ({code}): what to do"
    unknown = errmod._from_native(123, "ACL_SOMETHING", "m")
    assert type(unknown) is AclError and unknown.code == 123
    assert errmod.ACL_ERROR_INVALID_PARAM == 100000
    assert errmod.ACL_ERROR_RT_PARAM_INVALID == 107000
    assert errmod.ACL_ERROR_RT_MEMORY_ALLOCATION == 207001
    assert errmod.ACL_ERROR_RT_MEMORY_FREE == 207002


def _raised_errors() -> list[AclError]:
    d = Device("16MiB", allocator="direct")
    p = d.malloc(100)
    errors = []
    for call in (
        lambda: d.malloc(0),
        lambda: d.malloc(32 * MiB),
        lambda: d.free(p + 64),
        lambda: d.read(p, 101),
        lambda: d.memcpy(p, 1, p, 2),
    ):
        try:
            call()
        except AclError as e:
            errors.append(e)
    d.free(p)
    try:
        d.free(p)
    except AclError as e:
        errors.append(e)
    assert len(errors) == 6
    return errors


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_errors_pickle(protocol):
    made = [InvalidParamError(100000, CODE_NAMES[100000], "msg"), AclError(1, "ACL_OTHER", "other")]
    for err in made + _raised_errors():
        back = pickle.loads(pickle.dumps(err, protocol))
        assert type(back) is type(err)
        assert (back.code, back.name, back.message, str(back)) == (err.code, err.name, err.message, str(err))
        assert back.args == err.args
        clone = copy.deepcopy(err)
        assert (type(clone), clone.code, clone.message) == (type(err), err.code, err.message)


def test_builtin_except_clauses_catch_errors(dev):
    with pytest.raises(ValueError):
        dev.malloc(0)
    with pytest.raises(MemoryError):
        dev.malloc(GiB)
    p = dev.malloc(1)
    dev.free(p)
    with pytest.raises(ValueError):
        dev.free(p)


# --------------------------------------------------------------------------------------------
# Every bad call: the right class, code and message, and no change to the device
# --------------------------------------------------------------------------------------------


class Ctx:
    """A device with a live allocation ``p`` (100 bytes), a freed one ``f``, a malloc_host block
    ``h`` (256 bytes) and ``foreign``, host memory that did not come from malloc_host."""

    def __init__(self):
        self.d = Device("64MiB", allocator="direct")
        self.p = self.d.malloc(100)
        self.f = self.d.malloc(100)
        self.d.free(self.f)
        self.h = self.d.malloc_host(256)
        self._buf = ctypes.create_string_buffer(4096)
        self.foreign = ctypes.addressof(self._buf)
        self.d.write(self.p, bytes(range(100)))
        ctypes.memmove(self.h, b"\x11" * 256, 256)


IP, RT, OOM, FREE = (
    (InvalidParamError, 100000),
    (InvalidParamError, 107000),
    (OutOfMemoryError, 207001),
    (
        MemoryFreeError,
        207002,
    ),
)

# (id, call, expected (class, code), message regex, failed_mallocs delta or None to skip the check)
#: Bad calls whose address only means something in the simulator's fixed VA window.
SIM_ONLY_CALLS = {
    "memcpy-unmapped": "an unmapped address in the simulator's VA window",
    "memcpy-window-last": "the last byte of the simulator's VA window",
}

BAD_CALLS = [
    # malloc
    ("malloc-0", lambda c: c.d.malloc(0), IP, "greater than 0", 0),
    ("malloc-0-normal", lambda c: c.d.malloc(0, Policy.NORMAL_ONLY), IP, "greater than 0", 0),
    ("malloc-0-1g", lambda c: c.d.malloc(0, Policy.HUGE1G_ONLY), IP, "greater than 0", 0),
    ("align32-0", lambda c: c.d.malloc_align32(0), IP, "greater than 0", 0),
    ("malloc-neg", lambda c: c.d.malloc(-1), IP, "2\\*\\*64", 0),
    ("malloc-2**64", lambda c: c.d.malloc(2**64), IP, "2\\*\\*64", 0),
    ("malloc-2**70", lambda c: c.d.malloc(2**70), IP, "2\\*\\*64", 0),
    ("malloc-max", lambda c: c.d.malloc(2**64 - 1), IP, "overflows", 0),
    ("malloc-pad-overflow", lambda c: c.d.malloc(2**64 - 32), IP, "overflows", 0),
    ("align32-overflow", lambda c: c.d.malloc_align32(2**64 - 31), IP, "overflows", 0),
    ("malloc-page-overflow", lambda c: c.d.malloc(2**64 - 64, Policy.NORMAL_ONLY), IP, "overflow", None),
    ("malloc-huge-overflow", lambda c: c.d.malloc(2**64 - 64), IP, "overflow", None),
    ("malloc-bad-string", lambda c: c.d.malloc("12 parsecs"), IP, "cannot read", 0),
    ("policy-8", lambda c: c.d.malloc(100, 8), IP, "ACL_MEM_MALLOC_HUGE_FIRST=0", 0),
    ("policy-neg", lambda c: c.d.malloc(100, -1), IP, "policy", 0),
    ("policy-2**32", lambda c: c.d.malloc(100, 2**32), IP, "policy", 0),
    ("align32-policy-9", lambda c: c.d.malloc_align32(100, 9), IP, "policy", 0),
    ("oom", lambda c: c.d.malloc(65 * MiB), OOM, "free of 64 MiB", 1),
    ("oom-padded", lambda c: c.d.malloc(64 * MiB, Policy.NORMAL_ONLY), OOM, "64 MiB", 1),
    ("oom-2**63", lambda c: c.d.malloc(2**63), OOM, "malloc", 1),
    ("oom-huge-only", lambda c: c.d.malloc(64 * MiB, Policy.HUGE_ONLY), OOM, "HUGE_ONLY", 1),
    ("oom-1g", lambda c: c.d.malloc(1, Policy.HUGE1G_ONLY), OOM, "giant_frames", 1),
    # free
    ("free-null", lambda c: c.d.free(0), IP, "NULL", 0),
    ("free-neg", lambda c: c.d.free(-1), IP, "ptr", 0),
    ("free-2**64", lambda c: c.d.free(2**64), IP, "ptr", 0),
    ("double-free", lambda c: c.d.free(c.f), FREE, "double free", 0),
    ("free-interior", lambda c: c.d.free(c.p + 64), FREE, "64 bytes into the allocation", 0),
    ("free-padding", lambda c: c.d.free(c.p + 100), FREE, "into the allocation", 0),
    ("free-unknown", lambda c: c.d.free(VA_WINDOW_START + GiB), FREE, "never came from malloc", 0),
    ("free-host-ptr", lambda c: c.d.free(c.h), FREE, "not a live device allocation", 0),
    ("free-window-end", lambda c: c.d.free(VA_WINDOW_END), FREE, "not a live", 0),
    # host memory
    ("free-host-null", lambda c: c.d.free_host(0), IP, "NULL", 0),
    ("free-host-device", lambda c: c.d.free_host(c.p), FREE, "malloc_host", 0),
    ("free-host-interior", lambda c: c.d.free_host(c.h + 64), FREE, "malloc_host", 0),
    ("free-host-foreign", lambda c: c.d.free_host(c.foreign), FREE, "malloc_host", 0),
    ("malloc-host-0", lambda c: c.d.malloc_host(0), IP, "greater than 0", 0),
    ("malloc-host-neg", lambda c: c.d.malloc_host(-5), IP, "size", 0),
    ("malloc-host-2**63", lambda c: c.d.malloc_host(2**63), IP, "too large", 0),
    ("malloc-host-2**64", lambda c: c.d.malloc_host(2**64), IP, "size", 0),
    # memcpy
    ("memcpy-count>dst_max", lambda c: c.d.memcpy(c.p, 10, c.h, 11), RT, "dst_max", 0),
    ("memcpy-kind-6", lambda c: c.d.memcpy(c.p, 10, c.h, 10, 6), IP, "kinds 0-5", 0),
    ("memcpy-kind-7", lambda c: c.d.memcpy(c.p, 10, c.h, 10, 7), IP, "kinds 0-5", 0),
    ("memcpy-kind-8", lambda c: c.d.memcpy(c.p, 10, c.h, 10, 8), IP, "memcpy kind", 0),
    ("memcpy-kind-neg", lambda c: c.d.memcpy(c.p, 10, c.h, 10, -1), IP, "kind", 0),
    ("memcpy-dst-past-end", lambda c: c.d.memcpy(c.p, 200, c.h, 101), RT, "1 bytes past the end", 0),
    ("memcpy-src-past-end", lambda c: c.d.memcpy(c.h, 256, c.p + 50, 60), RT, "10 bytes past the end", 0),
    (
        "memcpy-past-end-kind",
        lambda c: c.d.memcpy(c.h, 256, c.p, 101, MemcpyKind.HOST_TO_HOST),
        RT,
        "past the end",
        0,
    ),
    ("memcpy-padding", lambda c: c.d.memcpy(c.p + 100, 10, c.h, 1), RT, "padding", 0),
    ("memcpy-uaf-dst", lambda c: c.d.memcpy(c.f, 10, c.h, 10), RT, "use after free", 0),
    ("memcpy-uaf-src", lambda c: c.d.memcpy(c.h, 10, c.f, 10), RT, "use after free", 0),
    ("memcpy-unmapped", lambda c: c.d.memcpy(VA_WINDOW_START + GiB, 10, c.h, 10), RT, "not inside", 0),
    ("memcpy-window-last", lambda c: c.d.memcpy(c.h, 10, VA_WINDOW_END - 1, 1), RT, "not inside", 0),
    ("memcpy-host-past-end", lambda c: c.d.memcpy(c.h + 250, 10, c.p, 10), RT, "past the end", 0),
    ("memcpy-foreign-src", lambda c: c.d.memcpy(c.p, 10, c.foreign, 10), RT, "malloc_host", 0),
    ("memcpy-foreign-dst", lambda c: c.d.memcpy(c.foreign, 10, c.p, 10), RT, "malloc_host", 0),
    ("memcpy-small-int", lambda c: c.d.memcpy(c.p, 10, 4096, 10), RT, "malloc_host", 0),
    ("memcpy-null-dst", lambda c: c.d.memcpy(0, 10, c.p, 10), IP, "NULL", 0),
    ("memcpy-null-src", lambda c: c.d.memcpy(c.p, 10, 0, 10), IP, "NULL", 0),
    ("memcpy-dst-2**64", lambda c: c.d.memcpy(2**64, 10, c.p, 10), IP, "dst", 0),
    ("memcpy-count-neg", lambda c: c.d.memcpy(c.p, 10, c.h, -1), IP, "count", 0),
    # memset
    ("memset-count>dst_max", lambda c: c.d.memset(c.p, 10, 0, 11), RT, "dst_max", 0),
    ("memset-past-end", lambda c: c.d.memset(c.p, 1000, 0, 101), RT, "past the end", 0),
    ("memset-uaf", lambda c: c.d.memset(c.f, 10, 0, 10), RT, "use after free", 0),
    ("memset-null", lambda c: c.d.memset(0, 10, 0, 10), IP, "NULL", 0),
    ("memset-foreign", lambda c: c.d.memset(c.foreign, 10, 0, 10), RT, "malloc_host", 0),
    ("memset-host-past-end", lambda c: c.d.memset(c.h, 300, 0, 257), RT, "past the end", 0),
    # write / read / read_into
    ("write-past-end", lambda c: c.d.write(c.p, bytes(101)), RT, "past the end", 0),
    ("write-padding", lambda c: c.d.write(c.p + 100, b"x"), RT, "padding", 0),
    ("write-uaf", lambda c: c.d.write(c.f, b"x"), RT, "use after free", 0),
    ("write-null", lambda c: c.d.write(0, b"x"), IP, "NULL", 0),
    ("write-foreign", lambda c: c.d.write(c.foreign, b"x"), RT, "malloc_host", 0),
    ("write-noncontig", lambda c: c.d.write(c.p, memoryview(bytes(20))[::2]), IP, "C-contiguous", 0),
    ("read-past-end", lambda c: c.d.read(c.p, 101), RT, "past the end", 0),
    ("read-uaf", lambda c: c.d.read(c.f, 1), RT, "use after free", 0),
    ("read-null", lambda c: c.d.read(0, 1), IP, "NULL", 0),
    ("read-neg-ptr", lambda c: c.d.read(-1, 1), IP, "ptr", 0),
    ("read-neg-count", lambda c: c.d.read(c.p, -1), IP, "count", 0),
    ("read-foreign", lambda c: c.d.read(c.foreign, 1), RT, "malloc_host", 0),
    ("read-into-readonly", lambda c: c.d.read_into(c.p, bytes(10)), IP, "read-only", 0),
    ("read-into-past-end", lambda c: c.d.read_into(c.p, bytearray(101)), RT, "past the end", 0),
    ("read-into-noncontig", lambda c: c.d.read_into(c.p, np.zeros((4, 4), "u1")[:, ::2]), IP, "contiguous", 0),
    ("to-numpy-past-end", lambda c: c.d.to_numpy(c.p, (26,), np.float32), RT, "past the end", 0),
    # translate / walk / mem_info / allocation
    ("translate-null", lambda c: c.d.translate(0), RT, "not a device address", 0),
    ("translate-host", lambda c: c.d.translate(c.h), RT, "not a device address", 0),
    ("translate-window-end", lambda c: c.d.translate(VA_WINDOW_END), RT, "not a device address", 0),
    ("translate-below-window", lambda c: c.d.translate(VA_WINDOW_START - 1), RT, "not a device address", 0),
    ("translate-freed", lambda c: c.d.translate(c.f), RT, "not mapped", 0),
    ("translate-2**64", lambda c: c.d.translate(2**64), IP, "va", 0),
    ("walk-freed", lambda c: c.d.walk(c.f), RT, "not mapped", 0),
    ("walk-neg", lambda c: c.d.walk(-1), IP, "va", 0),
    ("mem-info-18", lambda c: c.d.mem_info(18), IP, "ACL_HBM_MEM=1", 0),
    ("mem-info-neg", lambda c: c.d.mem_info(-1), IP, "attr", 0),
    ("allocation-neg", lambda c: c.d.allocation(-1), IP, "ptr", 0),
    ("from-numpy-bad-policy", lambda c: c.d.from_numpy(np.arange(4), 9), IP, "policy", 0),
]


@pytest.mark.parametrize(
    ("call", "expected", "match", "failed"),
    [
        pytest.param(
            *c[1:], id=c[0], marks=[pytest.mark.sim_only(SIM_ONLY_CALLS[c[0]])] if c[0] in SIM_ONLY_CALLS else []
        )
        for c in BAD_CALLS
    ],
)
def test_bad_call(call, expected, match, failed):
    c = Ctx()
    before = snapshot(c.d)
    failed_before = c.d.stats()["failed_mallocs"]
    host_before = ctypes.string_at(c.h, 256)
    cls, code = expected
    with raises_acl(cls, code, match=match):
        call(c)
    assert snapshot(c.d) == before
    if failed is not None:
        assert c.d.stats()["failed_mallocs"] == failed_before + failed
    assert c.d.read(c.p, 100) == bytes(range(100))
    assert ctypes.string_at(c.h, 256) == host_before
    # The device still works.
    q = c.d.malloc(10)
    c.d.write(q, b"0123456789")
    assert c.d.read(q, 10) == b"0123456789"


@pytest.mark.parametrize(
    "call",
    [
        lambda d: d.malloc(1.5),
        lambda d: d.malloc(None),
        lambda d: d.malloc(100, "HUGE_ONLY"),
        lambda d: d.free("0x1000"),
        lambda d: d.free(None),
        lambda d: d.read(1.0, 1),
        lambda d: d.write(d.malloc(8), "text"),
        lambda d: d.write(d.malloc(8), 12),
        lambda d: d.memcpy(None, 1, 1, 1),
        lambda d: d.mem_info(1.0),
        lambda d: d.translate("16TiB"),
        lambda d: npumem.parse_size(1.5),
    ],
)
def test_wrong_types_raise_type_error(dev, call):
    with pytest.raises(TypeError):
        call(dev)


# --------------------------------------------------------------------------------------------
# Fuzzing: arbitrary ints into every method raise AclError or succeed, and the books balance
# --------------------------------------------------------------------------------------------

FUZZ_CAPACITY = 16 * MiB


@settings(max_examples=60)
@given(data=st.data())
def test_fuzz_never_crashes(data):
    d = Device(FUZZ_CAPACITY, allocator="direct")
    live = [d.malloc(100), d.malloc(3 * MiB, Policy.HUGE_ONLY)]
    hosts = [d.malloc_host(128)]
    freed = d.malloc(5000)
    d.free(freed)

    def address():
        return data.draw(
            st.one_of(
                st.sampled_from([0, 1, 4096, VA_WINDOW_START, VA_WINDOW_END - 1, VA_WINDOW_END, 2**63, 2**64 - 1]),
                st.sampled_from(live + hosts + [freed]).flatmap(
                    lambda base: st.integers(-64, 5000).map(lambda off: base + off)
                ),
                st.integers(-(2**65), 2**65),
            )
        )

    def count(limit: int = 2**66):
        return data.draw(
            st.one_of(
                st.integers(-1, 300),
                st.sampled_from([4096, 2 * MiB, 2**63, 2**64 - 1, 2**64]),
                st.integers(-limit, limit),
            )
        )

    def enum():
        return data.draw(st.one_of(st.integers(-2, 20), st.sampled_from([2**31, 2**32, 2**64])))

    ops = {
        "malloc": lambda: live.append(d.malloc(count(), enum())),
        "malloc_align32": lambda: live.append(d.malloc_align32(count(), enum())),
        "free": lambda: d.free(address()),
        "malloc_host": lambda: hosts.append(d.malloc_host(data.draw(st.integers(-1, 4096)))),
        "free_host": lambda: d.free_host(address()),
        "memcpy": lambda: d.memcpy(address(), count(), address(), count(), enum()),
        "memset": lambda: d.memset(address(), count(), data.draw(st.integers(-(2**31), 2**31 - 1)), count()),
        # read() builds its result before it checks the range (see test_read_count_is_checked_first),
        # so keep the count small here.
        "read": lambda: d.read(address(), data.draw(st.integers(-1, 2 * MiB))),
        "read_into": lambda: d.read_into(address(), bytearray(data.draw(st.integers(0, 300)))),
        "write": lambda: d.write(address(), bytes(data.draw(st.integers(0, 300)))),
        "translate": lambda: d.translate(address()),
        "walk": lambda: d.walk(address()),
        "mem_info": lambda: d.mem_info(enum()),
        "allocation": lambda: d.allocation(address()),
    }
    for _ in range(data.draw(st.integers(1, 25))):
        name = data.draw(st.sampled_from(sorted(ops)))
        try:
            ops[name]()
        except AclError as e:
            assert e.code in CODE_NAMES and e.name == CODE_NAMES[e.code] and e.message
            assert e.code != 507899, f"{name}: internal error {e}"

    # The books balance: what the device reports matches what it says is live.
    allocs = d.allocations()
    granted = sum(a["granted"] for a in allocs)
    s = d.stats()
    assert s["live_count"] == len(allocs)
    assert s["live_granted"] == granted
    assert d.mem_info() == (FUZZ_CAPACITY - granted, FUZZ_CAPACITY)
    sim = d.backend == "sim"
    if sim:
        assert d.page_table_stats()["mapped_bytes"] == granted
    for a, b in itertools.pairwise(allocs):
        assert a["ptr"] + a["granted"] <= b["ptr"]
    for a in allocs:
        d.free(a["ptr"])
    assert d.mem_info() == (FUZZ_CAPACITY, FUZZ_CAPACITY)
    if sim:
        assert d.page_table_stats()["mapped_bytes"] == 0
        assert d.frame_stats() == Device(FUZZ_CAPACITY, allocator="direct").frame_stats()


# --------------------------------------------------------------------------------------------
# Messages
# --------------------------------------------------------------------------------------------


@pytest.mark.sim_only("a fragmented buddy (fragment())")
def test_oom_messages_explain_fragmentation():
    d = Device("16MiB", allocator="direct")
    fragment(d)
    with raises_acl(OutOfMemoryError, 207001) as info:
        d.malloc(2 * MiB, Policy.HUGE_ONLY)
    message = info.value.message
    assert "HUGE_ONLY" in message and "HUGE_FIRST" in message
    assert "fragmentation" in message
    assert "largest free block 1 MiB" in message
    assert "15.97 MiB free of 16 MiB" in message


def test_invalid_enum_messages_list_valid_values(dev):
    with raises_acl(InvalidParamError, 100000) as info:
        dev.malloc(1, 42)
    for p in Policy:
        assert f"ACL_MEM_MALLOC_{p.name}={p.value}" in info.value.message
    with raises_acl(InvalidParamError, 100000) as info:
        dev.memcpy(1, 1, 1, 1, 9)
    assert "ACL_MEMCPY_DEFAULT=4" in info.value.message
    with raises_acl(InvalidParamError, 100000) as info:
        dev.mem_info(99)
    assert "ACL_HBM_MEM_HUGE1G=10" in info.value.message


def test_past_the_end_message_names_the_allocation(dev):
    p = dev.malloc(100)
    with raises_acl(InvalidParamError, 107000) as info:
        dev.read(p + 40, 70)
    assert f"{p:#x}" in info.value.message
    assert "10 bytes past the end" in info.value.message
    assert "(100 bytes)" in info.value.message


# --------------------------------------------------------------------------------------------
# Regressions: bugs found by this suite, fixed
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("count", [2**63, 2**64 - 1])
def test_read_count_is_checked_first(dev, count):
    p = dev.malloc(100)
    with raises_acl(InvalidParamError, 107000, match="past the end"):
        dev.read(p, count)


@pytest.mark.parametrize("value", [-1, 2**64])
def test_format_size_out_of_range(value):
    with raises_acl(InvalidParamError, 100000):
        npumem.format_size(value)


def run_isolated(code: str, *, memory_limit: int | None = None, timeout: float = 30) -> subprocess.CompletedProcess:
    """Runs ``code`` in a fresh interpreter (a crash there cannot take the test run down)."""

    def limit():  # pragma: no cover - runs in the child
        if memory_limit is not None:
            import resource

            resource.setrlimit(resource.RLIMIT_AS, (memory_limit, memory_limit))

    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
        preexec_fn=limit,
        env={**os.environ, "OPENBLAS_NUM_THREADS": "1"},
    )


def test_isolated_runner_reports_success():
    r = run_isolated("import npumem; print(npumem.Device('16MiB', allocator='direct').mem_info())")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str((16 * MiB, 16 * MiB))


@pytest.mark.parametrize(
    "call",
    ["d.to_numpy(p, (4,), object)", "d.read_into(p, np.empty(4, dtype=object))"],
    ids=["to_numpy", "read_into"],
)
def test_object_arrays_are_refused(call):
    r = run_isolated(
        f"""
        import numpy as np, npumem
        d = npumem.Device("16MiB", allocator="direct")
        p = d.malloc(64)
        d.write(p, bytes(range(1, 65)))
        try:
            out = {call}
            print(repr(out))
        except (npumem.AclError, TypeError) as e:
            print("refused:", type(e).__name__)
        """
    )
    assert r.returncode == 0, f"crashed with {r.returncode}: {r.stderr[-500:]}"
    assert r.stdout.startswith("refused:")


def test_absurd_capacity_is_refused():
    r = run_isolated(
        """
        import npumem
        try:
            npumem.Device(2**64 - 1, allocator="direct")
            print("accepted")
        except npumem.InvalidParamError as e:
            print("refused", e.code)
        """,
        memory_limit=512 * MiB,
    )
    assert r.returncode == 0, f"crashed with {r.returncode}: {r.stderr[-300:]}"
    assert r.stdout.strip() == "refused 100000"


def test_from_numpy_frees_on_a_failed_write():
    class Failing(Device):
        def write(self, ptr, buffer):
            raise RuntimeError("injected")

    d = Failing("16MiB", allocator="direct")
    before = snapshot(d)
    with pytest.raises(RuntimeError, match="injected"):
        d.from_numpy(np.arange(1000))
    after = snapshot(d)
    assert after["allocations"] == [] and after["mem_info"] == before["mem_info"]
    assert after["frames"] == before["frames"]
    assert after["stats"]["live_count"] == 0


def test_errors_are_raised_across_threads(dev):
    errors = run_in_threads(lambda _: dev.malloc(0), 8)
    assert len(errors) == 8
    assert all(type(e) is InvalidParamError and e.code == 100000 for e in errors)


def test_unchanged_helper_catches_failed_malloc_counter(dev):
    """``unchanged`` must fail when failed_mallocs moves unexpectedly."""
    with pytest.raises(AssertionError), unchanged(dev), pytest.raises(OutOfMemoryError):
        dev.malloc(GiB)
