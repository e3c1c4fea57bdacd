"""Trainer silence (docs/recovery.md, "A lost trainer's node"): trainer 0's progress quiet for peerSilenceSeconds,
its node's kubelet Lease overdue and another kubelet renewing since: the operator fails the job's pods on that
node without waiting for the node controller. Decision tables with injected time, then reconcile passes."""
from __future__ import annotations

from typing import Any

import pytest
import test_peer_silence as ps
from kubeforge.api import progress
from kubeforge.operator import nodeloss, observed, peersilence, reasons, reconcile, timefmt, trainersilence

T0 = ps.T0                    # trainer 0's last step record was made at T0
SILENCE = ps.SILENCE          # spec.failurePolicy.peerSilenceSeconds (the default, 10 s)
at = ps.at


def report(*, step: int = 12, time: float = 0.0, epoch: int = 1) -> dict[str, Any]:
    doc: dict[str, Any] = {"step": step, "trainerEpoch": epoch}
    if time == 0.0:
        doc["time"] = T0.timestamp()
    elif time > 0:
        doc["time"] = at(time).timestamp()
    return doc


def gang(*, rep: dict[str, Any] | None = None, epoch: int = 1) -> list[dict[str, Any]]:
    """The tiny job on two nodes: the trainer alone on n1, the generator and the verifier on n0."""
    return [ps.raw_pod("trainer", "n1", report=report() if rep is None else rep, epoch=epoch),
            ps.raw_pod("generator", "n0"), ps.raw_pod("verifier", "n0")]


def judged(pods: list[dict[str, Any]], *, n1: dict[str, Any], lease1: dict[str, Any] | None,
           lease0: dict[str, Any] | None, now: float) -> trainersilence.Judged:
    fs = [observed.pod_facts(p) for p in pods]
    rep = next(p.progress for p in fs if p.role == "trainer")
    quiet = trainersilence.quiet_since(rep, last_progress=None)
    assert quiet is not None
    trainers = trainersilence.trainer_pods(fs, attempt=0)
    return trainersilence.judge(fs, trainers, quiet=quiet, nodes={"n1": nodeloss.node_facts(n1, "n1")},
                                leases={"n1": peersilence.kubelet(lease1)},
                                witnesses={"n0": peersilence.kubelet(lease0)}, now=at(now))


def lost(j: trainersilence.Judged) -> list[tuple[str, str]]:
    return [(p.pod, p.failure.reason) for p in j.verdict.lost]


# ------------------------------------------------------------------ what counts as quiet progress

def test_quiet_progress_counts_from_trainer_0s_last_step_record() -> None:
    last = at(-5)
    assert trainersilence.quiet_since(None, last_progress=last) is None, "no report: nothing to go quiet"
    assert trainersilence.quiet_since(progress.ProgressReport(step=0), last_progress=last) is None, \
        "no step of this attempt yet: the node controller decides"
    assert trainersilence.quiet_since(progress.ProgressReport(step=3, time=T0.timestamp()), last_progress=last) == T0
    assert trainersilence.quiet_since(progress.ProgressReport(step=3), last_progress=last) == last, \
        "a trainer that reports no record time: the status's lastProgressTime"


def test_the_trainer_nodes_are_read_only_once_progress_has_been_quiet_for_the_peer_silence() -> None:
    trainers = trainersilence.trainer_pods([observed.pod_facts(p) for p in gang()], attempt=0)
    assert [p.name for p in trainers] == ["tiny-trainer-0"]
    assert trainersilence.watched(trainers, quiet=T0, now=at(4), peer_silence=SILENCE) == ([], 6.0)
    assert trainersilence.watched(trainers, quiet=T0, now=at(9.5), peer_silence=SILENCE) == \
        ([], trainersilence.RECHECK_MIN_S)
    assert trainersilence.watched(trainers, quiet=T0, now=at(10), peer_silence=SILENCE) == (["n1"], None)
    assert trainersilence.watched(trainers, quiet=None, now=at(60), peer_silence=SILENCE) == ([], None)
    assert trainersilence.trainer_pods([observed.pod_facts(p) for p in gang()], attempt=1) == [], \
        "a pod of another attempt is being drained, not judged"


# ------------------------------------------------------------------ the decision table

DEAD = ps.node("n1", heartbeat=-1.0)


@pytest.mark.parametrize(("case", "renewed1", "renewed0", "now", "want", "requeue"), [
    # the kubelet's last word at -1: its renewal (10 s) and margin (2.5 s) are overdue from 11.5
    ("dead, renewal not overdue yet", -1.0, 9.0, 11.0, [], 0.5),
    # a witness: another kubelet renewed when this one's renewal was due (9 s after its last word) or later
    ("dead, overdue, the other kubelet renewed since", -1.0, 9.0, 12.0, [("tiny-trainer-0", "NodeLost")], None),
    ("dead, overdue long since, the other renewed later", -1.0, 30.0, 31.0, [("tiny-trainer-0", "NodeLost")], None),
    # every kubelet quiet alike: a slow API server, not a lost node; look again a quarter renewal later
    ("overdue, no other kubelet renewed since", -1.0, 8.5, 14.0, [], 2.5),
    # a live kubelet: its next renewal is the next time to look
    ("the kubelet renews", 8.0, 8.0, 12.0, [], 8.5),
])
def test_the_decision_table(case: str, renewed1: float, renewed0: float, now: float, want: list[tuple[str, str]],
                            requeue: float | None) -> None:
    j = judged(gang(), n1=DEAD, lease1=ps.lease(renewed1), lease0=ps.lease(renewed0), now=now)
    assert lost(j) == want, case
    assert j.verdict.requeue_after == (None if requeue is None else pytest.approx(requeue)), case
    for p in j.verdict.lost:
        assert p.failure.ident == f"{p.uid}/NodeLost", "one identity with nodeloss: a pod is failed once"
        assert p.failure.node == "n1" and p.failure.since == timefmt.fmt(at(-1.0)), "the fault: its last word"
    if want:
        assert j.witnesses == {"n1": "n0"}


def test_progress_reported_after_the_renewal_was_due_means_the_node_answered() -> None:
    """A step record made after the kubelet's renewal was overdue reached the API server: the node's processes
    answered then, so its kubelet alone is late (the node controller decides)."""
    j = judged(gang(rep=report(time=12.0)), n1=DEAD, lease1=ps.lease(-1.0), lease0=ps.lease(30.0), now=40.0)
    assert lost(j) == [] and j.verdict.requeue_after is None


def test_a_node_not_ready_is_lost_at_once_without_a_witness() -> None:
    j = judged(gang(), n1=ps.node("n1", ready="Unknown", heartbeat=-1.0), lease1=ps.lease(-1.0), lease0=None,
               now=10.0)
    assert lost(j) == [("tiny-trainer-0", "NodeLost")] and j.witnesses == {"n1": None}


def test_without_a_lease_only_a_not_ready_node_counts() -> None:
    j = judged(gang(), n1=ps.node("n1", heartbeat=-200.0), lease1=None, lease0=ps.lease(30.0), now=40.0)
    assert lost(j) == [] and j.verdict.requeue_after is None


def test_every_pod_of_the_job_on_the_lost_node_goes_with_it() -> None:
    pods = gang()
    pods[2]["spec"]["nodeName"] = "n1"             # the verifier beside the trainer
    j = judged(pods, n1=DEAD, lease1=ps.lease(-1.0), lease0=ps.lease(12.0), now=12.0)
    assert lost(j) == [("tiny-trainer-0", "NodeLost"), ("tiny-verifier-0", "NodeLost")]


# ------------------------------------------------------------------ reconcile passes

def running_job(*, last_progress: float = 0.0) -> dict[str, Any]:
    doc = ps.job_doc()
    doc["status"].update(lastProgressTime=timefmt.fmt(at(last_progress)), progress={"step": 12})
    return doc


def test_a_pass_fails_the_trainers_node_before_the_node_controller_and_fences_its_epoch() -> None:
    fake = ps.SilenceCluster(running_job(), gang(), {"n0": ps.node("n0", heartbeat=8.0), "n1": DEAD},
                             {"n0": ps.lease(8.0), "n1": ps.lease(-1.0)})
    key, cache = ("ns", "tiny"), reconcile.ApplyCache()
    early = reconcile.reconcile(fake, key, image="img", cache=cache, clock=lambda: at(4))
    assert fake.lease_reads == [] and early.requeue_after is not None and early.requeue_after <= 6.0, \
        "progress quiet for less than peerSilenceSeconds: nothing read"
    waiting = reconcile.reconcile(fake, key, image="img", cache=cache, clock=lambda: at(12))
    assert fake.lease_reads == ["n1", "n0"] and not fake.deleted(), "overdue, but no other kubelet renewed since"
    assert waiting.requeue_after is not None and waiting.requeue_after <= 2.5
    fake.leases["n0"] = ps.lease(12.0)
    reconcile.reconcile(fake, key, image="img", cache=cache, clock=lambda: at(13))
    assert fake.deleted() == ["tiny-trainer-0"], "the generator and the verifier on n0 stay"
    st = fake.job["status"]
    assert st["lastFailure"]["reason"] == "NodeLost" and st["lastFailure"]["node"] == "n1", st
    assert st["trainerEpoch"] == 2, "the replacement's writes carry a newer epoch: the old trainer is fenced"
    (msg,) = [m for r, m in fake.events if r == reasons.NODE_LOST]
    assert "holds a trainer" in msg and "n0's kubelet renewed since" in msg and "tiny-trainer-0" in msg, msg
    aff = ps.node_affinity(fake.applied["tiny-trainer"])
    assert aff["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]["matchExpressions"][0][
        "values"] == ["n1"], "the replacement keeps off the node that does not answer"
    restarts = st["restarts"]
    reconcile.reconcile(fake, key, image="img", cache=cache, clock=lambda: at(14))
    assert fake.job["status"]["restarts"] == restarts, "nothing counted twice"


def test_the_trainers_force_delete_waits_for_the_template_with_the_new_epoch() -> None:
    fake = ps.SilenceCluster(running_job(), gang(), {"n0": ps.node("n0", heartbeat=11.0), "n1": DEAD},
                             {"n0": ps.lease(13.0), "n1": ps.lease(-1.0)}, observed=False)
    ps.held_until_observed(fake, first=13, want=["tiny-trainer-0"])


@pytest.mark.parametrize("case", ["no step reported", "finished", "suspended", "stale trainer's report"])
def test_no_lease_is_read_without_the_current_trainers_progress(case: str) -> None:
    doc, pods = running_job(), gang()
    if case == "no step reported":
        pods = gang(rep=report(step=0))
    elif case == "finished":
        doc["status"]["phase"] = "Succeeded"
    elif case == "suspended":
        doc["spec"]["suspend"] = True
    else:
        pods = gang(rep=report(epoch=1), epoch=2)
    fake = ps.SilenceCluster(doc, pods, {"n0": ps.node("n0", heartbeat=11.0), "n1": DEAD},
                             {"n0": ps.lease(60.0), "n1": ps.lease(-1.0)})
    reconcile.reconcile(fake, ("ns", "tiny"), image="img", cache=reconcile.ApplyCache(), clock=lambda: at(60))
    assert fake.lease_reads == [] and fake.deleted() == [], case


def test_a_job_whose_status_still_says_starting_is_judged_too() -> None:
    """The pass that first writes Running read the status before it (Starting); a trainer silent from then on
    makes no event for another pass, so that pass must already watch its progress (and ask to run again)."""
    doc = running_job()
    doc["status"]["phase"] = "Starting"
    fake = ps.SilenceCluster(doc, gang(), {"n0": ps.node("n0", heartbeat=11.0), "n1": DEAD},
                             {"n0": ps.lease(13.0), "n1": ps.lease(-1.0)})
    key, cache = ("ns", "tiny"), reconcile.ApplyCache()
    early = reconcile.reconcile(fake, key, image="img", cache=cache, clock=lambda: at(4))
    assert early.requeue_after is not None and early.requeue_after <= 6.0, "asks to look again when quiet enough"
    reconcile.reconcile(fake, key, image="img", cache=cache, clock=lambda: at(13))
    assert fake.deleted() == ["tiny-trainer-0"]


def test_the_fault_mark_is_the_kubelets_last_word() -> None:
    fake = ps.SilenceCluster(running_job(), gang(), {"n0": ps.node("n0", heartbeat=11.0), "n1": DEAD},
                             {"n0": ps.lease(13.0), "n1": ps.lease(-1.0)})
    reconcile.reconcile(fake, ("ns", "tiny"), image="img", cache=reconcile.ApplyCache(), clock=lambda: at(13))
    rb = fake.job["status"]["recoveryBreakdown"]
    assert timefmt.parse(rb["faultTime"]) == at(-1.0).replace(microsecond=0) or \
        timefmt.parse(rb["faultTime"]) == at(-1.0), rb
    assert rb["detect"] == pytest.approx(14.0, abs=1.0), rb

