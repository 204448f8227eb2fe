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


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(USAGE, file=sys.stderr if not args else sys.stdout)
        return 0 if args else 2
    script = args[0]
    if not os.path.isfile(script):
        print(f"npumem.run: {script}: no such file", file=sys.stderr)
        return 2
    from . import acl
    from .acl import _config

    try:
        acl.configure(**_config.from_env().__dict__)
    except (_config.ConfigError, TypeError) as e:
        print(f"npumem.run: {e}", file=sys.stderr)
        return 2
    acl.install()
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


if __name__ == "__main__":
    sys.exit(main())
