"""The snapshot-pickle admission scan (``npumem_core::snapshot_pickle``, through
``npumem._snapshot_pickle.check``) against an independent model of it in Python
(tests/snapshot_pickle_model.py): the same verdict and the same message on real pickles of
plain data at every protocol, on every prefix of them, on random opcode programs, on byte
mutations, and on the fuzz corpus; and what it admits the restricted unpickler loads.
"""

from __future__ import annotations

import io
import pathlib
import pickle

import snapshot_pickle_model as model
from hypothesis import given, settings
from hypothesis import strategies as st

from npumem import _snapshot_pickle

CORPUS = pathlib.Path(__file__).parent.parent / "fuzz" / "regressions" / "trace_readers"


def verdict(check, data: bytes) -> tuple[str, str]:
    try:
        check(data)
    except _snapshot_pickle.Truncated as e:
        return ("truncated", str(e))
    except pickle.UnpicklingError as e:
        return ("refused", str(e))
    return ("admitted", "")


def same(data: bytes) -> tuple[str, str]:
    got = verdict(_snapshot_pickle.check, data)
    assert got == verdict(model.check, data), data[:200]
    return got


atoms = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False),
    st.text(max_size=8),
    st.binary(max_size=8),
)
keys = st.one_of(st.none(), st.booleans(), st.integers(-(2**60), 2**60), st.text(max_size=6), st.binary(max_size=4))
plain = st.recursive(
    atoms,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.tuples(inner, inner),
        st.lists(inner, max_size=3).map(tuple),
        st.dictionaries(keys, inner, max_size=4),
        st.frozensets(keys, max_size=3),
        st.sets(keys, max_size=3),
    ),
    max_leaves=20,
)


@settings(max_examples=300)
@given(plain, st.integers(0, pickle.HIGHEST_PROTOCOL))
def test_pickles_of_plain_data_agree_and_load(obj, protocol):
    data = pickle.dumps(obj, protocol=protocol)
    kind, _ = same(data)
    if kind == "admitted":
        assert _snapshot_pickle.PlainUnpickler(io.BytesIO(data)).load() == obj
    for cut in range(0, len(data), max(1, len(data) // 16)):
        assert same(data[:cut])[0] in ("truncated", "refused")


# Opcode programs: a handful of items, marks, memo traffic and containers, in any order, so
# that stack underflows, memo misses and odd shapes are reached as often as well-formed data.
OPS = [
    b"K\x01",
    b"J\xff\xff\xff\xff",
    b"M\x02\x00",
    b"N",
    b"\x88",
    b"\x8a\x01\x05",
    b"\x8a\x09" + b"\x01" * 9,
    b"\x8c\x01a",
    b"C\x01b",
    b"G" + b"\x00" * 8,
    b"I12\n",
    b"I" + b"9" * 20 + b"\n",
    b"S'x'\n",
    b"(",
    b")",
    b"]",
    b"}",
    b"\x8f",
    b"\x85",
    b"\x86",
    b"\x87",
    b"t",
    b"l",
    b"d",
    b"s",
    b"u",
    b"a",
    b"e",
    b"\x90",
    b"\x91",
    b"1",
    b"0",
    b"2",
    b"\x94",
    b"q\x00",
    b"q\x01",
    b"r\x00\x00\x00\x00",
    b"h\x00",
    b"h\x01",
    b"j\x00\x00\x00\x00",
    b"g0\n",
    b"gx\n",
    b"p0\n",
    b"p-1\n",
    b"cbuiltins\nfrozenset\n",
    b"c__builtin__\nset\n",
    b"cos\nsystem\n",
    b"\x8c\x08builtins\x8c\x03set\x93",
    b"R",
    b"b",
    b"\x95" + b"\x00" * 8,
    b"\x82\x01",
    b"\xff",
]


@settings(max_examples=2000)
@given(st.lists(st.sampled_from(OPS), max_size=40), st.booleans())
def test_random_opcode_programs_agree(ops, stop):
    same(b"\x80\x04" + b"".join(ops) + (b"." if stop else b""))


@settings(max_examples=500)
@given(plain, st.integers(0, pickle.HIGHEST_PROTOCOL), st.data())
def test_mutated_pickles_agree(obj, protocol, data):
    raw = bytearray(pickle.dumps(obj, protocol=protocol))
    for _ in range(data.draw(st.integers(1, 3))):
        i = data.draw(st.integers(0, len(raw) - 1))
        raw[i] = data.draw(st.integers(0, 255))
    same(bytes(raw))


def test_the_fuzz_corpus_agrees():
    files = sorted(CORPUS.iterdir())
    assert any("snapshot" in f.name for f in files)
    for f in files:
        data = f.read_bytes()
        same(data)
        same(data[1:])  # the fuzz target's first byte picks the reader


def test_the_bounds_are_the_modules():
    deep = b"\x80\x04}K\x01" + b"\x85" * 101 + b"K\x02s."
    assert same(deep) == ("refused", "a tuple nested more than 100 deep (at byte 105)")
    ok = b"\x80\x04]K\x01" + b"\x85" * 100 + b"a."
    assert same(ok) == ("admitted", "")
    assert _snapshot_pickle.MAX_TUPLE_DEPTH == 100
