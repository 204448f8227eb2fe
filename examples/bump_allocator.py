"""Pointing npumem.testing at your own allocator: a toy first-fit allocator in pure Python.

``FirstFit`` carves blocks from a bytearray arena with a bump pointer and reuses freed blocks
first fit (splitting the rest off). ``FirstFit(bug=True)`` is the same allocator with one line
mutated — it reuses the first free block without checking that it is large enough — and the
stateful machine catches it: the reused block overlaps its neighbour, and the data written into
one shows up changed in the other.

Run: ``python examples/bump_allocator.py`` (checks both; the mutant's shrunk failing program is
printed). The test suite runs it too (tests/test_testing.py).
"""

from __future__ import annotations

import sys

from npumem.testing import AllocatorCheckError, check_allocator, sizes


class FirstFit:
    """malloc/free over a ``capacity``-byte arena, 16-byte aligned, with read/write and stats."""

    alignment = 16
    base = 0x1000  # pointers are offsets into the arena plus this base

    def __init__(self, capacity: int = 1 << 20, *, bug: bool = False) -> None:
        self.arena = bytearray(capacity)
        self.top = 0  # the bump pointer
        self.free_list: list[tuple[int, int]] = []  # (offset, size), address order
        self.sizes: dict[int, int] = {}  # live offset -> rounded size
        self.bug = bug

    def malloc(self, size: int) -> int:
        size = -(-size // self.alignment) * self.alignment
        for k, (off, n) in enumerate(self.free_list):
            if self.bug or n >= size:  # the mutant skips the size check
                del self.free_list[k]
                if n > size:
                    self.free_list.insert(k, (off + size, n - size))
                self.sizes[off] = size
                return self.base + off
        if self.top + size > len(self.arena):
            raise MemoryError(f"arena full: {size} bytes asked, {len(self.arena) - self.top} left")
        off, self.top = self.top, self.top + size
        self.sizes[off] = size
        return self.base + off

    def free(self, ptr: int) -> None:
        off = ptr - self.base
        n = self.sizes.pop(off)
        self.free_list.append((off, n))
        self.free_list.sort()

    def write(self, ptr: int, data: bytes) -> None:
        off = ptr - self.base
        self.arena[off : off + len(data)] = data

    def read(self, ptr: int, n: int) -> bytes:
        off = ptr - self.base
        return bytes(self.arena[off : off + n])

    def stats(self) -> dict[str, int]:
        return {"allocated_bytes": sum(self.sizes.values()), "reserved_bytes": self.top, "live_blocks": len(self.sizes)}


def main() -> int:
    small = sizes(1, 4096)
    check_allocator(lambda: FirstFit(), size=small, max_examples=100)
    print("FirstFit: every check passed (100 programs)")
    try:
        check_allocator(lambda: FirstFit(bug=True), size=small, max_examples=200)
    except AllocatorCheckError as e:
        print(f"FirstFit(bug=True) is caught: {e}")
        return 0
    print("FirstFit(bug=True) was NOT caught", file=sys.stderr)
    return 1


if __name__ == "__main__":
    raise SystemExit(main())
