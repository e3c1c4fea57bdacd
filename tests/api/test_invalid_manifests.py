"""The local launcher refuses every manifest of the shared table, naming the field (the API server side of the
same table is e2e/test_crd_validation.py)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

import invalid_manifests
from kubeforge.api import load


def test_the_base_manifest_is_valid() -> None:
    load.parse(invalid_manifests.valid())


def test_the_table_is_large_and_ids_unique() -> None:
    ids = [c.id for c in invalid_manifests.ALL_CASES]
    assert len(invalid_manifests.CASES) >= 30 and len(invalid_manifests.SEMANTIC_CASES) >= 20
    assert len(set(ids)) == len(ids)


@pytest.mark.parametrize("case", invalid_manifests.ALL_CASES, ids=lambda c: c.id)
def test_launcher_refuses_naming_the_field(case: invalid_manifests.Case) -> None:
    with pytest.raises(load.InvalidRLJob) as info:
        load.parse(case.manifest())
    problems = info.value.problems
    assert problems, "an InvalidRLJob must carry at least one problem"
    # every problem names the case's field (the case breaks one rule only) ...
    assert all(p.startswith(case.path) for p in problems), problems
    # ... and one says what the API server says
    assert any(case.message.lower() in p.lower() for p in problems), problems


@pytest.mark.parametrize("case", invalid_manifests.SEMANTIC_CASES[:3] + invalid_manifests.CASES[:2],
                         ids=lambda c: c.id)
def test_kubeforge_validate_prints_each_problem_and_exits_1(case: invalid_manifests.Case, tmp_path: object) -> None:
    path = f"{tmp_path}/job.json"
    with open(path, "w") as f:
        json.dump(case.manifest(), f)
    run = subprocess.run([sys.executable, "-m", "kubeforge.cli", "validate", path], capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == 1, run
    lines = run.stdout.splitlines()
    assert lines and all(line.startswith(case.path) for line in lines), lines
    assert any(case.message.lower() in line.lower() for line in lines), lines


def test_kubeforge_validate_accepts_the_examples() -> None:
    import pathlib
    root = pathlib.Path(__file__).resolve().parents[2]
    for example in sorted((root / "examples").glob("*.yaml")):
        run = subprocess.run([sys.executable, "-m", "kubeforge.cli", "validate", str(example)], capture_output=True,
                             text=True, timeout=60)
        assert run.returncode == 0 and run.stdout.strip().endswith(": valid"), run
