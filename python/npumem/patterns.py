"""Access-pattern generators: numpy arrays of byte addresses for the TLB model.

Every generator is vectorised and deterministic for a given ``seed``. Addresses are absolute
device addresses (pass the pointer of an allocation as ``base``).

Arguments are checked before anything is built: sizes and counts are ints in range (a footprint
holds at least one access of the pattern), every address stays below 2**64 (none wraps around),
and no call builds more than 2**28 addresses unless a ``limit`` caps it (TypeError for a wrong
type, InvalidParamError naming the argument otherwise).
"""

from __future__ import annotations

import math

import numpy as np

from . import _args
from .errors import invalid_param

LINE = 64


def _base(base: int, extent: int, name: str = "base") -> int:
    base = _args.integer(base, name)
    _args.address_range(base, extent, name)
    return base


def _seed(seed: int) -> int:
    return _args.integer(seed, "seed", 0, _args.U64_MAX)


def _count(count: int, name: str = "count") -> int:
    return _args.integer(count, name, 0, _args.MAX_ELEMENTS)


def _limit(limit: int | None) -> int | None:
    return _args.optional_integer(limit, "limit", 0, _args.MAX_ELEMENTS)


def sequential(base: int, footprint: int, step: int = LINE) -> np.ndarray:
    """Every ``step`` bytes over ``[base, base + footprint)``."""
    footprint = _args.size(footprint, "footprint")
    step = _args.size(step, "step")
    base = _base(base, footprint)
    _args.count_limit(-(-footprint // step), "footprint / step", "; use a larger step")
    return np.arange(base, base + footprint, step, dtype=np.uint64)


def strided(base: int, footprint: int, stride: int, count: int) -> np.ndarray:
    """``count`` accesses ``stride`` bytes apart, wrapping inside the footprint."""
    footprint = _args.size(footprint, "footprint")
    stride = _args.integer(stride, "stride")
    count = _count(count)
    base = _base(base, footprint)
    stride %= footprint  # the same addresses
    if count and (count - 1) * stride > _args.U64_MAX:  # the uint64 products would wrap: exact ints
        return np.array([base + i * stride % footprint for i in range(count)], dtype=np.uint64)
    offs = (np.arange(count, dtype=np.uint64) * np.uint64(stride)) % np.uint64(footprint)
    return np.uint64(base) + offs


def uniform(base: int, footprint: int, count: int, seed: int = 0, align: int = LINE) -> np.ndarray:
    """``count`` uniformly random ``align``-aligned addresses in the footprint (GUPS-like)."""
    footprint = _args.size(footprint, "footprint")
    count = _count(count)
    seed = _seed(seed)
    align = _args.size(align, "align", 1, footprint)
    base = _base(base, footprint)
    rng = np.random.default_rng(seed)
    slots = rng.integers(0, footprint // align, count, dtype=np.uint64)
    return np.uint64(base) + slots * np.uint64(align)


def pointer_chase(base: int, footprint: int, count: int, page: int = 4096, seed: int = 0) -> np.ndarray:
    """A random cyclic walk touching one line per ``page``-sized block (as test-tlb does), so the
    model can be compared with host pointer-chase measurements. ``page`` is a power of two of
    at least a line (64 B) and the footprint holds at least one page."""
    page = _args.size(page, "page", LINE)
    if page & (page - 1):
        raise invalid_param(f"page {page} must be a power of two of at least {LINE} bytes")
    footprint = _args.size(footprint, "footprint", page)
    count = _count(count)
    seed = _seed(seed)
    base = _base(base, footprint)
    _args.count_limit(footprint // page, "footprint / page")
    rng = np.random.default_rng(seed)
    pages = footprint // page
    order = rng.permutation(pages).astype(np.uint64)
    lines = rng.integers(0, page // LINE, pages, dtype=np.uint64) * np.uint64(LINE)
    visit = order[np.arange(count) % pages]
    return np.uint64(base) + visit * np.uint64(page) + lines[visit]


def gemm(
    a: int,
    b: int,
    c: int,
    m: int,
    n: int,
    k: int,
    *,
    elem: int = 2,
    tile: tuple[int, int, int] = (64, 64, 64),
    order: str = "mnk",
    limit: int | None = None,
) -> np.ndarray:
    """C[m,n] += A[m,k] B[k,n] in tile order over row-major matrices at ``a``, ``b``, ``c``: for each
    (tm, tn, tk) tile in the given loop ``order`` (a permutation of "mnk"), one access per cache
    line of the A tile, the B tile and the C tile. ``limit`` stops after that many addresses
    (large GEMMs emit billions; without one, a GEMM of more than 2**28 accesses is refused)."""
    if not isinstance(order, str):
        raise _args.type_error("order", order, "a str, a permutation of 'mnk'")
    if sorted(order) != ["k", "m", "n"]:
        raise invalid_param(f"order {order!r} must be a permutation of 'mnk'")
    m, n, k = (_args.integer(v, name, 1, 1 << 32) for v, name in ((m, "m"), (n, "n"), (k, "k")))
    elem = _args.integer(elem, "elem", 1, 1 << 10)
    if not isinstance(tile, (tuple, list)) or len(tile) != 3:
        raise _args.type_error("tile", tile, "a (tm, tn, tk) triple of ints")
    tile = tuple(_args.integer(t, f"tile[{i}]", 1, 1 << 32) for i, t in enumerate(tile))
    limit = _limit(limit)
    for ptr, name, rows, cols in ((a, "a", m, k), (b, "b", k, n), (c, "c", m, n)):
        _base(ptr, rows * cols * elem + LINE, name)
    if limit is None:
        tiles = math.prod(-(-d // t) for d, t in zip((m, n, k), tile, strict=True))
        rows_cols = ((min(tile[0], m), min(tile[2], k)), (min(tile[2], k), min(tile[1], n)))
        rows_cols += ((min(tile[0], m), min(tile[1], n)),)
        per_tile = sum(r * -(-(w * elem) // LINE) for r, w in rows_cols)
        _args.count_limit(tiles * per_tile, "gemm", "; pass limit=")
    tm, tn, tk = tile
    ranges = {"m": range(0, m, tm), "n": range(0, n, tn), "k": range(0, k, tk)}
    out: list[np.ndarray] = []
    emitted = 0

    def tile_lines(base: int, row0: int, col0: int, rows: int, cols: int, ld: int) -> np.ndarray:
        r = np.arange(row0, min(row0 + rows, 1 << 62), dtype=np.uint64)
        start = np.uint64(base) + (r * np.uint64(ld) + np.uint64(col0)) * np.uint64(elem)
        per_row = max(1, (cols * elem + LINE - 1) // LINE)
        return (start[:, None] + np.arange(per_row, dtype=np.uint64)[None, :] * np.uint64(LINE)).reshape(-1)

    for i in ranges[order[0]]:
        for j in ranges[order[1]]:
            for q in ranges[order[2]]:
                idx = dict(zip(order, (i, j, q), strict=True))
                mi, ni, ki = idx["m"], idx["n"], idx["k"]
                rm, rn, rk = min(tm, m - mi), min(tn, n - ni), min(tk, k - ki)
                for part in (
                    tile_lines(a, mi, ki, rm, rk, k),
                    tile_lines(b, ki, ni, rk, rn, n),
                    tile_lines(c, mi, ni, rm, rn, n),
                ):
                    out.append(part)
                    emitted += len(part)
                if limit is not None and emitted >= limit:
                    return np.concatenate(out)[:limit]
    return np.concatenate(out)


def gather(base: int, rows: int, row_bytes: int, count: int, zipf: float | None = None, seed: int = 0) -> np.ndarray:
    """Embedding / KV-cache gathers: ``count`` rows chosen uniformly or Zipf(``zipf``)-distributed
    (popular rows first), each read line by line. ``zipf`` is the exponent, above 1."""
    rows = _args.integer(rows, "rows", 1, _args.U64_MAX)
    row_bytes = _args.size(row_bytes, "row_bytes")
    count = _count(count)
    seed = _seed(seed)
    if zipf is not None:
        zipf = _args.real(zipf, "zipf", 1.0, 1e6)
        if zipf == 1.0:
            raise invalid_param("zipf must be above 1 (the Zipf exponent), got 1.0")
    base = _base(base, rows * row_bytes)
    _args.count_limit(count * max(1, row_bytes // LINE), "count x lines per row")
    rng = np.random.default_rng(seed)
    if zipf is None:
        idx = rng.integers(0, rows, count, dtype=np.uint64)
    else:
        idx = (rng.zipf(zipf, count).astype(np.uint64) - np.uint64(1)) % np.uint64(rows)
    per_row = max(1, row_bytes // LINE)
    starts = np.uint64(base) + idx * np.uint64(row_bytes)
    return (starts[:, None] + np.arange(per_row, dtype=np.uint64)[None, :] * np.uint64(LINE)).reshape(-1)


def interleave(*streams: np.ndarray, chunk: int = 1) -> np.ndarray:
    """Round-robin mix of several address streams (``chunk`` accesses from each in turn), as
    concurrent streams or cores would issue them; longer streams continue alone at the end."""
    chunk = _args.integer(chunk, "chunk", 1, _args.MAX_ELEMENTS)
    streams = tuple(_args.uint64_array(s, f"streams[{i}]") for i, s in enumerate(streams))
    _args.count_limit(sum(len(s) for s in streams), "interleave")
    if not any(len(s) for s in streams):
        return np.empty(0, dtype=np.uint64)
    parts = [np.array_split(s, max(1, -(-len(s) // chunk))) for s in streams]
    out = []
    for i in range(max(len(p) for p in parts)):
        out.extend(p[i] for p in parts if i < len(p))
    return np.concatenate(out).astype(np.uint64)


def conv_nc1hwc0(
    base: int,
    n: int,
    c1: int,
    h: int,
    w: int,
    *,
    c0: int = 16,
    elem: int = 2,
    kernel: int = 3,
    limit: int | None = None,
) -> np.ndarray:
    """A direct convolution's input reads over an activation tensor in Ascend's NC1HWC0 layout
    (channels split into C1 groups of C0, the C0 values of a pixel contiguous): for each output
    pixel (n, c1, y, x), the ``kernel`` x ``kernel`` window of C0-vectors around it, one address
    per vector (``c0 * elem`` bytes, 32 by default: two per 64-byte line)."""
    n, c1, h, w = (_args.integer(v, name, 1, 1 << 20) for v, name in ((n, "n"), (c1, "c1"), (h, "h"), (w, "w")))
    c0 = _args.integer(c0, "c0", 1, 1 << 10)
    elem = _args.integer(elem, "elem", 1, 1 << 10)
    kernel = _args.integer(kernel, "kernel", 1, 1 << 10)
    limit = _limit(limit)
    vec = c0 * elem
    outs_h, outs_w = h - kernel + 1, w - kernel + 1
    if outs_h <= 0 or outs_w <= 0:
        raise invalid_param(f"the image ({h} x {w}) is smaller than the kernel ({kernel} x {kernel})")
    base = _base(base, n * c1 * h * w * vec)
    if limit is None:
        _args.count_limit(n * c1 * outs_h * outs_w * kernel * kernel, "conv_nc1hwc0", "; pass limit=")
    dy, dx = np.meshgrid(np.arange(kernel), np.arange(kernel), indexing="ij")
    window = (dy * w + dx).reshape(-1).astype(np.uint64)  # pixel offsets of the window
    out: list[np.ndarray] = []
    emitted = 0
    for ni in range(n):
        for ci in range(c1):
            plane = np.uint64(base) + np.uint64(((ni * c1 + ci) * h * w) * vec)
            ys, xs = np.meshgrid(np.arange(outs_h), np.arange(outs_w), indexing="ij")
            anchors = (ys * w + xs).reshape(-1).astype(np.uint64)
            pixels = anchors[:, None] + window[None, :]
            part = (plane + pixels * np.uint64(vec)).reshape(-1)
            out.append(part)
            emitted += len(part)
            if limit is not None and emitted >= limit:
                return np.concatenate(out)[:limit]
    return np.concatenate(out)


def gemm_fractal(
    a: int, b: int, c: int, m: int, n: int, k: int, *, elem: int = 2, frac: int = 16, limit: int | None = None
) -> np.ndarray:
    """GEMM over matrices stored in ``frac`` x ``frac`` fractals (FRACTAL_NZ-like: each fractal's
    elements contiguous, fractals in column-major order of blocks), read fractal by fractal in
    m-n-k order: one address per cache line of each A, B and C fractal. ``m``, ``n`` and ``k``
    are at least ``frac``."""
    frac = _args.integer(frac, "frac", 1, 1 << 10)
    elem = _args.integer(elem, "elem", 1, 1 << 10)
    m, n, k = (_args.integer(v, name, frac, 1 << 32) for v, name in ((m, "m"), (n, "n"), (k, "k")))
    limit = _limit(limit)
    for ptr, name, rows, cols in ((a, "a", m, k), (b, "b", k, n), (c, "c", m, n)):
        _base(ptr, rows * cols * elem + LINE, name)
    if limit is None:
        lines = -(-(frac * frac * elem) // LINE)
        _args.count_limit((m // frac) * (n // frac) * (2 * (k // frac) + 1) * lines, "gemm_fractal", "; pass limit=")
    fbytes = frac * frac * elem
    lines = np.arange(0, fbytes, LINE, dtype=np.uint64)
    mb, nb, kb = m // frac, n // frac, k // frac
    out: list[np.ndarray] = []
    emitted = 0
    for i in range(mb):
        for j in range(nb):
            ks = np.arange(kb, dtype=np.uint64)
            a_f = np.uint64(a) + (ks * np.uint64(mb) + np.uint64(i)) * np.uint64(fbytes)
            b_f = np.uint64(b) + (np.uint64(j) * np.uint64(kb) + ks) * np.uint64(fbytes)
            part = np.concatenate(
                [
                    (a_f[:, None] + lines[None, :]).reshape(-1),
                    (b_f[:, None] + lines[None, :]).reshape(-1),
                    np.uint64(c) + np.uint64((j * mb + i) * fbytes) + lines,
                ]
            )
            out.append(part)
            emitted += len(part)
            if limit is not None and emitted >= limit:
                return np.concatenate(out)[:limit]
    return np.concatenate(out)
