"""The k3 estimator of KL(policy || reference), per token.

With d = ref_logp - logp (both of the sampled token): ``k3 = exp(d) - d - 1``. It is unbiased for KL(pi || ref)
when tokens are sampled from pi, always >= 0, and 0 exactly where the two models agree (Schulman, "Approximating
KL divergence"). Neighbours: ``surrogate.token_terms`` adds ``kl_coef * k3`` to each token's loss.
"""
from __future__ import annotations

import torch


def k3(*, logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token k3 KL; differentiable in ``logp``; the reference is treated as a constant."""
    d = ref_logp.detach() - logp
    return torch.exp(d) - d - 1.0
