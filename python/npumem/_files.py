"""Reading input files: JSON (plain or gzip-compressed) and PyTorch memory-snapshot pickles.

Invariants: a file that cannot be opened raises ``OSError`` (naming the path); a file that can be
opened but is not what the caller reads (not gzip, not UTF-8, not JSON, nested past the parser's
depth, not a pickle, or a pickle that refers to anything but plain data) raises
:class:`npumem.InvalidParamError` naming the path and what was expected. Pickles are read with a
restricted unpickler: no class, function or module named in the file is ever imported or
called, so a crafted file cannot run code.
"""

from __future__ import annotations

import gzip
import json
import os
import pickle
from typing import Any

from . import _args
from .errors import invalid_param


def path_arg(path: Any, name: str = "path") -> str:
    """A file path (str or os.PathLike) as a str."""
    if not isinstance(path, (str, os.PathLike)):
        raise _args.type_error(name, path, "a file path")
    return os.fspath(path)


def read_json(path: Any, what: str) -> Any:
    """The JSON document in ``path`` (gzip-compressed when the name ends in ``.gz``); ``what``
    names the expected content in error messages."""
    name = path_arg(path)
    opener = gzip.open if name.endswith(".gz") else open
    try:
        with opener(name, "rt", encoding="utf-8") as f:
            return json.load(f)
    except gzip.BadGzipFile as e:
        raise invalid_param(f"{name}: not a gzip file ({e}); expected {what}") from None
    except (EOFError, UnicodeDecodeError, ValueError) as e:  # JSONDecodeError is a ValueError
        raise invalid_param(f"{name}: not valid JSON ({e}); expected {what}") from None
    except RecursionError:
        raise invalid_param(f"{name}: JSON nested too deeply to be {what}") from None


#: What a PyTorch memory snapshot is made of (``torch.cuda.memory._dump_snapshot`` pickles a dict
#: of lists, dicts, strings, numbers, booleans, None and tuples); pickles name no other global.
_PLAIN = {("builtins", n) for n in ("dict", "list", "tuple", "str", "int", "float", "bool", "set", "frozenset")}


class _PlainUnpickler(pickle.Unpickler):
    """Loads only plain data: any other class or function the pickle names is refused before it
    is imported, so ``__reduce__`` tricks (``os.system``, ``eval``, ...) never run."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _PLAIN:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(
            f"it refers to {module}.{name}; a memory snapshot holds only dicts, lists, tuples, strings, "
            "numbers, booleans and None, and npumem loads nothing else"
        )

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("it holds persistent ids; a memory snapshot has none")


def read_snapshot(path: Any) -> Any:
    """The object pickled in ``path`` by ``_dump_snapshot``, loaded with :class:`_PlainUnpickler`."""
    name = path_arg(path)
    with open(name, "rb") as f:  # read as it is unpickled: snapshots can be gigabytes
        try:
            return _PlainUnpickler(f).load()
        except (pickle.UnpicklingError, EOFError, ValueError, TypeError, IndexError, KeyError, MemoryError) as e:
            raise invalid_param(f"{name}: not a memory snapshot pickle that npumem loads: {e}") from None
        except RecursionError:
            raise invalid_param(f"{name}: pickle nested too deeply to be a memory snapshot") from None
