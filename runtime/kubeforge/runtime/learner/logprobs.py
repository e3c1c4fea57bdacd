"""Current-policy logprobs of the completion tokens: completion positions only, LM head applied in chunks.

Logprob convention (agreed with the generator, ``generator/engine.py``, vLLM ``logprobs_mode="processed_logprobs"``;
docs/runtime.md "Logprob convention"): each completion token's logprob is ``log_softmax(logits / T)[token]`` in
float32 with T the sampling temperature, after the sampler's top-k/top-p truncation: the role wiring passes
``logit_temperature=spec.algorithm.temperature`` (1.0 when greedy) and ``truncation`` (``truncation.Truncation.of``
``spec.algorithm``'s temperature, topK, topP), and tokens outside the kept set (computed from these logits as vLLM
computes it: ``truncation``) are -inf before the ``log_softmax``, so the logprob is renormalised over the same set
vLLM sampled from (tested against vLLM for topP 0.9 and topK 20: ``tests/runtime/test_sampling_logprobs.py``). A
sampled token outside the trainer's own set (numerics at the boundary) is kept in it and counted (``outside``).

Memory: the decoder's hidden states are kept only at real completion positions ([N, hidden], N = completion
tokens); the LM head runs over at most ``chunk_elements / vocab`` positions at a time, recomputed in backward, so
at most one chunk of float32 logits exists at any time, in forward and in backward (never the ``[rows, tokens,
vocab]`` tensor). Exception by choice: when ``N x vocab <= keep_elements`` (the policy passes ``KEEP_ELEMENTS``,
256 MiB; 0 keeps nothing) the forward's probabilities stay for the backward, which then skips the head's
recomputation (``lmhead`` "Kept probabilities"; the demo: at most 512 x 49,152 elements, one matmul of ~24-29
GFLOP fewer per step). The entropy of the full next-token distribution comes out of the same chunk (detached). Where
``lmhead.applies`` (a plain head, and a plain embedding when tied) the head and the tied embedding are
``lmhead``'s autograd functions, which accumulate the weight's gradient in one buffer; otherwise the head module
runs each chunk under activation checkpointing.

Shared prompts: the completions of a GRPO group repeat one prompt, and prompts are usually longer than the
completions. Two ways run every distinct prompt of the batch through the decoder once, at the cost of ``distinct
prompts x P + rows x T`` tokens instead of ``rows x (P + T)`` (the demo: 4 x 48 + 32 x 16 instead of 32 x 64, 2.9x
fewer); both give the full forward's result (the same attention over the same positions, tested):
- Packed (``pack_max_tokens`` > 0, tried first): one row per distinct prompt holds the prompt (its left padding
  included) followed by the completions of every row that repeats it, under a custom 4-D block mask (prompt tokens
  causal within the prompt; each completion sees its prompt and itself causally; padding never seen) and the rows'
  own position ids. One decoder pass of ordinary shape, so it composes with compiled blocks and activation
  checkpointing. Applies when the packed row is at most ``pack_max_tokens`` long (attention over it is quadratic:
  rows x heads x S^2 mask and probabilities) and the model's attention is HF's eager or SDPA (which take the mask
  as it is).
- Cached (``share_prefix``): the prompts run first with ``use_cache``; their keys and values are indexed out to
  every row that repeats them and the completions run on top, with gradients flowing back through the shared keys
  and values into the prompt's single pass. Two decoder passes, the second over the HF cache object: never with
  FSDP2 sharding or activation checkpointing (each decoder block must run once per forward there), and with
  compiled blocks each layer's cache state recompiles. Kept for long rows on GPUs, where the FLOPs dominate.
Measured on the demo (2 CPU cores, bf16; ``bench/profile_train_step.py --compare pack`` / ``--compare
share-prefix``): docs/trainer.md "Packed groups". The cached way took 1.19x the CPU time of the full forward
(autocast at the time): the CPU step was bound by per-call overhead that a second decoder pass doubles.

Short rows: the trainer's compute copy on CPU runs the decoder with HF's plain ("eager": matmul, float32 softmax,
matmul) attention when a batch's rows are at most ``policy.EAGER_ATTENTION_MAX_TOKENS`` tokens long (:func:`attention`
switches it for one forward). Measured on the demo (62-token rows, bf16, 1 torch thread; ``bench/profile_train_step.py
--compare attention``): torch's CPU flash-attention backward alone was ~19% of the step's CPU time, for attention
FLOPs that are negligible at this length. Longer rows keep the model's own implementation (SDPA): eager attention
keeps ``rows x heads x T^2`` probabilities per layer for backward.

Neighbours: ``policy.Policy`` (the trained module calls :func:`forward`), ``step.Trainer`` (reference model, via
:func:`completion_logprobs`).
"""
from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator

import torch
from torch.utils import checkpoint

from kubeforge.runtime.learner import batch as batch_mod
from kubeforge.runtime.learner import lmhead
from kubeforge.runtime.learner import truncation as trunc_mod

CHUNK_ELEMENTS = 1 << 24     # float32 logits per chunk: 64 MiB
KEEP_ELEMENTS = 1 << 26      # the forward's probabilities kept for backward up to this many (256 MiB float32)
PACK_MAX_TOKENS = 512        # shared prompts: packed rows (prompt + its group's completions) up to this long
PACK_ATTENTION = ("eager", "sdpa")    # HF attentions that take a custom additive 4-D mask as it is


@dataclasses.dataclass(frozen=True, kw_only=True)
class TokenLogprobs:
    logp: torch.Tensor       # [B, T] logprob of each completion token (differentiable unless under no_grad)
    entropy: float           # mean entropy (nats) over completion tokens, detached


@contextlib.contextmanager
def attention(lm: torch.nn.Module, implementation: str | None) -> Iterator[None]:
    """Run ``lm``'s forwards inside with HF attention ``implementation`` ("eager", "sdpa"; None: unchanged).
    HF reads ``config._attn_implementation`` at every call, for the mask's format and the attention function."""
    config = getattr(lm, "config", None)
    before = getattr(config, "_attn_implementation", None)
    if implementation is None or config is None or before == implementation:
        yield
        return
    config._attn_implementation = implementation
    try:
        yield
    finally:
        config._attn_implementation = before


def _head_chunk(head: torch.nn.Module, hidden: torch.Tensor, ids: torch.Tensor, temperature: float,
                truncation: trunc_mod.Truncation | None = None,
                outside: trunc_mod.Outside | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    logits = head(hidden).float()
    if temperature != 1.0:
        logits = logits / temperature
    logits = trunc_mod.apply(logits, ids, truncation, outside)
    logsm = torch.log_softmax(logits, dim=-1)
    logp = logsm.gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    with torch.no_grad():
        plogp = logsm.exp() * logsm
        if truncation is not None:      # 0 * -inf outside the kept set
            plogp = plogp.nan_to_num(nan=0.0)
        entropy = -plogp.sum(dim=-1)
    return logp, entropy


def _shared_prefix_hidden(decoder: torch.nn.Module, *, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                          position_ids: torch.Tensor, t: int) -> torch.Tensor | None:
    """Hidden states at positions ``P-1 .. P+T-2`` (those that predict the completion tokens), each distinct
    prompt run once (module docstring); None when no two rows share a prompt."""
    p = int(input_ids.shape[1]) - t
    rows = int(input_ids.shape[0])
    if p < 1 or rows < 2:
        return None
    uniq, inverse = torch.unique(torch.cat([input_ids[:, :p], attention_mask[:, :p]], dim=1), dim=0,
                                 return_inverse=True)
    if int(uniq.shape[0]) == rows:
        return None
    first = torch.full((int(uniq.shape[0]),), rows, dtype=torch.long, device=input_ids.device).scatter_reduce(
        0, inverse, torch.arange(rows, device=input_ids.device), reduce="amin")
    head = decoder(input_ids=input_ids[first, :p], attention_mask=attention_mask[first, :p],
                   position_ids=position_ids[first, :p], use_cache=True)
    cache = head.past_key_values
    cache.batch_select_indices(inverse)                     # differentiable gather: grads flow to the prompt pass
    tail = decoder(input_ids=input_ids[:, p:], attention_mask=attention_mask, position_ids=position_ids[:, p:],
                   past_key_values=cache, use_cache=True).last_hidden_state
    last = head.last_hidden_state[:, -1, :][inverse]        # position P-1 predicts completion token 0
    return torch.cat([last.unsqueeze(1), tail[:, :-1, :]], dim=1)


@dataclasses.dataclass(frozen=True)
class _Packing:
    """Where each token of the packed batch comes from and where each row's completion is predicted from."""

    src_row: torch.Tensor        # [K, S] row of the batch each packed token comes from
    src_col: torch.Tensor        # [K, S] its column
    mask: torch.Tensor           # [K, 1, S, S] True: query may attend key
    predict: torch.Tensor        # [R, T] flat index (into K x S) of the hidden state predicting completion token j


def _packing(attention_mask: torch.Tensor, inverse: torch.Tensor, k: int, p: int, t: int) -> _Packing:
    """Packed row u = distinct prompt u (its P columns, left padding included) then the completions of the rows
    that repeat it, T columns each, then filler. Masks: prompt tokens attend causally within the prompt; a
    completion attends its prompt and causally within itself; padding keys (attention_mask 0) and filler are never
    attended, except each query by itself (a padding query's output is unused; it must only be finite)."""
    rows = int(inverse.shape[0])
    inv = inverse.tolist()
    members: list[list[int]] = [[] for _ in range(k)]
    for r, u in enumerate(inv):
        members[u].append(r)
    s_len = p + max(len(m) for m in members) * t
    src_row = torch.zeros((k, s_len), dtype=torch.long)
    src_col = torch.zeros((k, s_len), dtype=torch.long)
    seg = torch.full((k, s_len), -2, dtype=torch.long)          # -1 prompt, slot >= 0 completion, -2 filler
    order = torch.zeros((k, s_len), dtype=torch.long)           # position inside its segment
    predict = torch.zeros((rows, t), dtype=torch.long)
    cols = torch.arange(t)
    for u, ms in enumerate(members):
        src_row[u, :p], src_col[u, :p], seg[u, :p], order[u, :p] = ms[0], torch.arange(p), -1, torch.arange(p)
        for slot, r in enumerate(ms):
            a = p + slot * t
            src_row[u, a:a + t], src_col[u, a:a + t], seg[u, a:a + t], order[u, a:a + t] = r, p + cols, slot, cols
            predict[r, 0] = u * s_len + p - 1                   # the prompt's last position predicts token 0
            predict[r, 1:] = u * s_len + a + cols[:-1]
    device = attention_mask.device
    src_row, src_col, seg, order = (x.to(device) for x in (src_row, src_col, seg, order))
    valid = (attention_mask[src_row, src_col] > 0) & (seg > -2)
    q_seg, k_seg = seg.unsqueeze(2), seg.unsqueeze(1)
    q_ord, k_ord = order.unsqueeze(2), order.unsqueeze(1)
    causal = k_ord <= q_ord
    allowed = (((k_seg == -1) & ((q_seg >= 0) | ((q_seg == -1) & causal)))
               | ((k_seg >= 0) & (k_seg == q_seg) & causal)) & valid.unsqueeze(1)
    allowed |= torch.eye(s_len, dtype=torch.bool, device=device).unsqueeze(0)
    return _Packing(src_row=src_row, src_col=src_col, mask=allowed.unsqueeze(1), predict=predict.to(device))


def _packed_hidden(lm: torch.nn.Module, decoder: torch.nn.Module, *, input_ids: torch.Tensor,
                   attention_mask: torch.Tensor, position_ids: torch.Tensor, t: int, max_tokens: int,
                   embed: Callable[[torch.Tensor], torch.Tensor] | None) -> torch.Tensor | None:
    """Hidden states [R, T, H] predicting the completion tokens, each distinct prompt run once inside one packed
    row with its group's completions (module docstring, "Shared prompts"); None when no two rows share a prompt,
    the packed row would exceed ``max_tokens`` or the model's attention cannot take the mask."""
    p = int(input_ids.shape[1]) - t
    rows = int(input_ids.shape[0])
    if p < 1 or rows < 2 or getattr(getattr(lm, "config", None), "_attn_implementation", None) not in PACK_ATTENTION:
        return None
    uniq, inverse = torch.unique(torch.cat([input_ids[:, :p], attention_mask[:, :p]], dim=1), dim=0,
                                 return_inverse=True)
    k = int(uniq.shape[0])
    if k == rows or p + int(torch.bincount(inverse).max()) * t > max_tokens:
        return None
    pk = _packing(attention_mask, inverse, k, p, t)
    ids = input_ids[pk.src_row, pk.src_col]
    tokens = {"inputs_embeds": embed(ids)} if embed is not None else {"input_ids": ids}
    weight: torch.Tensor = lm.get_input_embeddings().weight  # type: ignore[operator]
    dtype = tokens["inputs_embeds"].dtype if embed is not None else weight.dtype
    if not dtype.is_floating_point:
        dtype = torch.float32
    mask = torch.zeros(pk.mask.shape, dtype=dtype, device=ids.device).masked_fill_(~pk.mask, torch.finfo(dtype).min)
    hidden = decoder(**tokens, attention_mask=mask, position_ids=position_ids[pk.src_row, pk.src_col],
                     use_cache=False).last_hidden_state
    flat: torch.Tensor = hidden.reshape(-1, hidden.shape[-1])
    return flat[pk.predict.reshape(-1)].reshape(rows, t, -1)


def forward(lm: torch.nn.Module, *, input_ids: torch.Tensor, attention_mask: torch.Tensor,
            position_ids: torch.Tensor, completion_ids: torch.Tensor, completion_mask: torch.Tensor,
            temperature: float = 1.0, chunk_elements: int = CHUNK_ELEMENTS, keep_elements: int = 0,
            share_prefix: bool = False, pack_max_tokens: int = 0, truncation: trunc_mod.Truncation | None = None,
            outside: trunc_mod.Outside | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(logp [B, T] float32, zero on padding; entropy summed over completion tokens, detached scalar) of
    ``completion_ids`` under the HF causal LM ``lm`` (see the module docstring for the memory bound and for
    ``share_prefix``), of the distribution truncated as the sampler's ``truncation`` (None: untruncated);
    ``outside`` counts sampled tokens outside the trainer's own kept set."""
    rows, t = completion_ids.shape
    decoder = lm.get_decoder()  # type: ignore[operator]
    head = lm.get_output_embeddings()  # type: ignore[operator]
    fused = lmhead.applies(lm, input_ids.device)            # one gradient buffer for the head's weight
    buffer = lmhead.WeightGrad()
    hidden = None
    if pack_max_tokens > 0:
        embed = None
        if fused is not None and fused.embedding is not None:
            def embed(ids: torch.Tensor) -> torch.Tensor:
                assert fused is not None
                return lmhead.embed(fused, ids, buffer)
        hidden = _packed_hidden(lm, decoder, input_ids=input_ids, attention_mask=attention_mask,
                                position_ids=position_ids, t=int(t), max_tokens=pack_max_tokens, embed=embed)
    if hidden is None and share_prefix:
        hidden = _shared_prefix_hidden(decoder, input_ids=input_ids, attention_mask=attention_mask,
                                       position_ids=position_ids, t=int(t))
        if hidden is not None and fused is not None:        # the model's own embedding ran: the head delivers
            fused = lmhead.Tied(head=fused.head, embedding=None)
    if hidden is None:
        if fused is not None and fused.embedding is not None:   # tied: the embedding adds into the same buffer
            tokens: dict[str, torch.Tensor] = {"inputs_embeds": lmhead.embed(fused, input_ids, buffer)}
        else:
            tokens = {"input_ids": input_ids}
        hidden = decoder(**tokens, attention_mask=attention_mask, position_ids=position_ids,
                         use_cache=False).last_hidden_state
        hidden = hidden[:, -(t + 1):-1, :]                  # position P-1+j predicts completion token j
    where = completion_mask > 0
    picked, ids = hidden[where], completion_ids[where]     # [N, H], [N] in row-major order
    vocab = int(head.weight.shape[0])
    step = max(1, chunk_elements // max(vocab, 1))
    if fused is not None:
        keep = int(picked.shape[0]) * vocab <= keep_elements      # backward reuses the forward's probabilities
        lp, ent = lmhead.logprobs(fused, picked, ids, temperature=temperature, chunk=step, buffer=buffer,
                                  keep=keep, truncation=truncation, outside=outside)
        parts, entropy = [lp], ent.sum()
    else:
        parts, entropy = _head_chunks(head, picked, ids, temperature=temperature, step=step,
                                      truncation=truncation, outside=outside)
    logp = torch.zeros((rows, t), dtype=torch.float32, device=hidden.device)
    if parts:
        logp = logp.index_put(tuple(where.nonzero().t()), torch.cat(parts))
    return logp, entropy


def _head_chunks(head: torch.nn.Module, picked: torch.Tensor, ids: torch.Tensor, *, temperature: float,
                 step: int, truncation: trunc_mod.Truncation | None = None,
                 outside: trunc_mod.Outside | None = None) -> tuple[list[torch.Tensor], torch.Tensor]:
    """The plain path: the head module over ``step`` positions at a time, each chunk checkpointed."""
    parts: list[torch.Tensor] = []
    entropy = torch.zeros((), dtype=torch.float32, device=picked.device)
    for i in range(0, int(picked.shape[0]), step):
        if torch.is_grad_enabled():
            once = trunc_mod.Outside() if outside is not None else None    # the recomputation counts into it again
            lp, ent = checkpoint.checkpoint(_head_chunk, head, picked[i:i + step], ids[i:i + step], temperature,
                                            truncation, once, use_reentrant=False)
            if outside is not None and once is not None:
                outside.tokens += once.tokens
        else:
            lp, ent = _head_chunk(head, picked[i:i + step], ids[i:i + step], temperature, truncation, outside)
        parts.append(lp)
        entropy = entropy + ent.detach().sum()
    return parts, entropy


def completion_logprobs(*, model: torch.nn.Module, batch: batch_mod.Batch, temperature: float = 1.0,
                        device: torch.device | str = "cpu",
                        truncation: trunc_mod.Truncation | None = None) -> TokenLogprobs:
    """Logprobs of ``batch.completion_ids`` under ``model`` (an HF causal LM), truncated as ``truncation``."""
    mask = batch.completion_mask.to(device)
    logp, ent = forward(model, input_ids=batch.input_ids.to(device), attention_mask=batch.attention_mask.to(device),
                        position_ids=batch.position_ids.to(device), completion_ids=batch.completion_ids.to(device),
                        completion_mask=mask, temperature=temperature, truncation=truncation)
    return TokenLogprobs(logp=logp, entropy=float(ent) / max(float(mask.sum().item()), 1.0))
