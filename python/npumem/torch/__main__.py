"""``python -m npumem.torch script.py [args...]``: runs a PyTorch program with its ``npu``
device served by npumem.

Rules:
- The device comes from the environment (``NPUMEM_CAPACITY``, ``NPUMEM_ALLOCATOR``,
  ``NPUMEM_ALLOC_CONF`` or ``PYTORCH_NPU_ALLOC_CONF``, ``NPUMEM_DEVICES``, ``NPUMEM_BACKEND``,
  ``NPUMEM_TORCH_MODE``), checked before the script starts: a bad value, a missing torch or a
  name another backend owns is one line on stderr and exit status 2.
- For that process ``import torch_npu`` resolves to a module whose ``npu`` is ``torch.npu``, so
  a torch_npu program runs unmodified. The script's own exit status is kept.
"""

from __future__ import annotations

import sys
import types

from .._optional import MissingDependencyError
from ..run import run_script, usage_status

USAGE = "usage: python -m npumem.torch script.py [args...]"


def stand_in_torch_npu() -> None:
    """Makes ``import torch_npu`` give a module whose ``npu`` is ``torch.npu`` (unless a
    torch_npu module is there already)."""
    import torch

    shim = types.ModuleType("torch_npu", "npumem.torch's stand-in for torch_npu: its npu is torch.npu")
    shim.npu = torch.npu  # type: ignore[attr-defined]
    sys.modules.setdefault("torch_npu", shim)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    status = usage_status("npumem.torch", USAGE, args)
    if status is not None:
        return status
    from . import ConfigError, InstallError, install

    try:
        install()
    except (ConfigError, InstallError, MissingDependencyError, TypeError) as e:
        print(f"npumem.torch: {e}", file=sys.stderr)
        return 2
    stand_in_torch_npu()
    return run_script(args)


if __name__ == "__main__":
    sys.exit(main())
