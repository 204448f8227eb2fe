"""Allocation from Python, every entry point against its floor and its peers, in one run.

One table of ratios (each row: subject, peer, the goal), least time of interleaved rounds
(``npumem._timing.best_of``: every case of a group is timed in turn, round after round, so a slow
spell of the shared machine hits both ends of a ratio alike):

1. 4 KiB: the ``Device`` malloc+free pair against two no-op calls into the extension;
   ``Device.buffer(4096)`` against ``np.empty(4096)``; ``HostPool.empty/zeros/full`` against
   ``np.empty/zeros/full``; pyACL's ``acl.rt.malloc+free``, ``memcpy``, ``memset`` and
   ``malloc_host+free_host`` against the ``Device`` calls they wrap; ``pa.allocate_buffer`` on
   pyarrow's system, mimalloc and jemalloc pools.
2. ``HostPool.empty/zeros/full`` against NumPy from 64 B to 1 GiB (goal: never slower).
3. ``np.zeros`` with the pool's NEP 49 handler installed against without it, untouched and used
   (one byte written per 4 KiB page), 64 B to 1 GiB.
4. The allocate-free cycle and the allocate-touch-free cycle (one byte per 4 KiB page) at 4 KiB,
   1 MiB and 64 MiB: ``HostPool.empty``, ``np.empty`` and ``pa.allocate_buffer`` (three pools).
5. Four threads allocating and freeing through one ``Device`` and through one ``HostPool``:
   aggregate pairs per second against one thread (the same work, all threads started together).

``--instructions`` adds callgrind instruction counts per call for the 4 KiB rows (one child
process under ``valgrind --tool=callgrind`` runs every case, counted only inside its calling loop,
net of the loop's own cost): free of the machine's load, where wall time is too noisy.

Run: make bench B=python   (or: .venv/bin/python benches/bench_python.py [--quick] [--instructions])
"""

from __future__ import annotations

import os

# numpy's BLAS threads spin on this 2-core machine and steal time from what is measured.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse
import functools
import gc
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable

import numpy as np
import pyarrow as pa

import npumem
import npumem.acl as acl
from npumem._timing import best_of, calls_for
from npumem.hostpool import HostPool
from npumem.units import fmt

PAGE = 4096
ARROW_POOLS = {
    "system": pa.system_memory_pool,
    "mimalloc": pa.mimalloc_memory_pool,
    "jemalloc": pa.jemalloc_memory_pool,
}


def touch(a: np.ndarray) -> None:
    a[::PAGE] = 1  # one byte per 4 KiB page


class World:
    """Every object the cases use, made once (the child processes of ``--instructions`` make
    their own)."""

    def __init__(self) -> None:
        self.dev = npumem.Device("4GiB")
        self.pool = HostPool("8GiB")
        self.nep49 = HostPool("4GiB")
        self.arrow = {name: make() for name, make in ARROW_POOLS.items()}
        acl.configure(devices=1, capacity="4GiB")
        acl.init()
        acl.rt.set_device(0)
        self.acl_dev, _ = acl.rt.malloc(PAGE, 0)
        self.acl_host, _ = acl.rt.malloc_host(PAGE)
        # The device acl.rt runs on: its own calls are the floor of the pyACL ones.
        self.acl_device = acl._runtime.RT.sys().device(0)
        self.dev_ptr, self.host_ptr = self.acl_device.malloc(PAGE), self.acl_device.malloc_host(PAGE)

    def close(self) -> None:
        acl.rt.free(self.acl_dev)
        acl.rt.free_host(self.acl_host)
        acl.finalize()


def cases_4k(w: World) -> dict[str, Callable[[], object]]:
    dev, pool, d, u8 = w.dev, w.pool, w.acl_device, np.uint8
    a_dev, a_host, d_dev, d_host = w.acl_dev, w.acl_host, w.dev_ptr, w.host_ptr
    cases: dict[str, Callable[[], object]] = {
        "no-op pair": lambda: (dev._noop(1), dev._noop(2)),
        "Device malloc+free": lambda: dev.free(dev.malloc(PAGE)),
        "Device.buffer(4096)": lambda: dev.buffer(PAGE),
        "np.empty(4096)": lambda: np.empty(PAGE),
        "HostPool.empty(4096, u8)": lambda: pool.empty(PAGE, u8),
        "np.empty(4096, u8)": lambda: np.empty(PAGE, u8),
        "HostPool.zeros(4096, u8)": lambda: pool.zeros(PAGE, u8),
        "np.zeros(4096, u8)": lambda: np.zeros(PAGE, u8),
        "HostPool.full(4096, 7, u8)": lambda: pool.full(PAGE, 7, u8),
        "np.full(4096, 7, u8)": lambda: np.full(PAGE, 7, u8),
        "acl.rt.malloc+free": lambda: acl.rt.free(acl.rt.malloc(PAGE, 0)[0]),
        "its Device malloc+free": lambda: d.free(d.malloc(PAGE, 0)),
        "acl.rt.memcpy H2D": lambda: acl.rt.memcpy(a_dev, PAGE, a_host, PAGE, 1),
        "its Device.memcpy H2D": lambda: d.memcpy(d_dev, PAGE, d_host, PAGE, 1),
        "acl.rt.memset": lambda: acl.rt.memset(a_dev, PAGE, 0, PAGE),
        "its Device.memset": lambda: d.memset(d_dev, PAGE, 0, PAGE),
        "acl.rt.malloc_host+free_host": lambda: acl.rt.free_host(acl.rt.malloc_host(PAGE)[0]),
        "its Device malloc_host+free_host": lambda: d.free_host(d.malloc_host(PAGE)),
    }
    for name, mp in w.arrow.items():
        cases[f"pa.allocate_buffer(4096), {name}"] = lambda mp=mp: pa.allocate_buffer(PAGE, memory_pool=mp)
    return cases


#: (subject, peer, goal: the subject's time at most this multiple of the peer's, or None).
RATIOS_4K = [
    ("Device malloc+free", "no-op pair", 2.0),
    ("Device.buffer(4096)", "np.empty(4096)", 0.8),
    ("HostPool.empty(4096, u8)", "np.empty(4096, u8)", 1.0),
    ("HostPool.zeros(4096, u8)", "np.zeros(4096, u8)", 1.0),
    ("HostPool.full(4096, 7, u8)", "np.full(4096, 7, u8)", 1.0),
    ("acl.rt.malloc+free", "its Device malloc+free", 2.0),
    ("acl.rt.memcpy H2D", "its Device.memcpy H2D", 2.0),
    ("acl.rt.memset", "its Device.memset", 2.0),
    ("acl.rt.malloc_host+free_host", "its Device malloc_host+free_host", 2.0),
] + [(f"pa.allocate_buffer(4096), {name}", "HostPool.empty(4096, u8)", None) for name in ARROW_POOLS]


def measure(cases: dict[str, Callable[[], object]], budget: float, rounds: int) -> dict[str, float]:
    n = {name: calls_for(fn, budget, most=50_000) for name, fn in cases.items()}
    return best_of(cases, n, rounds)


Rows = list[tuple[str, str, str, str, str]]


def goal_text(ratio: float, goal: float | None) -> str:
    return "" if goal is None else f"<= {goal:.1f}x {'met' if ratio <= goal else 'NOT met'}"


def row(rows: Rows, subject: str, peer: str, ts: float, tp: float, goal: float | None) -> None:
    """A row of seconds per call: the subject's, the peer's, their ratio against the goal."""
    unit, scale = ("µs", 1e6) if max(ts, tp) >= 1e-5 else ("ns", 1e9)
    times = f"{ts * scale:,.{1 if unit == 'µs' else 0}f} / {tp * scale:,.{1 if unit == 'µs' else 0}f} {unit}"
    rows.append((subject, peer, times, f"{ts / tp:.2f}x", goal_text(ts / tp, goal)))


def sizes_table(w: World, quick: bool) -> Rows:
    pool, u8, rows = w.pool, np.uint8, []
    for size in (64, PAGE, 64 << 10, 1 << 20, 64 << 20, 1 << 30):
        cases = {
            "HostPool.empty": lambda s=size: pool.empty(s, u8),
            "np.empty": lambda s=size: np.empty(s, u8),
            "HostPool.zeros": lambda s=size: pool.zeros(s, u8),
            "np.zeros": lambda s=size: np.zeros(s, u8),
            "HostPool.full": lambda s=size: pool.full(s, 7, u8),
            "np.full": lambda s=size: np.full(s, 7, u8),
        }
        budget = 0.002 if quick else (0.05 if size >= 1 << 30 else 0.01)
        t = measure(cases, budget, 3 if quick or size >= 1 << 30 else 15)
        for what in ("empty", "zeros", "full"):
            row(rows, f"HostPool.{what}({fmt(size)})", f"np.{what}", t[f"HostPool.{what}"], t[f"np.{what}"], 1.0)
        print(f"  measured {fmt(size)}", flush=True)
    return rows


def nep49_table(w: World, quick: bool) -> Rows:
    """The handler is installed around each timed batch of the "with" case (not per call:
    installing it is a context-variable change that a program makes once)."""
    rows = []
    for size in (64, PAGE, 64 << 10, 256 << 10, 1 << 20, 64 << 20, 1 << 30):
        for used in (False, True):

            def zeros(s: int = size, used: bool = used) -> None:
                a = np.zeros(s, np.uint8)
                if used:
                    touch(a)

            n = calls_for(zeros, 0.002 if quick else 0.01, most=50_000)
            best = {"with": float("inf"), "without": float("inf")}
            for _ in range(3 if quick or size >= 1 << 30 else 15):
                for case in best:
                    previous = w.nep49.set_numpy_handler() if case == "with" else None
                    t0 = time.perf_counter()
                    for _ in range(n):
                        zeros()
                    best[case] = min(best[case], (time.perf_counter() - t0) / n)
                    if previous is not None:
                        HostPool.restore_numpy_handler(previous)
            how = "used" if used else "untouched"
            row(rows, f"np.zeros({fmt(size)}) {how}, pool handler", "without", best["with"], best["without"], 1.0)
    return rows


def cycles_table(w: World, quick: bool) -> Rows:
    pool, u8, rows = w.pool, np.uint8, []
    for size in (PAGE, 1 << 20, 64 << 20):
        for touched in (False, True):
            cases: dict[str, Callable[[], object]] = {}
            if touched:
                cases["HostPool.empty"] = lambda s=size: touch(pool.empty(s, u8))
                cases["np.empty"] = lambda s=size: touch(np.empty(s, u8))
                for name, mp in w.arrow.items():
                    cases[f"pa.allocate_buffer, {name}"] = lambda s=size, mp=mp: touch(
                        np.frombuffer(pa.allocate_buffer(s, memory_pool=mp), u8)
                    )
            else:
                cases["HostPool.empty"] = lambda s=size: pool.empty(s, u8)
                cases["np.empty"] = lambda s=size: np.empty(s, u8)
                for name, mp in w.arrow.items():
                    cases[f"pa.allocate_buffer, {name}"] = lambda s=size, mp=mp: pa.allocate_buffer(s, memory_pool=mp)
            t = measure(cases, 0.002 if quick else 0.01, 3 if quick else 15)
            how = "alloc+touch+free" if touched else "alloc+free"
            for peer in [k for k in cases if k != "HostPool.empty"]:
                row(rows, f"HostPool.empty {fmt(size)} {how}", peer, t["HostPool.empty"], t[peer], 1.0)
    return rows


def threads_table(w: World, quick: bool) -> Rows:
    """Pairs per second, 4 threads against 1 (each thread makes ``n`` pairs; the aggregate is
    all pairs over the wall time from the common start to the last thread's end)."""
    n = 20_000 if quick else 200_000
    dev, pool, u8 = w.dev, w.pool, np.uint8
    work = {
        "Device malloc+free": lambda k: [dev.free(dev.malloc(PAGE)) for _ in range(k)],
        "HostPool.empty(4096, u8)": lambda k: [pool.empty(PAGE, u8) for _ in range(k)],
        "HostPool.churn (Rust, no GIL)": lambda k: pool.churn(PAGE, 10 * k),
    }
    rows = []
    for name, fn in work.items():
        rate = {}
        for threads in (1, 4):
            best = 0.0
            for _ in range(2 if quick else 5):
                start = threading.Barrier(threads + 1)

                def run(start: threading.Barrier = start, fn: Callable[[int], object] = fn) -> None:
                    start.wait()
                    fn(n)

                ts = [threading.Thread(target=run) for _ in range(threads)]
                for t in ts:
                    t.start()
                start.wait()
                t0 = time.perf_counter()
                for t in ts:
                    t.join()
                pairs = threads * n * (10 if "churn" in name else 1)
                best = max(best, pairs / (time.perf_counter() - t0))
            rate[threads] = best
        rows.append(
            (
                f"{name}, 4 threads",
                "1 thread",
                f"{rate[4] / 1e6:.2f} / {rate[1] / 1e6:.2f} M pairs/s",
                f"{rate[4] / rate[1]:.2f}x",
                f"aggregate ({os.cpu_count()} cores)",
            )
        )
    return rows


def instructions(quick: bool) -> dict[str, float]:
    """Callgrind instructions per call of each 4 KiB case, net of the loop that calls it: one
    child under callgrind runs every case through ``functools.reduce``, collected only inside it
    (``--toggle-collect``) and dumped after each (``--dump-after``), so start-up is not counted;
    the loop's own cost (a case that does nothing) is subtracted."""
    if shutil.which("valgrind") is None:
        raise SystemExit("--instructions needs valgrind (apt-get install valgrind)")
    calls = 1000 if quick else 10_000
    names = [NOTHING, *cases_4k(WORLD)]
    with tempfile.TemporaryDirectory() as tmp:
        out = f"{tmp}/cg.out"
        cmd = [
            "valgrind",
            "--tool=callgrind",
            "--collect-atstart=no",
            "--toggle-collect=functools_reduce",
            "--dump-after=functools_reduce",
            f"--callgrind-out-file={out}",
            sys.executable,
            __file__,
            "--child",
            str(calls),
        ]
        subprocess.run(cmd, capture_output=True, text=True, check=True)
        counts = []
        for i in range(1, len(names) + 1):
            with open(f"{out}.{i}") as f:
                counts.append(int(re.search(r"^summary: (\d+)", f.read(), re.M).group(1)) / calls)
    loop = counts[0]
    return {name: c - loop for name, c in zip(names[1:], counts[1:], strict=True)}


#: The case that measures the calling loop alone.
NOTHING = "nothing"


def child(calls: int) -> None:
    """Every 4 KiB case, ``calls`` times inside one ``functools.reduce`` each (after a warm-up
    outside it), in the order ``instructions`` reads the dumps."""
    w = World()
    cases = {NOTHING: lambda: None, **cases_4k(w)}
    for fn in cases.values():
        for _ in range(100):
            fn()
        functools.reduce(lambda _a, _b, fn=fn: fn(), range(calls), None)
    w.close()


def print_rows(title: str, rows: Rows) -> None:
    print(f"\n{title}\n| subject | peer | time (subject / peer) | ratio | goal |\n|---|---|---|---|---|")
    for r in rows:
        print("| " + " | ".join(r) + " |")


WORLD: World


def main() -> None:
    global WORLD
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer rounds, shorter runs (a smoke test)")
    ap.add_argument("--instructions", action="store_true", help="callgrind instructions per call of the 4 KiB rows")
    ap.add_argument("--child", type=int, metavar="CALLS", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child)
        return
    gc.disable()
    WORLD = w = World()
    rounds = 3 if args.quick else 15
    t = measure(cases_4k(w), 0.002 if args.quick else 0.01, rounds)
    rows: Rows = []
    for subject, peer, goal in RATIOS_4K:
        row(rows, subject, peer, t[subject], t[peer], goal)
    print_rows("4 KiB, least of interleaved rounds", rows)
    if args.instructions:
        ins = instructions(args.quick)
        ins_rows = []
        for subject, peer, goal in RATIOS_4K:
            r = ins[subject] / ins[peer]
            ins_rows.append(
                (subject, peer, f"{ins[subject]:,.0f} / {ins[peer]:,.0f} instr", f"{r:.2f}x", goal_text(r, goal))
            )
        print_rows("4 KiB, callgrind instructions per call", ins_rows)
    print("\nsizes (HostPool against NumPy):", flush=True)
    print_rows("HostPool.empty/zeros/full against NumPy, 64 B to 1 GiB", sizes_table(w, args.quick))
    print_rows("np.zeros with the pool's NEP 49 handler against without", nep49_table(w, args.quick))
    print_rows("allocate-free and allocate-touch-free cycles", cycles_table(w, args.quick))
    print_rows("threads: aggregate pairs per second", threads_table(w, args.quick))
    w.close()


if __name__ == "__main__":
    main()
