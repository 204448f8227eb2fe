"""The PyTorch models behind ``examples/graphs/*.json.gz`` (see ``record.py``): an Inception-style
network (GoogLeNet's Inception module: four branches from one input, concatenated), a U-Net (an
encoder whose activations skip across to the decoder) and a small CNN whose training step
(forward, backward, SGD update) is traced whole. Plain ``torch.nn`` modules, random weights."""

from __future__ import annotations

import torch
from torch import nn


def conv(cin: int, cout: int, k: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, k, padding=k // 2), nn.ReLU())


class Inception(nn.Module):
    """GoogLeNet's Inception module (Szegedy et al. 2015, Fig. 2b): 1x1; 1x1 -> 3x3; 1x1 -> 5x5;
    3x3 max-pool -> 1x1; concatenated on channels."""

    def __init__(self, cin: int, c1: int, c3r: int, c3: int, c5r: int, c5: int, cp: int) -> None:
        super().__init__()
        self.b1 = conv(cin, c1, 1)
        self.b3 = nn.Sequential(conv(cin, c3r, 1), conv(c3r, c3, 3))
        self.b5 = nn.Sequential(conv(cin, c5r, 1), conv(c5r, c5, 5))
        self.bp = nn.Sequential(nn.MaxPool2d(3, 1, 1), conv(cin, cp, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.b1(x), self.b3(x), self.b5(x), self.bp(x)], 1)


class InceptionNet(nn.Module):
    """GoogLeNet's inception 3a, 3b and 4a with their published widths at their resolutions (28x28,
    then 14x14 for a 28x28 input), after a one-conv stem to 192 channels, then a classifier."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = conv(3, 192, 3)
        self.i3a = Inception(192, 64, 96, 128, 16, 32, 32)
        self.i3b = Inception(256, 128, 128, 192, 32, 96, 64)
        self.pool = nn.MaxPool2d(2)
        self.i4a = Inception(480, 192, 96, 208, 16, 48, 64)
        self.fc = nn.Linear(512, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.i4a(self.pool(self.i3b(self.i3a(self.stem(x)))))
        return self.fc(x.mean((2, 3)))


class UNet(nn.Module):
    """Ronneberger et al. 2015, four levels: two 3x3 convs per level, 2x2 max-pool down,
    transposed-conv up, each encoder level's output concatenated into the decoder."""

    def __init__(self, c: int = 16, levels: int = 4) -> None:
        super().__init__()
        widths = [c * 2**i for i in range(levels + 1)]
        self.down = nn.ModuleList()
        cin = 3
        for w in widths[:-1]:
            self.down.append(nn.Sequential(conv(cin, w, 3), conv(w, w, 3)))
            cin = w
        self.mid = nn.Sequential(conv(widths[-2], widths[-1], 3), conv(widths[-1], widths[-1], 3))
        self.up = nn.ModuleList()
        self.dec = nn.ModuleList()
        for w_hi, w in zip(reversed(widths[1:]), reversed(widths[:-1]), strict=True):
            self.up.append(nn.ConvTranspose2d(w_hi, w, 2, stride=2))
            self.dec.append(nn.Sequential(conv(2 * w, w, 3), conv(w, w, 3)))
        self.head = nn.Conv2d(widths[0], 2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skips = []
        for d in self.down:
            x = d(x)
            skips.append(x)
            x = nn.functional.max_pool2d(x, 2)
        x = self.mid(x)
        for up, dec, s in zip(self.up, self.dec, reversed(skips), strict=True):
            x = dec(torch.cat([up(x), s], 1))
        return self.head(x)


class SmallCNN(nn.Module):
    """Three conv blocks and a classifier: a chain, as most training steps are."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(
            conv(3, 32, 3), nn.MaxPool2d(2), conv(32, 64, 3), nn.MaxPool2d(2), conv(64, 128, 3), nn.MaxPool2d(2)
        )
        self.fc = nn.Linear(128 * 4 * 4, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.body(x).flatten(1))


def watts_strogatz(n: int, k: int, p: float, seed: int) -> list[tuple[int, int]]:
    """RandWire's WS generator (Xie et al. 2019, section 3.2): a ring lattice where each node links
    to its k/2 neighbours on each side, each edge rewired with probability p; edges point from
    the lower to the higher index, which makes the graph acyclic."""
    import random

    rng = random.Random(seed)
    edges = {(i, (i + j) % n) for i in range(n) for j in range(1, k // 2 + 1)}
    for i, j in sorted(edges):
        if rng.random() < p:
            new = rng.randrange(n)
            while new == i or (i, new) in edges or (new, i) in edges:
                new = rng.randrange(n)
            edges.discard((i, j))
            edges.add((i, new))
    return sorted({(min(a, b), max(a, b)) for a, b in edges})


class RandWire(nn.Module):
    """One RandWire stage (Xie et al. 2019): a WS(n, k, p) random DAG of nodes, each summing its
    inputs, then ReLU, 3x3 conv and batch norm; nodes without predecessors read the stage input,
    the stage output averages the nodes without successors."""

    def __init__(self, channels: int = 32, n: int = 16, k: int = 4, p: float = 0.75, seed: int = 0) -> None:
        super().__init__()
        self.edges = watts_strogatz(n, k, p, seed)
        self.n = n
        self.stem = nn.Conv2d(3, channels, 3, padding=1)
        self.nodes = nn.ModuleList(
            nn.Sequential(nn.ReLU(), nn.Conv2d(channels, channels, 3, padding=1), nn.BatchNorm2d(channels))
            for _ in range(n)
        )
        self.fc = nn.Linear(channels, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        preds: list[list[int]] = [[] for _ in range(self.n)]
        for a, b in self.edges:
            preds[b].append(a)
        out: list[torch.Tensor] = []
        for i in range(self.n):
            inp = x if not preds[i] else sum(out[j] for j in preds[i][1:]) + out[preds[i][0]] * 1.0
            out.append(self.nodes[i](inp))
        sinks = [i for i in range(self.n) if not any(a == i for a, _ in self.edges)]
        y = sum(out[i] for i in sinks) / len(sinks)
        return self.fc(y.mean((2, 3)))
