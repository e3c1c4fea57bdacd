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


ONE_GEN = {"clusterQueue": "cq", "podSetAssignments": [{"name": "generator", "count": 1, "flavors": {}}]}
GROWN = queueing.facts(_wl(("QuotaReserved", "True", "QuotaReserved", ""), ("Admitted", "True", "Admitted", ""),
                           admission=ONE_GEN))
GROW_EVICTED = queueing.facts(_wl(("Admitted", "True", "Admitted", ""), ("Evicted", "True", "Preempted", "x"),
                                  admission=ONE_GEN))
GROW_PENDING = queueing.facts(_wl(("QuotaReserved", "False", "Pending", "insufficient quota")))


def test_grow_workload_asks_for_one_generator_on_the_admitted_flavors_labels() -> None:
    job = _job(**{contract.LABEL_KUEUE_PRIORITY: "high"})
    gw = workload_render.grow_workload(job, CTX, 3, priority=1000, node_labels={"pool": "a"})
    assert gw["metadata"]["name"] == "tiny.generator-3" and gw["spec"]["queueName"] == "team-a"
    (ps,) = gw["spec"]["podSets"]
    assert (ps["name"], ps["count"], "minCount" in ps) == ("generator", 1, False)
    assert ps["template"]["spec"]["nodeSelector"] == {"pool": "a"} and gw["spec"]["priority"] == 1000
    assert gw["metadata"]["ownerReferences"][0]["uid"] == "u1"
    assert list(queueing.grow_candidates(job)) == [2, 3]     # replicas 4, minReplicas 2


def test_growth_asks_for_the_missing_generators_and_counts_those_admitted() -> None:
    job = _job()                                            # 4 generators asked; main admitted with 3
    main = queueing.facts(ADMITTED)
    g = queueing.growth(job, main, {}, over=False, live_generators=(0, 1, 2))
    assert (g.grown, g.create, g.release, g.delete) == (0, (3,), (), ())
    g = queueing.growth(job, main, {3: GROW_PENDING}, over=False, live_generators=(0, 1, 2))
    assert g.grown == 0
    g = queueing.growth(job, main, {3: GROWN}, over=False, live_generators=(0, 1, 2))
    assert g.grown == 1 and queueing.admitted_job(job, main, {}, grown=g.grown).spec.roles.generator.replicas == 4
    assert queueing.admission_key(main, {}, grown=1) != queueing.admission_key(main, {}, grown=0)
    assert "(+1 as quota freed)" in queueing.gate(main, grown=1).message


def test_an_evicted_grow_workload_gives_its_quota_back_only_once_its_generator_is_gone() -> None:
    job, main = _job(), queueing.facts(ADMITTED)
    g = queueing.growth(job, main, {3: GROW_EVICTED}, over=False, live_generators=(0, 1, 2, 3))
    assert g.grown == 0 and g.release == ()                   # generator 3 still runs: its quota is still used
    g = queueing.growth(job, main, {3: GROW_EVICTED}, over=False, live_generators=(0, 1, 2))
    assert g.release == (3,) and g.create == (3,)             # released; Kueue requeues it, it grows again later
    assert queueing.release(GROW_EVICTED, now="t") is not None


def test_grow_workloads_go_when_the_job_is_evicted_or_over() -> None:
    job = _job()
    evicted = queueing.facts(_wl(("Admitted", "True", "Admitted", ""), ("Evicted", "True", "Preempted", "x"),
                                 admission=ADMISSION))
    g = queueing.growth(job, evicted, {3: GROWN}, over=False, live_generators=(0, 3))
    assert (g.grown, g.create, g.delete) == (0, (), ())         # pods still going: the quota stays held
    g = queueing.growth(job, evicted, {3: GROWN}, over=False, live_generators=())
    assert g.delete == (3,)
    g = queueing.growth(job, queueing.facts(ADMITTED), {3: GROWN}, over=True, live_generators=(0, 1, 2, 3))
    assert (g.create, g.delete) == ((), (3,))                 # over: deleted at once, like Finished frees the quota
    full = queueing.facts(_wl(("Admitted", "True", "Admitted", ""), admission={"podSetAssignments": [
        {"name": "generator", "count": 4}]}))
    g = queueing.growth(job, full, {2: GROWN}, over=False, live_generators=(0, 1, 2, 3))
    assert (g.create, g.delete) == ((), (2,))                 # readmitted whole: a leftover goes
