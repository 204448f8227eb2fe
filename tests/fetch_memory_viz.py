"""Finds PyTorch's memory_viz (``torch/cuda/_memory_viz.py``) for ``make bench B=memory-viz`` and
prints its path: ``NPUMEM_MEMORY_VIZ`` when set, else an installed torch's copy (found without
importing torch), else the copy in the torch wheel on PyPI, downloaded once (``pip download torch
--no-deps``, about 0.5 GiB) into DIR and extracted from it (the module imports nothing from torch
for its commands). Exits 1 with one line saying why when none can be had.

Run: python tests/fetch_memory_viz.py DIR
"""

from __future__ import annotations

import glob
import os
import subprocess
import sys
import zipfile

MEMBER = "torch/cuda/_memory_viz.py"


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    folder = sys.argv[1]
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from test_memory_viz import find_memory_viz

    path, _ = find_memory_viz()
    if path is not None:
        print(path)
        return 0
    out = os.path.join(folder, MEMBER)
    if not os.path.isfile(out):
        wheels = glob.glob(os.path.join(folder, "torch-*.whl"))
        if not wheels:
            print(f"downloading the torch wheel from PyPI into {folder} (once)", file=sys.stderr)
            cmd = [sys.executable, "-m", "pip", "download", "-q", "torch", "--no-deps", "-d", folder]
            if subprocess.run(cmd, check=False).returncode != 0:
                print("check-memory-viz: no torch wheel could be downloaded (is PyPI reachable?)", file=sys.stderr)
                return 1
            wheels = glob.glob(os.path.join(folder, "torch-*.whl"))
        with zipfile.ZipFile(sorted(wheels)[-1]) as z:
            z.extract(MEMBER, folder)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
