"""Top-k / top-p truncation of the trainer's logits, as vLLM's sampler truncates before it samples.

Why: the generator's behaviour logprobs are vLLM's *processed* logprobs (``logprobs_mode="processed_logprobs"``):
``log_softmax`` of the temperature-scaled logits after top-k and top-p set every token outside the kept set to
-inf. The trainer's logprobs must be of the same distribution, or the importance ratio compares two different
distributions (docs/runtime.md, "Logprob convention").

The kept set, as vLLM 0.32 computes it on CPU (``vllm/v1/sample/ops/topk_topp_sampler.py``,
``apply_top_k_top_p_pytorch`` / ``apply_top_k_only``), over ``z = logits / T`` (float32):

1. top-k (``0 < k < vocab``): keep every token whose ``z`` is >= the k-th largest ``z`` (ties at the threshold
   are all kept);
2. top-p (``p < 1``): sort the (top-k masked) ``z`` ascending, ``cumsum(softmax(sorted))``; drop the tokens whose
   cumulative sum is ``<= 1 - p``; the largest token is always kept.

Greedy sampling (temperature 0) truncates nothing (vLLM skips the sampler's truncation for greedy requests).

The boundary: the trainer's logits differ from the sampler's by numerics, so a sampled token near the boundary may
fall outside the trainer's kept set. Such a token is kept anyway (the kept set is ``trainer's set | {sampled
token}``: the sampler did keep it), so its logprob stays finite and differentiable and the loss never sees -inf or
NaN; each such token is counted (``Outside``, reported per step as ``truncation_outside_tokens``).
"""
from __future__ import annotations

import dataclasses

import torch


@dataclasses.dataclass(frozen=True)
class Truncation:
    """The sampler's truncation: ``top_k`` (0 or -1: off, vLLM's convention) and ``top_p`` (1: off)."""

    top_k: int = 0
    top_p: float = 1.0

    @property
    def active(self) -> bool:
        return self.top_k > 0 or self.top_p < 1.0

    @classmethod
    def of(cls, *, temperature: float, top_k: int, top_p: float) -> Truncation | None:
        """The truncation vLLM applies at these settings; None when it applies none (greedy, or both off)."""
        t = cls(top_k=max(int(top_k), 0), top_p=float(top_p))
        return t if temperature > 0 and t.active else None


class Outside:
    """Counts sampled tokens outside the trainer's own kept set (kept anyway: module docstring)."""

    def __init__(self) -> None:
        self.tokens = 0

    def take(self) -> int:
        n, self.tokens = self.tokens, 0
        return n


def keep_mask(z: torch.Tensor, truncation: Truncation) -> torch.Tensor:
    """[N, V] bool: the tokens vLLM's sampler keeps for tempered logits ``z`` [N, V] (float32)."""
    vocab = int(z.shape[-1])
    k = truncation.top_k if 0 < truncation.top_k < vocab else 0
    keep = torch.ones_like(z, dtype=torch.bool)
    if k:
        kth = torch.topk(z, k, dim=-1).values[..., -1:]
        keep = z >= kth
    if truncation.top_p < 1.0:
        masked = z.masked_fill(~keep, float("-inf")) if k else z
        sorted_z, idx = masked.sort(dim=-1, descending=False)
        cum = sorted_z.softmax(dim=-1).cumsum(dim=-1)
        drop_sorted = cum <= 1.0 - truncation.top_p
        drop_sorted[..., -1] = False
        drop = torch.zeros_like(drop_sorted).scatter_(-1, idx, drop_sorted)
        keep = keep & ~drop
    return keep


def apply(z: torch.Tensor, ids: torch.Tensor, truncation: Truncation | None,
          outside: Outside | None = None) -> torch.Tensor:
    """``z`` [N, V] with every token outside the kept set (and not the sampled ``ids`` [N]) set to -inf; the mask
    is computed without gradient (the kept set is a constant of the sample, as it is for the sampler)."""
    if truncation is None or not truncation.active:
        return z
    with torch.no_grad():
        keep = keep_mask(z.detach(), truncation)
        sampled_kept = keep.gather(-1, ids.unsqueeze(-1))
        if outside is not None:
            outside.tokens += int((~sampled_kept).sum().item())
        keep.scatter_(-1, ids.unsqueeze(-1), True)
    return z.masked_fill(~keep, float("-inf"))
