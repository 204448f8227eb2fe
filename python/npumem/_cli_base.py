"""What every ``npumem`` subcommand shares: the exit statuses and the usage error.

- A user's mistake raises :class:`UsageError`: one line on stderr, exit status ``EXIT_USAGE``.
- Subcommand modules (``cli``, ``cli_stress``) import from here, never from each other's
  top level, so the command line has no import cycle.
"""

from __future__ import annotations

import os

EXIT_OK = 0
EXIT_NO = 1
EXIT_USAGE = 2
EXIT_MISSING_DEPENDENCY = 3
EXIT_INTERNAL = 4
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141


class UsageError(Exception):
    """A bad command line or input: reported in one line, exit status 2."""


def _output_path(path: str, option: str) -> str:
    """Checks, before any work, that an output file can be created where asked."""
    folder = os.path.dirname(path) or "."
    if os.path.isdir(path):
        raise UsageError(f"{option} {path!r} is a directory; give a file name")
    if not os.path.isdir(folder):
        raise UsageError(f"{option} {path!r}: the folder {folder!r} does not exist")
    return path
