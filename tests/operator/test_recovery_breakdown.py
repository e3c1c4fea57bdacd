"""status.recoveryBreakdown (docs/recovery.md): the arithmetic over timestamps, the replacement that decides it, and
a breakdown followed pass by pass from a lost node to the next trained step."""
from __future__ import annotations

import datetime as dt

from kubeforge.api import progress, rljob
from kubeforge.operator import nodeloss, observed, recovery, timefmt

T0 = dt.datetime(2026, 11, 29, 12, 0, 0, tzinfo=dt.timezone.utc)


def at(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


def ts(seconds: float) -> str:
    return timefmt.fmt(at(seconds))


def test_the_parts_follow_the_marks_and_add_up_to_the_whole() -> None:
    parts = recovery.breakdown(recovery.Marks(fault=at(0), detected=at(12), scheduled=at(13), running=at(15),
                                              ready=at(40), weights=at(41.5), first_step=at(43)))
    assert parts == {"detect": 12.0, "reschedule": 1.0, "pod_start": 2.0, "engine_start": 25.0, "weights": 1.5,
                     "first_step": 1.5, "seconds": 43.0}


def test_a_mark_before_the_one_before_counts_from_it_and_unknown_marks_leave_their_part_null() -> None:
    # restarted in place: the pod kept its scheduling (before the fault); no push recorded (a fresh start)
    parts = recovery.breakdown(recovery.Marks(fault=at(0), detected=at(3), scheduled=at(-500), running=at(4),
                                              ready=at(2), first_step=at(9)))
    assert parts == {"detect": 3.0, "reschedule": 0.0, "pod_start": 1.0, "engine_start": 0.0, "weights": None,
                     "first_step": 5.0, "seconds": 9.0}
    still = recovery.breakdown(recovery.Marks(fault=at(0), detected=at(3)))
    assert still["detect"] == 3.0 and still["seconds"] is None and still["reschedule"] is None


def pod(name: str, *, attempt: int = 1, created: float | None = None, scheduled: float | None = None,
        running: float | None = None, ready: float | None = None, role: str = "generator",
        report: progress.ProgressReport | None = None) -> observed.PodFacts:
    return observed.PodFacts(
        name=name, role=role, index=0, attempt=attempt, world=None, phase="Running", scheduled=scheduled is not None,
        ready=ready is not None, terminating=False, restarts=0, unschedulable=None, failure=None, progress=report,
        marks=observed.PodMarks(created=ts(created) if created is not None else None,
                                scheduled=ts(scheduled) if scheduled is not None else None,
                                running=ts(running) if running is not None else None,
                                ready=ts(ready) if ready is not None else None))


def test_the_replacement_ready_last_decides_and_one_still_starting_comes_first() -> None:
    old = pod("job-trainer-0", created=-900, scheduled=-899, running=-890, ready=-800, role="trainer")
    gen = pod("job-generator-0", created=13, scheduled=14, running=16, ready=60)
    ver = pod("job-verifier-0", created=13, scheduled=13, running=15, ready=20)
    assert recovery.critical([old, gen, ver], attempt=1, detected=at(12)) == gen
    starting = pod("job-verifier-1", created=13, scheduled=14)
    assert recovery.critical([old, gen, ver, starting], attempt=1, detected=at(12)) == starting
    in_place = pod("job-generator-1", created=-900, scheduled=-899, running=30)   # its container restarted
    assert recovery.critical([old, in_place], attempt=1, detected=at(12)) == in_place
    assert recovery.critical([old], attempt=1, detected=at(12)) is None
    assert recovery.critical([gen], attempt=2, detected=at(12)) is None            # another attempt's pods


def test_a_node_loss_is_followed_pass_by_pass_until_the_next_step_then_kept() -> None:
    node = nodeloss.node_facts({"status": {"conditions": [{"type": "Ready", "status": "Unknown",
                                                           "lastTransitionTime": ts(40),
                                                           "lastHeartbeatTime": ts(0)}]}}, "kf-real-1")
    lost_pod = pod("job-generator-0", attempt=0, created=-900, scheduled=-899, running=-890, ready=-800)
    verdict = nodeloss.judge([observed.PodFacts(**{**lost_pod.__dict__, "node": "kf-real-1", "ready": False})],
                             {"kf-real-1": node}, now=at(52), grace=10)
    (lost,) = verdict.lost
    assert lost.failure.since == ts(0)                   # the kubelet's last heartbeat: when the node was lost
    # the pass that acts on it (attempt 0 -> 1: RestartAll); the trainer had reported step 6
    b = recovery.track(None, failure=lost.failure, pods=[lost_pod], attempt=1, report=None, step=6, now=at(52))
    assert b is not None and (b.fault_time, b.detected_time, b.step, b.detect, b.seconds) == (ts(0), ts(52), 6,
                                                                                               52.0, None)
    # the replacement is scheduled and starts; its engine loads
    gen = pod("job-generator-0", created=53, scheduled=54, running=57)
    b = recovery.track(b, failure=None, pods=[gen], attempt=1, report=None, step=6, now=at(60))
    assert b is not None and (b.pod, b.reschedule, b.pod_start, b.engine_start, b.seconds) == (
        "job-generator-0", 2.0, 3.0, None, None)
    # ready; the old trainer's last report (made before the detection) does not end it
    gen = pod("job-generator-0", created=53, scheduled=54, running=57, ready=80)
    before = progress.ProgressReport(step=6, time=at(30).timestamp())
    b = recovery.track(b, failure=None, pods=[gen], attempt=1, report=before, step=6, now=at(81))
    assert b is not None and (b.engine_start, b.weights, b.first_step, b.seconds) == (23.0, None, None, None)
    # trainer 0 resumed from step 5, pushed the policy and trained step 6 again: the next trained step
    report = progress.ProgressReport(step=6, time=at(84).timestamp(), weights_at=at(82.5).timestamp())
    b = recovery.track(b, failure=None, pods=[gen], attempt=1, report=report, step=6, now=at(85))
    assert b is not None and (b.weights, b.first_step, b.seconds) == (2.5, 1.5, 84.0)
    assert b.detect + b.reschedule + b.pod_start + b.engine_start + b.weights + b.first_step == b.seconds
    # closed: later passes (a replayed one too) change nothing; a new failure starts a new breakdown
    later = progress.ProgressReport(step=9, time=at(95).timestamp())
    assert recovery.track(b, failure=None, pods=[gen], attempt=1, report=later, step=9, now=at(96)) == b
    crash = observed.Failure(role="verifier", pod="job-verifier-0", attempt=1, exit_code=137, reason="Error",
                             time=ts(100))
    fresh = recovery.track(b, failure=crash, pods=[gen], attempt=1, report=later, step=9, now=at(101))
    assert fresh is not None and (fresh.fault_time, fresh.detect, fresh.step, fresh.seconds) == (ts(100), 1.0, 9,
                                                                                                 None)


def test_a_trainer_that_kept_running_ends_the_recovery_only_with_a_step_after_the_replacement_holds_the_policy() -> None:
    """RestartRole: the generator's node is lost, the trainer keeps running (attempt 0) and trains a step from
    rollouts sampled before the fault; the recovery ends at the first step after the replacement's push."""
    lost = observed.Failure(role="generator", pod="job-generator-0", attempt=0, exit_code=None, reason="NodeLost",
                            time=ts(12), since=ts(0))
    trainer = pod("job-trainer-0", attempt=0, created=-900, scheduled=-899, running=-890, ready=-800, role="trainer")
    b = recovery.track(None, failure=lost, pods=[trainer], attempt=0, report=None, step=6, now=at(12))
    # a step trained after the detection, before any replacement exists (the pass of the 2026-11-30 run)
    early = progress.ProgressReport(step=7, time=at(12.3).timestamp(), weights_at=at(5).timestamp())
    b = recovery.track(b, failure=None, pods=[trainer], attempt=0, report=early, step=7, now=at(12.5))
    assert b is not None and b.seconds is None, "a step before any replacement is not the recovery's"
    gen = pod("job-generator-0", attempt=0, created=13, scheduled=14, running=16)
    buffered = progress.ProgressReport(step=7, time=at(13).timestamp(), weights_at=at(5).timestamp())
    b = recovery.track(b, failure=None, pods=[trainer, gen], attempt=0, report=buffered, step=7, now=at(14))
    assert b is not None and (b.pod, b.weights, b.first_step, b.seconds) == ("job-generator-0", None, None, None)
    gen = pod("job-generator-0", attempt=0, created=13, scheduled=14, running=16, ready=36)
    rejoined = progress.ProgressReport(step=7, time=at(13).timestamp(), weights_at=at(38).timestamp())
    b = recovery.track(b, failure=None, pods=[trainer, gen], attempt=0, report=rejoined, step=7, now=at(41))
    assert b is not None and b.seconds is None, "the step before the push is not the recovery's"
    after = progress.ProgressReport(step=8, time=at(39).timestamp(), weights_at=at(38).timestamp())
    b = recovery.track(b, failure=None, pods=[trainer, gen], attempt=0, report=after, step=8, now=at(42))
    assert b is not None and (b.detect, b.reschedule, b.pod_start, b.engine_start, b.weights, b.first_step,
                              b.seconds) == (12.0, 2.0, 2.0, 20.0, 2.0, 1.0, 39.0)


def test_the_status_model_carries_the_breakdown_in_camel_case() -> None:
    doc = rljob.RLJobStatus(recovery_breakdown=rljob.RecoveryBreakdown(detect=1.0, pod_start=2.0)).model_dump(
        mode="json", by_alias=True)
    assert doc["recoveryBreakdown"]["podStart"] == 2.0 and doc["recoveryBreakdown"]["engineStart"] is None
