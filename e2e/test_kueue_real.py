"""Kueue preempting an RLJob in real pods: the tiny RLJob (every role on the real node) is admitted by Kueue
v0.17.0, a higher-priority RLJob (kwok pods) preempts it mid-run, it is Suspended (Preempted), readmitted once the
high one finished, and Succeeds with its steps contiguous and each trained once: the trainer wrote a stop
checkpoint of the step it had trained when SIGTERM came (the periodic checkpoint is off: everySteps > steps).

Measured (printed as ``E2E-KUEUE-REAL {...}``): Workload evicted → the job's pods gone (SIGTERM, the stop
checkpoint, exit), and readmission → the next trained step (vLLM and the trainer start again, resume). One real
node per machine: run under ``flock /tmp/kubeforge-realnode.lock`` with ``KUBEFORGE_REAL_NODE=1``
(``real_node_cluster`` in e2e/conftest.py).

The operator is the chart's, installed as users do (``installed``: ``helm install``, in a pod on the real node) in
**namespaced mode**, the mode docs/install.md recommends: every Kueue read it makes (the Workload in the job's
namespace; the ResourceFlavor and WorkloadPriorityClass, cluster-scoped) goes through the chart's RBAC.
``test_flavor_and_priority_class_under_namespaced_chart_rbac`` is the short run of that (no preemption).
"""
from __future__ import annotations

import json
import pathlib
import re
import threading
import time
from typing import Any

import pytest
import yaml

import installed
import run_real
from kfcluster import harness, kueue, testing
from node import realnode

pytestmark = [pytest.mark.realnode, pytest.mark.cluster, pytest.mark.slow, pytest.mark.timeout(1800)]

KUEUE = "kueue.x-k8s.io/v1beta2"
WORKLOADS = "workloads.kueue.x-k8s.io"
CQ = "kf-e2e-kueue-real"                     # cluster-scoped names: real-node runs never overlap (the flock)
LOW, HIGH = f"{CQ}-low", f"{CQ}-high"
STEPS, PREEMPT_AT = 20, 4
CPU_QUOTA = "1"                              # the low job asks 300m, the high one 900m: not both
QUEUE_LABELS = {"kueue.x-k8s.io/queue-name": "team"}


def base_manifest(path: pathlib.Path) -> pathlib.Path:
    """examples/tiny.yaml labelled for the queue at low priority, 100m CPU per role, ``STEPS`` steps, no periodic
    checkpoint within them."""
    doc = yaml.safe_load((harness.ROOT / "examples" / "tiny.yaml").read_text())
    doc["metadata"]["labels"] = {**QUEUE_LABELS, "kueue.x-k8s.io/priority-class": LOW}
    doc["spec"]["algorithm"]["steps"] = STEPS
    doc["spec"]["checkpoint"]["everySteps"] = 10 * STEPS
    for role in ("generator", "verifier", "trainer"):
        doc["spec"]["roles"][role]["resources"] = {"requests": {"cpu": "100m"}}
    path.write_text(yaml.safe_dump(doc))
    return path


def high_job(ns: str) -> dict[str, Any]:
    doc = yaml.safe_load((harness.ROOT / "examples" / "tiny.yaml").read_text())
    doc["metadata"] = {"name": "high", "namespace": ns,
                       "labels": {**QUEUE_LABELS, "kueue.x-k8s.io/priority-class": HIGH}}
    for role in ("generator", "verifier", "trainer"):
        doc["spec"]["roles"][role] = {"replicas": 1, "resources": {"requests": {"cpu": "300m"}},
                                      "tolerations": [dict(testing.KWOK_TOLERATION)]}
    return doc


def setup_queue(k: harness.K, ns: str) -> None:
    k.apply({"apiVersion": KUEUE, "kind": "ResourceFlavor", "metadata": {"name": CQ}, "spec": {}})
    k.apply({"apiVersion": KUEUE, "kind": "ClusterQueue", "metadata": {"name": CQ}, "spec": {
        "namespaceSelector": {}, "preemption": {"withinClusterQueue": "LowerPriority"},
        "resourceGroups": [{"coveredResources": ["cpu"], "flavors": [
            {"name": CQ, "resources": [{"name": "cpu", "nominalQuota": CPU_QUOTA}]}]}]}})
    for name, value in ((LOW, 100), (HIGH, 1000)):
        k.apply({"apiVersion": KUEUE, "kind": "WorkloadPriorityClass", "metadata": {"name": name}, "value": value})
    k.apply({"apiVersion": KUEUE, "kind": "LocalQueue", "metadata": {"name": "team", "namespace": ns},
             "spec": {"clusterQueue": CQ}})


def _true(wl: dict[str, Any] | None, kind: str) -> bool:
    return bool(wl) and any(c["type"] == kind and c["status"] == "True"
                            for c in (wl or {}).get("status", {}).get("conditions", []))


class Preemption:
    """The fault: apply the high-priority RLJob, then watch (on a thread) the low job's Workload evicted, its pods
    gone, the high job Running (then finished by its trainer's done report) and the low job readmitted."""

    def __init__(self, k: harness.K) -> None:
        self.k = k
        self.at: dict[str, float] = {}
        self.info: dict[str, Any] = {}
        self.thread: threading.Thread | None = None

    def __call__(self, step: int, pods: list[dict[str, Any]]) -> dict[str, Any]:
        ns = pods[0]["metadata"]["namespace"]
        self.at["fault"] = time.monotonic()
        self.k.apply(high_job(ns))
        self.info.update(step=step, high_applied=True)
        self.thread = threading.Thread(target=self._watch, args=(ns,), daemon=True)
        self.thread.start()
        return self.info

    def _get(self, *args: str) -> dict[str, Any] | None:
        r = self.k.run("get", *args, "-o", "json", check=False)
        return json.loads(r.stdout) if r.returncode == 0 else None

    def _until(self, what: str, probe: Any, timeout_s: float = 600) -> None:
        harness.wait(what, probe, timeout_s=timeout_s, interval_s=0.3)
        self.at[what] = time.monotonic()

    def _watch(self, ns: str) -> None:
        try:
            self._until("evicted", lambda: _true(self._get(WORKLOADS, "tiny", "-n", ns), "Evicted"))
            self._until("pods_gone", lambda: not self.k.items("pods", ns, "kubeforge.dev/job=tiny"))
            self._until("high_running", lambda: ((self._get("rljob", "high", "-n", ns) or {}).get("status") or {})
                        .get("phase") == "Running")
            self.k.report(ns, "high-trainer-0", step=40, meanReward=0.9, policyVersion=40, done=True)
            self._until("readmitted", lambda: _true(wl := self._get(WORKLOADS, "tiny", "-n", ns), "Admitted")
                        and not _true(wl, "Evicted"))
        except Exception as exc:  # noqa: BLE001 - reported by the test
            self.info["error"] = repr(exc)

    def seconds(self, a: str, b: str) -> float | None:
        return round(self.at[b] - self.at[a], 1) if a in self.at and b in self.at else None


def test_preempted_mid_run_resumes_from_its_stop_checkpoint(real_node_cluster: run_real.Acquired,
                                                           tmp_path: pathlib.Path) -> None:
    cluster = kueue.start(real_node_cluster.cluster)
    k = harness.K(kubectl=cluster.kubectl.binary, kubeconfig=cluster.kubeconfig)
    fault = Preemption(k)
    try:
        res = run_real.run(cluster=cluster, workdir=tmp_path, kill_after_step=PREEMPT_AT,
                           base=base_manifest(tmp_path / "tiny-kueue.yaml"), fault=fault,
                           prepare=lambda ns: setup_queue(k, ns), timeout_s=1500)
    finally:
        k.run("delete", "clusterqueue", CQ, "--wait=false", check=False)
        k.run("delete", "workloadpriorityclass", LOW, HIGH, check=False)
        k.run("delete", "resourceflavor", CQ, "--wait=false", check=False)
    assert "error" not in fault.info, fault.info
    assert res.succeeded, (res.status, res.phases)
    assert "Suspended" in [p for _, p in res.phases], res.phases
    assert len(res.trainer_logs) == 2, f"expected the preempted and the readmitted trainer, got {len(res.trainer_logs)}"
    (resumed0, steps0), (resumed1, steps1) = (run_real.step_sequence(t) for t in res.trainer_logs)
    assert resumed0 == 0 and steps0 == list(range(1, len(steps0) + 1)) and steps0[-1] >= PREEMPT_AT, steps0
    stop = re.search(r"stop checkpoint of step (\d+) written in ([\d.]+)s, ([\d.]+)s after SIGTERM", res.trainer_logs[0])
    assert stop is not None, res.trainer_logs[0][-2000:]
    assert resumed1 == int(stop.group(1)) == steps0[-1]            # no periodic checkpoint: the stop checkpoint
    assert steps1 == list(range(resumed1 + 1, STEPS + 1)), steps1   # none repeated, none lost
    first_step_after = fault.at["fault"] + res.next_step_s if res.next_step_s is not None else None
    figures = {
        "preempted_at_step": steps0[-1],
        "high_applied_to_evicted_s": fault.seconds("fault", "evicted"),
        "evicted_to_pods_gone_s": fault.seconds("evicted", "pods_gone"),
        "stop_checkpoint_write_s": float(stop.group(2)), "sigterm_to_checkpoint_written_s": float(stop.group(3)),
        "high_running_to_low_readmitted_s": fault.seconds("high_running", "readmitted"),
        "readmitted_to_next_step_s": round(first_step_after - fault.at["readmitted"], 1)
        if first_step_after is not None and "readmitted" in fault.at else None,
        "apply_to_succeeded_s": res.figures()["apply_to_succeeded_s"], "phases": res.figures()["phases"],
        "real_node": realnode.NODE_NAME}
    print("E2E-KUEUE-REAL " + json.dumps(figures))
    assert figures["evicted_to_pods_gone_s"] is not None and figures["readmitted_to_next_step_s"] is not None


FLAVOR = f"{CQ}-real-node"                   # a flavor whose node labels are the real node's own
PRIORITY_CLASS = f"{CQ}-team"
SHORT_STEPS = 4


def flavored_manifest(path: pathlib.Path) -> pathlib.Path:
    """examples/tiny.yaml labelled for the queue with a WorkloadPriorityClass, ``SHORT_STEPS`` steps."""
    doc = yaml.safe_load((harness.ROOT / "examples" / "tiny.yaml").read_text())
    doc["metadata"]["labels"] = {**QUEUE_LABELS, "kueue.x-k8s.io/priority-class": PRIORITY_CLASS}
    doc["spec"]["algorithm"]["steps"] = SHORT_STEPS
    for role in ("generator", "verifier", "trainer"):
        doc["spec"]["roles"][role]["resources"] = {"requests": {"cpu": "100m"}}
    path.write_text(yaml.safe_dump(doc))
    return path


def setup_flavored_queue(k: harness.K, ns: str) -> None:
    """A ResourceFlavor with the real node's label (copied into the pods' nodeSelector on admission: the operator
    must GET the flavor), a WorkloadPriorityClass (the operator must GET it to set the Workload's priority), a
    ClusterQueue and the LocalQueue ``team``."""
    k.apply({"apiVersion": KUEUE, "kind": "ResourceFlavor", "metadata": {"name": FLAVOR},
             "spec": {"nodeLabels": {realnode.NODE_LABEL: "true"}}})
    k.apply({"apiVersion": KUEUE, "kind": "ClusterQueue", "metadata": {"name": FLAVOR}, "spec": {
        "namespaceSelector": {}, "resourceGroups": [{"coveredResources": ["cpu"], "flavors": [
            {"name": FLAVOR, "resources": [{"name": "cpu", "nominalQuota": "4"}]}]}]}})
    k.apply({"apiVersion": KUEUE, "kind": "WorkloadPriorityClass", "metadata": {"name": PRIORITY_CLASS},
             "value": 500})
    k.apply({"apiVersion": KUEUE, "kind": "LocalQueue", "metadata": {"name": "team", "namespace": ns},
             "spec": {"clusterQueue": FLAVOR}})


def test_flavor_and_priority_class_under_namespaced_chart_rbac(real_node_cluster: run_real.Acquired,
                                                               tmp_path: pathlib.Path) -> None:
    """Issue 37's done-when: a Kueue RLJob with a WorkloadPriorityClass and a ResourceFlavor runs to Succeeded in
    real pods under the chart's namespaced-mode RBAC (before the fix: 403 on both GETs, the job never started)."""
    cluster = kueue.start(real_node_cluster.cluster)
    k = harness.K(kubectl=cluster.kubectl.binary, kubeconfig=cluster.kubeconfig)
    seen: dict[str, Any] = {}

    def watch_workload(step: int, pods: list[dict[str, Any]]) -> dict[str, Any]:
        ns = pods[0]["metadata"]["namespace"]
        seen["workload"] = k.get(WORKLOADS, "tiny", "-n", ns)
        seen["pods"] = pods
        return {"step": step, "observed": "workload"}

    try:
        res = run_real.run(cluster=cluster, workdir=tmp_path, kill_after_step=1, fault=watch_workload,
                           base=flavored_manifest(tmp_path / "tiny-flavored.yaml"),
                           prepare=lambda ns: setup_flavored_queue(k, ns), timeout_s=1200)
    finally:
        k.run("delete", "clusterqueue", FLAVOR, "--wait=false", check=False)
        k.run("delete", "workloadpriorityclass", PRIORITY_CLASS, check=False)
        k.run("delete", "resourceflavor", FLAVOR, "--wait=false", check=False)
    assert res.operator["mode"] == installed.NAMESPACED, res.operator
    assert res.succeeded, (res.status, res.phases, res.failures)
    wl = seen["workload"]
    assert wl["spec"]["priority"] == 500 and wl["spec"]["priorityClassRef"]["name"] == PRIORITY_CLASS, wl["spec"]
    flavors = {a["name"]: a["flavors"] for a in wl["status"]["admission"]["podSetAssignments"]}
    assert all(f == {"cpu": FLAVOR} for f in flavors.values()), flavors
    # the operator read both cluster-scoped objects (its own counter) and used nothing its RBAC lacks
    assert res.api_requests.get("get resourceflavors", 0) >= 1, res.api_requests
    assert res.api_requests.get("get workloadpriorityclasses", 0) >= 1, res.api_requests
    assert not res.undeclared, res.undeclared
    print("E2E-KUEUE-RBAC " + json.dumps({"operator": res.operator, "apply_to_succeeded_s": res.figures()[
        "apply_to_succeeded_s"], "phases": res.figures()["phases"], "api_requests": res.api_requests}))
