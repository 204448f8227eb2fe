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
  lock keeps the tables and the devices in step);
- the records of memory (``allocs``, ``host_blocks``, ``freed_sites``) live in the native
  ``TABLES``, which serve the plain hot calls of ``acl.rt`` (see ``npumem._native.AclTables``);
  each thread's current context is mirrored there whenever it is set (``_Thread.context``).
"""

from __future__ import annotations

import ctypes
import itertools
import os
import sys
import threading
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import Any

from .. import _native
from .._native import AclAlloc as Alloc
from .._native import AclHostBlock as HostBlock
from ..device import Device
from ..errors import AclError
from . import _config, codes

LOCK = _native.ReentrantLock()
#: The records of the program's memory, and the native plain-call paths of the hot calls.
TABLES = _native.AclTables(LOCK)
#: Handles: distinct, non-zero, pointer-like ints, one sequence for contexts, streams, events
#: and physical-memory handles alike so that one is never taken for another.
_HANDLES = itertools.count(0x5A0000001000, 0x40)
PAGE = 4096
#: How many freed blocks' call sites the report can still name.
FREED_SITES = _native.ACL_FREED_SITES


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
class IpcKey:
    device: int
    ptr: int
    size: int
    pids: set[int]
    check_pid: bool
    #: The addresses the imports got (second mappings of the same pages), latest last.
    imports: list[int] = field(default_factory=list)


class _Records(MutableMapping[int, Any]):
    """A dict-like view of one kind of record in ``TABLES`` (keys: pointers)."""

    def __init__(
        self,
        get: Callable[[Any], Any],
        put: Callable[[int, Any], None],
        delete: Callable[[Any], bool],
        keys: Callable[[], list[int]],
        count: Callable[[], int],
    ) -> None:
        self.get_record, self._put, self._delete, self._keys, self._count = get, put, delete, keys, count

    def __getitem__(self, ptr: Any) -> Any:
        record = self.get_record(ptr)
        if record is None:
            raise KeyError(ptr)
        return record

    def get(self, ptr: Any, default: Any = None) -> Any:
        record = self.get_record(ptr)
        return default if record is None else record

    def __contains__(self, ptr: object) -> bool:
        return self.get_record(ptr) is not None

    def __setitem__(self, ptr: int, record: Any) -> None:
        self._put(ptr, record)

    def __delitem__(self, ptr: Any) -> None:
        if not self._delete(ptr):
            raise KeyError(ptr)

    def __iter__(self) -> Iterator[int]:
        return iter(self._keys())

    def __len__(self) -> int:
        return self._count()


class _FreedSites(Mapping[int, str]):
    """The call sites of the last ``FREED_SITES`` pointers freed, oldest free first."""

    def __getitem__(self, ptr: Any) -> str:
        site = TABLES.freed_site(ptr)
        if site is None:
            raise KeyError(ptr)
        return site

    def get(self, ptr: Any, default: Any = None) -> Any:
        site = TABLES.freed_site(ptr)
        return default if site is None else site

    def __contains__(self, ptr: object) -> bool:
        return TABLES.freed_site(ptr) is not None

    def __iter__(self) -> Iterator[int]:
        return iter(TABLES.freed_site_keys())

    def __len__(self) -> int:
        return TABLES.freed_site_count()


class _Thread(threading.local):
    error: str = ""
    _context: Context | None = None

    @property
    def context(self) -> Context | None:
        return self._context

    @context.setter
    def context(self, ctx: Context | None) -> None:
        self._context = ctx
        if ctx is None:
            TABLES.set_current(0, 0)
        else:
            TABLES.set_current(ctx.handle, ctx.device)


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
        self._system: System | None = None
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
        TABLES.reset()
        self.allocs: MutableMapping[int, Alloc] = _Records(
            TABLES.alloc, TABLES.set_alloc, TABLES.del_alloc, TABLES.alloc_keys, TABLES.alloc_count
        )
        self.host_blocks: MutableMapping[int, HostBlock] = _Records(
            TABLES.host_block,
            TABLES.set_host_block,
            TABLES.del_host_block,
            TABLES.host_block_keys,
            TABLES.host_block_count,
        )
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
        self.freed_sites: Mapping[int, str] = _FreedSites()
        TABLES.bind(self.ipc, self.fail)

    @property
    def kind_mismatches(self) -> int:
        """Copies whose kind named another direction than their addresses (the kind is advisory)."""
        return TABLES.kind_mismatches

    @kind_mismatches.setter
    def kind_mismatches(self, value: int) -> None:
        TABLES.kind_mismatches = value

    # ----- the system -----

    @property
    def system(self) -> System | None:
        return self._system

    @system.setter
    def system(self, system: System | None) -> None:
        self._system = system
        if system is None:
            TABLES.bind_system(None, 0)
        else:
            TABLES.bind_system(system.devices, system._slice if system._sim else 0)

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
        elif ctx is not None:
            TABLES.set_current(ctx.handle, ctx.device)  # the mirror may be of an older epoch
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
        TABLES.context_dropped()
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
        TABLES.forget_site(ptr, site)

    # ----- where an address lives -----

    def add_host_block(self, addr: int, block: HostBlock) -> None:
        self.host_blocks[addr] = block

    def remove_host_block(self, addr: int) -> None:
        del self.host_blocks[addr]

    def host_block_of(self, addr: int) -> tuple[int, HostBlock] | None:
        return TABLES.host_block_of(addr) if 0 <= addr < 1 << 64 else None


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
