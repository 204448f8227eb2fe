"""The demo report: what each allocation policy maps, and fragmentation told honestly.

Part 1 allocates under each ``aclrtMalloc`` policy and shows the page size, the page-table entries
and the walk depth each one produces. Part 2 churns mixed small allocations through a device until
it is full, frees most of them, and then shows what the real runtime does: ``mem_info`` reports
plenty of free memory, yet HUGE_ONLY fails because no 2 MiB frame is left, and HUGE_FIRST quietly
falls back to 4 KiB pages (hundreds of times more page-table entries).
"""

from __future__ import annotations

import io
import os
import random
import time
from collections.abc import Sequence
from typing import TextIO

import numpy as np

from . import _args
from ._optional import MissingDependencyError
from ._timing import best_of, per_call
from .device import Device
from .enums import MemAttr, MemcpyKind, Policy
from .errors import AclError, OutOfMemoryError
from .graph import Graph
from .pipelines import double_buffered, render_timeline, scratch_loop
from .replay import min_capacity, peak_live_bytes, replay
from .units import fmt
from .workloads import dynamic_shape_inference, transformer_training

_RULE = "-" * 96
#: Device sizes the fragmentation story runs on (it fills the device with small allocations).
CAPACITY_RANGE = (256 << 20, 64 << 30)


def _table(out: TextIO, header: Sequence[str], rows: list[Sequence[object]]) -> None:
    cells = [list(map(str, header))] + [list(map(str, r)) for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    for k, r in enumerate(cells):
        padded = (c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
        out.write("  " + "  ".join(padded) + "\n")
        if k == 0:
            out.write("  " + "  ".join("-" * w for w in widths) + "\n")


def page_mix(out: TextIO) -> None:
    out.write(f"{_RULE}\n1. Page mix by policy (Device 8 GiB, 4 KiB normal pages, 2 giant frames set aside)\n{_RULE}\n")
    dev = Device("8GiB", giant_frames=2, allocator="direct")
    cases = [
        (Policy.HUGE_FIRST, 4 << 10),
        (Policy.HUGE_FIRST, 1 << 20),
        (Policy.HUGE_FIRST, 3 << 20),
        (Policy.HUGE_ONLY, 1 << 10),
        (Policy.NORMAL_ONLY, 64 << 20),
        (Policy.HUGE_FIRST, 64 << 20),
        (Policy.HUGE_FIRST_P2P, 5 << 20),
        (Policy.HUGE1G_ONLY, 3 << 29),
    ]
    rows = []
    for policy, size in cases:
        ptr = dev.malloc(size, policy)
        a = dev.allocation(ptr)
        _, page, depth = dev.walk(ptr)
        rows.append(
            [policy.name, fmt(size), f"{a['booked']:,} B", fmt(a["granted"]), fmt(page), a["granted"] // page, depth]
        )
    _table(out, ["policy", "request", "booked", "mapped", "page", "PTEs", "walk"], rows)
    pt = dev.page_table_stats()
    out.write(
        "\n  booked = align_up(size, 32) + 32 (no pad for HUGE1G, which rounds 1.5 GiB up to 2 GiB);\n"
        "  requests <= 1 MiB get normal pages even under HUGE_FIRST. 'walk' is the number of\n"
        "  descriptors a translation reads (1 GiB block: 2, 2 MiB block: 3, 4 KiB page: 4).\n"
    )
    out.write(
        f"  page table: {', '.join(f'{n} x {k}' for k, n in pt['pages'].items() if n)} pages; "
        f"tables per level {pt['tables']} "
        f"({fmt(pt['table_bytes'])} of descriptors for {fmt(pt['mapped_bytes'])} mapped)\n\n"
    )


def fragmentation(out: TextIO, capacity: str | int, seed: int) -> None:
    dev = Device(capacity, allocator="direct")
    total = dev.mem_info()[1]
    out.write(f"{_RULE}\n2. Fragmentation, honestly (Device {fmt(total)}, direct allocator, seed {seed})\n{_RULE}\n")
    rng = random.Random(seed)
    live = []
    while True:
        size = rng.choice([4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256]) << 10
        try:
            live.append(dev.malloc(size - 64, Policy.HUGE_FIRST))
        except OutOfMemoryError:
            break
    filled = len(live)
    rng.shuffle(live)
    keep = len(live) * 2 // 5
    for ptr in live[keep:]:
        dev.free(ptr)
    live = live[:keep]
    free, total = dev.mem_info(MemAttr.HBM)
    huge_free, _ = dev.mem_info(MemAttr.HBM_HUGE)
    fs = dev.frame_stats()
    out.write(
        f"  churn: {filled} small allocations (4-256 KiB) filled the device; 60% of them freed at random.\n\n"
        f"  mem_info(HBM)      : {fmt(free)} free of {fmt(total)} ({100 * free / total:.0f}% free)\n"
        f"  mem_info(HBM_HUGE) : {fmt(huge_free)} free in blocks that can hold a 2 MiB page\n"
        f"  largest free block : {fmt(fs['largest_free_block'])}\n"
        f"  physical fragmentation of the device's free frames (1 - largest free block / free memory): "
        f"{100 * (1 - fs['largest_free_block'] / max(free, 1)):.1f}%\n\n"
        "  free memory by buddy order (like /proc/buddyinfo):\n"
    )
    rows = [
        [fmt(size), n, fmt(b)]
        for size, n, b in zip(fs["block_sizes"], fs["free_blocks"], fs["free_bytes_by_order"], strict=True)
        if n
    ]
    _table(out, ["block", "free blocks", "bytes"], rows)
    request = 64 << 20
    out.write(f"\n  Now ask for {fmt(request)}:\n")
    try:
        dev.malloc(request, Policy.HUGE_ONLY)
        out.write("  HUGE_ONLY  : succeeded (the churn did not fragment this device)\n")
    except OutOfMemoryError as e:
        out.write(f"  HUGE_ONLY  : {e.name} ({e.code})\n               {e.message}\n")
        out.write(
            "               (The message's 'external fragmentation' is the allocator's: of the free memory\n"
            "               inside what it has reserved, none here, as the direct allocator caches nothing.\n"
            "               The free frames are what is fragmented: the physical figure above.)\n"
        )
    before = dev.stats()["huge_fallbacks"]
    ptr = dev.malloc(request, Policy.HUGE_FIRST)
    a = dev.allocation(ptr)
    fell_back = dev.stats()["huge_fallbacks"] > before
    page = a["page_size"]
    out.write(
        f"  HUGE_FIRST : succeeded with {fmt(page)} pages{' (silent fallback)' if fell_back else ''}: "
        f"{a['granted'] // page} PTEs where 2 MiB pages would need {a['granted'] // (2 << 20)}\n"
    )
    dev.free(ptr)
    for p in live:
        dev.free(p)
    fs_after = dev.frame_stats()
    out.write(
        f"\n  After freeing everything: largest free block {fmt(fs_after['largest_free_block'])}, "
        f"{fmt(dev.mem_info(MemAttr.HBM_HUGE)[0])} usable by 2 MiB pages again (buddies re-merged).\n\n"
    )


def pools(out: TextIO) -> None:
    trace = transformer_training(layers=4, hidden=1024, steps=6, batch=(2, 6), seq=(256, 768))
    peak = peak_live_bytes(trace)
    out.write(
        f"{_RULE}\n3. Caching pools on a training trace (transformer, 4 layers, batch 2->6, seq 256->768)\n{_RULE}\n"
    )
    families = ["direct", "pytorch", "torch_npu", "npumem"]
    needs = {a: min_capacity(trace, {"allocator": a}) for a in families}
    small = -(-int(peak * 1.02) // (2 << 20)) * (2 << 20)
    out.write(
        f"  {len(trace)} alloc/free events; peak live {fmt(peak)}. Each allocator replays the trace on a\n"
        f"  roomy device, then on a device of {fmt(small)} (peak live + 2%); 'needs' is the smallest device\n"
        "  on which it completes (binary search).\n\n"
    )
    rows = []
    for a in families:
        roomy = replay(trace, {"capacity": 4 * needs[a], "allocator": a})
        tight = replay(trace, {"capacity": small, "allocator": a})
        verdict = "completes" if tight.completed else f"OOM x{tight.ooms}"
        rows.append(
            [
                a,
                fmt(roomy.peak_reserved),
                fmt(needs[a]),
                f"{needs[a] / peak:.3f}x",
                roomy.device_allocs,
                f"{roomy.cache_hit_rate:.2f}",
                verdict,
            ]
        )
    header = ["allocator", "peak reserved", "needs", "vs live", "device allocs", "hit rate", f"on {fmt(small)}"]
    _table(out, header, rows)
    out.write(
        "\n  pytorch/torch_npu reproduce those allocators' rules (512 B rounding, 2 MiB small and 20 MiB\n"
        "  large segments, split thresholds; torch_npu adds its 32 B pad): blocks cached in segments\n"
        "  that are split among live tensors cannot serve the next, larger step. The npumem pool maps\n"
        "  2 MiB pages under a large VA range on demand and remaps idle pages under new ranges, so it\n"
        "  needs barely more than the live bytes. 'direct' caches nothing: every malloc maps pages.\n\n"
    )
    dev = Device(small)
    dev.record_memory_history()
    replay(trace[:400], dev)
    snap = dev.memory_snapshot()
    st = dev.memory_stats()
    out.write(
        f"  memory_snapshot(): {len(snap['segments'])} segments, {len(snap['device_traces'][0])} trace entries in\n"
        "  PyTorch's schema; dump_snapshot(path) writes a pickle that PyTorch's memory_viz reads. A segment\n"
        "  of the npumem pool is a run of contiguous mapped pages, counted alike by memory_stats()\n"
        f"  ({st['segment.all.current']}) and memory_summary(); its {st['num_device_alloc']} device allocs are "
        "the 2 MiB pages mapped.\n\n"
    )


def streams(out: TextIO) -> None:
    dev = Device("2GiB")
    out.write(
        f"{_RULE}\n4. Streams on the simulated clock: a double-buffered input pipeline ({dev.cost_model()['name']})\n"
        f"{_RULE}\n"
    )
    serial = double_buffered(dev, batches=6, batch_bytes=64 << 20, kernel_us=1500.0, overlap=False)
    piped = double_buffered(dev, batches=6, batch_bytes=64 << 20, kernel_us=1500.0, overlap=True)
    out.write(
        f"  6 batches of 64 MiB copied from pinned host memory ({serial.copy_us:.0f} us each over PCIe) and\n"
        f"  a 1500 us kernel per batch. One stream: {serial.total_us:.0f} us (model: {serial.predicted_us:.0f} us).\n"
        f"  Copy stream + compute stream with events: {piped.total_us:.0f} us (model: {piped.predicted_us:.0f} us),\n"
        f"  {serial.total_us / piped.total_us:.2f}x faster. C = copy, K = kernel:\n\n"
    )
    out.write(render_timeline(serial.timeline, 80) + "\n\n")
    out.write(render_timeline(piped.timeline, 80) + "\n\n")
    out.write("  Freeing scratch memory, 20 x (malloc 32 MiB on a stream, 200 us kernel, free):\n")
    rows = []
    modes = [("sync", "synchronise, then free"), ("event", "event-driven free"), ("stream", "stream-ordered")]
    for mode, label in modes:
        r = scratch_loop(Device("2GiB"), iterations=20, scratch_bytes=32 << 20, kernel_us=200.0, mode=mode)
        rows.append([label, f"{r.total_us:.0f}", f"{r.idle_us:.0f}", r.host_blocked, fmt(r.peak_reserved)])
    _table(out, ["free", "total us", "device idle us", "host blocks", "peak reserved"], rows)
    out.write("\n")
    racy(out)


def racy(out: TextIO) -> None:
    """The pipeline with its events left out, under the sanitizer (on by default, collecting)."""
    dev = Device("512MiB")
    n = 16 << 20
    host, buf = dev.malloc_host(n), dev.malloc(n)
    copy, compute = dev.create_stream(), dev.create_stream()
    dev.memcpy_async(buf, n, host, n, MemcpyKind.HOST_TO_DEVICE, copy)
    dev.launch(compute, 500.0, reads=[buf], writes=[buf])  # no stream_wait_event: races the copy
    dev.read(buf, 16)  # the host looks before synchronising
    out.write("  The same pipeline with its events left out, under the sanitizer (default: collect):\n")
    for f in dev.sanitizer_reports():
        out.write(f"  - {f}\n")
    out.write("\n")


def tlb(out: TextIO, plot_path: str | None) -> list[str]:
    from . import tlb as tlbmod

    out.write(f"{_RULE}\n5. Page sizes and the TLB: a GEMM and an embedding gather over 256 MiB\n{_RULE}\n")
    rows = tlbmod.sweep(
        presets=("ascend_like", "zen4"),
        pages=("4KiB", "2MiB", "1GiB"),
        patterns=("gemm", "gather"),
        footprints=(16 << 20, 256 << 20, 1 << 30),
        accesses=200_000,
    )
    table = [
        [
            r["preset"],
            r["pattern"],
            r["page"],
            f"{r['L1_mpka']:.1f}",
            f"{1000 * r['walks'] / r['accesses']:.2f}",
            f"{r['cycles_per_access']:.2f}",
            r["page_table_entries"],
            fmt(r["L2_nominal_reach"]),
        ]
        for r in rows
        if r["footprint"] == 256 << 20
    ]
    _table(out, ["TLB", "pattern", "page", "L1 MPKA", "walks/1k", "cycles/access", "PTEs", "L2 reach"], table)
    out.write(
        "\n  200k accesses each through the device's page table; 'ascend_like' is a labelled guess (Ascend\n"
        "  publishes no TLB geometry). Cycles are translation cycles beyond an L1 hit.\n"
    )
    missing = []
    if plot_path:
        try:
            tlbmod.plot(rows, plot_path)
            out.write(f"  Walks per 1000 accesses against footprint: {plot_path}\n")
        except MissingDependencyError as e:
            out.write("  (no plot: matplotlib is not installed)\n")
            missing.append(str(e))
    out.write("\n")
    return missing


def run(
    capacity: str | int = "1GiB", seed: int = 7, out: TextIO | None = None, plot_path: str | None = None
) -> list[str]:
    """Writes the demo report to ``out`` (stdout by default); the fragmentation story runs on a
    device of ``capacity`` (256 MiB to 64 GiB) churned with ``seed``. Returns the one-line hints
    for outputs skipped because an optional dependency is missing (the TLB plot without
    matplotlib); the report itself never needs one."""
    import sys

    capacity = _args.size(capacity, "capacity", *CAPACITY_RANGE)
    seed = _args.integer(seed, "seed", -(2**63), 2**64 - 1)
    if plot_path is not None:
        plot_path = os.fspath(plot_path)
    out = out or sys.stdout
    out.write(
        "npumem demo: the memory system of an Ascend-style NPU, on the simulated device (section 10: on real\n"
        "host memory)\n\n"
    )
    page_mix(out)
    fragmentation(out, capacity, seed)
    pools(out)
    streams(out)
    missing = tlb(out, plot_path)
    planning(out)
    graph_limits(out)
    host_pool(out)
    fast_path(out)
    host_memory(out)
    timeline_path = os.path.join(os.path.dirname(plot_path) or ".", "timeline.png") if plot_path else None
    missing += generated_workload(out, timeline_path)
    pyacl(out)
    return missing


def planning(out: TextIO) -> None:
    """Static planning: the same kind of training trace, planned offline at fixed offsets."""
    from .plan import STRATEGIES, Problem

    trace = transformer_training(layers=4, hidden=1024, steps=2, batch=(2, 6), seq=(256, 768))
    problem = Problem.from_trace(trace)
    pool_needs = min_capacity(trace, {"allocator": "npumem"})
    out.write(f"{_RULE}\n6. Static memory planning: the training trace planned offline at fixed offsets\n{_RULE}\n")
    out.write(
        f"  {len(problem)} buffers (2 steps of section 3's transformer, 512 B aligned); lower bound (max live)\n"
        f"  {fmt(problem.lower_bound)}. Each strategy assigns every buffer an offset in one arena:\n\n"
    )
    rows = []
    for s in STRATEGIES:
        p = problem.solve(s)
        problem.validate(p.offsets)
        rows.append([s, fmt(p.peak), f"{100 * p.gap:+.2f}%", f"{1000 * p.solve_seconds:.1f}"])
    _table(out, ["strategy", "arena", "vs bound", "ms"], rows)
    out.write(
        f"\n  The npumem pool replaying the same run online needs {fmt(pool_needs)}. "
        "CLI: npumem plan FILE.csv --strategy all\n\n"
    )


def mlp_training_graph(layers: int = 8, batch: int = 1024, hidden: int = 2048) -> Graph:
    """One training step of an MLP (fp32) as a graph: forward ``h_i = relu(h_{i-1} W_i)``, a
    loss, and backward ops that read the saved activations and produce the weight gradients
    (graph outputs)."""
    g = Graph(alignment=512)
    act, weight = batch * hidden * 4, hidden * hidden * 4
    h = g.input("x", act)
    saved = [h]
    for i in range(1, layers + 1):
        w = g.weight(f"W{i}", weight)
        h = g.op(f"fc{i}", [h, w], [(f"h{i}", act)], workspace=act // 4)
        saved.append(h)
    grad = g.op("loss", [h], [("g_out", act)])
    for i in range(layers, 0, -1):
        outs = [(f"dW{i}", weight)] + ([(f"g{i - 1}", act)] if i > 1 else [])
        g.op(f"fc{i}_backward", [grad, saved[i - 1], f"W{i}"], outs, workspace=act // 4)
        g.mark_output(f"dW{i}")
        grad = f"g{i - 1}"
    return g


def graph_limits(out: TextIO) -> None:
    """Graph planning: liveness from ops and tensors, then a memory limit met by moves."""
    g = mlp_training_graph()
    free = g.plan()
    r = free.report()
    out.write(f"{_RULE}\n7. Graph planning: one MLP training step, then the same under a memory limit\n{_RULE}\n")
    out.write(
        f"  {len(g)} tensors, {len(g.ops)} ops (8 layers, batch 1024, hidden 2048, fp32). Liveness gives every\n"
        f"  activation [producer, last reader]; weights, the input and the weight gradients stay resident.\n"
        f"  Unconstrained: peak {fmt(r['peak_memory'])} = weights {fmt(r['weight_memory'])} + I/O "
        f"{fmt(r['io_memory'])} + arena {fmt(r['activation_memory'])}\n"
        f"  (naive activations {fmt(r['naive_activation_memory'])}, reuse {100 * r['reuse_ratio']:.0f}%, "
        f"reach_theory_rate {r['reach_theory_rate']:.2f}).\n\n"
    )
    rows = []
    for frac in (0.9, 0.75, 0.6):
        limit = int(r["peak_memory"] * frac)
        p = g.plan(mem_limit=limit)
        q = p.report()
        kinds = ", ".join(
            f"{sum(m.kind == k for m in p.moves)} {k}" for k in ("offload_weight", "offload_activation", "recompute")
        )
        rows.append(
            [
                f"{frac:.0%}",
                fmt(limit),
                fmt(p.peak_memory),
                kinds,
                f"{1e3 * q['transfer_seconds']:.2f}",
                f"{1e3 * q['recompute_seconds']:.2f}",
                "yes" if p.fits else "no",
            ]
        )
    _table(out, ["limit", "bytes", "peak", "moves", "copy ms", "recompute ms", "fits"], rows)
    out.write(
        "\n  Moves are chosen greedily, fewest bytes moved per byte saved; copy time is on the ascend910b\n"
        "  PCIe model. Real models: benches/graphs/ (ResNet-50, MobileNet v2, BERT-base, training steps).\n\n"
    )


def host_pool(out: TextIO) -> None:
    """Real host memory, pooled: numpy temporaries without page faults, NumPy's own allocations."""

    import numpy as np

    from .hostpool import HANDLER_NAME, HostPool

    pool = HostPool("4GiB")
    out.write(f"{_RULE}\n8. Host memory pool: real numpy arrays that keep their pages between uses\n{_RULE}\n")

    def touch(a: np.ndarray) -> None:
        a[::4096] = 1  # one write per page

    rows = []
    for size, n in ((1 << 20, 200), (64 << 20, 5)):
        t_np = per_call(lambda s=size: touch(np.zeros(s, np.uint8)), n, 3) * 1e6
        t_pool = per_call(lambda s=size: touch(pool.zeros(s, np.uint8)), n, 3) * 1e6
        rows.append([fmt(size), f"{t_np:.1f}", f"{t_pool:.1f}", f"{t_np / t_pool:.1f}x"])
    _table(out, ["zeros + touch", "numpy us", "pool us", "speedup"], rows)
    with pool.numpy_allocator():
        a = np.arange(1 << 20, dtype=np.float64) * 2  # NumPy's own allocations
    s = pool.stats()
    out.write(
        f"\n  Freed blocks keep their pages, so a reused 64 MiB temporary costs no page faults (numpy's come\n"
        f"  from fresh mmap'd pages). Inside `with pool.numpy_allocator():` NumPy itself allocates from the\n"
        f"  pool (NEP 49): an np.arange result is owned by {HostPool.handler_of(a)!r} "
        f"({'ok' if HostPool.handler_of(a) == HANDLER_NAME else 'NOT the pool'}).\n"
        f"  Pool: {fmt(s['carved'])} carved of {fmt(s['capacity'])} reserved, huge pages: "
        f"{s['huge_pages']}; per-thread\n"
        f"  caches over lock-free lists, ~15 ns an alloc+free pair in Rust (make bench B=pools).\n\n"
    )


def fast_path(out: TextIO) -> None:
    """Device malloc/free at Python speed: single calls against a no-op call, and batch calls."""

    import numpy as np

    out.write(f"{_RULE}\n9. Device allocation at Python speed: single calls and batches\n{_RULE}\n")
    dev = Device("16GiB")

    pairs = {"device": lambda: dev.free(dev.malloc(4096)), "floor": lambda: (dev._noop(1), dev._noop(2))}
    t = best_of(pairs, 10_000, rounds=5)
    pair, floor = t["device"] * 1e9, t["floor"] * 1e9
    sizes = np.full(1000, 4096, np.uint64)
    batch = per_call(lambda: dev.free_many(dev.malloc_many(sizes)), 20) / 2000 * 1e9
    p = dev.malloc(4096)
    dev.free(p)
    try:
        dev.write(p, b"x")
        caught = "NOT caught"
    except AclError:
        caught = "caught"
    out.write(
        f"  A 4 KiB malloc+free pair takes {pair:.0f} ns from Python ({pair / floor:.1f}x two no-op calls into\n"
        f"  the binding); malloc_many/free_many of 1,000 blocks run {1e3 / batch:.0f} M operations/s\n"
        f"  ({batch:.0f} ns each). A freed block waits in its size's stack and comes back in O(1),\n"
        f"  yet it is dead at once: a write to it is {caught} as use after free. Statistics,\n"
        "  snapshots and fragmentation count waiting blocks as free; the first malloc of another\n"
        "  size releases them (make bench B=fastpath measures all of this against numpy and peers).\n\n"
    )


def host_memory(out: TextIO) -> None:
    """The allocation story on real memory: a fresh mapping per malloc against the pool, aliases,
    and whether the kernel has huge pages."""
    out.write(f"{_RULE}\n10. Real memory: the same allocations on the host backend (Linux memfd + mmap)\n{_RULE}\n")
    trace = transformer_training(layers=2, hidden=512, vocab=8000, steps=4, batch=(2, 2), seq=(256, 256))
    allocs = sum(1 for e in trace if e[0] == "alloc")
    out.write(
        f'  Device(backend="host") hands out real addresses. A training trace ({allocs} mallocs, peak live\n'
        f"  {fmt(peak_live_bytes(trace))}) replayed twice on each allocator: 'direct' makes every malloc a memfd,\n"
        "  an fallocate and an mmap (and every free an unmap and a close), as a runtime that maps each\n"
        "  tensor; the npumem pool maps pages once and keeps them.\n\n"
    )
    try:
        Device("64MiB", backend="host")
    except AclError as e:  # no Linux memfd here, or too little memory
        out.write(f"  (skipped: the host backend cannot run here: {e})\n\n")
        return
    calls = ("physical_allocs", "maps", "unmaps")
    rows, ms = [], {}
    for allocator in ("direct", "npumem"):
        dev = Device("512MiB", backend="host", allocator=allocator)
        for run in ("first", "second"):
            before = dev.stats()
            t0 = time.perf_counter()
            replay(trace, dev)
            ms[allocator, run] = (time.perf_counter() - t0) * 1e3
            after = dev.stats()
            rows.append([allocator, run, f"{ms[allocator, run]:.1f}", *(after[k] - before[k] for k in calls)])
    _table(out, ["allocator", "pass", "wall ms", "memfds", "mmaps", "unmaps"], rows)
    out.write(
        f"\n  Once its pages are mapped the pool makes no system call: the second pass runs "
        f"{ms['direct', 'second'] / ms['npumem', 'second']:.0f}x faster\n"
        "  than mapping per call (wall time includes the replay loop in Python; make bench B=host times\n"
        "  single pairs against mmap, glibc malloc and numpy).\n\n"
    )

    # The program's own VMM calls: one physical allocation mapped at two addresses.
    dev = Device("256MiB", backend="host")
    page = dev.mem_get_allocation_granularity(MemAttr.MEM_NORMAL)
    handle = dev.malloc_physical(16 * page, MemAttr.MEM_NORMAL)
    va = dev.reserve_mem_address(64 * page)
    other = va + 32 * page
    dev.map_mem(va, handle)
    dev.map_mem(other, handle)
    text = b"written through the first mapping"
    dev.write(va + 100, text)
    seen = dev.read(other + 100, len(text))
    same = dev.translate(va + 100)[0] == dev.translate(other + 100)[0]
    out.write(
        f"  Aliases: malloc_physical, reserve_mem_address and map_mem twice put one memfd at {va:#x}\n"
        f"  and {other:#x}; written through the first, read through the second:\n"
        f"  {seen!r} ({'ok' if seen == text and same else 'NOT aliased'}; translate() gives both one physical "
        "address).\n\n"
    )
    for at in (va, other):
        dev.unmap_mem(at)
    dev.free_physical(handle)
    dev.release_mem_address(va)

    huge_free, _ = dev.mem_info(MemAttr.HBM_HUGE)
    try:
        dev.free(dev.malloc(2 << 20, Policy.HUGE_ONLY))
        out.write(
            f"  Huge pages: the kernel's hugetlb pool has {huge_free // (2 << 20)} free 2 MiB pages; HUGE_ONLY and\n"
            "  HUGE_FIRST above 1 MiB map them (make bench B=pagesize times 4 KiB against 2 MiB pages).\n\n"
        )
    except OutOfMemoryError:
        out.write(
            "  Huge pages: none free in the kernel's hugetlb pool, so HUGE_ONLY fails (out of memory) and\n"
            "  HUGE_FIRST falls back to 4 KiB pages; reserve some as root: echo 64 > /proc/sys/vm/nr_hugepages\n\n"
        )


#: Glyphs of the text timeline, lowest to highest.
_BARS = " ▁▂▃▄▅▆▇█"


def _spark(values: Sequence[int], top: int) -> str:
    return "".join(_BARS[min(len(_BARS) - 1, round(v / top * (len(_BARS) - 1)))] for v in values)


def generated_workload(out: TextIO, plot_path: str | None) -> list[str]:
    """One generated workload (the detector at batch 8 whose shapes change every batch) replayed
    on every family, with the allocated-vs-reserved timeline as text and, with matplotlib, a PNG."""
    from .workloads import measure, plot_timelines

    out.write(
        f"{_RULE}\n11. A generated workload on every family: dynamic-shape detection at batch 8 (npumem.workloads)\n"
        f"{_RULE}\n"
    )
    events = dynamic_shape_inference(batches=16, seed=0)
    peak = peak_live_bytes(events)
    families = ["direct", "pytorch", "torch_npu", "npumem"]
    timelines = [measure(events, fam, windows=64) for fam in families]
    out.write(
        f"  dynamic_shape_inference(batches=16): a ResNet-50 + FPN detector, 16 batches of 8 images whose padded\n"
        f"  size changes every batch; {len(events):,} events, peak live {fmt(peak)}. Replayed on a roomy device.\n\n"
    )
    rows = [
        [tl.allocator, fmt(tl.peak_allocated), fmt(tl.peak_reserved), f"{tl.peak_reserved / peak:.2f}x"]
        for tl in timelines
    ]
    _table(out, ["allocator", "peak allocated", "peak reserved", "reserved / live"], rows)
    top = max(tl.peak_reserved for tl in timelines)
    out.write(
        f"\n  Reserved (upper row) and allocated (lower row) over the trace, one column per window (top {fmt(top)}):\n"
    )
    for tl in timelines:
        out.write(f"  {tl.allocator:<10}|{_spark(tl.reserved, top)}|\n  {'':<10}|{_spark(tl.allocated, top)}|\n")
    out.write(
        "\n  'direct' caches nothing: reserved is allocated, and every malloc maps pages. The caching\n"
        "  families keep each batch's odd-sized blocks cached in segments the next batch's shapes cannot\n"
        "  reuse, so reserved climbs in steps well above the peak allocated. The npumem pool keeps its\n"
        "  pages mapped too, but remaps idle ones under new ranges: reserved plateaus at the peak.\n"
    )
    missing = []
    if plot_path:
        try:
            plot_timelines(timelines, plot_path, title="dynamic-shape detection, batch 8: allocated vs reserved")
            out.write(f"  Timeline: {plot_path}\n")
        except MissingDependencyError as e:
            out.write("  (no timeline plot: matplotlib is not installed)\n")
            missing.append(str(e))
    out.write("\n")
    return missing


def pyacl(out: TextIO) -> None:
    """A pyACL program, unchanged, on two simulated devices of one address space: copies, a P2P
    copy at the P2P bandwidth, and the leak report of what it forgot."""
    import contextlib

    from . import acl
    from .acl._runtime import LOCK, RT

    out.write(f"{_RULE}\n12. pyACL programs on npumem: import npumem.acl as acl (or python -m npumem.run)\n{_RULE}\n")
    with LOCK:
        RT.forget()
    acl.configure(devices=2, capacity="1GiB")
    size = 16 << 20
    data = np.arange(size, dtype=np.uint8)
    acl.init()
    acl.rt.set_device(0)
    src, _ = acl.rt.malloc(size, 0)
    acl.rt.memcpy(src, size, data.ctypes.data, size, 1)
    acl.rt.set_device(1)
    dst, _ = acl.rt.malloc(size, 0)
    no_peer = acl.rt.memcpy(dst, size, src, size, 3)
    acl.rt.device_enable_peer_access(0, 0)
    stream, _ = acl.rt.create_stream()
    start, _ = acl.rt.create_event()
    end, _ = acl.rt.create_event()
    acl.rt.record_event(start, stream)
    acl.rt.memcpy_async(dst, size, src, size, 3, stream)
    acl.rt.record_event(end, stream)
    acl.rt.synchronize_stream(stream)
    ms, _ = acl.rt.event_elapsed_time(start, end)
    check = np.zeros(size, np.uint8)
    acl.rt.memcpy(check.ctypes.data, size, dst, size, 2)
    where = [acl.rt.pointer_get_attributes(p)[0]["location"]["id"] for p in (src, dst)]
    out.write(
        f"  Two devices share one address space: src {src:#x} is on device {where[0]}, dst {dst:#x} on device\n"
        f"  {where[1]}. Device 1 copies from device 0 before device_enable_peer_access: ret {no_peer}; after it,\n"
        f"  memcpy_async of {fmt(size)} takes {ms:.3f} ms on the device clock ({size / ms / 1e6:.1f} GB/s, the P2P\n"
        f"  link) and the bytes arrive {'intact' if np.array_equal(check, data) else 'CHANGED'}.\n"
        "  The program then forgets to free dst and to destroy its stream; acl.finalize() reports it:\n\n"
    )
    for e in (start, end):
        acl.rt.destroy_event(e)
    acl.rt.set_device(0)
    acl.rt.free(src)
    report = io.StringIO()
    with contextlib.redirect_stderr(report):
        acl.finalize()
    out.write("".join(f"  {line}\n" for line in report.getvalue().splitlines()) + "\n")
    with LOCK:
        RT.forget()
