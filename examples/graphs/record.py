"""Records the example graphs of ``examples/graphs/`` from the PyTorch models in ``models.py``
(needs torch; runs on the CPU in a few seconds, random weights, no downloads):

- ``randwire_s{0,1,2}``: RandWire stages (WS(16, 4, 0.75), seeds 0-2), inference by
  ``torch.export`` — irregular wiring, where the op order decides the peak;
- ``inception``: GoogLeNet's inception 3a, 3b, 4a (four-way fan-out), ``torch.export``;
- ``unet``: a four-level U-Net (encoder skips into the decoder), ``torch.export``;
- ``cnn_train_sgd``: one training step of a small CNN at batch 8 — forward, backward and the
  SGD update of every weight (in place) — by ``make_fx``.

Run: ``python examples/graphs/record.py [--out examples/graphs]``; then
``npumem plan examples/graphs/unet.json --schedule``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from models import InceptionNet, RandWire, SmallCNN, UNet

from npumem.torch_graphs import from_export, from_training


def builders() -> dict:
    """Each example graph's name and a function that records it."""
    graphs = {
        f"randwire_s{s}": lambda s=s: from_export(RandWire(seed=s), (torch.randn(1, 3, 32, 32),)) for s in range(3)
    }
    graphs["inception"] = lambda: from_export(InceptionNet(), (torch.randn(1, 3, 28, 28),))
    graphs["unet"] = lambda: from_export(UNet(), (torch.randn(1, 3, 128, 128),))
    graphs["cnn_train_sgd"] = lambda: from_training(SmallCNN(), torch.randn(8, 3, 32, 32), lr=0.01)
    return graphs


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(Path(__file__).parent))
    out = Path(ap.parse_args().out)
    sizes = {}
    for name, build in builders().items():
        torch.manual_seed(0)
        g = build()
        g.save(out / f"{name}.json")
        sizes[name] = (len(g), len(g.ops))
    print(
        f"torch {torch.__version__} -> {out}: "
        + ", ".join(f"{n} ({t} tensors, {o} ops)" for n, (t, o) in sizes.items())
    )


if __name__ == "__main__":
    main()
