"""Errors: classes and codes, pickling, actionable messages, errors across threads. The bad calls
that raise them are in test_bad_inputs.py."""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest
from conftest import BOTH_BACKENDS, CODE_NAMES, GiB, MiB, fragment, raises_acl, run_in_threads, snapshot, unchanged

from npumem import (
    AclError,
    Device,
    InternalError,
    InvalidHandleError,
    InvalidParamError,
    MemoryFreeError,
    OutOfMemoryError,
    Policy,
    UnsupportedError,
)
from npumem import errors as errmod

# --------------------------------------------------------------------------------------------
# Classes, codes, pickling
# --------------------------------------------------------------------------------------------

pytestmark = BOTH_BACKENDS

HIERARCHY = [
    (InvalidParamError, ValueError),
    (OutOfMemoryError, MemoryError),
    (MemoryFreeError, ValueError),
    (InvalidHandleError, ValueError),
    (UnsupportedError, NotImplementedError),
    (InternalError, RuntimeError),
]


@pytest.mark.parametrize(("cls", "builtin"), HIERARCHY)
def test_hierarchy(cls, builtin):
    assert issubclass(cls, AclError)
    assert issubclass(cls, builtin)
    assert issubclass(AclError, Exception)


def test_codes_map_to_classes():
    expected = {
        100000: InvalidParamError,
        107000: InvalidParamError,
        107008: InvalidParamError,
        107017: InvalidHandleError,
        200006: UnsupportedError,
        207001: OutOfMemoryError,
        207002: MemoryFreeError,
        507899: InternalError,
    }
    assert set(expected) == set(CODE_NAMES)
    for code, cls in expected.items():
        err = errmod._from_native(code, CODE_NAMES[code], "what to do")
        assert type(err) is cls
        assert (err.code, err.name, err.message) == (code, CODE_NAMES[code], "what to do")
        assert str(err) == f"{CODE_NAMES[code]} ({code}): what to do"
    unknown = errmod._from_native(123, "ACL_SOMETHING", "m")
    assert type(unknown) is AclError and unknown.code == 123
    assert errmod.ACL_ERROR_INVALID_PARAM == 100000
    assert errmod.ACL_ERROR_RT_PARAM_INVALID == 107000
    assert errmod.ACL_ERROR_RT_MEMORY_ALLOCATION == 207001
    assert errmod.ACL_ERROR_RT_MEMORY_FREE == 207002


def _raised_errors() -> list[AclError]:
    d = Device("16MiB", allocator="direct")
    p = d.malloc(100)
    errors = []
    for call in (
        lambda: d.malloc(0),
        lambda: d.malloc(32 * MiB),
        lambda: d.free(p + 64),
        lambda: d.read(p, 101),
        lambda: d.memcpy(p, 1, p, 2),
    ):
        try:
            call()
        except AclError as e:
            errors.append(e)
    d.free(p)
    try:
        d.free(p)
    except AclError as e:
        errors.append(e)
    assert len(errors) == 6
    return errors


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_errors_pickle(protocol):
    made = [InvalidParamError(100000, CODE_NAMES[100000], "msg"), AclError(1, "ACL_OTHER", "other")]
    for err in made + _raised_errors():
        back = pickle.loads(pickle.dumps(err, protocol))
        assert type(back) is type(err)
        assert (back.code, back.name, back.message, str(back)) == (err.code, err.name, err.message, str(err))
        assert back.args == err.args
        clone = copy.deepcopy(err)
        assert (type(clone), clone.code, clone.message) == (type(err), err.code, err.message)


def test_builtin_except_clauses_catch_errors(dev):
    with pytest.raises(ValueError):
        dev.malloc(0)
    with pytest.raises(MemoryError):
        dev.malloc(GiB)
    p = dev.malloc(1)
    dev.free(p)
    with pytest.raises(ValueError):
        dev.free(p)


# --------------------------------------------------------------------------------------------
# Messages
# --------------------------------------------------------------------------------------------


@pytest.mark.sim_only("a fragmented buddy (fragment())")
def test_oom_messages_explain_fragmentation():
    d = Device("16MiB", allocator="direct")
    fragment(d)
    with raises_acl(OutOfMemoryError, 207001) as info:
        d.malloc(2 * MiB, Policy.HUGE_ONLY)
    message = info.value.message
    assert "HUGE_ONLY" in message and "HUGE_FIRST" in message
    assert "fragmentation" in message
    assert "largest free block 1 MiB" in message
    assert "15.97 MiB free of 16 MiB" in message


def test_invalid_enum_messages_list_valid_values(dev):
    with raises_acl(InvalidParamError, 100000) as info:
        dev.malloc(1, 42)
    for p in Policy:
        assert f"ACL_MEM_MALLOC_{p.name}={p.value}" in info.value.message
    with raises_acl(InvalidParamError, 100000) as info:
        dev.memcpy(1, 1, 1, 1, 9)
    assert "ACL_MEMCPY_DEFAULT=4" in info.value.message
    with raises_acl(InvalidParamError, 100000) as info:
        dev.mem_info(99)
    assert "ACL_HBM_MEM_HUGE1G=10" in info.value.message


def test_past_the_end_message_names_the_allocation(dev):
    p = dev.malloc(100)
    with raises_acl(InvalidParamError, 107000) as info:
        dev.read(p + 40, 70)
    assert f"{p:#x}" in info.value.message
    assert "10 bytes past the end" in info.value.message
    assert "(100 bytes)" in info.value.message


def test_from_numpy_frees_on_a_failed_write():
    class Failing(Device):
        def write(self, ptr, buffer):
            raise RuntimeError("injected")

    d = Failing("16MiB", allocator="direct")
    before = snapshot(d)
    with pytest.raises(RuntimeError, match="injected"):
        d.from_numpy(np.arange(1000))
    after = snapshot(d)
    assert after["allocations"] == [] and after["mem_info"] == before["mem_info"]
    assert after["frames"] == before["frames"]
    assert after["stats"]["live_count"] == 0


def test_errors_are_raised_across_threads(dev):
    errors = run_in_threads(lambda _: dev.malloc(0), 8)
    assert len(errors) == 8
    assert all(type(e) is InvalidParamError and e.code == 100000 for e in errors)


def test_unchanged_helper_catches_failed_malloc_counter(dev):
    """``unchanged`` must fail when failed_mallocs moves unexpectedly."""
    with pytest.raises(AssertionError), unchanged(dev), pytest.raises(OutOfMemoryError):
        dev.malloc(GiB)
