"""A tiny PyTorch training loop on the `npu` device, as written for torch_npu (`make run` runs it
under `python -m npumem.torch`): a small CNN with BatchNorm, three SGD steps, then the memory
the npumem device behind npu:0 saw.

Usage: python -m npumem.torch examples/tiny_npu.py
"""

from __future__ import annotations

import torch
from torch import nn

import npumem.torch


def main() -> None:
    torch.manual_seed(0)
    features = [nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU()]
    model = nn.Sequential(*features, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10)).npu()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x, y = torch.randn(8, 3, 32, 32, device="npu"), torch.randint(0, 10, (8,), device="npu")
    for step in range(3):
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        print(f"step {step}: loss {loss.item():.4f} on {loss.device}")
    dev = npumem.torch.device()
    print(
        f"npu:0 ({dev.allocator} allocator): allocated {torch.npu.memory_allocated():,} B, peak "
        f"{torch.npu.max_memory_allocated():,} B, reserved {torch.npu.memory_reserved():,} B"
    )


if __name__ == "__main__":
    main()
