"""One fp32 training step (AdamW) of a Llama-style decoder built from torch.nn, on ``npu``.

At the default size it is Llama-2-7B's shape (32 layers, hidden 4096, MLP 11008, 32 heads,
vocabulary 32000: 6.74 billion parameters), far more than a laptop holds, so run it in shape mode,
where memory is simulated and ops compute shapes only:

    npumem fit --mode shape --capacity 80GiB examples/llama_train_step.py     # does not fit
    npumem fit --mode shape --capacity 192GiB examples/llama_train_step.py    # fits

Rules:
- The model is made on the device (``torch.device("npu")``), as a big model must be: built on
  the CPU first, its 27 GB of weights would need the host's memory.
- Nothing reads a tensor's values (no ``loss.item()``), so the step runs in shape mode too.
- It prints its parameter count (one line, ``parameters: N``) before the step.

Usage: python -m npumem.torch examples/llama_train_step.py [--layers 32] [--hidden 4096]
[--intermediate 11008] [--heads 32] [--vocab 32000] [--batch 1] [--seq 512]
"""

from __future__ import annotations

import argparse

import torch
from torch import nn
from torch.nn import functional as F


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


class Attention(nn.Module):
    def __init__(self, hidden: int, heads: int):
        super().__init__()
        self.heads = heads
        self.q_proj = nn.Linear(hidden, hidden, bias=False)
        self.k_proj = nn.Linear(hidden, hidden, bias=False)
        self.v_proj = nn.Linear(hidden, hidden, bias=False)
        self.o_proj = nn.Linear(hidden, hidden, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        projections = (self.q_proj, self.k_proj, self.v_proj)
        q, k, v = (p(x).view(b, s, self.heads, h // self.heads).transpose(1, 2) for p in projections)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(out.transpose(1, 2).reshape(b, s, h))


class MLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, hidden: int, intermediate: int, heads: int):
        super().__init__()
        self.input_layernorm = RMSNorm(hidden)
        self.self_attn = Attention(hidden, heads)
        self.post_attention_layernorm = RMSNorm(hidden)
        self.mlp = MLP(hidden, intermediate)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class Llama(nn.Module):
    def __init__(self, layers: int, hidden: int, intermediate: int, heads: int, vocab: int):
        super().__init__()
        self.heads = heads
        self.embed_tokens = nn.Embedding(vocab, hidden)
        self.layers = nn.ModuleList(DecoderLayer(hidden, intermediate, heads) for _ in range(layers))
        self.norm = RMSNorm(hidden)
        self.lm_head = nn.Linear(hidden, vocab, bias=False)

    def rotary(self, seq: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        dim = self.embed_tokens.embedding_dim // self.heads
        inv_freq = 1.0 / (10000 ** (torch.arange(0, dim, 2, device=device, dtype=torch.float32) / dim))
        angles = torch.outer(torch.arange(seq, device=device, dtype=torch.float32), inv_freq)
        angles = torch.cat((angles, angles), dim=-1)
        return angles.cos(), angles.sin()

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        cos, sin = self.rotary(tokens.shape[1], tokens.device)
        x = self.embed_tokens(tokens)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.lm_head(self.norm(x))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=32)
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--intermediate", type=int, default=11008)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--seq", type=int, default=512)
    a = p.parse_args()
    device = torch.device("npu")
    with device:
        model = Llama(a.layers, a.hidden, a.intermediate, a.heads, a.vocab)
    print(f"parameters: {sum(t.numel() for t in model.parameters())}", flush=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    tokens = torch.randint(0, a.vocab, (a.batch, a.seq), device=device)
    logits = model(tokens)
    loss = F.cross_entropy(logits.view(-1, a.vocab), tokens.view(-1))
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


if __name__ == "__main__":
    main()
