"""Progress's two typed shapes (kubeforge.api.progress): encode/decode, and the flow step → annotation → status."""
from __future__ import annotations

import json

from kubeforge.api import progress, rljob


def test_step_record_round_trips_and_leaves_out_what_the_step_lacks() -> None:
    rec = progress.StepRecord(step=3, policy_version=3, mean_reward=0.25, seconds={"total": 1.5}, time=10.0)
    line = rec.encode()
    doc = json.loads(line)
    assert doc["weight_sync_seconds"] is None                      # always present, null when unknown
    assert not set(progress.SPARSE) & set(doc)                      # evaluation and export only when the step has them
    assert progress.StepRecord.decode(line) == rec
    evaluated = rec.model_copy(update={"eval_accuracy": 0.0, "evaluated": True})
    assert json.loads(evaluated.encode())["eval_accuracy"] == 0.0    # a zero accuracy is a value, not "unknown"
    assert progress.StepRecord.decode(evaluated.encode()) == evaluated


def test_step_record_decode_never_raises() -> None:
    for bad in ('{"step": 6, "mean_rew', "[1]", '{"step": "6"}', '{"step": true}', '{"mean_reward": 1}',
                '{"step": 1, "completions": "many"}', ""):
        assert progress.StepRecord.decode(bad) is None, bad
    assert progress.StepRecord.decode('{"step": 2, "from_a_newer_trainer": 1}') == progress.StepRecord(step=2)


def test_progress_report_of_a_step_encodes_the_annotation() -> None:
    rec = progress.StepRecord(step=4, policy_version=4, mean_reward=0.5, export="/c/export-step-4",
                              export_request="r1", logprob_mismatch_kl=2e-4)
    report = progress.ProgressReport.of_step(rec, done=False)
    assert json.loads(report.encode()) == {"step": 4, "meanReward": 0.5, "policyVersion": 4, "done": False,
                                           "logprobMismatchKl": 2e-4,
                                           "lastExport": {"request": "r1", "path": "/c/export-step-4", "step": 4}}
    assert progress.ProgressReport.decode(report.encode()) == report
    plain = progress.ProgressReport.of_step(progress.StepRecord(step=1), done=True)
    assert json.loads(plain.encode()) == {"step": 1, "meanReward": None, "policyVersion": 0, "done": True,
                                          "logprobMismatchKl": None}


def test_progress_report_decode_keeps_the_progress_of_a_malformed_export() -> None:
    assert progress.ProgressReport.decode(None) is None
    assert progress.ProgressReport.decode("{not json") is None
    assert progress.ProgressReport.decode('{"step": "x"}') is None
    got = progress.ProgressReport.decode('{"step": 2, "lastExport": {"request": 7}, "newField": 1}')
    assert got is not None and got.step == 2 and got.last_export is None


def test_status_progress_keeps_the_last_export_once_set() -> None:
    served = rljob.ExportInfo(request="r", path="/p", step=2)
    prev = rljob.Progress(step=2, last_export=served)
    now = progress.ProgressReport(step=5, mean_reward=0.75, policy_version=5, eval_accuracy=0.5).status(prev)
    assert now == rljob.Progress(step=5, mean_reward=0.75, policy_version=5, eval_accuracy=0.5, last_export=served)


def test_every_status_progress_field_flows_from_the_step_record() -> None:
    """Adding a progress field touches two files: StepRecord and rljob.Progress (same snake_case name). A status
    field that StepRecord lacks would never be reported: this fails first."""
    reported = set(rljob.Progress.model_fields) - {"last_export"}        # lastExport: from export/export_request
    assert reported <= set(progress.StepRecord.model_fields)
    values = {name: 1 for name in reported}
    report = progress.ProgressReport.of_step(progress.StepRecord(**values), done=False)
    assert report.status(rljob.Progress()).model_dump(exclude={"last_export"}) == values


def test_status_progress_carries_the_episode_figures_of_a_job_with_an_environment() -> None:
    rec = progress.StepRecord(step=3, episode_turns_mean=1.75, tool_calls=22, tool_errors=1)
    report = progress.ProgressReport.of_step(rec, done=False)
    doc = json.loads(report.encode())
    assert (doc["episodeTurnsMean"], doc["toolCalls"]) == (1.75, 22)
    status = progress.ProgressReport.decode(report.encode())
    assert status is not None
    got = status.status(rljob.Progress())
    assert (got.episode_turns_mean, got.tool_calls) == (1.75, 22)
    # without an environment there are no episodes: neither field is reported (not "0 tool calls")
    single = progress.ProgressReport.of_step(progress.StepRecord(step=3), done=False)
    assert single.tool_calls is None and single.episode_turns_mean is None
    assert not {"episodeTurnsMean", "toolCalls"} & set(json.loads(single.encode()))
