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
def test_kubeforge_validate_prints_each_problem_on_stderr_and_exits_2(case: invalid_manifests.Case,
                                                                     tmp_path: object) -> None:
    """Issue 37 item 7: the refusal of ``kubeforge run`` (stderr, ``kubeforge: FILE: path: message``, exit 2)."""
    path = f"{tmp_path}/job.json"
    with open(path, "w") as f:
        json.dump(case.manifest(), f)
    run = subprocess.run([sys.executable, "-m", "kubeforge.cli", "validate", path], capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == load.EXIT_INVALID == 2 and run.stdout == "", run
    lines = run.stderr.splitlines()
    assert lines and all(line.startswith(f"kubeforge: {path}: {case.path}") for line in lines), lines
    assert any(case.message.lower() in line.lower() for line in lines), lines


def test_kubeforge_validate_accepts_the_examples() -> None:
    import pathlib
    root = pathlib.Path(__file__).resolve().parents[2]
    for example in sorted((root / "examples").glob("*.yaml")):
        run = subprocess.run([sys.executable, "-m", "kubeforge.cli", "validate", str(example)], capture_output=True,
                             text=True, timeout=60)
        assert run.returncode == 0 and run.stdout.strip().endswith(": valid"), run


# ---------------------------------------------------------------- one truth for names and refusals (issue 37 item 7)


@pytest.mark.parametrize(("path", "value"), [(("spec", "algorithm", "steps"), "5"), (("spec", "suspend"), "yes")])
def test_a_quoted_number_or_boolean_is_refused_as_on_the_api_server(path: tuple[str, ...], value: str) -> None:
    """Types are strict, as the API server types JSON values (docs/api.md, "Defaults and null")."""
    doc = invalid_manifests.valid()
    node = doc
    for p in path[:-1]:
        node = node.setdefault(p, {})
    node[path[-1]] = value
    with pytest.raises(load.InvalidRLJob) as info:
        load.parse(doc)
    assert any(line.startswith(".".join(path) + ":") for line in info.value.problems), info.value.problems


@pytest.mark.parametrize("field", ["spec.algorithm.prompts_per_step", "spec.failure_policy",
                                   "spec.roles.trainer.image_pull_secrets", "metadata.name"])
def test_snake_case_names_are_unknown_fields_as_on_the_api_server(field: str) -> None:
    """The model's Python names are not wire names: a manifest spelling one is refused as the API server refuses
    an unknown field (strict field validation), never silently taken."""
    doc = invalid_manifests.valid()
    if field == "metadata.name":          # a wire name stays valid (the control case)
        assert load.parse(doc).metadata.name
        return
    *parents, leaf = field.split(".")
    node = doc
    for p in parents:
        node = node.setdefault(p, {})
    node[leaf] = 3 if leaf == "prompts_per_step" else ({"maxRestarts": 1} if leaf == "failure_policy" else [])
    with pytest.raises(load.InvalidRLJob) as info:
        load.parse(doc)
    assert info.value.problems == [f"{field}: Unknown field: field not declared in schema"]


@pytest.mark.parametrize("bad", ["lots", [1], {"a": 1}, True])
def test_a_union_error_is_one_line_naming_the_field(bad: object) -> None:
    """``int | quantity`` (x-kubernetes-int-or-string): one problem, not one per union member."""
    doc = invalid_manifests.valid()
    doc["spec"].setdefault("roles", {}).setdefault("trainer", {})["resources"] = {"limits": {"cpu": bad}}
    with pytest.raises(load.InvalidRLJob) as info:
        load.parse(doc)
    assert len(info.value.problems) == 1, info.value.problems
    assert info.value.problems[0].startswith("spec.roles.trainer.resources.limits.cpu: Invalid value: ")


def test_every_union_of_the_model_is_one_error() -> None:
    """A union other than "X or null" in the schema must be one the test above covers (``IntOrQuantity``): a new
    one would print pydantic's error per member again."""
    from kubeforge.api import crd

    found = []

    def walk(node: object, path: str) -> None:
        if isinstance(node, dict):
            options = [o for o in node.get("anyOf", []) if o.get("type") != "null"]
            if len(options) > 1:
                found.append((path, sorted(str(o.get("type")) for o in options)))
            for k, v in node.items():
                walk(v, f"{path}.{k}")
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, f"{path}[{i}]")

    walk(crd.json_schema(), "")
    assert found and all(types == ["integer", "string"] and "ResourceRequirements" in path for path, types in found), \
        found


def test_validate_and_run_refuse_with_the_same_lines_and_status(tmp_path: object) -> None:
    doc = invalid_manifests.valid()
    doc["spec"]["algorithm"]["prompts_per_step"] = 3
    doc["spec"]["algorithm"]["groupSize"] = 1
    path = f"{tmp_path}/job.json"
    with open(path, "w") as f:
        json.dump(doc, f)
    runs = [subprocess.run([sys.executable, "-m", "kubeforge.cli", cmd, path], capture_output=True, text=True,
                           timeout=120) for cmd in ("validate", "run")]
    assert [r.returncode for r in runs] == [load.EXIT_INVALID] * 2, runs
    assert runs[0].stderr == runs[1].stderr and runs[0].stdout == runs[1].stdout == "", runs
    assert sorted(runs[0].stderr.splitlines()) == [
        f"kubeforge: {path}: spec.algorithm.groupSize: Invalid value: 1: should be greater than or equal to 2",
        f"kubeforge: {path}: spec.algorithm.prompts_per_step: Unknown field: field not declared in schema"]
