"""Replaying allocation traces against a device, and the smallest capacity a trace fits in.

A trace is a sequence of events. Each event is ``("alloc", id, size)`` or ``("free", id)`` (a
3-tuple ``("free", id, size)`` is accepted too), or a mapping with ``action`` (``"alloc"`` /
``"free"``, PyTorch's ``"free_requested"`` / ``"free_completed"`` are read as free), ``id`` or
``addr``, and ``size``. Ids are any hashable values naming a live allocation. The rules are
:func:`npumem.formats.normalize`'s; every function here takes a :class:`npumem.formats.Trace`
as well.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from . import _args
from .device import Device
from .enums import Policy
from .errors import invalid_param
from .formats import Event, Trace, as_trace, normalize
from .formats import event_fields as event_fields  # part of npumem.replay's names


def peak_live_bytes(events: Iterable[Event] | Trace) -> int:
    """The largest sum of live requested bytes over the trace (events or a
    :class:`npumem.formats.Trace`): no allocator can do with less."""
    return as_trace(events).peak_live() if isinstance(events, Trace) else Trace._of(normalize(events)).peak_live()


@dataclass
class ReplayResult:
    """What a replay cost. Byte figures are the allocator's own stats; ``device_allocs`` counts
    physical allocations from the device (segments, or pages for the npumem pool); the cache hit
    rate is the share of mallocs served without any new device memory; ``driver_calls`` the
    device allocations, frees, maps and unmaps the allocator made; ``seconds`` the replay's wall
    time. ``samples`` (with ``sample_every``) holds arrays ``event``, ``live``, ``allocated``,
    ``reserved``: the memory in use after every ``sample_every``-th event."""

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
    driver_calls: int = 0
    seconds: float = 0.0
    alloc_conf: str = ""
    capacity: int = 0
    samples: dict[str, np.ndarray] | None = field(default=None, repr=False)

    @property
    def ns_per_event(self) -> float:
        """Wall time of the replay per event, in nanoseconds."""
        return 1e9 * self.seconds / self.events if self.events else 0.0

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("samples")
        d["ns_per_event"] = self.ns_per_event
        return d


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


def _device(device_or_config: Device | Mapping[str, Any] | str | None, extra: Mapping[str, Any]) -> Device:
    """The device to replay on: the one passed, or a new one from a config dict or an allocator
    family name, with ``extra`` (allocator=, alloc_conf=, capacity=) on top."""
    if isinstance(device_or_config, Device):
        if extra:
            raise invalid_param(
                f"replay on a Device takes no {', '.join(sorted(extra))}: the device has its own; "
                "pass a family name or a dict of Device arguments instead"
            )
        return device_or_config
    if isinstance(device_or_config, str):
        if "allocator" in extra:
            raise invalid_param("the allocator is named twice (as the second argument and allocator=)")
        cfg = {"allocator": device_or_config}
    elif device_or_config is None or isinstance(device_or_config, Mapping):
        cfg = _config(device_or_config, "device_or_config")
    else:
        raise _args.type_error(
            "device_or_config",
            device_or_config,
            "a Device, an allocator family name ('npumem', 'pytorch', ...), a dict of Device arguments or None",
        )
    cfg.update(extra)
    return Device(**cfg)


def replay(
    events: Iterable[Event] | Trace,
    device_or_config: Device | Mapping[str, Any] | str | None = None,
    *,
    allocator: str | None = None,
    alloc_conf: str | None = None,
    capacity: int | str | None = None,
    policy: int = Policy.HUGE_FIRST,
    stop_on_oom: bool = False,
    sample_every: int = 0,
    progress: Callable[[int, int], None] | None = None,
) -> ReplayResult:
    """Replays ``events`` (a list of events, or a :class:`npumem.formats.Trace`) on a device and
    reports the cost.

    The device is ``device_or_config`` when it is a Device, else a new one: ``replay(events,
    "pytorch")``, ``replay(events, allocator="pytorch", alloc_conf="max_split_size_mb:128")``,
    or ``replay(events, {"capacity": "32GiB", "allocator": "torch_npu"})``. A trace that names
    streams replays each event on its own stream (one device stream per trace stream).

    An allocation that fails with out-of-memory is counted and skipped (its free is skipped too),
    unless ``stop_on_oom``. Live allocations are freed at the end, so a passed device is left as
    it was found, apart from its cache and statistics. Arguments are checked before the device
    is touched. ``progress(done, total)`` is called as the replay advances (every 2**20 events).
    """
    trace = as_trace(events)
    policy = _args.member(policy, "policy", Policy)
    stop_on_oom = _args.flag(stop_on_oom, "stop_on_oom")
    sample_every = _args.integer(sample_every, "sample_every", 0, _args.U64_MAX)
    extra: dict[str, Any] = {}
    for key, value in (("allocator", allocator), ("alloc_conf", alloc_conf), ("capacity", capacity)):
        if value is not None:
            extra[key] = value
    if progress is not None and not callable(progress):
        raise _args.type_error("progress", progress, "a function progress(done, total) or None")
    return _replay(trace, _device(device_or_config, extra), policy, stop_on_oom, sample_every, progress)


#: Events per call into Rust when progress is shown.
_CHUNK = 1 << 20


def _replay(
    trace: Trace,
    dev: Device,
    policy: int,
    stop_on_oom: bool,
    sample_every: int = 0,
    progress: Callable[[int, int], None] | None = None,
) -> ReplayResult:
    before = dev.stats()
    stats_before = dev.memory_stats()
    dev.reset_peak_memory_stats()
    streams = None
    if trace.streams is not None and (trace.streams != 0).any():
        # One device stream per stream of the trace (its default stream is the device's).
        values = trace.stream_values()
        mine = {v: (0 if v == 0 else dev.create_stream()) for v in values}
        table_in = np.array(list(mine), dtype=np.uint64)
        table_out = np.array(list(mine.values()), dtype=np.uint64)
        order = np.argsort(table_in)
        streams = table_out[order][np.searchsorted(table_in[order], trace.streams)]
    t0 = time.perf_counter()
    out = dev._replay(
        trace.is_alloc,
        trace.ids,
        trace.sizes,
        streams,
        policy,
        stop_on_oom,
        sample_every,
        _CHUNK if progress is not None else 0,
        progress,
    )
    seconds = time.perf_counter() - t0
    allocs, ooms, peak_live, first_oom = out["allocs"], out["ooms"], out["peak_live"], out["first_oom"]
    stats = dev.memory_stats()
    after = dev.stats()
    if len(out["leftover"]):
        dev.free_many(out["leftover"])
    device_allocs = stats["num_device_alloc"] - stats_before["num_device_alloc"]
    device_frees = stats["num_device_free"] - stats_before["num_device_free"]
    misses = stats["num_cache_misses"] - stats_before["num_cache_misses"]
    served = allocs - ooms
    maps = after["maps"] - before["maps"]
    samples = None
    if sample_every:
        samples = {k: out[f"sample_{k}"] for k in ("event", "live", "allocated", "reserved")}
    return ReplayResult(
        allocator=dev.allocator,
        events=len(trace),
        allocs=allocs,
        ooms=ooms,
        completed=ooms == 0,
        peak_live=peak_live,
        peak_allocated=stats["allocated_bytes.all.peak"],
        peak_reserved=stats["reserved_bytes.all.peak"],
        device_allocs=device_allocs,
        device_frees=device_frees,
        maps=maps,
        physical_allocs=after["physical_allocs"] - before["physical_allocs"],
        cache_hit_rate=1.0 - misses / served if served else 0.0,
        first_oom=first_oom,
        driver_calls=_driver_calls(before, after),
        seconds=seconds,
        alloc_conf=dev.alloc_conf or "",
        capacity=dev.capacity,
        samples=samples,
    )


def _driver_calls(before: Mapping[str, int], after: Mapping[str, int]) -> int:
    """Driver calls between two ``Device.stats()``: physical allocations and frees, maps and
    unmaps."""
    keys = [k for k in ("physical_allocs", "physical_frees", "maps", "unmaps") if k in after]
    return sum(after[k] - before.get(k, 0) for k in keys)


#: The largest device min_capacity tries: the simulator's limit (1 TiB).
_MAX_CAPACITY = 1 << 40


def min_capacity(
    events: Iterable[Event] | Trace,
    config: Mapping[str, Any] | str | None = None,
    *,
    granularity: int = 2 << 20,
    policy: int = Policy.HUGE_FIRST,
) -> int:
    """The smallest device capacity (a multiple of ``granularity``) on which ``events`` replay
    without an out-of-memory error. ``config`` is an allocator family name or a dict of the
    other Device arguments (allocator, alloc_conf, normal_page, ...). Binary search between the
    trace's peak live bytes and 8x that (plus 64 granules): it assumes that a trace that fits on
    a device also fits on a larger one."""
    trace = as_trace(events)
    if isinstance(config, str):
        config = {"allocator": config}
    cfg = {k: v for k, v in _config(config, "config").items() if k != "capacity"}
    granularity = _args.size(granularity, "granularity", 1, 1 << 40)
    policy = _args.member(policy, "policy", Policy)
    peak = trace.peak_live()
    lo = max(1, peak // granularity)
    hi = min(8 * lo + 64, _MAX_CAPACITY // granularity)
    if lo > hi:
        raise invalid_param(
            f"the trace holds {peak:,} bytes live at once: more than the simulator's largest "
            f"device ({_args.bound(_MAX_CAPACITY)} bytes)"
        )

    def fits(units: int) -> bool:
        return _replay(trace, Device(units * granularity, **cfg), policy, True).completed

    if not fits(hi):
        raise invalid_param(f"the trace does not fit even in {hi * granularity} bytes")
    while lo < hi:
        mid = (lo + hi) // 2
        if fits(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo * granularity


#: ``min_capacity``, for :func:`compare`, whose flag of that name hides it.
_search_capacity = min_capacity


#: The columns of :class:`Comparison`'s table: (key, heading).
_COLUMNS = (
    ("allocator", "allocator"),
    ("peak_allocated", "peak allocated"),
    ("peak_reserved", "peak reserved"),
    ("min_capacity", "min capacity"),
    ("driver_calls", "driver calls"),
    ("cache_hit_rate", "hit rate"),
    ("ooms", "OOMs"),
    ("ns_per_event", "ns/event"),
)


@dataclass
class Comparison:
    """Allocator families side by side on one trace: one :class:`ReplayResult` per family (and
    its smallest capacity when asked for). ``str()`` is the table; :meth:`rows` its data."""

    results: list[ReplayResult]
    min_capacities: dict[str, int] = field(default_factory=dict)
    peak_live: int = 0

    def rows(self) -> list[dict[str, Any]]:
        """One dict per family: every ReplayResult field, ``ns_per_event``, and
        ``min_capacity`` (None unless it was searched)."""
        out = []
        for r in self.results:
            d = r.as_dict()
            d["min_capacity"] = self.min_capacities.get(r.allocator)
            out.append(d)
        return out

    def __str__(self) -> str:
        from .units import fmt

        def cell(key: str, v: Any) -> str:
            if v is None:
                return "-"
            if key in ("peak_allocated", "peak_reserved", "min_capacity"):
                return fmt(v)
            if key == "cache_hit_rate":
                return f"{v:.3f}"
            if key == "ns_per_event":
                return f"{v:.1f}"
            return str(v)

        rows = [[cell(k, r[k]) for k, _ in _COLUMNS] for r in self.rows()]
        heads = [h for _, h in _COLUMNS]
        widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(heads)]
        line = "  ".join(
            h.ljust(w) if i == 0 else h.rjust(w) for i, (h, w) in enumerate(zip(heads, widths, strict=True))
        )
        body = [
            "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
            for r in rows
        ]
        return "\n".join([line, *body])


def compare(
    events: Iterable[Event] | Trace,
    allocators: Sequence[str] = ("npumem", "pytorch", "torch_npu", "direct"),
    *,
    alloc_conf: str | Sequence[str | None] | None = None,
    capacity: int | str | None = None,
    min_capacity: bool = False,
    policy: int = Policy.HUGE_FIRST,
    sample_every: int = 0,
    progress: Callable[[str, int, int], None] | None = None,
) -> Comparison:
    """Replays ``events`` on each allocator family and returns one table (:class:`Comparison`):
    peak allocated and reserved, driver calls, cache hit rate, OOMs and time per event, and with
    ``min_capacity`` the smallest device each needs. ``alloc_conf`` is one setting for every
    family or one per family; ``capacity`` the device size (default: 4x the trace's peak live
    bytes, at least 1 GiB, at most the simulator's 1 TiB). ``progress(family, done, total)`` is
    called as each replay advances."""
    trace = as_trace(events)
    if isinstance(allocators, str):
        allocators = [allocators]
    names = [_args.text(a, f"allocators[{i}]") for i, a in enumerate(allocators)]
    if not names:
        raise invalid_param("allocators is empty; name at least one family (npumem, pytorch, torch_npu, direct)")
    if alloc_conf is None or isinstance(alloc_conf, str):
        confs: list[str | None] = [alloc_conf] * len(names)
    else:
        confs = list(alloc_conf)
        if len(confs) != len(names):
            raise invalid_param(f"{len(confs)} alloc_conf settings for {len(names)} allocators; give one or one each")
    peak = trace.peak_live()
    cap = capacity if capacity is not None else min(_MAX_CAPACITY, max(1 << 30, 4 * peak))
    table = Comparison([], peak_live=peak)
    for name, conf in zip(names, confs, strict=True):
        cfg: dict[str, Any] = {"allocator": name, "capacity": cap}
        if conf:
            cfg["alloc_conf"] = conf
        if min_capacity:
            granularity = 2 << 20 if peak > 1 << 30 else 1 << 20
            table.min_capacities[name] = _search_capacity(
                trace, {k: v for k, v in cfg.items() if k != "capacity"}, granularity=granularity, policy=policy
            )
        report = None if progress is None else (lambda done, total, n=name: progress(n, done, total))
        table.results.append(replay(trace, cfg, policy=policy, sample_every=sample_every, progress=report))
    return table


def plot_timeline(table: Comparison, path: str, *, title: str = "") -> None:
    """Draws, per family, the allocator's allocated (solid) and reserved (dashed) bytes over the
    trace's events, with the program's live bytes, as a PNG at ``path`` (the results need
    samples: ``compare(..., sample_every=N)``). Raises MissingDependencyError without
    matplotlib."""
    from ._optional import require

    require("matplotlib", "the timeline plot")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 5))
    live_drawn = False
    for i, r in enumerate(table.results):
        if not r.samples:
            raise invalid_param(f"the {r.allocator} replay has no samples; replay with sample_every > 0")
        x = r.samples["event"]
        color = f"C{i}"
        if not live_drawn:
            ax.plot(x, r.samples["live"] / 2**30, color="0.6", lw=1, label="live (the program)")
            live_drawn = True
        ax.plot(x, r.samples["allocated"] / 2**30, color=color, lw=1.2, label=f"{r.allocator} allocated")
        ax.plot(x, r.samples["reserved"] / 2**30, color=color, lw=1.2, ls="--", label=f"{r.allocator} reserved")
    ax.set_xlabel("event")
    ax.set_ylabel("GiB")
    ax.set_title(f"memory over the trace{': ' + title if title else ''}")
    ax.legend(fontsize=8, ncol=2)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
