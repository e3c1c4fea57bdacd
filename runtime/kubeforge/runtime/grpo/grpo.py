"""GRPO (DeepSeekMath): per-sequence mean of the token losses, then the mean over sequences.

Every completion weighs the same whatever its length (so tokens of short completions weigh more).
Denominator: the number of sequences (completions) in the batch.
"""
from __future__ import annotations

import torch

from kubeforge.runtime.grpo import inputs, surrogate


def denominator(*, mask: torch.Tensor) -> float:
    """The number of sequences (rows of ``mask``): additive over micro-batches and ranks."""
    return float(mask.shape[0])


def loss(*, batch: inputs.LossInputs, settings: inputs.LossSettings) -> inputs.LossOutput:
    """GRPO loss as sum over sequences of (mean over that sequence's tokens)."""
    t = surrogate.token_terms(batch=batch, settings=settings)
    lengths = batch.mask.sum(dim=-1).clamp(min=1.0).to(t.loss.dtype)
    per_seq = t.loss.sum(dim=-1) / lengths
    return inputs.LossOutput(total=per_seq.sum(), denominator=denominator(mask=batch.mask),
                             clip_fraction=t.clip_fraction, ratio_mean=t.ratio_mean, kl=t.kl, tokens=t.tokens)
