"""The LM head / embedding autograd functions (learner/lmhead.py) give the plain HF path's logprobs, entropy and
gradients, tied and untied, in float32 and bf16, with micro-batches accumulating, and hold one weight gradient."""
from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
import transformers

from kubeforge.runtime.learner import lmhead, logprobs


def _lm(*, tied: bool, arch: str = "qwen2", dtype: torch.dtype = torch.float32, pad: int | None = 0,
        seed: int = 0) -> torch.nn.Module:
    common = dict(vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=tied, pad_token_id=pad)
    torch.manual_seed(seed)
    cfg = transformers.Qwen2Config(**common) if arch == "qwen2" else transformers.LlamaConfig(**common)
    lm = (transformers.Qwen2ForCausalLM(cfg) if arch == "qwen2" else transformers.LlamaForCausalLM(cfg)).to(dtype)
    assert (lm.get_input_embeddings().weight is lm.get_output_embeddings().weight) == tied
    return lm


def _batch(seed: int = 1) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    rows, p, t = 5, 7, 6
    ids = torch.randint(1, 97, (rows, p + t), generator=g)
    ids[0, :3] = 0                                   # left padding with the pad token (padding_idx rows)
    ids[1, 2] = 0                                    # and a pad id inside a row
    attn = torch.ones_like(ids)
    attn[0, :3] = 0
    mask = torch.ones((rows, t))
    mask[2, 4:] = 0                                  # a short completion
    return {"input_ids": ids, "attention_mask": attn, "position_ids": (attn.cumsum(1) - 1).clamp(min=0),
            "completion_ids": ids[:, p:], "completion_mask": mask}


@pytest.fixture()
def plain(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(lmhead, "applies", lambda lm, device: None)
    yield


def _run(lm: torch.nn.Module, batch: dict[str, torch.Tensor], *, temperature: float = 1.0,
         chunk_elements: int = 97 * 4, keep_elements: int = 0
         ) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    lm.zero_grad(set_to_none=True)
    weights = torch.linspace(-1.0, 2.0, batch["completion_mask"].numel()).view_as(batch["completion_mask"])
    logp, ent = logprobs.forward(lm, **batch, temperature=temperature, chunk_elements=chunk_elements,
                                 keep_elements=keep_elements)
    (logp * weights).sum().backward()
    return logp.detach(), ent, {n: p.grad.clone() for n, p in lm.named_parameters() if p.grad is not None}


def _both(make: object, batch: dict[str, torch.Tensor], monkeypatch: pytest.MonkeyPatch, **kw: float) -> tuple[
        tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]],
        tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]]:
    lm = make()  # type: ignore[operator]
    assert lmhead.applies(lm, torch.device("cpu")) is not None
    fused = _run(lm, batch, **kw)
    with monkeypatch.context() as m:
        m.setattr(lmhead, "applies", lambda lm, device: None)
        reference = _run(lm, batch, **kw)
    return fused, reference


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("arch", ["qwen2", "llama"])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logprobs_entropy_and_gradients_equal_the_plain_path(tied: bool, arch: str, temperature: float,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    batch = _batch()
    (lp, ent, grads), (lp0, ent0, grads0) = _both(lambda: _lm(tied=tied, arch=arch), batch, monkeypatch,
                                                  temperature=temperature)
    torch.testing.assert_close(lp, lp0, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ent, ent0, rtol=1e-5, atol=1e-4)
    assert grads.keys() == grads0.keys() and "model.embed_tokens.weight" in grads
    assert ("lm_head.weight" in grads) == (not tied)
    for n in grads0:
        torch.testing.assert_close(grads[n], grads0[n], rtol=1e-4, atol=1e-6, msg=n)
    if not tied:     # the pad row gets no embedding gradient (nn.Embedding's rule; tied, the head's reaches it)
        assert grads["model.embed_tokens.weight"][0].abs().max() == 0


def test_without_padding_idx_and_in_bf16(monkeypatch: pytest.MonkeyPatch) -> None:
    batch = _batch(seed=3)
    (lp, _, grads), (lp0, _, grads0) = _both(lambda: _lm(tied=True, pad=None), batch, monkeypatch)
    torch.testing.assert_close(lp, lp0, rtol=1e-5, atol=1e-5)
    for n in grads0:
        torch.testing.assert_close(grads[n], grads0[n], rtol=1e-4, atol=1e-6, msg=n)
    assert grads["model.embed_tokens.weight"][0].abs().max() > 0
    (lp, _, grads), (lp0, _, grads0) = _both(lambda: _lm(tied=True, dtype=torch.bfloat16), batch, monkeypatch)
    torch.testing.assert_close(lp, lp0, rtol=2e-2, atol=2e-2)
    for n in grads0:    # the same bf16 matmuls, summed in a different order: bf16 rounding apart
        g, g0 = grads[n].float(), grads0[n].float()
        assert (g - g0).norm() <= 0.02 * g0.norm() + 1e-6, n


def test_micro_batches_accumulate_into_the_existing_gradient_without_a_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    lm = _lm(tied=True)
    w = lm.get_input_embeddings().weight
    a, b = _batch(seed=4), _batch(seed=5)
    for mb in (a, b):
        logp, _ = logprobs.forward(lm, **mb)
        logp.sum().backward()
        if mb is a:
            first = w.grad
            assert first is not None
    assert w.grad is first                           # the second micro-batch added into the same tensor
    fused = w.grad.clone()
    lm.zero_grad(set_to_none=True)
    with monkeypatch.context() as m:
        m.setattr(lmhead, "applies", lambda lm, device: None)
        for mb in (a, b):
            logprobs.forward(lm, **mb)[0].sum().backward()
    torch.testing.assert_close(fused, w.grad, rtol=1e-4, atol=1e-6)


def test_one_buffer_takes_every_chunk_and_the_embedding_and_becomes_the_gradient(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Tied: the head's chunks (4 here) and the embedding add into one vocab x hidden buffer, allocated once by the
    first chunk, and that very tensor becomes the parameter's gradient (no copy, no second dense gradient)."""
    lm = _lm(tied=True)
    calls: list[tuple[str, int]] = []
    add_mm, add_rows = lmhead.WeightGrad.add_mm, lmhead.WeightGrad.add_rows

    def spy_mm(self: lmhead.WeightGrad, a: torch.Tensor, b: torch.Tensor) -> None:
        calls.append(("mm", 0 if self.grad is None else self.grad.data_ptr()))
        add_mm(self, a, b)

    def spy_rows(self: lmhead.WeightGrad, index: torch.Tensor, rows: torch.Tensor, *, shape: torch.Size) -> None:
        calls.append(("rows", 0 if self.grad is None else self.grad.data_ptr()))
        add_rows(self, index, rows, shape=shape)
    monkeypatch.setattr(lmhead.WeightGrad, "add_mm", spy_mm)
    monkeypatch.setattr(lmhead.WeightGrad, "add_rows", spy_rows)
    logprobs.forward(lm, **_batch(), chunk_elements=97 * 8)[0].sum().backward()
    w = lm.get_input_embeddings().weight
    assert w.grad is not None
    assert [k for k, _ in calls] == ["mm"] * 4 + ["rows"]
    assert calls[0][1] == 0 and {p for _, p in calls[1:]} == {w.grad.data_ptr()}


def test_plain_modules_run_when_the_head_is_hooked_or_under_autocast() -> None:
    lm = _lm(tied=True)
    cpu = torch.device("cpu")
    assert lmhead.applies(lm, cpu) is not None
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert lmhead.applies(lm, cpu) is None
    h = lm.get_output_embeddings().register_forward_hook(lambda m, a, o: o)
    assert lmhead.applies(lm, cpu) is None
    h.remove()
    tied = lmhead.applies(_lm(tied=False), cpu)
    assert tied is not None and tied.embedding is None


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_kept_probabilities_give_the_recomputed_gradients_with_the_head_run_once(
        tied: bool, temperature: float, monkeypatch: pytest.MonkeyPatch) -> None:
    """``keep_elements`` covering the batch: the backward reuses the forward's probabilities, so the head's logits
    are computed once per chunk instead of twice, and every logprob, entropy and gradient equals the recomputing
    path's (to float32 rounding: exp of the log-softmax instead of a second softmax); a bound below the batch's
    N x vocab recomputes."""
    batch = _batch(seed=6)
    n = int(batch["completion_mask"].sum())
    heads: list[int] = []
    logits = lmhead._logits

    def counting(hidden: torch.Tensor, weight: torch.Tensor, t: float) -> torch.Tensor:
        heads.append(int(hidden.shape[0]))
        return logits(hidden, weight, t)
    monkeypatch.setattr(lmhead, "_logits", counting)
    results = {}
    for keep_elements in (n * 97, n * 97 - 1, 0):
        heads.clear()
        run = _run(_lm(tied=tied), batch, temperature=temperature, chunk_elements=97 * 8, keep_elements=keep_elements)
        results[keep_elements] = (*run, sum(heads))
    kept, recomputed, off = results[n * 97], results[n * 97 - 1], results[0]
    assert kept[3] == n and recomputed[3] == off[3] == 2 * n     # positions through the head: once vs twice
    for other in (recomputed, off):
        torch.testing.assert_close(kept[0], other[0], rtol=0, atol=0)
        torch.testing.assert_close(kept[1], other[1], rtol=1e-6, atol=1e-6)
        assert kept[2].keys() == other[2].keys()
        for name in kept[2]:
            torch.testing.assert_close(kept[2][name], other[2][name], rtol=1e-4, atol=1e-6, msg=name)


def test_kept_probabilities_survive_a_second_backward() -> None:
    lm = _lm(tied=True)
    logp, _ = logprobs.forward(lm, **_batch(seed=7), keep_elements=1 << 20)
    logp.sum().backward(retain_graph=True)
    first = lm.get_input_embeddings().weight.grad.clone()
    lm.zero_grad(set_to_none=True)
    logp.sum().backward()
    torch.testing.assert_close(lm.get_input_embeddings().weight.grad, first, rtol=0, atol=0)


def test_the_policy_keeps_probabilities_by_default() -> None:
    from kubeforge.runtime.learner import policy

    assert policy.Policy(_lm(tied=True)).keep_elements == logprobs.KEEP_ELEMENTS > 0
