"""An RLJob that names a GeneratorPool (``spec.generatorPool``), and the pool's own manifest: what the launcher's
``kubeforge validate`` refuses, alone and with the pool's file beside the job's (docs/generator-pool.md). The API
server's side of the job-only rule is ``invalid_manifests``' ``pool-*`` cases (e2e/test_crd_validation.py); the
webhook's pool lookup is tests/operator/test_pool_admission.py."""
from __future__ import annotations

import pathlib
from typing import Any

import pytest
import yaml

from kubeforge import cli
from kubeforge.api import generatorpool, load, rljob, validate_pool

import invalid_manifests  # tests/api: valid()

Manifest = dict[str, Any]


def pool(**spec: Any) -> Manifest:
    return {"apiVersion": "kubeforge.dev/v1alpha1", "kind": "GeneratorPool", "metadata": {"name": "shared"},
            "spec": {"model": {"builtin": "tiny"}, "maxLoraRank": 16, **spec}}


def job(name: str = "job-a", *, rank: int = 8, dtype: str = "float32", pool_name: str = "shared") -> Manifest:
    doc = invalid_manifests.valid()
    doc["metadata"]["name"] = name
    doc["spec"]["model"] = {"builtin": "tiny", "dtype": dtype, "lora": {"rank": rank}}
    doc["spec"]["generatorPool"] = {"name": pool_name}
    return doc


def check(*docs: Manifest) -> dict[str, list[str]]:
    texts = {f"{d['kind']}-{d['metadata']['name']}.yaml": yaml.safe_dump(d) for d in docs}
    return load.check_texts(texts)[1]


def test_a_lora_job_on_its_pool_is_valid() -> None:
    assert check(pool(), job(), job("job-b", rank=16)) == {}
    parsed = load.parse(job())
    assert parsed.spec.own_roles() == ("verifier", "trainer")
    assert load.parse(invalid_manifests.valid()).spec.own_roles() == ("generator", "verifier", "trainer")


def test_a_job_without_lora_is_refused_naming_the_field() -> None:
    doc = job()
    del doc["spec"]["model"]["lora"]
    with pytest.raises(load.InvalidRLJob) as exc:
        load.parse(doc)
    assert exc.value.problems == [f"spec: {rljob.MSG_POOL_NEEDS_LORA}"]
    assert "generatorPool" in exc.value.problems[0] and "spec.model.lora" in exc.value.problems[0]


def test_another_base_model_is_refused() -> None:
    other = job(dtype="bfloat16")
    other["spec"]["model"]["builtin"] = "tiny"
    problems = check(pool(), other)["RLJob-job-a.yaml"]
    assert problems == [
        "spec.model: Invalid value: builtin: tiny, dtype: bfloat16: should be the base model of GeneratorPool "
        "'shared' (builtin: tiny, dtype: float32): its engines hold that model and serve adapters of it only"]
    path_model = pool(model={"path": "/models/base"})
    assert "spec.model: Invalid value: builtin: tiny" in check(path_model, job())["RLJob-job-a.yaml"][0]


def test_a_rank_above_the_pools_limit_is_refused() -> None:
    assert check(pool(maxLoraRank=8), job(rank=16))["RLJob-job-a.yaml"] == [
        "spec.model.lora.rank: Invalid value: 16: should be at most the maxLoraRank of GeneratorPool 'shared' (8): "
        "its engines accept no larger adapter"]
    assert check(pool(maxLoraRank=16), job(rank=16)) == {}


def test_the_named_pool_must_be_among_the_files_given_with_pools() -> None:
    assert check(job()) == {}, "no pool given: the pool is unknown here (the cluster may have it)"
    assert check(pool(), job(pool_name="other"))["RLJob-job-a.yaml"] == [validate_pool.pool_missing("other")]


@pytest.mark.parametrize(("spec", "path"), [
    ({"maxAdapters": 0}, "spec.maxAdapters"),
    ({"maxLoraRank": 513}, "spec.maxLoraRank"),
    ({"replicas": 0}, "spec.replicas"),
    ({"model": {"builtin": "tiny", "lora": {"rank": 8}}}, "spec.model.lora"),
    ({"model": {"builtin": "tiny", "path": "/m"}}, "spec.model"),
    ({"affinity": {}}, "spec.affinity"),
    ({"tensorParallelSize": 2, "resources": {"limits": {"nvidia.com/gpu": 1}}}, "spec.tensorParallelSize"),
    ({"volumes": [{"name": "kubeforge-x", "emptyDir": {}}]}, "spec.volumes[0].name"),
    ({"env": [{"name": "KUBEFORGE_ROLE", "value": "x"}]}, "spec.env[0].name"),
])
def test_pool_refusals_name_the_field(spec: Manifest, path: str) -> None:
    with pytest.raises(load.InvalidRLJob) as exc:
        load.parse_pool(pool(**spec))
    assert exc.value.problems and all(p.startswith(f"{path}:") for p in exc.value.problems), exc.value.problems


def test_pool_name_rules() -> None:
    doc = pool()
    doc["metadata"]["name"] = "p" * 41
    with pytest.raises(load.InvalidRLJob) as exc:
        load.parse_pool(doc)
    assert exc.value.problems == [f"metadata.name: {generatorpool.MSG_POOL_NAME_TOO_LONG}"]


def write(tmp_path: pathlib.Path, *docs: Manifest) -> list[str]:
    out = []
    for d in docs:
        p = tmp_path / f"{d['metadata']['name']}.yaml"
        p.write_text(yaml.safe_dump(d))
        out.append(str(p))
    return out


def test_cli_validate_checks_the_files_together(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = write(tmp_path, pool(), job())
    assert cli.validate(good) == 0
    assert capsys.readouterr().out.splitlines() == [f"{f}: valid" for f in good]
    bad = write(tmp_path, pool(maxLoraRank=1), job("job-b"))
    assert cli.validate(bad) == cli.EXIT_INVALID
    out = capsys.readouterr()
    assert out.out.splitlines() == [f"{bad[0]}: valid"]
    assert out.err == load.refusal(bad[1], check(pool(maxLoraRank=1), job("job-b"))["RLJob-job-b.yaml"])


def test_cli_run_hands_a_checked_pool_and_its_jobs_to_the_pool_launcher(
        tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """A pool and its jobs run through ``launcher.poolrun`` once checked together (never by starting a job's own
    generators for a job that names a pool); files that fail the check never reach it (exit 2)."""
    import sys
    import types

    calls: list[list[str]] = []
    fake = types.ModuleType("kubeforge.runtime.launcher.poolrun")
    fake.run = lambda *, files, run_dir, steps: calls.append(list(files)) or 0  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "kubeforge.runtime.launcher.poolrun", fake)
    import kubeforge.runtime.launcher as launcher_pkg
    monkeypatch.setattr(launcher_pkg, "poolrun", fake, raising=False)
    files = write(tmp_path, pool(), job(), job("job-b"))
    assert cli.run(files, run_dir=None, steps=None) == 0 and calls == [files]
    assert cli.run(files[1:2], run_dir=None, steps=None) == 0 and calls[-1] == files[1:2]   # poolrun refuses it
    bad = write(tmp_path, pool(maxLoraRank=1), job("job-c"))
    assert cli.run(bad, run_dir=None, steps=None) == cli.EXIT_INVALID
    err = capsys.readouterr().err
    assert "spec.model.lora.rank" in err and len(calls) == 2
