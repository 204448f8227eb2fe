"""An independent model of the snapshot-pickle admission scan, in Python: the oracle that
tests/test_snapshot_pickle.py holds ``npumem_core::snapshot_pickle`` (what
:func:`npumem._snapshot_pickle.check` calls) against, opcode for opcode and message for message.

It walks the opcodes with a model of the unpickler's stack that keeps, for each item, only what
the rules of ``npumem._snapshot_pickle`` need (a hash-safe atom, another atom, a tuple's depth, a
list's hash-safety). :func:`check` raises ``pickle.UnpicklingError`` (:class:`Truncated` when the
bytes end first) or returns None.
"""

from __future__ import annotations

import pickle
import pickletools
from typing import Any

from npumem._snapshot_pickle import _PLAIN, MAX_TUPLE_DEPTH, Truncated, _refers

# Records of the stack model: a hash-safe atom, any other atom, a tuple (depth, the lists it
# holds, or None when it holds anything else that is not hash-safe), a list [hash-safe so far].
_SAFE, _OTHER = 0, 1
_MARK = object()

# The argument of each opcode: 0 none, n > 0 fixed bytes, -1 to a newline, -2 twice to a
# newline (GLOBAL, INST), or -(10 + k): a k-byte little-endian length, then that many bytes.
_ARG: dict[int, int] = {}
for _op in pickletools.opcodes:
    _n = _op.arg.n if _op.arg is not None else 0
    if _op.name in ("GLOBAL", "INST"):
        _n = -2
    elif _n == pickletools.TAKEN_FROM_ARGUMENT1:
        _n = -11
    elif _n in (pickletools.TAKEN_FROM_ARGUMENT4, pickletools.TAKEN_FROM_ARGUMENT4U):
        _n = -14
    elif _n == pickletools.TAKEN_FROM_ARGUMENT8U:
        _n = -18
    elif _n == pickletools.UP_TO_NEWLINE:
        _n = -1
    _ARG[_op.code.encode("latin-1")[0]] = _n
_OP = {o.name: o.code.encode("latin-1")[0] for o in pickletools.opcodes}

_OTHER_PUSH = {_OP[n] for n in ("LONG", "LONG4", "FLOAT", "BINFLOAT", "BYTEARRAY8", "GLOBAL")}
#: Text atoms of protocol 0, hash-safe (the str of STRING and UNICODE hashes randomised).
_TEXT_PUSH = {_OP[n] for n in ("STRING", "UNICODE")}
_REFUSED = {
    _OP[n]: why
    for n, why in (
        ("NEXT_BUFFER", "out-of-band buffers"),
        ("READONLY_BUFFER", "out-of-band buffers"),
        ("PERSID", "persistent ids"),
        ("BINPERSID", "persistent ids"),
        ("EXT1", "extension codes"),
        ("EXT2", "extension codes"),
        ("EXT4", "extension codes"),
        ("BUILD", "object state (BUILD)"),
        ("INST", "instances (INST)"),
        ("OBJ", "instances (OBJ)"),
        ("NEWOBJ", "instances (NEWOBJ)"),
        ("NEWOBJ_EX", "instances (NEWOBJ_EX)"),
    )
}


def _refuse(why: str, pos: int) -> pickle.UnpicklingError:
    return pickle.UnpicklingError(f"{why} (at byte {pos})")


def _truncated(why: str, pos: int) -> Truncated:
    return Truncated(f"{why} (at byte {pos})")


def _tuple(items: list[Any], pos: int) -> tuple[int, tuple[list[bool], ...] | None]:
    depth, lists = 1, []
    for r in items:
        if type(r) is tuple:
            depth = max(depth, r[0] + 1)
            lists = None
        elif type(r) is list:
            if lists is not None:
                lists.append(r)
        elif r != _SAFE:
            lists = None
    if depth > MAX_TUPLE_DEPTH:
        raise _refuse(f"a tuple nested more than {MAX_TUPLE_DEPTH} deep", pos)
    return depth, None if lists is None else tuple(lists)


def _hashed(items: Any, pos: int) -> None:
    for r in items:
        if type(r) is not int or r != _SAFE:
            raise _refuse(
                "a dict key or set element that is not a string, bytes, None, a bool or an int below 2**55", pos
            )


def check(data: bytes) -> None:
    """Raises ``pickle.UnpicklingError`` (saying why, and at which byte) unless ``data`` is a
    pickle that the rules in the module doc admit; :class:`Truncated` when ``data`` is (as far as
    it goes) the start of one."""
    _check(data)


def _check(data: bytes) -> None:
    n = len(data)
    stack: list[Any] = []
    push = stack.append
    marks: list[int] = []
    memo: dict[int, Any] = {}
    pos = 0
    arg = b""
    fast, prefix = _FAST, _PREFIX
    try:
        while True:
            if pos >= n:
                raise _truncated("the pickle ends before its STOP opcode", pos)
            op = data[pos]
            at = pos
            pos += 1
            # The most common opcodes first, each with its argument skipped in place.
            skip = fast[op]
            if skip >= 0:  # a hash-safe atom with a fixed-size argument
                pos += skip
                push(_SAFE)
                continue
            k = prefix[op]
            if k:  # a hash-safe atom: a string or bytes with a k-byte length
                length = int.from_bytes(data[pos : pos + k], "little", signed=op == _BINSTRING)
                pos += k + length
                if length < 0:
                    raise _refuse(f"a length of {length:,} bytes", at)
                if pos > n:
                    raise _truncated(f"a length of {length:,} bytes runs past the end of the file", at)
                push(_SAFE)
                continue
            if op == _BINGET or op == _LONG_BINGET:
                if op == _BINGET:
                    idx = data[pos]
                    pos += 1
                else:
                    idx = int.from_bytes(data[pos : pos + 4], "little")
                    pos += 4
                r = memo.get(idx, memo)
                if r is memo:
                    raise _refuse(f"memo index {idx} is read before it is written", at)
                push(r)
                continue
            if op == _MEMOIZE:
                memo[len(memo)] = stack[-1]
                continue
            if op == _MARK:
                marks.append(len(stack))
                continue
            if op == _SETITEMS:
                m = marks.pop()
                items = stack[m:]
                del stack[m:]
                if len(items) % 2:
                    raise _refuse("a dict's items are not key-value pairs", at)
                for r in items[0::2]:
                    if r is not _SAFE:
                        _hashed((r,), at)
                continue
            if op == _EMPTY_DICT:
                push(_OTHER)
                continue
            if op == _EMPTY_LIST:
                push([True])
                continue
            if op == _APPENDS:
                m = marks.pop()
                items = stack[m:]
                del stack[m:]
                target = stack[-1]
                if type(target) is list and target[0]:
                    target[0] = all(r is _SAFE for r in items)
                continue
            if op == _LONG1:
                length = data[pos] if pos < n else 0
                pos += 1 + length
                push(_SAFE if length <= 7 else _OTHER)
                continue
            if op == _FRAME:
                pos += 8
                continue
            # The rest, with their arguments parsed generically.
            a = _ARG.get(op)
            if a is None:
                raise _refuse(f"byte {op:#04x} is not a pickle opcode", at)
            if a > 0:
                arg = data[pos : pos + a]
                pos += a
            elif a == -1 or a == -2:
                lines = []
                for _ in range(-a):
                    nl = data.find(b"\n", pos)
                    if nl < 0:
                        raise _truncated("the pickle ends inside an opcode's argument", at)
                    lines.append(data[pos:nl])
                    pos = nl + 1
                arg = lines[-1]
                if op == _GLOBAL:
                    module, name = (x.decode("utf-8", "replace") for x in lines)
                    if (module, name) not in _PLAIN:
                        raise pickle.UnpicklingError(_refers(module, name))
            elif a < 0:
                k = -a - 10
                length = int.from_bytes(data[pos : pos + k], "little", signed=k == 4 and op in _SIGNED4)
                pos += k
                if length < 0:
                    raise _refuse(f"a length of {length:,} bytes", at)
                if pos + length > n:
                    raise _truncated(f"a length of {length:,} bytes runs past the end of the file", at)
                arg = data[pos : pos + length]
                pos += length
            if pos > n:
                raise _truncated("the pickle ends inside an opcode's argument", at)
            if op == _GET:
                idx = int(arg)
                if idx not in memo:
                    raise _refuse(f"memo index {idx} is read before it is written", at)
                push(memo[idx])
            elif op == _BINPUT or op == _LONG_BINPUT or op == _PUT:
                idx = int(arg) if op == _PUT else int.from_bytes(arg, "little")
                if idx < 0 or idx > len(memo):
                    raise _refuse(f"memo index {idx} is written with {len(memo)} entries in the memo", at)
                memo[idx] = stack[-1]
            elif op == _DICT:
                m = marks.pop()
                items = stack[m:]
                del stack[m:]
                if len(items) % 2:
                    raise _refuse("a dict's items are not key-value pairs", at)
                _hashed(items[0::2], at)
                push(_OTHER)
            elif op in _OTHER_PUSH:
                push(_OTHER)
            elif op in _TEXT_PUSH:
                push(_SAFE)
            elif op == _INT:
                push(_SAFE if len(arg) <= 16 else _OTHER)
            elif op == _TUPLE1 or op == _TUPLE2 or op == _TUPLE3:
                k = 1 if op == _TUPLE1 else 2 if op == _TUPLE2 else 3
                items = stack[-k:]
                if len(items) != k:
                    raise _refuse("a tuple of more items than the stack holds", at)
                del stack[-k:]
                push(_tuple(items, at))
            elif op == _TUPLE or op == _LIST or op == _FROZENSET or op == _POP_MARK:
                m = marks.pop()
                items = stack[m:]
                del stack[m:]
                if op == _TUPLE:
                    push(_tuple(items, at))
                elif op == _LIST:
                    push([all(r is _SAFE for r in items)])
                elif op == _FROZENSET:
                    _hashed(items, at)
                    push(_OTHER)
            elif op == _EMPTY_TUPLE:
                push((1, ()))
            elif op == _SETITEM:
                _hashed(stack[-2:-1], at)
                del stack[-2:]
            elif op == _APPEND:
                item = stack.pop()
                target = stack[-1]
                if type(target) is list and target[0]:
                    target[0] = item is _SAFE
            elif op == _EMPTY_SET:
                push(_OTHER)
            elif op == _ADDITEMS:
                m = marks.pop()
                _hashed(stack[m:], at)
                del stack[m:]
            elif op == _REDUCE:
                args = stack.pop()
                stack.pop()
                # set(x) / frozenset(x) hash the items of x: a tuple of hash-safe atoms or lists.
                if type(args) is not tuple or args[1] is None or not all(lst[0] for lst in args[1]):
                    raise _refuse("a set (a call of set or frozenset) of items that are not all hash-safe", at)
                push(_OTHER)
            elif op == _STACK_GLOBAL:
                del stack[-2:]
                push(_OTHER)
            elif op == _POP:
                if stack and (not marks or marks[-1] < len(stack)):
                    stack.pop()
                else:
                    marks.pop()
            elif op == _DUP:
                push(stack[-1])
            elif op == _PROTO:
                pass
            elif op == _STOP:
                if len(stack) != 1 or marks:
                    raise _refuse("the pickle stops with a malformed stack", at)
                return
            elif op in _REFUSED:
                raise _refuse(f"it holds {_REFUSED[op]}; a memory snapshot has none", at)
            else:  # pragma: no cover - every opcode is handled above
                raise _refuse(f"opcode {op:#04x} is not expected in a memory snapshot", at)
    except IndexError:
        if pos >= n:  # an argument read past the end
            raise _truncated("the pickle ends inside an opcode's argument", pos) from None
        raise _refuse("an opcode takes more items than the pickle's stack holds", pos) from None
    except ValueError:
        raise _refuse("a malformed opcode argument", pos) from None


_SIGNED4 = {_OP["LONG4"], _OP["BINSTRING"]}
# The opcodes the scan tells apart (their byte values).
_BINSTRING = pickle.BINSTRING[0]
_MEMOIZE = pickle.MEMOIZE[0]
_BINGET = pickle.BINGET[0]
_LONG_BINGET = pickle.LONG_BINGET[0]
_MARK = pickle.MARK[0]
_SETITEMS = pickle.SETITEMS[0]
_EMPTY_DICT = pickle.EMPTY_DICT[0]
_EMPTY_LIST = pickle.EMPTY_LIST[0]
_APPENDS = pickle.APPENDS[0]
_LONG1 = pickle.LONG1[0]
_FRAME = pickle.FRAME[0]
_GLOBAL = pickle.GLOBAL[0]
_GET = pickle.GET[0]
_BINPUT = pickle.BINPUT[0]
_LONG_BINPUT = pickle.LONG_BINPUT[0]
_PUT = pickle.PUT[0]
_DICT = pickle.DICT[0]
_INT = pickle.INT[0]
_TUPLE1 = pickle.TUPLE1[0]
_TUPLE2 = pickle.TUPLE2[0]
_TUPLE3 = pickle.TUPLE3[0]
_TUPLE = pickle.TUPLE[0]
_LIST = pickle.LIST[0]
_FROZENSET = pickle.FROZENSET[0]
_POP_MARK = pickle.POP_MARK[0]
_EMPTY_TUPLE = pickle.EMPTY_TUPLE[0]
_SETITEM = pickle.SETITEM[0]
_APPEND = pickle.APPEND[0]
_EMPTY_SET = pickle.EMPTY_SET[0]
_ADDITEMS = pickle.ADDITEMS[0]
_REDUCE = pickle.REDUCE[0]
_STACK_GLOBAL = pickle.STACK_GLOBAL[0]
_POP = pickle.POP[0]
_DUP = pickle.DUP[0]
_PROTO = pickle.PROTO[0]
_STOP = pickle.STOP[0]
#: Hash-safe atoms by their argument: a fixed size (-1: not one of them) ...
_FAST = [-1] * 256
for _name, _size in (("BININT", 4), ("BININT1", 1), ("BININT2", 2), ("NONE", 0), ("NEWTRUE", 0), ("NEWFALSE", 0)):
    _FAST[_OP[_name]] = _size
#: ... or the size of their length field (0: not one of them).
_PREFIX = [0] * 256
for _name, _size in (("SHORT_BINUNICODE", 1), ("BINUNICODE", 4), ("BINUNICODE8", 8), ("SHORT_BINBYTES", 1)):
    _PREFIX[_OP[_name]] = _size
for _name, _size in (("BINBYTES", 4), ("BINBYTES8", 8), ("SHORT_BINSTRING", 1), ("BINSTRING", 4)):
    _PREFIX[_OP[_name]] = _size
