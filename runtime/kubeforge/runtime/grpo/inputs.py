"""The loss functions' inputs, settings and outputs: plain frozen dataclasses of tensors and numbers.

Neighbours: the trainer builds ``LossInputs`` from a forward pass and a collated batch; ``LossSettings.from_spec``
reads ``spec.algorithm``; every loss variant returns a ``LossOutput``.

Shapes: B completions (rows), T = longest completion in the batch (columns, right-padded). ``mask`` is 1.0 on real
completion tokens, 0.0 on padding; padded positions of the other tensors may hold anything finite.
"""
from __future__ import annotations

import dataclasses

import torch

from kubeforge.api import rljob


@dataclasses.dataclass(frozen=True, kw_only=True)
class LossInputs:
    """Per-token tensors of one batch of completions."""

    logp: torch.Tensor              # [B, T] current policy logprob of each completion token (carries the gradient)
    behaviour_logp: torch.Tensor    # [B, T] logprob the generator sampled the token with (no gradient)
    mask: torch.Tensor              # [B, T] float, 1 on completion tokens
    advantages: torch.Tensor        # [B] one advantage per completion
    ref_logp: torch.Tensor | None = None  # [B, T] frozen reference model's logprob; needed when kl_coef > 0


@dataclasses.dataclass(frozen=True, kw_only=True)
class LossSettings:
    """Knobs shared by every variant. The ratio is clipped to [1 - clip_low, 1 + clip_high]."""

    clip_low: float = 0.2
    clip_high: float = 0.2
    kl_coef: float = 0.0
    max_tokens: int = 1             # DrGRPO's constant normaliser: the generation budget (maxNewTokens)
    importance_cap: float | None = None          # TIS cap C (grpo/mismatch.py); None: off
    mismatch_mask_level: str | None = None       # "Mean" | "Max" (grpo/mismatch.py); None: off
    mismatch_mask_threshold: float | None = None  # |log ratio| above which a completion is masked; None: off

    def __post_init__(self) -> None:
        if self.clip_low <= 0 or self.clip_high <= 0:
            raise ValueError("clip_low and clip_high must be > 0")
        if self.kl_coef < 0:
            raise ValueError("kl_coef must be >= 0")
        if self.max_tokens < 1:
            raise ValueError("max_tokens must be >= 1")
        if self.importance_cap is not None and self.importance_cap < 1:
            raise ValueError("importance_cap must be >= 1")
        if self.mismatch_mask_threshold is not None and self.mismatch_mask_threshold <= 0:
            raise ValueError("mismatch_mask_threshold must be > 0")

    @classmethod
    def from_spec(cls, algorithm: rljob.AlgorithmSpec) -> LossSettings:
        """Settings from ``spec.algorithm``; ``clipEpsilonHigh`` defaults to ``clipEpsilon`` (symmetric clip)."""
        high = algorithm.clip_epsilon_high if algorithm.clip_epsilon_high is not None else algorithm.clip_epsilon
        mask = algorithm.mismatch_mask
        return cls(clip_low=algorithm.clip_epsilon, clip_high=high, kl_coef=algorithm.kl_coef,
                   max_tokens=algorithm.max_new_tokens, importance_cap=algorithm.importance_cap,
                   mismatch_mask_level=str(getattr(mask.level, "value", mask.level)) if mask else None,
                   mismatch_mask_threshold=mask.threshold if mask else None)


@dataclasses.dataclass(frozen=True, kw_only=True)
class LossOutput:
    """A loss as ``total / denominator``, plus detached per-token metrics of the batch.

    ``total`` carries the gradient. ``denominator`` counts sequences (GRPO, DrGRPO) or tokens (DAPO); with data
    parallelism the trainer all-reduces it before dividing, which makes N ranks equal one big batch."""

    total: torch.Tensor             # scalar, differentiable
    denominator: float
    clip_fraction: float            # share of tokens whose clipped term won (gradient zero through the ratio)
    ratio_mean: float               # mean importance ratio over tokens
    kl: float                       # mean k3 KL over tokens (0 when no reference)
    tokens: int

    @property
    def loss(self) -> torch.Tensor:
        """The loss of this batch alone (what a single rank would minimise)."""
        return self.total / max(self.denominator, 1.0)
