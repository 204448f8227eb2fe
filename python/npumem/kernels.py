"""Measurement kernels over numpy arrays (Rust, the interpreter released while they run), for
timing memory behaviour on real pages, e.g. a zero-copy view of host-backend device memory
mapped with 4 KiB or 2 MiB pages (``benches/bench_pagesize.py``).

- ``chase(next, steps, start=0) -> (end, ns_per_step)``: a dependent-load pointer chase
  ``i = next[i]`` over a 1-D uint64 array whose every value is an index into it.
- ``gemm_tiled(a, b, c, tile=64) -> ns``: ``c += a @ b`` over C-contiguous float32 matrices in
  square tiles (m-n-k tile order, i-k-j inside a tile, no packing), so the traversal's page
  footprint is the matrices' own.

Every argument is checked before the first access: ``TypeError`` for something that is not a
numpy array of the right dtype and dimensions, :class:`npumem.InvalidParamError` naming the
argument and the value otherwise (non-contiguous arrays, an index out of bounds, shapes that do
not chain, ``c`` sharing memory with ``a`` or ``b``, runs past the bounds).
"""

from __future__ import annotations

from ._native import chase, gemm_tiled

__all__ = ["chase", "gemm_tiled"]
