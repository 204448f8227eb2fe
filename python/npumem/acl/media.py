"""``acl.media``: DVPP memory (``acldvppMalloc``/``acldvppFree``): device memory of the current
device whose start is 128-byte aligned, as DVPP requires."""

from __future__ import annotations

from typing import Any

from . import codes as C
from ._runtime import LOCK, RT, Alloc, call_site
from .rt import _free, _k, _native, _no_context

__all__ = ["dvpp_free", "dvpp_malloc"]

DVPP_ALIGN = 128


def dvpp_malloc(size: Any) -> tuple[int, int]:
    """``(dev_ptr, ret)``: ``size`` bytes of device memory starting on a 128-byte boundary."""
    n = _k(size, "dvpp_malloc", "size")
    with LOCK:
        ctx = RT.current()
        if ctx is None:
            return 0, _no_context("dvpp_malloc")
        if n == 0:
            return 0, RT.fail(C.ACL_ERROR_INVALID_PARAM, "acl.media.dvpp_malloc size must be greater than 0")
        site = call_site(2)
        # Device blocks start 64-byte aligned: ask for 64 more and hand out the 128-byte boundary.
        base, ret = _native(RT.sys().device(ctx.device).malloc_align32, n + 64, 0, tag=site)
        if ret:
            return 0, ret
        ptr = (base + DVPP_ALIGN - 1) & ~(DVPP_ALIGN - 1)
        RT.allocs[ptr] = Alloc(ctx.device, n, site, "dvpp", base)
        return ptr, C.ACL_SUCCESS


def dvpp_free(dev_ptr: Any) -> int:
    ptr = _k(dev_ptr, "dvpp_free", "dev_ptr")
    with LOCK:
        return _free("dvpp_free", ptr, lambda a: a.api == "dvpp", "acl.media.dvpp_malloc")
