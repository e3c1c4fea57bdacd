"""The trainer's logprobs honour the sampler's topP/topK: equal to vLLM's processed logprobs of its sampled tokens.

``vllm`` tests: the shared engine (``conftest.tiny_engine``) gets perturbed tiny weights (peaked distributions, as
after training); it samples with top-p / top-k and the trainer's module (``policy.Policy`` with the truncation the
trainer derives from ``spec.algorithm``) scores the same tokens teacher-forced. Tolerance: ``ATOL`` = 2e-3, the one
``test_weightsync.test_sampled_logprobs_follow_the_convention`` uses for topP 1. The untruncated logprobs must miss
by more than that (the truncation is what makes them equal). CPU tests: the kept set equals vLLM's own function's
and the plain LM head path equals the fused one (values and gradients).
"""
from __future__ import annotations

import pytest
import torch
import transformers

from kubeforge.api import rljob
from kubeforge.runtime import types
from kubeforge.runtime.learner import batch as batch_mod
from kubeforge.runtime.learner import logprobs, policy, truncation
from test_weightsync import ATOL, PROMPTS, trainer_model

MAX_TOKENS = 8
CASES = [  # (temperature, topP, topK)
    (1.0, 1.0, 0),
    (1.0, 0.9, 0),
    (1.0, 1.0, 20),
    (0.7, 0.9, 20),
]


def _trainer_logprobs(model: transformers.PreTrainedModel, out: list, *, temperature: float, top_p: float,
                      top_k: int, truncate: bool = True) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(trainer logp [B, T], vLLM logp [B, T], mask) of every sampled completion, through the trainer's module."""
    algo = rljob.AlgorithmSpec(temperature=temperature, top_p=top_p, top_k=top_k)
    trunc = truncation.Truncation.of(temperature=algo.temperature, top_k=algo.top_k, top_p=algo.top_p)
    pol = policy.Policy(model, temperature=temperature, truncation=trunc if truncate else None)
    groups = [types.RolloutGroup(prompt=p, prompt_token_ids=ids, completions=comps, policy_version=0,
                                 rewards=[float(i) for i in range(len(comps))])
              for p, (ids, comps) in zip(PROMPTS, out)]
    b = batch_mod.collate(groups=groups, pad_id=0, scale_by_std=False)
    with torch.no_grad():
        logp, _ = pol.run(b, device=torch.device("cpu"))
    return logp, b.behaviour_logp, pol.outside.tokens


@pytest.mark.vllm
@pytest.mark.parametrize(("temperature", "top_p", "top_k"), CASES)
def test_trainer_logprobs_equal_vllm_processed_logprobs(weight_sync: object, tiny_engine: object,
                                                        tiny_model_dir: object, temperature: float, top_p: float,
                                                        top_k: int) -> None:
    model = trainer_model(tiny_model_dir, noise_seed=5)
    weight_sync.sync(model.named_parameters(), version=5)  # type: ignore[attr-defined]
    out = tiny_engine.generate(PROMPTS, n=4, max_tokens=MAX_TOKENS,  # type: ignore[attr-defined]
                               temperature=temperature, top_p=top_p, top_k=top_k, seed=13, chat_template=False)
    logp, behaviour, outside = _trainer_logprobs(model, out, temperature=temperature, top_p=top_p, top_k=top_k)
    mask = batch_mod.collate(groups=[types.RolloutGroup(prompt=p, prompt_token_ids=ids, completions=c,
                                                        policy_version=0, rewards=[0.0] * len(c))
                                     for p, (ids, c) in zip(PROMPTS, out)], pad_id=0,
                             scale_by_std=False).completion_mask > 0
    diff = (logp - behaviour).abs()[mask]
    assert torch.isfinite(logp[mask]).all()
    assert float(diff.max()) < ATOL, f"max |trainer - vLLM| = {float(diff.max()):.2e} over {int(mask.sum())} tokens"
    assert outside <= 1, outside          # a boundary flip is possible, not common
    if top_p < 1.0 or top_k > 0:          # not vacuous: without the truncation the logprobs differ
        raw, _, _ = _trainer_logprobs(model, out, temperature=temperature, top_p=top_p, top_k=top_k,
                                      truncate=False)
        assert float((raw - behaviour).abs()[mask].max()) > 10 * ATOL


# ---------------------------------------------------------------- CPU: the kept set and the two LM head paths


@pytest.mark.parametrize(("top_k", "top_p"), [(20, 1.0), (0, 0.9), (20, 0.9), (5, 0.5), (0, 0.8)])
def test_kept_set_is_vllms(top_k: int, top_p: float) -> None:
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p_pytorch

    gen = torch.Generator().manual_seed(top_k + int(top_p * 100))
    z = torch.randn(32, 288, generator=gen) * 3
    z[0, :4] = z[0, 4]                                     # ties at whatever rank they land
    k = torch.full((32,), top_k, dtype=torch.int32) if top_k else None
    p = torch.full((32,), top_p) if top_p < 1 else None
    want = apply_top_k_top_p_pytorch(z.clone(), k, p, allow_cpu_sync=True) != float("-inf")
    got = truncation.keep_mask(z, truncation.Truncation(top_k=top_k, top_p=top_p))
    assert torch.equal(got, want)


def test_truncation_off_when_greedy_or_unset() -> None:
    assert truncation.Truncation.of(temperature=0.0, top_k=20, top_p=0.9) is None
    assert truncation.Truncation.of(temperature=1.0, top_k=0, top_p=1.0) is None
    assert truncation.Truncation.of(temperature=1.0, top_k=-1, top_p=1.0) is None
    assert truncation.Truncation.of(temperature=1.0, top_k=20, top_p=1.0) == truncation.Truncation(20, 1.0)


def test_sampled_token_outside_the_set_is_kept_and_counted() -> None:
    z = torch.tensor([[5.0, 4.0, 0.0, -1.0]])
    out = truncation.Outside()
    masked = truncation.apply(z, torch.tensor([3]), truncation.Truncation(top_k=1), out)
    assert out.tokens == 1
    lp = torch.log_softmax(masked, dim=-1)
    assert torch.isfinite(lp[0, [0, 3]]).all() and torch.isinf(lp[0, [1, 2]]).all()
    assert float(lp[0, 3]) == pytest.approx(float(torch.log_softmax(torch.tensor([5.0, -1.0]), 0)[1]))


def _tiny_lm(tied: bool) -> transformers.PreTrainedModel:
    cfg = transformers.Qwen2Config(vocab_size=97, hidden_size=64, intermediate_size=64, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=2, tie_word_embeddings=tied)
    torch.manual_seed(0)
    lm = transformers.Qwen2ForCausalLM(cfg).float()
    with torch.no_grad():
        lm.lm_head.weight.mul_(40.0)                       # peaked distributions: the truncation bites
    return lm


@pytest.mark.parametrize("tied", [True, False])
def test_plain_and_fused_heads_agree_under_truncation(tied: bool) -> None:
    lm = _tiny_lm(tied)
    gen = torch.Generator().manual_seed(1)
    rows, p, t = 3, 5, 6
    ids = torch.randint(1, 97, (rows, p + t), generator=gen)
    kw = dict(input_ids=ids, attention_mask=torch.ones_like(ids), position_ids=torch.arange(p + t).expand(rows, -1),
              completion_ids=ids[:, p:], completion_mask=torch.ones(rows, t), temperature=0.8,
              truncation=truncation.Truncation(top_k=10, top_p=0.8), chunk_elements=97 * 4)
    results = []
    for hooked in (False, True):    # a forward hook on the head turns the fused path off (lmhead.applies)
        lm.zero_grad(set_to_none=True)
        handle = lm.lm_head.register_forward_hook(lambda *a: None) if hooked else None
        out = truncation.Outside()
        logp, ent = logprobs.forward(lm, **kw, outside=out)
        assert torch.isfinite(logp).all() and torch.isfinite(ent)
        logp.sum().backward()
        results.append((logp.detach(), float(ent), lm.lm_head.weight.grad.clone(), out.tokens))
        if handle is not None:
            handle.remove()
    (a, ea, ga, oa), (b, eb, gb, ob) = results
    assert torch.allclose(a, b, atol=1e-5) and ea == pytest.approx(eb, rel=1e-5) and oa == ob
    assert torch.isfinite(ga).all() and torch.allclose(ga, gb, atol=1e-4)
