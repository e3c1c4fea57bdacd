"""FLOPs of a train step, counted from the model's shapes and the token shapes the step actually ran (pure).

Role: ``step.Trainer`` records every decoder pass of a step (``Work.decoder``: rows, query and key lengths, and
whether the pass was differentiated) and every LM-head application (``Work.head``: positions), then asks
:func:`step_flops` for the step's total; divided by the step's wall time and the GEMM peak measured in the same
process (``peak``) it is the step's ``mfu``. Neighbours: ``peak`` (the denominator), ``step`` (the recording).

Formula (multiply-add = 2 FLOPs; matmuls only: norms, softmax, rotary and activations are left out, as they are
by ``torch.utils.flop_counter.FlopCounterMode``, against which ``tests/runtime/test_flops.py`` checks it):

- Decoder weights: ``N = L x (H x (nq + 2 nkv) x d + nq x d x H + 3 x H x I)`` matmul weights (q, k, v, o and the
  gated MLP's gate, up, down; L layers, H hidden, nq/nkv query/key-value heads of size d, I intermediate).
  Forward ``2 N`` per token; backward ``2 N`` per token for the activations' gradients plus ``2 N_trained`` for the
  weights' gradients (``N_trained = N`` for a full fine-tune, 0 for LoRA's frozen base): the usual ``6 N`` per
  token trained, ``4 N`` with a frozen base.
- LoRA adapters (``r`` rank, per targeted linear of in x out): ``2 r (in + out)`` forward per token, twice that
  in backward (activations and the adapters' own weights).
- Attention's quadratic term: per layer and row ``2 x 2 x S_q x S_k x nq x d`` forward (``Q K^T`` and ``P V``;
  masked positions are computed all the same by the eager and SDPA kernels, so the full ``S_q x S_k`` counts), and
  twice that in backward (``dQ, dK, dP, dV``).
- LM head: ``2 x H x V`` per position it is applied to (completion positions only: ``logprobs``); backward ``2 H V``
  for the hidden states' gradient plus ``2 H V`` for the weight's when it is trained (tied or not: one weight).
  The embedding is a lookup: no matmul.

What "the step's tokens" are: the shapes the kernels ran, padding included (a padded position costs the same
matmul); shared-prompt packing runs fewer, longer rows (``logprobs`` "Shared prompts") and is counted as it ran.
A reference model's forward (``klCoef > 0``) is a forward-only pass. Recomputation (activation checkpointing, the
LM head when its probabilities are not kept) is *not* counted: the usual model-FLOPs utilisation, which a
recomputing step reaches less of.

Frozen base (LoRA): autograd computes an activation's gradient only above the first trained parameter. The
embedding is frozen, so in the first layer the inputs of the linears before the first adapted one get no gradient
(default targets q, k, v, o: q/k/v's input gradients, base and adapter, are skipped): :func:`_untrained_inputs`.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any


@dataclasses.dataclass(frozen=True, kw_only=True)
class Shape:
    """A decoder-only LM's matmul shapes (HF config names in :meth:`of`)."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int

    @classmethod
    def of(cls, config: Any) -> Shape:
        """From an HF config (Llama, Qwen2, Mistral-like: gated MLP, grouped-query attention)."""
        hidden, heads = int(config.hidden_size), int(config.num_attention_heads)
        head_dim = getattr(config, "head_dim", None) or hidden // heads
        return cls(hidden=hidden, layers=int(config.num_hidden_layers), heads=heads,
                   kv_heads=int(getattr(config, "num_key_value_heads", None) or heads), head_dim=int(head_dim),
                   intermediate=int(config.intermediate_size), vocab=int(config.vocab_size))

    def linears(self) -> dict[str, tuple[int, int]]:
        """(in, out) of each linear of one decoder layer, by its HF module name."""
        h, q, kv = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim
        i = self.intermediate
        return {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
                "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}

    def layer_weights(self) -> int:
        """Matmul weights of one decoder layer."""
        return sum(a * b for a, b in self.linears().values())


@dataclasses.dataclass(frozen=True, kw_only=True)
class Training:
    """What a backward computes weight gradients for: everything, or LoRA adapters on a frozen base."""

    base_trained: bool = True
    lora_rank: int = 0
    lora_targets: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True, kw_only=True)
class DecoderPass:
    rows: int
    queries: int            # query positions per row
    keys: int               # key positions per row (queries, or more over a prompt cache)
    backward: bool


@dataclasses.dataclass
class Work:
    """What one step ran (appended as it runs): decoder passes and LM-head applications."""

    passes: list[DecoderPass] = dataclasses.field(default_factory=list)
    head_forward: int = 0          # positions through the head, forward only
    head_trained: int = 0          # positions through the head and its backward

    def decoder(self, *, rows: int, queries: int, keys: int, backward: bool) -> None:
        self.passes.append(DecoderPass(rows=rows, queries=queries, keys=keys, backward=backward))

    def head(self, *, positions: int, backward: bool) -> None:
        if backward:
            self.head_trained += positions
        else:
            self.head_forward += positions


def _lora_weights(shape: Shape, training: Training) -> int:
    """Adapter matmul weights of one layer: r x (in + out) per targeted linear."""
    return sum(training.lora_rank * (a + b) for name, (a, b) in shape.linears().items()
               if name in training.lora_targets)


#: one layer's matmuls in data-flow order; a stage's input needs a gradient once an earlier stage is trained
_STAGES = (("q_proj", "k_proj", "v_proj"), ("attention",), ("o_proj",), ("gate_proj", "up_proj"), ("down_proj",))


def _untrained_inputs(shape: Shape, training: Training, *, tokens: int, attention: int) -> int:
    """Backward FLOPs a frozen base skips in the first layer: input gradients below its first adapted linear
    (``attention``: the layer's attention backward for the pass)."""
    if training.base_trained:
        return 0
    linears, skipped = shape.linears(), 0
    for stage in _STAGES:
        for name in stage:
            if name == "attention":
                skipped += 2 * attention
                continue
            a, b = linears[name]
            adapter = training.lora_rank * a if name in training.lora_targets else 0
            skipped += 2 * tokens * (a * b + adapter)
        if set(stage) & set(training.lora_targets):
            return skipped
    return skipped


def decoder_flops(shape: Shape, p: DecoderPass, training: Training) -> int:
    """One decoder pass: forward, plus backward when ``p.backward`` (module docstring)."""
    tokens = p.rows * p.queries
    base, lora = shape.layers * shape.layer_weights(), shape.layers * _lora_weights(shape, training)
    attention = shape.layers * p.rows * 4 * p.queries * p.keys * shape.heads * shape.head_dim
    forward = 2 * (base + lora) * tokens + attention
    if not p.backward:
        return forward
    weight_grads = 2 * (base if training.base_trained else 0) * tokens + 2 * lora * tokens
    skipped = _untrained_inputs(shape, training, tokens=tokens, attention=attention // shape.layers)
    return forward + 2 * (base + lora) * tokens + weight_grads + 2 * attention - skipped


def head_flops(shape: Shape, work: Work, training: Training) -> int:
    per = 2 * shape.hidden * shape.vocab
    trained = per * (3 if training.base_trained else 2)
    return per * work.head_forward + trained * work.head_trained


def step_flops(shape: Shape, work: Work, training: Training) -> int:
    """Every matmul FLOP of the step's recorded ``work``."""
    return sum(decoder_flops(shape, p, training) for p in work.passes) + head_flops(shape, work, training)


def total(shape: Shape, passes: Iterable[DecoderPass], *, head_trained: int, head_forward: int = 0,
          training: Training | None = None) -> int:
    """:func:`step_flops` of explicit passes (tests, benches)."""
    work = Work(passes=list(passes), head_forward=head_forward, head_trained=head_trained)
    return step_flops(shape, work, training or Training())
