"""Real host memory, pooled: numpy arrays and buffers that stop paying page faults.

A :class:`HostPool` reserves one region of address space (pages are committed when first
touched; transparent huge pages where the kernel allows, or 1 GiB hugetlb pages on request) and
hands out blocks in size classes. A freed block keeps its pages, so the next array of that size
class reuses memory that is already mapped: no page faults, no kernel zeroing. Arrays from
:meth:`HostPool.empty` / :meth:`HostPool.zeros` view a block and give it back when they are
garbage-collected. :meth:`HostPool.numpy_allocator` goes further: inside the ``with`` block,
NumPy's own ``np.empty`` / ``np.zeros`` / ufunc outputs are served by the pool (a NEP 49
``PyDataMem_Handler``, which also owns the pool's own arrays: ``handler_of`` names it for both).

Zeroed memory (``zeros``, and ``np.zeros`` under the handler) from 512 KiB is cleared page by
page as is cheapest: pages nobody touched since they were last cleared are handed back to the
kernel (they read as zero, as NumPy's fresh pages do, at the cost of a system call), pages in use
are written with zeros (so using them costs no page fault).

The pool is safe to use from many threads: each thread keeps a small cache of free blocks per
size class and refills it from lock-free shared lists; only carving fresh memory takes a lock.

    >>> import numpy as np
    >>> from npumem.hostpool import HostPool
    >>> pool = HostPool("1GiB")
    >>> a = pool.zeros((256, 1024), dtype=np.float32)
    >>> a.sum(), a.shape, a.flags.writeable
    (np.float32(0.0), (256, 1024), True)
    >>> with pool.numpy_allocator():
    ...     b = np.ones(1 << 20)          # NumPy's own allocation, served by the pool
    >>> HostPool.handler_of(b)
    'npumem_host_pool'
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np

from . import _args, _native
from .errors import invalid_param

#: The name NumPy reports (``np.core.multiarray.get_handler_name``) for pool-served arrays.
HANDLER_NAME: str = _native.HOST_POOL_HANDLER_NAME


class HostPool(_native.HostPool):
    """A pool of real host memory. ``capacity`` (bytes or a size string, default 64 GiB) is
    address space reserved up front, not memory used; ``huge_pages`` is ``"transparent"``
    (default), ``"none"`` or ``"1g"`` (hugetlb pages that the administrator reserved; the whole
    capacity is claimed when the pool is made, so a shortage raises OutOfMemoryError then).

    Native methods: ``empty(shape, dtype=float64, order="C")`` and ``zeros(...)`` (like NumPy's,
    on a pool block), ``buffer(nbytes, zero=False)`` (a writable memoryview), ``block`` (the raw
    block object), ``stats()`` (``capacity`` and ``base`` of the reserved range, ``carved``,
    ``shared_free_blocks``, ``carves``, ``trimmed``, ``huge_pages``), ``flush_thread_cache()``,
    ``churn(nbytes, n)`` (n alloc+free pairs in Rust, for benchmarks). Every block returns to the
    pool when the last array or view of it is collected."""

    def full(self, shape: int | tuple[int, ...], fill_value: Any, dtype: Any = None, order: str = "C") -> np.ndarray:
        """Like ``np.full`` (a scalar ``fill_value``, checked against the dtype before a block is
        taken)."""
        dt = np.asarray(fill_value).dtype if dtype is None else dtype
        try:
            probe = np.empty((), dtype=dt)
        except TypeError:
            probe = None  # not a dtype: array() says so, before it takes a block
        if probe is not None:
            try:
                probe.fill(fill_value)
            except (TypeError, ValueError, OverflowError) as e:
                raise invalid_param(
                    f"fill_value {_args.show(fill_value)} cannot be stored as {probe.dtype}: {e}"
                ) from None
        a = self.array(shape, dt, order, False)
        a.fill(fill_value)
        return a

    @contextlib.contextmanager
    def numpy_allocator(self) -> Iterator[HostPool]:
        """Serves NumPy's own data allocations from the pool inside the ``with`` block (in the
        current thread / context: NumPy keeps the handler in a context variable). Arrays made
        inside stay valid after it and free into the pool when collected."""
        previous = self.set_numpy_handler()
        try:
            yield self
        finally:
            _native.HostPool.restore_numpy_handler(previous)

    @staticmethod
    def handler_of(array: np.ndarray | None = None) -> str:
        """The NumPy allocator that owns ``array``'s data (or the current one): ``HANDLER_NAME``
        for pool memory."""
        if array is not None and not isinstance(array, np.ndarray):
            raise _args.type_error("array", array, "a numpy array or None")
        try:
            from numpy._core.multiarray import get_handler_name
        except ImportError:  # NumPy 1.x
            from numpy.core.multiarray import get_handler_name  # type: ignore[no-redef]
        base = array
        while isinstance(base, np.ndarray) and isinstance(base.base, np.ndarray):
            base = base.base
        return get_handler_name(base) if base is not None else get_handler_name()

    def trim(self, min_block: int = 1 << 20) -> int:
        """Gives the pages of free blocks of at least ``min_block`` bytes back to the system
        (after the calling thread's cache is flushed); returns the bytes released."""
        self.flush_thread_cache()
        return super().trim(min_block)


__all__ = ["HANDLER_NAME", "HostPool"]
