"""Every third-party module kubeforge's packages import is a declared dependency of the install that ships them:
api/ and operator/ from the base dependencies (the operator image installs only those), runtime/ from those plus the
``runtime`` extra (vLLM from ``cpu``/``gpu``). The bug this guards: the operator imported ``urllib3``, which came only
through the ``kubernetes`` client; when that left the dependencies the operator image failed to build."""

from __future__ import annotations

import ast
import importlib.metadata
import pathlib
import re
import sys
import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
# distributions that come with a declared one and are imported as part of it
PART_OF = {"pydantic-core": "pydantic"}


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_names(reqs: list[str]) -> set[str]:
    return {canonical(re.split(r"[\s<>=!~;\[]", r, maxsplit=1)[0]) for r in reqs}


def third_party_imports(tree: str) -> dict[str, str]:
    """Top-level module -> a file importing it, for every non-stdlib, non-kubeforge absolute import under ``tree``."""
    found: dict[str, str] = {}
    for path in sorted((ROOT / tree).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            for name in names:
                top = name.split(".")[0]
                if top != "kubeforge" and top not in sys.stdlib_module_names:
                    found.setdefault(top, str(path.relative_to(ROOT)))
    return found


def undeclared(tree: str, declared: set[str]) -> list[str]:
    dists = importlib.metadata.packages_distributions()
    out = []
    for module, where in third_party_imports(tree).items():
        names = {canonical(PART_OF.get(canonical(d), d)) for d in dists.get(module, [module])}
        if not names & declared:
            out.append(f"{module} (imported by {where}; distribution {sorted(names)})")
    return out


def test_the_base_packages_import_only_base_dependencies() -> None:
    base = requirement_names(PROJECT["dependencies"])
    assert undeclared("api", base) == [] and undeclared("operator", base) == []


# The one runtime file that runs in the environments' interpreter (`make venv-envs`), with its own requirements.
ENVS_RUNNER = "runtime/kubeforge/runtime/agents/primeintellect/runner.py"
ENVS_REQUIREMENTS = ROOT / "images" / "envs-requirements.txt"


def test_the_runtime_imports_only_what_its_extras_declare() -> None:
    extras = PROJECT["optional-dependencies"]
    declared = requirement_names(PROJECT["dependencies"] + extras["runtime"] + extras["cpu"] + extras["gpu"])
    envs = requirement_names([r for r in ENVS_REQUIREMENTS.read_text().splitlines() if r.strip()])
    missing = undeclared("runtime", declared)
    assert [m for m in missing if not (f"imported by {ENVS_RUNNER};" in m and m.split()[0] in envs)] == []


def test_the_guard_sees_an_undeclared_import() -> None:
    assert "urllib3" in third_party_imports("operator")
    missing = undeclared("operator", requirement_names(["kopf", "pydantic", "pyyaml", "cryptography",
                                                        "prometheus-client"]))
    assert [m.split()[0] for m in missing] == ["urllib3"]
