"""AscendCL-style errors raised by npumem.

Every error carries ``.code`` (the real ``aclError`` value), ``.name`` (its AscendCL constant) and a
message that says what to do. The classes also derive from the matching built-in exception, so
``except MemoryError`` and ``except ValueError`` work as expected.

The memory sanitizer's reports (``Device(sanitizer="raise" | "collect" | "off")``) live here too:
:class:`Finding` is what ``"collect"`` keeps, :class:`SanitizerError` what ``"raise"`` raises, and
both name their kind from :data:`KINDS`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

ACL_ERROR_INVALID_PARAM = 100000
ACL_ERROR_RT_PARAM_INVALID = 107000
ACL_ERROR_RT_ADDR_UNALIGNED = 107008
ACL_ERROR_RT_INVALID_HANDLE = 107017
ACL_ERROR_FEATURE_UNSUPPORTED = 200006
ACL_ERROR_RT_MEMORY_ALLOCATION = 207001
ACL_ERROR_RT_MEMORY_FREE = 207002
ACL_ERROR_RT_DRV_INTERNAL_ERROR = 507899


class AclError(Exception):
    """Base class: an AscendCL error code and an actionable message."""

    code: int
    name: str
    message: str

    def __init__(self, code: int, name: str, message: str) -> None:
        super().__init__(f"{name} ({code}): {message}")
        self.code = code
        self.name = name
        self.message = message

    def __reduce__(self):  # keep pickling (multiprocessing) working
        return (type(self), (self.code, self.name, self.message))


class InvalidParamError(AclError, ValueError):
    """A bad argument: zero or out-of-range size, unknown enum value, copy past an allocation."""


class OutOfMemoryError(AclError, MemoryError):
    """Device (or host) memory is exhausted; the message shows free memory and fragmentation."""


class MemoryFreeError(AclError, ValueError):
    """A free of memory that is not allocated: double free, unknown or interior pointer."""


class InvalidHandleError(AclError, ValueError):
    """An unknown physical-memory handle."""


class UnsupportedError(AclError, NotImplementedError):
    """The backend or configuration cannot do this."""


class InternalError(AclError, RuntimeError):
    """A bug inside npumem; the device state was left unchanged where possible."""


class SanitizerError(AclError, RuntimeError):
    """A memory-sanitizer finding raised under ``Device(sanitizer="raise")``; ``.kind`` names it
    (``race``, ``pending_write_read``, ...). The operation did not run."""

    kind: str

    def __init__(self, code: int, name: str, message: str, kind: str = "") -> None:
        super().__init__(code, name, message)
        self.kind = kind

    def __reduce__(self):
        return (type(self), (self.code, self.name, self.message, self.kind))


#: The kinds of finding, as ``Finding.kind`` and ``SanitizerError.kind`` name them.
KINDS = ("use_after_free", "double_free", "out_of_bounds", "kind_mismatch", "pending_write_read", "race")


@dataclass(frozen=True)
class Finding:
    """One sanitizer report.

    ``kind`` is one of :data:`KINDS`; ``addr`` and ``size`` give the bytes involved;
    ``allocation`` the start of the allocation concerned (when known) and ``tag`` its site tag
    (``malloc(..., tag=...)``); ``streams`` the streams involved, ``-1`` standing for the host.
    """

    kind: str
    message: str
    addr: int
    size: int
    allocation: int | None = None
    streams: list[int] = field(default_factory=list)
    tag: str | None = None

    def __str__(self) -> str:
        where = f" [{self.tag}]" if self.tag else ""
        return f"{self.kind}{where}: {self.message}"


_BY_CODE: dict[int, type[AclError]] = {
    ACL_ERROR_INVALID_PARAM: InvalidParamError,
    ACL_ERROR_RT_PARAM_INVALID: InvalidParamError,
    ACL_ERROR_RT_ADDR_UNALIGNED: InvalidParamError,
    ACL_ERROR_RT_INVALID_HANDLE: InvalidHandleError,
    ACL_ERROR_FEATURE_UNSUPPORTED: UnsupportedError,
    ACL_ERROR_RT_MEMORY_ALLOCATION: OutOfMemoryError,
    ACL_ERROR_RT_MEMORY_FREE: MemoryFreeError,
    ACL_ERROR_RT_DRV_INTERNAL_ERROR: InternalError,
}


def invalid_param(message: str) -> InvalidParamError:
    """An ``ACL_ERROR_INVALID_PARAM`` error raised by the Python layer."""
    return InvalidParamError(ACL_ERROR_INVALID_PARAM, "ACL_ERROR_INVALID_PARAM", message)


def _from_native(code: int, name: str, message: str, finding: str | None = None) -> AclError:
    """Called by the native module to build the exception for an error code."""
    if finding is not None:
        return SanitizerError(code, name, message, finding)
    return _BY_CODE.get(code, AclError)(code, name, message)
