"""The ``npumem`` command line: ``npumem demo`` runs the main job on the simulated device."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from . import demo


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="npumem", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    d = sub.add_parser("demo", help="page mix per policy and the fragmentation story, on the simulated device")
    d.add_argument("--capacity", default="1GiB", help="device size for the fragmentation story (default 1GiB)")
    d.add_argument("--seed", type=int, default=7, help="seed of the allocation churn (default 7)")
    args = parser.parse_args(argv)
    if args.command == "demo":
        demo.run(capacity=args.capacity, seed=args.seed, out=sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
