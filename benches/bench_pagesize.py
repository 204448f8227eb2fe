"""Page size measured on real memory, beside the TLB model's prediction.

The host backend maps one block with 4 KiB pages (``NORMAL_ONLY``: a memfd of normal pages,
``MADV_NOHUGEPAGE``) and one with 2 MiB pages (``HUGE_ONLY``: a hugetlb memfd). When the kernel's
pool has too few free 2 MiB pages, the shortfall is reserved through ``/proc/sys/vm/nr_hugepages``
(as root) and given back afterwards, also when the run fails; where that is impossible (or with
``--thp``) the 2 MiB side is an anonymous mapping with ``MADV_HUGEPAGE`` (transparent huge
pages), labelled so. What is in force is read from ``/proc/self/smaps`` for each range.

Kernels (``npumem.kernels``, Rust, over zero-copy numpy views of that memory):

1. pointer chase: one 64 B line per 4 KiB page in a random cycle (``npumem.patterns.pointer_chase``),
   footprints doubling from 128 KiB, so the data stays cache-resident long after the
   translations stop fitting the TLBs;
2. GEMM: ``gemm_tiled`` (float32, 64 x 64 x 64 tiles, no packing: every row of a B tile is read
   where it lies) and numpy's ``matmul`` (OpenBLAS, one thread, which packs tiles into its own
   buffers) on the same views;
3. the report's page-size study patterns (``npumem report``: GEMM tiles, conv 3x3 windows over an
   NC1HWC0 activation, a Zipf(1.2) gather), at footprints from 1 MiB up: the very addresses the
   sweep's TLB cells model (``npumem.tlb.PATTERNS``, the sweep's access count), made into word
   indices into the region and read in that order by ``numpy.take`` (one 8-byte load per address;
   the index array itself streams, the same for both page sizes, so it cancels in the
   difference). The loads are independent, as a kernel's are: the CPU overlaps their misses and
   walks, so the time saved is at most what the model's serial translation cycles predict.

Beside each measurement, the TLB model (``npumem.tlb.Tlb``) runs the same addresses through the
same device's ``translate`` (so it sees the page size in force): the preset closest to this CPU
(from ``/proc/cpuinfo``) with its published costs, and a calibrated one whose costs (cycles of
an L2 TLB hit and of a walk step) are fitted to the chase measurements by least squares. GEMM
predictions are the translation cycles of the kernel's own row-segment trace over the first
block row of tiles, scaled to the whole product.

With ``--json PATH`` the tables are also written as JSON (``make bench B=pagesize`` writes
``target/bench-pagesize.json``), which ``npumem report DIR --host-pagesize PATH`` sets beside the
model in its page-size study.

Run: make bench B=pagesize   (or: .venv/bin/python benches/bench_pagesize.py [--quick] [--thp]
[--max-footprint MIB] [--rounds N] [--gemm-rounds N] [--json PATH])
"""

from __future__ import annotations

import os

# numpy's BLAS threads spin on this 2-core machine and steal time from what is measured.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse
import contextlib
import itertools
import json
import mmap
import re
import signal
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

import npumem
from npumem import Policy
from npumem.chase_model import nonnegative_fit
from npumem.errors import OutOfMemoryError
from npumem.kernels import chase, gemm_tiled
from npumem.patterns import pointer_chase
from npumem.tlb import PATTERNS, Tlb, TlbStats
from npumem.units import fmt

KIB, MIB = 1 << 10, 1 << 20
HUGE = 2 * MIB
NR_HUGEPAGES = "/proc/sys/vm/nr_hugepages"
GEMM_SIDES = (1024, 2048)
TILE = 64
#: Chase samples per round, and steps per sample.
SAMPLES, SAMPLE_STEPS = 5, 100_000
#: A step of the chase time by at least this factor from one footprint to the next is a knee.
KNEE = 1.6
#: The report's page-size study patterns (npumem.tlb.PATTERNS names), measured at these footprints.
STUDY_PATTERNS = ("gemm", "conv", "gather")
STUDY_FOOTPRINTS = tuple(m * MIB for m in (1, 4, 16, 64, 256, 512))
#: Accesses per pattern run: the sweep's default (examples/sweeps/demo.toml), so the addresses are the
#: ones its TLB cells model.
STUDY_ACCESSES = 400_000
#: Timed passes per round over a pattern's addresses (the quickest counts).
STUDY_PASSES = 3
#: A page size whose time per access is within this share of the best does as well; the winner is
#: the smallest such page (as the report's study decides on the model's cycles).
STUDY_TIE = 0.05


# -- the machine -------------------------------------------------------------------------------


def cpu() -> tuple[str, str, float]:
    """(description, closest TLB preset, clock in GHz) from /proc/cpuinfo."""
    info: dict[str, str] = {}
    with open("/proc/cpuinfo") as f:
        for line in f:
            if not line.strip():
                break
            key, _, value = line.partition(":")
            info[key.strip()] = value.strip()
    vendor, family = info.get("vendor_id", "?"), int(info.get("cpu family", "0"))
    model = int(info.get("model", "0"))
    if vendor == "GenuineIntel":
        preset = "skylake"  # the Intel preset: split L1 DTLB by page size, 12-way STLB
    elif vendor == "AuthenticAMD":
        preset = {25: "zen4", 26: "zen5"}.get(family, "zen4")
    else:
        preset = "champsim_default"
    ghz = float(info.get("cpu MHz", "2000")) / 1000
    desc = f"{info.get('model name', '?')} ({vendor} family {family} model {model}, {ghz:.2f} GHz)"
    return desc, preset, ghz


def smaps_pages(start: int, nbytes: int) -> str:
    """What backs ``[start, start + nbytes)``, from /proc/self/smaps."""
    fields: dict[str, int] = {}
    kernel_pages: set[int] = set()
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = re.match(r"^([0-9a-f]+)-([0-9a-f]+) ", line)
            if head:
                lo, hi = int(head[1], 16), int(head[2], 16)
                inside = lo < start + nbytes and start < hi
                continue
            if inside:
                key, _, value = line.partition(":")
                if value.strip().endswith("kB"):
                    kb = int(value.split()[0])
                    if key == "KernelPageSize":
                        kernel_pages.add(kb)
                    else:
                        fields[key] = fields.get(key, 0) + kb
    pages = "/".join(f"{kb} kB" for kb in sorted(kernel_pages)) or "?"
    hugetlb = fields.get("Private_Hugetlb", 0) + fields.get("Shared_Hugetlb", 0)
    thp = sum(fields.get(k, 0) for k in ("AnonHugePages", "ShmemPmdMapped", "FilePmdMapped"))
    if 2048 in kernel_pages:
        return f"hugetlb (smaps KernelPageSize {pages}, {hugetlb // 1024} MiB Hugetlb)"
    if thp:
        return f"THP (smaps {thp // 1024} of {fields.get('Rss', 0) // 1024} MiB resident in 2 MiB pages)"
    return f"4 KiB pages (smaps KernelPageSize {pages}, no huge pages)"


def _read_int(path: str) -> int:
    with open(path) as f:
        return int(f.read().split()[0])


def _meminfo(field: str) -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


@contextlib.contextmanager
def hugetlb_pages(need: int) -> Iterator[str | None]:
    """Makes ``need`` 2 MiB pages free in the kernel's pool, reserving the shortfall through
    /proc/sys/vm/nr_hugepages; yields None when they are there, else why not. Gives back exactly
    the pages it added (other programs may hold some of the pool), also when the body fails."""
    added = 0
    shortfall = need - _meminfo("HugePages_Free")
    try:
        if shortfall > 0:
            before = _read_int(NR_HUGEPAGES)
            try:
                with open(NR_HUGEPAGES, "w") as f:
                    f.write(str(before + shortfall))
            except OSError as e:
                yield f"cannot reserve {shortfall} more 2 MiB pages through {NR_HUGEPAGES} ({e.strerror})"
                return
            added = _read_int(NR_HUGEPAGES) - before
            print(f"reserved {added} 2 MiB pages ({NR_HUGEPAGES}: {before} -> {before + added})")
            if added < shortfall:
                yield f"the kernel found only {added} of {shortfall} more 2 MiB pages (memory fragmented)"
                return
        yield None
    finally:
        if added > 0:
            now = _read_int(NR_HUGEPAGES)
            with open(NR_HUGEPAGES, "w") as f:
                f.write(str(max(0, now - added)))
            print(f"gave back {added} 2 MiB pages ({NR_HUGEPAGES}: {now} -> {_read_int(NR_HUGEPAGES)})")


# -- memory under test -------------------------------------------------------------------------


@dataclass
class Region:
    """Memory under test: a uint8 view of it, and where the TLB model finds its translations."""

    label: str
    memory: np.ndarray
    model_dev: npumem.Device
    model_base: int
    in_force: str = ""

    @property
    def base(self) -> int:
        return self.memory.ctypes.data

    def model_addresses(self, addresses: np.ndarray) -> np.ndarray:
        return addresses - np.uint64(self.base) + np.uint64(self.model_base)


def host_region(label: str, nbytes: int, policy: Policy) -> Region:
    dev = npumem.Device(nbytes + 64 * MIB, backend="host", allocator="direct")
    ptr = dev.malloc(nbytes, policy)
    return Region(label, dev.to_numpy(ptr, nbytes, copy=False), dev, ptr)


def thp_region(nbytes: int) -> Region:
    """An anonymous mapping advised MADV_HUGEPAGE (2 MiB aligned), modelled on a simulated device
    mapped with 2 MiB pages at the same offsets."""
    m = mmap.mmap(-1, nbytes + HUGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)  # shared would be shmem
    whole = np.frombuffer(m, np.uint8)
    skip = -whole.ctypes.data % HUGE
    m.madvise(mmap.MADV_HUGEPAGE)
    sim = npumem.Device(nbytes + 64 * MIB, allocator="direct")
    return Region(
        "2 MiB THP (anonymous mmap, MADV_HUGEPAGE)",
        whole[skip : skip + nbytes],
        sim,
        sim.malloc(nbytes, Policy.HUGE_ONLY),
    )


# -- the model ---------------------------------------------------------------------------------


def features(st: TlbStats) -> tuple[float, float]:
    """Per access: L2 TLB hits (L1 misses that did not walk) and walk steps taken."""
    l2_hits = st.levels[1].hits if len(st.levels) > 1 else 0
    return l2_hits / st.accesses, st.walk_steps / st.accesses


def model_run(preset: str, region: Region, addresses: np.ndarray, overrides: dict | None = None) -> TlbStats:
    """The preset on the region's translations: one pass to warm, one counted."""
    tlb = Tlb.preset(preset, region.model_dev, **(overrides or {}))
    addrs = region.model_addresses(addresses)
    tlb.run(addrs)
    tlb.reset_stats()
    return tlb.run(addrs)


def calibrated_costs(preset: str, l2_ns: float, step_ns: float, ghz: float) -> dict:
    """Overrides that give every L2 array the fitted hit cost and walks the fitted step cost."""
    cfg = Tlb.preset(preset, npumem.Device("64MiB")).config
    out = {"walk_step_cycles": round(step_ns * ghz)}
    for i in range(len(cfg["levels"][1]) if len(cfg["levels"]) > 1 else 0):
        out[f"1.{i}.hit_cycles"] = round(l2_ns * ghz)
    return out


def knees(points: list[tuple[int, float]]) -> list[int]:
    """Footprints at which the time per step jumps by at least KNEE over the previous one."""
    return [b for (_, ya), (b, yb) in itertools.pairwise(points) if ya > 0 and yb / ya >= KNEE]


def calibrated_geometry(footprints: list[int], steps: list[int]) -> dict:
    """Entry counts of the first L1 and L2 arrays (4 KiB pages) from the measured knees: the pages
    of the last footprint before each knee (the L1 fully associative, the L2 with the most ways
    up to 16 that divide its entries). Empty when the knees are not found."""
    if not steps:
        return {}
    before = {b: a for a, b in itertools.pairwise(footprints)}
    l1 = before[steps[0]] // (4 * KIB)
    out = {"0.0.entries": l1, "0.0.ways": l1}
    far = [k for k in steps if k >= 16 * steps[0]]
    if far:
        l2 = before[far[0]] // (4 * KIB)
        out |= {"1.0.entries": l2, "1.0.ways": max(w for w in range(1, 17) if l2 % w == 0)}
    return out


# -- kernels -----------------------------------------------------------------------------------


def chase_cycle(region: Region, footprint: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Writes a random cycle over one line per 4 KiB page of the region's first ``footprint``
    bytes; returns the u64 view and the cycle's addresses (one lap)."""
    pages = footprint // (4 * KIB)
    addrs = pointer_chase(region.base, footprint, pages + 1, seed=seed)
    nxt = region.memory[:footprint].view(np.uint64)
    nxt.fill(0)
    idx = (addrs - np.uint64(region.base)) // np.uint64(8)
    nxt[idx[:-1]] = idx[1:]
    return nxt, addrs[:-1]


def gemm_trace(a: int, b: int, c: int, side: int) -> np.ndarray:
    """The addresses ``gemm_tiled`` reads and writes, one per row segment (a segment never crosses
    a page), over the first block row of tiles (i0 = 0: every (j0, k0) tile)."""
    t = TILE
    i = np.arange(t, dtype=np.uint64)[:, None]
    kk = np.arange(t, dtype=np.uint64)[None, :]
    row = np.uint64(side * 4)
    out = []
    for j0 in range(0, side, t):
        for k0 in range(0, side, t):
            a_seg = np.uint64(a) + i * row + np.uint64(k0 * 4)
            b_seg = np.uint64(b) + (kk + np.uint64(k0)) * row + np.uint64(j0 * 4)
            c_seg = np.uint64(c) + i * row + np.uint64(j0 * 4)
            inner = np.stack([np.broadcast_to(b_seg, (t, t)), np.broadcast_to(c_seg, (t, t))], axis=2).reshape(t, 2 * t)
            out.append(np.concatenate([a_seg, inner], axis=1).reshape(-1))
    return np.concatenate(out)


# -- the benchmark -----------------------------------------------------------------------------


def measure_chase(regions: list[Region], footprints: list[int], rounds: int, seed: int) -> dict[tuple[str, int], float]:
    """ns per step of each (region, footprint): per footprint, the regions in turn for ``rounds``
    rounds, each a warming lap and then samples of SAMPLE_STEPS steps; the quickest sample counts
    (short samples: on a shared machine some of them run undisturbed)."""
    best: dict[tuple[str, int], float] = {}
    for fp in footprints:
        cycles = {}
        for r in regions:
            nxt, addrs = chase_cycle(r, fp, seed)
            cycles[r.label] = (nxt, int((addrs[0] - np.uint64(r.base)) // np.uint64(8)))
        for _ in range(rounds):
            for r in regions:
                nxt, at = cycles[r.label]
                at, _ = chase(nxt, fp // (4 * KIB), at)  # warm: one lap
                for _ in range(SAMPLES):
                    at, ns = chase(nxt, SAMPLE_STEPS, at)
                    best[r.label, fp] = min(best.get((r.label, fp), float("inf")), ns)
    return best


def _exit_on_term(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)  # unwinds, so the huge pages are given back


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer footprints and rounds (a smoke test)")
    ap.add_argument("--thp", action="store_true", help="use transparent huge pages for the 2 MiB side")
    ap.add_argument("--max-footprint", type=int, default=512, help="largest chase footprint, MiB")
    ap.add_argument("--rounds", type=int, default=7, help="chase rounds (the quickest sample of each counts)")
    ap.add_argument("--gemm-rounds", type=int, default=15, help="GEMM rounds (4 KiB and 2 MiB back to back)")
    ap.add_argument("--pattern-rounds", type=int, default=7, help="study-pattern rounds (quickest pass counts)")
    ap.add_argument("--accesses", type=int, default=STUDY_ACCESSES, help="addresses per study-pattern run")
    ap.add_argument("--json", default=None, help="also write the tables to this JSON file (for npumem report)")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, _exit_on_term)

    desc, preset, ghz = cpu()
    cpu_id = max(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpu_id})  # one core: its TLB and caches see only this run
    max_fp = (32 if args.quick else args.max_footprint) * MIB
    sides = GEMM_SIDES[:1] if args.quick else GEMM_SIDES
    rounds, gemm_rounds = (1, 1) if args.quick else (args.rounds, args.gemm_rounds)
    pattern_rounds = 1 if args.quick else args.pattern_rounds
    study_fps = [fp for fp in STUDY_FOOTPRINTS if fp <= max_fp]
    nbytes = max(max_fp, 3 * 4 * max(sides) ** 2)
    # Doubling from 128 KiB, with the points half way (x1.5) up to 16 MiB to place the TLB knees.
    fine = [f * KIB << i for i in range(8) for f in (128, 192)]
    footprints = sorted(f for f in {*fine, *(128 * KIB << i for i in range(20))} if f <= max_fp)
    print(f"CPU: {desc}; TLB preset: {preset}; pinned to CPU {cpu_id}")
    print(f"THP: {open('/sys/kernel/mm/transparent_hugepage/enabled').read().strip()}")

    need = -(-(nbytes + 64) // HUGE) + 1
    with hugetlb_pages(0 if args.thp else need) as why_not:
        small = host_region("4 KiB (host backend, NORMAL_ONLY)", nbytes, Policy.NORMAL_ONLY)
        big = None
        if not args.thp and why_not is None:
            try:
                big = host_region("2 MiB hugetlb (host backend, HUGE_ONLY)", nbytes, Policy.HUGE_ONLY)
            except OutOfMemoryError as e:
                why_not = str(e).split(" (device:")[0]
        if big is None:
            print(f"hugetlb not used: {why_not or '--thp'}; 2 MiB side: transparent huge pages")
            big = thp_region(nbytes)
        regions = [small, big]
        for r in regions:
            r.memory[::4096] = 0  # every page present before anything is timed
            r.in_force = smaps_pages(r.base, nbytes)
            print(f"{r.label}: {fmt(nbytes)} at {r.base:#x}: {r.in_force}")
        record = {"cpu": desc, "preset": preset, "command": " ".join(["python", *sys.argv])}
        study = (study_fps, args.accesses, pattern_rounds)
        run(regions, footprints, sides, (rounds, gemm_rounds), preset, ghz, record, study)
        del regions, small, big  # views before their devices
    if args.json:
        record["loadavg"] = [round(x, 2) for x in os.getloadavg()]  # a shared machine: say how busy
        os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(record, f, indent=1)
        print(f"tables -> {args.json}")


def run(
    regions: list[Region],
    footprints: list[int],
    sides: tuple[int, ...],
    rounds: tuple[int, int],
    preset: str,
    ghz: float,
    record: dict,
    study: tuple[list[int], int, int],
) -> None:
    """Measures and prints the tables; ``record`` receives them (rows of dicts) for --json."""
    small, big = regions
    record.update(small=f"{small.label}: {small.in_force}", big=f"{big.label}: {big.in_force}", chase=[], gemm=[])
    record["patterns"] = []
    rounds, gemm_rounds = rounds
    seed = 1
    t0 = time.perf_counter()
    measured = measure_chase(regions, footprints, rounds, seed)
    print(f"(chase measured in {time.perf_counter() - t0:.0f} s)")

    # Calibrated geometry: the TLB levels end where the 4 KiB series
    # steps up (the first knee, and the first one at least 16x further: the knee in between is
    # the data leaving the L1 cache).
    steps = knees([(fp, measured[small.label, fp]) for fp in footprints])
    print(f"knees (a step of at least {KNEE}x), 4 KiB pages: {[fmt(k) for k in steps]}")
    print(f"knees, 2 MiB pages: {[fmt(k) for k in knees([(fp, measured[big.label, fp]) for fp in footprints])]}")
    geometry = calibrated_geometry(footprints, steps)

    # The model on the same cycles, as published and with the calibrated geometry; then the costs
    # fitted to the differences (4 KiB minus 2 MiB at each footprint): the data lines are the same
    # in both runs, so cache effects cancel and what is left is what the page size changes.
    feats: dict[tuple[str, str, int], tuple[float, float]] = {}
    pub: dict[tuple[str, int], float] = {}
    for fp in footprints:
        for r in regions:
            _, addrs = chase_cycle(r, fp, seed)
            st = model_run(preset, r, addrs)
            feats["pub", r.label, fp] = features(st)
            pub[r.label, fp] = st.cycles / st.accesses
            feats["cal", r.label, fp] = features(model_run(preset, r, addrs, geometry))
    dx = np.array([np.subtract(feats["cal", small.label, fp], feats["cal", big.label, fp]) for fp in footprints])
    dy = np.array([measured[small.label, fp] - measured[big.label, fp] for fp in footprints])
    l2_ns, step_ns = (float(v) for v in nonnegative_fit(dx, dy))
    cal = {**geometry, **calibrated_costs(preset, l2_ns, step_ns, ghz)}
    print(f"calibrated {preset}: {cal}")

    print(
        f"\nPointer chase, ns per step (one line per 4 KiB page, random cycle; quickest of {rounds} rounds "
        f"x {SAMPLES} samples); "
        f"model: {preset} translation cycles per step as published, and calibrated to this machine "
        f"(geometry from the knees, {l2_ns:.1f} ns per L2 TLB hit, {step_ns:.1f} ns per walk step)"
    )
    head = ["footprint", "4K ns", "2M ns", "4K-2M ns", f"{preset} 4K cyc", f"{preset} 2M cyc"]
    head += [f"{preset} 4K-2M ns", "calibrated 4K-2M ns"]
    print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    for fp, (d_l2, d_steps) in zip(footprints, dx, strict=True):
        m4, m2 = measured[small.label, fp], measured[big.label, fp]
        c4, c2 = pub[small.label, fp], pub[big.label, fp]
        cells = [fmt(fp), f"{m4:.1f}", f"{m2:.1f}", f"{m4 - m2:+.1f}", f"{c4:.1f}", f"{c2:.1f}"]
        cells += [f"{(c4 - c2) / ghz:+.1f}", f"{l2_ns * d_l2 + step_ns * d_steps:+.1f}"]
        print("| " + " | ".join(cells) + " |")
        record["chase"].append(dict(zip(head, [fp, *(float(c) for c in cells[1:])], strict=True)))

    print(
        f"\nGEMM, float32, C += A @ B ({gemm_rounds} rounds, 4 KiB and 2 MiB back to back); time saved by 2 MiB "
        "pages: best against best, and the median (range) of the rounds; model: the kernel's translation "
        "time saved, as a share of its best 4 KiB time"
    )
    head = ["n", "kernel", "4K ms", "2M ms", "saved (best)", "saved (rounds)", f"{preset} predicts", "calibrated"]
    print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    for side in sides:
        size = 4 * side * side
        mats = {}
        for r in regions:
            f32 = r.memory[: 3 * size].view(np.float32)
            a, b, c = (f32[i * side * side : (i + 1) * side * side].reshape(side, side) for i in range(3))
            rng = np.random.default_rng(side)
            a[:] = rng.standard_normal((side, side), dtype=np.float32)
            b[:] = rng.standard_normal((side, side), dtype=np.float32)
            mats[r.label] = (a, b, c)
        times: dict[tuple[str, str], list[float]] = {}
        for _ in range(gemm_rounds):
            for r in regions:
                a, b, c = mats[r.label]
                c.fill(0)
                times.setdefault(("tiled", r.label), []).append(gemm_tiled(a, b, c, TILE) / 1e6)
                t0 = time.perf_counter()
                np.matmul(a, b, out=c)
                times.setdefault(("numpy", r.label), []).append((time.perf_counter() - t0) * 1e3)
        # The model: the kernel's trace over the first block row of tiles, scaled to all of them.
        pred: dict[str, float] = {}
        for name, over in ((preset, None), ("calibrated", cal)):
            cyc = {}
            for r in regions:
                trace = gemm_trace(r.base, r.base + size, r.base + 2 * size, side)
                st = model_run(preset, r, trace, over)
                cyc[r.label] = st.cycles * (side // TILE)
            pred[name] = (cyc[small.label] - cyc[big.label]) / ghz / 1e6
        for kernel in ("tiled", "numpy"):
            t4, t2 = np.array(times[kernel, small.label]), np.array(times[kernel, big.label])
            # Each round's 4 KiB and 2 MiB runs are back to back: their ratio is the paired figure.
            saved = 100 * (1 - t2 / t4)
            paired = f"{np.median(saved):+.1f}% ({saved.min():+.1f} to {saved.max():+.1f})"
            best = f"{100 * (1 - t2.min() / t4.min()):+.1f}%"
            model = [f"{100 * pred[m] / t4.min():+.1f}%" if kernel == "tiled" else "-" for m in (preset, "calibrated")]
            name = f"gemm_tiled ({TILE}^3 tiles)" if kernel == "tiled" else "numpy matmul (OpenBLAS)"
            print(
                f"| {side} | {name} | {t4.min():.1f} | {t2.min():.1f} | {best} | {paired} | {model[0]} | {model[1]} |"
            )
            cells = [side, name, round(t4.min(), 2), round(t2.min(), 2), best, paired, *model]
            record["gemm"].append(dict(zip(head, cells, strict=True)))
        del mats
    measure_study(regions, study, preset, cal, ghz, record)
    print(f"\n4K = {small.label}: {small.in_force}\n2M = {big.label}: {big.in_force}")


def winner(times: dict[str, float], tie: float = STUDY_TIE) -> str:
    """The smallest page size whose time is within ``tie`` of the best (pages in size order)."""
    best = min(times.values())
    return next(p for p, t in times.items() if t <= best * (1 + tie))


def measure_study(
    regions: list[Region], study: tuple[list[int], int, int], preset: str, cal: dict, ghz: float, record: dict
) -> None:
    """The report's study patterns on the host: ns per access of ``numpy.take`` over the pattern's
    addresses in each region (rounds alternate the regions; the quickest pass counts), beside the
    model's translation cycles per access on the same addresses (as published and calibrated)."""
    small, big = regions
    footprints, accesses, rounds = study
    print(
        f"\nStudy patterns (the report's page-size study), ns per access: numpy.take of one 8-byte word at each "
        f"of the pattern's {accesses} addresses (npumem.tlb.PATTERNS, as the sweep models them), quickest of "
        f"{rounds} rounds x {STUDY_PASSES} passes; winner: the smallest page within {100 * STUDY_TIE:.0f}% of "
        f"the best; model: {preset} translation cycles per access, published and calibrated"
    )
    head = ["pattern", "footprint", "accesses", "4K ns", "2M ns", "4K-2M ns", "host winner"]
    head += [f"{preset} 4K cyc", f"{preset} 2M cyc", f"{preset} 4K-2M ns", "calibrated 4K-2M ns"]
    print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    for pattern, fp in itertools.product(STUDY_PATTERNS, footprints):
        addrs = {r.label: PATTERNS[pattern](r.base, fp, accesses, 0) for r in regions}
        words = {r.label: r.memory[:fp].view(np.uint64) for r in regions}
        index = {r.label: ((addrs[r.label] - np.uint64(r.base)) // np.uint64(8)).astype(np.intp) for r in regions}
        out = np.empty(len(addrs[small.label]), np.uint64)
        best = {r.label: float("inf") for r in regions}
        for _ in range(rounds):
            for r in regions:
                np.take(words[r.label], index[r.label], out=out)  # warm
                for _ in range(STUDY_PASSES):
                    t0 = time.perf_counter_ns()
                    np.take(words[r.label], index[r.label], out=out)
                    best[r.label] = min(best[r.label], (time.perf_counter_ns() - t0) / len(out))
        cyc = {r.label: model_run(preset, r, addrs[r.label]) for r in regions}
        calib = {r.label: model_run(preset, r, addrs[r.label], cal) for r in regions}
        m4, m2 = best[small.label], best[big.label]
        c4, c2 = (cyc[r.label].cycles / cyc[r.label].accesses for r in regions)
        k4, k2 = (calib[r.label].cycles / calib[r.label].accesses for r in regions)
        row = dict(
            zip(
                head,
                [pattern, fp, len(out), *(round(v, 3) for v in (m4, m2, m4 - m2)), winner({"4KiB": m4, "2MiB": m2})]
                + [round(v, 3) for v in (c4, c2, (c4 - c2) / ghz, (k4 - k2) / ghz)],
                strict=True,
            )
        )
        row["footprint"] = fp
        print("| " + " | ".join(fmt(v) if k == "footprint" else str(v) for k, v in row.items()) + " |")
        record["patterns"].append(row)


if __name__ == "__main__":
    main()
