"""Resource limits: TLB sizes and cycle costs are bounded before anything is allocated, device
copies move through bounded pieces and never materialise unwritten memory, durations and costs
are bounded and the simulated clocks never wrap.

Reproductions that could abort run in a fresh interpreter under an address-space limit, so an
abort shows up as a signal (a failed test), not as the end of the test run."""

from __future__ import annotations

import json
import math
import resource
import subprocess
import sys
import textwrap

import pytest
from conftest import GiB, KiB, MiB, raises_acl, unchanged
from hypothesis import given
from hypothesis import strategies as st

from npumem import Device, InvalidParamError, Policy
from npumem.tlb import Tlb

#: The address-space limit of the isolated reproductions: far below what an abort needed (an
#: 8 GiB bounce buffer, terabytes of TLB entries), far above what the interpreter, numpy and
#: npumem take (about 150 MiB).
LIMIT = 1 * GiB

PRELUDE = """
import json, re
import npumem
from npumem.tlb import Tlb

def report(run):
    try:
        value = run()
    except BaseException as e:
        out = {"raised": type(e).__name__, "code": getattr(e, "code", None), "message": str(e)}
    else:
        out = {"raised": None, "value": value}
    # This process's own peak resident set (VmHWM): ru_maxrss would also count the pytest
    # process it was forked from, which keeps its high-water mark across exec.
    with open("/proc/self/status") as status:
        out["maxrss"] = int(re.search(r"VmHWM:\\s*(\\d+) kB", status.read()).group(1)) * 1024
    print(json.dumps(out))
"""


def isolated(body: str, limit: int = LIMIT) -> dict:
    """Runs ``body`` (which defines ``run()``) in a fresh interpreter limited to ``limit`` bytes of
    address space; checks that it exited normally (no signal, no Rust panic message) and returns
    what ``run`` returned or raised."""

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    code = PRELUDE + textwrap.dedent(body) + "\nreport(run)\n"
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, preexec_fn=cap, timeout=300, check=False
    )
    assert proc.returncode == 0, f"exit {proc.returncode} (negative: killed by a signal)\n{proc.stderr[-2000:]}"
    assert "panicked" not in proc.stderr and "memory allocation of" not in proc.stderr, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def assert_refused(out: dict, cls: type, code: int, *names: str) -> None:
    """The isolated run raised exactly ``cls`` with ``code`` and a message naming ``names``."""
    assert out["raised"] == cls.__name__, out
    assert out["code"] == code, out
    for name in names:
        assert name in out["message"], (name, out["message"])


# --------------------------------------------------------------------------------------------
# TLB configuration: every size and cycle count bounded before anything is allocated
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "names"),
    [
        ({"walk_cache_entries": [2**40, 1, 1]}, ["walk_cache_entries[0]", str(2**40), "0 to 4096"]),
        ({"walk_cache_entries": [1, 1, 2**62]}, ["walk_cache_entries[2]", str(2**62)]),
        ({"0.0.entries": 2**40, "0.0.ways": 1}, ["0.0.entries", str(2**40), "1 to 1048576"]),
        ({"0.0.entries": 2**62, "0.0.ways": 1}, ["0.0.entries", str(2**62)]),
        ({"1.0.entries": 2**40}, ["1.0.entries", str(2**40)]),
        ({"0.0.entries": 2**64, "0.0.ways": 1}, ["0.0.entries", str(2**64)]),
        ({"0.0.ways": 2**40}, ["0.0.ways", str(2**40)]),
        ({"walk_step_cycles": 2**64 - 1}, ["walk_step_cycles", str(2**64 - 1), "0 to 1000000"]),
        ({"walk_step_cycles": 2**64}, ["walk_step_cycles", str(2**64)]),
        ({"walk_step_cycles": -1}, ["walk_step_cycles", "-1"]),
        ({"1.0.hit_cycles": 2**63}, ["1.0.hit_cycles", str(2**63)]),
        ({"coalesce": 2**40}, ["coalesce", str(2**40)]),
    ],
)
def test_tlb_sizes_that_aborted_are_refused(overrides: dict, names: list[str]) -> None:
    out = isolated(f"""
        def run():
            dev = npumem.Device(64 << 20)
            Tlb.preset("zen4", dev, **{overrides!r})
    """)
    assert_refused(out, InvalidParamError, 100000, *names)
    assert out["maxrss"] < 512 * MiB, "nothing was allocated for the refused sizes"


def test_tlb_bad_overrides_name_the_field(dev: Device) -> None:
    with raises_acl(InvalidParamError, 100000, match="walk_cache_entries must hold 3 ints"):
        Tlb.preset("zen4", dev, walk_cache_entries=[1, 2])
    with raises_acl(InvalidParamError, 100000, match=r"0\.0\.ways .*power of two for pseudo-LRU"):
        Tlb.preset("ascend_like", dev, **{"0.0.ways": 128, "0.0.entries": 128})
    with raises_acl(InvalidParamError, 100000, match=r"0\.0\.ways.*multiple of ways"):
        Tlb.preset("zen4", dev, **{"0.0.ways": 7})
    with raises_acl(InvalidParamError, 100000, match=r"no array 5 at level 0"):
        Tlb.preset("zen4", dev, **{"0.5.entries": 8})
    with pytest.raises(TypeError, match="walk_step_cycles must be an int, got str"):
        Tlb.preset("zen4", dev, walk_step_cycles="fast")
    with pytest.raises(TypeError, match=r"0\.0\.entries must be an int, got float"):
        Tlb.preset("zen4", dev, **{"0.0.entries": 64.0})
    with pytest.raises(TypeError, match=r"0\.0\.replacement must be a str"):
        Tlb.preset("zen4", dev, **{"0.0.replacement": 5})
    with pytest.raises(TypeError, match="walk_cache_entries must be a list of 3 ints"):
        Tlb.preset("zen4", dev, walk_cache_entries=7)
    tlb = Tlb.preset("zen4", dev)
    with raises_acl(InvalidParamError, 100000, match=r"page_size must be .*18446744073709551616"):
        tlb.nominal_reach(2**64)
    with raises_acl(InvalidParamError, 100000, match="page_size must be 4096, .* got 4097"):
        tlb.nominal_reach(4097)


def test_tlb_largest_accepted_sizes_build_and_run(dev: Device) -> None:
    tlb = Tlb.preset(
        "zen4",
        dev,
        walk_cache_entries=[4096, 4096, 4096],
        walk_step_cycles=1_000_000,
        **{"1.0.entries": 1 << 20, "1.0.ways": 8, "1.0.hit_cycles": 1_000_000},
    )
    ptr = dev.malloc(1 * MiB, Policy.NORMAL_ONLY)
    stats = tlb.run([ptr + i * 4096 for i in range(256)])
    assert stats.walks == 256
    assert stats.cycles == stats.walk_steps * 1_000_000 > 0
    assert tlb.config["walk_cache_entries"] == [4096, 4096, 4096]


# --------------------------------------------------------------------------------------------
# Device copies: bounded pieces, unwritten memory never materialised
# --------------------------------------------------------------------------------------------


def test_copying_8_gib_device_to_device_fits_in_a_small_address_space() -> None:
    out = isolated("""
        def run():
            dev = npumem.Device(20 << 30)
            size = 8 << 30
            a, b = dev.malloc(size), dev.malloc(size)
            marks = [0, 3 << 30, size - 4096]
            for at in marks:
                dev.write(a + at, b"mark@%d" % at)
            dev.write(b + (5 << 30), b"overwritten")
            dev.memcpy(b, size, a, size)
            synced = [dev.read(b + at, 16) for at in marks] + [dev.read(b + (5 << 30), 11)]
            # Async and stream-ordered: the copy lands when the stream completes.
            s = dev.create_stream()
            dev.memcpy_async(a, size, b, size, stream=s)
            dev.synchronize_stream(s)
            back = [dev.read(a + at, 16) for at in marks]
            dev.memset(b, size, 0, size)
            return [x.hex() for x in synced + back] + [dev.read(b, 8).hex()]
    """)
    assert out["raised"] is None, out
    values = [bytes.fromhex(x) for x in out["value"]]
    for at, got in zip([0, 3 << 30, (8 << 30) - 4096], values[:3], strict=True):
        assert got.startswith(b"mark@%d" % at)
    assert values[3] == bytes(11), "unwritten source bytes overwrite written destination bytes with zeros"
    assert values[4:7] == values[:3]
    assert values[7] == bytes(8)
    assert out["maxrss"] < 512 * MiB, "no bounce buffer, no zeros materialised"


def test_host_memory_exhausted_by_a_fill_is_an_error_that_changes_nothing() -> None:
    out = isolated("""
        def run():
            dev = npumem.Device(4 << 30)
            size = 2 << 30
            p = dev.malloc(size)
            dev.write(p + 100, b"kept")
            stats = dev.stats()
            try:
                dev.memset(p, size, 0xAB, size)  # 2 GiB of real bytes: more than the host allows
            except npumem.OutOfMemoryError as e:
                error = (type(e).__name__, e.code, e.message)
            else:
                error = None
            # Nothing changed, and the device still works.
            assert dev.stats() == stats, (dev.stats(), stats)
            assert dev.read(p + 100, 4) == b"kept" and dev.read(p + (1 << 30), 4) == bytes(4)
            dev.memset(p, size, 0xCD, 1 << 20)
            assert dev.read(p, 2) == b"\\xcd\\xcd"
            dev.free(p)
            return error
    """)
    assert out["raised"] is None, out
    name, code, message = out["value"]
    assert (name, code) == ("OutOfMemoryError", 207001)
    assert "host has no memory left" in message


def test_read_is_validated_before_its_buffer_is_made() -> None:
    out = isolated("""
        def run():
            dev = npumem.Device(64 << 20)
            p = dev.malloc(1 << 20)
            dev.read(p, 1 << 40)
    """)
    assert_refused(out, InvalidParamError, 107000, str(1 << 40), "past the end of the allocation")


def test_reading_unwritten_memory_yields_zeros(dev: Device) -> None:
    p = dev.malloc(8 * MiB)
    assert dev.read(p + 3 * MiB, 64 * KiB) == bytes(64 * KiB)
    dev.memset(p, 8 * MiB, 7, 4096)
    dev.memcpy(p + 5 * MiB, 3 * MiB, p + 1 * MiB, 3 * MiB)
    assert dev.read(p + 5 * MiB, 4096) == bytes(4096)
    assert dev.read(p, 4096) == b"\x07" * 4096


@given(
    ops=st.lists(
        st.tuples(
            st.sampled_from(["write", "memset", "memcpy", "memcpy_async"]),
            st.integers(0, 96 * KiB),
            st.integers(0, 96 * KiB),
            st.integers(0, 40 * KiB),
        ),
        min_size=1,
        max_size=12,
    )
)
def test_copies_behave_as_memmove_on_scattered_pages(ops: list[tuple[str, int, int, int]]) -> None:
    # 4 KiB pages taken from the holes of a fragmented device: physically scattered.
    dev = Device(8 * MiB, allocator="direct")
    small = [dev.malloc(4 * KiB - 64, Policy.NORMAL_ONLY) for _ in range(64)]
    for p in small[::2]:
        dev.free(p)
    size = 128 * KiB
    base = dev.malloc(size, Policy.NORMAL_ONLY)
    frames = {dev.translate(base + i * 4096)[0] for i in range(size // 4096)}
    assert max(frames) - min(frames) > size, "the pages are not physically contiguous"
    model = bytearray(size)
    stream = dev.create_stream()
    for i, (op, dst, src, n) in enumerate(ops):
        n = min(n, size - dst, size - src)
        if op == "write":
            data = bytes((k * 7 + i) % 251 + 1 for k in range(n))
            dev.write(base + dst, data)
            model[dst : dst + n] = data
        elif op == "memset":
            dev.memset(base + dst, n, src % 3, n)
            model[dst : dst + n] = bytes([src % 3]) * n
        else:
            if op == "memcpy":
                dev.memcpy(base + dst, n, base + src, n)
            else:
                dev.memcpy_async(base + dst, n, base + src, n, stream=stream)
                dev.synchronize_stream(stream)
            model[dst : dst + n] = model[src : src + n]
        assert dev.read(base, size) == bytes(model)


# --------------------------------------------------------------------------------------------
# Durations, costs and clocks: bounded inputs, checked arithmetic, no wrap-around
# --------------------------------------------------------------------------------------------


def clock_state(dev: Device) -> tuple:
    return dev.now_us(), dev.timeline(), dev.cost_model(), dev.stats()


@pytest.mark.parametrize(
    "duration", [1e300, math.inf, -math.inf, math.nan, -1.0, -1e-9, 9.1e12, pytest.param(10**400, id="10**400")]
)
def test_launch_refuses_durations_that_would_wrap_the_clock(duration: float) -> None:
    dev = Device("64MiB")
    s = dev.create_stream()
    dev.launch(s, 10.0)
    before = clock_state(dev)
    with unchanged(dev), raises_acl(InvalidParamError, 100000, match="duration") as info:
        dev.launch(s, duration)
    if isinstance(duration, float):
        assert "microseconds from 0 to 9007199254740.992" in info.value.message
    else:
        assert "too large for a float" in info.value.message
    assert clock_state(dev) == before


def test_launch_duration_must_be_a_number(dev: Device) -> None:
    s = dev.create_stream()
    with pytest.raises(TypeError, match="duration must be a number, got str"):
        dev.launch(s, "fast")


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("launch_ns", 1e30),
        ("launch_ns", math.nan),
        ("map_ns", math.inf),
        ("driver_alloc_ns", -5.0),
        ("pcie_latency_ns", 2e9),
        ("hbm_bandwidth", 1e-300),
        ("hbm_bandwidth", 0),
        ("p2p_bandwidth", 1e300),
        pytest.param("pcie_pinned_bandwidth", 10**400, id="pcie_pinned_bandwidth-10**400"),
    ],
)
def test_set_cost_refuses_values_out_of_bounds(field: str, value: float) -> None:
    dev = Device("64MiB")
    before = clock_state(dev)
    with unchanged(dev), raises_acl(InvalidParamError, 100000, match=field):
        dev.set_cost(field, value)
    assert clock_state(dev) == before


def test_set_cost_bounds_are_inclusive_and_named(dev: Device) -> None:
    dev.set_cost("launch_ns", 1e9)
    dev.set_cost("hbm_bandwidth", 1e6)
    dev.set_cost("pcie_pinned_bandwidth", 1e15)
    with raises_acl(InvalidParamError, 100000, match=r"launch_ns must be a finite number from 0 to 1e9 ns"):
        dev.set_cost("launch_ns", 1e9 + 1)
    with raises_acl(InvalidParamError, 100000, match=r"from 1e6 to 1e15 bytes/s"):
        dev.set_cost("hbm_bandwidth", 999_999.0)
    with pytest.raises(TypeError, match="map_ns must be a number, got str"):
        dev.set_cost("map_ns", "slow")


def test_the_clock_never_runs_backwards() -> None:
    dev = Device("64MiB")
    s = dev.create_stream()
    longest = 2**53 / 1e3  # microseconds
    ends = []
    while True:
        try:
            ends.append(dev.launch(s, longest)[1])
        except InvalidParamError as e:
            assert e.code == 100000
            assert "kernel on stream" in e.message and "2^64-1 ns" in e.message, e.message
            break
        assert len(ends) <= 2048, "the stream's end passed 2**64 ns without an error"
    assert ends == sorted(ends) and len(set(ends)) == len(ends)
    assert ends[-1] * 1e3 <= 2**64
    before = clock_state(dev)
    with pytest.raises(InvalidParamError):
        dev.launch(s, 1.0 + longest)
    assert clock_state(dev) == before, "a refused launch changes nothing"
    # Other streams and the host keep working below the limit.
    other = dev.create_stream()
    start, end = dev.launch(other, 5.0)
    assert 0 < start < end < ends[-1]
    dev.synchronize_stream(other)
    assert dev.now_us() >= end


def test_slowest_costs_keep_times_finite_and_ordered(dev: Device) -> None:
    dev.set_cost("hbm_bandwidth", 1e6)
    dev.set_cost("launch_ns", 1e9)
    p = dev.malloc(16 * MiB)
    s = dev.create_stream()
    start, end = dev.memcpy_async(p + 8 * MiB, 8 * MiB, p, 8 * MiB, stream=s)
    assert end - start == pytest.approx(2 * 8 * MiB / 1e6 * 1e6, rel=1e-9)
    assert start >= 1e6, "the launch cost moved the host clock by a second"
    dev.synchronize_device()
    assert dev.now_us() == end
