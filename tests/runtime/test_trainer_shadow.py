"""The trainer's bf16 compute copy (learner/compute_copy.py): same numerics as autocast over the float32 masters
within a stated bf16 tolerance, refreshed once per optimizer step, gradients accumulated in float32 in the masters."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

import _trainer_util as util
from kubeforge.api import rljob
from kubeforge.runtime.learner import batch as batch_mod
from kubeforge.runtime.learner import policy as policy_mod
from kubeforge.runtime.learner import precision, step


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return util.build_tiny(tmp_path_factory.mktemp("tiny") / "model")


def _copy_matches_masters(t: step.Trainer) -> None:
    assert t.shadow is not None
    copies = dict(t.shadow.module.named_parameters())
    for n, m in t.policy.named_parameters():
        assert copies[n].dtype == torch.bfloat16, n
        assert torch.equal(copies[n], m.detach().to(torch.bfloat16)), n
        assert copies[n].grad is None, n


def _global_rel(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    num = sum(float(((a[n] - b[n]) ** 2).sum()) for n in b)
    den = sum(float((b[n] ** 2).sum()) for n in b)
    return (num / den) ** 0.5


def test_compute_copy_logprobs_and_gradients_are_as_close_to_float32_as_autocasts(tiny: Path) -> None:
    """Stated tolerance: against the float32 forward, the copy's logprobs and gradients are within 2x autocast's
    own error (+ a small floor), and within 0.02 nats / 5% (global gradient norm) of autocast itself."""
    t = step.Trainer(model_path=tiny, algorithm=util.algorithm(), dtype="bfloat16")
    assert t.shadow is not None and t.compute_policy is t.shadow.module
    assert all(p.dtype == torch.float32 for p in t.model.parameters())            # masters untouched
    assert all(b.dtype == torch.float32 for b in t.shadow.module.buffers() if b.is_floating_point())
    _copy_matches_masters(t)
    groups = util.synthetic_groups(step=0, prompts=3, group_size=4)
    b = batch_mod.collate(groups=groups, pad_id=t.pad_id, scale_by_std=True)
    w = torch.randn(b.completion_ids.shape, generator=torch.Generator().manual_seed(0)) * b.completion_mask

    def run(mode: str) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        t.model.zero_grad(set_to_none=True)
        if mode == "copy":
            logp, _ = t.compute_policy.run(b, device=t.device)
        else:
            with precision.autocast(device=t.device, dtype=torch.bfloat16 if mode == "autocast" else torch.float32):
                logp, _ = t.policy.run(b, device=t.device)
        (logp * w).sum().backward()
        grads = {n: p.grad.clone() for n, p in t.model.named_parameters() if p.grad is not None}
        assert all(g.dtype == torch.float32 for g in grads.values())
        return logp.detach(), grads

    f32, auto, copy = run("float32"), run("autocast"), run("copy")
    assert all(p.grad is None for p in t.shadow.module.parameters())          # gradients went to the masters
    assert copy[1].keys() == f32[1].keys()
    m = b.completion_mask > 0
    err_auto = float((auto[0] - f32[0])[m].abs().max())
    err_copy = float((copy[0] - f32[0])[m].abs().max())
    assert err_copy <= 2 * err_auto + 2e-3, (err_copy, err_auto)
    assert float((copy[0] - auto[0])[m].abs().max()) < 0.02
    g_auto, g_copy = _global_rel(auto[1], f32[1]), _global_rel(copy[1], f32[1])
    assert g_copy <= 2 * g_auto + 0.01, (g_copy, g_auto)
    assert _global_rel(copy[1], auto[1]) < 0.05


def test_train_step_refreshes_the_copy_once_per_step_and_accumulates_micro_batches_in_float32(tiny: Path) -> None:
    groups = [util.synthetic_groups(step=s, prompts=3, group_size=4) for s in range(3)]
    whole = step.Trainer(model_path=tiny, algorithm=util.algorithm(), dtype="bfloat16")
    micro = step.Trainer(model_path=tiny, algorithm=util.algorithm(), dtype="bfloat16",
                         scale=step.Scale(micro_batch_tokens=24))
    auto = step.Trainer(model_path=tiny, algorithm=util.algorithm(), dtype="bfloat16")
    auto.shadow = None                                                 # the path before: autocast over masters
    start = {n: p.detach().clone() for n, p in auto.model.named_parameters()}
    for gs in groups:
        mw, mm, ma = whole.train_step(groups=gs), micro.train_step(groups=gs), auto.train_step(groups=gs)
        for t in (whole, micro):
            _copy_matches_masters(t)                                   # refreshed after optimizer.step()
            assert all(p.grad is None for p in t.model.parameters())
        assert mm.loss == pytest.approx(mw.loss, rel=0.02, abs=2e-3)        # bf16: other padding, other sums
        assert mm.grad_norm == pytest.approx(mw.grad_norm, rel=0.02)  # micro-batches summed in float32
        assert mw.loss == pytest.approx(ma.loss, rel=0.02, abs=2e-3)
        assert mw.grad_norm == pytest.approx(ma.grad_norm, rel=0.05)
    # 3 steps later the weights moved as autocast's did (AdamW's sign-like first steps amplify bf16 noise in the
    # smallest gradients, so compare the whole update's direction)
    up_copy = torch.cat([(p.detach() - start[n]).flatten() for n, p in whole.model.named_parameters()])
    up_auto = torch.cat([(p.detach() - start[n]).flatten() for n, p in auto.model.named_parameters()])
    cos = float(up_copy @ up_auto / (up_copy.norm() * up_auto.norm()))
    assert cos > 0.98, cos                                           # measured 0.9975


def test_resume_refreshes_the_copy_and_float32_compute_has_none(tiny: Path, tmp_path: Path) -> None:
    a = step.Trainer(model_path=tiny, algorithm=util.algorithm(learningRate=1e-2), dtype="bfloat16")
    for s in range(2):
        a.train_step(groups=util.synthetic_groups(step=s, prompts=2, group_size=4))
    a.save_checkpoint(directory=tmp_path, keep=1, data_cursor=2)
    b = step.Trainer(model_path=tiny, algorithm=util.algorithm(learningRate=1e-2), dtype="bfloat16")
    b.resume(directory=tmp_path)
    _copy_matches_masters(b)
    gs = util.synthetic_groups(step=2, prompts=2, group_size=4)
    assert b.train_step(groups=gs).loss == pytest.approx(a.train_step(groups=gs).loss, abs=1e-6)
    f32 = step.Trainer(model_path=tiny, algorithm=util.algorithm())
    assert f32.shadow is None and f32.compute_policy is f32.policy


def test_lora_with_a_compute_copy_trains_adapters_only(tiny: Path) -> None:
    spec = rljob.LoraSpec(rank=4, alpha=8, targetModules=["q_proj", "v_proj"])
    t = step.Trainer(model_path=tiny, algorithm=util.algorithm(learningRate=2e-2), dtype="bfloat16", lora=spec)
    frozen = {n: p.detach().clone() for n, p in t.model.named_parameters() if not p.requires_grad}
    for s in range(2):
        m = t.train_step(groups=util.synthetic_groups(step=s, prompts=2, group_size=4))
        assert m.grad_norm > 0
    _copy_matches_masters(t)
    assert all(torch.equal(p, frozen[n]) for n, p in t.model.named_parameters() if n in frozen)
    assert any(float(p.abs().max()) > 0 for n, p in t.model.named_parameters() if ".lora_B." in n)


def test_short_rows_run_eager_attention_with_sdpas_results_and_long_rows_keep_sdpa(tiny: Path) -> None:
    """logprobs "Short rows": the CPU compute copy runs HF's eager attention for rows up to
    policy.EAGER_ATTENTION_MAX_TOKENS tokens (same logprobs and gradients as SDPA within bf16 rounding), the
    model's own implementation above it and whenever activation checkpointing recomputes the blocks."""
    t = step.Trainer(model_path=tiny, algorithm=util.algorithm(), dtype="bfloat16")
    pol = t.compute_policy
    assert pol.eager_attention_max_tokens == policy_mod.EAGER_ATTENTION_MAX_TOKENS > 0
    own = pol.lm.config._attn_implementation
    assert own != "eager"
    seen: list[str] = []
    layer = pol.lm.get_decoder().layers[0].self_attn
    hook = layer.register_forward_pre_hook(lambda mod, args: seen.append(mod.config._attn_implementation))
    b = batch_mod.collate(groups=util.synthetic_groups(step=0, prompts=3, group_size=4), pad_id=t.pad_id,
                          scale_by_std=True)
    w = torch.randn(b.completion_ids.shape, generator=torch.Generator().manual_seed(0)) * b.completion_mask

    def run(limit: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        pol.eager_attention_max_tokens = limit
        t.model.zero_grad(set_to_none=True)
        logp, _ = pol.run(b, device=t.device)
        (logp * w).sum().backward()
        return logp.detach(), {n: p.grad.clone() for n, p in t.model.named_parameters() if p.grad is not None}

    eager, sdpa = run(policy_mod.EAGER_ATTENTION_MAX_TOKENS), run(int(b.input_ids.shape[1]) - 1)
    hook.remove()
    assert seen == ["eager", own] and pol.lm.config._attn_implementation == own     # switched for one forward
    m = b.completion_mask > 0
    assert float((eager[0] - sdpa[0])[m].abs().max()) < 0.02
    assert _global_rel(eager[1], sdpa[1]) < 0.05
    ac = step.Trainer(model_path=tiny, algorithm=util.algorithm(), dtype="bfloat16",
                      scale=step.Scale(activation_checkpointing=True))
    assert ac.compute_policy.eager_attention_max_tokens == 0
