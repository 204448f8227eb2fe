"""Property-testing tools for allocators: hypothesis strategies for allocation workloads, and a
stateful machine that checks any allocator exposing ``malloc``/``free``.

Needs hypothesis (``pip install 'npumem[testing]'``); importing this module without it raises
``MissingDependencyError`` with that hint.

The allocator under test is any object with ``malloc(size) -> int`` and ``free(ptr)`` (the
:class:`Allocator` protocol). What it offers beyond that is checked too:

- ``alignment`` (int attribute): every pointer must be a multiple of it;
- ``write(ptr, data)`` and ``read(ptr, n)``: the machine writes a pattern into each block it
  gets and reads it back before the block is freed and whenever it checks it — a block that
  overlaps another live one, or that the allocator scribbles on, shows as corrupted data;
- ``stats()`` returning any of ``allocated_bytes``, ``reserved_bytes``, ``live_blocks``:
  ``allocated_bytes`` is at least the live requested bytes, ``reserved_bytes`` at least
  ``allocated_bytes``, ``live_blocks`` the number of live blocks, and after everything is freed
  (the machine's teardown) ``allocated_bytes`` and ``live_blocks`` are 0;
- ``options`` (a mapping from keyword to a list of values, e.g. ``{"policy": [...],
  "stream": [...]}``): the machine draws one value of each per malloc and passes them as
  keyword arguments;
- ``oom_errors`` (a tuple of exception types, default ``(MemoryError, OutOfMemoryError)``): a
  malloc that raises one of these is a legal refusal, not a failure.

Every check, whatever the allocator: a pointer is an int, a live block never overlaps another
live block (half-open ``[ptr, ptr + size)``), a block's data survives until its free.

:class:`DeviceAdapter` points the machine at an npumem :class:`~npumem.Device` of any allocator
family (``allocator_machine(lambda: DeviceAdapter(Device("1GiB", allocator="pytorch")))``).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from . import _args
from ._optional import require
from .enums import Policy
from .errors import OutOfMemoryError

require("hypothesis", "npumem.testing")

from hypothesis import strategies as st  # noqa: E402
from hypothesis.stateful import (  # noqa: E402
    Bundle,
    RuleBasedStateMachine,
    consumes,
    invariant,
    multiple,
    rule,
    run_state_machine_as_test,
)

__all__ = [
    "Allocator",
    "AllocatorCheckError",
    "DeviceAdapter",
    "allocator_machine",
    "check_allocator",
    "lifetimes",
    "policies",
    "sizes",
    "workloads",
]


@runtime_checkable
class Allocator(Protocol):
    """What the machine needs: ``malloc(size) -> int`` and ``free(ptr)``."""

    def malloc(self, size: int) -> int: ...

    def free(self, ptr: int) -> None: ...


class AllocatorCheckError(AssertionError):
    """A broken promise of the allocator under test (overlap, misalignment, corrupted data,
    inconsistent stats); the message says which blocks and values."""


# -- strategies ----------------------------------------------------------------------------------

KiB, MiB = 1 << 10, 1 << 20


def sizes(min_size: int = 1, max_size: int = 64 * MiB) -> st.SearchStrategy[int]:
    """Allocation sizes in ``[min_size, max_size]`` shaped like tensors': mostly small (up to
    4 KiB), powers of two and their neighbours (odd sizes just over a boundary are where
    rounding bugs live), and anything in range; shrinks towards ``min_size``."""
    lo = _args.integer(min_size, "min_size", 1, _args.U64_MAX)
    hi = _args.integer(max_size, "max_size", lo, _args.U64_MAX)
    powers = [1 << k for k in range(hi.bit_length()) if lo <= 1 << k <= hi]
    near = st.sampled_from(powers).flatmap(lambda p: st.integers(max(lo, p - 64), min(hi, p + 64))) if powers else None
    parts = [st.integers(lo, min(hi, max(lo, 4 * KiB))), st.integers(lo, hi)]
    if near is not None:
        parts.insert(1, near)
    return st.one_of(*parts)


def lifetimes(max_lifetime: int = 32) -> st.SearchStrategy[int | None]:
    """How many later allocations a block outlives (0: freed before the next one), or None: it
    lives to the end of the workload."""
    hi = _args.integer(max_lifetime, "max_lifetime", 0, 1 << 20)
    return st.one_of(st.integers(0, hi), st.none())


def policies(family: str = "npumem") -> st.SearchStrategy[Policy]:
    """The malloc policies ``family`` honours (the caching families serve HUGE_FIRST only)."""
    family = _args.choice(family, "family", ("npumem", "direct", "pytorch", "torch_npu"))
    if family in ("pytorch", "torch_npu"):
        return st.just(Policy.HUGE_FIRST)
    return st.sampled_from([Policy.HUGE_FIRST, Policy.HUGE_ONLY, Policy.NORMAL_ONLY])


def workloads(
    max_allocs: int = 40,
    size: st.SearchStrategy[int] | None = None,
    lifetime: st.SearchStrategy[int | None] | None = None,
    streams: int = 1,
    policy: st.SearchStrategy[Policy] | None = None,
) -> st.SearchStrategy[list[Any]]:
    """A workload: up to ``max_allocs`` allocations with sizes from ``size`` (default
    :func:`sizes`) and lifetimes from ``lifetime`` (default :func:`lifetimes`), each freed once.

    Events are what :func:`npumem.replay.replay` takes: ``("alloc", id, size)`` /
    ``("free", id, size)`` tuples, or — with ``streams`` > 1 or a ``policy`` strategy — mappings
    that add ``stream`` (0 to ``streams - 1``) and ``policy``. Every id is allocated once and
    freed once, after its allocation; a block whose lifetime is None is freed at the end. The
    arguments are checked when the strategy is made, not when it is drawn from."""
    max_allocs = _args.integer(max_allocs, "max_allocs", 1, 1 << 16)
    streams = _args.integer(streams, "streams", 1, 1 << 10)
    size = sizes() if size is None else size
    lifetime = lifetimes() if lifetime is None else lifetime
    for value, name in ((size, "size"), (lifetime, "lifetime"), (policy, "policy")):
        if value is not None and not isinstance(value, st.SearchStrategy):
            raise _args.type_error(name, value, "a hypothesis strategy or None")
    return _workloads(max_allocs, size, lifetime, streams, policy)


@st.composite
def _workloads(
    draw: Any,
    max_allocs: int,
    size: st.SearchStrategy[int],
    lifetime: st.SearchStrategy[int | None],
    streams: int,
    policy: st.SearchStrategy[Policy] | None,
) -> list[Any]:
    n = draw(st.integers(1, max_allocs))
    rich = streams > 1 or policy is not None
    events: list[Any] = []
    due: dict[int, list[tuple[int, int, int]]] = {}
    forever: list[tuple[int, int, int]] = []
    for i in range(n):
        nbytes = draw(size)
        s = draw(st.integers(0, streams - 1)) if streams > 1 else 0
        if rich:
            ev: dict[str, Any] = {"action": "alloc", "id": i, "size": nbytes, "stream": s}
            if policy is not None:
                ev["policy"] = int(draw(policy))
            events.append(ev)
        else:
            events.append(("alloc", i, nbytes))
        life = draw(lifetime)
        (forever if life is None else due.setdefault(i + life, [])).append((i, nbytes, s))
        for j, jb, js in due.pop(i, []):
            events.append(_free(j, jb, js, rich))
    for k in sorted(due):
        for j, jb, js in due[k]:
            events.append(_free(j, jb, js, rich))
    for j, jb, js in forever:
        events.append(_free(j, jb, js, rich))
    return events


def _free(i: int, size: int, stream: int, rich: bool) -> Any:
    return {"action": "free", "id": i, "size": size, "stream": stream} if rich else ("free", i, size)


# -- adapters ------------------------------------------------------------------------------------


class DeviceAdapter:
    """An npumem :class:`~npumem.Device` as an :class:`Allocator`: malloc with a drawn policy
    and stream (``policies``; ``streams`` streams are created, plus the default one), data
    through ``write``/``read``, stats from ``memory_stats()``. Alignment: 512 B for the pooled
    families (their 512 B quantum), the page size for ``direct``."""

    def __init__(self, device: Any, *, policies: Sequence[Policy] | None = None, streams: int = 0) -> None:
        from .device import Device

        if not isinstance(device, Device):
            raise _args.type_error("device", device, "an npumem.Device")
        streams = _args.integer(streams, "streams", 0, 64)
        self.device = device
        if policies is None:
            policies = [Policy.HUGE_FIRST]
        self.options: dict[str, list[Any]] = {"policy": [_args.member(p, "policies", Policy) for p in policies]}
        if streams:
            self.options["stream"] = [None] + [device.create_stream() for _ in range(streams)]
        self.alignment = device.normal_page if device.allocator == "direct" else 512
        self.oom_errors = (OutOfMemoryError,)

    def malloc(self, size: int, policy: Policy = Policy.HUGE_FIRST, stream: int | None = None) -> int:
        return self.device.malloc(size, policy, stream)

    def free(self, ptr: int) -> None:
        self.device.free(ptr)

    def write(self, ptr: int, data: bytes) -> None:
        self.device.write(ptr, data)

    def read(self, ptr: int, n: int) -> bytes:
        return self.device.read(ptr, n)

    def stats(self) -> dict[str, int]:
        s = self.device.memory_stats()
        return {
            "allocated_bytes": s["allocated_bytes.all.current"],
            "reserved_bytes": s["reserved_bytes.all.current"],
            "live_blocks": s["allocation.all.current"],
        }


# -- the stateful machine ------------------------------------------------------------------------

#: Bytes of pattern written at each end of a block.
PATTERN_BYTES = 64


def _pattern(serial: int, n: int) -> bytes:
    """``n`` bytes that differ from block to block (a multiplicative hash of the serial)."""
    seed = (serial * 0x9E3779B1 + 0x7F4A7C15) & 0xFFFFFFFF
    return bytes((seed >> (8 * (k % 4)) ^ k * 151) & 0xFF for k in range(n))


def allocator_machine(
    factory: Callable[[], Any],
    *,
    size: st.SearchStrategy[int] | None = None,
    check_data: bool = True,
) -> type[RuleBasedStateMachine]:
    """A :class:`hypothesis.stateful.RuleBasedStateMachine` class that builds an allocator with
    ``factory()`` for each example and runs random mallocs (sizes from ``size``, default
    ``sizes(1, 4 MiB)``), frees and data checks against it, checking the promises the module doc
    lists after each step. Run it with ``TestX = allocator_machine(f).TestCase`` (pytest /
    unittest) or :func:`check_allocator`."""
    if not callable(factory):
        raise _args.type_error("factory", factory, "a callable that returns an allocator")
    size = sizes(1, 4 * MiB) if size is None else size
    check_data = _args.flag(check_data, "check_data")
    probe = factory()
    if not isinstance(probe, Allocator):
        raise _args.type_error("factory()", probe, "an object with malloc(size) and free(ptr)")
    options: Mapping[str, Sequence[Any]] = getattr(probe, "options", None) or {}
    option_names = sorted(options)
    option_values = st.fixed_dictionaries({k: st.sampled_from(list(options[k])) for k in option_names})
    _close(probe)

    class AllocatorMachine(RuleBasedStateMachine):
        blocks = Bundle("blocks")

        def __init__(self) -> None:
            super().__init__()
            self.allocator = factory()
            self.alignment = int(getattr(self.allocator, "alignment", 1) or 1)
            self.oom_errors = (*getattr(self.allocator, "oom_errors", ()), MemoryError, OutOfMemoryError)
            self.data = check_data and hasattr(self.allocator, "write") and hasattr(self.allocator, "read")
            self.has_stats = callable(getattr(self.allocator, "stats", None))
            self.live: dict[int, tuple[int, int]] = {}  # ptr -> (size, serial)
            self.starts: list[int] = []  # sorted ptrs of live blocks
            self.serial = 0
            self.failed = False

        def _fail(self, what: str) -> None:
            self.failed = True  # the teardown then only frees, so this failure is the one reported
            raise AllocatorCheckError(f"{type(self.allocator).__name__}: {what}")

        @rule(target=blocks, nbytes=size, opts=option_values)
        def malloc(self, nbytes: int, opts: dict[str, Any]) -> Any:
            try:
                ptr = self.allocator.malloc(nbytes, **opts)
            except self.oom_errors:
                return multiple()
            if not _args.is_int(ptr) or ptr < 0:
                self._fail(f"malloc({nbytes}) returned {ptr!r}, not a non-negative int pointer")
            ptr = int(ptr)
            if ptr % self.alignment:
                self._fail(f"malloc({nbytes}) returned {ptr:#x}, not a multiple of alignment {self.alignment}")
            k = bisect.bisect_right(self.starts, ptr)
            if k and self.starts[k - 1] + self.live[self.starts[k - 1]][0] > ptr:
                prev = self.starts[k - 1]
                self._fail(
                    f"malloc({nbytes}) returned {ptr:#x}, inside the live block [{prev:#x}, "
                    f"{prev + self.live[prev][0]:#x})"
                )
            if k < len(self.starts) and ptr + nbytes > self.starts[k]:
                nxt = self.starts[k]
                self._fail(
                    f"malloc({nbytes}) returned [{ptr:#x}, {ptr + nbytes:#x}), overlapping the live block "
                    f"[{nxt:#x}, {nxt + self.live[nxt][0]:#x})"
                )
            self.serial += 1
            self.live[ptr] = (nbytes, self.serial)
            self.starts.insert(k, ptr)
            if self.data:
                for off, pat in self._patterns(ptr):
                    self.allocator.write(off, pat)
            return ptr

        def _patterns(self, ptr: int) -> list[tuple[int, bytes]]:
            nbytes, serial = self.live[ptr]
            head = _pattern(serial, min(nbytes, PATTERN_BYTES))
            if nbytes <= PATTERN_BYTES:
                return [(ptr, head)]
            tail_len = min(PATTERN_BYTES, nbytes - PATTERN_BYTES)
            return [(ptr, head), (ptr + nbytes - tail_len, _pattern(~serial, tail_len))]

        def _check_data(self, ptr: int) -> None:
            if not self.data:
                return
            for off, pat in self._patterns(ptr):
                got = bytes(self.allocator.read(off, len(pat)))
                if got != pat:
                    nbytes = self.live[ptr][0]
                    self._fail(
                        f"the data of the block [{ptr:#x}, {ptr + nbytes:#x}) changed at {off:#x}: wrote "
                        f"{pat[:8].hex()}..., read {got[:8].hex()}... (another block overlaps it, or the "
                        "allocator wrote into it)"
                    )

        @rule(ptr=consumes(blocks))
        def free(self, ptr: int) -> None:
            self._check_data(ptr)
            self.allocator.free(ptr)
            del self.live[ptr]
            self.starts.remove(ptr)

        @rule(ptr=blocks)
        def check(self, ptr: int) -> None:
            self._check_data(ptr)

        @invariant()
        def stats_consistent(self) -> None:
            if not self.has_stats:
                return
            s = self.allocator.stats()
            requested = sum(n for n, _ in self.live.values())
            allocated, reserved = s.get("allocated_bytes"), s.get("reserved_bytes")
            if allocated is not None and allocated < requested:
                self._fail(f"stats say {allocated:,} bytes allocated, but {requested:,} requested bytes are live")
            if allocated is not None and reserved is not None and reserved < allocated:
                self._fail(f"stats say {reserved:,} bytes reserved, fewer than the {allocated:,} allocated")
            blocks = s.get("live_blocks")
            if blocks is not None and blocks != len(self.live):
                self._fail(f"stats say {blocks} live blocks; {len(self.live)} are live")

        def teardown(self) -> None:
            if self.failed:
                _close(self.allocator)
                return
            try:
                for ptr in list(self.starts):
                    self.free(ptr)
                if self.has_stats:
                    s = self.allocator.stats()
                    if s.get("allocated_bytes", 0) or s.get("live_blocks", 0):
                        self._fail(f"everything was freed, but stats say {dict(s)}")
            finally:
                _close(self.allocator)

    AllocatorMachine.__name__ = AllocatorMachine.__qualname__ = f"AllocatorMachine[{type(probe).__name__}]"
    return AllocatorMachine


def _close(allocator: Any) -> None:
    close = getattr(allocator, "close", None)
    if callable(close):
        close()


def check_allocator(
    factory: Callable[[], Any],
    *,
    max_examples: int = 50,
    steps: int = 50,
    size: st.SearchStrategy[int] | None = None,
    check_data: bool = True,
) -> None:
    """Runs :func:`allocator_machine` for ``max_examples`` programs of up to ``steps`` steps;
    raises :class:`AllocatorCheckError` (with hypothesis's shrunk program printed) on the first
    broken promise."""
    from hypothesis import HealthCheck, settings

    max_examples = _args.integer(max_examples, "max_examples", 1, 1 << 20)
    steps = _args.integer(steps, "steps", 1, 1 << 20)
    machine = allocator_machine(factory, size=size, check_data=check_data)
    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=max_examples,
            stateful_step_count=steps,
            deadline=None,
            report_multiple_bugs=False,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
