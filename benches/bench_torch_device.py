"""The `npu` device (npumem.torch, host mode) against plain CPU in the same run: per-op time of
a small add, and a ResNet-style training step (batch 8, SGD) whose result must equal the CPU's, on
npu:0 (PyTorch's autograd engine) and on npu:1 (compiled autograd: its first step traces).

Usage: python benches/bench_torch_device.py [--steps N]
"""

from __future__ import annotations

import argparse
import copy
import time

import torch
from torch import nn

import npumem.torch


def per_op_us(device: str, n: int = 2000) -> float:
    a = torch.ones(1024, device=device)
    b = torch.ones(1024, device=device)
    for _ in range(50):
        a + b
    t = time.perf_counter()
    for _ in range(n):
        a + b
    return (time.perf_counter() - t) / n * 1e6


class Block(nn.Module):
    def __init__(self, c: int):
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(c, c, 3, padding=1, bias=False),
            nn.BatchNorm2d(c),
            nn.ReLU(),
            nn.Conv2d(c, c, 3, padding=1, bias=False),
            nn.BatchNorm2d(c),
        )

    def forward(self, x):
        return torch.relu(x + self.body(x))


def resnet() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1, bias=False),
        nn.BatchNorm2d(32),
        nn.ReLU(),
        *[Block(32) for _ in range(4)],
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(32, 10),
    )


def train_seconds(model: nn.Module, x, y, steps: int) -> tuple[float, torch.Tensor, float]:
    """Seconds per step after the first, the last loss, and the first step's seconds."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()

    def step():
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        return loss.detach()

    t = time.perf_counter()
    step()  # warm-up
    first = time.perf_counter() - t
    t = time.perf_counter()
    for _ in range(steps):
        loss = step()
    return (time.perf_counter() - t) / steps, loss.cpu(), first


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(1)
    npumem.torch.install(capacity="4GiB", devices=2)
    cpu, npu = per_op_us("cpu"), per_op_us("npu")
    print(f"add of 1,024 floats: cpu {cpu:.1f} us/op, npu {npu:.1f} us/op ({npu / cpu:.0f}x)")
    torch.manual_seed(0)
    model = resnet()
    x, y = torch.randn(8, 3, 32, 32), torch.randint(0, 10, (8,))
    on_npu = copy.deepcopy(model).npu()
    on_npu1 = copy.deepcopy(model).to("npu:1")
    t_cpu, l_cpu, _ = train_seconds(model, x, y, args.steps)
    t_npu, l_npu, _ = train_seconds(on_npu, x.npu(), y.npu(), args.steps)
    t_npu1, l_npu1, first1 = train_seconds(on_npu1, x.to("npu:1"), y.to("npu:1"), args.steps)
    assert torch.equal(l_cpu, l_npu) and torch.equal(l_cpu, l_npu1), (l_cpu, l_npu, l_npu1)
    print(
        f"ResNet-style step (9 convs, batch 8, 32x32, SGD): cpu {t_cpu * 1e3:.1f} ms, npu {t_npu * 1e3:.1f} ms "
        f"({t_npu / t_cpu:.2f}x); same loss {l_npu.item():.6f}; peak allocated {torch.npu.max_memory_allocated():,} B, "
        f"peak reserved {torch.npu.max_memory_reserved():,} B"
    )
    print(
        f"the same step on npu:1 (compiled autograd): {t_npu1 * 1e3:.1f} ms ({t_npu1 / t_npu:.2f}x npu:0's), "
        f"its first step (tracing) {first1:.2f} s; same loss"
    )


if __name__ == "__main__":
    main()
