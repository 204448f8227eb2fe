"""Imports real model graphs from PyTorch on the CPU (needs torch, torchvision, transformers;
not run by CI) and stores them as npumem graphs in ``benches/graphs/<name>.json.gz``, so that
``benches/bench_graphs.py`` and the tests plan them without torch.

Models are built from their configs with random weights (no downloads): ResNet-50 and
MobileNet v2 inference at batch 1 (fx + ShapeProp, fused as inference engines fuse them, and
ResNet-50 unfused), BERT-base at sequence length 128 (torch.export), and training steps at batch
32 of ResNet-18, ResNet-50 and MobileNet v2 (make_fx of forward + backward).

Run (once, in an environment with torch and npumem):
    python benches/record_torch_graphs.py [--out benches/graphs]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
import torchvision
from transformers import BertConfig, BertModel

from npumem.torch_graphs import from_export, from_fx, from_training


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(Path(__file__).parent / "graphs"))
    out = Path(ap.parse_args().out)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    x1 = torch.randn(1, 3, 224, 224)
    x32 = torch.randn(32, 3, 224, 224)
    ids = torch.randint(0, 30000, (1, 128))
    mask = torch.ones(1, 128, dtype=torch.long)
    models = {
        "resnet50": lambda: from_fx(torchvision.models.resnet50(), x1),
        "resnet50_fused": lambda: from_fx(torchvision.models.resnet50(), x1, fuse=True),
        "mobilenet_v2_fused": lambda: from_fx(torchvision.models.mobilenet_v2(), x1, fuse=True),
        "bert_base_seq128": lambda: from_export(
            BertModel(BertConfig()), (), {"input_ids": ids, "attention_mask": mask}
        ),
        "resnet18_train_bs32": lambda: from_training(torchvision.models.resnet18(), x32),
        "resnet50_train_bs32": lambda: from_training(torchvision.models.resnet50(), x32),
        "mobilenet_v2_train_bs32": lambda: from_training(torchvision.models.mobilenet_v2(), x32),
    }
    for name, build in models.items():
        t = time.perf_counter()
        g = build()
        g.save(out / f"{name}.json.gz")
        print(f"{name}: {len(g)} tensors, {len(g.ops)} ops ({time.perf_counter() - t:.1f} s) -> {out / name}.json.gz")
    print(f"torch {torch.__version__}, torchvision {torchvision.__version__}")


if __name__ == "__main__":
    main()
