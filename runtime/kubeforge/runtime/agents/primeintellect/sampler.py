"""The generator's sampler for ``spec.environment.type: Verifiers``: a ``verifiers``-library agent drives each
episode through the endpoint in front of this generator's engine; the endpoint's recordings become the groups.

```
 WORK(prompts) ─▶ sample: groupSize episodes per prompt (task = the prompt's index in the job's stream)
      ─▶ adapter.run_group ─▶ runner process (envs interpreter) ─▶ the library's rollouts
                                          └─ each model call ─▶ endpoint (127.0.0.1) ─▶ VllmSampler ─▶ engine
      ◀─ Outcome per episode: the library's reward + the endpoint's Recording
      ─▶ Branch.replay into agents.episode.Episode ─▶ episode.group: policy_spans, episode_stats (env reward)
```

Neighbours: ``generator.start`` builds it (:func:`from_role`) instead of ``agents.runner.EpisodeSampler``; the
records, groups and figures (``runner.Stats``) are the built-in runner's, so the verifier and the trainer see the
same groups from either producer (docs/agents.md).

Invariants:
- A group's completions share its prompt ids: an episode whose final branch starts from another prompt (the agent
  rewrote the first message, or a different task) is dropped to an empty completion with ``env_garbage``, since
  the trainer would otherwise score its tokens against the wrong prompt.
- Bounds: ``maxTurns`` is the endpoint's calls per episode (the next call is refused: ``max_turns``),
  ``maxTokensPerEpisode`` its token budget and ``maxNewTokens`` its tokens per call (``max_tokens``); each rollout
  has ``maxTurns x turnTimeoutSeconds`` (cancelled past it: ``env_timeout``, that episode only); a batch's answer
  from the runner process (long-lived: ``adapter.RunnerProcess``) that plus ``START_SECONDS`` (past it the
  process is killed, the batch's episodes fail, the next batch starts a fresh one). A failed episode keeps the tokens it sampled and gets no environment reward.
- The engine is only sampled while ``sample`` runs (the loop's thread waits in it), so a weight sync, which the loop
  does between batches, never meets a request in flight.
"""
from __future__ import annotations

import dataclasses
import pathlib
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from kubeforge.api import rljob
from kubeforge.runtime import infra, metrics as kf_metrics
from kubeforge.runtime import types
from kubeforge.runtime.agents import endpoint, episode, runner
from kubeforge.runtime.agents.primeintellect import adapter

START_SECONDS = 120.0     # the runner's own start (the library's import) on loaded CPUs
BOUND_REASONS = {"episode_call_limit": "max_turns", "episode_token_budget": "max_tokens",
                 "context_length_exceeded": "max_tokens"}


class GroupRunner(Protocol):
    """Runs one rollout per task through the endpoint (``adapter``: a one-shot process or a long-lived one)."""

    def run_group(self, ep: endpoint.server.Endpoint, tasks: Sequence[Any]) -> list[adapter.Outcome]: ...


@dataclasses.dataclass(frozen=True, kw_only=True)
class Bounds:
    """The endpoint's and the runner's limits from ``spec.environment`` and ``spec.algorithm``."""

    max_turns: int
    max_tokens_per_call: int
    max_episode_tokens: int
    rollout_seconds: float

    @classmethod
    def of(cls, env: rljob.EnvironmentSpec, algorithm: rljob.AlgorithmSpec) -> Bounds:
        return cls(max_turns=env.max_turns, max_tokens_per_call=algorithm.max_new_tokens,
                   max_episode_tokens=env.episode_tokens(algorithm.max_new_tokens),
                   rollout_seconds=env.max_turns * env.turn_timeout_seconds)

    def endpoint_config(self, *, turn_seconds: float) -> endpoint.server.EndpointConfig:
        # max_in_flight: every rollout of a batch may call at once (the sampler batches them)
        return endpoint.server.EndpointConfig(max_tokens_per_call=self.max_tokens_per_call,
                                              max_episode_tokens=self.max_episode_tokens,
                                              max_calls_per_episode=self.max_turns, request_timeout=turn_seconds,
                                              max_in_flight=4096)


class VerifiersSampler:
    """``generator.loop.Sampler`` for ``type: Verifiers`` (see the module docstring)."""

    def __init__(self, *, endpoint: endpoint.server.Endpoint, environment: GroupRunner,
                 group_size: int, fallback_prompt: Callable[[types.Prompt], tuple[int, ...]],
                 on_sampled: Callable[[runner.Stats], None] | None = None,
                 close: Callable[[], None] = lambda: None,
                 task_of: Callable[[types.Prompt], Any] = lambda p: p.index, label: str = "verifiers") -> None:
        self.endpoint, self.environment, self.group_size = endpoint, environment, group_size
        self.fallback_prompt = fallback_prompt    # prompt ids of a group none of whose episodes called the model
        self.on_sampled = on_sampled
        self.stats = runner.Stats()
        self.outcomes: list[adapter.Outcome] = []    # the last batch's (tests read them)
        self._close = close
        self.task_of, self.label = task_of, label     # what a runner gets per episode; the log line's name

    def sample(self, prompts: Sequence[types.Prompt]) -> list[types.RolloutGroup]:
        n = self.group_size
        started = time.monotonic()
        self.outcomes = self.environment.run_group(self.endpoint, [self.task_of(p) for p in prompts for _ in range(n)])
        ok = sum(o.ok for o in self.outcomes)
        print(f"{self.label}: {len(self.outcomes)} rollouts in {time.monotonic() - started:.1f} s, {ok} ok, "
              f"endpoint {self.endpoint.stats()}", file=sys.stderr, flush=True)
        groups = [self._group(p, self.outcomes[g * n:(g + 1) * n]) for g, p in enumerate(prompts)]
        if self.on_sampled is not None:
            self.on_sampled(self.stats.drain())
        return groups

    def _group(self, prompt: types.Prompt, outcomes: Sequence[adapter.Outcome]) -> types.RolloutGroup:
        finals = [o.recording.final for o in outcomes]
        prompt_ids = next((b.prompt_ids for o, b in zip(outcomes, finals) if o.ok and b is not None and b.calls),
                          None) or next((b.prompt_ids for b in finals if b is not None and b.calls), None) \
            or self.fallback_prompt(prompt)
        eps = [self._episode(o, b, prompt_ids) for o, b in zip(outcomes, finals)]
        for ep in eps:
            self.stats.episodes.append(ep.stats())
            self.stats.masked_tokens += len(ep.token_ids) - ep.policy_tokens
        return episode.group(prompt, list(prompt_ids), eps)

    def _episode(self, o: adapter.Outcome, branch: endpoint.record.Branch | None,
                 prompt_ids: tuple[int, ...]) -> episode.Episode:
        ep = episode.Episode()
        if branch is not None and branch.calls and branch.prompt_ids != prompt_ids:
            self._fail(ep, "env_garbage")          # another prompt than the group's: its tokens cannot be trained
            return ep
        if branch is not None:
            branch.replay(ep)
        ep.tool_calls = o.tool_calls
        bound = next((BOUND_REASONS[c] for c in o.recording.refused if c in BOUND_REASONS), None)
        if o.ok or (bound is not None and o.finish_reason != "env_timeout"):
            ep.env_reward = o.reward
            ep.finish(bound or "stop")
        else:
            self._fail(ep, o.finish_reason)
        return ep

    def _fail(self, ep: episode.Episode, kind: str) -> None:
        ep.finish(kind)
        (self.stats.lost if kind in infra.ENDS else self.stats.failures)[kind] += 1

    def close(self) -> None:
        self._close()


def fallback_prompt(engine: Any, spec: rljob.RLJobSpec) -> Callable[[types.Prompt], tuple[int, ...]]:
    """The prompt ids of a group none of whose episodes called the model: the prompt as a user message."""
    from kubeforge.runtime.agents import chat

    def ids(p: types.Prompt) -> tuple[int, ...]:
        out = chat.start_ids(engine.tokenizer, [{"role": "user", "content": p.text}],
                             chat_template=spec.task.chat_template)
        return tuple(int(i) for i in out)

    return ids


def environment(spec: rljob.EnvironmentSpec, *, python: pathlib.Path | None = None,
                paths: tuple[str, ...] | None = None) -> adapter.VerifiersEnvironment:
    """The adapter for ``spec.environment`` (type Verifiers): its module, args and time bounds."""
    assert spec.verifiers is not None
    rollout = spec.max_turns * spec.turn_timeout_seconds
    return adapter.VerifiersEnvironment(
        environment=spec.verifiers.environment, args=dict(spec.verifiers.args),
        python=python or adapter.default_python(), paths=adapter.default_paths() if paths is None else paths,
        rollout_timeout=rollout, timeout=rollout + START_SECONDS)


def from_engine(engine: Any, *, spec: rljob.RLJobSpec, on_sampled: Callable[[runner.Stats], None] | None = None,
                audit: bool = False, check: bool = True, env: adapter.VerifiersEnvironment | None = None,
                metrics: kf_metrics.Metrics | None = None) -> VerifiersSampler:
    """The sampler over a ``generator.engine.Engine``: the environment checked (``check``), then the endpoint on
    loopback in front of the engine, counting into ``metrics`` (the role's: the pod's /metrics serves the
    endpoint's series). ``audit`` keeps vLLM's own outputs (tests)."""
    assert spec.environment is not None
    env = env or environment(spec.environment)
    if check:
        env.check()
    algo = spec.algorithm
    vllm = endpoint.sampler.VllmSampler(engine, policy=endpoint.sampler.Policy(
        temperature=algo.temperature, top_p=algo.top_p, top_k=algo.top_k), audit=audit,
        queue_size=max(endpoint.sampler.DEFAULT_QUEUE, algo.prompts_per_step * algo.group_size))
    bounds = Bounds.of(spec.environment, algo)
    ep = endpoint.server.Endpoint(sampler=vllm, chat=endpoint.chat.ChatTemplate(engine.tokenizer),
                                  config=bounds.endpoint_config(turn_seconds=spec.environment.turn_timeout_seconds),
                                  metrics=metrics)

    process = adapter.RunnerProcess(env)

    def close() -> None:
        process.close()
        ep.close()
        vllm.close()

    return VerifiersSampler(endpoint=ep, environment=process, group_size=algo.group_size,
                            fallback_prompt=fallback_prompt(engine, spec),
                            on_sampled=on_sampled, close=close)

