"""Export on request in a cluster, the pure parts: the RLJob's request is relayed to trainer 0 of the current
attempt until status shows it served; ``lastExport`` from the progress annotation reaches status and stays."""
from __future__ import annotations

import json
from typing import Any

import opbuilders
from opbuilders import pod
from kubeforge.api import contract, progress, rljob
from kubeforge.operator import exports, lifecycle, observed, status

REQ = {contract.ANNOTATION_EXPORT_REQUEST: "r1"}


def _pods(attempt: int = 0, **trainer: Any) -> list[dict[str, Any]]:
    return [pod("tiny", "generator", 0, attempt=attempt), pod("tiny", "verifier", 0, attempt=attempt),
            pod("tiny", "trainer", 0, attempt=attempt, **trainer)]


def _with_annotation(raw: dict[str, Any], value: str) -> dict[str, Any]:
    raw["metadata"]["annotations"][contract.ANNOTATION_EXPORT_REQUEST] = value
    return raw


def _status(job: rljob.RLJob, pods: list[dict[str, Any]]) -> tuple[lifecycle.Plan, rljob.RLJobStatus]:
    obs = observed.observe(pods)
    plan = lifecycle.decide(job, obs, now=opbuilders.T0)
    return plan, status.compute(job, obs, plan, generation=1, now=opbuilders.T0)


def _relay(pods: list[dict[str, Any]], *, annotations: dict[str, str] | None = REQ, attempt: int = 0,
           served: rljob.ExportInfo | None = None) -> exports.Relay | None:
    return exports.relay(opbuilders.job("tiny"), observed.observe(pods), attempt=attempt, served=served,
                         annotations=annotations)


def test_a_request_goes_to_trainer_0_of_the_current_attempt_once() -> None:
    got = _relay(_pods())
    assert got == exports.Relay(pod="tiny-trainer-0", request="r1")
    assert got.patch() == {"metadata": {"annotations": {"kubeforge.dev/export-request": "r1"}}}
    in_place = _with_annotation(_pods()[2], "r1")
    assert _relay(_pods()[:2] + [in_place]) is None                      # already there: no patch
    assert _relay(_pods()[:2] + [_with_annotation(_pods()[2], "r0")]) == got  # an older one: replaced


def test_no_relay_without_request_when_served_or_without_a_running_trainer_0() -> None:
    assert _relay(_pods(), annotations={}) is None
    assert _relay(_pods(), annotations={contract.ANNOTATION_EXPORT_REQUEST: "  "}) is None
    assert _relay(_pods(), served=rljob.ExportInfo(request="r1", path="/c/export-step-3", step=3)) is None
    assert _relay(_pods(), served=rljob.ExportInfo(request="r0", step=1)) is not None
    assert _relay(_pods(attempt=0), attempt=1) is None                    # the old attempt's pod: not it
    assert _relay(_pods(attempt=1), attempt=1) is not None               # the new attempt's pod gets it
    assert _relay(_pods(phase="Pending")) is None
    assert _relay(_pods(deleting=True)) is None


def test_last_export_reaches_status_and_stays() -> None:
    last = {"request": "r1", "path": "/checkpoints/export-step-3", "step": 3}
    job = opbuilders.job("tiny")
    _, s = _status(job, _pods(progress={"step": 3, "meanReward": 0.5, "policyVersion": 3, "lastExport": last}))
    assert s.progress.last_export == rljob.ExportInfo(request="r1", path="/checkpoints/export-step-3", step=3)
    assert s.model_dump(mode="json", by_alias=True)["progress"]["lastExport"] == last
    # a new attempt's trainer reports progress without lastExport: status keeps the last one
    later = opbuilders.job("tiny", status=s.model_dump(mode="json", by_alias=True))
    _, s2 = _status(later, _pods(progress={"step": 5, "meanReward": 0.6, "policyVersion": 5}))
    assert s2.progress.step == 5 and s2.progress.last_export == s.progress.last_export


def test_malformed_last_export_is_ignored_not_the_progress() -> None:
    for bad in ({"path": "/x", "step": 1}, {"request": "", "step": 1}, {"request": "r", "step": "x"}, "r1", 3):
        report = progress.ProgressReport.decode(json.dumps({"step": 4, "lastExport": bad}))
        assert report is not None and report.step == 4 and report.last_export is None
    ok = progress.ProgressReport.decode(json.dumps({"step": 4, "lastExport": {"request": "r", "step": 4}}))
    assert ok is not None and ok.last_export == rljob.ExportInfo(request="r", path=None, step=4)


def test_pod_facts_carry_the_pods_export_request() -> None:
    raw = _with_annotation(_pods()[2], "r9")
    assert observed.pod_facts(raw).export_request == "r9"
    assert observed.pod_facts(_pods()[2]).export_request is None
