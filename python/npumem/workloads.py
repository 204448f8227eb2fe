"""Workload generators: seeded allocation traces shaped like the jobs that fragment device pools
(every trace generator of npumem is here).

Every generator returns a list of events in the format :func:`npumem.replay.replay` takes:
``("alloc", id, size)`` and ``("free", id, size)`` tuples, and, for :func:`pipeline_parallel`
(whose buffers live on two streams), mappings ``{"action", "id", "size", "stream"}`` (stream 0
is the compute stream, 1 the communication stream; ``replay`` reads them and ignores the
stream, :func:`measure` runs each stream's batches on a stream of its own). Invariants of every
generated trace: ids are ints, each allocated once and freed at most once after its allocation,
and every allocation is freed by the end (a trace ends with nothing live); sizes are positive
ints derived from the model's dimensions (below), never from unchecked arithmetic — arguments are
checked first, and a trace whose largest tensor or event count would be absurd is refused with
``InvalidParamError`` naming the arguments. The same arguments and ``seed`` give the same trace.

Sizes come from :class:`Model` dimensions (``hidden``, ``layers``, ``heads``, ``kv_heads``,
``ffn``, ``vocab``, ``experts``) times the element size ``dtype_bytes`` (2 for fp16/bf16):

- :func:`transformer_training`: a decoder-only transformer's training loop under PyTorch:
  persistent weights, Adam state created at the first step, per-layer activations saved in the
  forward pass and released in reverse during the backward pass, short-lived temporaries, large
  logits, and gradients dropped after each optimizer step (``zero_grad(set_to_none=True)``).
  Batch size and sequence length grow from step to step, the case that fragments a caching
  allocator: every step's blocks are a little larger than the holes the last step left.
- :func:`llm_training`: :func:`transformer_training` with a :class:`Model`'s dimensions.
- :func:`kv_cache_serving`: KV bytes per token ``2 x layers x kv_heads x head_dim x dtype``
  (512 KiB for Llama-2-7B in fp16); paged mode allocates a block of ``block_tokens`` tokens as a
  sequence grows (vLLM's scheme); contiguous mode one buffer per request sized for prompt plus
  ``max_new_tokens`` (a static cache); plus the prefill activations and per-step logits.
- :func:`dynamic_shape_inference`: a Faster R-CNN-style detector (ResNet-50 + FPN, RPN, RoI
  heads) at batch 8 on images whose padded size changes every batch (short side 480-800,
  long side up to 1333, multiples of 32): every feature map's size changes with the image.
- :func:`moe_routing`: a mixture-of-experts forward pass; per layer, router logits and, per
  expert, the gathered tokens and its FFN activations for however many tokens the router sent
  it (skewed, changing every step).
- :func:`pipeline_parallel`: one stage of a pipeline-parallel job under the 1F1B schedule:
  activations kept per micro-batch until its backward, receive / send buffers on the
  communication stream.
- :func:`long_running_service`: a service whose pool grows: per-request temporaries plus a
  cache of long-lived entries (sessions, embeddings) that keeps growing, the live-block count
  reaching tens of thousands — the setting for :func:`measure`'s latency-as-the-pool-grows.

:func:`random_churn` takes no model: allocations of 4 KiB - 64 MiB (log-uniform) and frees
``("free", id)`` of random live blocks, on :func:`churn`, the random alloc/free order that
:mod:`npumem.stress` starts its searches from too.

:func:`measure` replays a trace on one allocator family through the batch path
(``malloc_many``/``free_many``, one call per run of same-kind events) and samples, per window of
events, the peak allocated and reserved bytes, the live blocks and the time per allocation: the
timeline picture (:func:`plot_timelines`) and the latency-as-the-pool-grows benchmark
(``benches/bench_workloads.py``).
"""

from __future__ import annotations

import itertools
import math
import random
import statistics
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from . import _args, _files, formats
from .errors import OutOfMemoryError, invalid_param

#: The most events a generator builds (about a minute of replay in Python, seconds in Rust).
MAX_EVENTS = 1 << 24
#: The largest single tensor a generator emits (1 TiB: the simulator's largest device).
MAX_TENSOR = 1 << 40


@dataclass(frozen=True)
class Model:
    """A transformer's dimensions (those the published configs give)."""

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    experts: int = 1
    top_k: int = 1

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def kv_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        """Keys and values of one token over every layer."""
        return 2 * self.layers * self.kv_heads * self.head_dim * dtype_bytes


#: Published model configurations (Hugging Face config.json of each model).
MODELS = {
    m.name: m
    for m in (
        Model("gpt2", layers=12, hidden=768, heads=12, kv_heads=12, ffn=3072, vocab=50257),
        Model("gpt2-medium", layers=24, hidden=1024, heads=16, kv_heads=16, ffn=4096, vocab=50257),
        Model("llama-2-7b", layers=32, hidden=4096, heads=32, kv_heads=32, ffn=11008, vocab=32000),
        Model("llama-3-8b", layers=32, hidden=4096, heads=32, kv_heads=8, ffn=14336, vocab=128256),
        Model("mixtral-8x7b", layers=32, hidden=4096, heads=32, kv_heads=8, ffn=14336, vocab=32000, experts=8, top_k=2),
        Model("qwen1.5-moe-a2.7b", 24, 2048, 16, 16, ffn=1408, vocab=151936, experts=60, top_k=4),
    )
}


def model(value: str | Model) -> Model:
    """A :class:`Model`, or the name of one in :data:`MODELS`."""
    if isinstance(value, Model):
        return value
    return MODELS[_args.choice(value, "model", MODELS)]


class _Trace:
    """Builds events; ``stream`` events are mappings, the others tuples."""

    def __init__(self) -> None:
        self.events: list[Any] = []
        self.live: dict[int, int] = {}
        self.streams: dict[int, int] = {}
        self.next_id = 0

    def alloc(self, size: int, stream: int | None = None) -> int:
        size = max(1, int(size))
        if size > MAX_TENSOR:
            raise invalid_param(f"a tensor of {size:,} bytes: more than 1 TiB; use smaller dimensions")
        if len(self.events) >= MAX_EVENTS:
            raise invalid_param(f"the workload makes more than {MAX_EVENTS:,} events; use fewer steps or requests")
        i = self.next_id
        self.next_id += 1
        self.live[i] = size
        if stream is None:
            self.events.append(("alloc", i, size))
        else:
            self.streams[i] = stream
            self.events.append({"action": "alloc", "id": i, "size": size, "stream": stream})
        return i

    def free(self, i: int) -> None:
        """Frees ``i`` on the stream it was allocated on."""
        size = self.live.pop(i)
        stream = self.streams.pop(i, None)
        if stream is None:
            self.events.append(("free", i, size))
        else:
            self.events.append({"action": "free", "id": i, "size": size, "stream": stream})

    def free_all(self, ids: Iterable[int]) -> None:
        for i in ids:
            self.free(i)

    def close(self) -> list[Any]:
        """Frees what is still live, newest first, and returns the events."""
        for i in sorted(self.live, reverse=True):
            self.free(i)
        return self.events


def _seed(seed: Any) -> random.Random:
    return random.Random(_args.integer(seed, "seed", -(2**63), 2**64 - 1))


def _dtype(dtype_bytes: Any) -> int:
    return _args.integer(dtype_bytes, "dtype_bytes", 1, 16)


def _pair(value: Any, name: str, lo: int = 1, hi: int = 1 << 24) -> tuple[int, int]:
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise _args.type_error(name, value, "a (low, high) pair of ints")
    a, b = (_args.integer(v, f"{name}[{k}]", lo, hi) for k, v in enumerate(value))
    if a > b:
        raise invalid_param(f"{name} {tuple(value)} must be (low, high) with low <= high")
    return a, b


# -- transformer training and random churn ---------------------------------------------------

#: Most ``steps x layers`` of :func:`transformer_training` (about 25 events each), and most
#: events of :func:`random_churn`.
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
    batch = _first_last(batch, "batch")
    seq = _first_last(seq, "seq")
    dtype_bytes = _args.integer(dtype_bytes, "dtype_bytes", 1, 16)
    seed = _args.integer(seed, "seed", -(2**63), 2**64 - 1)
    if steps * layers > _MAX_WORK:
        raise invalid_param(f"steps x layers = {steps * layers:,} would make too many events; at most {_MAX_WORK:,}")
    biggest = max(batch) * (max(seq) + 64) * max(vocab * 4, heads * (max(seq) + 64), 4 * hidden) * dtype_bytes
    if biggest > _args.U64_MAX or vocab * hidden * dtype_bytes * 4 > _args.U64_MAX:
        raise invalid_param("batch, seq, hidden, heads and vocab make a tensor of 2**64 bytes or more")
    rng = random.Random(seed)
    ids = itertools.count()
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
    return churn(rng, steps=events, max_live=max_live, size=lambda: int(2 ** rng.uniform(12, 26)))


def churn(
    rng: random.Random,
    *,
    steps: int | None = None,
    allocs: int | None = None,
    max_live: int | None = None,
    size: Callable[[], int] | None = None,
) -> list[tuple]:
    """Random churn: at each step, when a block is live and more than ``max_live`` are (or with
    probability 0.45), a random live block is freed, else a block is allocated; after ``steps``
    steps (or when an allocation past the ``allocs``-th is due) every live block is freed, in
    order of allocation. A block's id is the step that allocates it. Events are
    ``("alloc", id, size())`` and ``("free", id)``, or ``("alloc", id)`` without ``size``."""
    out: list[tuple] = []
    live: list[int] = []
    allocated = 0
    for i in range(steps) if steps is not None else itertools.count():
        if live and ((max_live is not None and len(live) > max_live) or rng.random() < 0.45):
            out.append(("free", live.pop(rng.randrange(len(live)))))
            continue
        if allocs is not None and allocated == allocs:
            break
        out.append(("alloc", i) if size is None else ("alloc", i, size()))
        live.append(i)
        allocated += 1
    out.extend(("free", i) for i in live)
    return out


def _first_last(value: Any, name: str) -> tuple[int, int]:
    """A (first, last) pair of positive ints."""
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise _args.type_error(name, value, "a (first, last) pair of ints")
    return (
        _args.integer(value[0], f"{name}[0]", 1, 1 << 24),
        _args.integer(value[1], f"{name}[1]", 1, 1 << 24),
    )


# -- LLM training --------------------------------------------------------------------------------


def llm_training(
    model_name: str | Model = "gpt2",
    *,
    steps: int = 6,
    batch: tuple[int, int] = (4, 8),
    seq: tuple[int, int] = (256, 1024),
    dtype_bytes: int = 2,
    seed: int = 0,
) -> list[tuple[str, int, int]]:
    """Training steps of ``model_name`` (a :data:`MODELS` name or a :class:`Model`) whose batch
    and sequence length grow linearly over ``steps`` (with jitter): each step's activations are a
    little larger than the holes the last one left. The events of
    :func:`transformer_training` with the model's dimensions."""
    m = model(model_name)
    return transformer_training(
        layers=m.layers,
        hidden=m.hidden,
        heads=m.heads,
        vocab=m.vocab,
        steps=steps,
        batch=batch,
        seq=seq,
        dtype_bytes=dtype_bytes,
        seed=seed,
    )


# -- KV-cache serving ----------------------------------------------------------------------------


def kv_cache_serving(
    model_name: str | Model = "llama-2-7b",
    *,
    requests: int = 200,
    paged: bool = True,
    block_tokens: int = 16,
    max_batch: int = 32,
    arrival_rate: float = 0.5,
    prompt: tuple[int, int] = (32, 1024),
    output: tuple[int, int] = (16, 512),
    max_new_tokens: int = 512,
    dtype_bytes: int = 2,
    seed: int = 0,
) -> list[tuple[str, int, int]]:
    """An inference server decoding ``requests`` requests with continuous batching.

    Requests arrive as a Poisson process (``arrival_rate`` per decode step), with a prompt and an
    output length drawn log-uniformly from the ``prompt`` and ``output`` ranges (outputs capped
    at ``max_new_tokens``); at most ``max_batch`` decode at once. Per request, the KV cache:
    ``paged`` allocates one block of ``block_tokens`` tokens each time the sequence crosses a
    block boundary (every block the same size), otherwise one contiguous buffer for prompt +
    ``max_new_tokens`` tokens at admission (sizes as varied as the prompts). Prefill allocates
    the prompt's activations; every step allocates and frees the batch's hidden states and
    logits. A request's KV memory is freed when it finishes."""
    m = model(model_name)
    requests = _args.integer(requests, "requests", 1, 1 << 20)
    paged = _args.flag(paged, "paged")
    block_tokens = _args.integer(block_tokens, "block_tokens", 1, 1 << 16)
    max_batch = _args.integer(max_batch, "max_batch", 1, 1 << 16)
    rate = _args.real(arrival_rate, "arrival_rate", 1e-6, 1e6)
    p_lo, p_hi = _pair(prompt, "prompt")
    o_lo, o_hi = _pair(output, "output")
    max_new = _args.integer(max_new_tokens, "max_new_tokens", 1, 1 << 24)
    b = _dtype(dtype_bytes)
    rng = _seed(seed)
    per_token = m.kv_bytes_per_token(b)
    t = _Trace()

    def loguniform(lo: int, hi: int) -> int:
        return min(hi, round(math.exp(rng.uniform(math.log(lo), math.log(hi + 1)))))

    arrivals: list[tuple[int, int]] = []
    arrive_at: list[float] = []
    clock = 0.0
    for _ in range(requests):
        arrive_at.append(clock)
        arrivals.append((loguniform(p_lo, p_hi), min(max_new, loguniform(o_lo, o_hi))))
        clock += rng.expovariate(rate)
    waiting = 0
    running: list[dict[str, Any]] = []
    step = 0
    while waiting < requests or running:
        if not running and arrive_at[waiting] > step:
            step = math.ceil(arrive_at[waiting])  # idle steps make no events: skip to the arrival
        # admit
        while waiting < requests and arrive_at[waiting] <= step and len(running) < max_batch:
            plen, olen = arrivals[waiting]
            waiting += 1
            req: dict[str, Any] = {"tokens": plen, "left": olen, "kv": []}
            if paged:
                req["kv"] = [t.alloc(block_tokens * per_token) for _ in range(-(-plen // block_tokens))]
            else:
                req["kv"] = [t.alloc((plen + max_new) * per_token)]
            acts = [t.alloc(plen * m.hidden * b) for _ in range(3)]  # hidden, qkv scratch, mlp scratch
            logits = t.alloc(m.vocab * 4)  # last position, fp32
            t.free_all([*acts, logits])
            running.append(req)
        if running:
            n = len(running)
            h = t.alloc(n * m.hidden * b)
            scratch = t.alloc(n * m.ffn * b)
            logits = t.alloc(n * m.vocab * 4)
            t.free_all([scratch, h, logits])
            for req in running:
                req["tokens"] += 1
                req["left"] -= 1
                if paged and req["left"] > 0 and (req["tokens"] - 1) % block_tokens == 0:
                    req["kv"].append(t.alloc(block_tokens * per_token))
            for req in [r for r in running if r["left"] <= 0]:
                running.remove(req)
                t.free_all(req["kv"])
        step += 1
    return t.close()


# -- dynamic-shape inference ---------------------------------------------------------------------


def dynamic_shape_inference(
    *,
    batches: int = 40,
    batch: int = 8,
    short_side: tuple[int, int] = (480, 800),
    max_long_side: int = 1333,
    proposals: int = 1000,
    dtype_bytes: int = 2,
    seed: int = 0,
) -> list[tuple[str, int, int]]:
    """A Faster R-CNN-style detector (ResNet-50 backbone, FPN, RPN, RoI heads) serving
    ``batches`` batches of ``batch`` images whose size changes every batch.

    Each batch's images share a padded size: a short side drawn from ``short_side`` (multiples
    of 32), a long side from an aspect ratio of 1-1.75 capped at ``max_long_side``. The backbone
    runs stages of (3, 4, 6, 3) bottleneck blocks at strides 4-32 (each block allocating its
    1x1 / 3x3 / 1x1 outputs and freeing the block's input); stage outputs C2-C5 stay for the FPN,
    whose P2-P6 maps (256 channels) feed the RPN (3 anchors per position) and RoIAlign of
    ``proposals`` boxes per image to 256 x 7 x 7; the box head's two 1024-wide FC layers and
    the class / box outputs (81 classes) follow. Activations are ``dtype_bytes`` wide; the input
    is fp32."""
    batches = _args.integer(batches, "batches", 1, 1 << 20)
    n = _args.integer(batch, "batch", 1, 1 << 12)
    s_lo, s_hi = _pair(short_side, "short_side", 32, 1 << 14)
    max_long = _args.integer(max_long_side, "max_long_side", s_hi, 1 << 15)
    proposals = _args.integer(proposals, "proposals", 1, 1 << 16)
    b = _dtype(dtype_bytes)
    rng = _seed(seed)
    t = _Trace()
    # Parameter counts: conv1, res2-res5 (ResNet-50), FPN, box head fc6 (256x7x7 -> 1024), fc7 + outputs.
    weights = [t.alloc(c * b) for c in (9408, 215808, 1219584, 7098368, 14964736, 3344384, 12845056, 1460000)]
    for _ in range(batches):
        short = rng.randrange(s_lo, s_hi + 1) // 32 * 32 or 32
        long = min(max_long, round(short * rng.uniform(1.0, 1.75))) // 32 * 32 or 32
        hh, ww = (short, long) if rng.random() < 0.5 else (long, short)
        image = t.alloc(n * 3 * hh * ww * 4)

        def fmap(c: int, stride: int, hh: int = hh, ww: int = ww) -> int:
            return n * c * -(-hh // stride) * -(-ww // stride) * b

        stem = t.alloc(fmap(64, 2))
        t.free(image)
        x = t.alloc(fmap(64, 4))  # max pool
        t.free(stem)
        stage_out = []
        for k, (blocks, c) in enumerate(zip((3, 4, 6, 3), (256, 512, 1024, 2048), strict=True)):
            stride = 4 << k
            for _ in range(blocks):
                a = t.alloc(fmap(c // 4, stride))
                bb = t.alloc(fmap(c // 4, stride))
                t.free(a)
                y = t.alloc(fmap(c, stride))
                t.free(bb)
                if x not in stage_out:
                    t.free(x)
                x = y
            stage_out.append(x)
        laterals = [t.alloc(fmap(256, 4 << k)) for k in range(4)]
        p = [t.alloc(fmap(256, 4 << k)) for k in range(4)] + [t.alloc(fmap(256, 64))]
        t.free_all(laterals + stage_out)
        rpn = []
        for k in range(5):
            head = t.alloc(fmap(256, 4 << k))
            rpn += [t.alloc(fmap(3, 4 << k)), t.alloc(fmap(12, 4 << k))]
            t.free(head)
        anchors = sum(3 * -(-hh // (4 << k)) * -(-ww // (4 << k)) for k in range(5))
        boxes = t.alloc(n * anchors * 5 * 4)
        t.free_all(rpn)
        keep = t.alloc(n * proposals * 5 * 4)
        t.free(boxes)
        rois = t.alloc(n * proposals * 256 * 7 * 7 * b)
        t.free_all(p)
        fc6 = t.alloc(n * proposals * 1024 * b)
        t.free(rois)
        fc7 = t.alloc(n * proposals * 1024 * b)
        t.free(fc6)
        cls, box = t.alloc(n * proposals * 81 * 4), t.alloc(n * proposals * 81 * 4 * 4)
        t.free_all([fc7, keep])
        dets = t.alloc(n * 100 * 6 * 4)
        t.free_all([cls, box, dets])
    t.free_all(weights)
    return t.close()


# -- mixture of experts --------------------------------------------------------------------------


def moe_routing(
    model_name: str | Model = "mixtral-8x7b",
    *,
    steps: int = 4,
    layers: int | None = 4,
    tokens: tuple[int, int] = (2048, 8192),
    skew: float = 1.2,
    dtype_bytes: int = 2,
    seed: int = 0,
) -> list[tuple[str, int, int]]:
    """Forward passes of a mixture-of-experts model (``model_name``'s experts and top-k), the
    first ``layers`` of its layers (None: all), over batches of a token count drawn from
    ``tokens`` each step. Each layer's router sends every token to ``top_k`` experts with
    probabilities drawn each step from a Zipf-like law of exponent ``skew`` over a random order
    of the experts (popular experts change from step to step); each expert with work gathers its
    tokens, runs its gated FFN (gate, up, activation, down) and scatters back. The expert
    weights are not in the trace (they live in a static pool)."""
    m = model(model_name)
    if m.experts < 2:
        raise invalid_param(f"model {m.name!r} has no experts; use one of the MoE models or a Model with experts >= 2")
    steps = _args.integer(steps, "steps", 1, 1 << 16)
    n_layers = m.layers if layers is None else _args.integer(layers, "layers", 1, m.layers)
    t_lo, t_hi = _pair(tokens, "tokens", 1, 1 << 24)
    skew = _args.real(skew, "skew", 0.0, 10.0)
    b = _dtype(dtype_bytes)
    rng = _seed(seed)
    t = _Trace()
    h, f, e, k = m.hidden, m.ffn, m.experts, m.top_k
    for _ in range(steps):
        n = rng.randrange(t_lo, t_hi + 1)
        x = t.alloc(n * h * b)
        for _ in range(n_layers):
            normed = t.alloc(n * h * b)
            qkv = t.alloc(n * (h + 2 * m.kv_heads * m.head_dim) * b)
            attn = t.alloc(n * h * b)
            t.free_all([qkv, normed])
            x2 = t.alloc(n * h * b)
            t.free_all([attn, x])
            logits = t.alloc(n * e * 4)
            route = t.alloc(n * k * (4 + 8))  # top-k weights (fp32) and indices (int64)
            t.free(logits)
            order = list(range(e))
            rng.shuffle(order)  # order[r] is the expert of popularity rank r this step
            popularity = [0.0] * e
            for r, ex in enumerate(order):
                popularity[ex] = 1.0 / (r + 1) ** skew
            counts = [0] * e
            for ex in rng.choices(range(e), weights=popularity, k=min(n * k, 4096)):
                counts[ex] += 1
            scale = n * k / max(1, sum(counts))
            out = t.alloc(n * h * b)
            for ex in range(e):
                c = round(counts[ex] * scale)
                if not c:
                    continue
                xin = t.alloc(c * h * b)
                gate, up = t.alloc(c * f * b), t.alloc(c * f * b)
                act = t.alloc(c * f * b)
                t.free_all([gate, up])
                y = t.alloc(c * h * b)
                t.free_all([act, xin, y])
            t.free(route)
            x = t.alloc(n * h * b)
            t.free_all([out, x2])
        t.free(x)
    return t.close()


# -- pipeline parallelism ------------------------------------------------------------------------

COMPUTE_STREAM = 0
COMM_STREAM = 1


def pipeline_parallel(
    model_name: str | Model = "gpt2-medium",
    *,
    stages: int = 4,
    stage: int = 1,
    micro_batches: int = 8,
    micro_batch: int = 2,
    seq: int = 1024,
    iterations: int = 2,
    dtype_bytes: int = 2,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """Stage ``stage`` of ``stages`` of a pipeline-parallel training job under the 1F1B schedule:
    ``stages - stage`` warm-up forwards, then one forward and one backward in turn, then the
    remaining backwards, per iteration. Receive and send buffers (``micro_batch x seq x hidden``)
    are allocated on the communication stream (1); the stage's layers (its share of the model's)
    save their activations per micro-batch on the compute stream (0) until that micro-batch's
    backward. Weights, gradients and Adam state persist. ``seed`` jitters each micro-batch's
    sequence length by up to 1/8 (packed variable-length samples)."""
    m = model(model_name)
    stages = _args.integer(stages, "stages", 1, 1 << 10)
    stage = _args.integer(stage, "stage", 0, stages - 1)
    mbs = _args.integer(micro_batches, "micro_batches", 1, 1 << 12)
    mb = _args.integer(micro_batch, "micro_batch", 1, 1 << 12)
    seq = _args.integer(seq, "seq", 8, 1 << 20)
    iterations = _args.integer(iterations, "iterations", 1, 1 << 12)
    b = _dtype(dtype_bytes)
    rng = _seed(seed)
    t = _Trace()
    c, comm = COMPUTE_STREAM, COMM_STREAM
    layers = max(1, m.layers // stages)
    h = m.hidden
    params = layers * (3 * h * h + h * h + 2 * h * m.ffn + 4 * h)
    weights = [t.alloc(params * b, c)]
    adam = [t.alloc(params * 8, c)]  # fp32 m and v
    first, last = stage == 0, stage == stages - 1
    saved: dict[int, list[int]] = {}
    seqs: list[int] = []

    def forward(i: int) -> None:
        bsh = mb * seqs[i] * h * b
        x = t.alloc(bsh, comm) if not first else t.alloc(mb * seqs[i] * 8, c)  # received / token ids
        keep = [x]
        for _ in range(layers):
            keep += [t.alloc(3 * bsh, c), t.alloc(mb * m.heads * seqs[i] * seqs[i] * b, c), t.alloc(bsh, c)]
            keep += [t.alloc(mb * seqs[i] * m.ffn * b, c), t.alloc(bsh, c)]
        if last:
            keep.append(t.alloc(mb * seqs[i] * m.vocab * b, c))  # logits
        else:
            t.free(t.alloc(bsh, comm))  # send buffer
        saved[i] = keep

    def backward(i: int) -> None:
        bsh = mb * seqs[i] * h * b
        g = t.alloc(bsh, comm) if not last else t.alloc(mb * seqs[i] * m.vocab * b, c)
        for _ in range(layers):
            g2 = t.alloc(mb * seqs[i] * m.ffn * b, c)
            g3 = t.alloc(bsh, c)
            t.free_all([g2, g])
            g = g3
        if not first:
            t.free(t.alloc(bsh, comm))  # send buffer
        t.free(g)
        t.free_all(saved.pop(i))

    for _ in range(iterations):
        grads = t.alloc(params * b, c)
        seqs[:] = [seq - rng.randrange(0, seq // 8 + 1) for _ in range(mbs)]
        warm = min(mbs, stages - stage)
        fwd = bwd = 0
        for _ in range(warm):
            forward(fwd)
            fwd += 1
        while bwd < mbs:
            backward(bwd)
            bwd += 1
            if fwd < mbs:
                forward(fwd)
                fwd += 1
        tmp = t.alloc(params * 4, c)  # fp32 update temporary
        t.free_all([tmp, grads])
    t.free_all(adam + weights)
    return t.close()


# -- long-running service ------------------------------------------------------------------------


def long_running_service(
    model_name: str | Model = "gpt2-medium",
    *,
    ticks: int = 2000,
    requests_per_tick: tuple[int, int] = (1, 4),
    cache_entries: int = 20000,
    insert_rate: float = 12.0,
    evict_rate: float = 0.5,
    dtype_bytes: int = 2,
    seed: int = 0,
) -> list[tuple[str, int, int]]:
    """A serving process that runs for ``ticks`` ticks and whose pool grows.

    Each tick serves a few requests (``requests_per_tick``), each allocating and freeing the
    activations of a forward pass over a short batch (1-8 sequences of 16-512 tokens): hidden
    states, attention scratch, FFN scratch and output embeddings. Meanwhile a cache of long-lived
    entries grows: about ``insert_rate`` entries per tick are added (a session's KV prefix of
    16-256 tokens, an embedding vector of ``hidden`` floats, or a tokenizer / routing buffer of
    4-64 KiB) and about ``evict_rate`` evicted at random, until ``cache_entries`` entries are
    live; then the service keeps serving with a full cache. The live-block count climbs to
    ``cache_entries``: the pool an allocator has to search grows with it."""
    m = model(model_name)
    ticks = _args.integer(ticks, "ticks", 1, 1 << 24)
    r_lo, r_hi = _pair(requests_per_tick, "requests_per_tick", 0, 1 << 12)
    cap = _args.integer(cache_entries, "cache_entries", 0, 1 << 22)
    ins = _args.real(insert_rate, "insert_rate", 0.0, 1e4)
    ev = _args.real(evict_rate, "evict_rate", 0.0, 1e4)
    b = _dtype(dtype_bytes)
    rng = _seed(seed)
    t = _Trace()
    per_token = m.kv_bytes_per_token(b)
    cache: list[int] = []
    h = m.hidden
    for _ in range(ticks):
        for _ in range(rng.randint(r_lo, r_hi)):
            n = rng.randint(1, 8) * rng.randint(16, 512)
            x = t.alloc(n * h * b)
            qkv = t.alloc(3 * n * h * b)
            mlp = t.alloc(n * m.ffn * b)
            t.free_all([qkv, mlp])
            out = t.alloc(n * h * 4)
            t.free_all([x, out])
        for _ in range(_poisson(rng, ins) if len(cache) < cap else 0):
            kind = rng.random()
            if kind < 0.4:
                size = rng.randint(16, 256) * per_token // m.layers  # one layer's slice of a session prefix
            elif kind < 0.8:
                size = h * 4
            else:
                size = rng.randint(4, 64) << 10
            cache.append(t.alloc(size))
        for _ in range(min(len(cache), _poisson(rng, ev))):
            j = rng.randrange(len(cache))
            cache[j], cache[-1] = cache[-1], cache[j]
            t.free(cache.pop())
    return t.close()


def _poisson(rng: random.Random, lam: float) -> int:
    """A Poisson(lam) draw (Knuth's method for small lam, a rounded normal above 30)."""
    if lam <= 0:
        return 0
    if lam > 30:
        return max(0, round(rng.gauss(lam, math.sqrt(lam))))
    limit, k, p = math.exp(-lam), 0, 1.0
    while True:
        p *= rng.random()
        if p <= limit:
            return k
        k += 1


#: Every generator by name, with the arguments of its default (demo-sized) trace.
GENERATORS = {
    "llm_training": llm_training,
    "kv_cache_paged": lambda **kw: kv_cache_serving(paged=True, **kw),
    "kv_cache_contiguous": lambda **kw: kv_cache_serving(paged=False, **kw),
    "dynamic_shape_inference": dynamic_shape_inference,
    "moe_routing": moe_routing,
    "pipeline_parallel": pipeline_parallel,
    "long_running_service": long_running_service,
}


def generate(name: str, **kwargs: Any) -> list[Any]:
    """The trace of the generator called ``name`` (a key of :data:`GENERATORS`)."""
    return GENERATORS[_args.choice(name, "name", GENERATORS)](**kwargs)


# -- measuring a trace on an allocator family ----------------------------------------------------


@dataclass
class Timeline:
    """What :func:`measure` saw, one entry per window of events: the window's last event index,
    its peak allocated and reserved bytes (the allocator's own counters), the live blocks at its
    end, and the nanoseconds per allocation (batch path, timed around each native call; the
    window's median over its calls, so that a preempted call on a busy machine does not set
    the figure)."""

    allocator: str
    events: int
    end: list[int] = field(default_factory=list)
    allocated: list[int] = field(default_factory=list)
    reserved: list[int] = field(default_factory=list)
    live_blocks: list[int] = field(default_factory=list)
    ns_per_alloc: list[float] = field(default_factory=list)
    ooms: int = 0
    peak_live: int = 0

    @property
    def peak_allocated(self) -> int:
        return max(self.allocated, default=0)

    @property
    def peak_reserved(self) -> int:
        return max(self.reserved, default=0)

    def as_dict(self) -> dict[str, Any]:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        d.update(peak_allocated=self.peak_allocated, peak_reserved=self.peak_reserved)
        return d


def _parsed(events: Sequence[Any]) -> list[tuple[bool, Any, int, int]]:
    """(is_alloc, id, size, stream) of each event :func:`npumem.formats.normalize` keeps, checked
    by it; a free is on its allocation's stream."""
    events = list(events)
    triples, where = formats._normalize(events)
    streams: dict[Any, int] = {}
    out = []
    for (is_alloc, key, size), k in zip(triples, where, strict=True):
        if is_alloc:
            ev = events[k]
            s = ev.get("stream", 0) if isinstance(ev, Mapping) else 0
            streams[key] = _args.integer(s, "stream", 0, 1 << 16)
        out.append((is_alloc, key, size, streams[key] if is_alloc else streams.pop(key)))
    return out


def _columns(trace: formats.Trace) -> list[tuple[bool, Any, int, int]]:
    """(is_alloc, id, size, stream) of each event of ``trace``."""
    streams = trace.streams.tolist() if trace.streams is not None else [0] * len(trace)
    cols = (trace.is_alloc.astype(bool).tolist(), trace.ids.tolist(), trace.sizes.tolist(), streams)
    return list(zip(*cols, strict=True))


def measure(
    events: Sequence[Any] | formats.Trace,
    allocator: str = "npumem",
    *,
    capacity: int | str | None = None,
    alloc_conf: str | None = None,
    windows: int = 100,
) -> Timeline:
    """Replays ``events`` (a list of events or a :class:`npumem.formats.Trace`) on a new device
    with ``allocator`` and samples ``windows`` windows.

    Runs of consecutive allocations (or frees) on one stream go to the device in one
    ``malloc_many`` (``free_many``) call, timed; an out-of-memory batch is retried one block at a
    time, and what still fails is counted and skipped (its free too). ``capacity`` defaults to
    twice the trace's peak live bytes plus 1 GiB (at most 1 TiB). The device is left empty."""
    import numpy as np

    from .device import Device

    if isinstance(events, formats.Trace):
        evs = _columns(events)
    elif isinstance(events, (str, bytes)) or not isinstance(events, Sequence):
        raise _args.type_error("events", events, "a list of events")
    else:
        evs = _parsed(events)
    windows = _args.integer(windows, "windows", 1, 1 << 20)
    peak = formats.Trace._of([e[:3] for e in evs]).peak_live()
    if capacity is None:
        capacity = min(1 << 40, -(-(2 * peak + (1 << 30)) // (2 << 20)) * (2 << 20))
    dev = Device(capacity, allocator=allocator, alloc_conf=alloc_conf)
    streams: dict[int, int | None] = {0: None}
    for *_, s in evs:
        if s not in streams:
            streams[s] = dev.create_stream()
    tl = Timeline(allocator=dev.allocator, events=len(evs), peak_live=peak)
    ptrs: dict[Any, int] = {}
    per = max(1, -(-len(evs) // windows))
    live_blocks = 0
    for w0 in range(0, len(evs), per):
        window = evs[w0 : w0 + per]
        dev.reset_peak_memory_stats()
        costs: list[float] = []  # ns per allocation of each malloc_many call
        i = 0
        while i < len(window):
            is_alloc, _, _, s = window[i]
            j = i
            while j < len(window) and window[j][0] == is_alloc and window[j][3] == s:
                j += 1
            run = window[i:j]
            if is_alloc:
                sizes = np.fromiter((e[2] for e in run), dtype=np.uint64, count=len(run))
                t0 = time.perf_counter_ns()
                try:
                    got = dev.malloc_many(sizes, None, streams[s])
                except OutOfMemoryError:
                    got = None
                costs.append((time.perf_counter_ns() - t0) / len(run))
                if got is None:
                    for e in run:
                        try:
                            ptrs[e[1]] = dev.malloc(e[2], None, streams[s])
                        except OutOfMemoryError:
                            tl.ooms += 1
                else:
                    ptrs.update(zip((e[1] for e in run), got.tolist(), strict=True))
            else:
                gone = [ptrs.pop(e[1]) for e in run if e[1] in ptrs]
                if gone:
                    dev.free_many(gone)
            i = j
        live_blocks = len(ptrs)
        st = dev.memory_stats()
        tl.end.append(w0 + len(window))
        tl.allocated.append(st["allocated_bytes.all.peak"])
        tl.reserved.append(st["reserved_bytes.all.peak"])
        tl.live_blocks.append(live_blocks)
        tl.ns_per_alloc.append(statistics.median(costs) if costs else math.nan)
    if ptrs:
        dev.free_many(list(ptrs.values()))
    return tl


def plot_timelines(timelines: Sequence[Timeline], path: str, title: str = "") -> None:
    """Allocated (solid) and reserved (dashed) bytes over the trace, one colour per family, as
    a PNG at ``path``. Needs matplotlib (``MissingDependencyError`` with the install hint)."""
    from ._optional import require

    if isinstance(timelines, (str, bytes)) or not isinstance(timelines, Sequence):
        raise _args.type_error("timelines", timelines, "a list of Timeline (from workloads.timeline)")
    if not timelines:
        raise invalid_param("timelines is empty; give at least one Timeline to plot")
    for i, tl in enumerate(timelines):
        if not isinstance(tl, Timeline):
            raise _args.type_error(f"timelines[{i}]", tl, "a Timeline (from workloads.timeline)")
    path = _files.path_arg(path)
    require("matplotlib", "the timeline plot")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4.5))
    for k, tl in enumerate(timelines):
        colour = f"C{k}"
        ax.plot(tl.end, [a / 2**30 for a in tl.allocated], color=colour, label=f"{tl.allocator} allocated")
        ax.plot(tl.end, [r / 2**30 for r in tl.reserved], color=colour, ls="--", label=f"{tl.allocator} reserved")
    ax.set_xlabel("event")
    ax.set_ylabel("GiB (peak per window)")
    ax.set_title(title or "allocated vs reserved")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
