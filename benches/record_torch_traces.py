"""Records real allocation traces from PyTorch on the CPU (needs torch; not run by CI).

Each model trains for a few steps under ``torch.profiler`` with ``profile_memory=True``; the
``[memory]`` events of the exported Chrome trace become npumem replay events
(``npumem.formats.load``), renumbered and stored compactly in
``benches/traces/<name>.json.gz`` so that the benchmark and the tests replay them without torch.

Run (once, in an environment with torch and npumem):
    python benches/record_torch_traces.py [--out benches/traces]
"""

from __future__ import annotations

import argparse
import gzip
import json
import tempfile
from pathlib import Path

import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile

from npumem import formats


def transformer(steps: int = 3, seqs=(64, 96, 128)) -> tuple[nn.Module, list]:
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(d_model=256, nhead=4, dim_feedforward=1024, batch_first=True)
    model = nn.Sequential(nn.Embedding(8000, 256), nn.TransformerEncoder(layer, 4), nn.Linear(256, 8000))
    batches = [torch.randint(0, 8000, (16, seqs[i % len(seqs)])) for i in range(steps)]
    return model, batches


def convnet(steps: int = 3, sizes=(64, 96, 128)) -> tuple[nn.Module, list]:
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(64, 128, 3, padding=1), nn.BatchNorm2d(128), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        nn.Flatten(), nn.Linear(128, 10),
    )  # fmt: skip
    batches = [torch.randn(32, 3, sizes[i % len(sizes)], sizes[i % len(sizes)]) for i in range(steps)]
    return model, batches


MODELS = {"torch_cpu_transformer": transformer, "torch_cpu_convnet": convnet}


def record(name: str) -> dict:
    model, batches = MODELS[name]()
    opt = torch.optim.Adam(model.parameters())
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        for x in batches:
            out = model(x)
            loss = out.float().square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        # Ids renumbered densely in order of first use, as formats.Trace holds them.
        compact = [list(e) for e in formats.load(path, device_type=0).events()]
    return {
        "source": f"torch.profiler(profile_memory=True) on the CPU, torch {torch.__version__}",
        "model": name,
        "steps": len(batches),
        "events": compact,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(Path(__file__).parent / "traces"))
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name in MODELS:
        data = record(name)
        with gzip.open(out / f"{name}.json.gz", "wt") as f:
            json.dump(data, f, separators=(",", ":"))
        print(f"{name}: {len(data['events'])} events -> {out / (name + '.json.gz')}")


if __name__ == "__main__":
    main()
