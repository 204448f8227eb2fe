"""The README's Python tour runs as written."""

from __future__ import annotations

import pathlib
import re

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def test_readme_opens_with_the_two_commands():
    first_block = re.search(r"```\n(.*?)```", README.read_text(), re.S).group(1)
    assert first_block.split() == ["make", "run", "make", "test"]


def test_readme_python_tour_runs(capsys):
    code = re.search(r"```python\n(.*?)```", README.read_text(), re.S).group(1)
    exec(compile(code, str(README), "exec"), {})
    out = capsys.readouterr().out
    assert "npumem memory summary" in out
