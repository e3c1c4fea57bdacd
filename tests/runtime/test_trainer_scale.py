"""Trainer at scale, in one process: mixed precision with float32 masters, micro-batches by token budget,
chunked completion-only logprobs, activation checkpointing. (2-process FSDP runs: test_trainer_fsdp.py.)"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

import _trainer_util as util
from kubeforge.runtime.learner import batch as batch_mod
from kubeforge.runtime.learner import logprobs, step


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return util.build_tiny(tmp_path_factory.mktemp("tiny") / "model")


def test_bf16_compute_keeps_float32_masters_that_move_at_lr_1e_6(tiny: Path) -> None:
    t = step.Trainer(model_path=tiny, algorithm=util.algorithm(learningRate=1e-6), dtype="bfloat16")
    assert all(p.dtype == torch.float32 for p in t.model.parameters())
    assert all(v.dtype == torch.float32 for st in t.optimizer.state.values() for v in st.values()
               if isinstance(v, torch.Tensor) and v.numel() > 1)
    before = {n: p.detach().clone() for n, p in t.model.named_parameters()}
    t.train_step(groups=util.synthetic_groups(step=0, prompts=4, group_size=4))
    grads = {n: p.detach() - before[n] for n, p in t.model.named_parameters()}
    moved = sum(int((d != 0).sum()) for d in grads.values())
    total = sum(d.numel() for d in grads.values())
    assert moved > 0.9 * total, (moved, total)       # the float32 masters took the step
    # the same update applied to pure bf16 weights rounds away: the weights would not move at all
    kept = sum(int(((before[n] + d).to(torch.bfloat16) != before[n].to(torch.bfloat16)).sum())
               for n, d in grads.items())
    assert kept < 0.1 * total, (kept, total)
    # and a pure-bf16 AdamW (the old behaviour) really loses it
    pure = step.load_model(path=tiny, dtype="bfloat16", device=torch.device("cpu"))
    start = {n: p.detach().clone() for n, p in pure.named_parameters()}
    opt = torch.optim.AdamW(pure.parameters(), lr=1e-6)
    for p in pure.parameters():
        p.grad = torch.randn_like(p)
    opt.step()
    changed = sum(int((p.detach() != start[n]).sum()) for n, p in pure.named_parameters())
    assert changed < 0.1 * total, (changed, moved, total)
    assert t.named_tensors().meta[0].dtype == torch.bfloat16          # generators get the compute dtype
    assert next(iter(t.named_tensors()))[1].dtype == torch.bfloat16


def test_bf16_mixed_precision_step_is_close_to_float32(tiny: Path) -> None:
    groups = util.synthetic_groups(step=0, prompts=4, group_size=4)
    m32 = step.Trainer(model_path=tiny, algorithm=util.algorithm()).train_step(groups=groups)
    m16 = step.Trainer(model_path=tiny, algorithm=util.algorithm(), dtype="bfloat16").train_step(groups=groups)
    assert m16.loss == pytest.approx(m32.loss, rel=0.05, abs=0.02)
    assert m16.tokens == m32.tokens


@pytest.mark.parametrize("loss", ["GRPO", "DAPO", "DrGRPO"])
def test_micro_batched_step_equals_whole_batch_step(tiny: Path, loss: str) -> None:
    whole = step.Trainer(model_path=tiny, algorithm=util.algorithm(loss=loss))
    micro = step.Trainer(model_path=tiny, algorithm=util.algorithm(loss=loss),
                         scale=step.Scale(micro_batch_tokens=24))
    grads: dict[int, list[torch.Tensor]] = {}
    for t in (whole, micro):   # the gradients AdamW is about to use (after all-reduce and clipping)
        t.optimizer.register_step_pre_hook(
            lambda opt, *_: grads.__setitem__(id(opt), [p.grad.clone() for p in opt.param_groups[0]["params"]]))
    for s in range(2):
        groups = util.synthetic_groups(step=s, prompts=5, group_size=4)
        rows = batch_mod.rows_of(groups=groups, scale_by_std=True)
        assert len(batch_mod.micro_batches(rows=rows, pad_id=0, max_tokens=24)) >= 4
        a, b = whole.train_step(groups=groups), micro.train_step(groups=groups)
        assert b.loss == pytest.approx(a.loss, rel=1e-5, abs=1e-7)
        assert (b.tokens, b.completions, b.groups) == (a.tokens, a.completions, a.groups)
        assert b.entropy == pytest.approx(a.entropy, rel=1e-5)
        assert b.grad_norm == pytest.approx(a.grad_norm, rel=1e-4)
        for ga, gb in zip(grads[id(whole.optimizer)], grads[id(micro.optimizer)]):
            assert torch.allclose(ga, gb, rtol=1e-4, atol=1e-5), (s, float((ga - gb).abs().max()), float(ga.abs().max()))


def test_micro_batches_respect_the_token_budget_and_keep_every_row() -> None:
    groups = util.synthetic_groups(step=3, prompts=6, group_size=4)
    rows = batch_mod.rows_of(groups=groups, scale_by_std=True)
    for budget in (1, 9, 20, 64, 10_000):
        mbs = batch_mod.micro_batches(rows=rows, pad_id=0, max_tokens=budget)
        assert sum(b.rows for b in mbs) == len(rows)
        for b in mbs:
            assert b.rows == 1 or b.input_ids.numel() <= budget
        got = sorted(round(float(a), 6) for b in mbs for a in b.advantages)
        assert got == sorted(round(r.advantage, 6) for r in rows)
    assert len(batch_mod.micro_batches(rows=rows, pad_id=0, max_tokens=None)) == 1


def test_chunked_logprobs_and_gradients_equal_the_full_log_softmax(tiny: Path) -> None:
    t = step.Trainer(model_path=tiny, algorithm=util.algorithm())
    b = batch_mod.collate(groups=util.synthetic_groups(step=1, prompts=3, group_size=3), pad_id=0,
                          scale_by_std=True)
    args = dict(input_ids=b.input_ids, attention_mask=b.attention_mask, position_ids=b.position_ids,
                completion_ids=b.completion_ids, completion_mask=b.completion_mask)
    chunked, ent = logprobs.forward(t.model, **args, chunk_elements=2 * util.VOCAB, temperature=0.7)  # 2 rows/chunk
    (chunked * b.completion_mask).sum().backward()
    g_chunked = [p.grad.clone() for p in t.model.parameters()]
    t.model.zero_grad()
    logits = t.model(input_ids=b.input_ids, attention_mask=b.attention_mask, position_ids=b.position_ids,
                     logits_to_keep=b.completion_len + 1).logits[:, :-1].float() / 0.7
    logsm = torch.log_softmax(logits, dim=-1)
    full = logsm.gather(-1, b.completion_ids.unsqueeze(-1)).squeeze(-1) * b.completion_mask
    (full * b.completion_mask).sum().backward()
    assert torch.allclose(chunked, full, atol=1e-5)
    assert float(ent) == pytest.approx(float((-(logsm.exp() * logsm).sum(-1) * b.completion_mask).sum()), rel=1e-5)
    for p, g in zip(t.model.parameters(), g_chunked):
        assert torch.allclose(p.grad, g, atol=1e-5)


def test_activation_checkpointing_gives_the_same_step(tiny: Path) -> None:
    groups = util.synthetic_groups(step=0, prompts=3, group_size=4)
    a = step.Trainer(model_path=tiny, algorithm=util.algorithm())
    b = step.Trainer(model_path=tiny, algorithm=util.algorithm(), scale=step.Scale(activation_checkpointing=True))
    assert b.model.is_gradient_checkpointing
    ma, mb = a.train_step(groups=groups), b.train_step(groups=groups)
    assert mb.loss == pytest.approx(ma.loss, rel=1e-6)
    for p, q in zip(a.model.parameters(), b.model.parameters()):
        assert torch.allclose(p, q, atol=1e-6)
