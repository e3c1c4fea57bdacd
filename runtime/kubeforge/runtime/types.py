"""Plain data carried between the roles: prompts out, rollout groups back, scores added, then training.

Neighbours: ``wire`` encodes/decodes these (msgpack, versioned); ``generator`` fills ``Completion``s;
``verifiers`` fill ``RolloutGroup.rewards``/``scores``; ``trainer`` consumes scored groups. No torch here: these
cross process boundaries as plain lists.

Invariants: every completion carries its behaviour logprobs (one per generated token, under the policy version the
group was sampled with), so the trainer can compute clipped importance ratios and bound staleness.
"""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True, kw_only=True)
class Prompt:
    """One task item: what the model sees and the reference answer the verifiers compare against."""

    index: int               # position in the job's prompt stream (the data cursor counts these)
    text: str                # the prompt as given to the model (chat template applied by the generator)
    answer: str              # reference answer


@dataclasses.dataclass(frozen=True, kw_only=True)
class Completion:
    """One sampled completion with its behaviour logprobs."""

    token_ids: list[int]
    logprobs: list[float]    # behaviour logprob of each token in token_ids
    text: str
    finish_reason: str = ""


@dataclasses.dataclass(kw_only=True)
class RolloutGroup:
    """``groupSize`` completions of one prompt, sampled under one policy version; scored by the verifier."""

    prompt: Prompt
    prompt_token_ids: list[int]
    completions: list[Completion]
    policy_version: int                      # version of the weights the completions were sampled with
    step: int = 0                            # optimizer step this group was requested for
    generator: int = 0                       # replica index of the generator that sampled it
    rewards: list[float] | None = None       # one per completion, set by the verifier
    scores: dict[str, list[float]] = dataclasses.field(default_factory=dict)  # per verifier name
