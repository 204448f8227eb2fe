"""``npumem fit``: runs a PyTorch script on an npu device of a given size and answers whether it
fits (exit 0), where it ran out of memory in the user's own code (exit 1), or why the command
line is wrong (one line, exit 2)."""

from __future__ import annotations

import io
import json
import pickle
import subprocess
import sys
import textwrap
import time

import pytest
from conftest import require_torch

torch = require_torch()

SCRIPT = textwrap.dedent(
    """
    import sys
    import torch

    model = torch.nn.Linear(256, 256).npu()
    x = torch.randn(64, 256, device="npu")
    model(x).sum().backward()
    big = torch.empty(int(sys.argv[1]), device="npu")
    """
)


#: How a bad value's message starts (its AscendCL code).
BAD = "ACL_ERROR_INVALID_PARAM (100000): "


def _fit(tmp_path, *args: str) -> subprocess.CompletedProcess:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    cmd = [sys.executable, "-m", "npumem", "fit", *[str(script) if a == "SCRIPT" else a for a in args]]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=180)


def test_a_script_that_runs_out_of_memory_does_not_fit_at_its_own_line(tmp_path):
    out = _fit(tmp_path, "--capacity", "256MiB", "SCRIPT", str(100 << 20))  # 400 MiB of floats
    assert out.returncode == 1, out.stderr
    line = out.stdout.strip()
    assert line.startswith(f"does not fit: out of memory at {tmp_path / 'train.py'}:8, tried to allocate 400.00 MiB")
    assert line.endswith("reserved (of 256.00 MiB)")
    assert out.stderr.startswith("npumem fit: running")


def test_a_script_that_fits_reports_its_peaks_as_json_and_writes_the_snapshot(tmp_path):
    snap, png = tmp_path / "snap.pickle", tmp_path / "timeline.png"
    out = _fit(
        tmp_path,
        *("--capacity", "256MiB", "--allocator", "pytorch", "--json", "--snapshot", str(snap), "--plot", str(png)),
        *("SCRIPT", "1000"),
    )
    assert out.returncode == 0, out.stderr
    answer = json.loads(out.stdout)
    assert answer["fits"] is True and answer["out_of_memory"] is None
    assert answer["capacity"] == 256 << 20 and answer["allocator"] == "pytorch"
    # weights, bias, input, output, their gradients: at least these bytes were live at once
    assert answer["peak_allocated"] >= 4 * (256 * 256 + 256 + 2 * 64 * 256)
    assert answer["peak_reserved"] >= answer["peak_allocated"]
    with open(snap, "rb") as f:
        assert any(e["action"] == "alloc" for e in pickle.load(f)["device_traces"][0])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000  # matplotlib's timeline


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("tty", [True, False])
def test_the_progress_line_is_rewritten_on_a_terminal_and_throttled_elsewhere(npu, monkeypatch, tty):
    from npumem.torch import timeline

    monkeypatch.setattr(timeline, "TTY_EVERY_S" if tty else "PLAIN_EVERY_S", 0.01)
    out = _Terminal() if tty else io.StringIO()
    keep = torch.empty(1000, device="npu")
    progress = timeline.Progress([npu], out)
    progress.begin()
    time.sleep(0.1)
    progress.stop()
    text = out.getvalue()
    line = f"npumem fit: 0 s, allocated {timeline.format_size(npu.memory_allocated())}, reserved "
    if tty:  # rewritten in place, and cleared at the end
        assert text.startswith("\r\x1b[K" + line) and text.endswith("\r\x1b[K") and "\n" not in text
    else:
        assert text.startswith(line) and text.endswith(")\n") and "\r" not in text
    del keep


def test_bad_options_are_one_line_and_exit_status_2(tmp_path):
    for args, message in [
        (["--capacity", "lots", "SCRIPT"], f"npumem fit: {BAD}--capacity 'lots': expected a size"),
        (["--mode", "meta", "SCRIPT"], f"npumem fit: {BAD}--mode 'meta': expected one of host, shape"),
        (["--devices", "65", "SCRIPT"], f"npumem fit: {BAD}--devices 65: expected a number of devices from 1 to 64"),
        (["missing.py"], "npumem fit: missing.py: no such file"),
        (["/dev/zero"], "npumem fit: /dev/zero: not a file"),
        (["--plot", "/no/such/dir/t.png", "SCRIPT"], "npumem fit: --plot"),
    ]:
        out = _fit(tmp_path, *args)
        assert out.returncode == 2, (args, out.stderr)
        assert out.stderr.startswith(message) and len(out.stderr.strip().splitlines()) == 1, out.stderr


TWO_DEVICES = textwrap.dedent(
    """
    import sys
    import torch

    a = torch.ones(1 << 20, device="npu:0")  # 4 MiB on npu:0
    b = torch.ones(4 << 20, device="npu:1")  # 16 MiB on npu:1
    c = (b * 2).to("npu:0")
    big = torch.empty(int(sys.argv[1]), device="npu:1")
    """
)


def test_with_two_devices_the_answer_and_the_snapshot_cover_each_device(tmp_path):
    from torch.cuda import _memory_viz

    script = tmp_path / "two.py"
    script.write_text(TWO_DEVICES)
    snap = tmp_path / "two.pickle"
    fit = [sys.executable, "-m", "npumem", "fit", "--devices", "2", "--capacity", "256MiB"]
    runs = [  # both at once: each is a fresh process importing torch
        subprocess.Popen([*fit, "--snapshot", str(snap), str(script), str(100 << 20)], stdout=-1, stderr=-1, text=True),
        subprocess.Popen([*fit, "--json", str(script), "1000"], stdout=-1, stderr=-1, text=True),
    ]
    (oom, oom_err), (fits, fits_err) = (r.communicate(timeout=180) for r in runs)
    assert runs[0].returncode == 1, oom_err
    assert oom.startswith(f"does not fit: out of memory on npu:1 at {script}:8, tried to allocate 400.00 MiB with ")
    assert "; npu:0 peak reserved " in oom and "; npu:1 peak reserved " in oom
    with open(snap, "rb") as f:
        dumped = pickle.load(f)
    assert {s["device"] for s in dumped["segments"]} == {0, 1} and len(dumped["device_traces"]) == 2
    sizes = [[e["size"] for e in t if e["action"] == "alloc"] for t in dumped["device_traces"]]
    # each device's own history, in torch_npu's rounding (32 bytes more, to 512): a, then b
    assert sizes[0][0] == (4 << 20) + 512 and sizes[1][0] == (16 << 20) + 512 and (4 << 20) + 512 not in sizes[1]
    assert "Summary of segments" in _memory_viz.segsum(dumped)
    trace = _memory_viz.trace(dumped)
    assert "Device 0 ----" in trace and "Device 1 ----" in trace
    assert "<html" in _memory_viz.trace_plot(dumped).lower()  # every device

    assert runs[1].returncode == 0, fits_err
    answer = json.loads(fits)
    assert [d["device"] for d in answer["devices"]] == ["npu:0", "npu:1"]
    zero, one = answer["devices"]
    assert answer["peak_allocated"] == zero["peak_allocated"] and not zero["out_of_memory"]
    assert zero["peak_allocated"] >= 20 << 20 and one["peak_allocated"] >= 32 << 20  # a and c; b and b * 2
