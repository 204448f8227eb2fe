"""`make run`'s demo: every section runs and says what it should."""

from __future__ import annotations

import io
import re

from npumem import Policy, demo
from npumem.errors import OutOfMemoryError, UnsupportedError


def test_demo_runs_every_section():
    out = io.StringIO()
    demo.run(out=out)
    text = out.getvalue()
    sections = re.findall(r"^(\d+)\. ", text, re.M)
    assert sections == [str(i) for i in range(1, 13)]
    assert "7. Graph planning" in text and "8. Host memory pool" in text
    assert "owned by 'npumem_host_pool' (ok)" in text
    assert "9. Device allocation at Python speed" in text and "is caught as use after free" in text
    # Section 11: a pyACL program on two devices, its peer-access error, and its leak report.
    assert "before device_enable_peer_access: ret 107000" in text and "bytes arrive intact" in text
    assert re.search(r"leak: 16777216 bytes of device 1 at 0x[0-9a-f]+ \(malloc\) from .*demo\.py:\d+", text)
    assert "never destroyed" in text
    # Every memory-limit row of section 7 fits.
    rows = [line for line in text.splitlines() if re.match(r"\s+\d+%\s", line)]
    assert len(rows) == 3 and all(line.rstrip().endswith("yes") for line in rows)


def test_mlp_training_graph_shape():
    g = demo.mlp_training_graph(layers=3, batch=8, hidden=16)
    assert g.ops == ["fc1", "fc2", "fc3", "loss", "fc3_backward", "fc2_backward", "fc1_backward"]
    p = g.plan()
    r = p.report()
    assert r["weight_memory"] == 3 * 1024 and r["activation_memory"] == r["lower_bound"]
    assert all(p.resident(f"dW{i}") for i in (1, 2, 3))


def host_section() -> str:
    out = io.StringIO()
    demo.host_memory(out)
    return out.getvalue()


def test_host_section_counts_the_system_calls_and_shows_aliases():
    text = host_section()
    assert text.splitlines()[1].startswith("10. Real memory")
    allocs = int(re.search(r"A training trace \((\d+) mallocs", text)[1])
    rows = {
        (m[1], m[2]): [int(v) for v in m.groups()[2:]]
        for m in re.finditer(r"^\s+(\w+)\s+(first|second)\s+[\d.]+\s+(\d+)\s+(\d+)\s+(\d+)$", text, re.M)
    }
    # direct: one memfd, mmap and unmap per malloc, on every pass
    assert rows["direct", "first"] == rows["direct", "second"] == [allocs] * 3
    # the pool: pages mapped on the first pass, none unmapped; no system call on the second
    assert rows["npumem", "first"][1] > 0 and rows["npumem", "first"][2] == 0
    assert rows["npumem", "second"] == [0, 0, 0]
    assert "b'written through the first mapping' (ok; translate() gives both one physical address)" in text
    assert ("hugetlb pool has" in text) != ("echo 64 > /proc/sys/vm/nr_hugepages" in text)


def test_host_section_where_the_host_backend_cannot_run(monkeypatch):
    class NoHostBackend(demo.Device):
        def __init__(self, *args, backend="sim", **kwargs):
            if backend == "host":
                raise UnsupportedError(200006, "ACL_ERROR_FEATURE_UNSUPPORTED", "no memfd on this system")
            super().__init__(*args, backend=backend, **kwargs)

    monkeypatch.setattr(demo, "Device", NoHostBackend)
    text = host_section()
    assert "(skipped: the host backend cannot run here: " in text and "no memfd on this system" in text


def test_host_section_without_huge_pages(monkeypatch):
    class NoHugePages(demo.Device):
        def malloc(self, size, policy=None, stream=None):
            if policy == Policy.HUGE_ONLY:
                raise OutOfMemoryError(207001, "ACL_ERROR_RT_MEMORY_ALLOCATION", "no free 2 MiB pages")
            return super().malloc(size, policy, stream)

    monkeypatch.setattr(demo, "Device", NoHugePages)
    text = host_section()
    assert "HUGE_ONLY fails (out of memory)" in text and "echo 64 > /proc/sys/vm/nr_hugepages" in text
    assert re.search(r"^\s+npumem\s+second\s+[\d.]+\s+0\s+0\s+0$", text, re.M)


def test_generated_workload_section_with_and_without_matplotlib(tmp_path, monkeypatch):
    out = io.StringIO()
    png = tmp_path / "timeline.png"
    assert demo.generated_workload(out, str(png)) == []
    text = out.getvalue()
    ratios = {m[1]: float(m[2]) for m in re.finditer(r"^\s+(\w+)\s+[\d.]+\wiB\s+[\d.]+\wiB\s+([\d.]+)x$", text, re.M)}
    assert set(ratios) == {"direct", "pytorch", "torch_npu", "npumem"}
    assert ratios["npumem"] < 1.05 < 1.3 < min(ratios["pytorch"], ratios["torch_npu"])
    assert png.read_bytes()[:4] == b"\x89PNG" and f"Timeline: {png}" in text
    # Without matplotlib: a one-line hint back, and the rest of the section kept.
    from npumem import _optional

    def missing(module, purpose):
        raise _optional.MissingDependencyError(f"{purpose} needs matplotlib, which is not installed")

    monkeypatch.setattr(_optional, "require", missing)
    out = io.StringIO()
    hints = demo.generated_workload(out, str(tmp_path / "other.png"))
    assert len(hints) == 1 and "matplotlib" in hints[0]
    assert "(no timeline plot: matplotlib is not installed)" in out.getvalue() and "npumem    |" in out.getvalue()
