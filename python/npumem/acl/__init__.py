"""``npumem.acl``: a pyACL-compatible layer (``import acl``) over npumem's simulated devices.

A pyACL program runs on npumem with one line changed (``import npumem.acl as acl``), or none
(``npumem.acl.install()``; ``python -m npumem.run script.py ...``). The calls keep pyACL's shapes:
``(value..., ret)`` tuples and bare ``ret`` codes; runtime errors are codes, only wrong argument
types raise. The devices are a process-wide system: ``NPUMEM_DEVICES`` (default 8, each made on
first use), ``NPUMEM_CAPACITY``, ``NPUMEM_BACKEND``, ``NPUMEM_ALLOCATOR``, ``NPUMEM_ALLOC_CONF``, or
:func:`configure`. All devices share one address space: a pointer names its device.

``acl.finalize()`` (or the end of the process, if the program never finalizes) prints the leak
and misuse report to stderr when there is something to report: allocations never freed with the
line that made them, streams never destroyed, host buffers freed under queued copies, ... —
:func:`report` returns it as a dict.
"""

from __future__ import annotations

import atexit
import json
import re
import sys
from typing import Any

from . import _config, codes, media, rt, util
from ._config import ConfigError
from ._runtime import LOCK, RT

__all__ = [
    "ConfigError",
    "codes",
    "configure",
    "finalize",
    "format_report",
    "get_recent_err_msg",
    "get_soc_name",
    "init",
    "install",
    "media",
    "report",
    "rt",
    "uninstall",
    "util",
]

_atexit_registered = False


def _device_number(raw: Any) -> int:
    """A config's ``default_device``: an int, or a string of one (as pyACL's configs write it)."""
    if isinstance(raw, bool) or not isinstance(raw, (int, str)):
        raise ValueError(f'defaultDevice.default_device is {raw!r}; give a device number such as "0"')
    if isinstance(raw, str) and not (raw.strip().isascii() and raw.strip().isdigit() and len(raw.strip()) <= 9):
        raise ValueError(f'defaultDevice.default_device is {raw!r}; give a device number such as "0"')
    return int(raw)


def init(config_path: Any = None) -> int:
    """``aclInit``: 0, or 100002 (ACL_ERROR_REPEAT_INITIALIZE) when already initialised. A JSON
    config may name a default device (``{"defaultDevice": {"default_device": "0"}}``)."""
    global _atexit_registered
    if config_path is not None and not isinstance(config_path, str):
        raise TypeError(f"acl.init args parse failed: config_path must be str, not {type(config_path).__name__}")
    with LOCK:
        if RT.initialized:
            return RT.fail(codes.ACL_ERROR_REPEAT_INITIALIZE, "acl.init was called already (harmless)")
        default = None
        if config_path:
            try:
                with open(config_path, encoding="utf-8") as f:
                    text = f.read()
                conf = json.loads(text) if text.strip() else {}
                raw = conf.get("defaultDevice", {}).get("default_device") if isinstance(conf, dict) else None
                default = None if raw is None else _device_number(raw)
            except (OSError, ValueError, AttributeError, RecursionError) as e:
                return RT.fail(codes.ACL_ERROR_INVALID_PARAM, f"acl.init({config_path!r}): {e}")
            if default is not None and not RT.valid_device(default):
                return RT.fail(codes.ACL_ERROR_INVALID_PARAM, f"default_device {default} does not exist")
        RT.sys()
        RT.default_device = default
        RT.initialized = True
        if not _atexit_registered:
            atexit.register(_at_exit)
            _atexit_registered = True
    return codes.ACL_SUCCESS


def finalize() -> int:
    """``aclFinalize``: reports leaks and misuse (stderr, when any), then releases every device;
    100037 (ACL_ERROR_REPEAT_FINALIZE) when not initialised."""
    with LOCK:
        if not RT.initialized:
            return RT.fail(codes.ACL_ERROR_REPEAT_FINALIZE, "acl.finalize without acl.init")
        _finish()
    return codes.ACL_SUCCESS


def _finish() -> None:
    found = report()
    RT.last_report = found
    if _has_findings(found):
        print(format_report(found), file=sys.stderr)
    RT.initialized = False
    RT.default_device = None
    RT.shutdown()


def _at_exit() -> None:
    with LOCK:
        if RT.initialized:
            _finish()


def get_recent_err_msg() -> str:
    """The message of this thread's latest error code (``aclGetRecentErrMsg``)."""
    return RT.thread.error


def get_soc_name() -> str:
    return "Ascend910B (npumem simulator)"


def configure(
    devices: int | None = None,
    capacity: int | str | None = None,
    backend: str | None = None,
    allocator: str | None = None,
    alloc_conf: str | None = None,
) -> None:
    """Sets the process-wide system (before the first ``acl.rt`` call, or after
    ``acl.finalize()``); what is not given comes from the environment's defaults."""
    config = _config.make(devices, capacity, backend, allocator, alloc_conf)
    with LOCK:
        RT.configure(config)


def install() -> None:
    """Makes ``import acl`` (and ``acl.rt``, ``acl.util``, ``acl.media``) resolve to this module
    for the rest of the process."""
    me = sys.modules[__name__]
    sys.modules["acl"] = me
    for sub in ("rt", "util", "media"):
        sys.modules[f"acl.{sub}"] = getattr(me, sub)


def uninstall() -> None:
    """Undoes :func:`install`."""
    for name in ("acl", "acl.rt", "acl.util", "acl.media"):
        if sys.modules.get(name) in (sys.modules[__name__], rt, util, media):
            del sys.modules[name]


# ----- the leak and misuse report -----


def report() -> dict[str, Any]:
    """What the program left behind and what it did wrong so far: ``allocations`` (device memory
    never freed, with the ``site`` that allocated it), ``host_blocks``, ``contexts`` (made by
    create_context), ``streams``, ``events``,
    ``reservations``, ``physical`` handles and ``ipc_keys`` still open, ``kind_mismatches`` (copies
    whose kind the addresses contradict: legal, counted), and ``misuse`` (the
    sanitizer's findings on every device, e.g. a host buffer freed while a queued copy reads it,
    and the layer's own, e.g. memory freed while exported)."""
    with LOCK:
        out: dict[str, Any] = {
            "allocations": [
                {"ptr": p, "size": a.size, "device": a.device, "api": a.api, "site": a.site}
                for p, a in sorted(RT.allocs.items())
            ],
            "host_blocks": [{"ptr": p, "size": b.size, "site": b.site} for p, b in sorted(RT.host_blocks.items())],
            "contexts": [{"context": h, "device": c.device} for h, c in sorted(RT.contexts.items()) if not c.default],
            "streams": [{"stream": h, "device": s.device, "site": s.site} for h, s in sorted(RT.streams.items())],
            "events": [{"event": h, "device": e.device, "site": e.site} for h, e in sorted(RT.events.items())],
            "reservations": [
                {"ptr": va, "device": d, "site": site} for va, (d, site) in sorted(RT.reservations.items())
            ],
            "physical": [{"handle": h, "device": d, "site": site} for h, (d, _, site) in sorted(RT.physical.items())],
            "ipc_keys": sorted(RT.ipc),
            "misuse": list(RT.misuse),
            "kind_mismatches": RT.kind_mismatches,
        }
        if RT.system is not None:
            for index, dev in RT.system.created():
                for f in dev.sanitizer_reports():
                    if f.kind != "kind_mismatch":  # counted above, on every path alike
                        out["misuse"].append(_describe(index, f))
        return out


def _stream_name(device: int, native: int) -> str:
    """A stream as the program knows it: its handle, the default stream, or the queue of the
    other sides of cross-device copies."""
    if native == 0:
        return "the default stream"
    handle = RT.stream_names.get((device, native))
    if handle is not None:
        return f"stream {handle:#x}"
    if RT.system is not None and RT.system.peer_streams.get(device) == native:
        return "a cross-device copy"
    return f"stream {native}"


def _describe(index: int, f: Any) -> str:
    """A sanitizer finding of device ``index`` in the program's terms (its stream handles, the
    call site of the memory)."""
    base = f.allocation if f.allocation is not None else f.addr
    site = f.tag or (RT.allocs[base].site if base in RT.allocs else RT.freed_sites.get(base))
    where = f" (allocated at {site})" if site else ""
    users = [_stream_name(index, s) for s in f.streams if s >= 0]
    if f.kind == "use_after_free" and "frees the memory" in f.message:
        host = RT.system is None or RT.system.locate(f.addr) is None
        what = "malloc_host block" if host else "device memory"
        return (
            f"device {index}: use_after_free: the {what} at {f.addr:#x}{where} was freed while "
            f"{' and '.join(users) or 'queued work'} still used it; synchronize that stream (or an event "
            "recorded after the work) before freeing"
        )
    message = re.sub(r"stream (\d+)", lambda m: _stream_name(index, int(m[1])), f.message)
    return f"device {index}: {f.kind}{where}: {message}"


def _has_findings(found: dict[str, Any]) -> bool:
    """Whether the report is worth printing: a kind the addresses contradict is legal (the
    runtime ignores the kind), so that count alone is not."""
    return any(found[k] for k in found if k != "kind_mismatches")


def format_report(found: dict[str, Any]) -> str:
    """The report as text, one finding a line."""
    lines = ["npumem.acl: leak and misuse report"]
    for a in found["allocations"]:
        lines.append(
            f"  leak: {a['size']} bytes of device {a['device']} at {a['ptr']:#x} ({a['api']}) from {a['site']}"
        )
    for b in found["host_blocks"]:
        lines.append(f"  leak: {b['size']} bytes of malloc_host memory at {b['ptr']:#x} from {b['site']}")
    for c in found["contexts"]:
        lines.append(f"  context {c['context']:#x} of device {c['device']} never destroyed")
    for s in found["streams"]:
        lines.append(f"  stream {s['stream']:#x} of device {s['device']} never destroyed (created at {s['site']})")
    for e in found["events"]:
        lines.append(f"  event {e['event']:#x} of device {e['device']} never destroyed (created at {e['site']})")
    for r in found["reservations"]:
        lines.append(f"  VA reservation {r['ptr']:#x} of device {r['device']} never released (from {r['site']})")
    for p in found["physical"]:
        lines.append(f"  physical handle {p['handle']:#x} of device {p['device']} never freed (from {p['site']})")
    for k in found["ipc_keys"]:
        lines.append(f"  IPC key {k} never closed")
    for m in found["misuse"]:
        lines.append(f"  misuse: {m}")
    if found["kind_mismatches"]:
        lines.append(
            f"  note: {found['kind_mismatches']} copies named a kind their addresses contradict "
            "(the runtime ignores the kind and goes by the addresses)"
        )
    if len(lines) == 1:
        lines.append("  nothing to report")
    return "\n".join(lines)
