"""DAPO: the token-level mean over every completion token of the batch, with clip-higher.

Every token weighs the same, so long sequences contribute in proportion to their length. The asymmetric clip range
[1 - clipEpsilon, 1 + clipEpsilonHigh] (set through ``LossSettings.clip_high``) lets unlikely tokens grow more.
Denominator: the number of completion tokens.
"""
from __future__ import annotations

import torch

from kubeforge.runtime.grpo import inputs, surrogate


def denominator(*, mask: torch.Tensor) -> float:
    """The number of completion tokens (ones of ``mask``): additive over micro-batches and ranks."""
    return float(mask.sum().item())


def loss(*, batch: inputs.LossInputs, settings: inputs.LossSettings) -> inputs.LossOutput:
    """DAPO loss as the sum over all tokens; the denominator is the token count."""
    t = surrogate.token_terms(batch=batch, settings=settings)
    return inputs.LossOutput(total=t.loss.sum(), denominator=denominator(mask=batch.mask),
                             clip_fraction=t.clip_fraction, ratio_mean=t.ratio_mean, kl=t.kl, tokens=t.tokens)
