"""docs/guide.md's cluster variant in real pods on the real node: ``examples/own-model.yaml`` as the guide applies it,
its model folder and JSONL on PersistentVolumeClaims, run by the operator to Succeeded.

What differs from the local rehearsal (``e2e/guide_rehearsal.py``) is only what serves the two paths: here the claims
of ``examples/storage/own-model-storage.yaml`` (bound to local PersistentVolumes on the real node that hold the HF folder of
the tiny model and the JSONL file the rehearsal writes) are mounted at ``/models`` and ``/data``, and
``spec.checkpoint.claimName`` at ``/checkpoints``. The manifest keeps its paths, claims, sizes and steps; per role it
gets only what any pod on the real node needs (``realjob.role_template``: the host's Python and the project's venv
by read-only hostPath, the node selector and toleration, the signal-forwarding wrapper; the generator vLLM eager and
the host's lscpu), as ``e2e/test_e2e_real.py`` does for ``examples/tiny.yaml``. The claims' storageClassName is set
to "" so that they bind to the pre-bound local volumes whatever default StorageClass the cluster has.

Checks: the job Succeeds at its 40 steps; every role pod mounts exactly the claims at the paths its role reads
(the verifier none); the reward rises as in the rehearsal; the final export and the last checkpoint are on the
checkpoint claim's volume. Cluster and skip rules as ``test_e2e_real``. ``test_guide_job_*`` (no marker) check the
manifest builder without a cluster. The operator runs as a host process (``harness.Operator``): what this module
tests is the guide's manifest and storage in real pods, not the install, which the chart-installed suites cover
(``e2e/test_e2e_real.py``, ``e2e/test_secrets_real.py``, ``e2e/test_helm_install.py``).
"""

from __future__ import annotations

import copy
import json
import pathlib
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

import guide_rehearsal
import realjob
import run_real
from kfcluster import harness, lifecycle
from kubeforge.api import load
from node import realnode

REAL = [pytest.mark.realnode, pytest.mark.cluster, pytest.mark.slow, pytest.mark.timeout(1800)]
ID = uuid.uuid4().hex[:5]
STORAGE = guide_rehearsal.ROOT / "examples" / "storage" / "own-model-storage.yaml"
#: The claims of the guide and the host directory (under the test's workdir) each local volume serves.
CLAIM_DIRS = {"kubeforge-models": "models", "kubeforge-data": "data", "own-model-checkpoints": "checkpoints"}
ROLE_EXTRAS = ("image", "command", "env", "volumes", "volumeMounts", "nodeSelector", "tolerations", "enforceEager")


def guide_job(*, namespace: str, parts: realnode.PodParts | None = None) -> dict[str, Any]:
    """``examples/own-model.yaml`` for pods on the real node: per role ``realjob.role_template``'s pod parts added
    (the manifest's own volumes kept first), the generator eager with the host's lscpu; nothing else changed."""
    parts = parts or realnode.venv_python_parts()
    doc = guide_rehearsal.load_manifest()
    doc["metadata"] = {**doc["metadata"], "namespace": namespace}
    roles = doc["spec"]["roles"]
    for role in realjob.ROLES:
        vols: list[dict[str, Any]] = []
        mounts: list[dict[str, Any]] = []
        env: dict[str, str] = {}
        if role == "generator":
            vols = [{"name": "kf-lscpu", "hostPath": {"path": realjob.LSCPU, "type": "File"}}]
            mounts = [{"name": "kf-lscpu", "mountPath": realjob.LSCPU, "readOnly": True}]
            env = {"TORCHDYNAMO_DISABLE": "1"}
        roles[role] = realjob.role_template(roles.get(role) or {}, parts=parts, extra_env=env, volumes=vols,
                                            mounts=mounts)
    roles["generator"]["enforceEager"] = True
    return doc


def claims_for(namespace: str) -> list[dict[str, Any]]:
    """The PersistentVolumeClaims of the guide's storage example, in ``namespace``, with storageClassName ""."""
    out = []
    for d in yaml.safe_load_all(STORAGE.read_text()):
        if d and d["kind"] == "PersistentVolumeClaim":
            d = copy.deepcopy(d)
            d["metadata"]["namespace"] = namespace
            d["spec"]["storageClassName"] = ""
            out.append(d)
    return out


def local_volumes(namespace: str, workdir: pathlib.Path) -> list[dict[str, Any]]:
    """One local PersistentVolume on the real node per claim of the guide, pre-bound to it (claimRef)."""
    out = []
    for claim, sub in CLAIM_DIRS.items():
        out.append({
            "apiVersion": "v1", "kind": "PersistentVolume",
            "metadata": {"name": f"kf-guide-{ID}-{sub}", "labels": {"kubeforge.dev/e2e": f"guide-{ID}"}},
            "spec": {"capacity": {"storage": "100Gi"}, "accessModes": ["ReadWriteOnce"],
                     "persistentVolumeReclaimPolicy": "Retain", "storageClassName": "",
                     "claimRef": {"namespace": namespace, "name": claim},
                     "local": {"path": str(workdir / sub)},
                     "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                         {"key": "kubernetes.io/hostname", "operator": "In", "values": [realnode.NODE_NAME]}]}]}}}})
    return out


# ------------------------------------------------------------------------------------------- without a cluster


#: What ``realnode.venv_python_parts()`` gives, shaped by hand (that needs the checkout's .venv).
FAKE_PARTS = realnode.PodParts(
    python="/repo/.venv/bin/python", env=[{"name": "HOME", "value": "/tmp"}],
    volumes=[{"name": "kf-host-0", "hostPath": {"path": "/repo", "type": "Directory"}}],
    volume_mounts=[{"name": "kf-host-0", "mountPath": "/repo", "readOnly": True}])


def test_guide_job_differs_from_the_guides_manifest_only_by_the_real_nodes_pod_parts() -> None:
    cluster = guide_rehearsal.load_manifest()
    doc = guide_job(namespace="ns", parts=FAKE_PARTS)
    load.parse(doc)
    diffs = guide_rehearsal.differences(cluster, doc)
    assert diffs and all(d == ("metadata", "namespace") or (d[:2] == ("spec", "roles") and d[3] in ROLE_EXTRAS)
                         for d in diffs), diffs
    for role in realjob.ROLES:     # the guide's own volumes come first, unchanged
        mine = cluster["spec"]["roles"].get(role, {})
        for key in ("volumes", "volumeMounts"):
            assert doc["spec"]["roles"][role][key][:len(mine.get(key, []))] == mine.get(key, [])
    assert doc["spec"]["checkpoint"] == cluster["spec"]["checkpoint"]


def test_guide_claims_and_volumes_pair_up() -> None:
    claims = claims_for("ns")
    assert {c["metadata"]["name"] for c in claims} == set(CLAIM_DIRS)
    pvs = local_volumes("ns", pathlib.Path("/w"))
    assert {pv["spec"]["claimRef"]["name"] for pv in pvs} == set(CLAIM_DIRS)
    for pv in pvs:
        claim = next(c for c in claims if c["metadata"]["name"] == pv["spec"]["claimRef"]["name"])
        assert pv["spec"]["storageClassName"] == claim["spec"]["storageClassName"] == ""
        assert set(claim["spec"]["accessModes"]) <= set(pv["spec"]["accessModes"])


# ------------------------------------------------------------------------------------------- in real pods


class GuideRun:
    def __init__(self, result: run_real.Result, doc: dict[str, Any], workdir: pathlib.Path,
                 pvcs: list[dict[str, Any]]) -> None:
        self.result, self.doc, self.workdir, self.pvcs = result, doc, workdir, pvcs


@pytest.fixture(scope="module")
def guide_run(cluster: lifecycle.Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GuideRun]:
    workdir = tmp_path_factory.mktemp("guide-real")
    for sub in CLAIM_DIRS.values():
        (workdir / sub).mkdir()
        (workdir / sub).chmod(0o777)     # a local volume keeps the host directory's owner: the pods run as UID 1000
    guide_rehearsal.make_model_folder(workdir / "models" / "my-model")      # -> /models/my-model
    guide_rehearsal.make_jsonl(workdir / "data" / "train.jsonl")           # -> /data/train.jsonl
    k = cluster.kubectl
    harness.K(kubectl=k.binary, kubeconfig=k.kubeconfig).ensure_crd()
    ns = f"e2e-guide-{ID}"
    k.run("create", "namespace", ns)
    op = harness.Operator(kubeconfig=k.kubeconfig, log_path=workdir / "operator.log", extra=("--namespace", ns))
    try:
        k.apply("\n---\n".join(json.dumps(d) for d in local_volumes(ns, workdir)))
        k.apply("\n---\n".join(json.dumps(d) for d in claims_for(ns)))
        op.start()
        doc = guide_job(namespace=ns)
        name = doc["metadata"]["name"]
        result = run_real.Run(k=k, namespace=ns, name=name, workdir=workdir, kill_after_step=None,
                              timeout_s=1500).execute(doc)
        pvcs = k.get_json("pvc", "-n", ns)["items"]
        print("GUIDE-REAL " + json.dumps(result.figures()))
        yield GuideRun(result, doc, workdir, pvcs)
    finally:
        op.stop()
        k.run("delete", "namespace", ns, "--wait=true", "--timeout=120s", check=False, timeout_s=150)
        k.run("delete", "pv", "-l", f"kubeforge.dev/e2e=guide-{ID}", "--wait=false", check=False)


@pytest.mark.realnode
@pytest.mark.cluster
@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_guide_job_succeeds_on_its_claims(guide_run: GuideRun) -> None:
    st = guide_run.result.status
    assert st.get("phase") == "Succeeded", json.dumps(st)[:2000]
    assert st["progress"]["step"] == guide_run.doc["spec"]["algorithm"]["steps"] == 40
    assert {c["metadata"]["name"]: c["status"]["phase"] for c in guide_run.pvcs} == {c: "Bound" for c in CLAIM_DIRS}


@pytest.mark.realnode
@pytest.mark.cluster
@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_each_role_pod_mounts_the_claims_at_the_paths_it_reads(guide_run: GuideRun) -> None:
    reads = guide_rehearsal.read_paths(guide_run.doc)
    spec = guide_run.doc["spec"]
    want = {spec["model"]["path"]: "kubeforge-models", spec["task"]["jsonl"]["path"]: "kubeforge-data",
            spec["checkpoint"]["path"]: spec["checkpoint"]["claimName"]}
    seen = set()
    for pod in guide_run.result.pods:
        role = pod["metadata"]["labels"][run_real.LABEL_ROLE]
        seen.add(role)
        assert pod["spec"]["nodeName"] == realnode.NODE_NAME
        got = guide_rehearsal.serving_claims(pod["spec"], reads[role])
        assert got == {p: want[p] for p in reads[role]}, (pod["metadata"]["name"], got)
        claims = {v["persistentVolumeClaim"]["claimName"] for v in pod["spec"]["volumes"] if "persistentVolumeClaim" in v}
        assert claims == set(got.values()), (pod["metadata"]["name"], claims)
    assert seen == set(realjob.ROLES)


@pytest.mark.realnode
@pytest.mark.cluster
@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_reward_rose_and_the_export_is_on_the_checkpoint_claim(guide_run: GuideRun) -> None:
    res = guide_run.result
    records = [d for t in res.trainer_logs for d in run_real.json_lines(t) if "mean_reward" in d and "step" in d]
    by_step = {d["step"]: d["mean_reward"] for d in records}
    first = sum(by_step[s] for s in range(1, 11)) / 10
    last = sum(by_step[s] for s in range(res.steps - 9, res.steps + 1)) / 10
    assert last > first + 0.3, (first, last)            # as test_e2e_real; the rehearsal measured 0.11 -> 1.00
    volume = guide_run.workdir / "checkpoints"           # the host directory of own-model-checkpoints
    names = sorted(p.name for p in volume.iterdir())
    assert f"step-{res.steps:09d}" in names and f"export-step-{res.steps:09d}" in names, names
    assert (volume / f"export-step-{res.steps:09d}" / "config.json").is_file()
