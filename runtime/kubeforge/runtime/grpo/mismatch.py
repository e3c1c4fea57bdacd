"""The trainer–sampler logprob mismatch: measured per step, and two optional corrections.

``log_ratio = logp_trainer - logp_behaviour`` per token, where ``logp_trainer`` is the trainer's logprob of the
token before the step's update (the forward of the step's micro-batches runs on the pre-update weights: the
optimizer steps once, after every micro-batch) and ``logp_behaviour`` the generator's (vLLM's processed logprob). At
policy lag 0 the two differ by numerics only (kernels, dtypes); with lag > 0 the difference also holds the policy's
change since the rollout was sampled.

Measured (:func:`stats`, per token over the step's completion tokens; docs/runtime.md "Logprob mismatch"):
- ``logprob_mismatch_kl``: the k3 estimator of KL(behaviour || trainer) under the sampler's tokens,
  ``mean(r - 1 - log r)`` with ``r = exp(log_ratio)`` (Schulman's k3: unbiased, never negative);
- ``logprob_mismatch_max_ratio``: ``max r`` over the step's tokens;
- ``mismatch_masked_fraction``: completions masked by the sequence mask below (0 when off).

Corrections (``LossSettings``; both off by default, because the surrogate's ratio is already taken against the
behaviour logprobs, ``surrogate``, so the mismatch is importance-corrected and clipped as any staleness is):
- TIS (``spec.algorithm.importanceCap`` = C; Yao et al. 2025, "Your Efficient RL Framework Secretly Brings You
  Off-Policy RL Training"; verl's TIS): the PPO ratio is taken against the trainer's own pre-update logprobs (the
  proximal policy) and each token's loss is weighted by ``w = min(exp(log_ratio), C)`` (detached);
- sequence masking (``spec.algorithm.mismatchMask``): a completion whose mean (``level: Mean``, the log of the
  geometric-mean ratio) or max (``level: Max``) token ``|log_ratio|`` exceeds ``threshold`` contributes nothing
  (its tokens' losses are zeroed; the loss's denominator still counts it, as it does a zero-advantage completion).
"""
from __future__ import annotations

import dataclasses

import torch

MEAN = "Mean"
MAX = "Max"
LOG_RATIO_LIMIT = 20.0     # |log_ratio| beyond this is clamped (exp stays finite: no inf or NaN in the loss)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Stats:
    """Sums over one batch (additive over micro-batches and ranks, except ``max_ratio``: a max)."""

    kl_sum: float           # sum over tokens of k3
    max_ratio: float        # max over tokens of exp(log_ratio) (0 with no tokens)
    tokens: int
    masked: int             # completions masked
    rows: int               # completions


def log_ratio(*, logp: torch.Tensor, behaviour_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[B, T] detached ``logp - behaviour_logp`` (clamped to +-``LOG_RATIO_LIMIT``), 0 on padding."""
    lr = (logp.detach() - behaviour_logp.detach()).clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)
    return lr * mask


def keep_of(*, log_ratio: torch.Tensor, mask: torch.Tensor, level: str | None,
            threshold: float | None) -> torch.Tensor | None:
    """:func:`sequence_keep` when the mask is on (``threshold`` set), else None."""
    if threshold is None:
        return None
    return sequence_keep(log_ratio=log_ratio, mask=mask, level=level or MAX, threshold=threshold)


def sequence_keep(*, log_ratio: torch.Tensor, mask: torch.Tensor, level: str, threshold: float) -> torch.Tensor:
    """[B] float: 0 for a completion whose mean or max token ``|log_ratio|`` exceeds ``threshold``, else 1."""
    a = log_ratio.abs() * mask
    if level == MEAN:
        per_seq = a.sum(dim=-1) / mask.sum(dim=-1).clamp(min=1.0)
    elif level == MAX:
        per_seq = a.max(dim=-1).values if a.shape[-1] else a.sum(dim=-1)
    else:
        raise ValueError(f"mismatch mask level {level!r}: {MEAN} | {MAX}")
    return (per_seq <= threshold).to(mask.dtype)


def tis_weight(*, log_ratio: torch.Tensor, cap: float) -> torch.Tensor:
    """[B, T] detached truncated importance weight ``min(exp(log_ratio), cap)``."""
    return torch.exp(log_ratio).clamp(max=cap).detach()


def stats(*, logp: torch.Tensor, behaviour_logp: torch.Tensor, mask: torch.Tensor,
          keep: torch.Tensor | None = None) -> Stats:
    """The batch's mismatch figures (``keep``: the sequence mask's [B] result, None when off)."""
    m = mask.to(torch.float32)
    lr = log_ratio(logp=logp.float(), behaviour_logp=behaviour_logp.float(), mask=m)
    ratio = torch.exp(lr)
    k3 = (ratio - 1.0 - lr) * m
    n = int(m.sum().item())
    max_ratio = float(ratio.masked_fill(m == 0, 0.0).max().item()) if n else 0.0
    masked = int((keep == 0).sum().item()) if keep is not None else 0
    return Stats(kl_sum=float(k3.sum().item()), max_ratio=max_ratio, tokens=n, masked=masked,
                 rows=int(mask.shape[0]))
