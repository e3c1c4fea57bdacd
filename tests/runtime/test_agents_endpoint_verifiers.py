"""``spec.environment.type: Verifiers``: an environment written against PrimeIntellect's ``verifiers`` library only
(``vf_envs/vf_guess``: its Taskset, Task with a ``@vf.reward``, Harness) runs unchanged in the library's own rollout
loop, in the environments' interpreter (``make venv-envs``), against the endpoint backed by real vLLM (the shared
tiny engine). Each rollout comes back with the library's reward and the endpoint's exact token record.

Checks that can fail: the library's reward equals the rule recomputed from the recorded final reply (so the reward
is about the tokens we recorded); every model call of the rollout is in its episode, one branch of two calls that
extend each other; the recorded ids are vLLM's own (the sampler's audit). The unit test drives the adapter's failure
paths (a missing environment, a runner past its timeout) with the scripted sampler.
"""
from __future__ import annotations

import collections
import pathlib
from typing import Any

import pytest

from kubeforge.runtime.agents import endpoint, primeintellect
from test_agents_endpoint import ScriptedSampler

ROOT = pathlib.Path(__file__).resolve().parents[2]
ENVS = str(pathlib.Path(__file__).with_name("vf_envs"))
PYTHON = primeintellect.adapter.default_python(ROOT)
needs_envs = pytest.mark.skipif(not PYTHON.exists(), reason=f"no environments interpreter at {PYTHON}: make venv-envs")


def _env(**kw: Any) -> primeintellect.adapter.VerifiersEnvironment:
    return primeintellect.adapter.VerifiersEnvironment(environment=kw.pop("environment", "vf_guess"), python=PYTHON,
                                                       paths=(ENVS,), **kw)


@pytest.mark.vllm
@needs_envs
def test_verifiers_environment_runs_unchanged_through_the_endpoint(tiny_engine: Any) -> None:
    sampler = endpoint.sampler.VllmSampler(tiny_engine, policy=endpoint.sampler.Policy(), audit=True)
    ep = endpoint.server.Endpoint(sampler=sampler, chat=endpoint.chat.ChatTemplate(tiny_engine.tokenizer),
                                  config=endpoint.server.EndpointConfig(max_tokens_per_call=8))
    try:
        outcomes = _env(timeout=240, args={"tasks": 2}).run_group(ep, [0, 1, 2, 3])
    finally:
        ep.close()
        sampler.close()
    assert len(outcomes) == 4
    recorded: collections.Counter[tuple[Any, ...]] = collections.Counter()
    for o in outcomes:
        assert o.ok and o.error is None, o.error
        assert o.finish_reason == "stop" and o.rewards.keys() == {"answered_with_a_digit"}
        rec = o.recording
        assert [b.reason for b in rec.branches] == ["first"], [b.reason for b in rec.branches]
        calls = rec.branches[0].calls
        assert [c.reason for c in calls] == ["first", "extends"]
        assert calls[1].prompt_ids == calls[0].prompt_ids + calls[0].sampled_ids + calls[1].delta_ids
        assert o.reward == float(any(ch.isdigit() for ch in calls[-1].content))
        for c in calls:
            recorded[(c.prompt_ids, c.sampled_ids, c.logprobs)] += 1
    prompts = [tiny_engine.tokenizer.decode(list(o.recording.branches[0].prompt_ids)) for o in outcomes]
    assert prompts[0] == prompts[2] != prompts[1] == prompts[3]          # args {tasks: 2}: tasks 0, 1, 0, 1
    assert "Guess my number 1:" in prompts[1]
    assert sampler.audit is not None and len(sampler.audit) == 8
    assert collections.Counter((a.prompt_ids, a.token_ids, a.logprobs) for a in sampler.audit) == recorded
    assert ep.refused == {} and ep.branches == {"first": 4, "extends": 4}


@pytest.mark.slow
@needs_envs
def test_runner_failures_fail_the_group_only(tmp_path: pathlib.Path) -> None:
    tok = __import__("kubeforge.runtime.models.tiny", fromlist=["tiny"]).tokenizer()
    ep = endpoint.server.Endpoint(sampler=ScriptedSampler(tok), chat=endpoint.chat.ChatTemplate(tok))
    try:
        missing = _env(environment="no_such_env", timeout=120).run_group(ep, [0])
        assert [(o.ok, o.finish_reason) for o in missing] == [(False, "env_error")]
        bad_args = _env(args={"no_such_field": 1}, timeout=120).run_group(ep, [0])
        assert [(o.ok, o.finish_reason) for o in bad_args] == [(False, "env_error")]
        (tmp_path / "vf_slow").mkdir()
        (tmp_path / "vf_slow" / "__init__.py").write_text("import time\ntime.sleep(60)\n")
        slow = primeintellect.adapter.VerifiersEnvironment(environment="vf_slow", python=PYTHON, paths=(str(tmp_path),),
                                                           timeout=8).run_group(ep, [0, 1])
        assert [(o.ok, o.finish_reason) for o in slow] == [(False, "env_timeout")] * 2
        assert ep.stats()["episodes_open"] == 0
    finally:
        ep.close()


def test_a_missing_interpreter_fails_the_group_and_closes_its_episodes(tmp_path: pathlib.Path) -> None:
    tok = __import__("kubeforge.runtime.models.tiny", fromlist=["tiny"]).tokenizer()
    ep = endpoint.server.Endpoint(sampler=ScriptedSampler(tok), chat=endpoint.chat.ChatTemplate(tok))
    try:
        env = primeintellect.adapter.VerifiersEnvironment(environment="vf_guess", python=tmp_path / "no" / "python")
        assert [(o.ok, o.finish_reason, o.recording.calls) for o in env.run_group(ep, [0, 1])] == \
            [(False, "env_error", 0)] * 2
        assert ep.stats()["episodes_open"] == 0
    finally:
        ep.close()
