"""The per-token PPO-style clipped surrogate shared by every loss variant.

``ratio = exp(logp - behaviour_logp)``: the importance ratio of the CURRENT policy against the policy the generator
actually sampled with (its logprobs travel with each completion). It is not ``exp(logp - logp.detach())`` (always 1,
no off-policy correction: torchforge's bug), so stale or off-policy rollouts are corrected and clipped.

Per token: ``loss = -min(ratio * A, clip(ratio, 1 - clip_low, 1 + clip_high) * A) + kl_coef * k3``.
With ``importance_cap`` C (TIS, ``mismatch``): ``ratio = exp(logp - logp.detach())`` (against the trainer's own
pre-update logprobs) and the first term is weighted by ``min(exp(logp_old - behaviour_logp), C)``. With the
sequence mask (``mismatch``), a masked completion's tokens have loss 0.
Neighbours: ``grpo``, ``drgrpo`` and ``dapo`` reduce :class:`TokenTerms.loss` differently.
"""
from __future__ import annotations

import dataclasses

import torch

from kubeforge.runtime.grpo import inputs, kl, mismatch


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
    lr = mismatch.log_ratio(logp=batch.logp, behaviour_logp=batch.behaviour_logp, mask=mask)
    if settings.importance_cap is None:
        ratio = torch.exp(batch.logp - batch.behaviour_logp.detach())
    else:       # TIS: the proximal policy is the trainer's own (value 1, gradient of logp)
        ratio = torch.exp(batch.logp - batch.logp.detach())
    clipped = torch.clamp(ratio, 1.0 - settings.clip_low, 1.0 + settings.clip_high)
    unclipped_obj = ratio * adv
    clipped_obj = clipped * adv
    loss = -torch.minimum(unclipped_obj, clipped_obj)
    if settings.importance_cap is not None:
        loss = loss * mismatch.tis_weight(log_ratio=lr, cap=settings.importance_cap)
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
    keep = mismatch.keep_of(log_ratio=lr, mask=mask, level=settings.mismatch_mask_level,
                            threshold=settings.mismatch_mask_threshold)
    if keep is not None:
        loss = loss * keep.unsqueeze(-1)
    return TokenTerms(loss=loss * mask, clip_fraction=clip_fraction, ratio_mean=ratio_mean, kl=kl_mean,
                      tokens=int(n))
