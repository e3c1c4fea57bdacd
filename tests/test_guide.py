"""docs/guide.md against the code (fast; no processes): its manifests are the examples/ files, they validate as
``kubeforge validate`` and the admission webhook do, the operator mounts the volumes at the paths each role reads,
the JSONL sample loads with the task loader and scores as the guide says, and the local rehearsal
(``e2e/guide_rehearsal.py``) changes nothing of the cluster manifest but the two local paths.

The rehearsal itself (vLLM, a few minutes) is ``tests/runtime/test_guide_rehearsal.py``; the cluster variant in real
pods is ``e2e/test_guide_real.py`` (realnode).
"""
from __future__ import annotations

import json
import pathlib
import re
from typing import Any

import pytest
import yaml

import guide_rehearsal
from kubeforge import cli
from kubeforge.api import load, rljob
from kubeforge.operator import render
from kubeforge.operator.render import context

ROOT = pathlib.Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "guide.md"
EXAMPLES = ROOT / "examples"
RLJOBS = ("own-model.yaml", "own-model-gpu.yaml")
STORAGE = "storage/own-model-storage.yaml"   # not an RLJob: kept out of examples/*.yaml
CTX = context.RenderContext(namespace="rl-jobs", uid="u")


def blocks(lang: str) -> list[str]:
    """The fenced code blocks of the guide in ``lang``."""
    return re.findall(rf"^```{lang}\n(.*?)^```", GUIDE.read_text(), flags=re.S | re.M)


def rljob_doc(name: str) -> dict[str, Any]:
    doc = yaml.safe_load((EXAMPLES / name).read_text())
    assert isinstance(doc, dict)
    return doc


def test_every_yaml_block_of_the_guide_is_an_example_file() -> None:
    files = {str(p.relative_to(EXAMPLES)): p.read_text() for p in EXAMPLES.rglob("*.yaml")}
    found = blocks("yaml")
    assert found, "the guide has no yaml block"
    for block in found:
        same = [n for n, text in files.items() if text.strip() == block.strip()]
        assert same, f"a yaml block of docs/guide.md is no examples/ file verbatim:\n{block[:400]}"
    shown = {n for n, text in files.items() for b in found if text.strip() == b.strip()}
    assert {*RLJOBS, STORAGE} <= shown


@pytest.mark.parametrize("name", RLJOBS)
def test_the_guides_rljobs_pass_kubeforge_validate(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.validate(str(EXAMPLES / name)) == 0, capsys.readouterr().out
    job = load.load_file(str(EXAMPLES / name))
    assert job.spec.model.path is not None and job.spec.task.jsonl is not None
    assert job.spec.checkpoint.claim_name is not None        # the exported model outlives the job
    assert job.spec.gang.backend == rljob.GangBackend.NONE.value   # runs on a plain cluster


def test_the_gpu_manifest_uses_the_gpu_fields() -> None:
    job = load.load_file(str(EXAMPLES / "own-model-gpu.yaml"))
    spec = job.spec
    assert spec.model.dtype == rljob.DType.BFLOAT16.value
    assert spec.schedule.mode == rljob.ScheduleMode.OVERLAPPED.value
    gen, trainer = spec.roles.generator, spec.roles.trainer
    assert rljob.gpu_count(gen.resources) >= gen.tensor_parallel_size > 1
    assert rljob.gpu_count(trainer.resources) >= 1 and gen.gpu_memory_utilization < 1
    assert "written, not yet run on a gpu" in (EXAMPLES / "own-model-gpu.yaml").read_text().lower()
    assert "not yet run on a GPU" in " ".join(GUIDE.read_text().replace("**", "").split())


def _statefulsets(name: str) -> dict[str, dict[str, Any]]:
    out = render.render(load.load_file(str(EXAMPLES / name)), CTX)
    return {o["metadata"]["labels"]["kubeforge.dev/role"]: o for o in out.desired if o["kind"] == "StatefulSet"}


@pytest.mark.parametrize("name", RLJOBS)
def test_the_operator_mounts_each_claim_where_its_role_reads(name: str) -> None:
    """Rendered pods: every path a role reads (model, JSONL, checkpoints) lies on the claim the guide puts it on, and
    the verifier pods mount none of them."""
    doc = rljob_doc(name)
    want = {doc["spec"]["model"]["path"]: "kubeforge-models", doc["spec"]["task"]["jsonl"]["path"]: "kubeforge-data",
            doc["spec"]["checkpoint"]["path"]: doc["spec"]["checkpoint"]["claimName"]}
    reads = guide_rehearsal.read_paths(doc)
    assert reads == {"generator": ["/models/my-model"], "verifier": [],
                     "trainer": ["/models/my-model", "/data/train.jsonl", "/checkpoints"]}
    for role, sts in _statefulsets(name).items():
        pod = sts["spec"]["template"]["spec"]
        got = guide_rehearsal.serving_claims(pod, reads[role])
        assert got == {p: want[p] for p in reads[role]}, (role, got)
        claims = {v["persistentVolumeClaim"]["claimName"] for v in pod["volumes"] if "persistentVolumeClaim" in v}
        assert claims == set(got.values()), (role, claims)       # no role mounts a claim it does not read


def test_gpu_pods_hold_their_gpus_and_shared_memory() -> None:
    sts = _statefulsets("own-model-gpu.yaml")
    for role in ("generator", "trainer"):
        pod = sts[role]["spec"]["template"]["spec"]
        assert pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] in (2, "2")
        assert any(m["mountPath"] == "/dev/shm" for m in pod["containers"][0]["volumeMounts"])
    assert "nvidia.com/gpu" not in json.dumps(sts["verifier"]["spec"]["template"]["spec"]["containers"][0])


def test_the_storage_example_defines_every_claim_at_the_jobs_paths() -> None:
    docs = list(yaml.safe_load_all((EXAMPLES / STORAGE).read_text()))
    claims = {d["metadata"]["name"] for d in docs if d["kind"] == "PersistentVolumeClaim"}
    (pod,) = [d for d in docs if d["kind"] == "Pod"]
    spec = pod["spec"]
    pod_mounts = {m["mountPath"]: {v["name"]: v["persistentVolumeClaim"]["claimName"] for v in spec["volumes"]}[m["name"]]
                  for m in spec["containers"][0]["volumeMounts"]}
    for name in RLJOBS[:1]:                      # the CPU job; the GPU one names its own checkpoint claim
        doc = rljob_doc(name)
        used = {doc["spec"]["checkpoint"]["claimName"]}
        for role in doc["spec"]["roles"].values():
            for v in role.get("volumes", []):
                used.add(v["persistentVolumeClaim"]["claimName"])
                mount = next(m for m in role["volumeMounts"] if m["name"] == v["name"])
                assert pod_mounts[mount["mountPath"]] == v["persistentVolumeClaim"]["claimName"]
        assert used <= claims, used - claims
        assert pod_mounts[doc["spec"]["checkpoint"]["path"]] == doc["spec"]["checkpoint"]["claimName"]
    # the restricted Pod Security level: non-root, seccomp, no privilege escalation, no capabilities
    assert spec["securityContext"]["runAsNonRoot"] and spec["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    c = spec["containers"][0]["securityContext"]
    assert c["allowPrivilegeEscalation"] is False and c["capabilities"]["drop"] == ["ALL"]


def test_the_guides_jsonl_sample_loads_and_scores_as_the_guide_says(tmp_path: pathlib.Path) -> None:
    from kubeforge.runtime import types
    from kubeforge.runtime.tasks import jsonl
    from kubeforge.runtime.verifiers import exact

    (sample,) = blocks("jsonl")
    path = tmp_path / "train.jsonl"
    path.write_text(sample)
    recs = jsonl.load(path, prompt_field="prompt", answer_field="answer")
    assert len(recs) >= 3 and any(r.answer == "42" for r in recs)      # a number becomes its string
    score = exact.ExactAnswer().score
    assert score(types.Prompt(index=0, text="copy: a", answer="a"), ["a", "a.", "ab", "b"]) == [1.0, 1.0, 0.0, 0.0]
    number = types.Prompt(index=0, text="6 * 7", answer="42")
    assert score(number, ["6 * 7 = 42", "The answer is 42.", "\\boxed{42} or 41", "42 or 41", "forty-two"]) == [
        1.0, 1.0, 1.0, 0.0, 0.0]
    # the rehearsal writes records of the same shape
    for r in guide_rehearsal.records(8):
        assert set(r) == {"prompt", "answer"} and r["prompt"] == f"copy: {r['answer']}"


def test_the_rehearsal_manifest_differs_only_in_the_local_paths(tmp_path: pathlib.Path) -> None:
    cluster = guide_rehearsal.load_manifest()
    before = json.dumps(cluster, sort_keys=True)
    model, data = tmp_path / "models" / "my-model", tmp_path / "data" / "train.jsonl"
    local = guide_rehearsal.local_manifest(cluster, model_dir=model, jsonl=data)
    assert json.dumps(cluster, sort_keys=True) == before                 # the cluster manifest is not mutated
    assert guide_rehearsal.differences(cluster, local) == list(guide_rehearsal.LOCAL_FIELDS)
    assert local["spec"]["model"]["path"] == str(model) and local["spec"]["task"]["jsonl"]["path"] == str(data)
    assert guide_rehearsal.differences({"a": [1, {"b": 2}]}, {"a": [1, {"b": 3}], "c": 0}) == [("a", "1", "b"), ("c",)]
    load.parse(local)                                                     # valid as it is
    # and `kubeforge run` finds its files once the rehearsal made them (the launcher's check of every role's files)
    from kubeforge.runtime import config

    assert [p.split(":")[0] for p in config.local_problems(load.parse(local).spec)] == [
        "spec.model.path", "spec.task.jsonl.path"]
    model.mkdir(parents=True)
    guide_rehearsal.make_jsonl(data, n=4)
    assert config.local_problems(load.parse(local).spec) == []
