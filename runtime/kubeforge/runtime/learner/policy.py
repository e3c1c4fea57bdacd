"""The trained module: an HF causal LM whose forward returns completion logprobs (not logits).

Role: the root that FSDP2 shards (its own parameters: embeddings, final norm and LM head; each decoder block is
sharded on its own by ``sharding``), and what every micro-batch's forward calls. Wrapping the LM keeps the chunked
LM head (``logprobs.forward``) inside the root's forward, where FSDP has the root's parameters gathered.
Neighbours: ``step.Trainer`` builds it; ``sharding.shard`` wraps it; ``precision.autocast`` surrounds its call when
it is not sharded.

``policy.lm`` is the plain HF model (its ``named_parameters`` are the HF names the generators load).
"""
from __future__ import annotations

import torch

from kubeforge.runtime.learner import batch as batch_mod
from kubeforge.runtime.learner import logprobs
from kubeforge.runtime.learner import truncation as trunc_mod

# Rows up to this many tokens run HF's eager attention on the CPU compute copy (logprobs: "Short rows"): its
# saved probabilities are rows x heads x T^2 per layer (the demo: 32 x 9 x 62^2 bf16 = 2.2 MB per layer).
EAGER_ATTENTION_MAX_TOKENS = 256


class Policy(torch.nn.Module):
    """``forward(batch) -> (logp [B, T], entropy sum)`` of an HF causal LM at temperature ``temperature``."""

    def __init__(self, lm: torch.nn.Module, *, temperature: float = 1.0, share_prefix: bool = False,
                 eager_attention_max_tokens: int = 0, pack_max_tokens: int = 0,
                 keep_elements: int = logprobs.KEEP_ELEMENTS,
                 truncation: trunc_mod.Truncation | None = None) -> None:
        super().__init__()
        self.lm = lm
        self.temperature = temperature
        # the sampler's top-k/top-p (logprobs' convention); sampled tokens outside the own kept set are counted
        self.truncation = truncation
        self.outside = trunc_mod.Outside()
        self.share_prefix = share_prefix     # each distinct prompt once (logprobs: "Shared prompts"; off)
        # plain matmul-softmax attention for batches up to this many tokens per row (logprobs: "Short rows")
        self.eager_attention_max_tokens = eager_attention_max_tokens
        # groups packed into one row each up to this many tokens (logprobs: "Shared prompts"; 0: off)
        self.pack_max_tokens = pack_max_tokens
        # the LM head's probabilities kept from forward to backward up to this many (logprobs; 0: recomputed)
        self.keep_elements = keep_elements

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
                completion_ids: torch.Tensor, completion_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        eager = 0 < int(input_ids.shape[1]) <= self.eager_attention_max_tokens
        with logprobs.attention(self.lm, "eager" if eager else None):
            return logprobs.forward(self.lm, input_ids=input_ids, attention_mask=attention_mask,
                                    position_ids=position_ids, completion_ids=completion_ids,
                                    completion_mask=completion_mask, temperature=self.temperature,
                                    keep_elements=self.keep_elements, share_prefix=self.share_prefix,
                                    pack_max_tokens=self.pack_max_tokens, truncation=self.truncation,
                                    outside=self.outside)

    def run(self, batch: batch_mod.Batch, *, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`forward` on a collated batch moved to ``device`` (through ``__call__``: FSDP's hooks run)."""
        out: tuple[torch.Tensor, torch.Tensor] = self(
            batch.input_ids.to(device), batch.attention_mask.to(device), batch.position_ids.to(device),
            batch.completion_ids.to(device), batch.completion_mask.to(device))
        return out
