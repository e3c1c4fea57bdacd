"""Held-out evaluation (trainer.evaluate), the learning-rate schedule (trainer.schedule) and where their figures go
(summary, plot, progress annotation, operator status)."""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Sequence

import pytest
import torch
import transformers

from kubeforge.api import rljob
from kubeforge.operator import observed
from kubeforge.runtime import models, tasks, types
from kubeforge.runtime.launcher import plot, summary
from kubeforge.runtime.roles import report
from kubeforge.runtime.trainer import evaluate, schedule


def sched(**kw: object) -> rljob.LRScheduleSpec:
    return rljob.LRScheduleSpec.model_validate(kw)


def test_constant_schedule_with_warmup() -> None:
    s = sched(type="Constant", warmupSteps=4)
    assert [schedule.factor(s, step=i, steps=10) for i in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    assert schedule.factor(sched(), step=0, steps=10) == 1.0


def test_cosine_schedule_runs_from_one_to_min_ratio() -> None:
    s = sched(type="Cosine", warmupSteps=2, minRatio=0.1)
    f = [schedule.factor(s, step=i, steps=12) for i in range(12)]
    assert f[:2] == [0.5, 1.0]
    assert f[2] == pytest.approx(1.0) and f[-1] == pytest.approx(0.1)
    assert all(a >= b for a, b in zip(f[2:], f[3:]))                   # monotone decay after the warm-up
    assert f[7] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 5 / 9)))
    assert schedule.factor(sched(type="Cosine"), step=0, steps=1) == pytest.approx(0.0)   # one step: the end


def test_trainer_applies_the_schedule(tmp_path: Path) -> None:
    from kubeforge.runtime.trainer import step
    path = models.resolve(rljob.ModelSpec(builtin="tiny"))
    algo = rljob.AlgorithmSpec.model_validate({"learningRate": 1e-3, "steps": 4, "maxNewTokens": 4,
                                               "learningRateSchedule": {"type": "Cosine", "warmupSteps": 2}})
    tr = step.Trainer(model_path=path, algorithm=algo)
    comps = [types.Completion(token_ids=[5, 6, 7], logprobs=[-1.0] * 3, text="") for _ in range(2)]
    g = types.RolloutGroup(prompt=types.Prompt(index=0, text="", answer=""), prompt_token_ids=[3, 4],
                           completions=comps, policy_version=0, rewards=[0.0, 1.0])
    lrs = [tr.train_step(groups=[g]).learning_rate for _ in range(4)]
    assert lrs == pytest.approx([5e-4, 1e-3, 1e-3, 0.0])


class Always:
    def __init__(self, value: float) -> None:
        self.value = value
        self.seen: list[str] = []

    def score(self, prompt: types.Prompt, completions: Sequence[str]) -> list[float]:
        self.seen.extend(completions)
        return [self.value for _ in completions]


def test_evaluator_scores_greedy_answers_of_held_out_prompts() -> None:
    path = models.resolve(rljob.ModelSpec(builtin="tiny"))
    model = transformers.AutoModelForCausalLM.from_pretrained(str(path))
    model.train()
    tok = transformers.AutoTokenizer.from_pretrained(str(path))
    task = rljob.TaskSpec.model_validate({"copy": {}, "seed": 0})
    ev = rljob.EvaluationSpec(prompts=5, firstIndex=1000)
    prompts = evaluate.held_out(tasks.stream(task), ev)
    assert [p.index for p in prompts] == list(range(1000, 1005))
    v = Always(1.0)
    e = evaluate.Evaluator(model=model, tokenizer=tok, prompts=prompts, verifier=v, max_new_tokens=3,
                           chat_template=False)
    r = e.run()
    assert (r.accuracy, r.correct, r.prompts) == (1.0, 5, 5) and len(v.seen) == 5
    assert model.training                                    # the mode is restored
    assert e.answers() == e.answers()                        # greedy: deterministic
    # one at a time, unpadded, gives the same answers as the left-padded batch
    alone = [evaluate.Evaluator(model=model, tokenizer=tok, prompts=[p], verifier=v, max_new_tokens=3,
                                chat_template=False).answers()[0] for p in prompts]
    assert alone == e.answers()
    assert evaluate.Evaluator(model=model, tokenizer=tok, prompts=prompts, verifier=Always(0.4), max_new_tokens=3,
                              chat_template=False).run().accuracy == 0.0


def test_evaluation_beats_the_heartbeat_every_decoding_step(monkeypatch: pytest.MonkeyPatch) -> None:
    # A long evaluation is progress: the trainer's liveness follows its heartbeat, and one uninterrupted call for the
    # demo's 256 prompts once outlasted progressDeadlineSeconds on a loaded machine (the run was restarted).
    path = models.resolve(rljob.ModelSpec(builtin="tiny"))
    model = transformers.AutoModelForCausalLM.from_pretrained(str(path))
    tok = transformers.AutoTokenizer.from_pretrained(str(path))
    prompts = evaluate.held_out(tasks.stream(rljob.TaskSpec.model_validate({"copy": {}, "seed": 0})),
                                rljob.EvaluationSpec(prompts=5, firstIndex=1000))
    plain = evaluate.Evaluator(model=model, tokenizer=tok, prompts=prompts, verifier=Always(1.0), max_new_tokens=4,
                               chat_template=False).answers()
    monkeypatch.setattr(evaluate, "BATCH", 2)                # three batches
    beats: list[int] = []
    steps: list[int] = []

    class Counting(evaluate._Beat):
        def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kw: object) -> torch.Tensor:
            steps.append(int(input_ids.shape[1]))
            return super().__call__(input_ids, scores, **kw)

    monkeypatch.setattr(evaluate, "_Beat", Counting)
    e = evaluate.Evaluator(model=model, tokenizer=tok, prompts=prompts, verifier=Always(1.0), max_new_tokens=4,
                           chat_template=False, progress=lambda: beats.append(len(steps)))
    assert e.answers() == plain                             # the heartbeat changes no answer
    assert len(steps) >= 3                                  # at least one decoding step per batch was heard
    assert len(beats) == len(steps) + 3                     # every decoding step, and the end of each batch
    assert beats[-1] == len(steps)


def test_evaluation_verifier_must_name_a_verifier() -> None:
    base = {"model": {"builtin": "tiny"}, "task": {"copy": {}}, "verifiers": [{"name": "answer", "type": "ExactAnswer"}]}
    ok = rljob.RLJobSpec.model_validate({**base, "evaluation": {"verifier": "answer", "everySteps": 5}})
    assert evaluate.verifier_spec(ok).name == "answer"
    with pytest.raises(ValueError, match="evaluation.verifier: must name one of spec.verifiers"):
        rljob.RLJobSpec.model_validate({**base, "evaluation": {"verifier": "nope"}})


def test_eval_figures_reach_summary_plot_annotation_and_status(tmp_path: Path) -> None:
    recs = [{"step": 1, "mean_reward": 0.1, "completions": 4, "time": 1.0, "eval_accuracy": 0.2,
             "eval_accuracy_base": 0.2},
            {"step": 2, "mean_reward": 0.3, "completions": 4, "time": 2.0, "eval_accuracy": 0.5, "evaluated": True}]
    s = summary.summarize(recs, wall_seconds=3.0, metrics_path="m")
    assert (s["eval_accuracy_before"], s["eval_accuracy_after"]) == (0.2, 0.5)
    assert summary.summarize(recs[:1] and [{"step": 1, "mean_reward": 0.1, "time": 1.0}], wall_seconds=1.0,
                             metrics_path="m")["eval_accuracy_after"] is None
    assert plot.reward_curve(recs, path=tmp_path / "r.png", title="t").stat().st_size > 0
    text = report.progress_annotation(recs[1], done=False)
    assert json.loads(text)["evalAccuracy"] == 0.5
    assert "evalAccuracy" not in report.progress_annotation({"step": 1}, done=False)
    parsed = observed.parse_progress(text)
    assert parsed is not None and parsed.eval_accuracy == 0.5
