"""Optional dependencies (matplotlib for plots, torch for model graphs, Dask and pyarrow for
sweeps, hypothesis for npumem.testing): imported only when a function needs one, and a missing one is a
:class:`MissingDependencyError` whose message is the one-line install hint. Nothing else of
npumem needs them."""

from __future__ import annotations

import importlib
from types import ModuleType


class MissingDependencyError(ImportError):
    """An optional dependency is not installed; ``str(e)`` says which and how to install it."""


#: Optional module -> the extra of the npumem package that installs it.
EXTRAS = {
    "matplotlib": "plot",
    "torch": "torch",
    "distributed": "sweep",
    "pyarrow": "sweep",
    "tomli": "sweep",
    "hypothesis": "testing",
}


def require(module: str, purpose: str) -> ModuleType:
    """Imports ``module`` or raises :class:`MissingDependencyError` naming ``purpose``."""
    top = module.split(".")[0]
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name is None or e.name.split(".")[0] != top:
            raise  # installed, but something it imports is missing: not ours to explain
        extra = EXTRAS.get(top)
        how = f"pip install 'npumem[{extra}]' (or pip install {top})" if extra else f"pip install {top}"
        raise MissingDependencyError(f"{purpose} needs {top}, which is not installed: {how}") from e
