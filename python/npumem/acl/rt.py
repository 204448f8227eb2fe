"""``acl.rt``: pyACL's runtime calls on npumem's devices.

Shapes as pyACL's: a call that produces values returns ``(value..., ret)`` with the return code
last, an action returns a bare ``ret``; runtime errors are return codes (the message is kept for
:func:`npumem.acl.get_recent_err_msg`), and only an argument of the wrong type raises
(``TypeError``), as the extension's argument parsing does. Pointers, streams, events and contexts
are ints; stream 0 is the current context's default stream.

Host memory is this process's memory: ``malloc_host`` blocks, and any mapped address the program
passes (``acl.util.bytes_to_ptr``/``numpy_to_ptr`` pointers, ``ndarray.ctypes.data``), checked
to be mapped before it is touched. Copies take their direction from the addresses (the kind is
checked, 0-5, then advisory); an async copy from or to pageable memory completes before it
returns, one between a device and its own ``malloc_host`` memory is queued on the stream.

Rules of the hot calls (``malloc``, ``free``, ``memcpy``, ``memset``, ``malloc_host``,
``free_host``):

- a plain call (exact ints, a live current context, memory of one created device or its
  ``malloc_host`` blocks, in bounds) is served natively (``npumem._native.AclTables``); anything
  else takes the checked path (``_malloc``, ``_free``, ``_copy``, ``_memset_args``,
  ``_malloc_host``, ``_free_host``), which words every error;
- both paths read and write the same records (``RT.allocs``, ``RT.host_blocks``,
  ``RT.freed_sites``) under ``LOCK`` and give the same codes, messages and bytes.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np

from ..errors import AclError
from . import codes as C
from ._runtime import (
    LOCK,
    RT,
    TABLES,
    Alloc,
    Context,
    Event,
    HostBlock,
    IpcKey,
    Stream,
    call_site,
    getpid,
    host_access,
    host_mapped,
    host_view,
    new_handle,
)

__all__ = [
    "create_context",
    "create_event",
    "create_event_with_flag",
    "create_stream",
    "destroy_context",
    "destroy_event",
    "destroy_stream",
    "device_can_access_peer",
    "device_disable_peer_access",
    "device_enable_peer_access",
    "device_get_bare_tgid",
    "event_elapsed_time",
    "free",
    "free_host",
    "free_physical",
    "get_context",
    "get_device",
    "get_device_count",
    "get_mem_info",
    "get_run_mode",
    "ipc_mem_close",
    "ipc_mem_get_export_key",
    "ipc_mem_import_by_key",
    "ipc_mem_set_import_pid",
    "malloc",
    "malloc_align32",
    "malloc_cached",
    "malloc_host",
    "malloc_physical",
    "malloc_with_cfg",
    "map_mem",
    "mem_get_allocation_granularity",
    "memcpy",
    "memcpy2d",
    "memcpy2d_async",
    "memcpy_async",
    "memset",
    "memset_async",
    "pointer_get_attributes",
    "query_event",
    "query_event_status",
    "record_event",
    "release_mem_address",
    "reserve_mem_address",
    "reset_device",
    "reset_device_force",
    "set_context",
    "set_device",
    "stream_wait_event",
    "synchronize_device",
    "synchronize_event",
    "synchronize_stream",
    "synchronize_stream_with_timeout",
    "unmap_mem",
]

F = TypeVar("F", bound=Callable[..., Any])
_U64 = (1 << 64) - 1
_U32 = (1 << 32) - 1

ACL_MEM_LOCATION_TYPE_HOST = 0
ACL_MEM_LOCATION_TYPE_DEVICE = 1
ACL_MEM_LOCATION_TYPE_UNREGISTERED = 2
#: Policy bits that pick a kind of memory the simulator does not distinguish (bandwidth,
#: read-only): accepted and set aside.
_POLICY_FLAGS = 0x100 | 0x1000 | 0x100000
_CACHED_POLICIES = (0, 1, 2, 6)
_IPC_KEY_LEN = 65
_IPC_FLAG_DISABLE_PID_VALIDATION = 1
_IPC_IMPORT_ENABLE_PEER_ACCESS = 1
#: aclrtMemcpy2dAsync's limits.
_MAX_2D_WIDTH = 5_000_000
_MAX_2D_HEIGHT = 5 * 1024 * 1024


def _locked(fn: F) -> F:
    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        with LOCK:
            return fn(*args, **kwargs)

    return run  # type: ignore[return-value]


# ----- argument parsing, as PyArg_ParseTuple's formats -----


def _int(value: Any, fn: str, arg: str) -> int:
    if isinstance(value, (int, np.integer)):
        return int(value)
    raise TypeError(f"acl.rt.{fn} args parse failed: {arg} must be int, not {type(value).__name__}")


def _k(value: Any, fn: str, arg: str) -> int:
    """``"k"``/``"K"``: an unsigned 64-bit int, masked without overflow checking."""
    if type(value) is int and 0 <= value <= _U64:  # the common case, checked quickly
        return value
    return _int(value, fn, arg) & _U64


def _i(value: Any, fn: str, arg: str) -> int:
    """``"i"``: a C int; out of range raises OverflowError."""
    v = value if type(value) is int else _int(value, fn, arg)
    if not -(1 << 31) <= v < 1 << 31:
        raise OverflowError(f"acl.rt.{fn}: {arg}={v} does not fit a C int")
    return v


def _u32(value: Any, fn: str, arg: str) -> int:
    """``"I"``: an unsigned int, masked."""
    return _int(value, fn, arg) & _U32


def _native(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, int]:
    """Calls a device method: (its value, 0), or (None, the error's code)."""
    try:
        return fn(*args, **kwargs), C.ACL_SUCCESS
    except AclError as e:
        return None, RT.native_error(e)


def _no_context(fn: str) -> int:
    return RT.fail(
        C.ACL_ERROR_RT_CONTEXT_NULL,
        f"acl.rt.{fn} needs a current context: call acl.rt.set_device(id) (or create_context) first",
    )


def _bad_device(index: int) -> int:
    n = RT.sys().config.devices
    return RT.fail(C.ACL_ERROR_RT_INVALID_DEVICEID, f"device {index} does not exist; this system has devices 0-{n - 1}")


def _open_device(index: int) -> int:
    """Makes device ``index`` (on first use): 0, or the code of why it cannot be (on ``acl`` and
    ``cuda``, the runtime's own refusal, such as a device it does not have)."""
    try:
        RT.sys().device(index)
    except AclError as e:
        return RT.fail(e.code, f"device {index} cannot be opened: {e.message}")
    return C.ACL_SUCCESS


# ----- devices and contexts -----


@_locked
def set_device(device_id: Any) -> int:
    """``aclrtSetDevice``: makes ``device_id`` current for this thread (one more reference)."""
    d = _i(device_id, "set_device", "device_id")
    if not RT.valid_device(d):
        return _bad_device(d)
    if (ret := _open_device(d)) != C.ACL_SUCCESS:
        return ret
    RT.thread.context = RT.retain_device(d)
    return C.ACL_SUCCESS


def _release_device(fn: str, device_id: Any, force: bool) -> int:
    d = _i(device_id, fn, "device_id")
    if not RT.valid_device(d):
        return _bad_device(d)
    refs = RT.device_refs.get(d, 0)
    if refs == 0:
        return C.ACL_SUCCESS
    refs = 0 if force else refs - 1
    RT.device_refs[d] = refs
    if refs == 0:
        ctx = RT.default_contexts.get(d)
        _, ret = _native(RT.sys().device(d).synchronize_device)
        if ctx is not None:
            RT.drop_context(ctx)
            if RT.thread.context is ctx:
                RT.thread.context = None
        return ret
    return C.ACL_SUCCESS


@_locked
def reset_device(device_id: Any) -> int:
    """``aclrtResetDevice``: one reference less; at none, the default context and its streams go
    (after their work completes)."""
    return _release_device("reset_device", device_id, False)


@_locked
def reset_device_force(device_id: Any) -> int:
    """``aclrtResetDeviceForce``: releases the device whatever its reference count."""
    return _release_device("reset_device_force", device_id, True)


@_locked
def get_device() -> tuple[int, int]:
    ctx = RT.current()
    if ctx is None:
        return 0, _no_context("get_device")
    return ctx.device, C.ACL_SUCCESS


@_locked
def get_device_count() -> tuple[int, int]:
    return RT.sys().config.devices, C.ACL_SUCCESS


@_locked
def create_context(device_id: Any) -> tuple[int, int]:
    """``aclrtCreateContext``: a new context on the device, made current for this thread."""
    d = _i(device_id, "create_context", "device_id")
    if not RT.valid_device(d):
        return 0, _bad_device(d)
    if (ret := _open_device(d)) != C.ACL_SUCCESS:
        return 0, ret
    ctx = Context(new_handle(), d, False)
    RT.contexts[ctx.handle] = ctx
    RT.thread.context = ctx
    return ctx.handle, C.ACL_SUCCESS


@_locked
def destroy_context(context: Any) -> int:
    h = _k(context, "destroy_context", "context")
    ctx = RT.contexts.get(h)
    if ctx is None or ctx.default:
        what = "a device's default context (reset the device instead)" if ctx else "not a live context"
        return RT.fail(C.ACL_ERROR_RT_PARAM_INVALID, f"context {h:#x} is {what}")
    _native(RT.sys().device(ctx.device).synchronize_device)
    RT.drop_context(ctx)
    if RT.thread.context is ctx:
        RT.thread.context = None
    return C.ACL_SUCCESS


@_locked
def set_context(context: Any) -> int:
    h = _k(context, "set_context", "context")
    ctx = RT.contexts.get(h)
    if ctx is None:
        return RT.fail(C.ACL_ERROR_RT_PARAM_INVALID, f"context {h:#x} is not a live context")
    RT.thread.context = ctx
    return C.ACL_SUCCESS


@_locked
def get_context() -> tuple[int, int]:
    ctx = RT.current()
    if ctx is None:
        return 0, _no_context("get_context")
    return ctx.handle, C.ACL_SUCCESS


@_locked
def get_run_mode() -> tuple[int, int]:
    """``aclrtGetRunMode``: 1 (ACL_HOST), the program runs on the host beside the devices."""
    return 1, C.ACL_SUCCESS


@_locked
def device_get_bare_tgid() -> tuple[int, int]:
    """``aclrtDeviceGetBareTgid``: this process's id, as the IPC whitelist takes it."""
    return getpid(), C.ACL_SUCCESS


@_locked
def synchronize_device() -> int:
    ctx = RT.current()
    if ctx is None:
        return _no_context("synchronize_device")
    _, ret = _native(RT.sys().device(ctx.device).synchronize_device)
    if ret == 0:
        RT.settle_peers(ctx.device)
    return ret


# ----- device memory -----


def _policy(policy: int, fn: str, allowed: tuple[int, ...] | None = None) -> int | None:
    base = policy & ~_POLICY_FLAGS
    if allowed is not None and base not in allowed:
        RT.fail(C.ACL_ERROR_INVALID_PARAM, f"acl.rt.{fn} takes policies {allowed}, not {policy:#x}")
        return None
    # An unknown policy is the runtime's default: huge pages above 1 MiB (HUGE_FIRST's rule).
    return base if 0 <= base <= 7 else 0


def _malloc(fn: str, size: Any, policy: Any, api: str, site: str) -> tuple[int, int]:
    n, p = _k(size, fn, "size"), _i(policy, fn, "policy")
    ctx = RT.current()
    if ctx is None:
        return 0, _no_context(fn)
    chosen = _policy(p, fn, _CACHED_POLICIES if api == "malloc_cached" else None)
    if chosen is None:
        return 0, C.ACL_ERROR_INVALID_PARAM
    if n == 0:
        return 0, RT.fail(C.ACL_ERROR_INVALID_PARAM, f"acl.rt.{fn} size must be greater than 0")
    dev = RT.sys().device(ctx.device)
    method = dev.malloc_align32 if api == "malloc_align32" else dev.malloc
    ptr, ret = _native(method, n, chosen, 0, site)
    if ret:
        return 0, ret
    RT.allocs[ptr] = Alloc(ctx.device, n, site, api)
    return ptr, C.ACL_SUCCESS


def _malloc_checked(size: Any, policy: Any) -> tuple[int, int]:
    with LOCK:
        return _malloc("malloc", size, policy, "malloc", call_site(2))


@_locked
def malloc_with_cfg(size: Any, policy: Any, cfg: Any) -> tuple[int, int]:
    """``aclrtMallocWithCfg``; ``cfg`` is a dict (``{}``: no configuration), whose settings the
    simulator has no use for."""
    if not isinstance(cfg, dict):
        raise TypeError(f"acl.rt.malloc_with_cfg args parse failed: cfg must be a dict, not {type(cfg).__name__}")
    return _malloc("malloc_with_cfg", size, policy, "malloc", call_site(3))


@_locked
def malloc_align32(size: Any, policy: Any) -> tuple[int, int]:
    return _malloc("malloc_align32", size, policy, "malloc_align32", call_site(3))


@_locked
def malloc_cached(size: Any, policy: Any) -> tuple[int, int]:
    return _malloc("malloc_cached", size, policy, "malloc_cached", call_site(3))


def _free(fn: str, ptr: int, api_ok: Callable[[Alloc], bool], hint: str) -> int:
    if ptr == 0:
        return RT.fail(C.ACL_ERROR_INVALID_PARAM, f"acl.rt.{fn}(NULL): pass a pointer {hint} returned")
    alloc = RT.allocs.get(ptr)
    if alloc is None or not api_ok(alloc):
        where = RT.sys().locate(ptr)
        why = "host memory" if where is None else f"not a live allocation of device {where}"
        if alloc is not None:
            why = f"memory from {alloc.api} (free it with its own call)"
        return RT.fail(C.ACL_ERROR_RT_MEMORY_FREE, f"acl.rt.{fn}({ptr:#x}): {why}; pass a pointer {hint} returned")
    for key, k in RT.ipc.items():
        if ptr <= k.ptr < ptr + alloc.size:
            RT.misuse.append(f"{ptr:#x} was freed while its IPC key {key} was still open (close it first)")
    _, ret = _native(RT.sys().device(alloc.device).free, alloc.base or ptr)
    if ret == 0:
        del RT.allocs[ptr]
        RT.forget_site(alloc.base or ptr, alloc.site)
    return ret


def _free_checked(dev_ptr: Any) -> int:
    with LOCK:
        return _free("free", _k(dev_ptr, "free", "dev_ptr"), _not_dvpp, "acl.rt.malloc")


def _not_dvpp(alloc: Alloc) -> bool:
    return alloc.api != "dvpp"


def _malloc_host_checked(size: Any) -> tuple[int, int]:
    with LOCK:
        return _malloc_host(_k(size, "malloc_host", "size"))


def _malloc_host(n: int) -> tuple[int, int]:
    if n == 0:
        return 0, RT.fail(C.ACL_ERROR_INVALID_PARAM, "acl.rt.malloc_host size must be greater than 0")
    ctx = RT.current()
    owner = ctx.device if ctx is not None else 0
    try:
        ptr = RT.sys().device(owner).malloc_host(n)
    except AclError as e:
        return 0, RT.native_error(e)
    RT.add_host_block(ptr, HostBlock(owner, n, call_site(3)))
    return ptr, C.ACL_SUCCESS


def _free_host_checked(host_ptr: Any) -> int:
    with LOCK:
        return _free_host(_k(host_ptr, "free_host", "host_ptr"))


def _free_host(ptr: int) -> int:
    if ptr == 0:
        return RT.fail(C.ACL_ERROR_INVALID_PARAM, "acl.rt.free_host(NULL): pass a pointer malloc_host returned")
    block = RT.host_blocks.get(ptr)
    if block is None:
        return RT.fail(C.ACL_ERROR_RT_MEMORY_FREE, f"{ptr:#x} is not a live malloc_host block")
    try:
        RT.system.devices[block.owner].free_host(ptr)  # type: ignore[union-attr]
    except AclError as e:
        return RT.native_error(e)
    RT.remove_host_block(ptr)
    RT.forget_site(ptr, block.site)
    return C.ACL_SUCCESS


# ----- where bytes live, and moving them -----

_DEV, _PINNED, _PAGEABLE = "device", "malloc_host", "pageable"
#: The (source on a device, destination on a device) each kind names; DEFAULT names none.
_KIND_DIRECTIONS = {0: (False, False), 1: (False, True), 2: (True, False), 3: (True, True), 5: (False, True)}


def _where(addr: int, count: int, role: str) -> tuple[str, int] | int:
    """(kind, device) of ``count`` bytes at ``addr``, or the error code (already recorded);
    pageable memory must be readable, and writable unless ``role`` is the source."""
    if addr == 0:
        return RT.fail(C.ACL_ERROR_INVALID_PARAM, f"{role} is NULL")
    d = RT.sys().locate(addr)
    if d is not None:
        if RT.sys().devices[d] is None:
            return RT.fail(C.ACL_ERROR_RT_PARAM_INVALID, f"{role} {addr:#x} is on device {d}, which was never used")
        return _DEV, d
    hit = RT.host_block_of(addr)
    if hit is not None:
        start, block = hit
        if addr + count > start + block.size:
            return RT.fail(
                C.ACL_ERROR_RT_PARAM_INVALID,
                f"{count} bytes at {role} {addr:#x} run past the malloc_host block at {start:#x} ({block.size} bytes)",
            )
        return _PINNED, block.owner
    if not host_mapped(addr, count):
        return RT.fail(C.ACL_ERROR_RT_PARAM_INVALID, f"{count} bytes at {role} {addr:#x} are not mapped host memory")
    write = role != "source"
    if not host_access(addr, count, write):
        return RT.fail(C.ACL_ERROR_RT_PARAM_INVALID, _no_access(count, role, addr, write))
    return _PAGEABLE, -1


def _no_access(count: int, role: str, addr: int, write: bool) -> str:
    what = "written (read-only or PROT_NONE)" if write else "read (PROT_NONE)"
    return f"{count} bytes at {role} {addr:#x} are mapped host memory that may not be {what}"


def _check_kind(kind: int) -> int:
    if not 0 <= kind <= 5:
        return RT.fail(C.ACL_ERROR_INVALID_PARAM, f"memcpy kind {kind} is not one of 0-5 (aclrtMemcpyKind)")
    return C.ACL_SUCCESS


def _stream(handle: int, fn: str) -> Stream | int:
    """The stream a handle names (0: the current context's default stream), or an error code."""
    ctx = RT.current()
    if handle == 0:
        if ctx is None:
            return _no_context(fn)
        return Stream(0, ctx.device, 0, ctx.handle, "")
    s = RT.streams.get(handle)
    if s is None:
        return RT.fail(C.ACL_ERROR_RT_PARAM_INVALID, f"stream {handle:#x} is not a live stream")
    if ctx is not None and ctx.device != s.device:
        return RT.fail(
            C.ACL_ERROR_RT_STREAM_CONTEXT,
            f"stream {handle:#x} belongs to device {s.device}, but the current device is {ctx.device}",
        )
    return s


def _peer_ok(issuer: int, devices: set[int]) -> int:
    for other in sorted(devices - {issuer}):
        if (issuer, other) not in RT.peers:
            return RT.fail(
                C.ACL_ERROR_RT_PARAM_INVALID,
                f"device {issuer} has no peer access to device {other}: call acl.rt.device_can_access_peer and "
                f"acl.rt.device_enable_peer_access({other}, 0) with device {issuer} current first",
            )
    return C.ACL_SUCCESS


def _peer_copy(dst: int, b: int, src: int, a: int, count: int, stream: Stream | None) -> int:
    """A copy between two devices, queued on ``stream`` (None: synchronous) at the P2P
    bandwidth; the other device's side runs on its peer stream, so each sanitizer sees it."""
    s = RT.sys()
    issuer = stream.device if stream is not None else RT.current().device  # type: ignore[union-attr]
    ret = _peer_ok(issuer, {a, b})
    if ret:
        return ret
    da, db = s.device(a), s.device(b)
    for dev, ptr in ((da, src), (db, dst)):
        _, ret = _native(dev._check_range, ptr, count)
        if ret:
            return ret
    us = count / da.cost_model()["p2p_bandwidth"] * 1e6
    queues: dict[int, int] = {x: s.peer_stream(x) for x in (a, b)}
    if stream is not None:
        queues[stream.device] = stream.native
    # The bytes move now, so everything queued before them on both devices lands first.
    for x in (a, b):
        _, ret = _native(s.device(x).synchronize_device)
        if ret:
            return ret
    if stream is not None and stream.device not in (a, b):
        _native(s.device(stream.device).synchronize_stream, stream.native)
    for x, q in queues.items():
        reads, writes = ([src] if x == a else []), ([dst] if x == b else [])
        _, ret = _native(s.device(x).launch, q, us, reads, writes)
        if ret:
            return ret
    _, ret = _native(da._copy_to_peer, src, db, dst, count)
    if ret == 0 and stream is None:
        for x, q in queues.items():
            _native(s.device(x).synchronize_stream, q)
    elif stream is not None:
        others = {x for x in (a, b) if x != stream.device}
        RT.peer_pending.setdefault((stream.device, stream.native), set()).update(others)
    return ret


def _copy(fn: str, dst: int, dst_max: int, src: int, count: int, kind: int, stream: Stream | None) -> int:
    """One checked copy (``stream`` None: ``aclrtMemcpy``)."""
    ret = _check_kind(kind)
    if ret or count == 0:
        return ret
    if count > dst_max:
        return RT.fail(C.ACL_ERROR_RT_PARAM_INVALID, f"count {count} is larger than dest_max {dst_max}")
    if dst == 0 or src == 0:
        return RT.fail(C.ACL_ERROR_INVALID_PARAM, f"acl.rt.{fn}: {'dst' if dst == 0 else 'src'} is NULL")
    if dst == src:
        return C.ACL_SUCCESS
    wd, ws = _where(dst, count, "destination"), _where(src, count, "source")
    if isinstance(wd, int):
        return wd
    if isinstance(ws, int):
        return ws
    (kd, d), (ks, s_) = wd, ws
    named = _KIND_DIRECTIONS.get(kind)
    if named is not None and named != (ks == _DEV, kd == _DEV):
        RT.kind_mismatches += 1
    sys_ = RT.sys()
    if kd == _DEV and ks == _DEV and d != s_:
        if stream is None and RT.current() is None:
            return _no_context(fn)
        return _peer_copy(dst, d, src, s_, count, stream)
    if stream is not None and _DEV in (kd, ks):
        devs = {x for k, x in ((kd, d), (ks, s_)) if k == _DEV}
        if stream.device not in devs:
            ret = _peer_ok(stream.device, devs)
            if ret:
                return ret
    # Both ends on one device and its own malloc_host blocks: that device does it (queued).
    if d == s_ and kd != _PAGEABLE and ks != _PAGEABLE:
        owner = d
        dev = sys_.device(owner)
        if stream is None:
            return _native(dev.memcpy, dst, dst_max, src, count, kind)[1]
        if stream.device == owner:
            return _native(dev.memcpy_async, dst, dst_max, src, count, kind, stream.native)[1]
    # Pageable memory (or another device's malloc_host block) on one end: synchronous, after
    # the stream's queued work.
    # On the stream's own device the copy is queued behind the stream's work and waited for
    # (it shows on the stream's timeline); otherwise the stream is waited for first.
    device = d if kd == _DEV else s_ if ks == _DEV else -1
    on_stream = stream is not None and stream.device == device
    if stream is not None and not on_stream:
        _, ret = _native(sys_.device(stream.device).synchronize_stream, stream.native)
        if ret:
            return ret
    queue = stream.native if on_stream else None  # type: ignore[union-attr]
    if kd == _DEV:
        view = memoryview(host_view(src, count)).cast("B")
        return _native(sys_.device(d).write, dst, view, queue)[1]
    if ks == _DEV:
        view = memoryview(host_view(dst, count)).cast("B")
        return _native(sys_.device(s_).read_into, src, view, queue)[1]
    ctypes.memmove(dst, src, count)
    return C.ACL_SUCCESS


def _memcpy_checked(dst: Any, dest_max: Any, src: Any, count: Any, kind: Any) -> int:
    with LOCK:
        f = "memcpy"
        args = _k(dst, f, "dst"), _k(dest_max, f, "dest_max"), _k(src, f, "src"), _k(count, f, "count")
        return _copy(f, *args, _i(kind, f, "kind"), None)


@_locked
def memcpy_async(dst: Any, dest_max: Any, src: Any, count: Any, kind: Any, stream: Any) -> int:
    """``aclrtMemcpyAsync``: queued on ``stream`` between a device and its malloc_host memory;
    from or to pageable memory it completes before returning."""
    f = "memcpy_async"
    args = _k(dst, f, "dst"), _k(dest_max, f, "dest_max"), _k(src, f, "src"), _k(count, f, "count")
    k, h = _i(kind, f, "kind"), _k(stream, f, "stream")
    s = _stream(h, f)
    if isinstance(s, int):
        return s
    return _copy(f, *args, k, s)


def _copy2d(fn: str, args: tuple[Any, ...], stream: Stream | None) -> int:
    dst, dpitch, src, spitch, width, height = (_k(v, fn, n) for v, n in zip(args[:6], _2D_NAMES, strict=True))
    kind = _i(args[6], fn, "kind")
    if kind not in (1, 2, 3, 4) or (stream is None and kind == 3):
        allowed = "1 (H2D), 2 (D2H), 3 (D2D), 4" if stream else "1 (H2D), 2 (D2H), 4"
        return RT.fail(C.ACL_ERROR_INVALID_PARAM, f"acl.rt.{fn} takes kinds {allowed}, not {kind}")
    if width > dpitch or width > spitch:
        return RT.fail(C.ACL_ERROR_INVALID_PARAM, f"width {width} must not exceed dpitch {dpitch} or spitch {spitch}")
    if stream is not None and (width > _MAX_2D_WIDTH or height > _MAX_2D_HEIGHT):
        return RT.fail(C.ACL_ERROR_INVALID_PARAM, f"width <= {_MAX_2D_WIDTH} and height <= {_MAX_2D_HEIGHT}")
    if width == 0 or height == 0:
        return C.ACL_SUCCESS
    # Check the whole extent of both sides before any row moves.
    span_d, span_s = (height - 1) * dpitch + width, (height - 1) * spitch + width
    for addr, span, role in ((dst, span_d, "destination"), (src, span_s, "source")):
        w = _where(addr, 1, role)
        if isinstance(w, int):
            return w
        if w[0] == _DEV:
            _, ret = _native(RT.sys().device(w[1])._check_range, addr, span)
        elif not host_mapped(addr, span):
            ret = RT.fail(C.ACL_ERROR_RT_PARAM_INVALID, f"{span} bytes at {role} {addr:#x} are not mapped memory")
        elif not host_access(addr, span, role == "destination"):
            ret = RT.fail(C.ACL_ERROR_RT_PARAM_INVALID, _no_access(span, role, addr, role == "destination"))
        else:
            ret = 0
        if ret:
            return ret
    if width == dpitch == spitch:  # rows back to back on both sides: one copy
        return _copy(fn, dst, width * height, src, width * height, kind, stream)
    for row in range(height):
        ret = _copy(fn, dst + row * dpitch, width, src + row * spitch, width, kind, stream)
        if ret:
            return ret
    return C.ACL_SUCCESS


_2D_NAMES = ("dst", "dpitch", "src", "spitch", "width", "height")


@_locked
def memcpy2d(dst: Any, dpitch: Any, src: Any, spitch: Any, width: Any, height: Any, kind: Any) -> int:
    """``aclrtMemcpy2d``: ``height`` rows of ``width`` bytes, host to device or back."""
    return _copy2d("memcpy2d", (dst, dpitch, src, spitch, width, height, kind), None)


@_locked
def memcpy2d_async(
    dst: Any, dpitch: Any, src: Any, spitch: Any, width: Any, height: Any, kind: Any, stream: Any
) -> int:
    s = _stream(_k(stream, "memcpy2d_async", "stream"), "memcpy2d_async")
    if isinstance(s, int):
        return s
    return _copy2d("memcpy2d_async", (dst, dpitch, src, spitch, width, height, kind), s)


def _memset(fn: str, ptr: int, max_count: int, value: int, count: int, stream: Stream | None) -> int:
    if count == 0:
        return C.ACL_SUCCESS
    if count > max_count:
        return RT.fail(C.ACL_ERROR_RT_PARAM_INVALID, f"count {count} is larger than max_count {max_count}")
    w = _where(ptr, count, "destination")
    if isinstance(w, int):
        return w
    kind, owner = w
    if stream is not None and kind == _DEV and owner != stream.device:
        ret = _peer_ok(stream.device, {owner})
        if ret:
            return ret
    if kind != _PAGEABLE:
        dev = RT.sys().device(owner)
        if stream is not None and stream.device == owner:
            return _native(dev.memset_async, ptr, max_count, value, count, stream.native)[1]
        if stream is not None:
            _native(RT.sys().device(stream.device).synchronize_stream, stream.native)
        return _native(dev.memset, ptr, max_count, value, count)[1]
    if stream is not None:
        _native(RT.sys().device(stream.device).synchronize_stream, stream.native)
    ctypes.memset(ptr, value & 0xFF, count)
    return C.ACL_SUCCESS


def _memset_checked(dev_ptr: Any, max_count: Any, value: Any, count: Any) -> int:
    with LOCK:
        return _memset_args(dev_ptr, max_count, value, count)


def _memset_args(dev_ptr: Any, max_count: Any, value: Any, count: Any) -> int:
    f = "memset"
    return _memset(
        f, _k(dev_ptr, f, "dev_ptr"), _k(max_count, f, "max_count"), _i(value, f, "value"), _k(count, f, "count"), None
    )


@_locked
def memset_async(dev_ptr: Any, max_count: Any, value: Any, count: Any, stream: Any) -> int:
    f = "memset_async"
    args = _k(dev_ptr, f, "dev_ptr"), _k(max_count, f, "max_count"), _i(value, f, "value"), _k(count, f, "count")
    s = _stream(_k(stream, f, "stream"), f)
    if isinstance(s, int):
        return s
    return _memset(f, *args, s)


@_locked
def get_mem_info(attr: Any) -> tuple[int, int, int]:
    """``aclrtGetMemInfo`` of the current device: ``(free, total, ret)``."""
    a = _i(attr, "get_mem_info", "attr")
    ctx = RT.current()
    if ctx is None:
        return 0, 0, _no_context("get_mem_info")
    if not 0 <= a <= 17:
        return 0, 0, RT.fail(C.ACL_ERROR_INVALID_PARAM, f"attr {a} is not an aclrtMemAttr (0-17)")
    info, ret = _native(RT.sys().device(ctx.device).mem_info, a)
    return (info[0], info[1], 0) if ret == 0 else (0, 0, ret)


@_locked
def pointer_get_attributes(ptr: Any) -> tuple[dict[str, Any], int]:
    """``aclrtPointerGetAttributes``: where the memory lives and its page size."""
    p = _k(ptr, "pointer_get_attributes", "ptr")

    def attrs(loc_id: int, loc_type: int, page: int) -> dict[str, Any]:
        return {"location": {"id": loc_id, "type": loc_type}, "page_size": page, "rsv": [0, 0, 0, 0]}

    if p == 0:
        return attrs(0, 0, 0), RT.fail(C.ACL_ERROR_INVALID_PARAM, "ptr is NULL")
    d = RT.sys().locate(p)
    if d is not None:
        dev = RT.sys().devices[d]
        if dev is None:
            return attrs(0, 0, 0), RT.fail(C.ACL_ERROR_RT_PARAM_INVALID, f"{p:#x} is on device {d}, never used")
        t, ret = _native(dev.translate, p)
        if ret:
            return attrs(0, 0, 0), ret
        return attrs(d, ACL_MEM_LOCATION_TYPE_DEVICE, t[1]), C.ACL_SUCCESS
    if RT.host_block_of(p) is not None:
        return attrs(0, ACL_MEM_LOCATION_TYPE_HOST, 4096), C.ACL_SUCCESS
    return attrs(0, ACL_MEM_LOCATION_TYPE_UNREGISTERED, 4096), C.ACL_SUCCESS


# ----- virtual memory (the VMM calls) -----


@_locked
def reserve_mem_address(size: Any, alignment: Any, expect_ptr: Any, flags: Any) -> tuple[int, int]:
    f = "reserve_mem_address"
    n, al, want, fl = (
        _k(size, f, "size"),
        _k(alignment, f, "alignment"),
        _k(expect_ptr, f, "expect_ptr"),
        _k(flags, f, "flags"),
    )
    ctx = RT.current()
    if ctx is None:
        return 0, _no_context(f)
    dev = RT.sys().device(ctx.device)
    va, ret = _native(dev.reserve_mem_address, n, want or None, al, fl)
    if ret:
        return 0, ret
    RT.reservations[va] = (ctx.device, call_site(3))
    return va, C.ACL_SUCCESS


@_locked
def release_mem_address(vir_ptr: Any) -> int:
    va = _k(vir_ptr, "release_mem_address", "vir_ptr")
    d = RT.sys().locate(va)
    if d is None or RT.sys().devices[d] is None:
        return RT.fail(C.ACL_ERROR_INVALID_PARAM, f"{va:#x} is not a reserved device address")
    _, ret = _native(RT.sys().device(d).release_mem_address, va)
    if ret == 0:
        RT.reservations.pop(va, None)
    return ret


def _prop(prop: Any, fn: str) -> tuple[int, int] | int:
    """(device, memAttr) of an ``aclrtPhysicalMemProp`` dict, or an error code."""
    if not isinstance(prop, dict):
        raise TypeError(f"acl.rt.{fn} args parse failed: prop must be a dict, not {type(prop).__name__}")
    loc = prop.get("location", {})
    if not isinstance(loc, dict):
        raise TypeError(f"acl.rt.{fn}: prop['location'] must be a dict with 'id' and 'type'")
    handle_type = _int(prop.get("handleType", 0), fn, "prop['handleType']")
    alloc_type = _int(prop.get("allocationType", 0), fn, "prop['allocationType']")
    attr = _int(prop.get("memAttr", 13), fn, "prop['memAttr']")
    loc_id = _int(loc.get("id", 0), fn, "prop['location']['id']")
    loc_type = _int(loc.get("type", ACL_MEM_LOCATION_TYPE_DEVICE), fn, "prop['location']['type']")
    if handle_type != 0 or alloc_type != 0:
        return RT.fail(C.ACL_ERROR_INVALID_PARAM, "handleType must be 0 (NONE) and allocationType 0 (PINNED)")
    if loc_type != ACL_MEM_LOCATION_TYPE_DEVICE:
        return RT.fail(C.ACL_ERROR_INVALID_PARAM, f"location type {loc_type}: only device memory (1) is simulated")
    if not RT.valid_device(loc_id):
        return _bad_device(loc_id)
    return loc_id, attr


@_locked
def malloc_physical(size: Any, prop: Any, flags: Any) -> tuple[int, int]:
    f = "malloc_physical"
    n, fl = _k(size, f, "size"), _k(flags, f, "flags")
    p = _prop(prop, f)
    if isinstance(p, int):
        return 0, p
    device, attr = p
    native, ret = _native(RT.sys().device(device).malloc_physical, n, attr, fl)
    if ret:
        return 0, ret
    handle = new_handle()
    RT.physical[handle] = (device, native, call_site(3))
    return handle, C.ACL_SUCCESS


@_locked
def free_physical(handle: Any) -> int:
    h = _k(handle, "free_physical", "handle")
    entry = RT.physical.get(h)
    if entry is None:
        return RT.fail(C.ACL_ERROR_RT_INVALID_HANDLE, f"{h:#x} is not a live physical-memory handle")
    _, ret = _native(RT.sys().device(entry[0]).free_physical, entry[1])
    if ret == 0:
        del RT.physical[h]
    return ret


@_locked
def map_mem(vir_ptr: Any, size: Any, offset: Any, handle: Any, flags: Any) -> int:
    f = "map_mem"
    va, n, off, h, fl = (
        _k(v, f, a)
        for v, a in ((vir_ptr, "vir_ptr"), (size, "size"), (offset, "offset"), (handle, "handle"), (flags, "flags"))
    )
    entry = RT.physical.get(h)
    if entry is None:
        return RT.fail(C.ACL_ERROR_RT_INVALID_HANDLE, f"{h:#x} is not a live physical-memory handle")
    d = RT.sys().locate(va)
    if d != entry[0]:
        return RT.fail(
            C.ACL_ERROR_RT_PARAM_INVALID,
            f"{va:#x} is not an address of device {entry[0]}, whose memory the handle holds",
        )
    return _native(RT.sys().device(d).map_mem, va, entry[1], n, off, fl)[1]


@_locked
def unmap_mem(vir_ptr: Any) -> int:
    va = _k(vir_ptr, "unmap_mem", "vir_ptr")
    d = RT.sys().locate(va)
    if d is None or RT.sys().devices[d] is None:
        return RT.fail(C.ACL_ERROR_RT_PARAM_INVALID, f"{va:#x} is not a mapped device address")
    return _native(RT.sys().device(d).unmap_mem, va)[1]


@_locked
def mem_get_allocation_granularity(prop: Any, option: Any) -> tuple[int, int]:
    f = "mem_get_allocation_granularity"
    opt = _i(option, f, "option")
    p = _prop(prop, f)
    if isinstance(p, int):
        return 0, p
    if opt not in (0, 1):
        return 0, RT.fail(C.ACL_ERROR_INVALID_PARAM, f"option {opt}: 0 (MINIMUM) or 1 (RECOMMENDED)")
    g, ret = _native(RT.sys().device(p[0]).mem_get_allocation_granularity, p[1])
    return (g, 0) if ret == 0 else (0, ret)


# ----- streams and events -----


@_locked
def create_stream() -> tuple[int, int]:
    ctx = RT.current()
    if ctx is None:
        return 0, _no_context("create_stream")
    native, ret = _native(RT.sys().device(ctx.device).create_stream)
    if ret:
        return 0, ret
    s = Stream(new_handle(), ctx.device, native, ctx.handle, call_site(3))
    RT.streams[s.handle] = s
    RT.stream_names[ctx.device, native] = s.handle
    ctx.streams.add(s.handle)
    return s.handle, C.ACL_SUCCESS


@_locked
def destroy_stream(stream: Any) -> int:
    h = _k(stream, "destroy_stream", "stream")
    s = RT.streams.get(h)
    if s is None:
        return RT.fail(C.ACL_ERROR_RT_PARAM_INVALID, f"stream {h:#x} is not a live stream (the default stream is 0)")
    _, ret = _native(RT.sys().device(s.device).destroy_stream, s.native)
    if ret == 0:
        del RT.streams[h]
        ctx = RT.contexts.get(s.context)
        if ctx is not None:
            ctx.streams.discard(h)
    return ret


@_locked
def synchronize_stream(stream: Any) -> int:
    s = _stream(_k(stream, "synchronize_stream", "stream"), "synchronize_stream")
    if isinstance(s, int):
        return s
    return _sync_stream(s)


def _sync_stream(s: Stream) -> int:
    _, ret = _native(RT.sys().device(s.device).synchronize_stream, s.native)
    if ret == 0:
        RT.settle_peers(s.device, s.native)
    return ret


@_locked
def synchronize_stream_with_timeout(stream: Any, timeout: Any) -> int:
    """The simulated clock never stalls: the wait always completes within any timeout."""
    _i(timeout, "synchronize_stream_with_timeout", "timeout")
    s = _stream(_k(stream, "synchronize_stream_with_timeout", "stream"), "synchronize_stream_with_timeout")
    if isinstance(s, int):
        return s
    return _sync_stream(s)


def _create_event(fn: str) -> tuple[int, int]:
    ctx = RT.current()
    if ctx is None:
        return 0, _no_context(fn)
    native, ret = _native(RT.sys().device(ctx.device).create_event)
    if ret:
        return 0, ret
    e = Event(new_handle(), ctx.device, native, call_site(4))
    RT.events[e.handle] = e
    return e.handle, C.ACL_SUCCESS


@_locked
def create_event() -> tuple[int, int]:
    return _create_event("create_event")


@_locked
def create_event_with_flag(flag: Any) -> tuple[int, int]:
    _u32(flag, "create_event_with_flag", "flag")
    return _create_event("create_event_with_flag")


def _event(handle: Any, fn: str) -> Event | int:
    h = _k(handle, fn, "event")
    e = RT.events.get(h)
    if e is None:
        return RT.fail(C.ACL_ERROR_RT_PARAM_INVALID, f"event {h:#x} is not a live event")
    return e


@_locked
def destroy_event(event: Any) -> int:
    e = _event(event, "destroy_event")
    if isinstance(e, int):
        return e
    _, ret = _native(RT.sys().device(e.device).destroy_event, e.native)
    if ret == 0:
        del RT.events[e.handle]
    return ret


@_locked
def record_event(event: Any, stream: Any) -> int:
    e = _event(event, "record_event")
    if isinstance(e, int):
        return e
    s = _stream(_k(stream, "record_event", "stream"), "record_event")
    if isinstance(s, int):
        return s
    if s.device != e.device:
        return RT.fail(
            C.ACL_ERROR_RT_STREAM_CONTEXT, f"event of device {e.device} recorded on a stream of device {s.device}"
        )
    return _native(RT.sys().device(e.device).record_event, e.native, s.native)[1]


@_locked
def query_event(event: Any) -> tuple[int, int]:
    """``(status, ret)``: status 0 = ACL_EVENT_STATUS_COMPLETE, 1 = NOT_READY."""
    e = _event(event, "query_event")
    if isinstance(e, int):
        return 1, e
    status, ret = _native(RT.sys().device(e.device).query_event, e.native)
    return (status, 0) if ret == 0 else (1, ret)


@_locked
def query_event_status(event: Any) -> tuple[int, int]:
    """``(status, ret)``: status 1 = ACL_EVENT_RECORDED_STATUS_COMPLETE, 0 = NOT_READY."""
    e = _event(event, "query_event_status")
    if isinstance(e, int):
        return 0, e
    status, ret = _native(RT.sys().device(e.device).query_event, e.native)
    return (1 - status, 0) if ret == 0 else (0, ret)


@_locked
def synchronize_event(event: Any) -> int:
    e = _event(event, "synchronize_event")
    if isinstance(e, int):
        return e
    _, ret = _native(RT.sys().device(e.device).synchronize_event, e.native)
    if ret == 0:
        RT.settle_peers(e.device)
    return ret


@_locked
def stream_wait_event(stream: Any, event: Any) -> int:
    """The stream's later work waits for the event; an event of another device is waited for
    on the host (the work after it is then ordered too)."""
    s = _stream(_k(stream, "stream_wait_event", "stream"), "stream_wait_event")
    if isinstance(s, int):
        return s
    e = _event(event, "stream_wait_event")
    if isinstance(e, int):
        return e
    if s.device == e.device:
        return _native(RT.sys().device(e.device).stream_wait_event, s.native, e.native)[1]
    return _native(RT.sys().device(e.device).synchronize_event, e.native)[1]


@_locked
def event_elapsed_time(start: Any, end: Any) -> tuple[float, int]:
    """``(ms, ret)`` between two recorded events of one device, on its simulated clock."""
    a, b = _event(start, "event_elapsed_time"), _event(end, "event_elapsed_time")
    if isinstance(a, int):
        return 0.0, a
    if isinstance(b, int):
        return 0.0, b
    if a.device != b.device:
        return 0.0, RT.fail(C.ACL_ERROR_RT_PARAM_INVALID, "the two events belong to different devices")
    ms, ret = _native(RT.sys().device(a.device).event_elapsed_time, a.native, b.native)
    return (float(ms), 0) if ret == 0 else (0.0, ret)


# ----- peer access -----


@_locked
def device_can_access_peer(device_id: Any, peer_device_id: Any) -> tuple[int, int]:
    """``(can, ret)``: every two distinct devices of the system reach each other (HCCS/PCIe)."""
    d, p = (
        _i(device_id, "device_can_access_peer", "device_id"),
        _i(peer_device_id, "device_can_access_peer", "peer_device_id"),
    )
    for x in (d, p):
        if not RT.valid_device(x):
            return 0, _bad_device(x)
    return int(d != p), C.ACL_SUCCESS


@_locked
def device_enable_peer_access(peer_device_id: Any, flags: Any) -> int:
    """Lets the current device copy to and from ``peer_device_id``'s memory."""
    p, fl = (
        _i(peer_device_id, "device_enable_peer_access", "peer_device_id"),
        _u32(flags, "device_enable_peer_access", "flags"),
    )
    ctx = RT.current()
    if ctx is None:
        return _no_context("device_enable_peer_access")
    if fl != 0:
        return RT.fail(C.ACL_ERROR_INVALID_PARAM, f"flags must be 0, got {fl}")
    if not RT.valid_device(p):
        return _bad_device(p)
    if p == ctx.device:
        return RT.fail(C.ACL_ERROR_RT_PARAM_INVALID, f"device {p} is the current device, not a peer")
    RT.sys().device(p)
    RT.peers.add((ctx.device, p))
    return C.ACL_SUCCESS


@_locked
def device_disable_peer_access(peer_device_id: Any) -> int:
    p = _i(peer_device_id, "device_disable_peer_access", "peer_device_id")
    ctx = RT.current()
    if ctx is None:
        return _no_context("device_disable_peer_access")
    if not RT.valid_device(p):
        return _bad_device(p)
    if (ctx.device, p) not in RT.peers:
        return RT.fail(C.ACL_ERROR_RT_PARAM_INVALID, f"peer access from device {ctx.device} to {p} is not enabled")
    RT.peers.discard((ctx.device, p))
    return C.ACL_SUCCESS


# ----- IPC -----


@_locked
def ipc_mem_get_export_key(dev_ptr: Any, size: Any, length: Any, flags: Any) -> tuple[str, int]:
    """``(key, ret)``: a name another device (or process) imports the memory by. The range must
    be page-table aligned: a small block carved from a larger one fails the check."""
    f = "ipc_mem_get_export_key"
    ptr, n, ln, fl = _k(dev_ptr, f, "dev_ptr"), _k(size, f, "size"), _k(length, f, "len"), _k(flags, f, "flags")
    ctx = RT.current()
    if ctx is None:
        return "", _no_context(f)
    if not _IPC_KEY_LEN <= ln < 1024 or fl not in (0, _IPC_FLAG_DISABLE_PID_VALIDATION) or n == 0:
        return "", RT.fail(C.ACL_ERROR_INVALID_PARAM, f"len must be 65-1023 (got {ln}), flags 0 or 1, size above 0")
    w = _where(ptr, n, "dev_ptr")
    if isinstance(w, int):
        return "", w
    if w[0] != _DEV:
        return "", RT.fail(C.ACL_ERROR_RT_PARAM_INVALID, f"{ptr:#x} is host memory; only device memory is exported")
    dev = RT.sys().device(w[1])
    _, ret = _native(dev._check_range, ptr, n)
    if ret:
        return "", ret
    page, ret = _native(dev.page_of, ptr)
    if ret:
        return "", ret
    if ptr % page:
        return "", RT.fail(
            C.ACL_ERROR_RT_PARAM_INVALID,
            f"{ptr:#x} is not aligned to its {page}-byte page: the allocation was carved from a larger block; "
            "export memory that starts on a page (allocate at least a page, or use the VMM calls)",
        )
    key = f"npumem-ipc-{getpid():x}-{new_handle():x}"
    RT.ipc[key] = IpcKey(w[1], ptr, n, set(), fl == 0)
    return key, C.ACL_SUCCESS


def _key(key: Any, fn: str) -> IpcKey | int:
    if not isinstance(key, str):
        raise TypeError(f"acl.rt.{fn} args parse failed: key must be str, not {type(key).__name__}")
    k = RT.ipc.get(key)
    if k is None:
        return RT.fail(C.ACL_ERROR_RT_PARAM_INVALID, f"IPC key {key!r} is not open")
    return k


@_locked
def ipc_mem_set_import_pid(key: Any, pids: Any) -> int:
    k = _key(key, "ipc_mem_set_import_pid")
    if not isinstance(pids, (list, tuple)):
        raise TypeError(f"acl.rt.ipc_mem_set_import_pid: pids must be a list of ints, not {type(pids).__name__}")
    values = [_i(p, "ipc_mem_set_import_pid", "pid") for p in pids]
    if isinstance(k, int):
        return k
    if not values:
        return RT.fail(C.ACL_ERROR_INVALID_PARAM, "pids is empty")
    k.pids.update(values)
    return C.ACL_SUCCESS


@_locked
def ipc_mem_import_by_key(key: Any, flags: Any) -> tuple[int, int]:
    """``(dev_ptr, ret)``: the exported memory mapped a second time, at a new address of the
    exporter's device (the same physical pages: writes through either address are seen through
    the other; the pages live until this import is closed, even past the exporter's free)."""
    fl = _k(flags, "ipc_mem_import_by_key", "flags")
    k = _key(key, "ipc_mem_import_by_key")
    if isinstance(k, int):
        return 0, k
    ctx = RT.current()
    if ctx is None:
        return 0, _no_context("ipc_mem_import_by_key")
    if fl not in (0, _IPC_IMPORT_ENABLE_PEER_ACCESS):
        return 0, RT.fail(C.ACL_ERROR_INVALID_PARAM, f"flags must be 0 or 1, got {fl}")
    if k.check_pid and getpid() not in k.pids:
        return 0, RT.fail(
            C.ACL_ERROR_RT_NO_PERMISSION,
            f"pid {getpid()} is not on the key's whitelist: the exporter calls acl.rt.ipc_mem_set_import_pid first",
        )
    alias, ret = _native(RT.sys().device(k.device)._map_alias, k.ptr, k.size)
    if ret:
        return 0, ret
    if fl == _IPC_IMPORT_ENABLE_PEER_ACCESS and ctx.device != k.device:
        RT.peers.add((ctx.device, k.device))
    k.imports.append(alias)
    return alias, C.ACL_SUCCESS


@_locked
def ipc_mem_close(key: Any) -> int:
    """Closes one side: the importers first (each close unmaps the latest import), then the
    exporter (the key goes)."""
    k = _key(key, "ipc_mem_close")
    if isinstance(k, int):
        return k
    if k.imports:
        _, ret = _native(RT.sys().device(k.device)._unmap_alias, k.imports[-1])
        if ret == 0:
            k.imports.pop()
        return ret
    del RT.ipc[key]
    return C.ACL_SUCCESS


# The hot calls: plain calls are served natively (npumem._native.AclTables), every other call
# by the checked call given here.
TABLES.set_checked_calls(
    _malloc_checked, _free_checked, _memcpy_checked, _memset_checked, _malloc_host_checked, _free_host_checked
)
malloc = TABLES.malloc
free = TABLES.free
memcpy = TABLES.memcpy
memset = TABLES.memset
malloc_host = TABLES.malloc_host
free_host = TABLES.free_host
