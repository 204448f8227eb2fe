"""The package's import graph is acyclic.

- Every ``import`` and ``from ... import`` in ``python/npumem`` counts, at module level and inside
  functions alike (a lazy import is still an arrow between two modules).
- ``from . import name`` is an arrow to the submodule ``name`` when one exists, else to the package.
- An import of the package root (``npumem/__init__.py``) from a submodule is an arrow too.
"""

from __future__ import annotations

import ast
import itertools
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent / "python" / "npumem"


def _modules() -> dict[str, pathlib.Path]:
    mods: dict[str, pathlib.Path] = {}
    for p in sorted(ROOT.rglob("*.py")) + sorted(ROOT.rglob("*.pyi")):
        parts = list(p.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods.setdefault(".".join(parts), p)
    return mods


def _graph() -> dict[str, dict[str, int]]:
    mods = _modules()
    graph: dict[str, dict[str, int]] = {}
    for name, path in mods.items():
        if path.suffix != ".py":
            continue
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        arrows: dict[str, int] = {}
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    module = ".".join(base + ([node.module] if node.module else []))
                else:
                    module = node.module or ""
                targets = [f"{module}.{a.name}" if f"{module}.{a.name}" in mods else module for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            for target in targets:
                if target in mods and target != name and mods[target].suffix == ".py":
                    arrows.setdefault(target, node.lineno)
        graph[name] = arrows
    return graph


def _cycle(graph: dict[str, dict[str, int]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(v: str) -> list[str] | None:
        state[v] = 1
        path.append(v)
        for w in graph[v]:
            if state.get(w) == 1:
                return [*path[path.index(w) :], w]
            if w not in state and (found := visit(w)):
                return found
        path.pop()
        state[v] = 2
        return None

    for v in sorted(graph):
        if v not in state and (found := visit(v)):
            return found
    return None


def test_the_graph_sees_the_package():
    graph = _graph()
    assert {"npumem", "npumem.formats", "npumem.replay", "npumem.device", "npumem.acl"} <= set(graph)
    assert "npumem.formats" in graph["npumem.replay"]
    assert "npumem.errors" in graph["npumem.device"]


def test_a_cycle_is_found():
    assert _cycle({"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b": 1}, "b": {}}) is None


def test_no_import_cycle_in_the_package():
    graph = _graph()
    cycle = _cycle(graph)
    shown = " -> ".join(f"{a} (line {graph[a][b]})" for a, b in itertools.pairwise(cycle or []))
    assert cycle is None, f"import cycle: {shown} -> {cycle[-1]}"
