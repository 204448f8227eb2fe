"""The plain-call paths of acl.rt's hot calls (malloc, free, memcpy, memset, malloc_host,
free_host) keep every promise of the checked path: each error code and message, the per-thread
context, and, for random programs, the same codes, messages and bytes as the checked path
(``rt._malloc``, ``rt._free``, ``rt._copy``, ``rt._memset_args``, ``rt._malloc_host``,
``rt._free_host``) run as the model."""

from __future__ import annotations

import ctypes
import re
import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import npumem.acl as acl
from npumem.acl import codes as C
from npumem.acl import rt
from npumem.acl._runtime import LOCK, RT

H2H, H2D, D2H, D2D = 0, 1, 2, 3
SCRATCH = 8192


def reset() -> None:
    with LOCK:
        RT.forget()


def fresh(devices: int = 2) -> None:
    reset()
    acl.configure(devices=devices, capacity="256MiB")
    assert acl.init() == 0
    assert acl.rt.set_device(0) == 0


@pytest.fixture
def system():
    fresh()
    yield acl
    reset()


def err() -> str:
    return acl.get_recent_err_msg()


# ----- each error path of the five calls -----


def test_malloc_sizes_and_policies(system):
    assert acl.rt.malloc(0, 0) == (0, C.ACL_ERROR_INVALID_PARAM)
    assert "size must be greater than 0" in err()
    # A negative size is masked to 64 bits, as pyACL's "K" format: too large to align.
    assert acl.rt.malloc(-1, 0) == (0, C.ACL_ERROR_INVALID_PARAM) and "18446744073709551615 overflows" in err()
    assert acl.rt.malloc(1 << 62, 0) == (0, C.ACL_ERROR_RT_MEMORY_ALLOCATION)
    assert "4194304 TiB is larger than the device" in err()
    p, ret = acl.rt.malloc(4096, 0x100 | 2)  # a policy flag bit beside a base policy
    assert ret == 0 and acl.rt.free(p) == 0
    p, ret = acl.rt.malloc(np.uint64(4096), np.int32(0))  # numpy ints take the checked path
    assert ret == 0 and p in RT.allocs and acl.rt.free(p) == 0
    with pytest.raises(TypeError, match="size must be int, not float"):
        acl.rt.malloc(4096.0, 0)
    with pytest.raises(OverflowError, match="policy=4294967296 does not fit a C int"):
        acl.rt.malloc(4096, 1 << 32)


def test_malloc_records_the_call_site(system):
    p, ret = acl.rt.malloc(4096, 0)
    line = test_malloc_records_the_call_site.__code__.co_firstlineno + 1
    assert ret == 0 and RT.allocs[p].site == f"{__file__}:{line}"
    assert (RT.allocs[p].size, RT.allocs[p].device, RT.allocs[p].api) == (4096, 0, "malloc")
    assert acl.rt.free(p) == 0 and p not in RT.allocs and RT.freed_sites[p].endswith(f":{line}")


def test_malloc_host_records_the_call_site(system):
    h, ret = acl.rt.malloc_host(100)
    line = test_malloc_host_records_the_call_site.__code__.co_firstlineno + 1
    assert ret == 0 and RT.host_blocks[h].site == f"{__file__}:{line}" and RT.host_blocks[h].owner == 0
    assert acl.rt.free_host(h) == 0 and RT.freed_sites[h].endswith(f":{line}")
    # Without a context (another thread), the block belongs to device 0.
    got = []
    t = threading.Thread(target=lambda: got.append(acl.rt.malloc_host(64)))
    t.start()
    t.join()
    assert got[0][1] == 0 and RT.host_blocks[got[0][0]].owner == 0 and acl.rt.free_host(got[0][0]) == 0


def test_malloc_without_a_context_on_another_thread(system):
    got = []
    t = threading.Thread(target=lambda: got.append((acl.rt.malloc(4096, 0), err())))
    t.start()
    t.join()
    (value, msg) = got[0]
    assert value == (0, C.ACL_ERROR_RT_CONTEXT_NULL) and "needs a current context" in msg
    # The context a thread sets is its own: device 1 there, device 0 here.
    t = threading.Thread(target=lambda: got.append((acl.rt.set_device(1), acl.rt.malloc(4096, 0))))
    t.start()
    t.join()
    ptr = got[1][1][0]
    assert got[1][0] == 0 and got[1][1][1] == 0 and RT.allocs[ptr].device == 1
    p, _ = acl.rt.malloc(4096, 0)
    assert RT.allocs[p].device == 0
    assert acl.rt.free(ptr) == 0 and acl.rt.free(p) == 0


def test_malloc_after_the_context_went(system):
    assert acl.rt.reset_device(0) == 0
    assert acl.rt.malloc(4096, 0) == (0, C.ACL_ERROR_RT_CONTEXT_NULL)
    ctx, ret = acl.rt.create_context(1)
    assert ret == 0
    p, ret = acl.rt.malloc(4096, 0)
    assert ret == 0 and RT.allocs[p].device == 1
    assert acl.rt.free(p) == 0 and acl.rt.destroy_context(ctx) == 0
    assert acl.rt.malloc(4096, 0) == (0, C.ACL_ERROR_RT_CONTEXT_NULL)


def test_free_errors(system):
    p, _ = acl.rt.malloc(4096, 0)
    h, _ = acl.rt.malloc_host(4096)
    assert acl.rt.free(0) == C.ACL_ERROR_INVALID_PARAM and "free(NULL)" in err()
    assert acl.rt.free(p + 64) == C.ACL_ERROR_RT_MEMORY_FREE and "not a live allocation of device 0" in err()
    assert acl.rt.free(h) == C.ACL_ERROR_RT_MEMORY_FREE and "host memory" in err()
    assert acl.rt.free(p) == 0
    assert acl.rt.free(p) == C.ACL_ERROR_RT_MEMORY_FREE and f"free({p:#x})" in err()
    assert acl.rt.free(-1) == C.ACL_ERROR_RT_MEMORY_FREE  # masked: 0xffff_ffff_ffff_ffff
    with pytest.raises(TypeError, match="dev_ptr must be int, not str"):
        acl.rt.free("0x10")
    assert acl.rt.free_host(h) == 0


def test_free_host_errors(system):
    p, _ = acl.rt.malloc(4096, 0)
    h, ret = acl.rt.malloc_host(100)
    assert ret == 0 and h % 64 == 0 and RT.host_block_of(h + 99) == (h, RT.host_blocks[h])
    assert acl.rt.malloc_host(0) == (0, C.ACL_ERROR_INVALID_PARAM) and "malloc_host size" in err()
    assert acl.rt.free_host(0) == C.ACL_ERROR_INVALID_PARAM and "free_host(NULL)" in err()
    assert acl.rt.free_host(p) == C.ACL_ERROR_RT_MEMORY_FREE and "not a live malloc_host block" in err()
    assert acl.rt.free_host(h + 1) == C.ACL_ERROR_RT_MEMORY_FREE
    assert acl.rt.free_host(h) == 0 and RT.host_block_of(h) is None
    assert acl.rt.free_host(h) == C.ACL_ERROR_RT_MEMORY_FREE
    assert acl.rt.free(p) == 0


def test_memcpy_errors_and_kinds(system):
    p, _ = acl.rt.malloc(4096, 0)
    h, _ = acl.rt.malloc_host(4096)
    for kind in (-1, 6, 7):
        assert acl.rt.memcpy(p, 4096, h, 16, kind) == C.ACL_ERROR_INVALID_PARAM and f"kind {kind}" in err()
    assert acl.rt.memcpy(p, 8, h, 16, H2D) == C.ACL_ERROR_RT_PARAM_INVALID and "larger than dest_max" in err()
    assert acl.rt.memcpy(0, 16, h, 16, H2D) == C.ACL_ERROR_INVALID_PARAM and "dst is NULL" in err()
    assert acl.rt.memcpy(p, 16, 0, 16, H2D) == C.ACL_ERROR_INVALID_PARAM and "src is NULL" in err()
    assert acl.rt.memcpy(p, 8192, h, 8192, H2D) == C.ACL_ERROR_RT_PARAM_INVALID and "run past" in err()
    assert acl.rt.memcpy(p + 4000, 200, h, 200, H2D) == C.ACL_ERROR_RT_PARAM_INVALID
    assert "run 104 bytes past the end of the allocation" in err()
    assert acl.rt.memcpy(p, 16, p, 16, D2D) == 0  # the same address: nothing to move
    assert acl.rt.memcpy(p, 16, h, 0, H2D) == 0  # nothing to move, and no address is checked
    # Every kind 0-5 copies; one that names another direction is counted, then ignored.
    before = RT.kind_mismatches
    for kind in range(6):
        data = np.arange(kind, kind + 16, dtype=np.uint8)
        ctypes.memmove(h, data.ctypes.data, 16)
        assert acl.rt.memcpy(p, 4096, h, 16, kind) == 0
        out = np.zeros(16, np.uint8)
        assert acl.rt.memcpy(out.ctypes.data, 16, p, 16, D2H) == 0
        assert (out == data).all()
    assert RT.kind_mismatches == before + 3  # kinds 0, 2 and 3 name other directions than H2D
    # Overlapping device ranges copy as memmove does.
    put = np.arange(64, dtype=np.uint8)
    assert acl.rt.memcpy(p, 64, put.ctypes.data, 64, H2D) == 0
    assert acl.rt.memcpy(p + 8, 64, p, 32, D2D) == 0
    out = np.zeros(64, np.uint8)
    assert acl.rt.memcpy(out.ctypes.data, 64, p, 64, D2H) == 0
    assert (out[8:40] == np.arange(32)).all() and (out[:8] == np.arange(8)).all()
    with pytest.raises(TypeError, match="kind must be int, not NoneType"):
        acl.rt.memcpy(p, 16, h, 16, None)
    assert acl.rt.free(p) == 0 and acl.rt.free_host(h) == 0


def test_memcpy_to_a_device_never_used(system):
    p, _ = acl.rt.malloc(4096, 0)
    far = p + RT.sys()._slice * 1  # device 1's window: that device was never made
    assert acl.rt.memcpy(far, 16, p, 16, D2D) == C.ACL_ERROR_RT_PARAM_INVALID and "never used" in err()
    assert acl.rt.memset(far, 16, 0, 16) == C.ACL_ERROR_RT_PARAM_INVALID and "never used" in err()
    assert acl.rt.free(p) == 0


def test_memset_errors(system):
    p, _ = acl.rt.malloc(4096, 0)
    h, _ = acl.rt.malloc_host(64)
    assert acl.rt.memset(p, 8, 1, 16) == C.ACL_ERROR_RT_PARAM_INVALID and "larger than max_count" in err()
    assert acl.rt.memset(0, 16, 1, 16) == C.ACL_ERROR_INVALID_PARAM and "destination is NULL" in err()
    assert acl.rt.memset(h, 128, 1, 128) == C.ACL_ERROR_RT_PARAM_INVALID and "run past" in err()
    assert acl.rt.memset(p + 4090, 16, 1, 16) == C.ACL_ERROR_RT_PARAM_INVALID
    assert "run 10 bytes past the end of the allocation" in err()
    assert acl.rt.memset(p, 16, 1, 0) == 0
    with pytest.raises(OverflowError, match="value=2147483648 does not fit a C int"):
        acl.rt.memset(p, 16, 1 << 31, 16)
    assert acl.rt.memset(p, 16, 0x1FF, 16) == 0  # the low byte fills
    assert acl.rt.memset(h, 64, -2, 64) == 0
    out = np.zeros(16, np.uint8)
    assert acl.rt.memcpy(out.ctypes.data, 16, p, 16, D2H) == 0 and (out == 0xFF).all()
    assert acl.rt.memcpy(out.ctypes.data, 16, h, 16, H2H) == 0 and (out == 0xFE).all()
    assert acl.rt.free(p) == 0 and acl.rt.free_host(h) == 0


# ----- random programs: the plain-call path against the checked path -----

SIZES = st.sampled_from([0, 1, 64, 100, 4096, 5000, 1 << 62])
OP = st.one_of(
    st.tuples(st.just("malloc"), SIZES, st.sampled_from([0, 1, 2, 9])),
    st.tuples(st.just("malloc_host"), SIZES),
    st.tuples(st.just("free"), st.integers(0, 20), st.sampled_from([0, 0, 64])),
    st.tuples(st.just("free_host"), st.integers(0, 20)),
    st.tuples(
        st.just("memcpy"),
        st.integers(0, 20),
        st.sampled_from([0, 8, 4090]),
        st.integers(0, 20),
        st.sampled_from([0, 8]),
        st.sampled_from([0, 1, 16, 100, 4096]),
        st.sampled_from([0, 1, -1]),
        st.integers(-1, 6),
    ),
    st.tuples(
        st.just("memset"),
        st.integers(0, 20),
        st.sampled_from([0, 8, 4090]),
        st.integers(-300, 300),
        st.sampled_from([0, 1, 16, 100]),
        st.sampled_from([0, -1]),
    ),
    st.tuples(st.just("set_device"), st.integers(0, 1)),
    st.tuples(st.just("reset_device"), st.integers(0, 1)),
)


def _checked(op: str, *args):
    """The checked path of each call: the model the plain-call path must match."""
    with LOCK:
        if op == "malloc":
            return rt._malloc("malloc", args[0], args[1], "malloc", "model")
        if op == "free":
            return rt._free("free", rt._k(args[0], "free", "dev_ptr"), rt._not_dvpp, "acl.rt.malloc")
        if op == "memcpy":
            return rt._copy("memcpy", *args, None)
        if op == "memset":
            return rt._memset_args(*args)
        if op == "malloc_host":
            return rt._malloc_host(rt._k(args[0], "malloc_host", "size"))
        if op == "free_host":
            return rt._free_host(rt._k(args[0], "free_host", "host_ptr"))
    raise AssertionError(op)


def run(program, fast: bool) -> list:
    """Runs ``program`` on a fresh system: each call's result and message (addresses written as
    their index in the blocks handed out), and every live block's bytes at the end.

    Device addresses are the same in both runs; host addresses are the heap's, so a host block
    is named by its index alone: a freed one (whose address the heap may hand out again in one
    run only) is passed as the scratch buffer's address, pageable memory that is no block."""
    fresh()
    call = (lambda op, *a: getattr(acl.rt, op)(*a)) if fast else _checked
    #: [address, size, malloc_host block, live] of every block handed out
    blocks: list[list] = []
    out: list = []
    # Bytes are copied to and from pageable memory as in C: an end of a copy or fill that is not
    # device memory nor inside its own live malloc_host block is this buffer (never the heap).
    scratch = np.zeros(2 * SCRATCH, np.uint8)

    def name(text: str) -> str:
        known = {f"{b[0]:#x}": f"P{i}" for i, b in enumerate(blocks) if b[3] or not b[2]}
        return re.sub(r"0x[0-9a-f]+", lambda m: known.get(m.group(0), "ADDR"), text)

    def ptr(i: int, off: int) -> int:
        if not blocks:
            return 0
        addr, size, host, live = blocks[i % len(blocks)]
        if host and not (live and off < size):
            return scratch.ctypes.data + off
        return addr + off

    for op in program:
        before = acl.get_recent_err_msg()
        kind, args = op[0], op[1:]
        if kind == "malloc":
            res = call("malloc", *args)
        elif kind == "malloc_host":
            res = call("malloc_host", args[0])
        elif kind == "free":
            res = call("free", ptr(args[0], args[1]))
        elif kind == "free_host":
            res = call("free_host", ptr(args[0], 0))
            if res == 0:
                blocks[args[0] % len(blocks)][3] = False
        elif kind == "memcpy":
            d, s, n = ptr(args[0], args[1]), ptr(args[2], args[3]), args[4]
            res = call("memcpy", d, n + args[5], s, n, args[6])
        elif kind == "memset":
            res = call("memset", ptr(args[0], args[1]), args[3] + args[4], args[2], args[3])
        else:
            res = getattr(acl.rt, kind)(args[0])
        if isinstance(res, tuple) and res[1] == 0:
            # A distinct pattern in each new block, so every copy shows in the bytes.
            pattern = bytes((len(blocks) * 31 + j) % 251 for j in range(args[0]))
            if kind == "malloc":
                RT.sys().device(RT.allocs[res[0]].device).write(res[0], pattern)
            else:
                ctypes.memmove(res[0], pattern, args[0])
            blocks.append([res[0], args[0], kind == "malloc_host", True])
            res = ("P", res[1])
        msg = acl.get_recent_err_msg()
        out.append((kind, res, name(msg) if msg != before else None))
    for i, (addr, _, host, live) in enumerate(blocks):
        if host and live:
            out.append(ctypes.string_at(addr, RT.host_blocks[addr].size))
        elif not host and addr in RT.allocs and addr not in [b[0] for b in blocks[i + 1 :]]:
            buf = bytearray(RT.allocs[addr].size)
            RT.sys().device(RT.allocs[addr].device).read_into(addr, buf)
            out.append(bytes(buf))
    out.append(scratch.tobytes())
    reset()
    return out


@settings(max_examples=100, deadline=None)
@given(st.lists(OP, max_size=25))
def test_random_programs_match_the_checked_path(program):
    # Three blocks to start with, so most copies and fills find memory to move.
    program = [("malloc", 4096, 0), ("malloc", 5000, 2), ("malloc_host", 4096), *program]
    assert run(program, True) == run(program, False)


# ----- Device.malloc(size, policy, stream, tag): the call npumem.acl makes -----


def test_device_malloc_with_four_positional_arguments():
    import npumem

    dev = npumem.Device("256MiB")
    x = dev.malloc(4096, 2, 0, "site.py:7")
    assert [(a["ptr"], a["tag"]) for a in dev.leak_report()["allocations"]] == [(x, "site.py:7")]
    assert dev.page_of(x) == 4096  # policy 2 (NORMAL_ONLY) kept
    s = dev.create_stream()
    y = dev.malloc(100, 0, s, "on a stream")
    dev.free(y)
    # What the plain call refuses goes to the general method, with its messages.
    with pytest.raises(npumem.errors.InvalidParamError, match="99 is not a valid memory malloc policy"):
        dev.malloc(4096, 99, 0, "t")
    with pytest.raises(TypeError, match="tag must be a str, got int"):
        dev.malloc(4096, 0, 0, 5)
    with pytest.raises(npumem.errors.InvalidParamError, match="stream 7 does not exist"):
        dev.malloc(4096, 0, 7, "t")
    with pytest.raises(npumem.errors.InvalidParamError, match="size must be greater than 0"):
        dev.malloc(0, 0, 0, "t")
    with pytest.raises(npumem.errors.InvalidParamError, match="size must be an integer from 0 to 2"):
        dev.malloc(-1, 0, 0, "t")
    dev.free(x)
    assert dev.leak_report()["allocations"] == []


# ----- the native tables: records, call sites, contexts across threads, the lock -----


def test_call_sites_name_each_line(system):
    a, _ = acl.rt.malloc(64, 0)
    first = test_call_sites_name_each_line.__code__.co_firstlineno + 1
    b, _ = acl.rt.malloc(64, 0)
    h, _ = acl.rt.malloc_host(64)
    assert [RT.allocs[a].site, RT.allocs[b].site, RT.host_blocks[h].site] == [
        f"{__file__}:{first}",
        f"{__file__}:{first + 2}",
        f"{__file__}:{first + 3}",
    ]
    # Code compiled from a string, at module level of its own: its file name and line.
    scope = {"acl": acl}
    exec(compile("\n\nx = acl.rt.malloc(64, 0)", "<prog>", "exec"), scope)
    assert RT.allocs[scope["x"][0]].site == "<prog>:3"
    for p in (a, b, scope["x"][0]):
        assert acl.rt.free(p) == 0
    assert acl.rt.free_host(h) == 0
    assert RT.freed_sites[scope["x"][0]] == "<prog>:3" and RT.freed_sites.get(h) == f"{__file__}:{first + 3}"


def test_records_behave_as_mappings(system):
    p, _ = acl.rt.malloc(4096, 0)
    h, _ = acl.rt.malloc_host(64)
    assert list(RT.allocs) == [p] and len(RT.allocs) == 1 and dict(RT.allocs)[p].size == 4096
    assert list(RT.host_blocks) == [h] and RT.host_blocks[h].size == 64
    # Keys no pointer can be are simply absent.
    for k in ("x", -1, 1 << 70, 4.0):
        assert k not in RT.allocs and RT.allocs.get(k) is None and k not in RT.freed_sites
    with pytest.raises(KeyError):
        RT.allocs[p + 1]
    with pytest.raises(KeyError):
        del RT.host_blocks[h + 1]
    assert RT.host_block_of(h + 63) == (h, RT.host_blocks[h]) and RT.host_block_of(h + 64) is None
    assert RT.host_block_of(-5) is None and RT.host_block_of(1 << 64) is None
    assert acl.rt.free(p) == 0 and acl.rt.free_host(h) == 0
    assert len(RT.allocs) == len(RT.host_blocks) == 0 and list(RT.freed_sites)[-2:] == [p, h]
    rt.TABLES.check_invariants()


def test_freed_sites_keep_the_latest(system):
    from npumem.acl._runtime import FREED_SITES

    ptrs = [acl.rt.malloc(64, 0)[0] for _ in range(FREED_SITES + 10)]
    for p in ptrs:
        assert acl.rt.free(p) == 0
    assert len(RT.freed_sites) == FREED_SITES
    assert ptrs[0] not in RT.freed_sites and ptrs[-1] in RT.freed_sites and ptrs[10] in RT.freed_sites
    # The same pointer freed over and over is one entry (and the order list stays bounded).
    for _ in range(3 * FREED_SITES):
        p, _ = acl.rt.malloc(64, 0)
        assert acl.rt.free(p) == 0
    assert len(RT.freed_sites) <= FREED_SITES and list(RT.freed_sites)[-1] == p
    rt.TABLES.check_invariants()


def test_a_context_destroyed_on_another_thread(system):
    """The plain-call path trusts a thread's context only in the epoch it was set: a context
    destroyed by another thread is seen at once."""
    ctx, ret = acl.rt.create_context(1)
    assert ret == 0
    p, _ = acl.rt.malloc(64, 0)
    assert RT.allocs[p].device == 1
    t = threading.Thread(target=lambda: acl.rt.destroy_context(ctx))
    t.start()
    t.join()
    assert acl.rt.malloc(64, 0) == (0, C.ACL_ERROR_RT_CONTEXT_NULL)
    assert acl.rt.malloc_host(64) != (0, C.ACL_ERROR_RT_CONTEXT_NULL)  # host memory needs none
    assert acl.rt.free(p) == 0


def test_threads_on_their_own_devices(system):
    """Four threads, two per device, each allocating, filling, copying and freeing on the plain
    paths at once: every block on its thread's device, every byte its own, nothing left."""
    errors: list = []

    def work(index: int) -> None:
        try:
            assert acl.rt.set_device(index % 2) == 0
            h, ret = acl.rt.malloc_host(256)
            assert ret == 0
            for i in range(300):
                p, ret = acl.rt.malloc(256, 0)
                assert ret == 0 and RT.allocs[p].device == index % 2
                assert acl.rt.memset(p, 256, (index * 7 + i) & 0xFF, 256) == 0
                assert acl.rt.memcpy(h, 256, p, 256, D2H) == 0
                assert ctypes.string_at(h, 256) == bytes([(index * 7 + i) & 0xFF]) * 256
                assert acl.rt.free(p) == 0
            assert acl.rt.free_host(h) == 0
        except BaseException as e:  # reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and len(RT.allocs) == 0 and len(RT.host_blocks) == 0
    rt.TABLES.check_invariants()


def test_finalize_with_live_memory(system):
    p, _ = acl.rt.malloc(4096, 0)
    h, _ = acl.rt.malloc_host(64)
    assert acl.rt.reset_device(0) == 0
    assert acl.finalize() == 0 and len(RT.allocs) == len(RT.host_blocks) == len(RT.freed_sites) == 0
    # No system now: every call takes the checked path, which says why.
    assert acl.rt.free(p) != 0 and acl.rt.free_host(h) != 0
    fresh()
    assert acl.rt.malloc(4096, 0)[1] == 0


def test_kind_mismatches_are_counted(system):
    p, _ = acl.rt.malloc(64, 0)
    h, _ = acl.rt.malloc_host(64)
    assert acl.rt.memcpy(p, 64, h, 64, H2D) == 0 and RT.kind_mismatches == 0
    assert acl.rt.memcpy(h, 64, p, 64, H2D) == 0 and RT.kind_mismatches == 1  # really D2H
    assert acl.rt.memcpy(h, 64, p, 64, 4) == 0 and RT.kind_mismatches == 1  # DEFAULT names none
    assert acl.rt.free(p) == 0 and acl.rt.free_host(h) == 0


def test_the_hot_calls_read_as_pyacl_functions(system):
    import inspect

    assert str(inspect.signature(acl.rt.malloc)) == "(size, policy)"
    assert "aclrtMalloc" in acl.rt.malloc.__doc__ and acl.rt.memcpy.__name__ == "memcpy"
    p, ret = acl.rt.malloc(size=4096, policy=0)  # keywords take the checked path
    assert ret == 0 and acl.rt.free(dev_ptr=p) == 0
    with pytest.raises(TypeError):
        acl.rt.malloc(4096)


# ----- the lock both paths hold -----


def test_the_lock_is_reentrant_and_owned():
    from npumem._native import ReentrantLock

    lock = ReentrantLock()
    assert lock.acquire() and lock.acquire(blocking=False) and lock._is_owned()
    lock.release()
    with lock:
        assert lock.locked()
    lock.release()
    assert not lock.locked() and not lock._is_owned()
    with pytest.raises(RuntimeError, match="un-acquired"):
        lock.release()
    with pytest.raises(ValueError, match="non-blocking"):
        lock.acquire(blocking=False, timeout=1)
    with pytest.raises(ValueError, match="non-negative"):
        lock.acquire(timeout=-2)


def test_the_lock_makes_other_threads_wait():
    from npumem._native import ReentrantLock

    lock = ReentrantLock()
    taken, release, seen = threading.Event(), threading.Event(), []

    def holder() -> None:
        with lock:
            taken.set()
            release.wait(10)

    t = threading.Thread(target=holder)
    t.start()
    assert taken.wait(10)
    seen.append(lock.acquire(blocking=False))
    seen.append(lock.acquire(timeout=0.05))
    with pytest.raises(RuntimeError):
        lock.release()  # not this thread's
    waiter = threading.Thread(target=lambda: seen.append(lock.acquire(timeout=10)))
    waiter.start()  # waits detached: the holder runs meanwhile
    release.set()
    t.join()
    waiter.join()
    assert seen == [False, False, True] and lock.locked() and not lock._is_owned()
