"""Reading input files: JSON (plain or gzip-compressed) and PyTorch memory-snapshot pickles.

Invariants: a file that cannot be opened raises ``OSError`` (naming the path); a file that can be
opened but is not what the caller reads (not gzip, not UTF-8, not JSON, nested past the parser's
depth, not a pickle, or a pickle that refers to anything but plain data) raises
:class:`npumem.InvalidParamError` naming the path and what was expected. Pickles are read with a
restricted unpickler: no class, function or module named in the file is ever imported or
called, so a crafted file cannot run code (:mod:`npumem._snapshot_pickle`). What is read is
bounded by the file, never by a size it claims: JSON up to :data:`MAX_JSON_BYTES` decompressed,
text files (configs) up to :data:`MAX_TEXT_BYTES`, CSV lines up to :data:`MAX_CSV_LINE` characters,
so a ``/dev/zero`` or a runaway file is refused, never read whole.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import zlib
from collections.abc import Iterator
from typing import Any

from . import _args, _snapshot_pickle
from .errors import InvalidParamError, invalid_param


def path_arg(path: Any, name: str = "path") -> str:
    """A file path (str or os.PathLike) as a str."""
    if not isinstance(path, (str, os.PathLike)):
        raise _args.type_error(name, path, "a file path")
    return os.fspath(path)


#: The largest JSON document read (decompressed): more would not fit in memory once parsed.
MAX_JSON_BYTES = 1 << 30


def read_json(path: Any, what: str) -> Any:
    """The JSON document in ``path`` (gzip-compressed when the name ends in ``.gz``); ``what``
    names the expected content in error messages. At most :data:`MAX_JSON_BYTES` are read."""
    name = path_arg(path)
    try:
        text = _json_bytes(name, what).decode("utf-8-sig")  # a BOM (Windows tools write one) is not JSON
        return json.loads(text)
    except gzip.BadGzipFile as e:
        raise invalid_param(f"{name}: not a gzip file ({e}); expected {what}") from None
    except (EOFError, UnicodeDecodeError, ValueError, zlib.error) as e:  # JSONDecodeError is a ValueError
        if isinstance(e, InvalidParamError):
            raise
        raise invalid_param(f"{name}: not valid JSON ({e}); expected {what}") from None
    except RecursionError:
        raise invalid_param(f"{name}: JSON nested too deeply to be {what}") from None
    except MemoryError:
        raise invalid_param(f"{name}: too large to parse in this process's memory; expected {what}") from None


_PROBE = 1 << 16


def _read_upto(f: Any, n: int) -> bytes:
    """At most ``n`` more bytes of ``f``, read in chunks (``f.read(n)`` would set aside ``n``
    bytes first, whatever the file holds)."""
    chunks = []
    while n > 0:
        chunk = f.read(min(n, 1 << 24))
        if not chunk:
            break
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def _plausible(head: bytes) -> bool:
    """Whether a JSON document may start with ``head`` (so a ``/dev/zero`` is refused at once)."""
    text = head.removeprefix(b"\xef\xbb\xbf").lstrip()
    return not text or text[:1] in b'{["-0123456789tfn'


def _json_bytes(path: str, what: str) -> bytes:
    """The bytes of the JSON file at ``path`` (decompressed when the name ends in ``.gz``),
    refused when longer than :data:`MAX_JSON_BYTES`, or when its first 64 KiB cannot start a
    JSON document (a ``/dev/zero`` or a decompression bomb is never read whole)."""
    limit = MAX_JSON_BYTES
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read(min(limit + 1, _PROBE))
        if len(data) == _PROBE and not _plausible(data):
            raise invalid_param(f"{path}: not valid JSON (it does not start like a JSON document); expected {what}")
        data += _read_upto(f, limit + 1 - len(data))
    if len(data) > limit:
        raise invalid_param(f"{path}: larger than {_args.bound(limit)} bytes; {what} this large is not read")
    return data


#: The longest line a CSV reader takes (a row of a trace or a plan is a few dozen characters).
MAX_CSV_LINE = 1 << 16


def csv_lines(f: Any, name: str, what: str) -> Iterator[str]:
    """The lines of the text file ``f``, refusing one longer than :data:`MAX_CSV_LINE` before it
    is read whole; ``what`` names the expected content in the error."""
    n = 0
    while True:
        line = f.readline(MAX_CSV_LINE + 1)
        if not line:
            return
        n += 1
        if len(line) > MAX_CSV_LINE:
            raise invalid_param(f"{name}: line {n} is longer than {MAX_CSV_LINE:,} characters; not {what}")
        yield line


#: The largest text file (a config) read whole.
MAX_TEXT_BYTES = 1 << 24


def read_text(path: Any, what: str) -> str:
    """The UTF-8 text of ``path``, at most :data:`MAX_TEXT_BYTES`; ``what`` names the expected
    content in errors."""
    name = path_arg(path)
    with open(name, "rb") as f:
        data = _read_upto(f, MAX_TEXT_BYTES + 1)
    if len(data) > MAX_TEXT_BYTES:
        raise invalid_param(f"{name}: larger than {_args.bound(MAX_TEXT_BYTES)} bytes; not {what}")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise invalid_param(f"{name}: not UTF-8 text ({e}); expected {what}") from None


def sha256(path: str) -> str:
    """The SHA-256 of the file at ``path``, read in chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def read_snapshot(path: Any) -> Any:
    """The object pickled in ``path`` by ``_dump_snapshot``, checked by
    :func:`npumem._snapshot_pickle.check` and loaded with its restricted unpickler."""
    name = path_arg(path)
    with open(name, "rb") as f:
        data = f.read(_snapshot_pickle.PROBE_BYTES)
        if len(data) == _snapshot_pickle.PROBE_BYTES:  # more may follow: first check the start
            try:
                _snapshot_pickle.check(data)
            except _snapshot_pickle.Truncated:
                data += _read_upto(f, _snapshot_pickle.MAX_PICKLE_BYTES + 1 - len(data))
            except Exception as e:
                raise invalid_param(f"{name}: not a memory snapshot pickle that npumem loads: {e}") from None
    if len(data) > _snapshot_pickle.MAX_PICKLE_BYTES:
        limit = _args.bound(_snapshot_pickle.MAX_PICKLE_BYTES)
        raise invalid_param(f"{name}: larger than {limit} bytes; a memory snapshot this large is not read")
    try:
        _snapshot_pickle.check(data)
        return _snapshot_pickle.PlainUnpickler(io.BytesIO(data)).load()
    except RecursionError:
        raise invalid_param(f"{name}: pickle nested too deeply to be a memory snapshot") from None
    except Exception as e:  # whatever the file makes the unpickler raise is the file's fault
        raise invalid_param(f"{name}: not a memory snapshot pickle that npumem loads: {e}") from None
