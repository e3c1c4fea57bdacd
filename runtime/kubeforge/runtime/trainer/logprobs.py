"""Current-policy logprobs of the completion tokens: completion positions only, LM head applied in chunks.

Logprob convention (agreed with the generator, ``generator/engine.py``, vLLM ``logprobs_mode="processed_logprobs"``;
docs/runtime.md "Logprob convention"): each completion token's logprob is ``log_softmax(logits / T)[token]`` in
float32 with T the sampling temperature; the role wiring passes ``logit_temperature=spec.algorithm.temperature``
(1.0 when greedy). Known gap: with ``topP < 1`` vLLM renormalises over the nucleus while this computes the
untruncated distribution, so ratios are then approximate (default ``topP = 1`` is exact).

Memory: the decoder's hidden states are kept only at real completion positions ([N, hidden], N = completion
tokens); the LM head runs over at most ``chunk_elements / vocab`` positions at a time, each chunk under activation
checkpointing, so at most one chunk of float32 logits exists at any time, in forward and in backward (never the
``[rows, tokens, vocab]`` tensor). The entropy of the full next-token distribution comes out of the same chunk
(detached).

Neighbours: ``policy.Policy`` (the trained module calls :func:`forward`), ``step.Trainer`` (reference model, via
:func:`completion_logprobs`).
"""
from __future__ import annotations

import dataclasses

import torch
from torch.utils import checkpoint

from kubeforge.runtime.trainer import batch as batch_mod

CHUNK_ELEMENTS = 1 << 24     # float32 logits per chunk: 64 MiB


@dataclasses.dataclass(frozen=True, kw_only=True)
class TokenLogprobs:
    logp: torch.Tensor       # [B, T] logprob of each completion token (differentiable unless under no_grad)
    entropy: float           # mean entropy (nats) over completion tokens, detached


def _head_chunk(head: torch.nn.Module, hidden: torch.Tensor, ids: torch.Tensor,
                temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    logits = head(hidden).float()
    if temperature != 1.0:
        logits = logits / temperature
    logsm = torch.log_softmax(logits, dim=-1)
    logp = logsm.gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    with torch.no_grad():
        entropy = -(logsm.exp() * logsm).sum(dim=-1)
    return logp, entropy


def forward(lm: torch.nn.Module, *, input_ids: torch.Tensor, attention_mask: torch.Tensor,
            position_ids: torch.Tensor, completion_ids: torch.Tensor, completion_mask: torch.Tensor,
            temperature: float = 1.0, chunk_elements: int = CHUNK_ELEMENTS) -> tuple[torch.Tensor, torch.Tensor]:
    """(logp [B, T] float32, zero on padding; entropy summed over completion tokens, detached scalar) of
    ``completion_ids`` under the HF causal LM ``lm`` (see the module docstring for the memory bound)."""
    rows, t = completion_ids.shape
    decoder = lm.get_decoder()  # type: ignore[operator]
    head = lm.get_output_embeddings()  # type: ignore[operator]
    hidden = decoder(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                     use_cache=False).last_hidden_state
    hidden = hidden[:, -(t + 1):-1, :]                      # position P-1+j predicts completion token j
    where = completion_mask > 0
    picked, ids = hidden[where], completion_ids[where]     # [N, H], [N] in row-major order
    vocab = int(head.weight.shape[0])
    step = max(1, chunk_elements // max(vocab, 1))
    parts: list[torch.Tensor] = []
    entropy = torch.zeros((), dtype=torch.float32, device=hidden.device)
    for i in range(0, int(picked.shape[0]), step):
        if torch.is_grad_enabled():
            lp, ent = checkpoint.checkpoint(_head_chunk, head, picked[i:i + step], ids[i:i + step], temperature,
                                            use_reentrant=False)
        else:
            lp, ent = _head_chunk(head, picked[i:i + step], ids[i:i + step], temperature)
        parts.append(lp)
        entropy = entropy + ent.detach().sum()
    logp = torch.zeros((rows, t), dtype=torch.float32, device=hidden.device)
    if parts:
        logp = logp.index_put(tuple(where.nonzero().t()), torch.cat(parts))
    return logp, entropy


def completion_logprobs(*, model: torch.nn.Module, batch: batch_mod.Batch, temperature: float = 1.0,
                        device: torch.device | str = "cpu") -> TokenLogprobs:
    """Logprobs of ``batch.completion_ids`` under ``model`` (an HF causal LM)."""
    mask = batch.completion_mask.to(device)
    logp, ent = forward(model, input_ids=batch.input_ids.to(device), attention_mask=batch.attention_mask.to(device),
                        position_ids=batch.position_ids.to(device), completion_ids=batch.completion_ids.to(device),
                        completion_mask=mask, temperature=temperature)
    return TokenLogprobs(logp=logp, entropy=float(ent) / max(float(mask.sum().item()), 1.0))
