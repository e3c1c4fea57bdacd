"""Unit tests of ``run_real``'s watching (no cluster): every trainer pod is followed, and a container that exits
non-zero has its last log lines printed once (a fake kubectl stands in for the API)."""

from __future__ import annotations

import pathlib
import subprocess
from typing import Any

import pytest

import run_real


class FakeKubectl:
    """Records ``kubectl`` calls; ``logs`` answers with a numbered log."""

    binary = "kubectl"
    kubeconfig = "/dev/null"

    def __init__(self) -> None:
        self.calls: list[tuple[str, ...]] = []

    def run(self, *args: str, check: bool = True, timeout_s: float = 60.0, stdin: str | None = None
            ) -> subprocess.CompletedProcess[str]:
        self.calls.append(args)
        return subprocess.CompletedProcess(list(args), 0, stdout="\n".join(f"line {i}" for i in range(5)), stderr="")


def _pod(name: str, role: str, *, uid: str, running: bool = True, last_exit: int | None = None,
         exit_now: int | None = None) -> dict[str, Any]:
    cs: dict[str, Any] = {"name": role, "state": {"running": {}} if running else {}}
    if exit_now is not None:
        cs["state"] = {"terminated": {"exitCode": exit_now, "reason": "Error", "containerID": f"c-{uid}-now"}}
    if last_exit is not None:
        cs["lastState"] = {"terminated": {"exitCode": last_exit, "reason": "Error", "containerID": f"c-{uid}-last"}}
    return {"metadata": {"name": name, "uid": uid, "labels": {run_real.LABEL_ROLE: role, run_real.LABEL_ATTEMPT: "0"}},
            "status": {"containerStatuses": [cs]}}


def _run(tmp_path: pathlib.Path) -> tuple[run_real.Run, FakeKubectl]:
    k = FakeKubectl()
    return run_real.Run(k=k, namespace="ns", name="job", workdir=tmp_path, kill_after_step=None,
                        timeout_s=1), k


def test_every_trainer_and_verifier_pod_and_generator_0_are_followed(tmp_path: pathlib.Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[tuple[str, pathlib.Path]] = []

    class Follower:
        def __init__(self, *, k: Any, namespace: str, pod: str, container: str, path: pathlib.Path) -> None:
            started.append((pod, path))

    monkeypatch.setattr(run_real, "LogFollower", Follower)
    run, _ = _run(tmp_path)
    pods = [_pod("job-trainer-0", "trainer", uid="u0"), _pod("job-trainer-1", "trainer", uid="u1"),
            _pod("job-generator-0", "generator", uid="g0"), _pod("job-verifier-0", "verifier", uid="v0"),
            _pod("job-trainer-2", "trainer", uid="u2", running=False)]
    run.follow_new_containers(pods)
    run.follow_new_containers(pods)                 # nothing twice
    assert sorted(run.followers) == ["generator:g0", "rank:job-trainer-1:u1", "trainer:u0",
                                     "verifier:job-verifier-0:v0"]
    assert [p for p, _ in started] == ["job-trainer-0", "job-trainer-1", "job-generator-0", "job-verifier-0"]
    assert {path.name for _, path in started} == {"trainer-0-u0.log", "trainer-1-0-u1.log", "generator-0-g0.log",
                                                  "verifier-0-0-v0.log"}


def test_each_verifier_pods_environment_server_line_is_a_figure() -> None:
    line = ("environment server: 5120 resets, 8470 steps (mean 3.0 ms), 5120 closes, 0 forgotten, 1 callers, "
            "0 undeliverable answers, dropped frames: none")
    result = run_real.Result(status={}, steps=40, verifier_logs={
        "job-verifier-0": [f"verifier-0: metrics on 0.0.0.0:29500\nverifier-0: {line}\n"],
        "job-verifier-1": ["verifier-1: no environments in this job\n"]})
    assert result.env_servers() == {"job-verifier-0": line}
    assert result.figures()["env_servers"] == {"job-verifier-0": line}


def test_a_failed_container_is_reported_once_with_its_last_log_lines(tmp_path: pathlib.Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    run, k = _run(tmp_path)
    pods = [_pod("job-trainer-0", "trainer", uid="u0"), _pod("job-trainer-1", "trainer", uid="u1", last_exit=1),
            _pod("job-verifier-0", "verifier", uid="v0", running=False, exit_now=0)]
    run.report_failures(pods)
    run.report_failures(pods)
    assert k.calls == [("logs", "-n", "ns", "job-trainer-1", "-c", "trainer", "--tail=40", "--previous")]
    assert run.failures == [{"pod": "job-trainer-1", "attempt": "0", "exit_code": 1, "reason": "Error",
                             "log_tail": "\n".join(f"line {i}" for i in range(5))}]
    err = capsys.readouterr().err
    assert "job-trainer-1 (attempt 0) exited 1" in err and "    | line 4" in err
    run.report_failures([_pod("job-trainer-1", "trainer", uid="u1", running=False, exit_now=143, last_exit=1)])
    assert k.calls[-1] == ("logs", "-n", "ns", "job-trainer-1", "-c", "trainer", "--tail=40")
    deleted = _pod("job-trainer-0", "trainer", uid="u0", running=False, exit_now=143)   # the scale-down's SIGTERM
    deleted["metadata"]["deletionTimestamp"] = "2026-11-23T17:49:13Z"
    run.report_failures([deleted])
    assert len(k.calls) == 2 and len(run.failures) == 2


def test_an_export_is_asked_for_on_the_rljob_and_read_back_from_status(tmp_path: pathlib.Path) -> None:
    k = FakeKubectl()
    run = run_real.Run(k=k, namespace="ns", name="job", workdir=tmp_path, kill_after_step=None,
                       timeout_s=1, export_after_step=3)
    result = run_real.Result(status={}, steps=10)
    trainer = _pod("job-trainer-0", "trainer", uid="u0")
    trainer["metadata"]["annotations"] = {"kubeforge.dev/progress": '{"step": 2}'}
    run.ask_for_export({"phase": "Running"}, [trainer], result)
    assert k.calls == [] and run.export_request is None                   # step 2 < 3: not yet
    trainer["metadata"]["annotations"] = {"kubeforge.dev/progress": '{"step": 3}'}
    run.ask_for_export({"phase": "Running"}, [trainer], result)
    assert run.export_request is not None
    rid = run.export_request[0]
    assert k.calls == [("annotate", "rljob", "job", "-n", "ns", f"kubeforge.dev/export-request={rid}", "--overwrite")]
    run.ask_for_export({"phase": "Running", "progress": {"lastExport": {"request": "older"}}}, [trainer], result)
    assert result.export is None
    served = {"request": rid, "path": "/checkpoints/export-step-4", "step": 4}
    run.ask_for_export({"phase": "Running", "progress": {"lastExport": served}}, [trainer], result)
    assert result.export is not None and result.export["path"] == served["path"]
    assert result.export["asked_at_step"] == 3 and len(k.calls) == 1


def test_the_recoverys_first_step_is_one_trained_after_the_fault_by_a_new_trainer_or_after_a_generator_came_back() -> None:
    rec = '{"step": %d, "mean_reward": 0.5}\n'
    before = "trainer-0: started\n" + rec % 6
    assert not run_real.stepped_after_fault(before, since=len(before), restarted=False)
    # a step from rollouts sampled before the fault: not the recovery's while the generator has not come back
    kept = before + "trainer-0: generator-0 silent for 10s\n" + rec % 7
    assert not run_real.stepped_after_fault(kept, since=len(before), restarted=False)
    back = kept + "trainer-0: generator-0 restarted: weight-sync epoch 2, policy v7 pushed, 16 prompts re-issued\n"
    assert not run_real.stepped_after_fault(back, since=len(before), restarted=False)
    assert run_real.stepped_after_fault(back + rec % 8, since=len(before), restarted=False)
    joined = kept + "trainer-0: generators 1 -> 2 (joined); weight-sync epoch 3\n" + rec % 8
    assert run_real.stepped_after_fault(joined, since=len(before), restarted=False)
    # a trainer started after the fault (RestartAll): its first step record, whatever it says before
    assert run_real.stepped_after_fault('{"resumed": 5}\n' + rec % 6, since=0, restarted=True)
    assert not run_real.stepped_after_fault('{"resumed": 5}\n', since=0, restarted=True)
