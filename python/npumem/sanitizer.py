"""Findings of npumem's memory sanitizer (``Device(sanitizer="raise" | "collect" | "off")``)."""

from __future__ import annotations

from dataclasses import dataclass, field

#: The kinds of finding, as ``Finding.kind`` and ``SanitizerError.kind`` name them.
KINDS = ("use_after_free", "double_free", "out_of_bounds", "kind_mismatch", "pending_write_read", "race")


@dataclass(frozen=True)
class Finding:
    """One sanitizer report.

    ``kind`` is one of :data:`KINDS`; ``addr`` and ``size`` give the bytes involved;
    ``allocation`` the start of the allocation concerned (when known) and ``tag`` its site tag
    (``malloc(..., tag=...)``); ``streams`` the streams involved, ``-1`` standing for the host.
    """

    kind: str
    message: str
    addr: int
    size: int
    allocation: int | None = None
    streams: list[int] = field(default_factory=list)
    tag: str | None = None

    def __str__(self) -> str:
        where = f" [{self.tag}]" if self.tag else ""
        return f"{self.kind}{where}: {self.message}"
