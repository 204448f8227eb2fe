"""``npumem fit [--capacity 64GiB] [options] script.py [args...]``: does this PyTorch program fit
an NPU of this size?

Runs the script in this process with its ``npu`` device served by npumem (host mode: real
memory, PyTorch's CPU kernels; shape mode: a simulated device, ops compute shapes only, so a
model far larger than the machine takes its step in seconds) and answers "fits: peak reserved X of Y, peak allocated Z,
fragmentation F" (exit 0) or "does not fit: out of memory at file:line, tried to allocate S with
R reserved" (exit 1), the line being the user's own frame, not PyTorch's or npumem's.

Rules:
- Options come before the script; everything after it is the script's. They are checked
  before torch is imported or the script starts: a bad one is one line and exit status 2.
- With ``--devices N`` the answer names each device's peaks (``devices`` in ``--json``), and
  out of memory on any device does not fit, naming the device that ran out; the top-level
  figures of ``--json`` are npu:0's. ``--snapshot`` holds every device (one pickle in PyTorch's
  format, each segment tagged with its device, ``device_traces[i]`` for npu:i).
- The script sees ``sys.argv`` as ``[script, args...]`` and ``import torch_npu`` resolves to
  npumem's stand-in, as under ``python -m npumem.torch``. An exception of the script's own (not
  out of memory) is its traceback and exit status 2; its ``sys.exit(n)`` with ``n`` not 0 is
  exit status 2 too, since the run did not finish. A read of values in shape mode
  (:class:`~npumem.torch.ShapeModeError`) is one line naming the script's line and the op, exit
  status 2.
- ``--snapshot`` and ``--plot`` are written whatever the answer (memory history is recorded from
  the start); a plot asked for without matplotlib is a hint and exit status 3, after the answer.
- While the script runs, a progress line on stderr (:mod:`.timeline`).
"""

from __future__ import annotations

import argparse
import json
import os
import runpy
import sys
import traceback
from typing import Any

from .._cli_base import EXIT_MISSING_DEPENDENCY, EXIT_NO, EXIT_OK, EXIT_USAGE, UsageError, _output_path
from .._optional import MissingDependencyError


def add_parser(sub: Any) -> None:
    """Adds ``fit`` to the ``npumem`` subcommands."""
    f = sub.add_parser(
        "fit",
        help="run a PyTorch script on an npu device of a given size: does it fit?",
        description="Runs the script with its npu device served by npumem (host mode: real memory, PyTorch's "
        "CPU kernels; shape mode: simulated memory, ops compute shapes only) and says whether it fits: peak "
        "reserved and allocated, or where it ran out of memory.",
        epilog="Exit status: 0 fits, 1 does not fit, 2 a bad option or the script failed for another reason, "
        "3 --plot without matplotlib.",
    )
    f.add_argument("script", help="the PyTorch program (run as __main__)")
    f.add_argument("script_args", nargs=argparse.REMAINDER, help="its arguments (everything after the script)")
    f.add_argument("--capacity", default="64GiB", help="the device's memory (default 64GiB)")
    f.add_argument("--allocator", default="torch_npu", help="torch_npu (default), pytorch, npumem, direct")
    f.add_argument("--alloc-conf", default=None, help="PYTORCH_NPU_ALLOC_CONF-style settings (default: the variable)")
    f.add_argument(
        "--mode",
        default="host",
        help="host (default: real memory, CPU kernels) or shape (simulated memory, shapes only)",
    )
    f.add_argument("--devices", default="1", help="number of devices, npu:0 .. npu:N-1 (default 1)")
    f.add_argument("--snapshot", default=None, help="write the memory snapshot (memory_viz's pickle) here")
    f.add_argument("--plot", default=None, help="draw each device's allocated and reserved memory here (a PNG)")
    f.add_argument("--json", action="store_true", help="print the answer as one JSON object")
    f.set_defaults(run=run)


def _user_frame(tb: Any, script: str, shown: str) -> tuple[str, int]:
    """The innermost frame of the script itself (named ``shown``, as the command line gave it),
    else the innermost outside torch and npumem."""
    frames = traceback.extract_tb(tb)
    for fr in reversed(frames):
        if os.path.abspath(fr.filename) == script:
            return shown, fr.lineno or 0
    skip = (os.sep + "torch" + os.sep, os.sep + "npumem" + os.sep)
    for fr in reversed(frames):
        if not any(s in fr.filename for s in skip):
            return fr.filename, fr.lineno or 0
    last = frames[-1]
    return last.filename, last.lineno or 0


def run(args: Any) -> int:
    from . import ConfigError, InstallError, ShapeModeError, install
    from .__main__ import stand_in_torch_npu
    from .settings import resolve

    script = os.path.abspath(args.script)
    if not os.path.isfile(script):
        raise UsageError(f"{args.script}: {'not a file' if os.path.exists(script) else 'no such file'}")
    if args.snapshot:
        _output_path(args.snapshot, "--snapshot")
    if args.plot:
        _output_path(args.plot, "--plot")
    try:
        settings = resolve(args.capacity, args.allocator, args.alloc_conf, args.mode, args.devices)
    except (ConfigError, TypeError) as e:
        message = str(e)
        for name in ("capacity", "allocator", "alloc_conf", "mode", "devices"):
            message = message.replace(f"{name}=", f"--{name.replace('_', '-')} ")
        raise UsageError(message) from None
    try:
        install(settings.capacity, settings.allocator, settings.alloc_conf, settings.mode, settings.devices)
    except InstallError as e:
        raise UsageError(str(e)) from None
    import torch

    from . import runtime, timeline

    dev = runtime.device(0)
    for d in runtime.get().devices:
        d.record_memory_history(True)
    count = settings.devices
    stand_in_torch_npu()
    where = "npu:0" if count == 1 else f"npu:0..npu:{count - 1}, each"
    print(
        f"npumem fit: running {args.script} on {where} ({_gib(dev.capacity)}, {dev.allocator} allocator)",
        file=sys.stderr,
    )
    oom: dict[str, Any] | None = None
    saved_argv, saved_path = sys.argv, list(sys.path)
    sys.argv = [args.script, *args.script_args]
    sys.path.insert(0, os.path.dirname(script))
    progress = timeline.Progress(runtime.get().devices)
    progress.begin()
    try:
        runpy.run_path(script, run_name="__main__")
    except torch.OutOfMemoryError as e:
        file, line = _user_frame(e.__traceback__, script, args.script)
        tried, reserved, index = runtime.LAST_OOM or (0, dev.memory_reserved(), 0)
        oom = {"file": file, "line": line, "tried_to_allocate": tried, "reserved": reserved, "device": index}
    except ShapeModeError as e:  # the script read a value in shape mode: where, in one line
        file, line = _user_frame(e.__traceback__, script, args.script)
        print(f"npumem fit: {file}:{line}: {e}", file=sys.stderr)
        return EXIT_USAGE
    except SystemExit as e:
        if e.code not in (None, 0):
            print(f"npumem fit: {args.script} exited with status {e.code!r} before finishing", file=sys.stderr)
            return EXIT_USAGE
    except Exception:
        traceback.print_exc()
        print(f"npumem fit: {args.script} failed (its traceback above); no answer", file=sys.stderr)
        return EXIT_USAGE
    finally:
        progress.stop()
        sys.argv, sys.path[:] = saved_argv, saved_path
    if args.snapshot:
        from .snapshot import dump

        dump(args.snapshot)
    missing = None
    if args.plot:
        try:
            title = f"npumem fit {os.path.basename(args.script)} ({dev.allocator} allocator, {settings.mode} mode)"
            timeline.plot(runtime.get().devices, args.plot, title, None if oom is None else oom["device"])
        except MissingDependencyError as e:
            missing = f"npumem fit: no plot: {e}"
    frag = dev.fragmentation()
    answer = {
        "fits": oom is None,
        "capacity": dev.capacity,
        "peak_reserved": dev.max_memory_reserved(),
        "peak_allocated": dev.max_memory_allocated(),
        "fragmentation": frag["external"],
        "allocator": dev.allocator,
        "alloc_conf": dev.alloc_conf,
        "out_of_memory": oom,
        "devices": [
            {
                "device": f"npu:{i}",
                "peak_reserved": d.max_memory_reserved(),
                "peak_allocated": d.max_memory_allocated(),
                "fragmentation": d.fragmentation()["external"],
                "out_of_memory": oom is not None and oom["device"] == i,
            }
            for i, d in enumerate(runtime.get().devices)
        ],
    }
    if args.json:
        print(json.dumps(answer))
    elif oom is None:
        peaks = f"peak reserved {_gib(answer['peak_reserved'])} of {_gib(dev.capacity)}, peak allocated "
        peaks += f"{_gib(answer['peak_allocated'])}"
        print(
            f"fits: {peaks}{' on npu:0' if count > 1 else ''}, fragmentation {frag['external']:.1%} of the free "
            f"reserved memory at the end{_others(answer['devices'], skip=0)}"
        )
    else:
        on = f" on npu:{oom['device']}" if count > 1 else ""
        print(
            f"does not fit: out of memory{on} at {oom['file']}:{oom['line']}, tried to allocate "
            f"{_gib(oom['tried_to_allocate'])} with {_gib(oom['reserved'])} reserved (of {_gib(dev.capacity)})"
            f"{_others(answer['devices'], skip=None)}"
        )
    if missing:
        print(missing, file=sys.stderr)
        return EXIT_MISSING_DEPENDENCY
    return EXIT_OK if oom is None else EXIT_NO


def _others(devices: list[dict[str, Any]], skip: int | None) -> str:
    """Each device's peaks but ``skip``'s, for the answer's line (nothing with one device)."""
    if len(devices) == 1:
        return ""
    return "".join(
        f"; {d['device']} peak reserved {_gib(d['peak_reserved'])}, peak allocated {_gib(d['peak_allocated'])}"
        for i, d in enumerate(devices)
        if i != skip
    )


def _gib(n: int) -> str:
    from .oom import format_size

    return format_size(n)
