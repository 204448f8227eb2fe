"""The `npu` device in shape mode (npumem.torch, simulated memory, meta kernels) beside PyTorch's
own shape-only device (`meta`) and the CPU in the same run: the time an op takes; the Llama-style
7B training step of examples/llama_train_step.py run in this process (ops per second, peaks, host
memory) beside the same step under PyTorch's MemTracker on FakeTensorMode (the tool a CPU user
has: live tensor bytes, no allocator); and `npumem fit --mode shape` at 80 GiB and 192 GiB, each
in its own process.

Usage: python benches/bench_torch_shape.py [--layers 32] [--no-fit] [--no-memtracker]
"""

from __future__ import annotations

import argparse
import os
import pathlib
import resource
import runpy
import subprocess
import sys
import time

import torch

import npumem.torch
from npumem.torch import shape

ROOT = pathlib.Path(__file__).resolve().parent.parent
LLAMA = ROOT / "examples" / "llama_train_step.py"


def per_op_us(device: str, what: str, n: int = 2000) -> float:
    a = torch.ones(64, 64, device=device)
    ops = {"add": lambda: a + a, "mm": lambda: a @ a, "add_": lambda: a.add_(a), "slice": lambda: a[1:3]}
    op = ops[what]
    for _ in range(50):
        op()
    t = time.perf_counter()
    for _ in range(n):
        op()
    return (time.perf_counter() - t) / n * 1e6


def memtracker(layers: int) -> None:
    """The example's step under ``MemTracker`` on ``FakeTensorMode`` (CPU fake tensors; AdamW
    with ``foreach=True``, which the npu device gets by default)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker

    llama = runpy.run_path(str(LLAMA))["Llama"]
    t = time.perf_counter()
    with FakeTensorMode():
        model = llama(layers, 4096, 11008, 32, 32000)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
        tracker = MemTracker()
        tracker.track_external(model, optimizer)
        with tracker:
            tokens = torch.randint(0, 32000, (1, 512))
            loss = torch.nn.functional.cross_entropy(model(tokens).view(-1, 32000), tokens.view(-1))
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        peak = sum(v["Total"] for v in tracker.get_tracker_snapshot("peak").values())
    print(
        f"MemTracker on FakeTensorMode, the same step: {time.perf_counter() - t:.1f} s, peak {peak / 2**30:.2f} GiB "
        "(no reserved memory, fragmentation or out-of-memory point)"
    )


def llama_step(layers: int) -> None:
    """The example's step in this process; prints its ops per second and memory."""
    calls = [0]
    inner = shape.fallback

    def counted(op, *args, **kwargs):
        calls[0] += 1
        return inner(op, *args, **kwargs)

    shape.fallback = counted  # the kernels look it up when they are registered, below
    npumem.torch.install(mode="shape", capacity="192GiB")
    saved = sys.argv
    sys.argv = [str(LLAMA), "--layers", str(layers)]
    t = time.perf_counter()
    try:
        runpy.run_path(str(LLAMA), run_name="__main__")
    finally:
        sys.argv = saved
    wall = time.perf_counter() - t
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (1 << 20)
    print(
        f"Llama-style step ({layers} layers, hidden 4096, fp32, AdamW): {wall:.1f} s, {calls[0]:,} ops through the "
        f"shape kernels = {calls[0] / wall:,.0f} ops/s; peak allocated {torch.npu.max_memory_allocated() / 2**30:.2f} "
        f"GiB, peak reserved {torch.npu.max_memory_reserved() / 2**30:.2f} GiB; host max RSS {rss:.2f} GiB"
    )


def fit(capacity: str, layers: int) -> None:
    """``npumem fit --mode shape`` in a process of its own: its answer, wall time and RSS."""
    cmd = [sys.executable, "-m", "npumem", "fit", "--mode", "shape", "--capacity", capacity]
    cmd += [str(LLAMA), "--layers", str(layers)]
    t = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    out = proc.stdout.read() if proc.stdout else ""
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t
    answer = out.strip().splitlines()[-1]
    print(
        f"npumem fit --mode shape --capacity {capacity}: exit {os.waitstatus_to_exitcode(status)} in {wall:.1f} s, "
        f"max RSS {usage.ru_maxrss / (1 << 20):.2f} GiB: {answer}"
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--no-fit", action="store_true", help="skip the two npumem fit runs")
    ap.add_argument("--no-memtracker", action="store_true", help="skip MemTracker (about 35 s at 32 layers)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    if not args.no_fit:
        for capacity in ("80GiB", "192GiB"):
            fit(capacity, args.layers)
    ops = ("add", "add_", "mm", "slice")
    # PyTorch's meta device as it comes (Python meta kernels for ~650 ops), before shape mode
    # makes the C++ ones active (npumem.torch.meta)
    stock = {what: per_op_us("meta", what) for what in ops}
    if not args.no_memtracker:
        memtracker(args.layers)
    llama_step(args.layers)
    for what in ops:
        us = {dev: per_op_us(dev, what) for dev in ("npu", "meta", "cpu")}
        print(
            f"{what} of 64x64 floats: npu (shape) {us['npu']:.1f} us/op = {1e6 / us['npu']:,.0f} ops/s; "
            f"meta as PyTorch ships it {stock[what]:.1f} us/op ({us['npu'] / stock[what]:.2f}x), with its C++ "
            f"kernels {us['meta']:.1f} us/op ({us['npu'] / us['meta']:.1f}x); cpu {us['cpu']:.1f} us/op "
            f"({us['npu'] / us['cpu']:.1f}x)"
        )


if __name__ == "__main__":
    main()
