"""`make run`'s demo: every section runs and says what it should."""

from __future__ import annotations

import io
import re

from npumem import demo


def test_demo_runs_every_section():
    out = io.StringIO()
    demo.run(out=out)
    text = out.getvalue()
    sections = re.findall(r"^(\d)\. ", text, re.M)
    assert sections == [str(i) for i in range(1, 10)]
    assert "7. Graph planning" in text and "8. Host memory pool" in text
    assert "owned by 'npumem_host_pool' (ok)" in text
    assert "9. Device allocation at Python speed" in text and "is caught as use after free" in text
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
