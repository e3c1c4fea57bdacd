"""The generator's sampler for ``type: Verifiers`` (``agents.primeintellect.sampler``): the endpoint's recordings become
the same groups the built-in episode runner makes, with the bounds of ``spec.environment``.

The unit tests drive the endpoint in process with scripted agents (no HTTP, no library, no vLLM): the group's prompt
ids are the recorded first prompt, each completion is the final branch's tokens (environment deltas masked out of
the policy spans), the library's reward becomes the environment reward, a refused call past ``maxTurns`` is
``max_turns`` (the reward kept), a crash or a timeout fails its episode only, and an episode whose prompt differs from
its group's is dropped empty. ``RunnerProcess`` is checked with a fake runner (timeouts, garbage, exits) and, where
the environments' interpreter exists, with the library itself (one process for several batches; a hanging and a
crashing rollout cost their own episodes only).
"""
from __future__ import annotations

import pathlib
import subprocess
import sys
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from kubeforge.api import load, rljob
from kubeforge.runtime import types
from kubeforge.runtime.agents import endpoint, primeintellect
from test_agents_endpoint import ScriptedSampler

ROOT = pathlib.Path(__file__).resolve().parents[2]
PYTHON = primeintellect.adapter.default_python(ROOT)
needs_envs = pytest.mark.skipif(not PYTHON.exists(), reason=f"no environments interpreter at {PYTHON}: make venv-envs")
Agent = Callable[[endpoint.server.Endpoint, str, int], dict[str, Any]]


def _tok() -> Any:
    return __import__("kubeforge.runtime.models.tiny", fromlist=["tiny"]).tokenizer()


def _call(ep: endpoint.server.Endpoint, eid: str, messages: list[dict[str, str]]) -> str:
    r = ep.complete(eid, {"model": "policy", "messages": messages})
    return str(r["choices"][0]["message"]["content"])


def two_turns(ep: endpoint.server.Endpoint, eid: str, task: int) -> dict[str, Any]:
    msgs = [{"role": "user", "content": f"task {task}"}]
    reply = _call(ep, eid, msgs)
    _call(ep, eid, msgs + [{"role": "assistant", "content": reply}, {"role": "user", "content": "higher"}])
    return {"reward": 0.5, "ok": True, "tool_calls": 1}


def too_many_turns(ep: endpoint.server.Endpoint, eid: str, task: int) -> dict[str, Any]:
    msgs = [{"role": "user", "content": f"task {task}"}]
    for _ in range(3):
        try:
            msgs += [{"role": "assistant", "content": _call(ep, eid, msgs)}, {"role": "user", "content": "again"}]
        except endpoint.request.Refusal:
            return {"reward": 0.25, "ok": False, "error": "BadRequestError: episode_call_limit"}
    raise AssertionError("the third call was not refused")


def crashes(ep: endpoint.server.Endpoint, eid: str, task: int) -> dict[str, Any]:
    _call(ep, eid, [{"role": "user", "content": f"task {task}"}])
    return {"reward": None, "ok": False, "error": "RuntimeError: the agent crashed"}


def hangs(ep: endpoint.server.Endpoint, eid: str, task: int) -> dict[str, Any]:
    _call(ep, eid, [{"role": "user", "content": f"task {task}"}])
    return {"reward": None, "ok": False, "error": "TimeoutError", "timed_out": True}


def rewrites_the_prompt(ep: endpoint.server.Endpoint, eid: str, task: int) -> dict[str, Any]:
    _call(ep, eid, [{"role": "system", "content": "be brief"}, {"role": "user", "content": f"task {task}"}])
    return {"reward": 1.0, "ok": True}


class ScriptedRunner:
    """``primeintellect.sampler.GroupRunner`` with in-process agents, one per episode in order."""

    def __init__(self, agents: Sequence[Agent]) -> None:
        self.agents = list(agents)

    def run_group(self, ep: endpoint.server.Endpoint, tasks: Sequence[int]) -> list[primeintellect.adapter.Outcome]:
        out = []
        for agent, task in zip(self.agents, tasks):
            eid = ep.open_episode()
            line = {"task": task, "rewards": {}, "error": None, **agent(ep, eid, task)}
            out.append(primeintellect.adapter._outcome(task, line, "", ep.close_episode(eid)))
        return out


def _spec(**env: Any) -> rljob.RLJobSpec:
    doc = load.dump(load.load_file(str(ROOT / "examples" / "tiny-verifiers.yaml")))
    doc["spec"]["environment"].update(env)
    doc["spec"]["algorithm"]["groupSize"] = 4
    return load.parse(doc).spec


def _sampler(agents: Sequence[Agent], spec: rljob.RLJobSpec) -> tuple[primeintellect.sampler.VerifiersSampler,
                                                                      ScriptedSampler]:
    assert spec.environment is not None
    tok = _tok()
    scripted = ScriptedSampler(tok)
    bounds = primeintellect.sampler.Bounds.of(spec.environment, spec.algorithm)
    ep = endpoint.server.Endpoint(sampler=scripted, chat=endpoint.chat.ChatTemplate(tok),
                                  config=bounds.endpoint_config(turn_seconds=spec.environment.turn_timeout_seconds))
    return primeintellect.sampler.VerifiersSampler(endpoint=ep, environment=ScriptedRunner(agents), group_size=4,
                                                   fallback_prompt=lambda p: (5, 6), close=ep.close), scripted


def test_recordings_become_the_built_in_runners_groups() -> None:
    spec = _spec(maxTurns=2)
    sampler, scripted = _sampler([two_turns, too_many_turns, crashes, hangs], spec)
    try:
        [group] = sampler.sample([types.Prompt(index=3, text="ignored", answer="1")])
    finally:
        sampler.close()
    assert [o.task for o in sampler.outcomes] == [3, 3, 3, 3]
    assert list(group.prompt_token_ids) == list(scripted.prompts[0])     # the recorded first prompt
    assert group.policy_spans is not None and group.episode_stats is not None
    for o, comp, spans in zip(sampler.outcomes, group.completions, group.policy_spans):
        branch = o.recording.final
        assert branch is not None
        assert list(comp.token_ids) == list(branch.token_ids())
        assert spans == branch.policy_spans()
        sampled = [i for c in branch.calls for i in c.sampled_ids]
        assert [int(comp.token_ids[i]) for s, e in spans for i in range(s, e)] == sampled
        masked = [i for i in range(len(comp.token_ids)) if not any(s <= i < e for s, e in spans)]
        assert all(comp.logprobs[i] == 0.0 for i in masked)
        assert sum(len(c.delta_ids) for c in branch.calls) == len(masked)
    assert [c.finish_reason for c in group.completions] == ["stop", "max_turns", "env_error", "env_timeout"]
    assert [s.env_reward for s in group.episode_stats] == [0.5, 0.25, None, None]
    assert [s.turns for s in group.episode_stats] == [2, 2, 1, 1]
    assert [s.tool_calls for s in group.episode_stats] == [1, 0, 0, 0]
    assert sampler.stats.failures == {"env_error": 1, "env_timeout": 1}
    assert len(sampler.stats.episodes) == 4
    assert sampler.stats.masked_tokens == sum(len(c.token_ids) for c in group.completions) - \
        sum(e - s for spans in group.policy_spans for s, e in spans)


def test_an_episode_from_another_prompt_is_dropped_empty() -> None:
    sampler, _ = _sampler([two_turns, rewrites_the_prompt, two_turns, two_turns], _spec(maxTurns=2))
    try:
        [group] = sampler.sample([types.Prompt(index=0, text="x", answer="1")])
    finally:
        sampler.close()
    assert [len(c.token_ids) for c in group.completions][1] == 0
    assert group.completions[1].finish_reason == "env_garbage"
    assert group.episode_stats is not None and group.episode_stats[1].env_reward is None
    assert sampler.stats.failures == {"env_garbage": 1}


def test_a_group_with_no_call_gets_the_fallback_prompt() -> None:
    def silent(ep: endpoint.server.Endpoint, eid: str, task: int) -> dict[str, Any]:
        return {"reward": None, "ok": False, "error": "no model call"}

    sampler, _ = _sampler([silent] * 4, _spec())
    try:
        [group] = sampler.sample([types.Prompt(index=0, text="x", answer="1")])
    finally:
        sampler.close()
    assert list(group.prompt_token_ids) == [5, 6]
    assert [len(c.token_ids) for c in group.completions] == [0] * 4


def test_bounds_follow_the_spec() -> None:
    spec = _spec(maxTurns=3, turnTimeoutSeconds=7, maxTokensPerEpisode=40)
    assert spec.environment is not None
    b = primeintellect.sampler.Bounds.of(spec.environment, spec.algorithm)
    assert (b.max_turns, b.max_tokens_per_call, b.max_episode_tokens, b.rollout_seconds) == (3, 1, 40, 21.0)
    cfg = b.endpoint_config(turn_seconds=7)
    assert (cfg.max_calls_per_episode, cfg.max_tokens_per_call, cfg.max_episode_tokens, cfg.request_timeout) == \
        (3, 1, 40, 7)
    assert cfg.host == "127.0.0.1" and cfg.key is None          # loopback: the runner lives in the same pod
    env = primeintellect.sampler.environment(spec.environment, python=pathlib.Path("/x/python"), paths=("/envs",))
    assert (env.environment, env.args, env.rollout_timeout) == ("vf_guess_number",
                                                                {"max_value": 2, "tasks": 64, "turns": 2}, 21.0)
    assert env.timeout == 21.0 + primeintellect.sampler.START_SECONDS


def test_a_missing_interpreter_is_refused_at_start(tmp_path: pathlib.Path) -> None:
    env = primeintellect.adapter.VerifiersEnvironment(environment="vf_guess_number", python=tmp_path / "no" / "python")
    with pytest.raises(primeintellect.adapter.EnvironmentUnavailable, match="make venv-envs"):
        env.check()


def test_the_launcher_names_the_missing_interpreter(monkeypatch: pytest.MonkeyPatch,
                                                    tmp_path: pathlib.Path) -> None:
    from kubeforge.runtime import config

    monkeypatch.setenv(primeintellect.adapter.ENV_PYTHON, str(tmp_path / "none"))
    problems = config.local_problems(_spec())
    assert len(problems) == 1 and problems[0].startswith("spec.environment.type: Invalid value: 'Verifiers'")
    assert config.local_problems(_spec(), role="verifier") == []
    monkeypatch.setenv(primeintellect.adapter.ENV_PYTHON, sys.executable)
    assert config.local_problems(_spec()) == []


# ---------------------------------------------------------------- the long-lived runner's answer reading

def _fake(script: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE)


@pytest.mark.parametrize("script,n,want", [
    ('print(\'{"a": 1}\'); print(\'{"end": true}\'); import time; time.sleep(30)', 1, ""),
    ('print(\'{"a": 1}\'); print(\'{"end": true}\')', 2, "env_garbage"),      # fewer lines than jobs
    ('print("not json")', 1, "env_garbage"),
    ('print("[1]")', 1, "env_garbage"),
    ('print(\'{"a": 1}\')', 1, "env_error"),                                 # exits before its end line
    ('import time; time.sleep(30)', 1, "env_timeout"),
    ('import sys; sys.stdout.write("x" * (2 << 20)); sys.stdout.flush(); import time; time.sleep(30)', 1,
     "env_garbage"),
])
def test_a_batch_answer_is_bounded(script: str, n: int, want: str) -> None:
    proc = _fake(script)
    try:
        lines, failure = primeintellect.adapter._read_answer(proc, n=n, timeout=3.0)
    finally:
        proc.kill()
        proc.wait()
    assert failure == want
    assert (lines == {0: {"a": 1}}) == (want == "")


@pytest.mark.slow
@needs_envs
def test_one_runner_process_serves_many_batches_and_a_bad_rollout_costs_its_episode() -> None:
    tok = _tok()
    ep = endpoint.server.Endpoint(sampler=ScriptedSampler(tok), chat=endpoint.chat.ChatTemplate(tok))
    env = primeintellect.adapter.VerifiersEnvironment(environment="vf_flaky", python=PYTHON,
                                                      paths=(str(pathlib.Path(__file__).with_name("vf_envs")),),
                                                      rollout_timeout=30, timeout=300)
    runner = primeintellect.adapter.RunnerProcess(env)
    try:
        first = runner.run_group(ep, [0, 1, 2, 0])
        second = runner.run_group(ep, [0, 0])
    finally:
        runner.close()
        ep.close()
    assert [(o.ok, o.finish_reason) for o in first] == [(True, "stop"), (False, "env_timeout"),
                                                       (False, "env_error"), (True, "stop")]
    assert [o.recording.calls for o in first] == [2, 1, 1, 2]
    assert [(o.ok, o.reward) for o in second] == [(True, 1.0), (True, 1.0)]
    assert runner.starts == 1 and ep.stats()["episodes_open"] == 0
