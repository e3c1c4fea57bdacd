"""Group-normalised advantages: every completion is compared with its siblings sampled for the same prompt.

Role: turns each scored group's rewards into one advantage per completion (the same value for all of its
tokens). Neighbours: the trainer's collate step calls :func:`group_advantages`; the loss variants consume the result.

- GRPO / DAPO: ``A_i = (r_i - mean(r)) / (std(r) + eps)``.
- DrGRPO (``scale_by_std=False``): ``A_i = r_i - mean(r)``; dividing by the std over-weights prompts that are
  nearly always solved or failed (Dr. GRPO's "question-level difficulty bias").

Convention: ``std`` is the population standard deviation of the group (divide by K, not K - 1), so a group of
rewards [0, 1] gets advantages [-1, +1] (up to eps). A group whose rewards are all equal gets advantages of 0:
it carries no learning signal (the trainer reports the share of such groups).
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

DEFAULT_EPS = 1e-4


def group_advantages(*, rewards: Sequence[Sequence[float]], scale_by_std: bool,
                     eps: float = DEFAULT_EPS) -> torch.Tensor:
    """Advantages of every completion, flattened group after group (float32, shape [sum of group sizes]).

    Groups may have different sizes; a group must hold at least one reward."""
    out: list[torch.Tensor] = []
    for i, group in enumerate(rewards):
        if len(group) == 0:
            raise ValueError(f"rewards[{i}]: a group needs at least one reward")
        r = torch.tensor(list(group), dtype=torch.float64)
        centred = r - r.mean()
        if scale_by_std:
            centred = centred / (r.std(unbiased=False) + eps)
        out.append(centred.to(torch.float32))
    if not out:
        return torch.zeros(0, dtype=torch.float32)
    return torch.cat(out)
