"""The pyACL examples run unchanged under ``python -m npumem.run``, and the runner's own promises:
``import acl`` resolves for that process only, bad settings are a one-line error (exit 2), the
script's exit status is kept, and a program that never finalizes gets its leak report at exit."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((ROOT / "examples" / "pyacl").glob("*.py"))


def run(args: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("NPUMEM_")}
    environ.update({"NPUMEM_DEVICES": "2", "NPUMEM_CAPACITY": "1GiB"}, **env)
    return subprocess.run(
        [sys.executable, "-m", "npumem.run", *args], capture_output=True, text=True, env=environ, timeout=300
    )


def test_there_are_examples():
    names = {p.name for p in EXAMPLES}
    assert {"memory_copy.py", "dvpp_async.py", "p2p_copy.py", "ipc_export_import.py"} <= names


@pytest.mark.parametrize("script", EXAMPLES, ids=lambda p: p.name)
def test_example_runs_clean(script: Path):
    done = run([str(script)])
    assert done.returncode == 0, done.stderr
    assert "ok" in done.stdout or "reads" in done.stdout
    assert "leak and misuse report" not in done.stderr, done.stderr


def test_bad_environment_is_one_line(tmp_path):
    script = tmp_path / "s.py"
    script.write_text("import acl\n")
    done = run([str(script)], NPUMEM_DEVICES="lots")
    assert done.returncode == 2
    assert "NPUMEM_DEVICES='lots'" in done.stderr and "Traceback" not in done.stderr
    done = run([str(script)], NPUMEM_BACKEND="gpu")
    assert done.returncode == 2 and "sim, host" in done.stderr
    assert run([str(tmp_path / "missing.py")]).returncode == 2
    assert run([]).returncode == 2


def test_exit_status_argv_and_report_at_exit(tmp_path):
    script = tmp_path / "leaky.py"
    script.write_text(
        "import sys\nimport acl\n"
        "acl.init()\nacl.rt.set_device(1)\n"
        "ptr, ret = acl.rt.malloc(4096, 0)\n"
        "print(sys.argv[1:], ret)\n"
        "sys.exit(3)\n"
    )
    done = run([str(script), "a", "b"])
    assert done.returncode == 3
    assert done.stdout.strip() == "['a', 'b'] 0"
    assert f"{script}:5" in done.stderr and "leak" in done.stderr
