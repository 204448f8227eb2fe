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
from typing import Any

from . import _args, _files
from .errors import invalid_param

#: Most ``steps x layers`` a generated trace may have (about 25 events each).
_MAX_WORK = 1 << 20


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
    Every argument is a positive int (sizes stay below 2**64 bytes).
    """
    layers = _args.integer(layers, "layers", 1, 1 << 16)
    hidden = _args.integer(hidden, "hidden", 1, 1 << 20)
    heads = _args.integer(heads, "heads", 1, 1 << 16)
    vocab = _args.integer(vocab, "vocab", 1, 1 << 24)
    steps = _args.integer(steps, "steps", 1, 1 << 16)
    batch = _pair_arg(batch, "batch")
    seq = _pair_arg(seq, "seq")
    dtype_bytes = _args.integer(dtype_bytes, "dtype_bytes", 1, 16)
    seed = _args.integer(seed, "seed", -(2**63), 2**64 - 1)
    if steps * layers > _MAX_WORK:
        raise invalid_param(f"steps x layers = {steps * layers:,} would make too many events; at most {_MAX_WORK:,}")
    biggest = max(batch) * (max(seq) + 64) * max(vocab * 4, heads * (max(seq) + 64), 4 * hidden) * dtype_bytes
    if biggest > _args.U64_MAX or vocab * hidden * dtype_bytes * 4 > _args.U64_MAX:
        raise invalid_param("batch, seq, hidden, heads and vocab make a tensor of 2**64 bytes or more")
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


def random_churn(events: int = 20000, *, seed: int = 1, max_live: int = 300) -> list[tuple]:
    """Random mixed-size churn: allocations of 4 KiB - 64 MiB (log-uniform) and frees of random
    live blocks, at most ``max_live`` live at once, then every live block freed: the trace that
    fragments a pool most. ``("alloc", id, size)`` / ``("free", id)`` events (about ``events``
    of them before the final frees)."""
    events = _args.integer(events, "events", 1, _MAX_WORK)
    seed = _args.integer(seed, "seed", -(2**63), 2**64 - 1)
    max_live = _args.integer(max_live, "max_live", 1, _MAX_WORK)
    rng = random.Random(seed)
    out: list[tuple] = []
    live: list[int] = []
    for i in range(events):
        if live and (len(live) > max_live or rng.random() < 0.45):
            out.append(("free", live.pop(rng.randrange(len(live)))))
        else:
            out.append(("alloc", i, int(2 ** rng.uniform(12, 26))))
            live.append(i)
    out.extend(("free", i) for i in live)
    return out


def _pair_arg(value: Any, name: str) -> tuple[int, int]:
    """A (first, last) pair of positive ints."""
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise _args.type_error(name, value, "a (first, last) pair of ints")
    return (
        _args.integer(value[0], f"{name}[0]", 1, 1 << 24),
        _args.integer(value[1], f"{name}[1]", 1, 1 << 24),
    )


def load(path: str) -> list[tuple[str, int, int]]:
    """Events from a compact trace file (``.json`` or ``.json.gz``) holding
    ``{"events": [[action, id, size], ...]}``, as ``benches/record_torch_traces.py`` writes (the
    bundled ``benches/traces/*.json.gz``). Anything else raises InvalidParamError naming the file
    and the event."""
    name = _files.path_arg(path)
    data = _files.read_json(name, 'a compact trace ({"events": [[action, id, size], ...]})')
    if not isinstance(data, dict) or not isinstance(data.get("events"), list):
        hint = (
            " (a torch.profiler trace: read it with npumem.importers.profiler_trace)"
            if (isinstance(data, dict) and "traceEvents" in data)
            else ""
        )
        raise invalid_param(f'{name}: expected {{"events": [[action, id, size], ...]}}{hint}')
    out = []
    for n, ev in enumerate(data["events"]):
        if not isinstance(ev, list) or len(ev) != 3 or not isinstance(ev[0], str):
            raise invalid_param(f"{name}: events[{n}] is {_args.show(ev)}, not [action, id, size]")
        action, key, size = ev
        out.append((action, tuple(key) if isinstance(key, list) else key, size))
    return out
