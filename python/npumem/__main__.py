"""``python -m npumem``: the ``npumem`` command line."""

from .cli import main

raise SystemExit(main())
