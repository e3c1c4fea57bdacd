"""GeneratorPools on the REAL kube-apiserver (kwok tier; docs/generator-pool.md): the operator renders a pool's
engines, a job naming the pool renders no generators and dials the pool's at its own port block, the pool's jobs
ConfigMap follows the jobs that attach, go, are suspended and resume (ports kept, freed, never shared), every key is
the one derived from the operator's master key (the pool's in its key Secret, each job's in its own), the admission
refusals come from the API server with the launcher's words, and deleting a pool in use waits for its jobs (the
finalizer).

The operator runs on the host with its self-registered webhook (as ``e2e/test_operator.py`` and
``e2e/test_webhook_admission.py``); kwok's nodes run no containers, so what is checked is the objects and the
API server's answers, not a serving engine (the pool's runtime sharing is not built yet)."""
from __future__ import annotations

import base64
import json
import pathlib
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from kfcluster import harness, lifecycle, testing
from kfcluster.harness import wait
from kubeforge.api import load, poolkeys, rljob

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(600)]
ROOT = harness.ROOT
COSCHEDULING = ("--coscheduling-scheduler-name=default-scheduler",)
FINALIZER = "kubeforge.dev/pool-in-use"


@pytest.fixture(scope="module")
def operator(kube_cluster: lifecycle.Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[harness.Operator]:
    op = harness.Operator(kubeconfig=kube_cluster.kubeconfig, extra=("--all-namespaces", *COSCHEDULING),
                          log_path=tmp_path_factory.mktemp("operator") / "operator.log")
    harness.K(kubectl=kube_cluster.kubectl.binary, kubeconfig=kube_cluster.kubeconfig).ensure_crd()
    yield op.start()
    op.stop()


@pytest.fixture(scope="module")
def env(kube_cluster: lifecycle.Cluster, operator: harness.Operator) -> harness.K:
    return harness.K(kubectl=kube_cluster.kubectl.binary, kubeconfig=kube_cluster.kubeconfig)


@pytest.fixture
def ns(env: harness.K) -> Iterator[str]:
    name = env.namespace(f"pool-{uuid.uuid4().hex[:8]}")
    yield name
    env.run("delete", "rljobs", "--all", "-n", name, "--wait=false", check=False)
    # while the operator runs: it takes each pool's finalizer off once its jobs are gone
    env.run("delete", "generatorpools", "--all", "-n", name, "--wait=false", check=False)
    env.run("delete", "namespace", name, "--wait=false", check=False)


def pool(ns: str, name: str = "shared", **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "kubeforge.dev/v1alpha1", "kind": "GeneratorPool", "metadata": {"name": name,
            "namespace": ns}, "spec": {"model": {"builtin": "tiny"}, "replicas": 2, "maxAdapters": 4, "maxLoraRank": 16,
            "tolerations": [dict(testing.KWOK_TOLERATION)], **spec}}


def pool_job(ns: str, name: str, *, rank: int = 8, pool_name: str = "shared") -> dict[str, Any]:
    doc = yaml.safe_load((ROOT / "examples" / "tiny.yaml").read_text())
    doc["metadata"] = {"name": name, "namespace": ns}
    doc["spec"]["model"]["lora"] = {"rank": rank}
    doc["spec"]["generatorPool"] = {"name": pool_name}
    roles = doc["spec"].setdefault("roles", {})
    for role in ("verifier", "trainer"):
        roles.setdefault(role, {}).setdefault("tolerations", []).append(dict(testing.KWOK_TOLERATION))
    return doc


def refusal(k: harness.K, doc: dict[str, Any]) -> str:
    """What the API server says to ``kubectl apply --dry-run=server`` of ``doc`` (empty: accepted)."""
    out = k.run("apply", "--dry-run=server", "-f", "-", stdin=json.dumps(doc), check=False)
    return out.stderr if out.returncode else ""


def pool_status(k: harness.K, ns: str, name: str = "shared") -> dict[str, Any]:
    return dict(k.get("generatorpool", name, "-n", ns).get("status") or {})


def test_a_pool_and_a_job_on_it(env: harness.K, ns: str) -> None:
    k = env
    k.apply(pool(ns))
    sts = wait("the pool's StatefulSet", lambda: k.get("statefulset", "shared-pool", "-n", ns))
    assert sts["spec"]["replicas"] == 2 and sts["spec"]["serviceName"] == "shared-pool"
    assert sts["metadata"]["ownerReferences"][0]["kind"] == "GeneratorPool"
    svc = k.get("service", "shared-pool", "-n", ns)
    assert svc["spec"]["clusterIP"] == "None"
    engine = json.loads(k.get("configmap", "shared-pool-config", "-n", ns)["data"]["engine.json"])
    assert (engine["enable_lora"], engine["max_loras"], engine["max_lora_rank"]) == (True, 4, 16)
    assert FINALIZER in k.get("generatorpool", "shared", "-n", ns)["metadata"]["finalizers"]
    st = wait("engines ready", lambda: (s := pool_status(k, ns)).get("readyEngines") == 2 and s)
    assert st["ready"] == "2/2" and st["attachedJobs"] == []

    k.apply(pool_job(ns, "job-a"))
    st = wait("job-a attached", lambda: (s := pool_status(k, ns)).get("attachedJobs") == ["job-a"] and s)
    assert st["attached"] == 1
    job_sets = wait("job-a's StatefulSets", lambda: sorted(
        o["metadata"]["name"] for o in k.items("statefulsets", ns, "kubeforge.dev/job=job-a")) or None)
    assert job_sets == ["job-a-trainer", "job-a-verifier"], "a job on a pool has no generators of its own"
    trainer = k.get("statefulset", "job-a-trainer", "-n", ns)
    env_vars = {e["name"]: e.get("value") for e in trainer["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env_vars["KUBEFORGE_PEERS_GENERATOR"] == \
        f"shared-pool-0.shared-pool.{ns}.svc:29510,shared-pool-1.shared-pool.{ns}.svc:29510", "its own port block"
    assert k.get("podgroup.scheduling.x-k8s.io", "job-a", "-n", ns)["spec"]["minMember"] == 2
    job = wait("job-a Running", lambda: (j := k.get("rljob", "job-a", "-n", ns)).get("status", {}).get(
        "phase") == "Running" and j)
    assert set(job["status"]["roles"]) == {"verifier", "trainer"} and job["status"]["ready"] == "2/2"
    table = k.run("get", "generatorpools", "-n", ns).stdout.splitlines()
    assert table[0].split()[:4] == ["NAME", "READY", "JOBS", "ADAPTERS"] and table[1].split()[:3] == [
        "shared", "2/2", "1"]

    k.run("scale", "generatorpool/shared", "-n", ns, "--replicas=3")
    wait("the job dials 3 engines", lambda: "shared-pool-2." in {e["name"]: e.get("value") for e in k.get(
        "statefulset", "job-a-trainer", "-n", ns)["spec"]["template"]["spec"]["containers"][0]["env"]}[
        "KUBEFORGE_PEERS_GENERATOR"])


def served(k: harness.K, ns: str) -> dict[str, Any]:
    """What the pool's engines would read: ``{job: (port bases, uid)}`` from its jobs ConfigMap."""
    jobs = json.loads(k.get("configmap", "shared-pool-jobs", "-n", ns)["data"]["jobs.json"])["jobs"]
    return {e["name"]: (e["portBases"], e["uid"]) for e in jobs}


def uid(k: harness.K, kind: str, ns: str, name: str) -> str:
    return str(k.get(kind, name, "-n", ns)["metadata"]["uid"])


def secret_text(k: harness.K, ns: str, name: str, key: str) -> str:
    return base64.b64decode(k.get("secret", name, "-n", ns)["data"][key]).decode()


def key_ref(k: harness.K, ns: str, job: str) -> str:
    """The Secret a job's trainer pods get their key from."""
    env_vars = k.get("statefulset", f"{job}-trainer", "-n", ns)["spec"]["template"]["spec"]["containers"][0]["env"]
    return str(next(e for e in env_vars if e["name"] == "KUBEFORGE_JOB_KEY")["valueFrom"]["secretKeyRef"]["name"])


def peers_port(k: harness.K, ns: str, job: str) -> int:
    sts = k.get("statefulset", f"{job}-trainer", "-n", ns)
    peers = {e["name"]: e.get("value") for e in sts["spec"]["template"]["spec"]["containers"][0]["env"]}[
        "KUBEFORGE_PEERS_GENERATOR"]
    return int(peers.split(",")[0].rsplit(":", 1)[1])


def test_attached_jobs_get_their_ports_keys_and_a_place_in_the_jobs_file(env: harness.K, ns: str,
                                                                          operator: harness.Operator) -> None:
    k = env
    k.apply(pool(ns))
    k.apply(pool_job(ns, "job-a"))
    k.apply(pool_job(ns, "job-b"))
    st = wait("job-a and job-b served", lambda: len(served(k, ns)) == 2 and pool_status(k, ns))
    assert st["jobPorts"] == [{"name": "job-a", "portBase": 29510}, {"name": "job-b", "portBase": 29520}]
    assert served(k, ns) == {"job-a": ([29510, 29510], uid(k, "rljob", ns, "job-a")),
                             "job-b": ([29520, 29520], uid(k, "rljob", ns, "job-b"))}, \
        "each engine serves each job at its block, knowing whose key to derive"
    data = k.get("configmap", "shared-pool-jobs", "-n", ns)["data"]
    assert {"job-job-a.yaml", "job-job-b.yaml"} <= set(data)
    wait("job-b dials its block", lambda: peers_port(k, ns, "job-b") == 29520)
    assert peers_port(k, ns, "job-a") == 29510

    # every key is the one derived from the operator's master key: the pool's in the Secret its engines mount,
    # each job's in the Secret its own pods get theirs from, equal to what an engine derives from the jobs file
    master = operator.pool_master_key_file().read_bytes()
    pool_key = poolkeys.pool_key(master, namespace=ns, pool="shared", uid=uid(k, "generatorpool", ns, "shared"))
    sources = [next(iter(s.values()))["name"] for s in next(
        v for v in k.get("statefulset", "shared-pool", "-n", ns)["spec"]["template"]["spec"]["volumes"]
        if v["name"] == "kubeforge-config")["projected"]["sources"]]
    key_secret = f"shared-pool-key-{poolkeys.key_id(pool_key)}"
    assert sources == ["shared-pool-config", "shared-pool-jobs", key_secret]
    assert secret_text(k, ns, key_secret, "pool.key") == pool_key.hex()
    for job in ("job-a", "job-b"):
        key = poolkeys.job_key(pool_key, namespace=ns, job=job, uid=served(k, ns)[job][1])
        ref = wait(f"{job}'s key Secret", lambda: key_ref(k, ns, job) != f"{job}-key" and key_ref(k, ns, job))
        assert ref == f"{job}-key-{poolkeys.key_id(key)}" and secret_text(k, ns, ref, "key") == key.hex()
        tmpl = json.dumps(k.get("statefulset", f"{job}-trainer", "-n", ns)["spec"]["template"])
        assert key_secret not in tmpl, "a job's pods never see the pool's key"
    template = k.get("statefulset", "shared-pool", "-n", ns)["spec"]["template"]

    # job-a goes: its block leaves the files, job-b keeps its block; job-c takes the block job-a freed
    k.run("delete", "rljob", "job-a", "-n", ns, "--wait=false")
    wait("job-a gone from the files", lambda: set(served(k, ns)) == {"job-b"})
    assert pool_status(k, ns)["jobPorts"] == [{"name": "job-b", "portBase": 29520}]
    k.apply(pool_job(ns, "job-c"))
    wait("job-c served", lambda: set(served(k, ns)) == {"job-b", "job-c"})
    assert {j: v[0] for j, v in served(k, ns).items()} == {"job-b": [29520, 29520], "job-c": [29510, 29510]}
    wait("job-c dials the freed block", lambda: peers_port(k, ns, "job-c") == 29510)

    # job-b suspended (as Kueue's eviction does, through its Suspended condition): out of the jobs file, so the
    # engines release its share and adapter slot; its block kept; resumed, served again at the same block
    k.run("patch", "rljob", "job-b", "-n", ns, "--type=merge", "-p", '{"spec": {"suspend": true}}')
    wait("job-b out of the jobs file", lambda: set(served(k, ns)) == {"job-c"})
    st = pool_status(k, ns)
    assert st["attachedJobs"] == ["job-b", "job-c"] and {"name": "job-b", "portBase": 29520} in st["jobPorts"]
    k.run("patch", "rljob", "job-b", "-n", ns, "--type=merge", "-p", '{"spec": {"suspend": false}}')
    wait("job-b served again", lambda: served(k, ns).get("job-b", ([],))[0] == [29520, 29520])
    assert k.get("statefulset", "shared-pool", "-n", ns)["spec"]["template"] == template, \
        "attaching, leaving and suspending change the files, not the engines' pods"


def test_the_api_server_refuses_what_kubeforge_validate_refuses(env: harness.K, ns: str,
                                                                tmp_path: pathlib.Path) -> None:
    """One refusal, two doors: the CRD's CEL (no LoRA) and the webhook reading the pool (rank, base model) say what
    ``kubeforge validate pool.yaml job.yaml`` says."""
    from kubeforge import cli

    k = env
    k.apply(pool(ns, maxLoraRank=8))
    wait("the pool's finalizer", lambda: FINALIZER in (k.get("generatorpool", "shared", "-n", ns)["metadata"].get(
        "finalizers") or []))
    no_lora = pool_job(ns, "no-lora")
    del no_lora["spec"]["model"]["lora"]
    assert rljob.MSG_POOL_NEEDS_LORA in refusal(k, no_lora)
    too_big = pool_job(ns, "too-big", rank=16)
    files = []
    for doc in (pool(ns, maxLoraRank=8), too_big):
        path = tmp_path / f"{doc['metadata']['name']}.yaml"
        path.write_text(yaml.safe_dump(doc))
        files.append(str(path))
    _, problems = load.check_texts({f: pathlib.Path(f).read_text() for f in files})
    (said,) = problems[files[1]]
    assert said.startswith("spec.model.lora.rank: Invalid value: 16")
    assert cli.validate(files) == cli.EXIT_INVALID
    assert said in refusal(k, too_big)
    other = pool_job(ns, "other-dtype")
    other["spec"]["model"]["dtype"] = "bfloat16"
    assert "spec.model: Invalid value: builtin: tiny, dtype: bfloat16: should be the base model" in refusal(k, other)
    assert refusal(k, pool_job(ns, "fits")) == ""
    assert refusal(k, pool_job(ns, "elsewhere", rank=64, pool_name="not-yet")) == "", \
        "a pool that does not exist yet is admitted: the job waits for it"
    bad_pool = pool(ns, "bad", maxLoraRank=1024)
    assert "spec.maxLoraRank" in refusal(k, bad_pool)


def test_deleting_a_pool_in_use_waits_for_its_jobs(env: harness.K, ns: str) -> None:
    k = env
    k.apply(pool(ns))
    k.apply(pool_job(ns, "job-a"))
    wait("job-a attached", lambda: pool_status(k, ns).get("attachedJobs") == ["job-a"])
    k.run("delete", "generatorpool", "shared", "-n", ns, "--wait=false")
    st = wait("the pool waits", lambda: any(c["type"] == "Terminating" and c["reason"] == "WaitingForJobs"
                                            for c in pool_status(k, ns).get("conditions", [])) and pool_status(k, ns))
    assert k.get("statefulset", "shared-pool", "-n", ns)["spec"]["replicas"] == 2, "it keeps serving its jobs"
    assert "job-a" in next(c["message"] for c in st["conditions"] if c["type"] == "Terminating")
    assert "is being deleted" in refusal(k, pool_job(ns, "job-b")), "a pool being deleted takes no new job"
    k.run("delete", "rljob", "job-a", "-n", ns, "--wait=false")
    wait("the pool gone", lambda: k.run("get", "generatorpool", "shared", "-n", ns, check=False).returncode != 0,
         timeout_s=120)
