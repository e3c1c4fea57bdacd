"""Collate scored rollout groups into one padded token batch for a single forward pass.

Role: pure function from ``RolloutGroup``s (plain lists) to tensors. Neighbours: ``step.Trainer`` calls
:func:`collate`, then ``logprobs.completion_logprobs`` runs the model over ``Batch.input_ids``.

Layout (one row per completion): the prompt is LEFT-padded and the completion RIGHT-padded, so every completion
starts at the same column ``P`` (the longest prompt)::

    [pad pad p0 p1 p2 | c0 c1 c2 pad]      attention_mask 0 on pads
    [p0 p1 p2 p3 p4   | c0 pad pad pad]    position_ids restart at 0 on the first real token

Then the logits of the last ``T + 1`` positions predict all completion tokens (HF ``logits_to_keep``) and the LM
head never runs over prompt positions. Invariants: ``completion_mask`` marks real completion tokens;
``behaviour_logp`` is aligned with it; ``advantages`` has one entry per row.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch

from kubeforge.runtime import types
from kubeforge.runtime.grpo import advantages as adv


@dataclasses.dataclass(frozen=True, kw_only=True)
class Batch:
    input_ids: torch.Tensor          # [B, P + T] long
    attention_mask: torch.Tensor     # [B, P + T] long
    position_ids: torch.Tensor       # [B, P + T] long
    completion_ids: torch.Tensor     # [B, T] long (0 on padding)
    completion_mask: torch.Tensor    # [B, T] float32
    behaviour_logp: torch.Tensor     # [B, T] float32
    advantages: torch.Tensor         # [B] float32
    rewards: torch.Tensor            # [B] float32
    zero_signal_groups: int          # groups whose rewards are all equal (advantage 0 everywhere)

    @property
    def rows(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def completion_len(self) -> int:
        return int(self.completion_ids.shape[1])


def _check(groups: Sequence[types.RolloutGroup]) -> None:
    for g in groups:
        where = f"group of prompt {g.prompt.index}"
        if g.rewards is None or len(g.rewards) != len(g.completions):
            raise ValueError(f"{where}: rewards must hold one value per completion")
        if not g.prompt_token_ids:
            raise ValueError(f"{where}: prompt_token_ids is empty")
        for c in g.completions:
            if len(c.logprobs) != len(c.token_ids):
                raise ValueError(f"{where}: a completion has {len(c.token_ids)} tokens but {len(c.logprobs)} logprobs")


def collate(*, groups: Sequence[types.RolloutGroup], pad_id: int, scale_by_std: bool) -> Batch:
    """One padded batch of every completion of ``groups`` (see the module docstring for the layout)."""
    _check(groups)
    rewards = [list(g.rewards or []) for g in groups]
    advantages = adv.group_advantages(rewards=rewards, scale_by_std=scale_by_std)
    rows = [(g.prompt_token_ids, c) for g in groups for c in g.completions]
    p_len = max((len(p) for p, _ in rows), default=1)
    t_len = max((len(c.token_ids) for _, c in rows), default=0)
    t_len = max(t_len, 1)
    b = len(rows)
    input_ids = torch.full((b, p_len + t_len), pad_id, dtype=torch.long)
    attention = torch.zeros((b, p_len + t_len), dtype=torch.long)
    comp_ids = torch.zeros((b, t_len), dtype=torch.long)
    comp_mask = torch.zeros((b, t_len), dtype=torch.float32)
    behaviour = torch.zeros((b, t_len), dtype=torch.float32)
    for i, (prompt, c) in enumerate(rows):
        n = len(c.token_ids)
        input_ids[i, p_len - len(prompt):p_len] = torch.tensor(prompt, dtype=torch.long)
        attention[i, p_len - len(prompt):p_len + n] = 1
        if n:
            input_ids[i, p_len:p_len + n] = torch.tensor(c.token_ids, dtype=torch.long)
            comp_ids[i, :n] = torch.tensor(c.token_ids, dtype=torch.long)
            comp_mask[i, :n] = 1.0
            behaviour[i, :n] = torch.tensor(c.logprobs, dtype=torch.float32)
    positions = (attention.cumsum(dim=-1) - 1).clamp(min=0)
    zero = sum(1 for r in rewards if max(r) == min(r))
    return Batch(input_ids=input_ids, attention_mask=attention, position_ids=positions, completion_ids=comp_ids,
                 completion_mask=comp_mask, behaviour_logp=behaviour, advantages=advantages,
                 rewards=torch.tensor([x for r in rewards for x in r], dtype=torch.float32),
                 zero_signal_groups=zero)
