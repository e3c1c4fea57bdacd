"""Held-out evaluation with an environment: greedy episodes of the trainer's model with the environment's feedback
(the real tiny model and HF ``generate``; the environment in a worker process)."""
from __future__ import annotations

import pytest
import transformers

from kubeforge.api import rljob
from kubeforge.runtime import models, types
from kubeforge.runtime.agents.hosts import workers
from kubeforge.runtime.tasks import registry as tasks
from kubeforge.runtime.learner import step
from kubeforge.runtime.trainer import episode_eval, evaluate
from kubeforge.runtime.verifiers import registry


def job(env: dict[str, object]) -> rljob.RLJobSpec:
    return rljob.RLJobSpec.model_validate({
        "model": {"builtin": "tiny"}, "task": {"copy": {"length": 1, "alphabet": "12"}},
        "verifiers": [{"name": "answer", "type": "ExactAnswer"}], "environment": env,
        "algorithm": {"groupSize": 2, "maxNewTokens": 1}, "evaluation": {"prompts": 6}})


@pytest.mark.parametrize("stop", [False, True])
def test_greedy_episodes_score_by_the_environment(stop: bool) -> None:
    spec = job({"type": "GuessNumber", "maxTurns": 2, "guessNumber": {"maxValue": 2}})
    path = models.resolve(spec.model)
    learner = step.Trainer(model_path=path, algorithm=spec.algorithm)
    tok = transformers.AutoTokenizer.from_pretrained(str(path))
    assert spec.evaluation is not None
    prompts = evaluate.held_out(tasks.stream(spec.task), spec.evaluation)
    base = evaluate.Evaluator(model=learner.model, tokenizer=tok, prompts=prompts,
                              verifier=registry.build_inner(evaluate.verifier_spec(spec)), max_new_tokens=3,
                              chat_template=False)
    assert spec.environment is not None
    host = workers.SubprocessHost(spec.environment, workers=1)
    try:
        ev = episode_eval.EpisodeEvaluator(base=base, spec=spec, host=host, verifier=base.verifier, max_context=512)
        if stop:   # a stop string cuts a greedy turn right after it
            ev.sampler.stop = ("1",)
        result = ev.run()
        again = ev.run()
    finally:
        host.shutdown()
    assert result.prompts == 6 and 0 <= result.correct <= 6
    assert (result.correct, result.accuracy) == (again.correct, again.accuracy)   # greedy: the same every time


def test_hf_turns_cut_at_budget_eos_and_stop() -> None:
    class Tok:
        def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
            return "".join(chr(96 + i) for i in ids)

    class Ev:
        tokenizer = Tok()
        eos_id = 9

    turns = episode_eval.HFTurns(Ev())  # type: ignore[arg-type]
    assert turns._turn([1, 2, 3, 4], 3, ()).token_ids.tolist() == [1, 2, 3]
    assert turns._turn([1, 9, 3], 5, ()).token_ids.tolist() == [1, 9]
    assert turns._turn([1, 2, 3, 4], 5, ("bc",)).token_ids.tolist() == [1, 2, 3]
    assert isinstance(turns._turn([1], 1, ()), types.Completion)


def test_hf_turns_with_a_shared_prefix_give_the_padded_turns_in_order(monkeypatch: pytest.MonkeyPatch) -> None:
    # contexts of three lengths behind one 12-token prefix (a system prompt and demonstration), interleaved
    path = models.resolve(rljob.ModelSpec(builtin="tiny"))
    model = transformers.AutoModelForCausalLM.from_pretrained(str(path))
    tok = transformers.AutoTokenizer.from_pretrained(str(path))
    base = evaluate.Evaluator(model=model, tokenizer=tok, prompts=[types.Prompt(index=0, text="x", answer="")],
                              verifier=registry.build_inner(rljob.VerifierSpec(name="a", type="ExactAnswer")),
                              max_new_tokens=6, chat_template=False)
    prefix = [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]
    tails = [[3], [4, 5, 6], [7, 8], [9], [10, 11, 12], [13, 14], [15]]
    contexts = [prefix + t for t in tails]
    limits = [6, 3, 6, 2, 6, 6, 4]
    turns = episode_eval.HFTurns(base)
    used: list[int] = []
    real = turns._shared
    monkeypatch.setattr(turns, "_shared", lambda *a: used.append(a[-1]) or real(*a))
    monkeypatch.setattr(episode_eval, "BATCH", 2)     # several batches per length
    got = turns.sample_turns(contexts, max_tokens=limits, seeds=[0] * 7, stop=())
    assert used == [len(prefix)]
    monkeypatch.setattr(evaluate, "shared_prefix", lambda contexts: 0)   # the padded path, prefix in every row
    plain = turns.sample_turns(contexts, max_tokens=limits, seeds=[0] * 7, stop=())
    assert used == [len(prefix)]
    assert [c.token_ids.tolist() for c in got] == [c.token_ids.tolist() for c in plain]
    assert [len(c.token_ids) for c in got] == [min(m, len(c.token_ids)) for c, m in zip(got, limits)]
    assert len({tuple(c.token_ids.tolist()) for c in got}) > 1   # different turns, so an order mix-up would show
