"""GSPO (Zheng et al. 2025, "Group Sequence Policy Optimization", arXiv 2507.18071): one importance ratio per
SEQUENCE, clipped per sequence, averaged over sequences.

With ``x`` the prompt, ``y_i`` completion i (``|y_i|`` tokens) and ``pi_old`` the policy that sampled it (its
behaviour logprobs travel with each completion)::

    s_i = (pi(y_i | x) / pi_old(y_i | x)) ** (1 / |y_i|) = exp(mean_t (logp_i,t - behaviour_logp_i,t))
    J   = mean_i min(s_i * A_i, clip(s_i, 1 - clip_low, 1 + clip_high) * A_i)          (loss = -J)

``A_i`` is the group-normalised advantage (as GRPO). The length normalisation keeps ``s_i`` in a narrow band,
so the paper's clip ranges are small (3e-4 below, 4e-4 above). Gradient (unclipped sequences): every token of
sequence i gets the same factor, ``d(s_i A_i)/d logp_i,t = A_i * s_i / |y_i|``: the tokens of a sequence are
weighted alike, unlike the token-level ratio of GRPO and DAPO (that is what makes it stable for MoE models,
whose per-token expert routing makes token ratios noisy). Clipped sequences give no gradient.

With ``kl_coef > 0`` each sequence's mean k3 KL is added (the paper has no KL term). Denominator: the number of
sequences. Metrics: ``clip_fraction`` and ``ratio_mean`` are token-weighted (every token of sequence i counts
``s_i`` and whether i was clipped), like the other variants'.
"""
from __future__ import annotations

import torch

from kubeforge.runtime.grpo import inputs, kl


def denominator(*, mask: torch.Tensor) -> float:
    """The number of sequences (rows of ``mask``): additive over micro-batches and ranks."""
    return float(mask.shape[0])


def sequence_ratio(*, logp: torch.Tensor, behaviour_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``s_i = exp(mean over sequence i's tokens of (logp - behaviour_logp))``, shape [B]; differentiable in
    ``logp``. An empty sequence gets 1."""
    mask = mask.to(logp.dtype)
    lengths = mask.sum(dim=-1).clamp(min=1.0)
    log_ratio = ((logp - behaviour_logp.detach()) * mask).sum(dim=-1) / lengths
    return torch.exp(log_ratio)


def loss(*, batch: inputs.LossInputs, settings: inputs.LossSettings) -> inputs.LossOutput:
    """GSPO loss as the sum over sequences of ``-min(s_i A_i, clip(s_i) A_i)`` (+ KL); the denominator is the
    sequence count."""
    mask = batch.mask.to(batch.logp.dtype)
    adv = batch.advantages.to(batch.logp.dtype)
    s = sequence_ratio(logp=batch.logp, behaviour_logp=batch.behaviour_logp, mask=mask)
    unclipped = s * adv
    clipped = torch.clamp(s, 1.0 - settings.clip_low, 1.0 + settings.clip_high) * adv
    per_seq = -torch.minimum(unclipped, clipped)
    lengths = mask.sum(dim=-1)
    n = float(lengths.sum().item())
    kl_mean = 0.0
    if settings.kl_coef > 0:
        if batch.ref_logp is None:
            raise ValueError("kl_coef > 0 needs ref_logp (a frozen reference model)")
        k = kl.k3(logp=batch.logp, ref_logp=batch.ref_logp) * mask
        per_seq = per_seq + settings.kl_coef * k.sum(dim=-1) / lengths.clamp(min=1.0)
        kl_mean = float(k.detach().sum().item()) / max(n, 1.0)
    with torch.no_grad():
        was_clipped = (clipped < unclipped).to(mask.dtype)
        clip_fraction = float((was_clipped * lengths).sum().item()) / max(n, 1.0)
        ratio_mean = float((s.detach() * lengths).sum().item()) / max(n, 1.0)
    return inputs.LossOutput(total=per_seq.sum(), denominator=denominator(mask=batch.mask),
                             clip_fraction=clip_fraction, ratio_mean=ratio_mean, kl=kl_mean, tokens=int(n))
