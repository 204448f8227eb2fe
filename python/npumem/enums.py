"""AscendCL enumerations with their real numeric values (``acl_rt.h``)."""

from __future__ import annotations

from enum import IntEnum


class Policy(IntEnum):
    """``aclrtMemMallocPolicy``."""

    HUGE_FIRST = 0
    HUGE_ONLY = 1
    NORMAL_ONLY = 2
    HUGE_FIRST_P2P = 3
    HUGE_ONLY_P2P = 4
    NORMAL_ONLY_P2P = 5
    HUGE1G_ONLY = 6
    HUGE1G_ONLY_P2P = 7


class MemAttr(IntEnum):
    """``aclrtMemAttr``, the argument of ``aclrtGetMemInfo``."""

    DDR = 0
    HBM = 1
    DDR_HUGE = 2
    DDR_NORMAL = 3
    HBM_HUGE = 4
    HBM_NORMAL = 5
    DDR_P2P_HUGE = 6
    DDR_P2P_NORMAL = 7
    HBM_P2P_HUGE = 8
    HBM_P2P_NORMAL = 9
    HBM_HUGE1G = 10
    HBM_P2P_HUGE1G = 11
    MEM_NORMAL = 12
    MEM_HUGE = 13
    MEM_HUGE1G = 14
    MEM_P2P_NORMAL = 15
    MEM_P2P_HUGE = 16
    MEM_P2P_HUGE1G = 17


class MemcpyKind(IntEnum):
    """``aclrtMemcpyKind``. The runtime infers the direction from the addresses."""

    HOST_TO_HOST = 0
    HOST_TO_DEVICE = 1
    DEVICE_TO_HOST = 2
    DEVICE_TO_DEVICE = 3
    DEFAULT = 4
    HOST_TO_BUF_TO_DEVICE = 5
    INNER_DEVICE_TO_DEVICE = 6
    INTER_DEVICE_TO_DEVICE = 7


class MemPoolAttr(IntEnum):
    """``aclrtMemPoolAttr``: the stream-ordered pool's attributes (SOMA)."""

    REUSE_FOLLOW_EVENT_DEPENDENCIES = 1
    REUSE_ALLOW_OPPORTUNISTIC = 2
    REUSE_ALLOW_INTERNAL_DEPENDENCIES = 3
    RELEASE_THRESHOLD = 4
    RESERVED_MEM_CURRENT = 5
    RESERVED_MEM_HIGH = 6
    USED_MEM_CURRENT = 7
    USED_MEM_HIGH = 8
