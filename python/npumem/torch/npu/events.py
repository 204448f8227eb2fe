"""``torch.npu.Event``: torch_npu's event, an npumem event of one device.

Rules:
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

import time
from typing import Any

from ... import errors
from .. import runtime
from .streams import _check, _native, current_stream


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
