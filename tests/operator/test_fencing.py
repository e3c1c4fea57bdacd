"""The operator's part of fencing (docs/fencing.md): the trainer epoch it hands out (status, the trainer template's
label, the env read from it), progress reports of a stale epoch ignored and counted, and a lost trainer pod
force-deleted only once its StatefulSet's template with the new epoch has been observed."""
from __future__ import annotations

import copy
import datetime as dt
from typing import Any

import pytest

import opbuilders
from kubeforge.api import contract, load, progress, rljob
from kubeforge.operator import fencing, lifecycle, observed, reconcile, timefmt

T0 = opbuilders.T0


def lost(role: str) -> observed.Failure:
    return observed.Failure(role=role, pod=f"tiny-{role}-0", exit_code=None, reason="NodeLost", time=None,
                            attempt=0)


def test_the_epoch_starts_at_one_and_grows_with_each_new_attempt_and_each_node_loss() -> None:
    assert fencing.epoch(0, new_attempt=False, fresh=[]) == 1
    assert fencing.epoch(1, new_attempt=False, fresh=[]) == 1
    assert fencing.epoch(1, new_attempt=True, fresh=[]) == 2
    assert fencing.epoch(2, new_attempt=False, fresh=[lost("generator")]) == 3
    assert fencing.epoch(3, new_attempt=True, fresh=[lost("trainer")]) == 4       # one step per pass
    crash = observed.Failure(role="trainer", pod="tiny-trainer-0", exit_code=1, reason="Error", time=None, attempt=0)
    assert fencing.epoch(3, new_attempt=False, fresh=[crash]) == 3     # the kubelet saw it stop: no new epoch


def trainer_pod(*, label: int | None, report: dict[str, Any] | None) -> dict[str, Any]:
    p = opbuilders.pod("tiny", "trainer", 0, progress=report)
    if label is not None:
        p["metadata"]["labels"][contract.LABEL_TRAINER_EPOCH] = str(label)
    return p


def test_a_report_below_its_pods_epoch_is_screened_out() -> None:
    stale = {"step": 12, "policyVersion": 12, "done": True, "trainerEpoch": 1}
    report, ident = fencing.screen(observed.pod_facts(trainer_pod(label=2, report=stale)))
    assert report is None and ident == "epoch 1 step 12 done"
    report, ident = fencing.screen(observed.pod_facts(trainer_pod(label=2, report={**stale, "trainerEpoch": 2})))
    assert report is not None and report.step == 12 and ident is None
    report, ident = fencing.screen(observed.pod_facts(trainer_pod(label=None, report=stale)))
    assert report is not None and ident is None          # a pod made before fencing: read as before


def decide(job: rljob.RLJob, pods: list[dict[str, Any]]) -> lifecycle.Plan:
    return lifecycle.decide(job, observed.observe(pods), now=T0)


def with_plan(job: rljob.RLJob, plan: lifecycle.Plan) -> rljob.RLJob:
    st = (job.status or rljob.RLJobStatus()).model_copy(update={
        "progress": plan.progress, "trainer_epoch": plan.trainer_epoch, "fenced_writes": plan.fenced_writes})
    return job.model_copy(update={"status": st})


def test_a_stale_trainers_report_neither_moves_progress_nor_completes_the_job_and_is_counted_once() -> None:
    job = opbuilders.job("tiny", status={"phase": "Running", "trainerEpoch": 2, "progress": {"step": 8}})
    good = [p for p in opbuilders.gang() if p["metadata"]["labels"][contract.LABEL_ROLE] != "trainer"]
    last = job.spec.algorithm.steps
    stale = trainer_pod(label=2, report={"step": last, "policyVersion": last, "done": True, "trainerEpoch": 1})
    plan = decide(job, [*good, stale])
    assert plan.terminal is None and plan.progress.step == 8
    assert plan.fenced_writes == rljob.FencedWrites(reports=1, last_report=f"epoch 1 step {last} done")
    job = with_plan(job, plan)
    assert decide(job, [*good, stale]).fenced_writes.reports == 1          # seen again: counted once
    current = trainer_pod(label=2, report={"step": 9, "policyVersion": 9, "trainerEpoch": 2,
                                           "fencedCheckpoints": 1, "fencedPushes": 2})
    plan = decide(job, [*good, current])
    assert plan.progress.step == 9
    assert (plan.fenced_writes.checkpoints, plan.fenced_writes.pushes, plan.fenced_writes.reports) == (1, 2, 1)
    job = with_plan(job, plan)
    restarted = trainer_pod(label=2, report={"step": 10, "policyVersion": 10, "trainerEpoch": 2})
    assert decide(job, [*good, restarted]).fenced_writes.pushes == 2      # a trainer restart's count never lowers it
    again = trainer_pod(label=2, report={"step": last, "policyVersion": last, "done": True, "trainerEpoch": 1,
                                         "fencedPushes": 9})
    plan = decide(job, [*good, again])
    assert plan.fenced_writes.reports == 1 and plan.fenced_writes.pushes == 2   # counts of a stale report: unread
    assert fencing.gained(job.status.fenced_writes if job.status else None,
                          plan.fenced_writes) == {}


def test_a_template_is_observed_once_its_controller_saw_its_generation_with_the_epoch() -> None:
    def sts(label: str, generation: int, observed_generation: int) -> dict[str, Any]:
        return {"metadata": {"generation": generation}, "status": {"observedGeneration": observed_generation},
                "spec": {"template": {"metadata": {"labels": {contract.LABEL_TRAINER_EPOCH: label}}}}}
    assert fencing.template_observed(sts("2", 3, 3), trainer_epoch=2)
    assert not fencing.template_observed(sts("2", 3, 2), trainer_epoch=2)
    assert not fencing.template_observed(sts("1", 3, 3), trainer_epoch=2)
    assert fencing.template_observed(None, trainer_epoch=2)       # no StatefulSet: nothing re-creates the pod


def test_a_report_round_trips_its_epoch_and_counts_and_leaves_them_out_of_status() -> None:
    rec = progress.StepRecord(step=3, policy_version=3, trainer_epoch=2, fenced_checkpoints=1, fenced_pushes=4)
    report = progress.ProgressReport.decode(progress.ProgressReport.of_step(rec, done=False).encode())
    assert report is not None and (report.trainer_epoch, report.fenced_checkpoints, report.fenced_pushes) == (2, 1, 4)
    assert report.status(rljob.Progress()) == rljob.Progress(step=3, policy_version=3)


class Cluster:
    """What a reconcile pass calls, with a trainer on a node that is lost, and a StatefulSet controller that has
    observed the applied trainer template only when told."""

    def __init__(self, job: dict[str, Any], pods: list[dict[str, Any]], nodes: dict[str, dict[str, Any]]) -> None:
        self.job, self.pods, self.nodes = job, pods, nodes
        self.force_deleted: list[str] = []
        self.sts: dict[str, dict[str, Any]] = {}
        self.observed_generation = 0

    def get_rljob(self, namespace: str, name: str) -> dict[str, Any] | None:
        return copy.deepcopy(self.job)

    def list_pods(self, namespace: str, job: str) -> list[dict[str, Any]]:
        return copy.deepcopy(self.pods)

    def get_node_lease(self, name: str) -> dict[str, Any] | None:
        return None      # no Lease readable: only the Ready condition speaks for a node

    def get_node(self, name: str) -> dict[str, Any] | None:
        return self.nodes.get(name)

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        obj = copy.deepcopy(self.sts.get(name))
        if obj is not None:
            obj["status"] = {"observedGeneration": self.observed_generation}
        return obj

    def force_delete_pod(self, namespace: str, name: str, uid: str) -> None:
        self.force_deleted.append(name)
        self.pods = [p for p in self.pods if p["metadata"]["name"] != name]

    def apply(self, obj: dict[str, Any]) -> None:
        if obj["kind"] == "StatefulSet":
            name = obj["metadata"]["name"]
            gen = self.sts.get(name, {}).get("metadata", {}).get("generation", 0) + 1
            self.sts[name] = {**copy.deepcopy(obj), "metadata": {**obj["metadata"], "generation": gen}}

    def delete(self, obj: dict[str, Any], **_: Any) -> None: ...

    def create_if_absent(self, obj: dict[str, Any]) -> bool:
        return True

    def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        self.job["status"] = status

    def post_event(self, job: dict[str, Any], **_: Any) -> None: ...


def node(ready: str) -> dict[str, Any]:
    return {"metadata": {"name": "n"}, "status": {"conditions": [
        {"type": "Ready", "status": ready, "lastTransitionTime": timefmt.fmt(T0)}]}}


def trainer_template(fake: Cluster) -> dict[str, Any]:
    tpl: dict[str, Any] = fake.sts[contract.child_name("tiny", "trainer")]["spec"]["template"]
    return tpl


@pytest.mark.parametrize("rules,attempt", [
    ([], 1),                                                                        # RestartAll: a new attempt
    ([{"action": "Ignore", "roles": ["trainer"], "onReasons": ["NodeLost"]}], 0),   # the same attempt
])
def test_a_lost_trainer_gets_a_new_epoch_and_its_pod_goes_only_once_the_template_is_observed(
        rules: list[dict[str, Any]], attempt: int) -> None:
    doc = load.dump(opbuilders.job("tiny", spec__failurePolicy__rules=rules))
    doc["metadata"].update(uid="u-job", generation=1, creationTimestamp="2026-11-22T11:00:00Z")
    pods = opbuilders.gang()
    for p in pods:
        p["metadata"]["uid"] = "u-" + p["metadata"]["labels"][contract.LABEL_ROLE]
        p["metadata"]["labels"][contract.LABEL_TRAINER_EPOCH] = "1"
    trainer = next(p for p in pods if p["metadata"]["labels"][contract.LABEL_ROLE] == "trainer")
    trainer["spec"]["nodeName"] = "lost"
    trainer["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
    fake = Cluster(doc, pods, {"lost": node("Unknown"), "kwok-gpu-0": node("True")})
    key, cache = ("ns", "tiny"), reconcile.ApplyCache()

    reconcile.reconcile(fake, key, image="img", cache=cache, clock=lambda: T0 + dt.timedelta(seconds=20))
    assert fake.job["status"]["trainerEpoch"] == 1 and not fake.force_deleted
    env = {e["name"]: e for e in trainer_template(fake)["spec"]["containers"][0]["env"]}
    assert env[contract.ENV_TRAINER_EPOCH]["valueFrom"]["fieldRef"]["fieldPath"] == \
        f"metadata.labels['{contract.LABEL_TRAINER_EPOCH}']"
    assert trainer_template(fake)["metadata"]["labels"][contract.LABEL_TRAINER_EPOCH] == "1"

    late = T0 + dt.timedelta(seconds=61)
    out = reconcile.reconcile(fake, key, image="img", cache=cache, clock=lambda: late)
    st = fake.job["status"]
    assert st["lastFailure"]["reason"] == "NodeLost" and st["attempt"] == attempt and st["trainerEpoch"] == 2
    assert trainer_template(fake)["metadata"]["labels"][contract.LABEL_TRAINER_EPOCH] == "2"
    assert fake.force_deleted == [], "the controller has not observed the new template yet"
    assert out.requeue_after is not None and out.requeue_after <= reconcile.TEMPLATE_WAIT_S

    fake.observed_generation = 2
    reconcile.reconcile(fake, key, image="img", cache=cache, clock=lambda: late)
    assert fake.force_deleted == ["tiny-trainer-0"] and fake.job["status"]["trainerEpoch"] == 2
    assert fake.job["status"].get("restarts", 0) == (1 if attempt else 0), "the loss was acted on once"

    # the replacement (label 2) starts; the old trainer comes back and patches the pod name with its report
    new = opbuilders.pod("tiny", "trainer", 0, attempt=attempt, progress={"step": 40, "policyVersion": 40,
                                                                           "done": True, "trainerEpoch": 1})
    new["metadata"]["labels"][contract.LABEL_TRAINER_EPOCH] = "2"
    fake.pods.append(new)
    out = reconcile.reconcile(fake, key, image="img", cache=cache, clock=lambda: late)
    st = fake.job["status"]
    assert st["phase"] != "Succeeded" and st["fencedWrites"]["reports"] == 1 and out.fenced == {"report": 1}


def test_the_fenced_writes_series_exists_at_zero_for_every_kind_before_any_refusal() -> None:
    # a dashboard panel over it shows "none refused" on a healthy cluster, not "no data" (the Helm suite checks that
    # every dashboard query names a series the operator serves)
    import prometheus_client as prom

    from kubeforge.operator import metrics
    text = prom.generate_latest(metrics.REGISTRY).decode()
    for kind in ("checkpoint", "push", "report"):
        assert f'kubeforge_operator_fenced_writes_total{{kind="{kind}"}}' in text
