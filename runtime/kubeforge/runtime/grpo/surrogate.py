"""The per-token PPO-style clipped surrogate shared by every loss variant.

``ratio = exp(logp - behaviour_logp)``: the importance ratio of the CURRENT policy against the policy the generator
actually sampled with (its logprobs travel with each completion). It is not ``exp(logp - logp.detach())`` (always 1,
no off-policy correction: torchforge's bug), so stale or off-policy rollouts are corrected and clipped.

Per token: ``loss = -min(ratio * A, clip(ratio, 1 - clip_low, 1 + clip_high) * A) + kl_coef * k3``.
Neighbours: ``grpo``, ``drgrpo`` and ``dapo`` reduce :class:`TokenTerms.loss` differently.
"""
from __future__ import annotations

import dataclasses

import torch

from kubeforge.runtime.grpo import inputs, kl


@dataclasses.dataclass(frozen=True, kw_only=True)
class TokenTerms:
    """Per-token loss (masked to 0 on padding) and the batch's detached metrics."""

    loss: torch.Tensor              # [B, T]
    clip_fraction: float
    ratio_mean: float
    kl: float
    tokens: int


def token_terms(*, batch: inputs.LossInputs, settings: inputs.LossSettings) -> TokenTerms:
    """Per-token clipped surrogate (+ k3 KL when ``settings.kl_coef > 0``)."""
    mask = batch.mask.to(batch.logp.dtype)
    adv = batch.advantages.to(batch.logp.dtype).unsqueeze(-1)
    ratio = torch.exp(batch.logp - batch.behaviour_logp.detach())
    clipped = torch.clamp(ratio, 1.0 - settings.clip_low, 1.0 + settings.clip_high)
    unclipped_obj = ratio * adv
    clipped_obj = clipped * adv
    loss = -torch.minimum(unclipped_obj, clipped_obj)
    kl_mean = 0.0
    n = float(mask.sum().item())
    if settings.kl_coef > 0:
        if batch.ref_logp is None:
            raise ValueError("kl_coef > 0 needs ref_logp (a frozen reference model)")
        k = kl.k3(logp=batch.logp, ref_logp=batch.ref_logp)
        loss = loss + settings.kl_coef * k
        kl_mean = float((k.detach() * mask).sum().item()) / max(n, 1.0)
    with torch.no_grad():
        was_clipped = (clipped_obj < unclipped_obj).to(mask.dtype)
        clip_fraction = float((was_clipped * mask).sum().item()) / max(n, 1.0)
        ratio_mean = float((ratio * mask).sum().item()) / max(n, 1.0)
    return TokenTerms(loss=loss * mask, clip_fraction=clip_fraction, ratio_mean=ratio_mean, kl=kl_mean,
                      tokens=int(n))
