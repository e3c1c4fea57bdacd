"""Failure-policy rules on a cluster (pure decide → status): RestartRole keeps the trainer's pods, Fail names its
reason, a failure is acted on once however often a pass is replayed (e.g. by an operator restarted mid-restart)."""
from __future__ import annotations

from typing import Any

import opbuilders
from opbuilders import pod
from test_lifecycle_status import cond, run
from kubeforge.api import rljob
from kubeforge.operator import reasons, status

ELASTIC = {"maxRestarts": 2, "rules": [{"action": "Fail", "onExitCodes": [3]},
                                       {"action": "Ignore", "roles": ["verifier"], "onReasons": ["Evicted"]},
                                       {"action": "RestartRole", "roles": ["generator", "verifier"]}]}


def _job(prev: rljob.RLJobStatus | None = None, policy: dict[str, Any] = ELASTIC) -> rljob.RLJob:
    st = None if prev is None else prev.model_dump(mode="json", by_alias=True)
    return opbuilders.job("tiny", status=st, spec__failurePolicy=policy)


def _gen_crashed(n: int, *, finished: str = "2026-11-22T12:00:03Z") -> dict[str, Any]:
    p = pod("tiny", "generator", 0, restarts=n, last_exit=137)
    p["status"]["containerStatuses"][0]["lastState"]["terminated"]["finishedAt"] = finished
    p["metadata"]["uid"] = "gen0-uid"
    return p


def test_restart_role_counts_once_and_keeps_the_attempt() -> None:
    _, s0 = run(_job(), opbuilders.gang())
    pods = [_gen_crashed(1), pod("tiny", "verifier", 0), pod("tiny", "trainer", 0)]
    plan, s1 = run(_job(s0), pods)
    assert (plan.attempt, plan.restarts, plan.active, plan.draining) == (0, 1, True, False)
    assert s1.roles["generator"].restarts == 1 and s1.roles["trainer"].restarts == 0 and s1.restarts == 1
    assert s1.last_failure is not None and (s1.last_failure.action, s1.last_failure.exit_code) == ("RestartRole", 137)
    assert [e.reason for e in status.transitions(s0, s1, plan)][:2] == [reasons.CONTAINER_FAILED,
                                                                         reasons.ROLE_RESTARTED]
    # the pod keeps showing the same termination (and an operator restarted mid-restart replays the pass):
    for _ in range(3):
        plan, s2 = run(_job(s1), pods)
        assert (plan.restarts, plan.attempt, plan.decision) == (1, 0, None) and s2.roles["generator"].restarts == 1
    # a second crash of the same pod is a new failure: counted, and the third one is over the limit
    pods2 = [_gen_crashed(2, finished="2026-11-22T12:01:00Z"), pod("tiny", "verifier", 0), pod("tiny", "trainer", 0)]
    plan, s3 = run(_job(s2), pods2)
    assert plan.restarts == 2 and s3.roles["generator"].restarts == 2 and plan.terminal is None
    pods3 = [_gen_crashed(3, finished="2026-11-22T12:02:00Z"), pod("tiny", "verifier", 0), pod("tiny", "trainer", 0)]
    plan, s4 = run(_job(s3), pods3)
    assert s4.phase == "Failed" and cond(s4, reasons.FAILED).reason == reasons.BACKOFF_LIMIT_EXCEEDED
    assert "after 2 restarts (maxRestarts=2)" in cond(s4, reasons.FAILED).message


def test_the_same_end_seen_now_and_after_the_kubelet_restarted_it_is_one_failure() -> None:
    _, s0 = run(_job(), opbuilders.gang())
    now = pod("tiny", "generator", 0, exit_now=137, ready=False)
    now["metadata"]["uid"] = "u"
    term = now["status"]["containerStatuses"][0]["state"]["terminated"]
    plan, s1 = run(_job(s0), [now, pod("tiny", "verifier", 0), pod("tiny", "trainer", 0)])
    assert plan.restarts == 1
    after = pod("tiny", "generator", 0, restarts=1)
    after["metadata"]["uid"] = "u"
    after["status"]["containerStatuses"][0]["lastState"] = {"terminated": term}
    plan, _ = run(_job(s1), [after, pod("tiny", "verifier", 0), pod("tiny", "trainer", 0)])
    assert plan.restarts == 1 and plan.decision is None


def test_a_generator_scaled_away_is_no_failure() -> None:
    """Scaled 2 -> 1: generator-1's pod is deleted and, still busy at the end of its grace period, SIGKILLed (137).
    Seen in real pods: the default rule made that a RestartAll of the whole job. It is no failure; generator-0
    crashing the same way still is."""
    _, s0 = run(_job(), opbuilders.gang())
    gone = pod("tiny", "generator", 1, exit_now=137, ready=False)
    gone["metadata"]["deletionTimestamp"] = "2026-11-22T12:00:05Z"
    plan, s1 = run(_job(s0, policy={"maxRestarts": 2}), [pod("tiny", "generator", 0), gone,
                                                         pod("tiny", "verifier", 0), pod("tiny", "trainer", 0)])
    assert (plan.decision, plan.restarts, plan.attempt, s1.last_failure) == (None, 0, 0, None)
    crashed = pod("tiny", "generator", 0, exit_now=137, ready=False)
    plan, s2 = run(_job(s1, policy={"maxRestarts": 2}), [crashed, pod("tiny", "verifier", 0),
                                                         pod("tiny", "trainer", 0)])
    assert plan.restarts == 1 and s2.last_failure is not None and s2.last_failure.action == "RestartAll"


def test_fail_rule_on_exit_code_fails_with_its_reason() -> None:
    _, s0 = run(_job(), opbuilders.gang())
    pods = [pod("tiny", "generator", 0), pod("tiny", "verifier", 0),
            pod("tiny", "trainer", 0, restarts=1, last_exit=3)]
    plan, s = run(_job(s0), pods)
    assert s.phase == "Failed" and cond(s, reasons.FAILED).reason == reasons.FAILED_BY_RULE
    assert "exit code 3" in cond(s, reasons.FAILED).message and plan.restarts == 0 and not plan.active


def test_ignore_rule_counts_nothing() -> None:
    _, s0 = run(_job(), opbuilders.gang())
    evicted = pod("tiny", "verifier", 0, phase="Failed", ready=False)
    evicted["status"]["reason"] = "Evicted"
    plan, s = run(_job(s0), [pod("tiny", "generator", 0), evicted, pod("tiny", "trainer", 0)])
    assert plan.restarts == 0 and plan.attempt == 0 and s.last_failure is not None
    assert (s.last_failure.reason, s.last_failure.action) == ("Evicted", "Ignore")
    assert reasons.FAILURE_IGNORED in [e.reason for e in status.transitions(s0, s, plan)]


def test_node_lost_pod_matches_node_lost() -> None:
    lost = pod("tiny", "generator", 0, deleting=True)
    lost["status"]["conditions"].append({"type": "DisruptionTarget", "status": "True",
                                         "reason": "DeletionByTaintManager"})
    policy = {"maxRestarts": 1, "rules": [{"action": "Fail", "onReasons": ["NodeLost"]}]}
    _, s0 = run(_job(policy=policy), opbuilders.gang())
    plan, s = run(_job(s0, policy), [lost, pod("tiny", "verifier", 0), pod("tiny", "trainer", 0)])
    assert s.phase == "Failed" and s.last_failure is not None and s.last_failure.reason == "NodeLost"


def test_trainer_failure_under_restart_role_rules_restarts_all() -> None:
    _, s0 = run(_job(), opbuilders.gang())
    pods = [pod("tiny", "generator", 0), pod("tiny", "verifier", 0), pod("tiny", "trainer", 0, restarts=1,
                                                                          last_exit=137)]
    plan, s = run(_job(s0), pods)
    assert (plan.attempt, plan.restarts, plan.draining) == (1, 1, True) and s.roles["trainer"].restarts == 1
    assert s.handled_failures == {}      # a new attempt starts with a clean slate


def test_stalled_condition_after_progress_deadline() -> None:
    import datetime as dt

    from opbuilders import T0

    policy = {"progressDeadlineSeconds": 60}
    trainer = pod("tiny", "trainer", 0, progress={"step": 4, "policyVersion": 4})
    pods = [pod("tiny", "generator", 0), pod("tiny", "verifier", 0), trainer]
    _, s0 = run(_job(policy=policy), pods)
    assert cond(s0, reasons.STALLED).status == "False" and s0.last_progress_time == "2026-11-22T12:00:00Z"
    plan, s1 = run(_job(s0, policy), pods, now=T0 + dt.timedelta(seconds=50))
    assert cond(s1, reasons.STALLED).status == "False" and plan.requeue_after is not None
    assert plan.requeue_after <= 11
    _, s2 = run(_job(s1, policy), pods, now=T0 + dt.timedelta(seconds=61))
    assert cond(s2, reasons.STALLED).status == "True" and cond(s2, reasons.STALLED).reason == reasons.NO_PROGRESS
    moved = [pod("tiny", "generator", 0), pod("tiny", "verifier", 0),
             pod("tiny", "trainer", 0, progress={"step": 5, "policyVersion": 5})]
    _, s3 = run(_job(s2, policy), moved, now=T0 + dt.timedelta(seconds=62))
    assert cond(s3, reasons.STALLED).status == "False" and s3.last_progress_time == "2026-11-22T12:01:02Z"


def test_no_step_yet_is_a_start_not_a_stall() -> None:
    """Before the first step the roles are starting (vLLM engines load, minutes on loaded CPUs): the job is Stalled
    only after the start allowance, 3 x progressDeadlineSeconds."""
    import datetime as dt

    from opbuilders import T0

    policy = {"progressDeadlineSeconds": 60}
    pods = [pod("tiny", "generator", 0), pod("tiny", "verifier", 0), pod("tiny", "trainer", 0)]
    _, s0 = run(_job(policy=policy), pods)
    _, s1 = run(_job(s0, policy), pods, now=T0 + dt.timedelta(seconds=170))
    assert cond(s1, reasons.STALLED).status == "False"
    _, s2 = run(_job(s1, policy), pods, now=T0 + dt.timedelta(seconds=181))
    assert cond(s2, reasons.STALLED).status == "True" and "limit 180s" in cond(s2, reasons.STALLED).message


def test_a_preempted_trainer_restarts_the_job_without_using_up_max_restarts() -> None:
    """maxRestarts 0: a crash would fail the job; a preemption of its trainer starts a new attempt, restarts stay
    0, and the event says Preempted."""
    policy: dict[str, Any] = {"maxRestarts": 0}
    _, s0 = run(_job(policy=policy), opbuilders.gang())
    trainer = pod("tiny", "trainer", 0, deleting=True, exit_now=143)
    trainer["status"]["conditions"].append({"type": "DisruptionTarget", "status": "True",
                                            "reason": "PreemptionByScheduler"})
    plan, s = run(_job(s0, policy), [pod("tiny", "generator", 0), pod("tiny", "verifier", 0), trainer])
    assert s.phase != "Failed" and (plan.attempt, plan.restarts) == (1, 0)
    assert s.last_failure is not None and (s.last_failure.reason, s.last_failure.action) == ("Preempted", "RestartAll")
    assert reasons.PREEMPTED in [e.reason for e in status.transitions(s0, s, plan)]
    crashed = pod("tiny", "trainer", 0, restarts=1, last_exit=137)
    _, s = run(_job(s0, policy), [pod("tiny", "generator", 0), pod("tiny", "verifier", 0), crashed])
    assert s.phase == "Failed"                     # the same policy fails a crash: the test can tell them apart
