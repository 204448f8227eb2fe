"""``torch.npu.Stream``, ``current_stream``, ``default_stream``, ``stream()``, ``set_stream`` and
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
  (:mod:`.events`), so the allocator's stream-ordered reuse sees them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

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
        from .events import Event

        if event is None:
            event = Event()
        elif not isinstance(event, Event):
            raise TypeError(f"event={event!r}: expected a torch.npu.Event")
        event.record(self)
        return event

    def wait_event(self, event: Any) -> None:
        """Work queued on this stream from now on waits for ``event``."""
        from .events import Event

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
