"""The episode runner: ``groupSize`` episodes per prompt, every episode of a batch batched per turn through vLLM.

```
 prompts ─▶ host.reset (one environment per episode) ─▶ chat.start_ids (the group's prompt ids)
   turn 1..maxTurns:  active episodes ─▶ engine.sample_turns (ONE batched vLLM call: prompt + episode so far)
                      ─▶ Episode.add_policy_turn ─▶ host.step (side by side) ─▶ done? reward, end
                      ─▶ else chat.delta (only the new messages' ids) ─▶ Episode.add_environment_turn
 ─▶ episode.group(...) per prompt: completions = episodes, policy_spans, episode_stats
```

An episode ends when its environment says done (``stop``), after ``maxTurns`` policy turns (``max_turns``), when the
next turn would pass ``maxTokensPerEpisode`` or the model's context (``max_tokens``), or when its environment fails
(``host.FAILURES``: counted by kind in ``stats``; the other episodes go on). An episode lost with its environment's
server (``env_lost``, ``infra.ENDS``) is counted apart (``stats.lost``): a pod was lost, the policy did nothing wrong,
and its group is kept out of training downstream (``infra``). With ``toolFormat: Native``
(``native``) the tools are rendered by the model's template, each turn is read in its tool-call format before the
environment steps (a turn whose markup does not parse counts as a tool error) and the answers go back as ``tool``
messages; the sampled ids are the same either way. Neighbours: ``generator.start`` builds
it as the loop's ``Sampler`` when ``spec.environment`` is set; ``host`` runs the steps; ``episode`` is the record.
"""
from __future__ import annotations

import collections
import dataclasses
import itertools
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from kubeforge.api import rljob
from kubeforge.runtime import infra, types
from kubeforge.runtime.agents import chat, episode, native
from kubeforge.runtime.agents.hosts import host as host_mod
from kubeforge.runtime.agents.envs import registry
from kubeforge.runtime.agents.toolcalls import choice as tool_choice

SEED_STRIDE = 1009


class TurnEngine(Protocol):
    tokenizer: Any

    def sample_turns(self, contexts: Sequence[Sequence[int]], *, max_tokens: Sequence[int], seeds: Sequence[int],
                     stop: Sequence[str]) -> list[types.Completion]:
        """One policy turn per context (token ids), each with its behaviour logprobs, in one batched call."""


@dataclasses.dataclass
class Stats:
    """What the runner saw since the metrics last drained it."""

    failures: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)  # the environment's
    lost: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)  # infrastructure (infra)
    step_seconds: list[float] = dataclasses.field(default_factory=list)
    episodes: list[types.EpisodeStats] = dataclasses.field(default_factory=list)
    masked_tokens: int = 0

    def drain(self) -> Stats:
        out = dataclasses.replace(self)
        self.failures, self.step_seconds, self.episodes, self.masked_tokens = collections.Counter(), [], [], 0
        self.lost = collections.Counter()
        return out


class EpisodeSampler:
    """``generator.loop.Sampler`` for jobs with ``spec.environment`` (see the module docstring)."""

    def __init__(self, *, engine: TurnEngine, host: host_mod.EnvironmentHost, spec: rljob.EnvironmentSpec,
                 algorithm: rljob.AlgorithmSpec, chat_template: bool, seed: int, max_context: int,
                 on_sampled: Callable[[Stats], None] | None = None) -> None:
        self.engine, self.host, self.spec, self.algo = engine, host, spec, algorithm
        self.chat_template, self.seed, self.max_context = chat_template, seed, max_context
        kind = registry.kind(spec)
        self.native = native.Native(tokenizer=engine.tokenizer, tools=kind.tools, chat_template=chat_template) \
            if spec.tool_format == rljob.ToolFormat.NATIVE.value else None
        self.render: dict[str, Any] = self.native.render() if self.native is not None else {}
        self.stop = self.native.format.stop if self.native is not None else kind.stop
        self.budget = spec.episode_tokens(algorithm.max_new_tokens)
        self.eos = getattr(engine.tokenizer, "eos_token_id", None)
        self.ids = itertools.count()
        self.calls = 0
        self.stats = Stats()
        self.on_sampled = on_sampled      # gets each batch's figures (the metrics); None: they accumulate in stats

    def sample(self, prompts: Sequence[types.Prompt]) -> list[types.RolloutGroup]:
        self.calls += 1
        n = self.algo.group_size
        eps = [episode.Episode() for _ in range(len(prompts) * n)]
        ids = [next(self.ids) for _ in eps]
        starts = self._start(prompts, eps, ids)
        try:
            for turn in range(self.spec.max_turns):
                active = [k for k, ep in enumerate(eps) if not ep.done]
                if not active:
                    break
                self._turn(turn, active, eps, ids, starts)
        finally:
            self.host.close(ids)
        for ep in eps:
            ep.finish("max_turns")                       # a no-op for every episode that ended already
            self.stats.episodes.append(ep.stats())
            self.stats.masked_tokens += len(ep.token_ids) - ep.policy_tokens
        if self.on_sampled is not None:
            self.on_sampled(self.stats.drain())
        return [episode.group(p, starts[g][1], eps[g * n:(g + 1) * n]) for g, p in enumerate(prompts)]

    def _start(self, prompts: Sequence[types.Prompt], eps: list[episode.Episode],
               ids: list[int]) -> list[tuple[list[dict[str, Any]], list[int]]]:
        """Each group's start messages and prompt ids (its first episode's); an episode whose reset failed or
        differs from its group's ends at once."""
        n = self.algo.group_size
        replies = self.host.reset([(ids[k], prompts[k // n]) for k in range(len(eps))])
        out = []
        for g, p in enumerate(prompts):
            mine = replies[g * n:(g + 1) * n]
            first = next((r.messages for r in mine if not r.failure and r.messages), None)
            msgs = first or [{"role": "user", "content": p.text}]
            shown = self.native.start(msgs) if self.native is not None else msgs
            out.append((shown, chat.start_ids(self.engine.tokenizer, shown, chat_template=self.chat_template,
                                              **self.render)))
            for k, r in enumerate(mine):
                if r.failure or r.messages != msgs:
                    self._fail(eps[g * n + k], r.failure or host_mod.GARBAGE)
        return out

    def _turn(self, turn: int, active: list[int], eps: list[episode.Episode], ids: list[int],
              starts: list[tuple[list[dict[str, Any]], list[int]]]) -> None:
        n = self.algo.group_size
        contexts = [starts[k // n][1] + eps[k].token_ids for k in active]
        limits = [min(self.algo.max_new_tokens, self.budget - len(eps[k].token_ids),
                      self.max_context - len(c)) for k, c in zip(active, contexts)]
        go = [(k, c, m) for k, c, m in zip(active, contexts, limits) if m > 0]
        for k, _, m in zip(active, contexts, limits):
            if m <= 0:
                eps[k].finish("max_tokens")
        if not go:
            return
        seeds = [self.seed * SEED_STRIDE * SEED_STRIDE + (self.calls * 65536 + ids[k]) * SEED_STRIDE + turn
                 for k, _, _ in go]
        turns = self.engine.sample_turns([c for _, c, _ in go], max_tokens=[m for _, _, m in go],
                                         seeds=[s % (1 << 62) for s in seeds], stop=self.stop)
        for (k, _, _), t in zip(go, turns):
            eps[k].add_policy_turn(t.token_ids, t.logprobs, t.text)
        stepping = [k for k, _, _ in go]
        calls = {k: self._read(eps[k]) for k in stepping} if self.native is not None else {}
        texts = [native.Native.step_text(calls[k]) if calls else eps[k].transcript_of_last_turn for k in stepping]
        replies = self.host.step([(ids[k], text) for k, text in zip(stepping, texts)])
        last = turn == self.spec.max_turns - 1
        for k, t, r in zip(stepping, turns, replies):
            self.stats.step_seconds.append(r.seconds)
            answered = [c.openai() for c in calls[k].calls] if calls else []
            self._answer(eps[k], t, r, start=starts[k // n][0], last=last, calls=answered)

    def _read(self, ep: episode.Episode) -> tool_choice.Reply:
        """A native turn read for calls (``toolcalls.choice.Reply``); markup that does not parse is a tool error."""
        assert self.native is not None
        got = self.native.read(ep.transcript_of_last_turn)
        if got.outcome == tool_choice.MALFORMED:
            ep.tool_errors += 1
        return got

    def _answer(self, ep: episode.Episode, turn: types.Completion, r: host_mod.Reply, *,
                start: list[dict[str, Any]], last: bool, calls: list[dict[str, Any]]) -> None:
        if r.failure:
            self._fail(ep, r.failure)
            return
        res = r.result
        assert res is not None and isinstance(res.observation, list)
        ep.tool_calls += res.tool_calls
        ep.tool_errors += res.tool_errors
        if res.reward is not None:
            ep.env_reward = res.reward
        if res.done:
            ep.finish("stop")
            return
        if last:
            ep.finish("max_turns")
            return
        ended = len(turn.token_ids) > 0 and self.eos is not None and int(turn.token_ids[-1]) == self.eos
        observation = native.Native.answers(res.observation, calls) if self.native is not None else res.observation
        ids, text = chat.delta(self.engine.tokenizer, start, observation, ended_with_eos=ended,
                               chat_template=self.chat_template, **self.render)
        if len(ep.token_ids) + len(ids) >= self.budget:
            ep.finish("max_tokens")
            return
        ep.add_environment_turn(ids, text)

    def _fail(self, ep: episode.Episode, kind: str) -> None:
        ep.finish(kind)
        (self.stats.lost if kind in infra.ENDS else self.stats.failures)[kind] += 1
