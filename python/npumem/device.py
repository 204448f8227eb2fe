"""The :class:`Device`: an Ascend-style NPU's memory, simulated by default."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from . import _args, _native
from .enums import Policy
from .errors import Finding, InvalidParamError, invalid_param
from .units import fmt

#: What write/read_into take without conversion.
_BYTES_LIKE = (bytes, bytearray, memoryview)


def _exported(buffer: Any) -> memoryview:
    """A flat byte view of any object that exports the buffer protocol (a ctypes array or
    scalar, an array.array, an mmap, a numpy scalar, ...): the memoryview fills in the shape and
    strides that some exporters (ctypes) leave out for contiguous memory."""
    try:
        view = memoryview(buffer)
    except TypeError:
        raise _args.type_error(
            "buffer", buffer, "a bytes-like object (bytes, bytearray, memoryview, numpy array, ctypes array)"
        ) from None
    if not view.c_contiguous:
        raise invalid_param("the buffer is not C-contiguous; pass numpy.ascontiguousarray(x)")
    return view.cast("B") if view.ndim != 1 or view.format != "B" else view


def _bytes_of(array: Any) -> np.ndarray:
    """A flat uint8 view of a numpy array or scalar (a contiguous copy where the layout needs one)."""
    array = np.asarray(array)
    if array.dtype.hasobject:
        raise invalid_param("the array holds Python object pointers, not data; convert it to a numeric dtype first")
    return np.ascontiguousarray(array).reshape(-1).view(np.uint8)


#: NumPy's scalar types and their dtypes, for `to_numpy`'s quick path (no object dtypes).
_INTS = (np.uint8, np.int8, np.uint16, np.int16, np.uint32, np.int32, np.uint64, np.int64)
_DTYPES = {t: np.dtype(t) for t in (*_INTS, np.float16, np.float32, np.float64, np.complex64, np.complex128, np.bool_)}


class Device(_native.Device):
    """A device with AscendCL memory semantics.

    ``Device(capacity="32GiB", *, normal_page="4KiB", giant_frames=0, backend="sim",
    allocator="npumem", alloc_conf=None)``.

    ``allocator`` picks the layer between ``malloc`` and the driver: ``"npumem"`` (the default:
    a VMM pool that maps 2 MiB pages on demand and stitches idle pages into new ranges),
    ``"pytorch"`` and ``"torch_npu"`` (those caching allocators' published rules), or
    ``"direct"`` (no cache: every malloc maps fresh frames, as bare ``aclrtMalloc``).
    ``alloc_conf`` tunes it in the ``PYTORCH_NPU_ALLOC_CONF`` grammar
    (``"max_split_size_mb:128,garbage_collection_threshold:0.6"``).

    ``backend`` is where the memory is: ``"sim"`` (the simulated device), ``"host"`` (real host
    memory), ``"acl"`` (an Ascend NPU through AscendCL, ``libascendcl.so`` from
    ``NPUMEM_ACL_LIB``, ``$ASCEND_HOME_PATH/lib64`` or the loader path) or ``"cuda"`` (a GPU
    through the CUDA driver, ``libcuda.so.1`` from ``NPUMEM_CUDA_LIB`` or the loader path); on
    the last two, streams and events are the runtime's own, and ``device_id`` picks the runtime's
    device (``aclrtSetDevice``, ``cuDeviceGet``; 0 by default, the only one on the others).

    Pointers are ints in the device window (16-24 TiB); ``malloc_host`` returns real, 64-byte
    aligned host memory. Errors are :class:`npumem.errors.AclError` subclasses carrying the
    AscendCL ``code``.
    """

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        _native._bind_methods(cls)

    def write(self, ptr: int, buffer: Any, stream: int | None = None) -> None:
        """Writes the bytes of ``buffer`` (bytes-like, or a numpy array or scalar of any layout) at
        ``ptr``; with ``stream``, queued on it and completed before returning (pageable memory)."""
        if isinstance(buffer, (np.ndarray, np.generic)):
            buffer = _bytes_of(buffer)
        elif not isinstance(buffer, _BYTES_LIKE):
            buffer = _exported(buffer)
        super().write(ptr, buffer, stream)

    def read_into(self, ptr: int, buffer: Any, stream: int | None = None) -> None:
        """Fills ``buffer`` (a writable bytes-like object or C-contiguous numpy array) from ``ptr``;
        with ``stream``, after the stream's queued work."""
        if isinstance(buffer, np.ndarray):
            if buffer.dtype.hasobject:
                raise invalid_param("cannot read raw bytes into an array of Python objects; use a numeric dtype")
            if not buffer.flags.c_contiguous:
                raise invalid_param("the array is not C-contiguous; read into numpy.empty_like(x) and copy")
            buffer = buffer.reshape(-1).view(np.uint8)
        elif not isinstance(buffer, (bytearray, memoryview)):
            buffer = _exported(buffer)
        super().read_into(ptr, buffer, stream)

    @functools.cached_property
    def _real_memory(self) -> bool:
        """Whether device pointers are this process's memory (any backend but the simulator)."""
        return self.backend != "sim"

    def to_numpy(
        self,
        ptr: int,
        shape: int | tuple[int, ...],
        dtype: Any = np.uint8,
        stream: int | None = None,
        *,
        copy: bool = True,
    ) -> np.ndarray:
        """The bytes at ``ptr`` as an array of ``shape`` and ``dtype``.

        By default a copy (after ``stream``'s queued work when given). With ``copy=False``
        (``backend="host"`` only) the array *is* the device memory: no copy, writes land in the
        allocation, and the allocation cannot be freed while the array or any view of it lives
        (``free`` raises ``MemoryFreeError``); synchronise the streams that write it first — the
        sanitizer does not see accesses made through the array. ``shape`` and ``dtype`` are
        checked against the allocation before anything is made."""
        if type(shape) is int and 0 <= shape <= _args.U64_MAX:  # the common case, checked quickly
            dims: tuple[int, ...] = (shape,)
        else:
            dims = (shape,) if _args.is_int(shape) else shape
            if not isinstance(dims, (tuple, list)):
                raise _args.type_error("shape", shape, "an int or a tuple of ints")
            dims = tuple(_args.integer(d, f"shape[{i}]", 0, _args.U64_MAX) for i, d in enumerate(dims))
        dt = _DTYPES.get(dtype) if isinstance(dtype, type) else None
        if dt is None:
            try:
                dt = np.dtype(dtype)
            except TypeError as e:
                raise TypeError(f"dtype {_args.show(dtype)} is not a NumPy dtype ({e})") from None
            if dt.hasobject:
                raise invalid_param("dtype holds Python object pointers; use a numeric dtype")
        count = 1
        for d in dims:
            count *= d
        nbytes = count * dt.itemsize
        if nbytes > _args.U64_MAX:
            raise invalid_param(f"shape {dims} of {dt} is {nbytes:,} bytes: more than any allocation")
        if not (type(ptr) is int and 0 <= ptr <= _args.U64_MAX):
            ptr = _args.integer(ptr, "ptr", 0, _args.U64_MAX)
        # A shape larger than any allocation is refused before the device is asked.
        device = self._real_memory or _native.VA_WINDOW_START <= ptr < _native.VA_WINDOW_END
        limit = self.capacity if device else 1 << 40
        if nbytes > limit:
            where = f"the device's capacity ({fmt(limit)})" if device else "1 TiB"
            raise invalid_param(f"shape {dims} of {dt} is {nbytes:,} bytes: more than {where}")
        view = copy is False or (copy is not True and not _args.flag(copy, "copy"))
        if view and stream is not None:
            raise invalid_param("to_numpy(copy=False) reads no stream: synchronize the stream, then view")
        # The range is checked before the array is made: it cannot be larger than its source.
        try:
            source = self._view(ptr, nbytes) if view else self._check_range(ptr, nbytes)
        except InvalidParamError as e:
            raise type(e)(
                e.code, e.name, f"shape {dims} of {dt} is {nbytes:,} bytes at {ptr:#x}: {e.message}"
            ) from None
        if view:
            return np.frombuffer(source, dtype=dt, count=count).reshape(dims)
        out = np.empty(dims, dtype=dt)
        if out.nbytes:
            self.read_into(ptr, out, stream)
        return out

    def from_numpy(self, array: np.ndarray, policy: int = Policy.HUGE_FIRST) -> int:
        """Allocates device memory for ``array``, copies it there and returns the pointer."""
        array = np.ascontiguousarray(array)
        if array.dtype.hasobject:
            raise invalid_param("the array holds Python object pointers, not data; convert it to a numeric dtype first")
        ptr = self.malloc(max(array.nbytes, 1), policy)
        try:
            self.write(ptr, array)
        except BaseException:
            self.free(ptr)
            raise
        return ptr

    def malloc_many(self, sizes: Any, policy: int | None = None, stream: int | None = None) -> np.ndarray:
        """Allocates one block per size (a 1-D array or list of ints; all or nothing) and returns
        their pointers as a uint64 array."""
        if not (
            type(sizes) is np.ndarray and sizes.dtype == np.uint64 and sizes.ndim == 1 and sizes.flags.c_contiguous
        ):
            sizes = _args.uint64_array(sizes, "sizes")
        return super().malloc_many(sizes, policy, stream)

    def free_many(self, ptrs: Any) -> None:
        """Frees every pointer (a 1-D array or list of ints; all or nothing)."""
        if not (type(ptrs) is np.ndarray and ptrs.dtype == np.uint64 and ptrs.ndim == 1 and ptrs.flags.c_contiguous):
            ptrs = _args.uint64_array(ptrs, "ptrs")
        super().free_many(ptrs)

    def record_memory_history(self, enabled: bool = True, max_entries: int = 1_000_000) -> None:
        """Starts (or stops) recording alloc/free/segment events for :meth:`memory_snapshot`'s
        ``device_traces``, keeping the last ``max_entries``."""
        super().record_memory_history(_args.flag(enabled, "enabled"), _args.integer(max_entries, "max_entries"))

    def sanitizer_reports(self) -> list[Finding]:  # type: ignore[override]
        """The sanitizer's findings so far, oldest first, as :class:`npumem.errors.Finding`."""
        return [Finding(**f) for f in super().sanitizer_reports()]

    def memory_summary(self) -> str:
        """A readable report of the allocator's state, in the spirit of ``torch.cuda.memory_summary``."""
        st = self.memory_stats()
        fr = self.fragmentation()
        lines = [
            f"npumem memory summary: {self!r}",
            f"{'metric':<26}{'current':>14}{'peak':>14}{'allocated':>14}{'freed':>14}",
        ]
        for key, label in [
            ("allocated_bytes", "allocated memory"),
            ("active_bytes", "active memory"),
            ("requested_bytes", "requested memory"),
            ("reserved_bytes", "reserved memory"),
            ("inactive_split_bytes", "non-releasable memory"),
        ]:
            for pool in ("all", "large_pool", "small_pool"):
                name = label if pool == "all" else f"  from {pool.replace('_', ' ')}"
                vals = [st[f"{key}.{pool}.{f}"] for f in ("current", "peak", "allocated", "freed")]
                lines.append(f"{name:<26}" + "".join(f"{fmt(v):>14}" for v in vals))
        for key, label in [("allocation", "allocations"), ("segment", "device segments")]:
            vals = [st[f"{key}.all.{f}"] for f in ("current", "peak", "allocated", "freed")]
            lines.append(f"{label:<26}" + "".join(f"{v:>14}" for v in vals))
        lines.append(
            "(a segment is what memory_snapshot() lists: for the npumem pool, a run of contiguous mapped pages)"
        )
        lines.append(
            f"device allocs/frees: {st['num_device_alloc']}/{st['num_device_free']}, "
            f"alloc retries: {st['num_alloc_retries']}, OOMs: {st['num_ooms']}"
        )
        lines.append(f"fragmentation: {fr['summary']}")
        return "\n".join(lines)

    def memory_snapshot(self) -> dict[str, Any]:
        """The allocator's state in PyTorch's snapshot schema (``torch.cuda.memory._snapshot()``):
        ``segments`` with their ``blocks``, ``device_traces`` (recorded after
        :meth:`record_memory_history`; a block whose free waits for its streams' work is then
        ``active_pending_free``) and ``allocator_settings``. Load a pickled copy
        (:meth:`dump_snapshot`) into PyTorch's memory_viz to see it."""
        trace = self._trace()
        segments = self._segments()
        # A block whose free waits for its streams' work (free_requested, no free_completed yet) is
        # PyTorch's active_pending_free: active, no longer allocated.
        last: dict[int, str] = {}
        for e in trace:
            if e["action"] in ("alloc", "free_requested", "free_completed"):
                last[e["addr"]] = e["action"]
        for seg in segments:
            for b in seg["blocks"]:
                if b["state"] == "active_allocated" and last.get(b["address"]) == "free_requested":
                    b["state"] = "active_pending_free"
                    seg["allocated_size"] -= b["size"]
                    seg["requested_size"] -= b["requested_size"]
        return {
            "segments": segments,
            "device_traces": [trace],
            "allocator_settings": {
                "allocator": self.allocator,
                "PYTORCH_NPU_ALLOC_CONF": self.alloc_conf,
                "expandable_segments": self.allocator == "npumem",
            },
            "external_annotations": [],
        }

    def dump_snapshot(self, path: str) -> None:
        """Pickles :meth:`memory_snapshot` to ``path``, as ``torch.cuda.memory._dump_snapshot``
        (:func:`npumem.formats.write_snapshot`: checked first, in a protocol memory_viz's browser
        views read)."""
        from .formats import write_snapshot

        write_snapshot(self, path)

    def page_of(self, ptr: int) -> int:
        """The page size (bytes) backing the allocation at ``ptr``."""
        return self.translate(ptr)[1]


# Native methods dispatched as fast on Device (and its subclasses, `__init_subclass__`) as on the
# native class: descriptors of its own, which CPython specialises (see dispatch.rs).
_native._bind_methods(Device)
