"""RLJobs as Kueue workloads, against Kueue v0.17.0's real manager on the real control plane (kwok GPU nodes,
the Coscheduling scheduler): queued, admitted, preempted and readmitted, partial admission, bad labels.

Each test makes its own ResourceFlavor/ClusterQueue (cluster-scoped, named after its namespace) and LocalQueue, so
quotas never mix; the operator runs as a subprocess, because this is the kwok tier, whose nodes run no containers
(the chart-installed operator with Kueue in real pods: ``e2e/test_kueue_real.py``). Run: ``pytest -m cluster
e2e/test_kueue.py`` (Kueue is built on first use: e2e/build/build.sh kueue).
"""
from __future__ import annotations

import copy
import hashlib
import json
import os
import pathlib
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from kfcluster import config as cfg
from kfcluster import harness, kueue, lifecycle, procs, testing
from kfcluster.harness import wait

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(600)]
ROOT = harness.ROOT
KUEUE = "kueue.x-k8s.io/v1beta2"
LABEL_JOB = "kubeforge.dev/job"
QUEUE = "kueue.x-k8s.io/queue-name"
PRIORITY = "kueue.x-k8s.io/priority-class"
ROLES_3_GPUS = {"generator": {"replicas": 1, "resources": {"limits": {"nvidia.com/gpu": 1}}},
                "trainer": {"replicas": 1, "resources": {"limits": {"nvidia.com/gpu": 2}}}}


@pytest.fixture(scope="module")
def env(kueue_cluster: lifecycle.Cluster,
        tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[harness.K, harness.Operator]]:
    k = harness.K(kubectl=kueue_cluster.kubectl.binary, kubeconfig=kueue_cluster.kubeconfig)
    k.ensure_crd()
    op = harness.Operator(kubeconfig=kueue_cluster.kubeconfig,
                          log_path=tmp_path_factory.mktemp("operator") / "operator.log").start()
    yield k, op
    op.stop()


@pytest.fixture
def ns(env: Any) -> Iterator[str]:
    k, _ = env
    name = k.namespace(f"kq-{uuid.uuid4().hex[:8]}")
    yield name
    k.run("delete", "rljobs", "--all", "-n", name, "--wait=false", check=False)
    k.run("delete", "clusterqueue", name, "--wait=false", check=False)
    k.run("delete", "namespace", name, "--wait=false", check=False)


def queue(k: harness.K, ns: str, *, gpus: int, preemption: bool = False) -> None:
    """ResourceFlavor + ClusterQueue ``ns`` (``gpus`` nvidia.com/gpu) + LocalQueue ``team`` in ``ns``."""
    k.apply({"apiVersion": KUEUE, "kind": "ResourceFlavor", "metadata": {"name": "kwok-gpu"},
             "spec": {"nodeLabels": {"type": "kwok"}}})
    cq: dict[str, Any] = {"namespaceSelector": {}, "resourceGroups": [{
        "coveredResources": ["nvidia.com/gpu"],
        "flavors": [{"name": "kwok-gpu", "resources": [{"name": "nvidia.com/gpu", "nominalQuota": gpus}]}]}]}
    if preemption:
        cq["preemption"] = {"withinClusterQueue": "LowerPriority"}
    k.apply({"apiVersion": KUEUE, "kind": "ClusterQueue", "metadata": {"name": ns}, "spec": cq})
    k.apply({"apiVersion": KUEUE, "kind": "LocalQueue", "metadata": {"name": "team", "namespace": ns},
             "spec": {"clusterQueue": ns}})


def rljob(ns: str, name: str, *, labels: dict[str, str], roles: dict[str, Any] | None = None) -> dict[str, Any]:
    doc = yaml.safe_load((ROOT / "examples" / "tiny.yaml").read_text())
    doc["metadata"] = {"name": name, "namespace": ns, "labels": labels}
    doc["spec"]["roles"] = copy.deepcopy(roles or ROLES_3_GPUS)
    for role in ("generator", "verifier", "trainer"):
        doc["spec"]["roles"].setdefault(role, {"replicas": 1}).setdefault("tolerations", []).append(
            dict(testing.KWOK_TOLERATION))
    return doc


def status(k: harness.K, ns: str, name: str) -> dict[str, Any]:
    return k.get("rljob", name, "-n", ns).get("status") or {}


def cond(st: dict[str, Any], kind: str) -> dict[str, Any]:
    return next((c for c in st.get("conditions", []) if c["type"] == kind), {})


def pods(k: harness.K, ns: str, name: str) -> list[dict[str, Any]]:
    return k.items("pods", ns, f"{LABEL_JOB}={name}")


def phase(k: harness.K, ns: str, name: str, want: str) -> Any:
    return lambda: (st := status(k, ns, name)).get("phase") == want and st


def finish(k: harness.K, ns: str, name: str) -> None:
    """The trainer reports its last step done (what trainer rank 0 writes on its pod)."""
    k.report(ns, f"{name}-trainer-0", step=40, meanReward=0.9, policyVersion=40, done=True)
    wait(f"{name} Succeeded", phase(k, ns, name, "Succeeded"))


def reasons(k: harness.K, ns: str, name: str) -> list[str]:
    evs = [e for e in k.items("events", ns) if e["involvedObject"].get("name") == name
           and e["involvedObject"].get("kind") == "RLJob"]
    return [e["reason"] for e in sorted(evs, key=lambda e: e["metadata"]["creationTimestamp"])]


def test_quota_fits_one_of_two_equal_jobs(env: Any, ns: str) -> None:
    k, _ = env
    queue(k, ns, gpus=3)
    t0 = time.monotonic()
    k.apply(rljob(ns, "first", labels={QUEUE: "team"}))
    wait("first Running", phase(k, ns, "first", "Running"), timeout_s=120)
    admitted_s = time.monotonic() - t0
    k.apply(rljob(ns, "second", labels={QUEUE: "team"}))
    st = wait("second Queued", lambda: (s := status(k, ns, "second")) and cond(s, "Admitted").get("reason") == "Queued"
              and s, timeout_s=60)
    assert st["phase"] == "Pending" and cond(st, "Admitted")["status"] == "False"
    wl = k.get("workloads.kueue.x-k8s.io", "second", "-n", ns)
    assert wl["metadata"]["ownerReferences"][0]["name"] == "second"
    assert [p["name"] for p in wl["spec"]["podSets"]] == ["generator", "verifier", "trainer"]
    time.sleep(5)
    assert pods(k, ns, "second") == [], "the second job has pods before Kueue admitted it"
    finish(k, ns, "first")
    t1 = time.monotonic()
    wait("second Running after the first finished", phase(k, ns, "second", "Running"), timeout_s=120)
    readmit_s = time.monotonic() - t1
    first_wl = k.get("workloads.kueue.x-k8s.io", "first", "-n", ns)
    assert any(c["type"] == "Finished" and c["status"] == "True" for c in first_wl["status"]["conditions"])
    assert "Queued" in reasons(k, ns, "second") and "Admitted" in reasons(k, ns, "second")
    print(json.dumps({"apply_to_running_s": round(admitted_s, 1), "finish_to_next_running_s": round(readmit_s, 1)}))


def test_high_priority_preempts_low_which_comes_back(env: Any, ns: str) -> None:
    k, _ = env
    queue(k, ns, gpus=3, preemption=True)
    for name, value in ((f"{ns}-low", 100), (f"{ns}-high", 1000)):
        k.apply({"apiVersion": KUEUE, "kind": "WorkloadPriorityClass", "metadata": {"name": name}, "value": value})
    try:
        k.apply(rljob(ns, "low", labels={QUEUE: "team", PRIORITY: f"{ns}-low"}))
        wait("low Running", phase(k, ns, "low", "Running"), timeout_s=120)
        t0 = time.monotonic()
        k.apply(rljob(ns, "high", labels={QUEUE: "team", PRIORITY: f"{ns}-high"}))
        st = wait("low Suspended (Preempted)", phase(k, ns, "low", "Suspended"), timeout_s=120)
        suspended_s = time.monotonic() - t0
        assert cond(st, "Admitted")["reason"] == "Preempted" and cond(st, "Suspended")["status"] == "True"
        wait("high Running", phase(k, ns, "high", "Running"), timeout_s=120)
        assert not [p for p in pods(k, ns, "low") if not p["metadata"].get("deletionTimestamp")]
        assert "Preempted" in reasons(k, ns, "low")
        assert k.get("workloads.kueue.x-k8s.io", "high", "-n", ns)["spec"]["priority"] == 1000
        finish(k, ns, "high")
        wait("low Running again", phase(k, ns, "low", "Running"), timeout_s=120)
        print(json.dumps({"high_applied_to_low_suspended_s": round(suspended_s, 1)}))
    finally:
        k.run("delete", "workloadpriorityclass", f"{ns}-low", f"{ns}-high", check=False)


def test_partial_admission_starts_with_the_generator_minimum(env: Any, ns: str) -> None:
    k, _ = env
    queue(k, ns, gpus=4)
    roles = {"generator": {"replicas": 4, "minReplicas": 1, "resources": {"limits": {"nvidia.com/gpu": 1}}},
             "trainer": {"replicas": 1, "resources": {"limits": {"nvidia.com/gpu": 2}}}}
    k.apply(rljob(ns, "part", labels={QUEUE: "team"}, roles=roles))
    wait("part Running", phase(k, ns, "part", "Running"), timeout_s=120)
    wl = k.get("workloads.kueue.x-k8s.io", "part", "-n", ns)
    counts = {a["name"]: a["count"] for a in wl["status"]["admission"]["podSetAssignments"]}
    assert counts["generator"] == 2 and counts["trainer"] == 1      # 4 GPUs: 2 generators beside the trainer
    gens = wait("2 generator pods", lambda: (g := [p for p in pods(k, ns, "part") if p["metadata"]["labels"][
        "kubeforge.dev/role"] == "generator"]) and len(g) == 2 and g, timeout_s=60)
    assert all(p["spec"]["nodeSelector"].get("type") == "kwok" for p in gens)     # the flavor's node labels


def role_pods(k: harness.K, ns: str, name: str, role: str) -> list[dict[str, Any]]:
    return [p for p in pods(k, ns, name) if p["metadata"]["labels"]["kubeforge.dev/role"] == role
            and not p["metadata"].get("deletionTimestamp")]


def test_a_partially_admitted_job_grows_when_quota_frees(env: Any, ns: str) -> None:
    """Two jobs share 6 GPUs: A (3) runs; B asks for 5 (a 1-GPU trainer and 4 generators, at least 1), is admitted
    with 2 generators and asks for the other two with one grow Workload each; when A finishes, Kueue admits them and
    B runs 4 generators, its trainer pod untouched (same UID, no restart, same attempt)."""
    k, _ = env
    queue(k, ns, gpus=6)
    k.apply(rljob(ns, "a", labels={QUEUE: "team"}))
    wait("a Running", phase(k, ns, "a", "Running"), timeout_s=120)
    roles = {"generator": {"replicas": 4, "minReplicas": 1, "resources": {"limits": {"nvidia.com/gpu": 1}}},
             "trainer": {"replicas": 1, "resources": {"limits": {"nvidia.com/gpu": 1}}}}
    k.apply(rljob(ns, "b", labels={QUEUE: "team"}, roles=roles))
    wait("b Running", phase(k, ns, "b", "Running"), timeout_s=120)
    wl = k.get("workloads.kueue.x-k8s.io", "b", "-n", ns)
    assert {a["name"]: a["count"] for a in wl["status"]["admission"]["podSetAssignments"]}["generator"] == 2
    wait("b's 2 generator pods", lambda: len(role_pods(k, ns, "b", "generator")) == 2, timeout_s=60)
    grows = wait("b's grow Workloads pending", lambda: (g := sorted(
        w["metadata"]["name"] for w in k.items("workloads.kueue.x-k8s.io", ns, f"{LABEL_JOB}=b")
        if w["metadata"]["name"] != "b")) and g, timeout_s=60)
    assert grows == ["b.generator-2", "b.generator-3"]
    time.sleep(5)
    assert len(role_pods(k, ns, "b", "generator")) == 2, "b grew while A still held the quota"
    (trainer,) = role_pods(k, ns, "b", "trainer")
    attempt = status(k, ns, "b").get("attempt")
    finish(k, ns, "a")
    t0 = time.monotonic()
    gens = wait("b grown to 4 generators", lambda: (g := role_pods(k, ns, "b", "generator")) and len(g) == 4 and all(
        p["status"].get("phase") == "Running" for p in g) and g, timeout_s=120)
    grow_s = time.monotonic() - t0
    assert sorted(int(p["metadata"]["labels"]["apps.kubernetes.io/pod-index"]) for p in gens) == [0, 1, 2, 3]
    st = status(k, ns, "b")
    assert st["phase"] == "Running" and st.get("attempt") == attempt
    assert "(+2 as quota freed)" in cond(st, "Admitted")["message"]
    (after,) = role_pods(k, ns, "b", "trainer")
    assert after["metadata"]["uid"] == trainer["metadata"]["uid"], "b's trainer was restarted to grow"
    assert all(c.get("restartCount", 0) == 0 for c in after["status"].get("containerStatuses", []))
    for name in grows:
        w = k.get("workloads.kueue.x-k8s.io", name, "-n", ns)
        assert any(c["type"] == "Admitted" and c["status"] == "True" for c in w["status"]["conditions"]), name
    finish(k, ns, "b")
    wait("b's grow Workloads gone with the job over", lambda: not [
        w for w in k.items("workloads.kueue.x-k8s.io", ns, f"{LABEL_JOB}=b") if w["metadata"]["name"] != "b"],
        timeout_s=60)
    print(json.dumps({"a_finished_to_b_grown_s": round(grow_s, 1)}))


def test_bad_labels_are_named_and_nothing_leaks(env: Any, ns: str) -> None:
    k, _ = env
    queue(k, ns, gpus=3)
    k.apply(rljob(ns, "noqueue", labels={QUEUE: "missing"}))
    k.apply(rljob(ns, "noclass", labels={QUEUE: "team", PRIORITY: "no-such-class"}))
    big = {"generator": {"replicas": 1, "resources": {"limits": {"nvidia.com/gpu": 1}}},
           "trainer": {"replicas": 1, "resources": {"limits": {"nvidia.com/gpu": 8}}}}
    k.apply(rljob(ns, "huge", labels={QUEUE: "team"}, roles=big))
    k.apply(rljob(ns, "fine", labels={QUEUE: "team"}))
    wait("fine Running beside the bad ones", phase(k, ns, "fine", "Running"), timeout_s=120)
    st = wait("noqueue says its LocalQueue is missing", lambda: (s := status(k, ns, "noqueue")) and "missing" in cond(
        s, "Admitted").get("message", "") and s, timeout_s=60)
    assert st["phase"] == "Pending"
    st = wait("noclass QueueInvalid", lambda: (s := status(k, ns, "noclass")) and cond(s, "Admitted").get(
        "reason") == "QueueInvalid" and s, timeout_s=60)
    assert "priority-class" in cond(st, "Admitted")["message"] and "no-such-class" in cond(st, "Admitted")["message"]
    assert k.run("get", "workloads.kueue.x-k8s.io", "noclass", "-n", ns, check=False).returncode != 0
    st = wait("huge says quota", lambda: (s := status(k, ns, "huge")) and "quota" in cond(s, "Admitted").get(
        "message", "") and s, timeout_s=60)
    for name in ("noqueue", "noclass", "huge"):
        assert pods(k, ns, name) == [], name
    k.run("delete", "rljob", "noqueue", "noclass", "huge", "-n", ns, "--wait=true")
    wait("their Workloads gone with them", lambda: not [w for w in k.items("workloads.kueue.x-k8s.io", ns, "")
                                                       if w["metadata"]["name"] != "fine"], timeout_s=60)


def _tree(path: pathlib.Path) -> dict[str, str]:
    """Every file under ``path`` with a digest of its content ({} when absent)."""
    return {str(f): hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(path.rglob("*")) if f.is_file()} \
        if path.exists() else {}


def test_kueue_up_down_leaves_nothing_behind(tmp_path: pathlib.Path) -> None:
    """A cluster with Kueue, up then down: the manager reads its metrics certificate from the work dir (its private
    /etc overlay), the host's /etc/kueue is not written (created, or changed where an older run left one), no mount
    of the work dir stays on the host, and down leaves no process and no port."""
    host = pathlib.Path("/etc/kueue")
    before = _tree(host)
    cluster = lifecycle.up(cfg.ClusterConfig(name="kf-kueue-leak", root=str(tmp_path), nodes=(cfg.NodePool(count=1),)))
    try:
        cluster = kueue.start(cluster)
        home = pathlib.Path(cluster.kwok_dir) / "kueue"
        pid = int((home / "kueue.pid").read_text())
        upper, _ = kueue.etc_overlay(home)
        seen = pathlib.Path(f"/proc/{pid}/root") / str(kueue.METRICS_CERT_DIR).lstrip("/") / "tls.crt"
        ours = upper / "kueue" / "metrics" / "certs" / "tls.crt"
        assert seen.read_bytes() == ours.read_bytes(), "Kueue does not read the work dir's metrics certificate"
        assert _tree(host) == before, "starting Kueue wrote the host's /etc/kueue"
        assert cluster.workdir not in pathlib.Path("/proc/self/mountinfo").read_text()
        ports = set(cluster.ports.values())
    finally:
        lifecycle.down(workdir=cluster.workdir)
    assert not procs.processes_mentioning(cluster.workdir)
    assert not ports & procs.listening_ports()
    assert not os.path.exists(cluster.workdir)
    assert _tree(host) == before
    assert cluster.workdir not in pathlib.Path("/proc/self/mountinfo").read_text()
