"""Observed facts from raw pods: failures of both kinds, progress, scheduling."""
from __future__ import annotations

from typing import Any

import opbuilders
from kubeforge.api import progress
from kubeforge.operator import observed


def test_restarted_container_is_a_failure() -> None:
    f = observed.pod_failure(opbuilders.pod("tiny", "verifier", 0, restarts=1, last_exit=3))
    assert f is not None and (f.role, f.pod, f.exit_code, f.reason, f.attempt) == \
        ("verifier", "tiny-verifier-0", 3, "Error", 0)


def test_failed_pod_is_a_failure() -> None:
    f = observed.pod_failure(opbuilders.pod("tiny", "trainer", 0, phase="Failed", exit_now=137, ready=False))
    assert f is not None and f.exit_code == 137


def test_clean_exit_and_running_are_not_failures() -> None:
    assert observed.pod_failure(opbuilders.pod("tiny", "trainer", 0, restarts=1, last_exit=0)) is None
    assert observed.pod_failure(opbuilders.pod("tiny", "trainer", 0)) is None


def test_malformed_progress_is_ignored() -> None:
    assert progress.ProgressReport.decode("{not json") is None
    assert progress.ProgressReport.decode('["a"]') is None
    assert progress.ProgressReport.decode('{"step": "x"}') is None
    p = progress.ProgressReport.decode('{"step": 3, "meanReward": 0.5, "policyVersion": 3, "done": false}')
    assert p == progress.ProgressReport(step=3, mean_reward=0.5, policy_version=3, done=False)


def test_unschedulable_message_and_stale_pods() -> None:
    obs = observed.observe([opbuilders.pod("tiny", "generator", 0, unschedulable="0/4 nodes are available"),
                            opbuilders.pod("tiny", "trainer", 0, attempt=1)])
    gen = obs.pods[0]
    assert gen.unschedulable == "0/4 nodes are available" and not gen.scheduled
    assert [p.name for p in obs.stale(1)] == ["tiny-generator-0"]


def test_a_preempted_pod_reads_as_preempted_before_and_after_its_container_ends() -> None:
    """The scheduler's preemption (DisruptionTarget PreemptionByScheduler, then the delete) and the kubelet's
    (phase Failed, reason Preempting): reason Preempted, one failure per pod however the SIGTERM ended it."""
    def preempted(exit_now: int | None) -> dict[str, Any]:
        p = opbuilders.pod("tiny", "trainer", 0, deleting=True, exit_now=exit_now)
        p["metadata"]["uid"] = "u1"
        p["status"]["conditions"].append({"type": "DisruptionTarget", "status": "True",
                                          "reason": "PreemptionByScheduler"})
        return p
    running, ended = observed.pod_failure(preempted(None)), observed.pod_failure(preempted(143))
    assert running is not None and ended is not None
    assert (running.reason, running.exit_code) == ("Preempted", None) and running.ident == ended.ident
    kubelet = opbuilders.pod("tiny", "generator", 0, phase="Failed", exit_now=137, ready=False)
    kubelet["status"]["reason"] = "Preempting"
    f = observed.pod_failure(kubelet)
    assert f is not None and f.reason == "Preempted"
    # a DisruptionTarget that is no preemption keeps its own reason
    lost = opbuilders.pod("tiny", "trainer", 0, deleting=True)
    lost["status"]["conditions"].append({"type": "DisruptionTarget", "status": "True",
                                         "reason": "DeletionByTaintManager"})
    f = observed.pod_failure(lost)
    assert f is not None and f.reason == "NodeLost"
