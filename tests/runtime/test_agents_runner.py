"""The episode runner over a scripted turn engine (a unit test of the turn loop; the real vLLM engine runs it in
tests/runtime/test_multiturn_learning.py): episodes batched per turn, environment tokens appended as deltas and
spanned out, every bound (maxTurns, maxTokensPerEpisode, the model's context) and failure ending one episode only."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from kubeforge.api import rljob
from kubeforge.runtime import types, wire
from kubeforge.runtime.agents import chat, runner
from kubeforge.runtime.agents.envs import arith, tags
from kubeforge.runtime.agents.hosts import host
from kubeforge.runtime.agents.envs import calculator, guess_number, registry
from kubeforge.runtime.models import tiny

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


class Script:
    """Answers the k-th call with ``turns[k]``: one text for every context, or a list of one per context (one byte
    token per character, logprob -0.5 each)."""

    def __init__(self, turns: list[str | list[str]], tokenizer: Any) -> None:
        self.tokenizer, self.turns = tokenizer, turns
        self.calls: list[int] = []

    def sample_turns(self, contexts: Sequence[Sequence[int]], *, max_tokens: Sequence[int], seeds: Sequence[int],
                     stop: Sequence[str]) -> list[types.Completion]:
        plan = self.turns[len(self.calls)]
        self.calls.append(len(contexts))
        texts = plan if isinstance(plan, list) else [plan] * len(contexts)
        out = []
        for text, m in zip(texts, max_tokens):
            ids = self.tokenizer.encode(text, add_special_tokens=False)[:m]
            out.append(types.Completion(token_ids=ids, logprobs=[-0.5] * len(ids), text=text[:len(ids)]))
        return out


def sampler(env: rljob.EnvironmentSpec, engine: Any, *, group_size: int = 2, max_new: int = 8,
            max_context: int = 512) -> runner.EpisodeSampler:
    h = host.InProcessHost(registry.kind(env).make(env), bounds=host.Bounds(timeout_s=5.0,
                                                                             max_observation_bytes=4096))
    algo = rljob.AlgorithmSpec.model_validate({"groupSize": group_size, "maxNewTokens": max_new})
    return runner.EpisodeSampler(engine=engine, host=h, spec=env, algorithm=algo, chat_template=False, seed=0,
                                 max_context=max_context)


def test_guess_number_episodes_are_batched_per_turn_and_spanned() -> None:
    tok = tiny.tokenizer()
    env = rljob.EnvironmentSpec.model_validate({"type": "GuessNumber", "maxTurns": 3, "guessNumber": {"maxValue": 2}})
    eng = Script(["1", "2", "2"], tok)
    s = sampler(env, eng, group_size=2)
    prompts = [types.Prompt(index=0, text="copy: 2", answer="2"), types.Prompt(index=1, text="copy: 1", answer="1")]
    groups = s.sample(prompts)
    assert eng.calls == [4, 2]      # all four episodes in one call on the first turn; the two left on the second
    g0 = groups[0]
    assert g0.prompt_token_ids.tolist() == tok.encode("Guess my number from 1 to 2:", add_special_tokens=True)
    assert g0.episode_stats is not None and g0.policy_spans is not None
    # episode 0 of prompt 0 (secret 2): "1" -> "higher" -> "2": done at turn 2, reward (3 - 2 + 1) / 3
    c = g0.completions[0]
    assert c.text == "1\nhigher\n2" and g0.episode_stats[0].turns == 2
    assert g0.episode_stats[0].env_reward == pytest.approx(2 / 3)
    assert g0.policy_spans[0] == ((0, 1), (9, 10))
    assert c.logprobs.tolist() == [-0.5] + [0.0] * 8 + [-0.5]
    assert types.policy_mask(g0, 0).tolist() == [1] + [0] * 8 + [1]
    # prompt 1's secret is 1: right at once
    assert groups[1].episode_stats[0].turns == 1 and groups[1].episode_stats[0].env_reward == 1.0
    assert wire.decode(wire.encode(wire.Rollout(group=g0))) == wire.Rollout(group=g0)


def test_bounds_end_episodes() -> None:
    tok = tiny.tokenizer()
    env = rljob.EnvironmentSpec.model_validate({"type": "GuessNumber", "maxTurns": 5, "maxTokensPerEpisode": 12,
                                                "guessNumber": {"maxValue": 9}})
    s = sampler(env, Script(["5"] * 5, tok), group_size=2)
    g = s.sample([types.Prompt(index=0, text="x", answer="9")])[0]
    assert g.completions[0].finish_reason == "max_tokens" and len(g.completions[0].token_ids) <= 12
    env2 = rljob.EnvironmentSpec.model_validate({"type": "GuessNumber", "maxTurns": 2,
                                                 "guessNumber": {"maxValue": 9}})
    g2 = sampler(env2, Script(["5"] * 4, tok)).sample([types.Prompt(index=0, text="x", answer="9")])[0]
    assert g2.completions[0].finish_reason == "max_turns" and g2.episode_stats[0].turns == 2
    assert g2.episode_stats[0].env_reward == 0.0


def test_a_failing_environment_costs_its_episode_only() -> None:
    class Flaky:
        def __init__(self) -> None:
            self.n = 0

        def reset(self, prompt: types.Prompt) -> list[dict[str, str]]:
            return [{"role": "user", "content": "go"}]

        def step(self, text: str) -> Any:
            if text == "boom":
                raise ValueError("no")
            from kubeforge.runtime.agents.protocol import StepResult
            return StepResult(observation="ok", done=True, reward=1.0)

    tok = tiny.tokenizer()
    env = rljob.EnvironmentSpec.model_validate({"type": "Python", "python": {"entryPoint": "x:y"}})
    algo = rljob.AlgorithmSpec.model_validate({"groupSize": 2, "maxNewTokens": 8})
    eng = Script([["boom", "fine"]], tok)
    s = runner.EpisodeSampler(engine=eng, host=host.InProcessHost(Flaky, bounds=host.Bounds()), spec=env,
                              algorithm=algo, chat_template=False, seed=0, max_context=512)
    g = s.sample([types.Prompt(index=0, text="", answer="")])[0]
    assert [c.finish_reason for c in g.completions] == [host.ERROR, "stop"]
    assert [st.env_reward for st in g.episode_stats] == [None, 1.0]
    assert s.stats.failures == {host.ERROR: 1}


def test_the_chat_delta_appends_exactly_what_the_template_renders() -> None:
    tok = tiny.tokenizer()
    tok.chat_template = CHATML
    start = [{"role": "system", "content": calculator.SYSTEM}, {"role": "user", "content": "What is 123 * 456?"}]
    first = chat.start_ids(tok, start, chat_template=True)
    call = "<tool>123*456</tool>"
    obs = [{"role": "user", "content": tags.result("56088")}]
    ids, text = chat.delta(tok, start, obs, ended_with_eos=False, chat_template=True)
    full = tok.apply_chat_template([*start, {"role": "assistant", "content": call}, *obs],
                                   add_generation_prompt=True, tokenize=False)
    assert tok.decode(first) + call + text == full
    assert ids == tok.encode(text, add_special_tokens=False)
    _, after_eos = chat.delta(tok, start, obs, ended_with_eos=True, chat_template=True)
    assert text == "<|im_end|>\n" + after_eos if tok.eos_token == "<|im_end|>" else after_eos == text


@pytest.mark.parametrize("expr,value", [("123*456", "56088"), ("(7+3)/4", "2.5"), ("2**10", "1024"),
                                        ("-5 % 3", "1"), ("10 // 3", "3")])
def test_safe_arithmetic(expr: str, value: str) -> None:
    assert arith.show(arith.evaluate(expr)) == value


@pytest.mark.parametrize("expr", ["__import__('os')", "a+1", "2**1000", "1/0", "'x'*3", "x" * 300, "(1,2)"])
def test_safe_arithmetic_refuses(expr: str) -> None:
    with pytest.raises(arith.ArithmeticError_):
        arith.evaluate(expr)


def test_calculator_environment() -> None:
    env = calculator.Calculator()
    env.reset(types.Prompt(index=0, text="123*456=", answer="56088"))
    r = env.step("Let me compute <tool>123*456</tool>")
    assert r.observation == "<result>56088</result>" and r.tool_calls == 1 and not r.done
    bad = env.step("<tool>import os</tool>")
    assert bad.tool_errors == 1 and "<error>" in str(bad.observation)
    assert env.step("56088").reward == 1.0 and env.step("56089").reward == 0.0


def test_guess_number_feedback() -> None:
    g = guess_number.GuessNumber(max_value=100, max_turns=4)
    g.reset(types.Prompt(index=3, text="", answer="40"))
    assert g.step("50").observation == "lower" and g.step("30").observation == "higher"
    assert g.step("a guess").observation == "a number"
    assert g.step("40").reward == pytest.approx(1 / 4)
    assert np.isfinite(g.max_value)


def test_the_run_plot_shows_turns_beside_reward(tmp_path: Any) -> None:
    from kubeforge.api import progress
    from kubeforge.runtime.launcher import plot

    recs = [progress.StepRecord(step=s, policy_version=s, mean_reward=0.1 * s, episode_turns_mean=2.0 - 0.1 * s)
            for s in range(1, 6)]
    assert plot.reward_curve(recs, path=tmp_path / "r.png", title="t").stat().st_size > 0


def test_a_full_context_ends_every_episode_without_a_call() -> None:
    tok = tiny.tokenizer()
    env = rljob.EnvironmentSpec.model_validate({"type": "GuessNumber", "guessNumber": {"maxValue": 9}})
    eng = Script(["5"] * 4, tok)
    g = sampler(env, eng, max_context=10).sample([types.Prompt(index=0, text="x", answer="9")])[0]
    assert eng.calls == [] and [c.finish_reason for c in g.completions] == ["max_tokens"] * 2
    assert [len(c.token_ids) for c in g.completions] == [0, 0]
    assert wire.decode(wire.encode(wire.Rollout(group=g))) == wire.Rollout(group=g)


def test_calculator_opens_with_a_worked_tool_call_whose_result_is_right() -> None:
    msgs = calculator.Calculator().reset(types.Prompt(index=0, text="What is 2 * 3?", answer="6"))
    assert msgs[0]["role"] == "system" and msgs[-1] == {"role": "user", "content": "What is 2 * 3?"}
    demo = msgs[1:-1]
    call = tags.tool_call(demo[1]["content"])
    assert call is not None and demo[2]["content"] == tags.result(arith.show(arith.evaluate(call)))
    assert demo[3]["content"] == arith.show(arith.evaluate(call))
