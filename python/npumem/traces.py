"""Built-in allocation traces: synthetic but shaped like real training.

``transformer_training`` emits the alloc/free events a decoder-only transformer's training loop
makes under PyTorch: persistent weights, Adam state created at the first step, per-layer
activations saved in the forward pass and released in reverse during the backward pass,
short-lived temporaries, large logits, and gradients dropped after each optimizer step
(``zero_grad(set_to_none=True)``). Batch size and sequence length grow from step to step, the
case that fragments a caching allocator: every step's blocks are a little larger than the holes
the last step left.
"""

from __future__ import annotations

import random
from itertools import count


def transformer_training(
    *,
    layers: int = 8,
    hidden: int = 1024,
    heads: int = 16,
    vocab: int = 32000,
    steps: int = 6,
    batch: tuple[int, int] = (4, 8),
    seq: tuple[int, int] = (256, 768),
    dtype_bytes: int = 2,
    seed: int = 0,
) -> list[tuple[str, int, int]]:
    """Events ``("alloc", id, size)`` / ``("free", id, size)`` of ``steps`` training steps.

    Batch and sequence length grow linearly from the first to the second value of each pair,
    with a little jitter (``seed``) in the sequence length, as with bucketed variable-length data.
    """
    rng = random.Random(seed)
    ids = count()
    events: list[tuple[str, int, int]] = []
    live: dict[int, int] = {}

    def alloc(size: int) -> int:
        i = next(ids)
        events.append(("alloc", i, size))
        live[i] = size
        return i

    def free(i: int) -> None:
        events.append(("free", i, live.pop(i)))

    h = hidden
    param_shapes = [vocab * h] + [s for _ in range(layers) for s in (3 * h * h, h * h, 4 * h * h, 4 * h * h, 2 * h)]
    params = [alloc(n * dtype_bytes) for n in param_shapes]
    adam: list[int] = []
    for step in range(steps):
        t = step / max(1, steps - 1)
        b = round(batch[0] + t * (batch[1] - batch[0]))
        s = round(seq[0] + t * (seq[1] - seq[0])) + rng.randrange(0, 64)
        bsh = b * s * h * dtype_bytes
        saved: list[list[int]] = []
        x = alloc(bsh)  # embeddings
        for _ in range(layers):
            keep = [x, alloc(3 * bsh)]  # input, qkv
            scores = alloc(b * heads * s * s * dtype_bytes)
            probs = alloc(b * heads * s * s * dtype_bytes)
            free(scores)
            keep.append(probs)
            keep.append(alloc(bsh))  # attention output
            ff = alloc(4 * bsh)
            act = alloc(4 * bsh)  # gelu output
            keep += [ff, act]
            x = alloc(bsh)  # layer output (next layer's input)
            saved.append(keep)
        logits = alloc(b * s * vocab * dtype_bytes)
        loss_tmp = alloc(b * s * vocab * 4)  # fp32 log-softmax
        free(loss_tmp)
        grad_logits = alloc(b * s * vocab * dtype_bytes)
        free(logits)
        grad_x = alloc(bsh)
        free(grad_logits)
        free(x)
        grads = [alloc(live[params[0]])]  # embedding grad
        for li in reversed(range(layers)):
            g_ff = alloc(4 * bsh)
            grads += [alloc(live[p]) for p in params[1 + 5 * li : 6 + 5 * li]]
            g_attn = alloc(3 * bsh)
            free(g_ff)
            new_grad_x = alloc(bsh)
            free(g_attn)
            free(grad_x)
            grad_x = new_grad_x
            for i in saved[li]:
                free(i)
        free(grad_x)
        if not adam:
            adam = [alloc(2 * live[p]) for p in params] + [alloc(2 * live[p]) for p in params]  # fp32 m and v
        for p in params:
            tmp = alloc(2 * live[p])  # fp32 update temporary
            free(tmp)
        for g in grads:
            free(g)
    for i in adam + params:
        free(i)
    return events


def load(path: str) -> list[tuple[str, int, int]]:
    """Events from a compact trace file (``.json`` or ``.json.gz``) holding
    ``{"events": [[action, id, size], ...]}``, as ``benches/record_torch_traces.py`` writes."""
    import gzip
    import json

    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt") as f:
        data = json.load(f)
    return [(a, k, s) for a, k, s in data["events"]]
