"""The LM head's completion logprobs and the input embedding as autograd functions that accumulate their weight's
gradient in one buffer: backward never holds a vocab x hidden temporary beyond that one gradient.

Role: ``logprobs.forward`` calls :func:`applies` and then, when it does, :func:`embed` for the decoder's input and
:func:`logprobs` for the completion positions, instead of the modules' own forwards. Neighbours: ``logprobs``
(the caller and the plain path it replaces), ``sharding`` (under FSDP2 the weight seen here is the root unit's
gathered parameter and the buffer becomes its unsharded gradient, which FSDP reduce-scatters).

Why (docs/trainer.md "Memory"): with plain autograd, a tied embedding/LM head of vocab x hidden (Qwen2-0.5B:
151,936 x 896, 545 MB in float32) gets one dense gradient per use: each checkpointed LM-head chunk's
``grad_output^T @ hidden``, and the embedding lookup's scatter, and autograd holds the first until the last one
arrives (the embedding, at the very end of the backward) and adds them. The backward peak held the gathered
weight plus two or three such gradients, plus the recomputed chunk's logits and their gradients.

How:
- :class:`WeightGrad` is the one buffer of a forward. The head's backward adds each chunk's
  ``dlogits^T @ hidden`` into it (``addmm_``: the first chunk allocates it); the embedding's backward adds its
  rows (``index_add_``; rows of ``padding_idx`` excluded, as ``nn.Embedding`` does).
- Tied (one weight object for both): the head's backward returns no gradient for the weight and the embedding's
  backward returns the buffer; autograd's accumulation then takes it as the parameter's gradient (no copy when
  there is none yet, an in-place add when micro-batches accumulate), so post-accumulate hooks still fire once.
  The embedding's backward always runs after the head's: the head's input is computed from the embedding's output.
- Untied: the head returns its buffer itself; the embedding stays the module's own (one dense gradient anyway).
- The head computes logits chunk by chunk (at most ``chunk`` positions x vocab float32 at a time) in forward and
  again in backward (recomputation, as the activation checkpoint did before), with the log-softmax gradient written
  by hand: ``dlogits = (onehot(token) - softmax(logits / T)) * g / T``, in float32, cast to the weight's dtype
  for the two matmuls (as autograd casts a bf16 linear's gradient). Entropy is computed in the forward, detached.
- Truncation (the sampler's top-k/top-p, ``truncation``): ``logits / T`` outside the kept set are -inf before the
  softmax, in forward and in the backward's recomputation (the same set: a pure function of the same logits and
  tokens), so ``softmax`` above is the truncated distribution's (0 outside the set) and so is the entropy.
- Kept probabilities (``keep=True``): the forward keeps every position's ``softmax(logits / T)`` (N x vocab
  float32, which it computes for the entropy anyway) and the backward starts from it instead of recomputing the
  logits: one ``N x hidden x vocab`` matmul and a softmax fewer per step, for that much memory between forward and
  backward. The caller decides (``logprobs.forward``'s ``keep_elements`` bound); the result is the same either way.

When it applies (:func:`applies`): a plain ``nn.Linear`` head without bias and, for the tied path, a plain
``nn.Embedding`` (no max_norm, scale_grad_by_freq or sparse), neither with hooks (LoRA on the head, for one, adds
a forward hook), and no autocast (the weight's dtype is the compute dtype). Otherwise the plain modules run.
"""
from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F

from kubeforge.runtime.learner import truncation as trunc_mod


@dataclasses.dataclass(frozen=True)
class Tied:
    """The modules of one HF causal LM this module computes for; ``embedding`` None: the head only (untied)."""

    head: torch.nn.Linear
    embedding: torch.nn.Embedding | None


def _hooked(m: torch.nn.Module) -> bool:
    return bool(m._forward_hooks or m._forward_pre_hooks or m._backward_hooks
                or getattr(m, "_backward_pre_hooks", None))


def applies(lm: torch.nn.Module, device: torch.device) -> Tied | None:
    """The modules to compute for, or None when the plain modules must run (see the module docstring)."""
    if torch.is_autocast_enabled(device.type):
        return None
    head = lm.get_output_embeddings()  # type: ignore[operator]
    if type(head) is not torch.nn.Linear or head.bias is not None or _hooked(head):
        return None
    emb = lm.get_input_embeddings()
    tied = (type(emb) is torch.nn.Embedding and emb.weight is head.weight and emb.max_norm is None
            and not emb.scale_grad_by_freq and not emb.sparse and not _hooked(emb))
    return Tied(head=head, embedding=emb if tied else None)


class WeightGrad:
    """The gradient of one weight in one forward, accumulated in place by every use's backward."""

    def __init__(self) -> None:
        self.grad: torch.Tensor | None = None

    def add_mm(self, a: torch.Tensor, b: torch.Tensor) -> None:
        """``grad += a^T @ b``."""
        if self.grad is None:
            self.grad = torch.mm(a.t(), b)
        else:
            self.grad.addmm_(a.t(), b)

    def add_rows(self, index: torch.Tensor, rows: torch.Tensor, *, shape: torch.Size) -> None:
        """``grad[index] += rows`` (repeated indices add up); a zero ``grad`` of ``shape`` when there is none."""
        if self.grad is None:
            self.grad = torch.zeros(shape, dtype=rows.dtype, device=rows.device)
        self.grad.index_add_(0, index, rows)

    def take(self) -> torch.Tensor | None:
        """The gradient, dropped from here (the caller's reference is then the only one: autograd can keep it
        as the parameter's gradient without a copy)."""
        g, self.grad = self.grad, None
        return g


class _Embedding(torch.autograd.Function):
    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, ids: torch.Tensor, weight: torch.Tensor,
                padding_idx: int | None, buffer: WeightGrad) -> torch.Tensor:
        ctx.save_for_backward(ids)
        ctx.padding_idx = padding_idx  # type: ignore[attr-defined]
        ctx.buffer = buffer  # type: ignore[attr-defined]
        ctx.shape, ctx.dtype = weight.shape, weight.dtype  # type: ignore[attr-defined]
        return F.embedding(ids, weight)

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx,
                 grad_out: torch.Tensor) -> tuple[None, torch.Tensor | None, None, None]:
        buffer: WeightGrad = ctx.buffer  # type: ignore[attr-defined]
        if not ctx.needs_input_grad[1]:  # type: ignore[attr-defined]
            buffer.take()
            return None, None, None, None
        (ids,) = ctx.saved_tensors  # type: ignore[attr-defined]
        ids = ids.reshape(-1)
        rows = grad_out.reshape(ids.shape[0], -1)
        if ctx.padding_idx is not None:  # type: ignore[attr-defined]
            keep = ids != ctx.padding_idx  # type: ignore[attr-defined]
            ids, rows = ids[keep], rows[keep]
        buffer.add_rows(ids, rows.to(ctx.dtype), shape=ctx.shape)  # type: ignore[attr-defined]
        return None, buffer.take(), None, None


class _HeadLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, hidden: torch.Tensor, weight: torch.Tensor,
                ids: torch.Tensor, temperature: float, chunk: int, buffer: WeightGrad,
                deliver: bool, keep: bool, truncation: trunc_mod.Truncation | None,
                outside: trunc_mod.Outside | None) -> tuple[torch.Tensor, torch.Tensor]:
        n = int(hidden.shape[0])
        logp = torch.empty((n,), dtype=torch.float32, device=hidden.device)
        entropy = torch.empty((n,), dtype=torch.float32, device=hidden.device)
        kept: list[torch.Tensor] = []
        for i in range(0, n, chunk):
            z = trunc_mod.apply(_logits(hidden[i:i + chunk], weight, temperature), ids[i:i + chunk], truncation,
                                outside)
            logsm = torch.log_softmax(z, dim=-1)
            del z
            logp[i:i + chunk] = logsm.gather(-1, ids[i:i + chunk].unsqueeze(-1)).squeeze(-1)
            probs = logsm.exp()
            if keep:
                kept.append(probs)
                plogp = probs * logsm
            else:
                plogp = probs.mul_(logsm)
            if truncation is not None:     # 0 * -inf outside the kept set
                plogp.nan_to_num_(nan=0.0)
            entropy[i:i + chunk] = -plogp.sum(dim=-1)
            del plogp
            del logsm, probs
        ctx.kept = kept  # type: ignore[attr-defined]
        ctx.save_for_backward(hidden, weight, ids)
        ctx.temperature, ctx.chunk = temperature, chunk  # type: ignore[attr-defined]
        ctx.truncation = truncation  # type: ignore[attr-defined]
        ctx.buffer, ctx.deliver = buffer, deliver  # type: ignore[attr-defined]
        ctx.mark_non_differentiable(entropy)
        return logp, entropy

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx,
                 grad_logp: torch.Tensor, _grad_entropy: torch.Tensor | None
                 ) -> tuple[torch.Tensor | None, torch.Tensor | None, None, None, None, None, None, None, None,
                            None]:
        hidden, weight, ids = ctx.saved_tensors  # type: ignore[attr-defined]
        temperature: float = ctx.temperature  # type: ignore[attr-defined]
        chunk: int = ctx.chunk  # type: ignore[attr-defined]
        buffer: WeightGrad = ctx.buffer  # type: ignore[attr-defined]
        kept: list[torch.Tensor] = ctx.kept  # type: ignore[attr-defined]
        truncation: trunc_mod.Truncation | None = ctx.truncation  # type: ignore[attr-defined]
        need_hidden, need_weight = ctx.needs_input_grad[0], ctx.needs_input_grad[1]  # type: ignore[attr-defined]
        grad_hidden = torch.empty_like(hidden) if need_hidden else None
        grad_logp = grad_logp.float()
        for k, i in enumerate(range(0, int(hidden.shape[0]), chunk)):
            h, g = hidden[i:i + chunk], grad_logp[i:i + chunk]
            if kept:     # the forward's probabilities (not in place: a second backward would find them changed)
                d = kept[k].mul(-g.unsqueeze(-1))
            else:
                z = trunc_mod.apply(_logits(h, weight, temperature), ids[i:i + chunk], truncation)
                d = torch.softmax(z, dim=-1).mul_(-g.unsqueeze(-1))
                del z
            d.scatter_add_(-1, ids[i:i + chunk].unsqueeze(-1), g.unsqueeze(-1))   # onehot(token) * g
            if temperature != 1.0:
                d.div_(temperature)
            d = d.to(weight.dtype)
            if grad_hidden is not None:
                torch.mm(d, weight, out=grad_hidden[i:i + chunk])
            if need_weight:
                buffer.add_mm(d, h)
            del d
        grad_weight = buffer.take() if need_weight and ctx.deliver else None  # type: ignore[attr-defined]
        return grad_hidden, grad_weight, None, None, None, None, None, None, None, None


def _logits(hidden: torch.Tensor, weight: torch.Tensor, temperature: float) -> torch.Tensor:
    logits = F.linear(hidden, weight).float()     # a fresh tensor either way: divided in place
    return logits.div_(temperature) if temperature != 1.0 else logits


def embed(tied: Tied, ids: torch.Tensor, buffer: WeightGrad) -> torch.Tensor:
    """The input embeddings of ``ids`` through the tied weight (its gradient goes to ``buffer``)."""
    assert tied.embedding is not None
    out: torch.Tensor = _Embedding.apply(ids,  # type: ignore[no-untyped-call]
                                        tied.embedding.weight, tied.embedding.padding_idx, buffer)
    return out


def logprobs(tied: Tied, hidden: torch.Tensor, ids: torch.Tensor, *, temperature: float, chunk: int,
             buffer: WeightGrad, keep: bool = False, truncation: trunc_mod.Truncation | None = None,
             outside: trunc_mod.Outside | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(logp [N] float32, entropy [N] detached) of token ``ids`` [N] at ``hidden`` [N, H] under the head; the
    head's weight gradient goes into ``buffer``, returned by the embedding's backward when tied. ``keep``: the
    backward reuses the forward's probabilities (N x vocab float32 held in between) instead of recomputing them.
    ``truncation``: the sampler's top-k/top-p (``truncation``), applied to ``logits / T`` before the softmax in
    forward and backward (the kept set recomputed identically); ``outside`` counts sampled tokens it keeps anyway."""
    keep = keep and torch.is_grad_enabled() and (hidden.requires_grad or tied.head.weight.requires_grad)
    out: tuple[torch.Tensor, torch.Tensor] = _HeadLogprobs.apply(  # type: ignore[no-untyped-call]
        hidden, tied.head.weight, ids, temperature, max(1, chunk), buffer, tied.embedding is None, keep,
        truncation if truncation is not None and truncation.active else None, outside)
    return out
