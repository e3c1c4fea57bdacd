"""Collate scored rollout groups into padded token batches: one for the whole step, or micro-batches by tokens.

Role: pure functions from ``RolloutGroup``s (plain lists) to tensors. Neighbours: ``step.Trainer`` calls
:func:`collate` (the whole step: rewards, denominators) and :func:`micro_batches` (what each forward pass runs),
then ``policy.Policy`` runs the model over ``Batch.input_ids``.

Micro-batches: rows are ordered by length (longest first) and packed greedily while
``rows x (longest prompt + longest completion)`` stays within the token budget; a row longer than the budget
runs alone. Every row lands in exactly one micro-batch with the advantage of its whole group.

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

import numpy as np
import torch

from kubeforge.runtime import types
from kubeforge.runtime.grpo import advantages as adv
from kubeforge.runtime.grpo import overlong as overlong_mod
from kubeforge.runtime.learner import staleness


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
        if len(g.prompt_token_ids) == 0:
            raise ValueError(f"{where}: prompt_token_ids is empty")
        for c in g.completions:
            if len(c.logprobs) != len(c.token_ids):
                raise ValueError(f"{where}: a completion has {len(c.token_ids)} tokens but {len(c.logprobs)} logprobs")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Row:
    """One completion with its prompt, advantage and reward."""

    prompt: types.Tokens
    completion: types.Completion
    advantage: float
    reward: float
    keep: np.ndarray | None = None   # 1 per token trained on; 0 masked: stale (learner.staleness) or environment token

    @property
    def tokens(self) -> int:
        return len(self.prompt) + max(len(self.completion.token_ids), 1)


def rows_of(*, groups: Sequence[types.RolloutGroup], scale_by_std: bool,
            overlong: overlong_mod.Overlong | None = None, min_version: int | None = None) -> list[Row]:
    """Every completion of ``groups`` as a row, group after group, with its group-normalised advantage (of the
    rewards plus DAPO's overlong penalty when ``overlong`` is given; ``Row.reward`` stays the verifiers'); tokens
    sampled under a version below ``min_version`` (partial rollouts) are masked out (``learner.staleness``), and so
    are an episode's environment tokens (``types.policy_mask``: in the context, never in the loss)."""
    _check(groups)
    rewards = [overlong_mod.shaped_rewards(g, overlong) for g in groups]
    advantages = adv.group_advantages(rewards=rewards, scale_by_std=scale_by_std).tolist()
    pairs = [(g.prompt_token_ids, c, r) for g in groups for c, r in zip(g.completions, g.rewards or [])]
    keeps = [_both(k, types.policy_mask(g, i)) for k, (g, i) in
             zip(staleness.keep_masks(groups, min_version=min_version),
                 ((g, i) for g in groups for i in range(len(g.completions))))]
    return [Row(prompt=p, completion=c, advantage=float(a), reward=float(r), keep=k)
            for (p, c, r), a, k in zip(pairs, advantages, keeps)]


def _both(keep: np.ndarray | None, policy: np.ndarray | None) -> np.ndarray | None:
    """The loss mask of one completion: not stale (partial rollouts) and sampled by the policy (episodes: environment
    tokens stay in the context, out of the loss)."""
    if policy is None:
        return keep
    return policy if keep is None else keep * policy


def collate(*, groups: Sequence[types.RolloutGroup], pad_id: int, scale_by_std: bool,
            min_version: int | None = None) -> Batch:
    """One padded batch of every completion of ``groups`` (see the module docstring for the layout)."""
    rows = rows_of(groups=groups, scale_by_std=scale_by_std, min_version=min_version)
    zero = sum(1 for g in groups if max(g.rewards or [0.0]) == min(g.rewards or [0.0]))
    return collate_rows(rows=rows, pad_id=pad_id, zero_signal_groups=zero)


def micro_batches(*, rows: Sequence[Row], pad_id: int, max_tokens: int | None) -> list[Batch]:
    """``rows`` packed into padded batches of at most ``max_tokens`` tokens each (None: one batch)."""
    if not rows:
        return []
    if max_tokens is None:
        return [collate_rows(rows=rows, pad_id=pad_id)]
    ordered = sorted(rows, key=lambda r: (len(r.prompt), len(r.completion.token_ids)), reverse=True)
    out: list[Batch] = []
    chunk: list[Row] = []
    p_max = t_max = 0
    for r in ordered:
        p, t = max(p_max, len(r.prompt)), max(t_max, len(r.completion.token_ids), 1)
        if chunk and (len(chunk) + 1) * (p + t) > max_tokens:
            out.append(collate_rows(rows=chunk, pad_id=pad_id))
            chunk, p, t = [], len(r.prompt), max(len(r.completion.token_ids), 1)
        chunk.append(r)
        p_max, t_max = p, t
    out.append(collate_rows(rows=chunk, pad_id=pad_id))
    return out


def collate_rows(*, rows: Sequence[Row], pad_id: int, zero_signal_groups: int = 0) -> Batch:
    """One padded batch of ``rows`` (see the module docstring for the layout)."""
    p_len = max((len(r.prompt) for r in rows), default=1)
    t_len = max((len(r.completion.token_ids) for r in rows), default=0)
    t_len = max(t_len, 1)
    b = len(rows)
    input_ids = torch.full((b, p_len + t_len), pad_id, dtype=torch.long)
    attention = torch.zeros((b, p_len + t_len), dtype=torch.long)
    comp_ids = torch.zeros((b, t_len), dtype=torch.long)
    comp_mask = torch.zeros((b, t_len), dtype=torch.float32)
    behaviour = torch.zeros((b, t_len), dtype=torch.float32)
    for i, row in enumerate(rows):
        prompt, c = row.prompt, row.completion
        n = len(c.token_ids)
        input_ids[i, p_len - len(prompt):p_len] = _long(prompt)
        attention[i, p_len - len(prompt):p_len + n] = 1
        if n:   # the packed arrays go to tensors in one vectorised copy each (no Python object per token)
            ids = _long(c.token_ids)
            input_ids[i, p_len:p_len + n] = ids
            comp_ids[i, :n] = ids
            comp_mask[i, :n] = 1.0 if row.keep is None else torch.from_numpy(row.keep.astype(np.float32))
            behaviour[i, :n] = torch.from_numpy(np.asarray(c.logprobs, dtype=np.float32))
    positions = (attention.cumsum(dim=-1) - 1).clamp(min=0)
    return Batch(input_ids=input_ids, attention_mask=attention, position_ids=positions, completion_ids=comp_ids,
                 completion_mask=comp_mask, behaviour_logp=behaviour,
                 advantages=torch.tensor([r.advantage for r in rows], dtype=torch.float32),
                 rewards=torch.tensor([r.reward for r in rows], dtype=torch.float32),
                 zero_signal_groups=zero_signal_groups)


def _long(ids: types.Tokens) -> torch.Tensor:
    """Token ids (a packed uint32 array, or any int sequence) as an int64 tensor."""
    return torch.from_numpy(np.asarray(ids, dtype=np.int64))
