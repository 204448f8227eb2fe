"""Replaying allocation traces against a device, and the smallest capacity a trace fits in.

A trace is a sequence of events. Each event is ``("alloc", id, size)`` or ``("free", id)`` (a
3-tuple ``("free", id, size)`` is accepted too), or a mapping with ``action`` (``"alloc"`` /
``"free"``, PyTorch's ``"free_requested"`` / ``"free_completed"`` are read as free), ``id`` or
``addr``, and ``size``. Ids are any hashable values naming a live allocation.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from . import _args
from .device import Device
from .enums import Policy
from .errors import invalid_param

Event = tuple[str, Any, int] | tuple[str, Any] | Mapping[str, Any]

_FREE_ACTIONS = {"free", "free_requested", "free_completed"}
# Actions of PyTorch device traces that do not change what the program holds.
_IGNORED_ACTIONS = {"segment_alloc", "segment_free", "segment_map", "segment_unmap", "snapshot", "oom"}


def event_fields(ev: Any, n: int) -> tuple[Any, Any, Any]:
    """``(action, id, size)`` of event number ``n`` (a tuple or a mapping, as the module doc
    says); the id must be hashable. The size is checked by the caller, for allocations."""
    if isinstance(ev, Mapping):
        action, key, size = ev.get("action"), ev.get("id", ev.get("addr")), ev.get("size", 0)
    elif isinstance(ev, Sequence) and not isinstance(ev, (str, bytes)) and len(ev) in (2, 3):
        action, key = ev[0], ev[1]
        size = ev[2] if len(ev) == 3 else 0
    else:
        raise invalid_param(f"event {n} is {_args.show(ev)}; use ('alloc', id, size) or ('free', id)")
    if not isinstance(action, str):
        raise invalid_param(f"event {n}: action {_args.show(action)} is not a string; use 'alloc' or 'free'")
    try:
        hash(key)
    except TypeError:
        raise invalid_param(f"event {n}: id {_args.show(key)} is not hashable; use an int, str or tuple") from None
    return action, key, size


def _events(events: Any) -> list[Any]:
    if isinstance(events, (str, bytes, Mapping)) or not isinstance(events, Iterable):
        raise _args.type_error("events", events, "a list of ('alloc', id, size) / ('free', id) events")
    return list(events)


def normalize(events: Iterable[Event]) -> list[tuple[bool, Any, int]]:
    """Events as (is_alloc, id, size) triples; raises InvalidParamError on malformed input
    (naming the event), TypeError when ``events`` is not a list of events.

    In a PyTorch device trace, which records both ``free_requested`` and ``free_completed``, the
    completed free is the one that returns memory; alone, either counts as the free."""
    events = _events(events)
    completed_marks = any(isinstance(e, Mapping) and e.get("action") == "free_completed" for e in events)
    out: list[tuple[bool, Any, int]] = []
    sizes: dict[Any, int] = {}
    for n, ev in enumerate(events):
        action, key, size = event_fields(ev, n)
        if action == "alloc":
            if not _args.is_int(size) or not 0 < size <= _args.U64_MAX:
                raise invalid_param(
                    f"event {n}: alloc of {_args.show(size)} bytes; sizes must be ints from 1 to 2**64-1"
                )
            size = int(size)
            if key in sizes:
                raise invalid_param(f"event {n}: id {key!r} allocated twice without a free")
            sizes[key] = size
            out.append((True, key, size))
        elif action in _FREE_ACTIONS:
            if action == "free_requested" and completed_marks:
                continue
            if key not in sizes:
                raise invalid_param(f"event {n}: free of unknown id {key!r}")
            out.append((False, key, sizes.pop(key)))
        elif action in _IGNORED_ACTIONS:
            continue
        else:
            raise invalid_param(f"event {n}: unknown action {_args.show(action)}; use 'alloc' or 'free'")
    return out


def peak_live_bytes(events: Iterable[Event]) -> int:
    """The largest sum of live requested bytes over the trace: no allocator can do with less."""
    return _peak(normalize(events))


def _peak(evs: list[tuple[bool, Any, int]]) -> int:
    live = peak = 0
    for is_alloc, _, size in evs:
        live += size if is_alloc else -size
        peak = max(peak, live)
    return peak


@dataclass
class ReplayResult:
    """What a replay cost. Byte figures are the allocator's own stats; ``device_allocs`` counts
    physical allocations from the device (segments, or pages for the npumem pool); the cache hit
    rate is the share of mallocs served without any new device memory."""

    allocator: str
    events: int
    allocs: int
    ooms: int
    completed: bool
    peak_live: int
    peak_allocated: int
    peak_reserved: int
    device_allocs: int
    device_frees: int
    maps: int
    physical_allocs: int
    cache_hit_rate: float
    first_oom: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


#: The keyword arguments of :class:`Device`.
_DEVICE_ARGS = frozenset(
    {"capacity", "normal_page", "giant_frames", "backend", "allocator", "alloc_conf", "preset", "sanitizer"}
)


def _config(config: Mapping[str, Any] | None, name: str) -> dict[str, Any]:
    """Keyword arguments of :class:`Device`, checked for names it does not take."""
    if config is None:
        return {}
    cfg = dict(_args.mapping(config, name))
    unknown = sorted(k for k in cfg if k not in _DEVICE_ARGS)
    if unknown:
        raise invalid_param(f"{name} has unknown Device arguments {unknown}; use {', '.join(sorted(_DEVICE_ARGS))}")
    return cfg


def _device(device_or_config: Device | Mapping[str, Any] | None) -> Device:
    if isinstance(device_or_config, Device):
        return device_or_config
    if device_or_config is not None and not isinstance(device_or_config, Mapping):
        raise _args.type_error("device_or_config", device_or_config, "a Device, a dict of Device arguments or None")
    return Device(**_config(device_or_config, "device_or_config"))


def replay(
    events: Iterable[Event],
    device_or_config: Device | Mapping[str, Any] | None = None,
    *,
    policy: int = Policy.HUGE_FIRST,
    stop_on_oom: bool = False,
) -> ReplayResult:
    """Replays ``events`` on a device (or a new ``Device(**config)``) and reports the cost.

    An allocation that fails with out-of-memory is counted and skipped (its free is skipped too),
    unless ``stop_on_oom``. Live allocations are freed at the end, so a passed device is left as
    it was found, apart from its cache and statistics. Arguments are checked before the device
    is touched.
    """
    evs = normalize(events)
    policy = _args.member(policy, "policy", Policy)
    stop_on_oom = _args.flag(stop_on_oom, "stop_on_oom")
    return _replay(evs, _device(device_or_config), policy, stop_on_oom)


def _replay(evs: list[tuple[bool, Any, int]], dev: Device, policy: int, stop_on_oom: bool) -> ReplayResult:
    before = dev.stats()
    stats_before = dev.memory_stats()
    dev.reset_peak_memory_stats()
    # The trace runs in Rust in one call: ids become integers, events three arrays.
    index: dict[Any, int] = {}
    is_alloc = np.fromiter((a for a, _, _ in evs), dtype=np.uint8, count=len(evs))
    ids = np.fromiter((index.setdefault(k, len(index)) for _, k, _ in evs), dtype=np.uint64, count=len(evs))
    sizes = np.fromiter((s for _, _, s in evs), dtype=np.uint64, count=len(evs))
    out = dev._replay(is_alloc, ids, sizes, policy, stop_on_oom)
    allocs, ooms, peak_live, first_oom = out["allocs"], out["ooms"], out["peak_live"], out["first_oom"]
    stats = dev.memory_stats()
    after = dev.stats()
    if len(out["leftover"]):
        dev.free_many(out["leftover"])
    device_allocs = stats["num_device_alloc"] - stats_before["num_device_alloc"]
    misses = stats["num_cache_misses"] - stats_before["num_cache_misses"]
    served = allocs - ooms
    return ReplayResult(
        allocator=dev.allocator,
        events=len(evs),
        allocs=allocs,
        ooms=ooms,
        completed=ooms == 0,
        peak_live=peak_live,
        peak_allocated=stats["allocated_bytes.all.peak"],
        peak_reserved=stats["reserved_bytes.all.peak"],
        device_allocs=device_allocs,
        device_frees=stats["num_device_free"] - stats_before["num_device_free"],
        maps=after["maps"] - before["maps"],
        physical_allocs=after["physical_allocs"] - before["physical_allocs"],
        cache_hit_rate=1.0 - misses / served if served else 0.0,
        first_oom=first_oom,
    )


#: The largest device min_capacity tries: the simulator's limit (1 TiB).
_MAX_CAPACITY = 1 << 40


def min_capacity(
    events: Iterable[Event],
    config: Mapping[str, Any] | None = None,
    *,
    granularity: int = 2 << 20,
    policy: int = Policy.HUGE_FIRST,
) -> int:
    """The smallest device capacity (a multiple of ``granularity``) on which ``events`` replay
    without an out-of-memory error. ``config`` holds the other Device arguments (allocator,
    alloc_conf, normal_page, ...). Binary search between the trace's peak live bytes and 8x that
    (plus 64 granules): it assumes that a trace that fits on a device also fits on a larger one."""
    evs = normalize(events)
    cfg = {k: v for k, v in _config(config, "config").items() if k != "capacity"}
    granularity = _args.size(granularity, "granularity", 1, 1 << 40)
    policy = _args.member(policy, "policy", Policy)
    lo = max(1, _peak(evs) // granularity)
    hi = min(8 * lo + 64, _MAX_CAPACITY // granularity)
    if lo > hi:
        raise invalid_param(
            f"the trace holds {_peak(evs):,} bytes live at once: more than the simulator's largest "
            f"device ({_args.bound(_MAX_CAPACITY)} bytes)"
        )

    def fits(units: int) -> bool:
        return _replay(evs, Device(units * granularity, **cfg), policy, True).completed

    if not fits(hi):
        raise invalid_param(f"the trace does not fit even in {hi * granularity} bytes")
    while lo < hi:
        mid = (lo + hi) // 2
        if fits(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo * granularity
