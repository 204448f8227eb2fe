"""The state behind ``npumem.acl``: one process-wide :class:`System` of devices sharing one
address space, the contexts, streams and events handed to the program, and the books the leak
report is made from.

Invariants:

- every device pointer lies in its device's slice of the device window (``va_slice``), so
  :meth:`System.locate` names the device of any pointer without asking the devices;
- ``allocs`` holds exactly the live pointers the program got from ``malloc*``/``dvpp_malloc``
  (with their call sites), ``host_blocks`` exactly the live ``malloc_host`` blocks; a failed call
  changes neither;
- a context, stream or event handle is a non-zero int that names one live object until it is
  destroyed, and is never handed out again;
- every public call takes ``LOCK`` for its whole run (the devices lock themselves too; this
  lock keeps the tables and the devices in step).
"""

from __future__ import annotations

import ctypes
import itertools
import os
import sys
import threading
from bisect import bisect_right
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from .. import _native
from ..device import Device
from ..errors import AclError
from . import _config, codes

LOCK = threading.RLock()
#: Handles: distinct, non-zero, pointer-like ints, one sequence for contexts, streams, events
#: and physical-memory handles alike so that one is never taken for another.
_HANDLES = itertools.count(0x5A0000001000, 0x40)
PAGE = 4096
#: How many freed blocks' call sites the report can still name.
FREED_SITES = 4096


def new_handle() -> int:
    return next(_HANDLES)


def call_site(depth: int = 2) -> str:
    """``file:line`` of the program's call into ``acl`` (``depth`` frames up)."""
    try:
        frame = sys._getframe(depth)
    except ValueError:
        return "<unknown>"
    return f"{frame.f_code.co_filename}:{frame.f_lineno}"


@dataclass(slots=True)
class Context:
    handle: int
    device: int
    #: The device's default context (set_device), shared by the threads that set the device.
    default: bool
    streams: set[int] = field(default_factory=set)


@dataclass(slots=True)
class Stream:
    handle: int
    device: int
    native: int
    context: int
    site: str


@dataclass(slots=True)
class Event:
    handle: int
    device: int
    native: int
    site: str


@dataclass(slots=True)
class Alloc:
    device: int
    size: int
    site: str
    api: str
    #: For dvpp_malloc: the pointer malloc returned (the program sees a 128-byte aligned one).
    base: int = 0


@dataclass(slots=True)
class HostBlock:
    owner: int
    size: int
    site: str


@dataclass(slots=True)
class IpcKey:
    device: int
    ptr: int
    size: int
    pids: set[int]
    check_pid: bool
    #: The addresses the imports got (second mappings of the same pages), latest last.
    imports: list[int] = field(default_factory=list)


class _Thread(threading.local):
    context: Context | None = None
    error: str = ""


class System:
    """N devices of one kind sharing the device window, each made on first use."""

    def __init__(self, config: _config.Config) -> None:
        self.config = config
        self.devices: list[Device | None] = [None] * config.devices
        self._slice = config.slice_bytes()
        self._sim = config.backend == "sim"
        self._span = self._slice * config.devices
        #: An internal stream per device for the peer side of cross-device copies.
        self.peer_streams: dict[int, int] = {}

    def device(self, index: int) -> Device:
        dev = self.devices[index]
        if dev is None:
            c = self.config
            va_slice = (index, c.devices) if c.backend == "sim" else None
            # On a runtime, device i is the runtime's device i (each opened as its own).
            device_id = index if c.backend in _config.RUNTIME_BACKENDS else None
            dev = Device(
                c.capacity,
                backend=c.backend,
                allocator=c.allocator,
                alloc_conf=c.alloc_conf,
                va_slice=va_slice,
                device_id=device_id,
            )
            self.devices[index] = dev
        return dev

    def created(self) -> list[tuple[int, Device]]:
        return [(i, d) for i, d in enumerate(self.devices) if d is not None]

    def locate(self, addr: int) -> int | None:
        """The device whose addresses hold ``addr`` (made or not), or None for host memory."""
        if self._sim:
            off = addr - _native.VA_WINDOW_START
            return off // self._slice if 0 <= off < self._span else None
        for i, d in self.created():
            if d.holds(addr):
                return i
        return None

    def peer_stream(self, index: int) -> int:
        s = self.peer_streams.get(index)
        if s is None:
            s = self.peer_streams[index] = self.device(index).create_stream()
        return s


class Runtime:
    """Everything ``npumem.acl`` keeps between calls (one per process: :data:`RT`)."""

    def __init__(self) -> None:
        self.config: _config.Config | None = None
        self.system: System | None = None
        self.initialized = False
        self.default_device: int | None = None
        self.thread = _Thread()
        self.reset_tables()
        self.last_report: dict[str, Any] | None = None

    def reset_tables(self) -> None:
        self.device_refs: dict[int, int] = {}
        self.default_contexts: dict[int, Context] = {}
        self.contexts: dict[int, Context] = {}
        self.streams: dict[int, Stream] = {}
        self.events: dict[int, Event] = {}
        self.allocs: dict[int, Alloc] = {}
        self.host_blocks: dict[int, HostBlock] = {}
        self._host_starts: list[int] = []
        self.physical: dict[int, tuple[int, int, str]] = {}
        self.reservations: dict[int, tuple[int, str]] = {}
        self.peers: set[tuple[int, int]] = set()
        #: (device, native stream) of a queued cross-device copy -> the other devices, whose peer
        #: streams carry its other side: synchronising that stream completes them too.
        self.peer_pending: dict[tuple[int, int], set[int]] = {}
        self.ipc: dict[str, IpcKey] = {}
        self.misuse: list[str] = []
        #: Every stream handle by (device, native stream), destroyed ones too, and the call sites
        #: of recently freed memory: sanitizer findings name them as the program knows them.
        self.stream_names: dict[tuple[int, int], int] = {}
        self.freed_sites: OrderedDict[int, str] = OrderedDict()
        #: Copies whose kind named another direction than their addresses (the kind is advisory).
        self.kind_mismatches = 0

    # ----- the system -----

    def sys(self) -> System:
        if self.system is None:
            if self.config is None:
                self.config = _config.from_env()
            self.system = System(self.config)
        return self.system

    def configure(self, config: _config.Config) -> None:
        if self.system is not None and any(d is not None for d in self.system.devices):
            raise RuntimeError(
                "npumem.acl.configure: the system already has devices in use; call it before the first "
                "acl.rt call, or after acl.finalize()"
            )
        self.config = config
        self.system = None

    def shutdown(self) -> None:
        """Drops the devices and every table (acl.finalize)."""
        self.system = None
        self.reset_tables()
        self.thread = _Thread()

    def forget(self) -> None:
        """Back to the state of a fresh process: no system, no settings, not initialised."""
        self.shutdown()
        self.initialized = False
        self.config = None
        self.default_device = None

    # ----- errors -----

    def fail(self, code: int, message: str) -> int:
        self.thread.error = f"{codes.name(code)} ({code}): {message}"
        return code

    def native_error(self, e: AclError) -> int:
        return self.fail(e.code, e.message)

    # ----- the current context -----

    def current(self) -> Context | None:
        ctx = self.thread.context
        if ctx is not None and ctx.handle not in self.contexts:
            ctx = self.thread.context = None
        if ctx is None and self.default_device is not None:
            ctx = self.retain_device(self.default_device)
            self.thread.context = ctx
        return ctx

    def valid_device(self, index: int) -> bool:
        return 0 <= index < self.sys().config.devices

    def retain_device(self, index: int) -> Context:
        self.sys().device(index)
        self.device_refs[index] = self.device_refs.get(index, 0) + 1
        ctx = self.default_contexts.get(index)
        if ctx is None:
            ctx = Context(new_handle(), index, True)
            self.default_contexts[index] = ctx
            self.contexts[ctx.handle] = ctx
        return ctx

    def drop_context(self, ctx: Context) -> None:
        """Destroys ``ctx`` and the streams made in it (after their work completes)."""
        dev = self.sys().device(ctx.device)
        for handle in sorted(ctx.streams):
            stream = self.streams.pop(handle, None)
            if stream is not None:
                try:
                    dev.synchronize_stream(stream.native)
                    dev.destroy_stream(stream.native)
                except AclError as e:
                    self.misuse.append(f"destroying stream {handle:#x} with its context: {e.message}")
        self.contexts.pop(ctx.handle, None)
        if ctx.default:
            self.default_contexts.pop(ctx.device, None)

    def settle_peers(self, device: int, stream: int | None = None) -> None:
        """After the program waited for ``stream`` of ``device`` (None: all its work), the other
        sides of the cross-device copies queued there are complete too."""
        for key in [k for k in self.peer_pending if k[0] == device and stream in (None, k[1])]:
            for other in self.peer_pending.pop(key):
                dev = self.sys().device(other)
                try:
                    dev.synchronize_stream(self.sys().peer_stream(other))
                except AclError as e:
                    self.misuse.append(f"completing a peer copy on device {other}: {e.message}")

    def forget_site(self, ptr: int, site: str) -> None:
        """Keeps the call site of memory just freed (the last ``FREED_SITES``)."""
        self.freed_sites[ptr] = site
        self.freed_sites.move_to_end(ptr)
        if len(self.freed_sites) > FREED_SITES:
            self.freed_sites.popitem(last=False)

    # ----- where an address lives -----

    def add_host_block(self, addr: int, block: HostBlock) -> None:
        self.host_blocks[addr] = block
        self._host_starts.insert(bisect_right(self._host_starts, addr), addr)

    def remove_host_block(self, addr: int) -> None:
        del self.host_blocks[addr]
        self._host_starts.pop(bisect_right(self._host_starts, addr) - 1)

    def host_block_of(self, addr: int) -> tuple[int, HostBlock] | None:
        i = bisect_right(self._host_starts, addr) - 1
        if i >= 0:
            start = self._host_starts[i]
            block = self.host_blocks[start]
            if addr < start + block.size:
                return start, block
        return None


RT = Runtime()


# ----- host memory the program passes by address -----

_libc = ctypes.CDLL(None, use_errno=True)
_mincore = _libc.mincore
_mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)
_mincore.restype = ctypes.c_int
#: mincore is asked about at most this many pages at a time (its result vector is that long).
_PROBE_PAGES = 1 << 16


def host_mapped(addr: int, count: int) -> bool:
    """Whether ``[addr, addr + count)`` is mapped memory of this process (``mincore`` fails with
    ENOMEM on any unmapped page): pageable host pointers are checked so before they are touched."""
    if addr <= 0 or addr + count > 1 << 47:
        return False
    start = addr & ~(PAGE - 1)
    end = (addr + count + PAGE - 1) & ~(PAGE - 1)
    vec = ctypes.create_string_buffer(min((end - start) // PAGE, _PROBE_PAGES))
    while start < end:
        pages = min((end - start) // PAGE, _PROBE_PAGES)
        if _mincore(start, pages * PAGE, vec) != 0:
            return False
        start += pages * PAGE
    return True


# Note [Host access]
# mincore says a page is mapped, not that it may be touched: a PROT_NONE guard page or a
# read-only mapping passes it, and copying into (or out of) it would fault the interpreter. The
# mappings that cover the range are read from /proc/self/maps (sorted by address) and each must
# grant the access. Limitation: another thread may change a mapping between the check and the
# copy (the copy is then as unsafe as in C); without /proc (not Linux) only mincore's answer is
# kept.


def host_access(addr: int, count: int, write: bool = False) -> bool:
    """Whether the mappings of this process that cover ``[addr, addr + count)`` (mapped: checked
    with :func:`host_mapped` first) all grant reading, and writing with ``write``: a
    ``PROT_NONE`` or read-only page is refused before it is touched."""
    try:
        with open("/proc/self/maps", "rb") as f:
            maps = f.read()
    except OSError:
        return True
    at, hi = addr, addr + count
    for line in maps.splitlines():
        span, perms = line.split(b" ", 2)[:2]
        a, _, b = span.partition(b"-")
        start, end = int(a, 16), int(b, 16)
        if end <= at:
            continue
        if start > at or not perms.startswith(b"r") or (write and perms[1:2] != b"w"):
            return False
        at = end
        if at >= hi:
            return True
    return False


def host_view(addr: int, count: int) -> Any:
    """A writable buffer over ``count`` bytes of process memory at ``addr`` (checked before)."""
    return (ctypes.c_char * count).from_address(addr)


def getpid() -> int:
    return os.getpid()
