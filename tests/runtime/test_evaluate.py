"""Held-out evaluation (trainer.evaluate), the learning-rate schedule (learner.schedule) and where their figures go
(summary, plot, progress annotation, operator status)."""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Sequence

import pytest
import torch
import transformers

from kubeforge.api import progress, rljob
from kubeforge.runtime import models, tasks, types
from kubeforge.runtime.launcher import plot, summary
from kubeforge.runtime.learner import schedule
from kubeforge.runtime.trainer import evaluate


def sched(**kw: object) -> rljob.LRScheduleSpec:
    return rljob.LRScheduleSpec.model_validate(kw)


def count_decoding_steps(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The sequence length at every decoding step the evaluator's heartbeat criterion hears (filled as it runs)."""
    steps: list[int] = []

    class Counting(evaluate._Beat):
        def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kw: object) -> torch.Tensor:
            steps.append(int(input_ids.shape[1]))
            return super().__call__(input_ids, scores, **kw)

    monkeypatch.setattr(evaluate, "_Beat", Counting)
    return steps


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
    from kubeforge.runtime.learner import step
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
    steps = count_decoding_steps(monkeypatch)
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
    recs = [progress.StepRecord(**r) for r in recs]
    s = summary.summarize(recs, wall_seconds=3.0, metrics_path="m")
    assert (s["eval_accuracy_before"], s["eval_accuracy_after"]) == (0.2, 0.5)
    assert summary.summarize(recs[:1] and [progress.StepRecord(step=1, mean_reward=0.1, time=1.0)], wall_seconds=1.0,
                             metrics_path="m")["eval_accuracy_after"] is None
    assert plot.reward_curve(recs, path=tmp_path / "r.png", title="t").stat().st_size > 0
    text = progress.ProgressReport.of_step(recs[1], done=False).encode()
    assert json.loads(text)["evalAccuracy"] == 0.5
    assert "evalAccuracy" not in progress.ProgressReport.of_step(progress.StepRecord(step=1), done=False).encode()
    parsed = progress.ProgressReport.decode(text)
    assert parsed is not None and parsed.eval_accuracy == 0.5


SYSTEM = "System: answer in one line. Question: "


def tiny_lm() -> tuple[Any, Any]:
    path = models.resolve(rljob.ModelSpec(builtin="tiny"))
    return (transformers.AutoModelForCausalLM.from_pretrained(str(path)),
            transformers.AutoTokenizer.from_pretrained(str(path)))


def shared_prompts() -> list[types.Prompt]:
    # one system text and questions of three lengths, interleaved: the prefix path batches by length
    qs = ["copy ab", "copy abcd", "copy abcdef", "copy cd", "copy cdef", "copy ef", "copy efgh", "copy ghijkl"]
    return [types.Prompt(index=i, text=SYSTEM + q, answer="") for i, q in enumerate(qs)]


def test_shared_prefix_gives_the_plain_answers_in_order(monkeypatch: pytest.MonkeyPatch) -> None:
    model, tok = tiny_lm()
    prompts = shared_prompts()
    monkeypatch.setattr(evaluate, "BATCH", 2)                # groups of 3, 3 and 2 rows: several batches each
    e = evaluate.Evaluator(model=model, tokenizer=tok, prompts=prompts, verifier=Always(1.0), max_new_tokens=6,
                           chat_template=False)
    assert e.shared >= evaluate.MIN_SHARED
    assert len({len(x) for x in e.encoded}) == 3
    assert all(x[:e.shared] == e.encoded[0][:e.shared] for x in e.encoded)
    plain = evaluate.Evaluator(model=model, tokenizer=tok, prompts=prompts, verifier=Always(1.0), max_new_tokens=6,
                               chat_template=False)
    plain.shared = 0                                         # the padded path, prefix computed in every row
    assert e.answers() == plain.answers()
    # and each prompt alone (no batch, no cache) agrees: the order is the prompts' order
    alone = [evaluate.Evaluator(model=model, tokenizer=tok, prompts=[p], verifier=Always(1.0), max_new_tokens=6,
                                chat_template=False).answers()[0] for p in prompts]
    assert e.answers() == alone
    assert len(set(alone)) > 1                               # different answers, so an order mix-up would show


def test_shared_prefix_is_computed_once_per_call() -> None:
    model, tok = tiny_lm()
    prompts = shared_prompts()
    shapes: list[tuple[int, int]] = []

    def seen(module: torch.nn.Module, args: tuple[torch.Tensor, ...]) -> None:
        shapes.append((int(args[0].shape[0]), int(args[0].shape[1])))

    hook = model.get_input_embeddings().register_forward_pre_hook(seen)
    try:
        e = evaluate.Evaluator(model=model, tokenizer=tok, prompts=prompts, verifier=Always(1.0), max_new_tokens=4,
                               chat_template=False)
        e.answers()
        with_prefix = list(shapes)
        shapes.clear()
        e.shared = 0
        e.answers()
        without = list(shapes)
    finally:
        hook.remove()
    lengths = sorted({len(x) for x in e.encoded})
    groups = {n: sum(len(x) == n for x in e.encoded) for n in lengths}
    s = evaluate.shared_prefix(e.encoded)
    assert with_prefix[0] == (1, s)                          # the prefix once, batch 1
    assert with_prefix.count((1, s)) == 1
    prefills = [sh for sh in with_prefix[1:] if sh[1] > 1]   # then one prefill per length group: its own tokens only
    assert sorted(prefills) == sorted((groups[n], n - s) for n in lengths)
    assert without[0] == (len(prompts), max(lengths))        # the plain path: every row's whole (padded) prompt
    prefill_tokens = sum(b * n for b, n in with_prefix if n > 1)
    assert prefill_tokens == s + sum(len(x) - s for x in e.encoded) < len(prompts) * max(lengths)


def test_prompts_without_a_common_prefix_take_the_plain_path() -> None:
    model, tok = tiny_lm()
    texts = ["copy ab", "say hello there", "what is 3 + 4"]
    prompts = [types.Prompt(index=i, text=t, answer="") for i, t in enumerate(texts)]
    e = evaluate.Evaluator(model=model, tokenizer=tok, prompts=prompts, verifier=Always(1.0), max_new_tokens=3,
                           chat_template=False)
    assert e.shared == 0
    assert len(e.answers()) == 3 and e.run().prompts == 3
    # too short a prefix, or a prompt that is nothing but the prefix: no sharing
    assert evaluate.shared_prefix([[1, 2, 3, 4], [1, 2, 3, 5]]) == 0
    assert evaluate.shared_prefix([list(range(10)), list(range(10)) + [11]]) == 0
    assert evaluate.shared_prefix([list(range(10)) + [11], list(range(10)) + [12, 13]]) == 10


def test_shared_prefix_beats_every_decoding_step(monkeypatch: pytest.MonkeyPatch) -> None:
    model, tok = tiny_lm()
    prompts = shared_prompts()
    monkeypatch.setattr(evaluate, "BATCH", 2)                # 2 + 2 batches of the 3-row groups, 1 of the 2-row one
    beats: list[int] = []
    steps = count_decoding_steps(monkeypatch)
    e = evaluate.Evaluator(model=model, tokenizer=tok, prompts=prompts, verifier=Always(1.0), max_new_tokens=4,
                           chat_template=False, progress=lambda: beats.append(len(steps)))
    assert e.shared > 0
    e.answers()
    assert len(steps) >= 5                                  # at least one decoding step per batch was heard
    assert len(beats) == len(steps) + 5                     # every decoding step, and the end of each batch
    assert beats[-1] == len(steps)
