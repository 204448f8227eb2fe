"""The restricted loader of PyTorch memory-snapshot pickles: plain data only, bounded work.

Rules:

- no class, function or module named in the file is imported or called, but ``set`` and
  ``frozenset`` (what protocols 0-3 pickle sets as): a crafted file cannot run code;
- before anything is built, the opcodes are scanned (:func:`check`) and the file is refused when
  a tuple nests deeper than :data:`MAX_TUPLE_DEPTH`, when a dict key or set element is anything
  but a string, bytes, ``None``, a bool or an int below 2**55 (what can be hashed in bounded
  time without crafted collisions), when a memo index runs ahead of the memo, or when a length
  runs past the end of the file; so loading never recurses without bound in C, never hashes
  without bound, and allocates in proportion to the file, not to a number the file claims;
- a file over :data:`MAX_PICKLE_BYTES` is refused before it is read whole, and a file whose
  first :data:`PROBE_BYTES` are not the start of such a pickle (``/dev/zero``, random bytes) is
  refused after reading only those.

Note [Scanning before loading]: the C unpickler has no hook between opcodes, and what crashes it
or hangs it happens inside one opcode (hashing a tuple nested 10^6 deep overflows the C stack;
a tuple that shares its halves 100 times over takes 2**100 steps to hash). So the opcodes are
walked once, in Rust (``npumem_core::snapshot_pickle``, a linear pass with a model of the
unpickler's stack, without the GIL), then the C unpickler loads the same bytes; the scan costs
a few percent of the load. Lists and dicts may nest and share freely: nothing in npumem walks
them recursively (messages show values through :func:`npumem._args.show`, which is bounded).
"""

from __future__ import annotations

import pickle
from typing import Any

from ._native import scan_snapshot_pickle

#: The deepest tuple a snapshot may hold (PyTorch's hold none); the scan's own bound.
MAX_TUPLE_DEPTH = 100
#: The largest snapshot pickle read (larger ones would not fit in memory once loaded).
MAX_PICKLE_BYTES = 1 << 34
#: What is read and checked before the rest of a file is.
PROBE_BYTES = 1 << 20

#: The globals a pickle may name (``__builtin__``: protocols 0-2 name Python 2's module).
_PLAIN = {(m, n) for m in ("builtins", "__builtin__") for n in ("set", "frozenset")}


class Truncated(pickle.UnpicklingError):
    """The bytes end before the pickle does (a prefix of a pickle raises only this)."""


def check(data: bytes) -> None:
    """Raises ``pickle.UnpicklingError`` (saying why, and at which byte) unless ``data`` is a
    pickle that the rules in the module doc admit; :class:`Truncated` when ``data`` is (as far as
    it goes) the start of one."""
    refusal = scan_snapshot_pickle(bytes(data))
    if refusal is not None:
        truncated, why = refusal
        raise (Truncated if truncated else pickle.UnpicklingError)(why)


def _refers(module: str, name: str) -> str:
    return (
        f"it refers to {module}.{name}; a memory snapshot holds only dicts, lists, tuples, sets, strings, "
        "numbers, booleans and None, and npumem loads nothing else"
    )


class PlainUnpickler(pickle.Unpickler):
    """Loads only plain data: any class or function the pickle names but ``set`` and
    ``frozenset`` is refused before it is imported, so ``__reduce__`` tricks (``os.system``,
    ``eval``, ...) never run."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _PLAIN:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(_refers(module, name))

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("it holds persistent ids; a memory snapshot has none")
