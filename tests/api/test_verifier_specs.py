"""Verifier and reward settings: rules the API server cannot check with CEL (a Python regular expression that must
compile) are refused by the model, so ``kubeforge validate`` / the launcher refuse them naming the field and the
operator refuses to run a stored job that slipped past admission (event InvalidSpec); defaults keep old
manifests' meaning."""
from __future__ import annotations

import pytest

import invalid_manifests
from kubeforge.api import load, rljob


def test_a_regex_that_does_not_compile_is_refused_naming_the_field() -> None:
    doc = invalid_manifests.valid()
    doc["spec"]["verifiers"][1]["regex"]["pattern"] = r"^(\d+$"
    with pytest.raises(load.InvalidRLJob) as e:
        load.parse(doc)
    assert "spec.verifiers[1].regex.pattern" in str(e.value)
    assert rljob.MSG_REGEX_INVALID in str(e.value)


def test_defaults_keep_the_weighted_sum_and_document_every_setting() -> None:
    job = load.parse(invalid_manifests.valid())
    assert job.spec.reward.aggregation == "WeightedSum"
    assert job.spec.reward.weak_supervision.refit_every_steps == 10
    v = job.spec.verifiers[0]
    assert (v.timeout_seconds, v.fallback_score, v.isolation) == (30.0, 0.0, "Thread")


def test_the_api_notes_examples_parse() -> None:
    doc = invalid_manifests.valid()
    doc["spec"]["task"] = {"jsonl": {"path": "/data/train.jsonl"}}   # CodeExecution needs answers that are tests
    doc["spec"]["verifiers"] = [
        {"name": "answer", "type": "MathEquivalence"},
        {"name": "tests", "type": "CodeExecution", "codeExecution": {"timeoutSeconds": 5, "memoryMiB": 256}},
        {"name": "rm", "type": "RewardModel", "rewardModel": {"path": "/models/rm"}},
        {"name": "mine", "type": "Python", "python": {"entryPoint": "my_rewards:score"}, "isolation": "Process"},
        {"name": "short", "type": "Length", "length": {"maxChars": 40}, "fallbackScore": None},
    ]
    doc["spec"]["reward"] = {"aggregation": "WeakSupervision",
                             "weakSupervision": {"classBalance": 0.5, "refitEverySteps": 10}}
    job = load.parse(doc)
    assert job.spec.verifiers[1].code_execution is not None
    assert job.spec.verifiers[1].code_execution.memory_mi_b == 256
    assert job.spec.verifiers[4].fallback_score is None
