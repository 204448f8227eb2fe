"""Access-pattern generators: numpy arrays of byte addresses for the TLB model.

Every generator is vectorised and deterministic for a given ``seed``. Addresses are absolute
device addresses (pass the pointer of an allocation as ``base``).
"""

from __future__ import annotations

import numpy as np

LINE = 64


def sequential(base: int, footprint: int, step: int = LINE) -> np.ndarray:
    """Every ``step`` bytes over ``[base, base + footprint)``."""
    return np.arange(base, base + footprint, step, dtype=np.uint64)


def strided(base: int, footprint: int, stride: int, count: int) -> np.ndarray:
    """``count`` accesses ``stride`` bytes apart, wrapping inside the footprint."""
    offs = (np.arange(count, dtype=np.uint64) * np.uint64(stride)) % np.uint64(footprint)
    return np.uint64(base) + offs


def uniform(base: int, footprint: int, count: int, seed: int = 0, align: int = LINE) -> np.ndarray:
    """``count`` uniformly random ``align``-aligned addresses in the footprint (GUPS-like)."""
    rng = np.random.default_rng(seed)
    slots = rng.integers(0, footprint // align, count, dtype=np.uint64)
    return np.uint64(base) + slots * np.uint64(align)


def pointer_chase(base: int, footprint: int, count: int, page: int = 4096, seed: int = 0) -> np.ndarray:
    """A random cyclic walk touching one line per ``page``-sized block (as test-tlb does), so the
    model can be compared with host pointer-chase measurements."""
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
    (large GEMMs emit billions)."""
    if sorted(order) != ["k", "m", "n"]:
        raise ValueError("order must be a permutation of 'mnk'")
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
    (popular rows first), each read line by line."""
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
    if not streams:
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
    vec = c0 * elem
    outs_h, outs_w = h - kernel + 1, w - kernel + 1
    if outs_h <= 0 or outs_w <= 0:
        raise ValueError("the image is smaller than the kernel")
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
    m-n-k order: one address per cache line of each A, B and C fractal."""
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
