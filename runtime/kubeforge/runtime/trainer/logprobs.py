"""Current-policy logprobs of the completion tokens from one forward pass over a collated ``Batch``.

Logprob convention (agreed with the generator, ``generator/engine.py``, vLLM ``logprobs_mode="processed_logprobs"``;
docs/runtime.md "Logprob convention"): each completion token's logprob is ``log_softmax(logits / T)[token]`` in
float32 with T the sampling temperature; the role wiring passes ``logit_temperature=spec.algorithm.temperature``
(1.0 when greedy). Known gap: with ``topP < 1`` vLLM renormalises over the nucleus while this computes the
untruncated distribution, so ratios are then approximate (default ``topP = 1`` is exact).

Neighbours: ``step.Trainer`` (policy, with gradient; reference, without). The entropy of the full next-token
distribution is returned too (detached, completion positions only) because the log-softmax is already there.
"""
from __future__ import annotations

import dataclasses

import torch

from kubeforge.runtime.trainer import batch as batch_mod


@dataclasses.dataclass(frozen=True, kw_only=True)
class TokenLogprobs:
    logp: torch.Tensor       # [B, T] logprob of each completion token (differentiable unless under no_grad)
    entropy: float           # mean entropy (nats) over completion tokens, detached


def completion_logprobs(*, model: torch.nn.Module, batch: batch_mod.Batch, temperature: float = 1.0,
                        device: torch.device | str = "cpu") -> TokenLogprobs:
    """Logprobs of ``batch.completion_ids`` under ``model`` (HF causal LM taking ``logits_to_keep``)."""
    t = batch.completion_len
    out = model(input_ids=batch.input_ids.to(device), attention_mask=batch.attention_mask.to(device),
                position_ids=batch.position_ids.to(device), logits_to_keep=t + 1, use_cache=False)
    logits = out.logits[:, :-1, :].float()           # position P-1+j predicts completion token j
    if temperature != 1.0:
        logits = logits / temperature
    logsm = torch.log_softmax(logits, dim=-1)
    ids = batch.completion_ids.to(device).unsqueeze(-1)
    logp = logsm.gather(-1, ids).squeeze(-1)
    with torch.no_grad():
        mask = batch.completion_mask.to(device)
        ent = -(logsm.exp() * logsm).sum(dim=-1)
        entropy = float((ent * mask).sum().item() / max(float(mask.sum().item()), 1.0))
    return TokenLogprobs(logp=logp, entropy=entropy)
