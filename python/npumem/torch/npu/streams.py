"""``torch.npu.Stream``, ``torch.npu.Event``, ``current_stream``, ``default_stream``, ``stream()``, ``set_stream`` and
``Tensor.record_stream``, answered by the npumem streams of each device.

Rules:
- A :class:`Stream` is a ``torch.Stream`` of the ``npu`` device whose ``stream_id`` is an npumem
  stream of that device (``Device.create_stream``); ``stream_id`` 0 is the default stream.
- The current stream of a device (``torch.npu.stream(s)``, ``set_stream``) is the stream new
  ``npu`` storages are allocated on and freed on. npumem's frees are stream-ordered, over one
  cache for all streams: a freed block waits until the streams that used it are done (or the
  stream that takes it is ordered after them), then any stream reuses it; so there are no
  per-stream cached bytes to report.
- ``tensor.record_stream(s)`` marks the block as used on ``s`` too (``Device.record_stream``):
  its memory is reused only once ``s`` reaches the point of the free.
- Ops do not run on streams (the kernels are synchronous CPU or meta kernels); what is queued
  on a stream is npumem's own work (``Device.launch``, ``memcpy_async``) on its simulated clock.
  ``synchronize``, ``query``, ``record_event``, ``wait_event`` and ``wait_stream`` are npumem's
  events, so the allocator's stream-ordered reuse sees them.

Events:
- An event belongs to no device until its first ``record``; then it is an npumem event of the
  recording stream's device (``Device.create_event``), and recording it on another device's
  stream is a ``RuntimeError``, as torch_npu's is. It is destroyed with the Python object.
- ``record``, ``wait``, ``query`` and ``synchronize`` are npumem's ``record_event``,
  ``stream_wait_event``, ``query_event`` and ``synchronize_event``, so the caching allocator's
  stream-ordered reuse sees them: a block freed for stream A while stream B still uses it
  (``record_stream``) is reused on A once A has waited on an event B recorded after that use.
  A wait on another device's event waits on the host, as ``npumem.acl``'s does.
- An event never recorded is complete: ``query`` is True, ``wait`` and ``synchronize`` return.
- ``elapsed_time`` is the host's wall-clock milliseconds between the two ``record`` calls: the
  kernels run when they are issued, so the work between two records took exactly that. Both
  events need ``enable_timing=True``, must be recorded on one device and be complete.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import torch

from ... import errors
from .. import runtime
from ..storage import storage_ptr

_TYPE = int(torch._C._autograd.DeviceType.PrivateUse1)
_DEFAULT = 0


class Stream(torch.Stream):
    """An npumem stream of an ``npu`` device (a new one unless ``stream_id`` names one)."""

    def __new__(cls, device: Any = None, priority: int = 0, stream_id: int | None = None) -> Stream:
        index = runtime.index_of(device)
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise TypeError(f"priority must be an int, got {priority!r}")
        handle = runtime.device(index).create_stream() if stream_id is None else stream_id
        return super().__new__(cls, stream_id=handle, device_index=index, device_type=_TYPE)

    def __init__(self, device: Any = None, priority: int = 0, stream_id: int | None = None) -> None:
        """The stream is made by ``__new__``."""

    def synchronize(self) -> None:
        runtime.device(self.device_index).synchronize_stream(_native(self.stream_id))

    def query(self) -> bool:
        """Whether the work queued on the stream so far is done."""
        return self.record_event().query()

    def record_event(self, event: Any = None) -> Any:
        """Records ``event`` (a new ``torch.npu.Event`` by default) on this stream; returns it."""
        if event is None:
            event = Event()
        elif not isinstance(event, Event):
            raise TypeError(f"event={event!r}: expected a torch.npu.Event")
        event.record(self)
        return event

    def wait_event(self, event: Any) -> None:
        """Work queued on this stream from now on waits for ``event``."""
        if not isinstance(event, Event):
            raise TypeError(f"event={event!r}: expected a torch.npu.Event")
        event.wait(self)

    def wait_stream(self, stream: Any) -> None:
        """Work queued on this stream from now on waits for the work queued on ``stream`` so far."""
        self.wait_event(_check(stream).record_event())


def _native(stream_id: int) -> int | None:
    return None if stream_id == _DEFAULT else stream_id


def current_stream(device: Any = None) -> Stream:
    index = runtime.index_of(device)
    return Stream(index, stream_id=runtime.get().streams.get(index, _DEFAULT))


def default_stream(device: Any = None) -> Stream:
    return Stream(runtime.index_of(device), stream_id=_DEFAULT)


def _check(stream: Any) -> Stream:
    """``stream`` as a :class:`Stream` (a plain ``torch.Stream`` of the npu device becomes one)."""
    if not isinstance(stream, torch.Stream) or stream.device_type != _TYPE:
        raise TypeError(f"stream={stream!r}: expected an npu stream (torch.npu.Stream())")
    runtime.check_index(stream.device_index)
    if isinstance(stream, Stream):
        return stream
    return Stream(stream.device_index, stream_id=stream.stream_id)


def set_stream(stream: Any) -> None:
    s = _check(stream)
    runtime.get().streams[s.device_index] = s.stream_id


@contextlib.contextmanager
def stream(stream: Any) -> Iterator[None]:
    """Makes ``stream`` its device's current stream inside the ``with`` block (``None``: no
    change)."""
    if stream is None:
        yield
        return
    s = _check(stream)
    streams = runtime.get().streams
    before = streams.get(s.device_index, _DEFAULT)
    streams[s.device_index] = s.stream_id
    try:
        yield
    finally:
        streams[s.device_index] = before


def record_stream(self: torch.Tensor, s: Any) -> None:
    """The ``record_stream`` kernel: npumem's ``Device.record_stream`` for the tensor's block."""
    if s.device_type != _TYPE or s.device_index != self.device.index:
        raise ValueError(f"record_stream: stream {s} is not a stream of the tensor's device {self.device}")
    ptr = storage_ptr(self)
    if ptr and s.stream_id != _DEFAULT:
        runtime.device(self.device.index).record_stream(ptr, s.stream_id)


def _flag(value: Any, name: str) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name}={value!r}: expected True or False")
    return value


class Event:
    """``torch.npu.Event(enable_timing=False, blocking=False, interprocess=False)``."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False) -> None:
        #: The device index and npumem event handle, once recorded.
        self._index: int | None = None
        self._handle: int | None = None
        self._recorded_ns: int | None = None
        self.enable_timing = _flag(enable_timing, "enable_timing")
        self.blocking = _flag(blocking, "blocking")
        if _flag(interprocess, "interprocess"):
            raise errors.UnsupportedError(
                errors.ACL_ERROR_FEATURE_UNSUPPORTED,
                "ACL_ERROR_FEATURE_UNSUPPORTED",
                "interprocess=True: npumem's npu devices live in one process, so events cannot be shared "
                "with another; expected interprocess=False",
            )
        self.interprocess = False

    @property
    def device(self) -> Any:
        """The device the event was recorded on (``None`` before its first ``record``)."""
        import torch

        return None if self._index is None else torch.device("npu", self._index)

    def record(self, stream: Any = None) -> None:
        """Records the event on ``stream`` (the current stream by default): it completes when the
        work queued on that stream so far has."""
        s = current_stream() if stream is None else _check(stream)
        if self._index is None:
            self._handle = runtime.device(s.device_index).create_event()
            self._index = s.device_index
        elif self._index != s.device_index:
            raise RuntimeError(
                f"Event device npu:{self._index} does not match recording stream's device npu:{s.device_index}"
            )
        runtime.device(self._index).record_event(self._handle, _native(s.stream_id))
        self._recorded_ns = time.perf_counter_ns()

    def wait(self, stream: Any = None) -> None:
        """Makes the work queued on ``stream`` (the current stream by default) from now on wait
        for this event."""
        s = current_stream() if stream is None else _check(stream)
        if self._index is None:
            return
        if s.device_index == self._index:
            runtime.device(self._index).stream_wait_event(s.stream_id, self._handle)
        else:
            self.synchronize()

    def query(self) -> bool:
        """Whether the work before the event's latest record is done."""
        if self._index is None:
            return True
        return runtime.device(self._index).query_event(self._handle) == 0

    def synchronize(self) -> None:
        """Waits until the work before the event's latest record is done."""
        if self._index is not None:
            runtime.device(self._index).synchronize_event(self._handle)

    def elapsed_time(self, end_event: Event) -> float:
        """Milliseconds of wall-clock time from this event's record to ``end_event``'s."""
        if not isinstance(end_event, Event):
            raise TypeError(f"end_event={end_event!r}: expected a torch.npu.Event")
        if not (self.enable_timing and end_event.enable_timing):
            raise ValueError("Both events must be created with argument 'enable_timing=True'.")
        if self._recorded_ns is None or end_event._recorded_ns is None:
            raise ValueError("Both events must be recorded before calculating elapsed time.")
        if self._index != end_event._index:
            raise ValueError(
                f"Both events must be recorded on one device: npu:{self._index} and npu:{end_event._index}"
            )
        if not (self.query() and end_event.query()):
            raise RuntimeError("elapsed_time: the events have not completed; call end_event.synchronize() first")
        return (end_event._recorded_ns - self._recorded_ns) / 1e6

    def ipc_handle(self) -> Any:
        raise errors.UnsupportedError(
            errors.ACL_ERROR_FEATURE_UNSUPPORTED,
            "ACL_ERROR_FEATURE_UNSUPPORTED",
            "ipc_handle: npumem's npu devices live in one process, so events cannot be shared with another",
        )

    def __del__(self) -> None:
        if self._handle is None or runtime.RUNTIME is None:
            return
        try:
            runtime.device(self._index).destroy_event(self._handle)
        except Exception:  # a finaliser must not raise (the interpreter may be exiting)
            pass

    def __repr__(self) -> str:
        where = "not recorded" if self._index is None else f"npu:{self._index}, handle {self._handle:#x}"
        return f"torch.npu.Event({where}, enable_timing={self.enable_timing})"
