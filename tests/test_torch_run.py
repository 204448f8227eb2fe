"""``python -m npumem.torch script.py``: an unmodified torch_npu-style script on the npu device,
configured by the environment; usage errors are one line and exit status 2."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys
import textwrap

import pytest
from conftest import require_torch

require_torch()

SCRIPT = textwrap.dedent(
    """
    import sys
    import torch
    import torch_npu  # the program as written for Ascend

    import npumem.torch

    model = torch.nn.Linear(16, 4).npu()
    loss = model(torch.randn(8, 16, device="npu")).square().mean()
    loss.backward()
    s = npumem.torch.installed()
    print("fine", torch.npu.device_count(), torch.npu.memory_allocated() > 0, s.capacity, s.allocator, s.alloc_conf)
    print("args", sys.argv[1:], torch_npu.npu is torch.npu)
    sys.exit(3)
    """
)


#: How a bad value's message starts (its AscendCL code).
BAD = "ACL_ERROR_INVALID_PARAM (100000): "


def _run(tmp_path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("NPUMEM_", "PYTORCH_NPU"))}
    return subprocess.run(
        [sys.executable, "-m", "npumem.torch", str(script), *args],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_script_runs_on_npu_with_its_arguments_exit_status_and_the_environment_s_device(tmp_path):
    env = {"NPUMEM_CAPACITY": "256MiB", "NPUMEM_ALLOCATOR": "pytorch", "PYTORCH_NPU_ALLOC_CONF": "max_split_size_mb:64"}
    out = _run(tmp_path, env, "--epochs", "1")
    assert out.returncode == 3, out.stderr
    assert out.stdout.splitlines() == [
        f"fine 1 True {256 << 20} pytorch max_split_size_mb:64",
        "args ['--epochs', '1'] True",
    ]


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {"NPUMEM_TORCH_MODE": "shape", "NPUMEM_BACKEND": "host"},
            f"npumem.torch: {BAD}NPUMEM_BACKEND='host' with mode='shape': shape mode has no bytes",
        ),
        ({"NPUMEM_ALLOC_CONF": "nonsense"}, f"npumem.torch: {BAD}NPUMEM_ALLOC_CONF='nonsense'"),
    ],
)
def test_a_bad_variable_is_one_line_and_exit_status_2(tmp_path, env, message):
    out = _run(tmp_path, env)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.startswith(message) and len(out.stderr.strip().splitlines()) == 1


def test_usage_errors_exit_2():
    run = [sys.executable, "-m", "npumem.torch"]
    out = subprocess.run([*run, "no-such-script.py"], capture_output=True, text=True, timeout=120)
    assert (out.returncode, out.stderr) == (2, "npumem.torch: no-such-script.py: no such file\n")
    out = subprocess.run(run, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and out.stderr.startswith("usage: python -m npumem.torch script.py")


def _python_block(path: str, after: str) -> str:
    text = (pathlib.Path(__file__).resolve().parents[1] / path).read_text()
    return re.search(r"```python\n(.*?)```", text[text.index(after) :], re.S).group(1)


def test_the_readme_and_docs_examples_run_as_written():
    readme = _python_block("README.md", "## Your PyTorch program on a simulated NPU")
    docs = _python_block("docs/torch-device.md", "# A PyTorch `npu` device")
    assert readme == docs
    out = subprocess.run([sys.executable, "-c", readme], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "npumem memory summary" in out.stdout and "allocated memory" in out.stdout


def test_without_torch_the_torch_tests_skip_except_under_ci(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` now raises ImportError
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match=r"CI=true: torch is not installed"):
        require_torch()
    monkeypatch.delenv("CI")
    with pytest.raises(pytest.skip.Exception, match=r"pip install -r requirements-torch.txt"):
        require_torch()
