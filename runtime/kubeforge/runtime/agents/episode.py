"""One multi-turn episode as the trainer will see it, built turn by turn.

``token_ids`` holds every token after the first prompt: policy turns (exactly the ids vLLM sampled, with their
behaviour logprobs) and environment turns (the ids the engine was fed next, logprob 0.0) interleaved;
``policy_spans`` says which ranges the policy sampled. Two producers fill it through the same two methods: the
generator's episode runner (``runner``) and the OpenAI-compatible endpoint. ``completion()`` and ``stats()`` are
what goes into the ``types.RolloutGroup`` (``policy_spans``, ``episode_stats``). See docs/agents.md.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from kubeforge.runtime import types

ENDS = ("stop", "length", "max_turns", "max_tokens", "env_error", "env_timeout", "env_garbage", "env_flood",
        "env_lost", "agent_lost")


@dataclasses.dataclass(kw_only=True)
class Episode:
    """The record of one episode (mutable while it runs; ``finish_reason`` set once it ends)."""

    token_ids: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    policy_spans: tuple[tuple[int, int], ...] = ()
    turns: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    env_reward: float | None = None
    transcript: str = ""
    finish_reason: str = ""
    transcript_of_last_turn: str = ""    # the last policy turn's text (what the environment's step is given)

    @property
    def done(self) -> bool:
        return bool(self.finish_reason)

    def add_policy_turn(self, token_ids: Any, logprobs: Any, text: str) -> None:
        """Append what the policy sampled this turn (ids and their behaviour logprobs, one each)."""
        ids, lps = list(map(int, token_ids)), list(map(float, logprobs))
        if len(ids) != len(lps):
            raise ValueError(f"a policy turn of {len(ids)} tokens with {len(lps)} logprobs")
        start = len(self.token_ids)
        self.token_ids += ids
        self.logprobs += lps
        if ids:
            self.policy_spans += ((start, start + len(ids)),)
        self.turns += 1
        self.transcript += text
        self.transcript_of_last_turn = text

    def add_environment_turn(self, token_ids: Any, text: str) -> None:
        """Append the tokens the engine is fed for the environment's answer (logprob 0.0: not trained on)."""
        ids = list(map(int, token_ids))
        self.token_ids += ids
        self.logprobs += [0.0] * len(ids)
        self.transcript += text

    def finish(self, reason: str) -> None:
        if reason not in ENDS:
            raise ValueError(f"finish reason {reason!r}, expected one of {ENDS}")
        if not self.finish_reason:
            self.finish_reason = reason

    @property
    def policy_tokens(self) -> int:
        return sum(e - s for s, e in self.policy_spans)

    def completion(self) -> types.Completion:
        return types.Completion(token_ids=np.asarray(self.token_ids, dtype=np.int64),
                                logprobs=np.asarray(self.logprobs, dtype=np.float64), text=self.transcript,
                                finish_reason=self.finish_reason or "stop")

    def stats(self) -> types.EpisodeStats:
        return types.EpisodeStats(turns=self.turns, tool_calls=self.tool_calls, tool_errors=self.tool_errors,
                                  env_reward=self.env_reward)


def group(prompt: types.Prompt, prompt_token_ids: Any, episodes: list[Episode]) -> types.RolloutGroup:
    """The rollout group of ``episodes`` (one prompt's), ready for the loop to stamp and send."""
    return types.RolloutGroup(prompt=prompt, prompt_token_ids=prompt_token_ids,
                              completions=[e.completion() for e in episodes], policy_version=0,
                              policy_spans=tuple(e.policy_spans for e in episodes),
                              episode_stats=tuple(e.stats() for e in episodes))
