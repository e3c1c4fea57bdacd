"""Table tests of the pure decide → status step, with injected time (no cluster, no clock)."""
from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

import opbuilders
from opbuilders import T0, gang, pod
from kubeforge.api import rljob
from kubeforge.operator import lifecycle, observed, reasons, status

ALL_READY = gang()
NOT_READY = gang(ready=False)
UNSCHED = [pod("tiny", r, 0, ready=False, unschedulable="0/4 nodes are available: 4 Insufficient nvidia.com/gpu")
           for r in ("generator", "verifier", "trainer")]


def run(job: rljob.RLJob, pods: list[dict[str, Any]], *, now: dt.datetime = T0,
        failures: tuple[observed.Failure, ...] = ()) -> tuple[lifecycle.Plan, rljob.RLJobStatus]:
    obs = observed.observe(pods, failures)
    plan = lifecycle.decide(job, obs, now=now)
    return plan, status.compute(job, obs, plan, generation=7, now=now)


def cond(s: rljob.RLJobStatus, kind: str) -> rljob.Condition:
    return next(c for c in s.conditions if c.type == kind)


@pytest.mark.parametrize("pods,phase,gang_reason", [
    ([], "Pending", reasons.WAITING_FOR_PODS),
    (UNSCHED, "Pending", reasons.UNSCHEDULABLE),
    (NOT_READY, "Starting", reasons.SCHEDULED),
    (ALL_READY, "Running", reasons.SCHEDULED),
])
def test_phase_table(pods: list[dict[str, Any]], phase: str, gang_reason: str) -> None:
    plan, s = run(opbuilders.job("tiny"), pods)
    assert s.phase == phase
    assert cond(s, reasons.GANG_SCHEDULED).reason == gang_reason
    assert all(c.observed_generation == 7 for c in s.conditions) and s.observed_generation == 7
    assert plan.active and s.start_time == "2026-11-22T12:00:00Z"


def test_unschedulable_message_is_the_schedulers() -> None:
    _, s = run(opbuilders.job("tiny"), UNSCHED)
    c = cond(s, reasons.GANG_SCHEDULED)
    assert c.status == "False" and "Insufficient nvidia.com/gpu" in c.message


def test_per_role_readiness_and_printer_column() -> None:
    pods = [pod("tiny", "generator", 0), pod("tiny", "verifier", 0, ready=False), pod("tiny", "trainer", 0)]
    _, s = run(opbuilders.job("tiny"), pods)
    assert s.roles["verifier"].ready == 0 and s.roles["generator"].ready == 1 and s.ready == "2/3"
    assert "verifier 0/1" in cond(s, reasons.READY).message


def test_transition_time_moves_only_on_flip() -> None:
    job = opbuilders.job("tiny")
    _, s1 = run(job, NOT_READY)
    later = T0 + dt.timedelta(seconds=30)
    job2 = opbuilders.job("tiny", status=s1.model_dump(mode="json", by_alias=True))
    _, s2 = run(job2, NOT_READY, now=later)
    assert cond(s2, reasons.READY).last_transition_time == cond(s1, reasons.READY).last_transition_time
    _, s3 = run(job2, ALL_READY, now=later)
    assert cond(s3, reasons.READY).last_transition_time == "2026-11-22T12:00:30Z"
    assert cond(s3, reasons.GANG_SCHEDULED).last_transition_time == cond(s1, reasons.GANG_SCHEDULED).last_transition_time


def _with(status: rljob.RLJobStatus, **spec: Any) -> rljob.RLJob:
    return opbuilders.job("tiny", status=status.model_dump(mode="json", by_alias=True), **spec)


def test_failure_restarts_whole_job_without_overlap() -> None:
    _, s0 = run(opbuilders.job("tiny"), ALL_READY)
    failed = [pod("tiny", "generator", 0), pod("tiny", "verifier", 0, restarts=1, last_exit=3),
              pod("tiny", "trainer", 0)]
    plan, s1 = run(_with(s0), failed)
    assert (plan.attempt, plan.restarts, plan.active, plan.draining) == (1, 1, False, True)
    assert s1.phase == "Restarting" and s1.restarts == 1 and s1.attempt == 1
    assert s1.last_failure is not None and (s1.last_failure.role, s1.last_failure.exit_code) == ("verifier", 3)
    events = status.transitions(s0, s1, plan)
    assert [e.reason for e in events] == [reasons.CONTAINER_FAILED, reasons.RESTARTING, "Restarting"]
    # old-attempt pods still there: still draining, no second bump for the same failure
    plan2, s2 = run(_with(s1), failed)
    assert (plan2.attempt, plan2.restarts, plan2.active) == (1, 1, False)
    # old pods gone: the new attempt starts
    plan3, s3 = run(_with(s2), [])
    assert plan3.active and s3.phase == "Pending" and s3.attempt == 1


def test_failure_seen_only_in_a_watch_event_counts() -> None:
    f = observed.Failure(role="trainer", pod="tiny-trainer-0", attempt=0, exit_code=2, reason="Error", time=None)
    plan, s = run(opbuilders.job("tiny"), ALL_READY, failures=(f,))
    assert plan.attempt == 1 and s.last_failure is not None and s.last_failure.time == "2026-11-22T12:00:00Z"
    stale = observed.Failure(role="trainer", pod="tiny-trainer-0", attempt=5, exit_code=2, reason="Error", time=None)
    plan, _ = run(opbuilders.job("tiny"), ALL_READY, failures=(stale,))
    assert plan.attempt == 0


def test_backoff_limit_fails_the_job() -> None:
    _, s0 = run(opbuilders.job("tiny"), ALL_READY)
    prev = s0.model_copy(update={"restarts": 1, "attempt": 1})
    job = _with(prev, spec__failurePolicy={"maxRestarts": 1})
    plan, s = run(job, [pod("tiny", "trainer", 0, attempt=1, phase="Failed", exit_now=1, ready=False)])
    assert s.phase == "Failed" and cond(s, reasons.FAILED).reason == reasons.BACKOFF_LIMIT_EXCEEDED
    assert not plan.active and not plan.gang_active and s.completion_time == "2026-11-22T12:00:00Z"


def test_last_step_alone_is_not_completion() -> None:
    """The last step is reported before the final checkpoint is written: only ``done`` (after it) completes."""
    pods = [pod("tiny", "generator", 0), pod("tiny", "verifier", 0),
            pod("tiny", "trainer", 0, progress={"step": 30, "meanReward": 0.9, "policyVersion": 30})]
    plan, s = run(opbuilders.job("tiny"), pods)
    assert s.phase == "Running" and plan.active and plan.terminal is None


def test_completion_by_done() -> None:
    for progress in ({"step": 30, "meanReward": 0.9, "policyVersion": 30, "done": True}, {"step": 3, "done": True}):
        pods = [pod("tiny", "generator", 0), pod("tiny", "verifier", 0), pod("tiny", "trainer", 0, progress=progress)]
        plan, s = run(opbuilders.job("tiny"), pods)
        assert s.phase == "Succeeded" and cond(s, reasons.COMPLETE).reason == reasons.TRAINING_COMPLETE
        assert not plan.active and s.progress.step == progress["step"]


def test_progress_is_reported_and_kept_when_the_pod_is_gone() -> None:
    pods = [pod("tiny", "generator", 0), pod("tiny", "verifier", 0),
            pod("tiny", "trainer", 0, progress={"step": 12, "meanReward": 0.41, "policyVersion": 12})]
    _, s = run(opbuilders.job("tiny"), pods)
    assert (s.progress.step, s.progress.mean_reward, s.progress.policy_version) == (12, 0.41, 12)
    _, s2 = run(_with(s), [])
    assert s2.progress.step == 12


def test_deadline_exceeded_and_requeue() -> None:
    job = opbuilders.job("tiny", spec__activeDeadlineSeconds=60)
    plan, s = run(job, ALL_READY)
    assert plan.requeue_after == 60
    plan, s2 = run(_with(s, spec__activeDeadlineSeconds=60), ALL_READY, now=T0 + dt.timedelta(seconds=61))
    assert s2.phase == "Failed" and cond(s2, reasons.FAILED).reason == reasons.DEADLINE_EXCEEDED


def test_suspend_releases_and_resume_resets_start() -> None:
    _, s0 = run(opbuilders.job("tiny"), ALL_READY)
    plan, s1 = run(_with(s0, spec__suspend=True), ALL_READY)
    assert (plan.active, plan.gang_active) == (False, False) and s1.phase == "Suspended"
    assert cond(s1, reasons.SUSPENDED).status == "True" and s1.start_time is None
    assert all(r.replicas == 0 for r in s1.roles.values())
    plan, s2 = run(_with(s1), [], now=T0 + dt.timedelta(seconds=10))
    assert plan.active and s2.phase == "Pending" and s2.start_time == "2026-11-22T12:00:10Z"


def test_ttl_deletes_finished_job_after_delay() -> None:
    done = [pod("tiny", "trainer", 0, progress={"step": 30, "done": True})]
    _, s = run(opbuilders.job("tiny", spec__ttlSecondsAfterFinished=5), done)
    plan, _ = run(_with(s, spec__ttlSecondsAfterFinished=5), [], now=T0 + dt.timedelta(seconds=2))
    assert not plan.delete_job and plan.requeue_after == 3
    plan, _ = run(_with(s, spec__ttlSecondsAfterFinished=5), [], now=T0 + dt.timedelta(seconds=5))
    assert plan.delete_job


def test_terminal_is_sticky() -> None:
    done = [pod("tiny", "trainer", 0, progress={"step": 30, "done": True})]
    _, s = run(opbuilders.job("tiny"), done)
    plan, s2 = run(_with(s), [pod("tiny", "trainer", 0, phase="Failed", exit_now=1)])
    assert s2.phase == "Succeeded" and plan.restarts == 0 and s2.completion_time == s.completion_time


def test_replica_change_rolls_out_as_a_new_attempt_not_a_restart() -> None:
    _, s0 = run(opbuilders.job("tiny"), ALL_READY)
    plan, s1 = run(_with(s0, spec__roles__verifier={"replicas": 2}), ALL_READY)
    assert plan.attempt == 1 and plan.restarts == 0 and plan.new_attempt_reason == reasons.RESCALED
    assert s1.phase == "Restarting"


def test_generator_replica_change_keeps_the_attempt_and_the_trainer() -> None:
    """Generators are elastic: scaling them is followed by their StatefulSet alone (no new attempt)."""
    _, s0 = run(opbuilders.job("tiny"), ALL_READY)
    plan, s1 = run(_with(s0, spec__roles__generator={"replicas": 2, "minReplicas": 1}), ALL_READY)
    assert plan.attempt == 0 and plan.active and plan.new_attempt_reason is None
    assert s1.roles["generator"].replicas == 2 and s1.roles["generator"].ready == 1 and s1.phase == "Running"
    assert cond(s1, reasons.READY).status == "False" and "generator 1/2" in cond(s1, reasons.READY).message


def test_status_is_stable_when_nothing_changes() -> None:
    _, s1 = run(opbuilders.job("tiny"), ALL_READY)
    plan, s2 = run(_with(s1), ALL_READY, now=T0 + dt.timedelta(minutes=5))
    assert s2 == s1 and status.transitions(s1, s2, plan) == []


def test_a_draining_job_restarting_its_stall_clock_is_detail_only() -> None:
    a = rljob.RLJobStatus(phase="Restarting", attempt=1, last_progress_time="2026-11-22T12:00:00Z")
    b = a.model_copy(update={"last_progress_time": "2026-11-22T12:00:04Z"})
    assert status.substance(a) == status.substance(b)
    running = [s.model_copy(update={"phase": "Running"}) for s in (a, b)]
    assert status.substance(running[0]) != status.substance(running[1])
    assert status.substance(a) != status.substance(a.model_copy(update={"attempt": 2}))


def test_a_gang_reason_flipping_while_it_stays_false_is_detail_only() -> None:
    """Recovery at scale: while the scheduler holds a gang being created, GangScheduled flips WaitingForPods <->
    Unschedulable with each pod; those flips are paced, the flip to Scheduled and other reasons are not."""
    job = opbuilders.job("tiny")
    _, waiting = run(job, [])
    _, unsched = run(job, UNSCHED)
    _, placed = run(job, NOT_READY)
    assert cond(waiting, reasons.GANG_SCHEDULED).reason == reasons.WAITING_FOR_PODS
    assert cond(unsched, reasons.GANG_SCHEDULED).reason == reasons.UNSCHEDULABLE
    assert waiting.phase == unsched.phase == "Pending"
    assert status.substance(waiting) == status.substance(unsched)
    assert status.substance(unsched) != status.substance(placed)        # True: Scheduled, and Starting
    # a False condition outside the placement reasons keeps its reason in the substance
    ready = cond(waiting, reasons.READY)
    stuck = waiting.model_copy(update={"conditions": [
        c.model_copy(update={"reason": "ImagePullBackOff"}) if c is ready else c for c in waiting.conditions]})
    assert status.substance(stuck) != status.substance(waiting)
