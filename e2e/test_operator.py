"""Integration tests of the operator on the real control plane (kube-apiserver, controller-manager, the
Coscheduling kube-scheduler, kwok GPU nodes). The operator runs as a subprocess against the test cluster: this is
the kwok tier (``cluster and not realnode``), whose nodes run no containers, so no operator pod could run there, and
its tests SIGKILL the process and start it again, or start one with other flags, mid-test (the chart-installed
operator in a pod is tested by the real-pod suites: ``e2e/installed.py``).

The cluster is the session's ``kube_cluster`` (``KUBECONFIG`` if it answers, else a private one). Each test
works in its own namespace and cleans up after itself, so GPU capacity (4 kwok nodes x 8 GPUs in two
zones) is free for the next one. Run: ``make cluster-up`` then ``pytest -m cluster e2e/test_operator.py``.
"""
from __future__ import annotations

import copy
import pathlib
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from kfcluster import config as kfconfig
from kfcluster import harness, lifecycle, testing
from kfcluster.harness import wait

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(600)]
ROOT = harness.ROOT
LABEL_JOB = "kubeforge.dev/job"
COSCHEDULING = ("--coscheduling-scheduler-name=default-scheduler",)
CHILD_KINDS = ("statefulsets", "services", "configmaps", "serviceaccounts", "roles", "rolebindings",
               "networkpolicies", "podgroups.scheduling.x-k8s.io", "pods")


@pytest.fixture(scope="module")
def env(kube_cluster: lifecycle.Cluster,
        tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[lifecycle.Cluster, harness.K, harness.Operator]]:
    cluster = kube_cluster
    k = harness.K(kubectl=cluster.kubectl.binary, kubeconfig=cluster.kubeconfig)
    k.ensure_crd()
    # the test cluster's scheduler is scheduler-plugins' Coscheduling as `default-scheduler`: say so, as the chart
    # value gang.coschedulingSchedulerName would, so gang.backend Auto (the examples) chooses Coscheduling
    op = harness.Operator(kubeconfig=cluster.kubeconfig, extra=("--all-namespaces", *COSCHEDULING),
                          log_path=tmp_path_factory.mktemp("operator") / "operator.log").start()
    yield cluster, k, op
    op.stop()


@pytest.fixture
def ns(env: Any) -> Iterator[str]:
    _, k, _ = env
    name = k.namespace(f"op-{uuid.uuid4().hex[:8]}")
    yield name
    k.run("delete", "rljobs", "--all", "-n", name, "--wait=false", check=False)
    k.run("delete", "namespace", name, "--wait=false", check=False)


def example(name: str, ns: str, **spec: Any) -> dict[str, Any]:
    """An example RLJob in ``ns`` with ``spec`` overrides; every role tolerates the kwok nodes' taint."""
    doc = yaml.safe_load((ROOT / "examples" / f"{name}.yaml").read_text())
    doc["metadata"]["namespace"] = ns
    doc["spec"].update(copy.deepcopy(spec))
    roles = doc["spec"].setdefault("roles", {})
    for role in ("generator", "verifier", "trainer"):
        roles.setdefault(role, {}).setdefault("tolerations", []).append(dict(testing.KWOK_TOLERATION))
    return doc


def job(k: harness.K, ns: str, name: str) -> dict[str, Any]:
    return k.get("rljob", name, "-n", ns)


def phase_is(k: harness.K, ns: str, name: str, phase: str) -> Any:
    def probe() -> Any:
        st = job(k, ns, name).get("status", {})
        return st if st.get("phase") == phase else None
    return probe


def condition(status: dict[str, Any], kind: str) -> dict[str, Any]:
    return next(c for c in status.get("conditions", []) if c["type"] == kind)


def pods(k: harness.K, ns: str, name: str) -> list[dict[str, Any]]:
    return k.items("pods", ns, f"{LABEL_JOB}={name}")


def children(k: harness.K, ns: str, name: str) -> dict[str, list[str]]:
    return {kind: sorted(o["metadata"]["name"] for o in k.items(kind, ns, f"{LABEL_JOB}={name}"))
            for kind in CHILD_KINDS}


def event_reasons(k: harness.K, ns: str, name: str) -> list[str]:
    evs = k.items("events", ns)
    evs = [e for e in evs if e["involvedObject"].get("name") == name and e["involvedObject"].get("kind") == "RLJob"]
    return [e["reason"] for e in sorted(evs, key=lambda e: e["metadata"]["creationTimestamp"])]


# ------------------------------------------------------------------------------------------------ tests


def test_examples_create_every_child_and_run(env: Any, ns: str) -> None:
    _, k, _ = env
    for name, file in (("tiny", "tiny"), ("arith", "arithmetic-smollm2")):
        k.apply(example(file, ns))
    for name in ("tiny", "arith"):
        st = wait(f"{name} Running", phase_is(k, ns, name, "Running"))
        assert st["ready"] == "3/3" and all(r["ready"] == r["replicas"] == 1 for r in st["roles"].values())
        assert condition(st, "GangScheduled")["status"] == "True"
        assert all(c["observedGeneration"] == job(k, ns, name)["metadata"]["generation"] for c in st["conditions"])
        got = children(k, ns, name)
        assert got["statefulsets"] == [f"{name}-generator", f"{name}-trainer", f"{name}-verifier"]
        assert got["services"] == [name]          # one headless Service per job names every role's pods
        assert got["configmaps"] == [f"{name}-config"] and got["podgroups.scheduling.x-k8s.io"] == [name]
        assert got["serviceaccounts"] == got["roles"] == got["rolebindings"] == [f"{name}-runtime"]
        ps = pods(k, ns, name)
        assert len(ps) == 3 and all(p["spec"]["nodeName"].startswith("kwok-") for p in ps)
        assert {"Pending", "Running"} <= set(event_reasons(k, ns, name))
    # the demo's generator asks for a GPU and the job is packed into one zone
    arith = pods(k, ns, "arith")
    gen = next(p for p in arith if p["metadata"]["labels"]["kubeforge.dev/role"] == "generator")
    assert gen["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    zones = {k.get("node", p["spec"]["nodeName"])["metadata"]["labels"][kfconfig.ZONE_LABEL] for p in arith}
    assert len(zones) == 1
    table = k.run("get", "rljobs", "-n", ns).stdout
    assert table.split("\n")[0].split()[:5] == ["NAME", "PHASE", "READY", "RESTARTS", "STEP"]
    assert "Running" in table and "3/3" in table


def test_auto_chooses_coscheduling_on_the_test_cluster(env: Any, ns: str) -> None:
    """gang.backend Auto (issue 37 item 3) where the PodGroup CRD is served and the operator names its scheduler:
    Coscheduling, said once by condition and event; the pods name the scheduler. The trainer of
    examples/hf-token-secret.yaml carries its Secret reference into the pod (the kwok node starts no container)."""
    _, k, _ = env
    doc = example("hf-token-secret", ns)
    assert "gang" not in doc["spec"]          # the example takes the default
    k.apply(doc)
    name = doc["metadata"]["name"]
    st = wait(f"{name} Running", phase_is(k, ns, name, "Running"))
    cond = condition(st, "GangScheduling")
    assert (cond["status"], cond["reason"]) == ("True", "AutoChoseCoscheduling"), cond
    assert "default-scheduler" in cond["message"] and condition(st, "GangScheduled")["status"] == "True"
    assert children(k, ns, name)["podgroups.scheduling.x-k8s.io"] == [name]
    ps = pods(k, ns, name)
    assert len(ps) == 3 and all(p["spec"]["schedulerName"] == "default-scheduler" for p in ps)
    assert all(p["metadata"]["labels"]["scheduling.x-k8s.io/pod-group"] == name for p in ps)
    trainer = next(p for p in ps if p["metadata"]["labels"]["kubeforge.dev/role"] == "trainer")
    env_vars = {e["name"]: e for e in trainer["spec"]["containers"][0]["env"]}
    assert env_vars["HF_TOKEN"]["valueFrom"] == {"secretKeyRef": {"name": "hf-token", "key": "token"}}
    assert event_reasons(k, ns, name).count("AutoChoseCoscheduling") == 1


def test_gang_waits_for_gpus_then_starts_whole(env: Any, ns: str) -> None:
    cluster, k, _ = env
    # 5 generators x 8 GPUs + trainer 8 GPUs = 48 GPUs; the cluster has 32
    big = example("tiny", ns, roles={"generator": {"replicas": 5, "resources": {"limits": {"nvidia.com/gpu": 8}}},
                                     "verifier": {"replicas": 1},
                                     "trainer": {"replicas": 1, "resources": {"limits": {"nvidia.com/gpu": 8}}}},
                  gang={"backend": "Coscheduling", "scheduleTimeoutSeconds": 600})
    big["metadata"]["name"] = "big"
    k.apply(big)
    st = wait("GangScheduled=False Unschedulable", lambda: (
        (s := job(k, ns, "big").get("status", {})) and s.get("conditions") and
        condition(s, "GangScheduled")["reason"] == "Unschedulable" and s))
    assert st["phase"] == "Pending" and condition(st, "GangScheduled")["message"]
    time.sleep(5)
    assert not any(p["spec"].get("nodeName") for p in pods(k, ns, "big")), "part of the gang was bound"
    pool = kfconfig.NodePool(count=2, prefix="kwok-extra", zones=("zone-c",))
    lifecycle.add_nodes(cluster, [pool])
    try:
        wait("big Running after nodes were added", phase_is(k, ns, "big", "Running"), timeout_s=180)
        assert len([p for p in pods(k, ns, "big") if p["spec"].get("nodeName")]) == 7
    finally:
        k.run("delete", "rljob", "big", "-n", ns, "--wait=true", check=False)
        wait("big's pods gone", lambda: not pods(k, ns, "big"), timeout_s=120)
        k.run("delete", "node", "kwok-extra-0", "kwok-extra-1", check=False)


def test_surplus_generators_never_take_the_trainers_place(env: Any, ns: str) -> None:
    """One node's worth of GPUs (8): 12 generators of 1 GPU with minReplicas 1 and a trainer of 2 GPUs. Only the
    minimum is the gang (1 generator, the verifier, the trainer: 3 GPUs); the 11 surplus generators come after
    it, so the trainer runs and the generators that do not fit wait (before, 8 generators took the node and the
    trainer stayed Pending)."""
    cluster, k, _ = env
    pool_id = f"one-{uuid.uuid4().hex[:6]}"
    pool = kfconfig.NodePool(count=1, gpus=8, prefix=pool_id, zones=("zone-c",),
                             extra_labels={"kubeforge.dev/pool": pool_id})
    lifecycle.add_nodes(cluster, [pool])
    on_pool = {"nodeSelector": {"kubeforge.dev/pool": pool_id}}
    roles = {"generator": {"replicas": 12, "minReplicas": 1, "resources": {"limits": {"nvidia.com/gpu": 1}},
                           **on_pool},
             "verifier": {"replicas": 1, **on_pool},
             "trainer": {"replicas": 1, "resources": {"limits": {"nvidia.com/gpu": 2}}, **on_pool}}
    try:
        k.apply(example("tiny", ns, roles=roles))
        st = wait("Running", phase_is(k, ns, "tiny", "Running"), timeout_s=180)
        trainer = k.get("pod", "tiny-trainer-0", "-n", ns)
        assert trainer["spec"]["nodeName"] == f"{pool_id}-0" and trainer["status"]["phase"] == "Running"
        assert condition(st, "GangScheduled")["status"] == "True"
        gens = [p for p in pods(k, ns, "tiny") if p["metadata"]["labels"]["kubeforge.dev/role"] == "generator"]
        wait("12 generator pods", lambda: len([p for p in pods(k, ns, "tiny") if p["metadata"]["labels"][
            "kubeforge.dev/role"] == "generator"]) == 12, timeout_s=60)
        time.sleep(5)      # several scheduling attempts for the surplus
        gens = [p for p in pods(k, ns, "tiny") if p["metadata"]["labels"]["kubeforge.dev/role"] == "generator"]
        bound = sorted(p["metadata"]["name"] for p in gens if p["spec"].get("nodeName"))
        waiting = [p for p in gens if not p["spec"].get("nodeName")]
        assert "tiny-generator-0" in bound and len(bound) == 5 + 1, bound      # 8 GPUs - 2 (trainer) = 6
        assert len(waiting) == 6 and all(p["status"]["phase"] == "Pending" for p in waiting)
        assert all(p["metadata"]["name"].startswith("tiny-gen-surplus-") for p in waiting)
        # the gang's members are exactly its minimum (before, all 12 generators carried the label and any 3 pods
        # satisfied minMember 3: whether the trainer got its place was a race the generators could win)
        members = sorted(p["metadata"]["name"] for p in pods(k, ns, "tiny")
                         if "scheduling.x-k8s.io/pod-group" in p["metadata"]["labels"])
        assert members == ["tiny-generator-0", "tiny-trainer-0", "tiny-verifier-0"], members
        assert k.get("podgroup", "tiny", "-n", ns)["spec"]["minMember"] == 3
        indexes = sorted(int(p["metadata"]["labels"]["apps.kubernetes.io/pod-index"]) for p in gens)
        assert indexes == list(range(12))        # ordinals contiguous across the two StatefulSets
        assert k.get("rljob", "tiny", "-n", ns)["status"]["phase"] == "Running"
    finally:
        k.run("delete", "rljob", "tiny", "-n", ns, "--wait=true", check=False)
        wait("tiny's pods gone", lambda: not pods(k, ns, "tiny"), timeout_s=120)
        k.run("delete", "node", f"{pool_id}-0", check=False)


def test_required_placement_and_exclusive_domains(env: Any, ns: str) -> None:
    _, k, _ = env
    placement = {"topologyKey": kfconfig.ZONE_LABEL, "mode": "Required", "exclusive": True}
    roles = {"generator": {"replicas": 3, "resources": {"limits": {"nvidia.com/gpu": 1}}}}
    for name in ("pa", "pb"):
        doc = example("tiny", ns, placement=placement, roles=roles)
        doc["metadata"]["name"] = name
        k.apply(doc)
    zones = {}
    for name in ("pa", "pb"):
        wait(f"{name} Running", phase_is(k, ns, name, "Running"))
        zs = {k.get("node", p["spec"]["nodeName"])["metadata"]["labels"][kfconfig.ZONE_LABEL]
              for p in pods(k, ns, name)}
        assert len(zs) == 1, f"{name} spans zones {zs}"
        zones[name] = zs.pop()
    assert zones["pa"] != zones["pb"]


def test_suspend_and_resume(env: Any, ns: str) -> None:
    _, k, _ = env
    k.apply(example("tiny", ns))
    wait("Running", phase_is(k, ns, "tiny", "Running"))
    k.run("patch", "rljob", "tiny", "-n", ns, "--type=merge", "-p", '{"spec":{"suspend":true}}')
    st = wait("Suspended", phase_is(k, ns, "tiny", "Suspended"))
    assert condition(st, "Suspended")["status"] == "True"
    wait("pods gone", lambda: not pods(k, ns, "tiny"))
    wait("PodGroup released", lambda: not k.items("podgroups.scheduling.x-k8s.io", ns))
    k.run("patch", "rljob", "tiny", "-n", ns, "--type=merge", "-p", '{"spec":{"suspend":false}}')
    wait("Running again", phase_is(k, ns, "tiny", "Running"))
    assert k.items("podgroups.scheduling.x-k8s.io", ns)


def test_active_deadline_fails_the_job(env: Any, ns: str) -> None:
    _, k, _ = env
    k.apply(example("tiny", ns, activeDeadlineSeconds=8))
    st = wait("Failed", phase_is(k, ns, "tiny", "Failed"), timeout_s=60)
    assert condition(st, "Failed")["reason"] == "DeadlineExceeded" and st["completionTime"]
    wait("pods gone", lambda: not pods(k, ns, "tiny"))


def test_completion_then_ttl_deletes_everything(env: Any, ns: str) -> None:
    _, k, _ = env
    k.apply(example("tiny", ns, ttlSecondsAfterFinished=4))
    wait("Running", phase_is(k, ns, "tiny", "Running"))
    steps = job(k, ns, "tiny")["spec"]["algorithm"]["steps"]
    k.report(ns, "tiny-trainer-0", step=steps, meanReward=0.9, policyVersion=steps, done=True)
    st = wait("Succeeded", phase_is(k, ns, "tiny", "Succeeded"))
    assert condition(st, "Complete")["reason"] == "TrainingComplete"
    assert st["progress"]["step"] == steps and st["progress"]["meanReward"] == 0.9
    wait("RLJob deleted by TTL", lambda: k.run("get", "rljob", "tiny", "-n", ns, check=False).returncode != 0,
         timeout_s=60)
    wait("no child left", lambda: not any(children(k, ns, "tiny").values()), timeout_s=90)


def test_export_request_on_the_rljob_reaches_trainer_0_and_status(env: Any, ns: str) -> None:
    """The user annotates the RLJob; the operator copies the request onto trainer 0's pod (where the trainer reads
    it); the trainer's lastExport (here written by hand, kwok runs no code) reaches status.progress.lastExport."""
    _, k, _ = env
    k.apply(example("tiny", ns))
    wait("Running", phase_is(k, ns, "tiny", "Running"))
    key = "kubeforge.dev/export-request"
    k.run("annotate", "rljob", "tiny", "-n", ns, f"{key}=r1")
    wait("request relayed to trainer 0", lambda: (
        (k.get("pod", "tiny-trainer-0", "-n", ns)["metadata"].get("annotations") or {}).get(key) == "r1"))
    last = {"request": "r1", "path": "/checkpoints/export-step-2", "step": 2}
    k.report(ns, "tiny-trainer-0", step=2, meanReward=0.5, policyVersion=2, lastExport=last)
    st = wait("lastExport in status", lambda: (
        (s := job(k, ns, "tiny").get("status", {})).get("progress", {}).get("lastExport") == last and s))
    assert st["progress"]["step"] == 2
    k.run("annotate", "rljob", "tiny", "-n", ns, f"{key}=r2", "--overwrite")
    wait("a new request relayed", lambda: (
        (k.get("pod", "tiny-trainer-0", "-n", ns)["metadata"].get("annotations") or {}).get(key) == "r2"))


def test_delete_garbage_collects_every_child(env: Any, ns: str) -> None:
    _, k, _ = env
    k.apply(example("tiny", ns))
    wait("Running", phase_is(k, ns, "tiny", "Running"))
    assert all(children(k, ns, "tiny")[kind] for kind in CHILD_KINDS)
    k.run("delete", "rljob", "tiny", "-n", ns)
    wait("no child left", lambda: not any(children(k, ns, "tiny").values()), timeout_s=90)


@pytest.mark.parametrize("style", ["pod-failed", "container-restart"])
def test_container_failure_restarts_the_job(env: Any, ns: str, style: str) -> None:
    _, k, _ = env
    k.apply(example("tiny", ns))
    wait("Running", phase_is(k, ns, "tiny", "Running"))
    prefix = ("pod-container-running-failed.stage.kwok.x-k8s.io" if style == "pod-failed"
              else "container-restart.stage.kubeforge.dev")
    k.run("annotate", "pod", "tiny-verifier-0", "-n", ns, f"{prefix}/exit-code=3", f"{prefix}/reason=Error")
    k.run("label", "pod", "tiny-verifier-0", "-n", ns, f"{prefix}=true")
    st = wait("a restart recorded", lambda: (s := job(k, ns, "tiny").get("status", {})).get("restarts") == 1 and s)
    assert st["attempt"] == 1
    assert st["lastFailure"]["role"] == "verifier" and st["lastFailure"]["exitCode"] == 3
    assert st["lastFailure"]["pod"] == "tiny-verifier-0" and st["lastFailure"]["reason"] == "Error"
    wait("Running in attempt 1", phase_is(k, ns, "tiny", "Running"), timeout_s=120)
    ps = pods(k, ns, "tiny")
    assert len(ps) == 3 and {p["metadata"]["labels"]["kubeforge.dev/attempt"] for p in ps} == {"1"}
    reasons = event_reasons(k, ns, "tiny")
    assert "ContainerFailed" in reasons and "Restarting" in reasons


def _crash(k: harness.K, ns: str, pod: str, code: int) -> None:
    """One in-place container crash (kubelet style) with ``code`` (the kwok stage of e2e/kfcluster/stages)."""
    prefix = "container-restart.stage.kubeforge.dev"
    k.run("annotate", "--overwrite", "pod", pod, "-n", ns, f"{prefix}/exit-code={code}", f"{prefix}/reason=Error")
    k.run("label", "pod", pod, "-n", ns, f"{prefix}=true")


def test_failure_rules_restart_role_once_fail_by_rule_and_backoff(env: Any, ns: str) -> None:
    """RestartRole on a generator: counted once (also across an operator restart right after it), the trainer
    pod and the attempt untouched, no duplicate pod; the next crash exhausts maxRestarts; a Fail rule on an exit
    code fails another job with FailedByRule."""
    _, k, op = env
    policy = {"maxRestarts": 1, "rules": [{"action": "Fail", "onExitCodes": [3]},
                                          {"action": "RestartRole", "roles": ["generator", "verifier"]}]}
    k.apply(example("tiny", ns, failurePolicy=policy))
    wait("Running", phase_is(k, ns, "tiny", "Running"))
    trainer_uid = k.get("pod", "tiny-trainer-0", "-n", ns)["metadata"]["uid"]
    _crash(k, ns, "tiny-generator-0", 137)
    st = wait("a role restart counted", lambda: (s := job(k, ns, "tiny").get("status", {})).get("restarts") == 1 and s)
    assert st["attempt"] == 0 and st["roles"]["generator"]["restarts"] == 1 and st["roles"]["trainer"]["restarts"] == 0
    assert st["lastFailure"]["action"] == "RestartRole" and st["lastFailure"]["exitCode"] == 137
    op.kill()                                    # the operator dies right after acting; a new one replays
    op.start()
    time.sleep(8)
    st = job(k, ns, "tiny")["status"]
    assert st["restarts"] == 1 and st["attempt"] == 0 and st["phase"] != "Failed"
    ps = pods(k, ns, "tiny")
    assert sorted(p["metadata"]["name"] for p in ps) == ["tiny-generator-0", "tiny-trainer-0", "tiny-verifier-0"]
    assert k.get("pod", "tiny-trainer-0", "-n", ns)["metadata"]["uid"] == trainer_uid
    time.sleep(1.1)                              # a later crash ends at a later second: a new failure
    _crash(k, ns, "tiny-generator-0", 137)
    st = wait("Failed", lambda: (s := job(k, ns, "tiny").get("status", {})).get("phase") == "Failed" and s)
    failed = condition(st, "Failed")
    assert failed["reason"] == "BackoffLimitExceeded" and "maxRestarts=1" in failed["message"]

    doc = example("tiny", ns, failurePolicy=policy)
    doc["metadata"]["name"] = "rule"
    k.apply(doc)
    wait("Running", phase_is(k, ns, "rule", "Running"))
    _crash(k, ns, "rule-trainer-0", 3)
    st = wait("Failed", lambda: (s := job(k, ns, "rule").get("status", {})).get("phase") == "Failed" and s)
    assert condition(st, "Failed")["reason"] == "FailedByRule" and st["restarts"] == 0
    assert "exit code 3" in condition(st, "Failed")["message"]


def test_generators_scale_without_touching_the_trainer(env: Any, ns: str) -> None:
    """Generators are elastic: `kubectl scale` (the scale subresource) 1 -> 2 -> 1 keeps the attempt and the
    trainer's pod; a verifier replica change still rolls out as a new attempt (not a restart)."""
    _, k, _ = env
    k.apply(example("tiny", ns))
    wait("Running", phase_is(k, ns, "tiny", "Running"))
    trainer_uid = k.get("pod", "tiny-trainer-0", "-n", ns)["metadata"]["uid"]
    k.run("scale", "rljob", "tiny", "-n", ns, "--replicas=2")
    wait("2 generators ready", lambda: (s := job(k, ns, "tiny").get("status", {})).get("phase") == "Running"
         and s["roles"]["generator"]["ready"] == 2)
    st = job(k, ns, "tiny")["status"]
    assert st["restarts"] == 0 and st["attempt"] == 0
    assert k.get("pod", "tiny-trainer-0", "-n", ns)["metadata"]["uid"] == trainer_uid
    k.run("scale", "rljob", "tiny", "-n", ns, "--replicas=1")
    wait("1 generator", lambda: len([p for p in pods(k, ns, "tiny") if p["metadata"]["labels"].get(
        "kubeforge.dev/role") == "generator" and not p["metadata"].get("deletionTimestamp")]) == 1)
    assert k.get("pod", "tiny-trainer-0", "-n", ns)["metadata"]["uid"] == trainer_uid
    assert job(k, ns, "tiny")["status"]["attempt"] == 0
    k.run("patch", "rljob", "tiny", "-n", ns, "--type=merge", "-p", '{"spec":{"roles":{"verifier":{"replicas":2}}}}')
    wait("2 verifiers ready", lambda: (s := job(k, ns, "tiny").get("status", {})).get("phase") == "Running"
         and s["roles"]["verifier"]["ready"] == 2)
    st = job(k, ns, "tiny")["status"]
    assert st["restarts"] == 0 and st["attempt"] == 1
    env_vars = {e["name"]: e.get("value") for e in
                k.get("pod", "tiny-trainer-0", "-n", ns)["spec"]["containers"][0]["env"]}
    assert env_vars["KUBEFORGE_VERIFIER_REPLICAS"] == "2"


def test_operator_killed_mid_reconcile_leaves_no_duplicate_or_orphan(env: Any, ns: str,
                                                                     tmp_path: pathlib.Path) -> None:
    cluster, k, op = env
    names = [f"j{i}" for i in range(10)]
    docs = []
    for name in names:
        doc = example("tiny", ns)
        doc["metadata"]["name"] = name
        docs.append(doc)
    k.apply({"apiVersion": "v1", "kind": "List", "items": docs})
    time.sleep(1.5)           # the operator is now in the middle of creating children
    op.kill()
    partial = sum(len(v) for n in names for v in children(k, ns, n).values())
    op.start()
    for name in names:
        wait(f"{name} Running", phase_is(k, ns, name, "Running"), timeout_s=180)
    for name in names:
        uid = job(k, ns, name)["metadata"]["uid"]
        got = children(k, ns, name)
        assert len(got["statefulsets"]) == 3 and len(got["services"]) == 1 and len(got["pods"]) == 3
        assert len(got["configmaps"]) == len(got["podgroups.scheduling.x-k8s.io"]) == 1
        for kind in CHILD_KINDS[:-1]:
            for obj in k.items(kind, ns, f"{LABEL_JOB}={name}"):
                refs = obj["metadata"].get("ownerReferences", [])
                assert [r["uid"] for r in refs] == [uid], f"{kind}/{obj['metadata']['name']} owner {refs}"
    every = {o["metadata"]["labels"][LABEL_JOB] for kind in CHILD_KINDS for o in k.items(kind, ns, LABEL_JOB)}
    assert every == set(names), f"orphans: {every - set(names)} (partial before restart: {partial})"


def test_namespace_scoping(env: Any, ns: str, tmp_path: pathlib.Path) -> None:
    cluster, k, op = env
    other = k.namespace(f"op-other-{uuid.uuid4().hex[:6]}")
    op.kill()
    scoped = harness.Operator(kubeconfig=cluster.kubeconfig, log_path=tmp_path / "scoped.log",
                              extra=("--namespace", ns)).start()
    try:
        for where in (ns, other):
            k.apply(example("tiny", where))
        wait("the watched namespace's job Running", phase_is(k, ns, "tiny", "Running"))
        time.sleep(3)
        assert "status" not in job(k, other, "tiny") and not pods(k, other, "tiny")
    finally:
        scoped.stop()
        k.run("delete", "namespace", other, "--wait=false", check=False)
        op.start()


def test_a_sandbox_pool_renders_outside_the_gang_and_its_pods_hold_nothing(env: Any, ns: str) -> None:
    """``spec.sandbox`` (docs/sandboxes.md): the operator makes the sandbox StatefulSet, headless Service,
    NetworkPolicy and key Secret; the sandbox pods run beside the job's three (not counted in its roles, not in the
    gang, without the job label), token-less and key-less; the verifiers are told the pool; deleting the job takes
    the pool with it."""
    _, k, _ = env
    doc = example("tiny", ns, task={"code": {}, "seed": 0},
                  verifiers=[{"name": "tests", "type": "CodeExecution"}],
                  sandbox={"replicas": 2, "slots": 4, "tolerations": [dict(testing.KWOK_TOLERATION)]})
    doc["spec"]["algorithm"]["maxNewTokens"] = 64
    doc["spec"].pop("evaluation", None)
    k.apply(doc)
    st = wait("tiny Running", phase_is(k, ns, "tiny", "Running"))
    assert st["ready"] == "3/3" and sorted(st["roles"]) == ["generator", "trainer", "verifier"]
    boxes = wait("2 sandbox pods Running", lambda: [
        p for p in k.items("pods", ns, "kubeforge.dev/sandbox-of=tiny")
        if p["status"].get("phase") == "Running"] if len(k.items("pods", ns, "kubeforge.dev/sandbox-of=tiny")) == 2
        else None)
    for p in boxes:
        labels, spec = p["metadata"]["labels"], p["spec"]
        assert LABEL_JOB not in labels and "scheduling.x-k8s.io/pod-group" not in labels
        assert spec["automountServiceAccountToken"] is False
        assert not any("projected" in v or "secret" in v for v in spec.get("volumes", []))
        env_names = {e["name"] for e in spec["containers"][0]["env"]}
        assert "KUBEFORGE_JOB_KEY" not in env_names and "KUBEFORGE_SANDBOX_KEY" in env_names
    assert {p["metadata"]["name"] for p in boxes} == {"tiny-sandbox-0", "tiny-sandbox-1"}
    assert len(pods(k, ns, "tiny")) == 3                  # the job's own pods: the sandbox pods are not among them
    got = children(k, ns, "tiny")
    assert "tiny-sandbox" in got["statefulsets"] and "tiny-sandbox" in got["services"]
    assert "tiny-sandbox-network" in got["networkpolicies"]
    policy = k.get("networkpolicy", "tiny-sandbox-network", "-n", ns)
    assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"] and not policy["spec"].get("egress")
    k.get("secret", "tiny-sandbox-key", "-n", ns)         # drawn by the operator
    verifier = k.items("pods", ns, f"{LABEL_JOB}=tiny,kubeforge.dev/role=verifier")[0]
    venv = {e["name"]: e for e in verifier["spec"]["containers"][0]["env"]}
    assert venv["KUBEFORGE_PEERS_SANDBOX"]["value"].startswith(f"tiny-sandbox-0.tiny-sandbox.{ns}.svc:")
    k.run("delete", "rljob", "tiny", "-n", ns, "--wait=true", "--timeout=120s")
    wait("the pool garbage-collected", lambda: not k.items("statefulsets", ns, f"{LABEL_JOB}=tiny")
         and not k.items("pods", ns, "kubeforge.dev/sandbox-of=tiny") or None)
