"""The TLB model: page-size research on the device's real page table.

``Tlb.preset("skylake", device=dev)`` builds a TLB hierarchy of a known geometry (presets cite
their sources; ``ascend_like`` is labelled a guess) over ``dev``'s page table, and
``tlb.run(addresses)`` feeds a numpy address array through it: each address is translated by the
page table, so the page sizes the allocator mapped (4 KiB, 64 KiB, 2 MiB, 1 GiB) are what the
TLB caches. The result carries per-level hits, misses and MPKA, page walks and translation
cycles. ``sequential``, ``strided`` and ``uniform`` make address arrays over an allocation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from . import _native
from .device import Device


@dataclass(frozen=True)
class ArrayStats:
    name: str
    lookups: int
    hits: int
    misses: int
    evictions: int


@dataclass(frozen=True)
class LevelStats:
    arrays: list[ArrayStats]
    accesses: int

    @property
    def hits(self) -> int:
        return sum(a.hits for a in self.arrays)

    @property
    def misses(self) -> int:
        return sum(a.misses for a in self.arrays)

    @property
    def lookups(self) -> int:
        return sum(a.lookups for a in self.arrays)

    @property
    def evictions(self) -> int:
        return sum(a.evictions for a in self.arrays)

    @property
    def miss_rate(self) -> float:
        return self.misses / self.lookups if self.lookups else 0.0

    @property
    def mpka(self) -> float:
        """Misses per thousand accesses (of the whole run)."""
        return 1000.0 * self.misses / self.accesses if self.accesses else 0.0


@dataclass(frozen=True)
class TlbStats:
    accesses: int
    faults: int
    walks: int
    walk_steps: int
    walk_steps_skipped: int
    cycles: int
    levels: list[LevelStats]

    @property
    def walk_cache_hit_rate(self) -> float:
        """Share of walk steps the page-walk caches saved."""
        total = self.walk_steps + self.walk_steps_skipped
        return self.walk_steps_skipped / total if total else 0.0

    def overhead(self, compute_cycles: float) -> float:
        """Translation cycles as a fraction of ``compute_cycles``."""
        return self.cycles / compute_cycles

    @classmethod
    def _from(cls, d: dict[str, Any]) -> TlbStats:
        levels = [LevelStats([ArrayStats(**a) for a in level], d["accesses"]) for level in d["levels"]]
        return cls(**{k: v for k, v in d.items() if k != "levels"}, levels=levels)


class Tlb:
    """A TLB hierarchy over a device's page table."""

    def __init__(self, preset: str, device: Device, **overrides: Any) -> None:
        self._tlb = _native.Tlb(preset, device, overrides or None)
        self.device = device

    @classmethod
    def preset(cls, name: str, device: Device, **overrides: Any) -> Tlb:
        """A preset geometry (``Tlb.presets()``); overrides as ``walk_step_cycles=...`` or
        ``**{"1.0.entries": 4096}`` (level 1, array 0)."""
        return cls(name, device, **overrides)

    @staticmethod
    def presets() -> list[str]:
        return _native.Tlb.presets()

    @property
    def config(self) -> dict[str, Any]:
        return self._tlb.config()

    def run(self, addresses: Any) -> TlbStats:
        """Feeds the addresses (any integer array-like) through the TLB; counters accumulate."""
        arr = np.ascontiguousarray(addresses, dtype=np.uint64).reshape(-1)
        return TlbStats._from(self._tlb.run(arr))

    def stats(self) -> TlbStats:
        return TlbStats._from(self._tlb.stats())

    def reset_stats(self) -> None:
        """Clears the counters; the entries stay (a warm TLB)."""
        self._tlb.reset_stats()

    def nominal_reach(self, page_size: int) -> list[int]:
        """Bytes each level maps when every entry holds a page of ``page_size``."""
        return self._tlb.nominal_reach(page_size)


def sequential(base: int, footprint: int, step: int = 64) -> np.ndarray:
    """Every ``step`` bytes over ``[base, base + footprint)``."""
    return np.arange(base, base + footprint, step, dtype=np.uint64)


def strided(base: int, footprint: int, stride: int, count: int) -> np.ndarray:
    """``count`` accesses ``stride`` bytes apart, wrapping inside the footprint."""
    return (base + (np.arange(count, dtype=np.uint64) * np.uint64(stride)) % np.uint64(footprint)).astype(np.uint64)


def uniform(base: int, footprint: int, count: int, seed: int = 0, align: int = 64) -> np.ndarray:
    """``count`` uniformly random ``align``-aligned addresses in the footprint (GUPS-like)."""
    rng = np.random.default_rng(seed)
    slots = rng.integers(0, footprint // align, count, dtype=np.uint64)
    return np.uint64(base) + slots * np.uint64(align)
