"""``kubeforge run`` and a role's ``valueFrom``: taken from the launcher's environment, refused naming the field
when it is missing and not optional (docs/launcher.md, "Secrets and ConfigMaps")."""
from __future__ import annotations

import json
import pathlib

import pytest
import yaml

from kubeforge.api import load
from kubeforge.runtime.launcher import localenv
from kubeforge.runtime.launcher import main as launcher_main

ROOT = pathlib.Path(__file__).resolve().parents[2]


def job(optional: bool = False) -> load.rljob.RLJob:
    doc = yaml.safe_load((ROOT / "examples" / "hf-token-secret.yaml").read_text())
    doc["spec"]["roles"]["trainer"]["env"][0]["valueFrom"]["secretKeyRef"]["optional"] = optional
    doc["spec"]["roles"]["trainer"]["env"].append({"name": "PLAIN", "value": "1"})
    doc["spec"]["roles"]["trainer"]["envFrom"] = [{"secretRef": {"name": "api-keys"}}]
    return load.parse(doc)


def test_value_from_reads_the_launchers_variable_of_the_same_name() -> None:
    j = job()
    assert localenv.problems(j, {"HF_TOKEN": "t0ken"}) == []
    assert localenv.values(j.spec.roles.trainer, {"HF_TOKEN": "t0ken", "OTHER": "x"}) == {"HF_TOKEN": "t0ken",
                                                                                          "PLAIN": "1"}


def test_a_missing_required_value_is_refused_naming_the_field() -> None:
    (problem,) = localenv.problems(job(), {})
    assert problem.startswith("spec.roles.trainer.env[0].valueFrom: Required value: kubeforge run reads no Secret")
    assert "set HF_TOKEN in the launcher's environment" in problem and "'hf-token', key 'token'" in problem
    assert localenv.problems(job(optional=True), {}) == []       # optional: unset, as on a pod
    assert localenv.values(job(optional=True).spec.roles.trainer, {}) == {"PLAIN": "1"}


def test_run_refuses_before_any_process(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("HF_TOKEN", raising=False)
    path = tmp_path / "job.json"
    path.write_text(json.dumps(load.dump(job())))
    assert launcher_main.run(file=str(path), run_dir=str(tmp_path / "run")) == load.EXIT_INVALID
    assert capsys.readouterr().err.startswith(f"kubeforge: {path}: spec.roles.trainer.env[0].valueFrom: ")
    assert not (tmp_path / "run").exists()
