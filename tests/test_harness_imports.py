"""The test harness (``e2e/kfcluster``) has no import circle, and is importable without a ``sys.path`` edit.

The circle ``kueue`` <-> ``lifecycle`` (issue 38) was broken by moving the cluster's record into ``record``; this
reads every module's imports (function-level ones too: the old circle hid in one) and fails naming any circle.
Importability: pytest finds ``kfcluster`` through ``pythonpath`` in pyproject.toml, bench scripts through the
harness's own editable install (``e2e/pyproject.toml``, installed by ``make venv``), and no file of bench/ or the
root conftest puts ``e2e/`` on ``sys.path``.
"""
from __future__ import annotations

import ast
import pathlib
import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "e2e" / "kfcluster"


def imports_of(path: pathlib.Path) -> set[str]:
    """The ``kfcluster`` modules ``path`` imports, anywhere in it (``from kfcluster import x``, ``import
    kfcluster.x``, ``from kfcluster.x import y``)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "kfcluster":
                out.update(alias.name for alias in node.names)
            elif node.module.startswith("kfcluster."):
                out.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            out.update(a.name.split(".")[1] for a in node.names if a.name.startswith("kfcluster."))
    return out


def graph() -> dict[str, set[str]]:
    modules = {p.stem for p in PACKAGE.glob("*.py") if p.stem not in ("__init__", "__main__")}
    modules |= {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    return {m: imports_of(PACKAGE / f"{m}.py") & modules - {m}
            for m in sorted(modules) if (PACKAGE / f"{m}.py").is_file()}


def circles(g: dict[str, set[str]]) -> list[list[str]]:
    """Every circle reachable in ``g``, each as the path that closes it (depth-first, colours)."""
    found: list[list[str]] = []
    state: dict[str, int] = {}          # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(g.get(node, ())):
            if state.get(nxt) == 1:
                stack = path + [node]
                found.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, path + [node])
        state[node] = 2

    for node in sorted(g):
        if node not in state:
            visit(node, [])
    return found


def test_the_harness_has_no_import_circle() -> None:
    g = graph()
    assert {"lifecycle", "kueue", "record"} <= set(g), sorted(g)
    assert "kueue" in g["lifecycle"] and "lifecycle" not in g["kueue"]
    assert circles(g) == []


def test_the_circle_finder_sees_a_circle() -> None:
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_kfcluster_is_found_without_sys_path_edits() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "e2e" in pyproject["tool"]["pytest"]["ini_options"]["pythonpath"]
    harness = tomllib.loads((ROOT / "e2e" / "pyproject.toml").read_text())
    assert "kfcluster" in harness["tool"]["setuptools"]["packages"]
    for path in [ROOT / "conftest.py", *sorted((ROOT / "bench").rglob("*.py"))]:
        text = path.read_text()
        assert not ("sys.path" in text and "e2e" in text), f"{path.relative_to(ROOT)} puts e2e/ on sys.path"
