"""Kueue admission of an RLJob, the pure half (queueing, render.workload) and its place in decide → status."""
from __future__ import annotations

from typing import Any

import opbuilders
from opbuilders import T0, gang, pod
from kubeforge.api import contract, rljob
from kubeforge.operator import lifecycle, observed, queueing, reasons, status
from kubeforge.operator.render import context
from kubeforge.operator.render import workload as workload_render

CTX = context.RenderContext(namespace="ns", uid="u1")


def _job(**labels: str) -> rljob.RLJob:
    job = opbuilders.job("tiny", spec__roles__generator={"replicas": 4, "minReplicas": 2,
                                                         "resources": {"limits": {"nvidia.com/gpu": 1}}})
    return job.model_copy(update={"metadata": job.metadata.model_copy(update={"labels": {
        contract.LABEL_KUEUE_QUEUE: "team-a", **labels}})})


def _wl(*conds: tuple[str, str, str, str], admission: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"metadata": {"resourceVersion": "7"}, "status": {
        "conditions": [{"type": t, "status": s, "reason": r, "message": m, "lastTransitionTime": "x"}
                       for t, s, r, m in conds], **({"admission": admission} if admission else {})}}


ADMISSION = {"clusterQueue": "cq", "podSetAssignments": [
    {"name": "generator", "count": 3, "flavors": {"nvidia.com/gpu": "gpu-a"}},
    {"name": "verifier", "count": 1, "flavors": {"cpu": "cpu"}}, {"name": "trainer", "count": 1, "flavors": {}}]}
ADMITTED = _wl(("QuotaReserved", "True", "QuotaReserved", ""), ("Admitted", "True", "Admitted", ""),
               admission=ADMISSION)


def _decide(job: rljob.RLJob, gate: queueing.Gate, pods: list[dict[str, Any]]) -> tuple[lifecycle.Plan,
                                                                                         rljob.RLJobStatus]:
    obs = observed.observe(pods, ())
    plan = lifecycle.decide(job, obs, now=T0, queue=gate)
    return plan, status.compute(job, obs, plan, generation=1, now=T0)


def test_workload_has_one_pod_set_per_role_with_the_minimum_as_min_count() -> None:
    wl = workload_render.workload(_job(**{contract.LABEL_KUEUE_PRIORITY: "high"}), CTX, priority=1000)
    assert wl["apiVersion"] == "kueue.x-k8s.io/v1beta2" and wl["spec"]["queueName"] == "team-a"
    sets = {p["name"]: p for p in wl["spec"]["podSets"]}
    assert list(sets) == list(contract.ROLES)
    assert sets["generator"]["count"] == 4 and sets["generator"]["minCount"] == 2
    assert "minCount" not in sets["trainer"]
    gen = sets["generator"]["template"]["spec"]["containers"][0]
    assert gen["resources"]["requests"]["nvidia.com/gpu"] == "1"       # limits stand in for requests
    assert wl["spec"]["priority"] == 1000
    assert wl["spec"]["priorityClassRef"] == {"group": "kueue.x-k8s.io", "kind": "WorkloadPriorityClass",
                                              "name": "high"}
    assert wl["metadata"]["ownerReferences"][0]["uid"] == "u1"


def test_gate_queued_admitted_preempted_invalid() -> None:
    assert queueing.gate(queueing.facts(None)).reason == reasons.QUEUED
    pending = queueing.facts(_wl(("QuotaReserved", "False", "Inadmissible", "LocalQueue nope doesn't exist")))
    g = queueing.gate(pending)
    assert not g.admitted and g.reason == reasons.QUEUED and "LocalQueue nope doesn't exist" in g.message
    g = queueing.gate(queueing.facts(ADMITTED))
    assert g.admitted and g.reason == reasons.QUOTA_ADMITTED and "generator 3" in g.message
    evicted = queueing.facts(_wl(("Admitted", "True", "Admitted", ""), ("Evicted", "True", "Preempted",
                                                                         "Preempted to accommodate a workload"),
                                 admission=ADMISSION))
    g = queueing.gate(evicted)
    assert not g.admitted and g.reason == reasons.PREEMPTED
    g = queueing.gate(pending, invalid="metadata.labels[kueue.x-k8s.io/priority-class]: no such class")
    assert g.reason == reasons.QUEUE_INVALID and "priority-class" in g.message


def test_admitted_job_takes_the_flavors_and_the_partial_count() -> None:
    flavors = {"gpu-a": queueing.Flavor(node_labels={"pool": "a"}, tolerations=({"key": "gpu", "operator": "Exists"},))}
    shaped = queueing.admitted_job(_job(), queueing.facts(ADMITTED), flavors)
    gen = shaped.spec.roles.generator
    assert gen.replicas == 3 and gen.node_selector == {"pool": "a"}
    assert {"key": "gpu", "operator": "Exists"} in gen.tolerations
    assert shaped.spec.roles.trainer.node_selector == {}


def test_a_queued_job_has_no_pods_and_says_why() -> None:
    job = _job()
    gate = queueing.gate(queueing.facts(_wl(("QuotaReserved", "False", "Pending", "insufficient quota"))))
    plan, s = _decide(job, gate, [])
    assert not plan.active and not plan.gang_active and plan.held_by_queue and s.phase == "Pending"
    adm = next(c for c in s.conditions if c.type == reasons.ADMITTED)
    assert (adm.status, adm.reason) == ("False", reasons.QUEUED) and "insufficient quota" in adm.message
    assert s.start_time is None
    events = status.transitions(None, s, plan)
    assert any(e.reason == reasons.QUEUED for e in events)


def test_admitted_runs_and_preempted_suspends_then_gives_the_quota_back() -> None:
    job = _job()
    pods = gang() + [pod("tiny", "generator", 1)]          # the gang's minimum: 2 generators
    plan, s = _decide(job, queueing.gate(queueing.facts(ADMITTED)), pods)
    assert plan.active and s.phase == "Running"
    evicted = queueing.facts(_wl(("QuotaReserved", "True", "QuotaReserved", ""), ("Admitted", "True", "Admitted", ""),
                                 ("Evicted", "True", "Preempted", "Preempted to accommodate x"), admission=ADMISSION))
    plan2, s2 = _decide(job.model_copy(update={"status": s}), queueing.gate(evicted), pods)
    assert not plan2.active and s2.phase == "Suspended"
    assert any(e.reason == reasons.PREEMPTED and e.type == "Warning" for e in status.transitions(s, s2, plan2))
    patch = queueing.release(evicted, now="2026-11-22T12:00:09Z")
    assert patch is not None and patch["status"]["admission"] is None
    conds = {c["type"]: c for c in patch["status"]["conditions"]}
    assert conds["QuotaReserved"]["status"] == "False" and conds["Admitted"]["status"] == "False"
    assert conds["Requeued"]["status"] == "True" and patch["metadata"]["resourceVersion"] == "7"


def test_finish_once() -> None:
    patch = queueing.finish(queueing.facts(ADMITTED), succeeded=True, message="done", now="t")
    assert patch is not None and {"type": "Finished", "status": "True"}.items() <= next(
        c for c in patch["status"]["conditions"] if c["type"] == "Finished").items()
    done = queueing.facts(_wl(("Finished", "True", "Succeeded", "")))
    assert queueing.finish(done, succeeded=True, message="", now="t") is None


def test_a_queue_label_with_kueue_pod_groups_is_refused_naming_the_label() -> None:
    from kubeforge.api import validate

    job = opbuilders.job("tiny", spec__gang__backend="Kueue", spec__gang__queue="team-a")
    labelled = job.model_copy(update={"metadata": job.metadata.model_copy(update={"labels": {
        contract.LABEL_KUEUE_QUEUE: "team-a"}})})
    (problem,) = [p for p in validate.problems(labelled) if "queue-name" in p]
    assert problem.startswith("metadata.labels[kueue.x-k8s.io/queue-name]: Forbidden")
    assert not [p for p in validate.problems(_job()) if "queue-name" in p]
