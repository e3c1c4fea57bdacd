"""Peer silence (docs/recovery.md, "The operator acts on the job's own heartbeats"): trainer 0 reports a generator
silent; the operator fails its pod, and every pod of the job on its node when the node does not answer either,
without waiting for the node controller. Decision tables with injected time, then reconcile passes."""
from __future__ import annotations

import datetime as dt
from typing import Any

import opbuilders
import pytest
import test_nodeloss
from kubeforge.api import contract, load, progress, rljob
from kubeforge.operator import nodeloss, observed, peersilence, reasons, reconcile, timefmt
from kubeforge.operator.render import placement

T0 = opbuilders.T0            # the generator was last heard at T0
SILENCE = 10.0                # spec.failurePolicy.peerSilenceSeconds (the default)
LEASE_S = 40                  # the kubelet's Lease duration (renewed every 10 s)


def at(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


def node(name: str, *, ready: str = "True", heartbeat: float | None = None) -> dict[str, Any]:
    cond: dict[str, Any] = {"type": "Ready", "status": ready, "lastTransitionTime": timefmt.fmt(at(-3600))}
    if heartbeat is not None:
        cond["lastHeartbeatTime"] = timefmt.fmt(at(heartbeat))
    return {"metadata": {"name": name}, "status": {"conditions": [cond]}}


def lease(renewed: float, duration: int = LEASE_S) -> dict[str, Any]:
    return {"spec": {"renewTime": at(renewed).strftime("%Y-%m-%dT%H:%M:%S.%fZ"), "leaseDurationSeconds": duration}}


def raw_pod(role: str, node_name: str, *, started: float = -300.0, uid: str = "",
            report: dict[str, Any] | None = None, epoch: int | None = None) -> dict[str, Any]:
    p = opbuilders.pod("tiny", role, 0, node=node_name, progress=report)
    p["metadata"]["uid"] = uid or f"u-{role}"
    p["status"]["containerStatuses"][0]["state"] = {"running": {"startedAt": timefmt.fmt(at(started))}}
    if epoch is not None:
        p["metadata"]["labels"][contract.LABEL_TRAINER_EPOCH] = str(epoch)
    return p


def silent_report(*, step: int = 6, epoch: int = 1, silent: dict[int, float] | None = None) -> dict[str, Any]:
    last = {0: T0.timestamp()} if silent is None else silent
    return {"step": step, "trainerEpoch": epoch, "silentGenerators": {str(g): t for g, t in last.items()}}


def gang(*, gen_node: str = "n1", started: float = -300.0, report: dict[str, Any] | None = None,
         epoch: int = 1) -> list[dict[str, Any]]:
    """The tiny job on two nodes: trainer on n0, generator and verifier on ``gen_node``."""
    return [raw_pod("trainer", "n0", report=silent_report() if report is None else report, epoch=epoch),
            raw_pod("generator", gen_node, started=started), raw_pod("verifier", gen_node)]


def facts(pods: list[dict[str, Any]]) -> list[observed.PodFacts]:
    return [observed.pod_facts(p) for p in pods]


def judged(pods: list[dict[str, Any]], nodes: dict[str, dict[str, Any]], leases: dict[str, dict[str, Any] | None],
           now: float) -> nodeloss.Verdict:
    fs = facts(pods)
    report = next(p.progress for p in fs if p.role == "trainer")
    silent = peersilence.silent_pods(report, fs)
    return peersilence.judge(silent, fs, {n: nodeloss.node_facts(r, n) for n, r in nodes.items()},
                             {n: peersilence.kubelet(r) for n, r in leases.items()}, now=at(now), peer_silence=SILENCE)


def lost(v: nodeloss.Verdict) -> list[tuple[str, str]]:
    return [(p.pod, p.failure.reason) for p in v.lost]


# ------------------------------------------------------------------ which pods the report names

def test_the_report_round_trips_and_is_left_out_when_nobody_is_silent() -> None:
    r = progress.ProgressReport(step=3, silent_generators={1: 12.5})
    assert progress.ProgressReport.decode(r.encode()) == r
    assert "silentGenerators" not in progress.ProgressReport(step=3).encode()
    assert progress.ProgressReport(step=3).status(progress.ProgressReport(step=2)).model_dump().get(
        "silent_generators") is None, "the report's silence never reaches status.progress"


def test_only_generators_running_before_their_silence_are_judged() -> None:
    fs = facts(gang())
    report = next(p.progress for p in fs if p.role == "trainer")
    (s,) = peersilence.silent_pods(report, fs)
    assert (s.pod.name, s.since) == ("tiny-generator-0", T0)
    restarted = facts(gang(started=+4.0))       # started after it was last heard: a new start, not this silence
    assert peersilence.silent_pods(next(p.progress for p in restarted if p.role == "trainer"), restarted) == []
    assert peersilence.silent_pods(None, fs) == []
    quiet = facts(gang(report=silent_report(silent={})))
    assert peersilence.silent_pods(next(p.progress for p in quiet if p.role == "trainer"), quiet) == []


# ------------------------------------------------------------------ the decision table

@pytest.mark.parametrize(("case", "ready", "renewed", "now", "want", "requeue"), [
    # a dead node: its kubelet's last renewal came before the generator's last beat
    ("dead, reported", "True", -1.0, 11.0, [], 0.5),
    # overdue: a renewal (10 s) and its margin (2.5 s) after the kubelet's last word, not after the last beat
    ("dead, a renewal overdue", "True", -1.0, 11.5,
     [("tiny-generator-0", "NodeLost"), ("tiny-verifier-0", "NodeLost")], None),
    ("dead, a renewal overdue long since", "True", -1.0, 16.0,
     [("tiny-generator-0", "NodeLost"), ("tiny-verifier-0", "NodeLost")], None),
    # the last renewal a beat after the last heard beat is still before the fault
    ("dead, renewed just after the last beat", "True", 3.0, 16.0,
     [("tiny-generator-0", "NodeLost"), ("tiny-verifier-0", "NodeLost")], None),
    # the node controller has already marked it: at once
    ("not ready", "Unknown", -1.0, 11.0, [("tiny-generator-0", "NodeLost"), ("tiny-verifier-0", "NodeLost")], None),
    # a live kubelet renewed after the generator went silent: the generator alone, after twice the silence
    ("node answers, early", "True", 8.0, 12.0, [], 8.0),
    ("node answers, twice the silence", "True", 18.0, 20.0, [("tiny-generator-0", "Unhealthy")], None),
])
def test_the_decision_table(case: str, ready: str, renewed: float, now: float, want: list[tuple[str, str]],
                            requeue: float | None) -> None:
    v = judged(gang(), {"n0": node("n0"), "n1": node("n1", ready=ready, heartbeat=-1.0)}, {"n1": lease(renewed)}, now)
    assert lost(v) == want, case
    if requeue is None:
        assert v.requeue_after is None, case
    else:
        assert v.requeue_after == pytest.approx(requeue), case
    for p in v.lost:
        assert p.failure.ident == f"{p.uid}/NodeLost", "one identity with nodeloss: a pod is failed once"
        assert p.failure.node == "n1"


def test_the_fault_mark_of_a_node_that_does_not_answer_is_its_kubelets_last_word() -> None:
    """The Lease renewal when it is newer than the Ready heartbeat (posted every 5 min on a quiet node)."""
    v = judged(gang(), {"n0": node("n0"), "n1": node("n1", heartbeat=-200.0)}, {"n1": lease(3.0)}, 16.0)
    assert {p.failure.since for p in v.lost} == {timefmt.fmt(at(3.0))}, v.lost


def test_without_a_lease_the_heartbeat_alone_never_says_a_ready_node_is_dead() -> None:
    """The Ready heartbeat of a quiet node is posted every 5 min by default: its age proves nothing."""
    nodes = {"n0": node("n0"), "n1": node("n1", heartbeat=-200.0)}
    assert lost(judged(gang(), nodes, {"n1": None}, 16.0)) == []
    assert lost(judged(gang(), nodes, {"n1": None}, 21.0)) == [("tiny-generator-0", "Unhealthy")]


def test_a_pod_of_a_finished_or_other_node_is_never_taken() -> None:
    pods = gang()
    pods[2]["spec"]["nodeName"] = "n0"             # the verifier beside the trainer
    v = judged(pods, {"n0": node("n0"), "n1": node("n1", heartbeat=-1.0)}, {"n1": lease(-1.0)}, 30.0)
    assert lost(v) == [("tiny-generator-0", "NodeLost")]


# ------------------------------------------------------------------ where the job's new pods may go

def test_a_lost_node_is_avoided_until_its_kubelet_speaks_again() -> None:
    failure = rljob.FailureInfo(reason="NodeLost", node="n1", pod="tiny-generator-0", time=timefmt.fmt(at(16)))
    dead = nodeloss.node_facts(node("n1", heartbeat=-1.0), "n1")
    assert peersilence.avoided(failure, dead, peersilence.kubelet(lease(-1.0))) == ("n1",)
    back = nodeloss.node_facts(node("n1", heartbeat=60.0), "n1")
    assert peersilence.avoided(failure, back, peersilence.kubelet(lease(61.0))) == ()
    other = rljob.FailureInfo(reason="Error", node=None, pod="tiny-generator-0", time=timefmt.fmt(at(16)))
    assert peersilence.avoided(other, dead, None) == ()


def test_the_pods_keep_off_the_avoided_nodes_by_required_node_affinity() -> None:
    job = opbuilders.job("tiny")
    assert "affinity" not in placement.pod_placement(job, "generator")
    aff = placement.pod_placement(job, "generator", avoid=("n1",))["affinity"]["nodeAffinity"]
    (term,) = aff["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert term["matchExpressions"] == [{"key": "kubernetes.io/hostname", "operator": "NotIn", "values": ["n1"]}]


# ------------------------------------------------------------------ reconcile passes

class SilenceCluster(test_nodeloss.NodeCluster):
    """Just what a reconcile pass calls (test_nodeloss's), with Leases and StatefulSets observed or not."""

    def __init__(self, job: dict[str, Any], pods: list[dict[str, Any]], nodes: dict[str, dict[str, Any]],
                 leases: dict[str, dict[str, Any]], *, observed: bool = True) -> None:
        super().__init__(job, pods, nodes)
        self.leases, self.observed = leases, observed
        self.applied: dict[str, dict[str, Any]] = {}
        self.lease_reads: list[str] = []

    def get_node_lease(self, name: str) -> dict[str, Any] | None:
        self.lease_reads.append(name)
        return self.leases.get(name)

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        obj = self.applied.get(name)
        if obj is None or kind != "StatefulSet":
            return None
        gen = 3
        return {**obj, "metadata": {**obj["metadata"], "generation": gen},
                "status": {"observedGeneration": gen if self.observed else gen - 1}}

    def apply(self, obj: dict[str, Any]) -> None:
        self.applied[obj["metadata"]["name"]] = obj

    def deleted(self) -> list[str]:
        return sorted(name for name, _ in self.force_deleted)


def job_doc() -> dict[str, Any]:
    doc = load.dump(opbuilders.job("tiny"))
    doc["metadata"].update(uid="u-job", generation=1, creationTimestamp="2026-11-22T11:00:00Z")
    doc["status"] = {"attempt": 0, "trainerEpoch": 1, "phase": "Running"}
    return doc


def node_affinity(obj: dict[str, Any]) -> Any:
    return obj["spec"]["template"]["spec"].get("affinity", {}).get("nodeAffinity")


def test_a_pass_fails_the_silent_generator_and_its_dead_nodes_pods_before_the_node_controller() -> None:
    fake = SilenceCluster(job_doc(), gang(), {"n0": node("n0", heartbeat=15.0), "n1": node("n1", heartbeat=-1.0)},
                          {"n0": lease(14.0), "n1": lease(-1.0)})
    key, cache = ("ns", "tiny"), reconcile.ApplyCache()
    early = reconcile.reconcile(fake, key, image="img", cache=cache, clock=lambda: at(11))
    assert not fake.deleted() and early.requeue_after is not None and early.requeue_after <= 6.0
    assert fake.lease_reads == ["n1"], "only the silent generator's node"
    out = reconcile.reconcile(fake, key, image="img", cache=cache, clock=lambda: at(16))
    assert fake.deleted() == ["tiny-generator-0", "tiny-verifier-0"], "the trainer on n0 stays"
    st = fake.job["status"]
    assert st["lastFailure"]["reason"] == "NodeLost" and st["lastFailure"]["node"] == "n1", st
    assert out.decision is not None and st["attempt"] == 1 and st["trainerEpoch"] == 2
    (msg,) = [m for r, m in fake.events if r == reasons.NODE_LOST]
    assert "does not answer" in msg and "peerSilenceSeconds" in msg and "tiny-verifier-0" in msg
    for name in ("tiny-generator", "tiny-verifier", "tiny-trainer"):
        aff = node_affinity(fake.applied[name])
        assert aff is not None and aff["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0][
            "matchExpressions"][0]["values"] == ["n1"], name
    # the same report read again (trainer 0 has not spoken since): nothing counted twice
    restarts = st["restarts"]
    reconcile.reconcile(fake, key, image="img", cache=cache, clock=lambda: at(17))
    assert fake.job["status"]["restarts"] == restarts
    # the generator's pod listed again, terminating (the new attempt drains it): it is still on the silent node,
    # force-deleted again without counting, whatever trainer 0 says
    fake.pods = gang(report=silent_report(silent={}))
    fake.pods[1]["metadata"]["deletionTimestamp"] = timefmt.fmt(at(17))
    reconcile.reconcile(fake, key, image="img", cache=cache, clock=lambda: at(18))
    assert fake.job["status"]["restarts"] == restarts and fake.force_deleted[-2:] == [
        ("tiny-generator-0", "u-generator"), ("tiny-verifier-0", "u-verifier")]
    assert "has not answered since" in fake.events[-1][1], fake.events[-1]
    # the node speaks again: its avoidance is lifted
    fake.nodes["n1"], fake.leases["n1"] = node("n1", heartbeat=90.0), lease(90.0)
    reconcile.reconcile(fake, key, image="img", cache=cache, clock=lambda: at(91))
    assert node_affinity(fake.applied["tiny-generator"]) is None


def held_until_observed(fake: SilenceCluster, *, first: float, want: list[str]) -> None:
    """A pass at ``first`` records the failure but deletes nothing (the StatefulSet has not observed its template);
    once it has, the next pass force-deletes ``want``."""
    key, cache = ("ns", "tiny"), reconcile.ApplyCache()
    out = reconcile.reconcile(fake, key, image="img", cache=cache, clock=lambda: at(first))
    assert fake.deleted() == [] and out.requeue_after is not None and out.requeue_after <= 1.0
    assert fake.job["status"]["lastFailure"]["reason"] == "NodeLost", "the failure is recorded at once"
    fake.observed = True
    reconcile.reconcile(fake, key, image="img", cache=cache, clock=lambda: at(first + 1))
    assert fake.deleted() == want


def test_the_force_delete_waits_until_the_statefulset_has_seen_the_template_that_avoids_the_node() -> None:
    fake = SilenceCluster(job_doc(), gang(), {"n0": node("n0", heartbeat=15.0), "n1": node("n1", heartbeat=-1.0)},
                          {"n1": lease(-1.0)}, observed=False)
    held_until_observed(fake, first=16, want=["tiny-generator-0", "tiny-verifier-0"])


def test_a_stale_trainers_report_of_silence_is_not_read() -> None:
    """A trainer of an older epoch patches its replacement's pod by name: its view of the generators is not the
    job's (fencing)."""
    pods = gang(report=silent_report(epoch=1), epoch=2)
    fake = SilenceCluster(job_doc(), pods, {"n0": node("n0", heartbeat=15.0), "n1": node("n1", heartbeat=-1.0)},
                          {"n1": lease(-1.0)})
    reconcile.reconcile(fake, ("ns", "tiny"), image="img", cache=reconcile.ApplyCache(), clock=lambda: at(30))
    assert fake.deleted() == [] and fake.lease_reads == []
