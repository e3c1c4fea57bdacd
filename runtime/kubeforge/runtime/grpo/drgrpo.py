"""Dr. GRPO ("GRPO done right"): each sequence's token losses are summed and divided by a CONSTANT, the
generation budget ``maxNewTokens`` (not by the sequence's own length), then averaged over sequences.

This removes GRPO's length bias (long wrong answers are not penalised less per token). Pair it with
``advantages.group_advantages(scale_by_std=False)``: Dr. GRPO also drops the std normalisation.
Denominator: the number of sequences.
"""
from __future__ import annotations

import torch

from kubeforge.runtime.grpo import inputs, surrogate


def denominator(*, mask: torch.Tensor) -> float:
    """The number of sequences (rows of ``mask``): additive over micro-batches and ranks."""
    return float(mask.shape[0])


def loss(*, batch: inputs.LossInputs, settings: inputs.LossSettings) -> inputs.LossOutput:
    """Dr. GRPO loss as sum over sequences of (sum over tokens / max_tokens)."""
    t = surrogate.token_terms(batch=batch, settings=settings)
    per_seq = t.loss.sum(dim=-1) / float(settings.max_tokens)
    return inputs.LossOutput(total=per_seq.sum(), denominator=denominator(mask=batch.mask),
                             clip_fraction=t.clip_fraction, ratio_mean=t.ratio_mean, kl=t.kl, tokens=t.tokens)
