"""``python -m npumem.run script.py [args...]``: runs a pyACL program on npumem's devices.

For that process only, ``import acl`` resolves to :mod:`npumem.acl`; the system comes from the
``NPUMEM_*`` variables (checked before the script starts: a bad value is a one-line error and
exit status 2). When the script ends without ``acl.finalize()``, the leak and misuse report is
printed then. The script's own exit status is kept.
"""

from __future__ import annotations

import os
import runpy
import sys

USAGE = "usage: python -m npumem.run script.py [args...]"


def usage_status(prog: str, usage: str, args: list[str]) -> int | None:
    """The exit status for a command line that names no script (help or usage, 0 or 2) or a
    missing one (2, one line on stderr); ``None`` when ``args[0]`` is a script to run."""
    if not args or args[0] in ("-h", "--help"):
        print(usage, file=sys.stderr if not args else sys.stdout)
        return 0 if args else 2
    if not os.path.isfile(args[0]):
        why = "not a file" if os.path.exists(args[0]) else "no such file"
        print(f"{prog}: {args[0]}: {why}", file=sys.stderr)
        return 2
    return None


def run_script(args: list[str]) -> int:
    """Runs the script ``args[0]`` as ``__main__`` with ``sys.argv = args`` and its folder first
    on ``sys.path``; returns its exit status (a non-integer ``SystemExit`` is printed, status 1)."""
    script = args[0]
    sys.argv = args
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as e:
        code = e.code
        if code is None or isinstance(code, int):
            return code or 0
        print(code, file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    status = usage_status("npumem.run", USAGE, args)
    if status is not None:
        return status
    from . import acl
    from .acl import _config

    try:
        acl.configure(**_config.from_env().__dict__)
    except (_config.ConfigError, TypeError) as e:
        print(f"npumem.run: {e}", file=sys.stderr)
        return 2
    acl.install()
    return run_script(args)


if __name__ == "__main__":
    sys.exit(main())
