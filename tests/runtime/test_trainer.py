"""The Trainer on a tiny real model: logprob gathering, learning a toy reward, and 2 gloo ranks in 2 processes."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import _trainer_util as util
import test_config as tc
from kubeforge.runtime import config
from kubeforge.runtime.learner import batch as batch_mod
from kubeforge.runtime.learner import logprobs, parallel, step

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return util.build_tiny(tmp_path_factory.mktemp("tiny") / "model")


def test_padded_batch_logprobs_match_each_sequence_alone(tiny: Path) -> None:
    t = step.Trainer(model_path=tiny, algorithm=util.algorithm())
    groups = util.synthetic_groups(step=0, prompts=3, group_size=3)
    b = batch_mod.collate(groups=groups, pad_id=t.pad_id, scale_by_std=True)
    with torch.no_grad():
        got = logprobs.completion_logprobs(model=t.model, batch=b).logp
        row = 0
        for g in groups:
            for c in g.completions:
                ids = torch.tensor([g.prompt_token_ids.tolist() + c.token_ids.tolist()])
                logsm = torch.log_softmax(t.model(input_ids=ids).logits[0].float(), dim=-1)
                p = len(g.prompt_token_ids)
                want = [float(logsm[p - 1 + j, tok]) for j, tok in enumerate(c.token_ids)]
                assert got[row, :len(want)].tolist() == pytest.approx(want, abs=1e-5)
                row += 1


def _tokens(kw: dict[str, torch.Tensor | None]) -> torch.Tensor:
    """The decoder's input: token ids, or the embeddings of the tied head's path (learner/lmhead.py)."""
    ids = kw.get("input_ids")
    out = ids if ids is not None else kw["inputs_embeds"]
    assert out is not None
    return out


@pytest.mark.parametrize("packed", [True, False])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_shared_prompts_run_once_with_the_full_forwards_logprobs_and_gradients(tiny: Path, packed: bool,
                                                                                dtype: str) -> None:
    """logprobs "Shared prompts": each distinct prompt goes through the decoder once, either packed with its
    group's completions into one row under a block mask (``packed``) or its keys and values indexed out to its
    group's rows; logp, entropy and every parameter's gradient equal the full forward's (float32: to float
    rounding; the bf16 compute copy, eager attention as the trainer runs it: within bf16 rounding)."""
    t = step.Trainer(model_path=tiny, algorithm=util.algorithm(), dtype=dtype)
    lm = t.compute_policy.lm
    groups = util.synthetic_groups(step=0, prompts=3, group_size=4)
    assert len({len(g.prompt_token_ids) for g in groups}) > 1          # left padding differs between prompts
    b = batch_mod.collate(groups=groups, pad_id=t.pad_id, scale_by_std=True)
    calls: list[tuple[int, int]] = []
    hook = lm.get_decoder().register_forward_pre_hook(
        lambda mod, args, kw: calls.append(tuple(_tokens(kw).shape[:2])), with_kwargs=True)
    weights = torch.randn(b.completion_ids.shape, generator=torch.Generator().manual_seed(0))

    def run(share: bool) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
        t.model.zero_grad(set_to_none=True)
        with logprobs.attention(lm, "eager" if dtype == "bfloat16" else None):
            logp, ent = logprobs.forward(lm, input_ids=b.input_ids, attention_mask=b.attention_mask,
                                         position_ids=b.position_ids, completion_ids=b.completion_ids,
                                         completion_mask=b.completion_mask, share_prefix=share and not packed,
                                         pack_max_tokens=logprobs.PACK_MAX_TOKENS if share and packed else 0)
        (logp * weights).sum().backward()
        return logp.detach(), ent.detach(), [p.grad.clone() for p in t.model.parameters() if p.grad is not None]

    full = run(False)
    assert calls == [tuple(b.input_ids.shape)]
    calls.clear()
    shared = run(True)
    hook.remove()
    p_len = b.input_ids.shape[1] - b.completion_len
    assert calls == ([(3, p_len + 4 * b.completion_len)] if packed else [(3, p_len), (12, b.completion_len)])
    m = b.completion_mask > 0
    if dtype == "float32":
        torch.testing.assert_close(shared[0], full[0], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(shared[1], full[1], atol=1e-4, rtol=1e-5)
        assert len(shared[2]) == len(full[2])
        for got, want in zip(shared[2], full[2]):
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)
    else:
        assert float((shared[0] - full[0])[m].abs().max()) < 0.02
        assert float(shared[1]) == pytest.approx(float(full[1]), rel=0.01)
        num = sum(float(((a - w) ** 2).sum()) for a, w in zip(shared[2], full[2]))
        assert len(shared[2]) == len(full[2]) and (num / sum(float((w ** 2).sum()) for w in full[2])) ** 0.5 < 0.05
    assert not t.policy.share_prefix              # cached: measured slower on CPU, the trainer does not use it
    # packed: the trainer on CPU packs in every compute dtype (docs/trainer.md "Packed groups"): float32 too, where
    # the unpacked path computed each prompt once per completion (demo step 25.1 s -> 8.7 s on an AVX2 CPU)
    assert t.compute_policy.pack_max_tokens == logprobs.PACK_MAX_TOKENS


def test_logit_temperature_divides_logits(tiny: Path) -> None:
    # the generator's processed logprobs are log_softmax(logits / T): the trainer must compute the same
    t = step.Trainer(model_path=tiny, algorithm=util.algorithm())
    g = util.synthetic_groups(step=0, prompts=1, group_size=1)[0]
    b = batch_mod.collate(groups=[g], pad_id=t.pad_id, scale_by_std=True)
    with torch.no_grad():
        got = logprobs.completion_logprobs(model=t.model, batch=b, temperature=2.0).logp[0]
        ids = torch.tensor([g.prompt_token_ids.tolist() + g.completions[0].token_ids.tolist()])
        logsm = torch.log_softmax(t.model(input_ids=ids).logits[0].float() / 2.0, dim=-1)
    p = len(g.prompt_token_ids)
    want = [float(logsm[p - 1 + j, tok]) for j, tok in enumerate(g.completions[0].token_ids)]
    assert got[:len(want)].tolist() == pytest.approx(want, abs=1e-5)


def test_mean_reward_improves_on_toy_problem(tiny: Path) -> None:
    # reward = share of sampled tokens equal to TARGET; a random 12-token model starts near 1/12
    torch.manual_seed(0)
    t = step.Trainer(model_path=tiny, algorithm=util.algorithm(learningRate=3e-3, maxNewTokens=4))
    rewards = []
    for s in range(15):
        groups = util.on_policy_groups(t.model, step=s, version=t.policy_version, prompts=8, group_size=8,
                                       max_new=4, seed=1)
        m = t.train_step(groups=groups)
        rewards.append(m.mean_reward)
        assert m.tokens == 8 * 8 * 4 and m.completions == 64 and m.groups == 8
        assert m.ratio_mean == pytest.approx(1.0, abs=1e-3)   # on-policy: ratio 1 before the update
        assert m.grad_norm > 0 or m.zero_signal_groups == 8   # no gradient only once every group is solved
    assert t.step == t.policy_version == 15
    final = util.on_policy_groups(t.model, step=99, version=t.policy_version, prompts=8, group_size=32,
                                  max_new=4, seed=2)
    final_reward = sum(r for g in final for r in (g.rewards or [])) / (8 * 32)
    first = sum(rewards[:3]) / 3
    assert final_reward > first + 0.3, (rewards, final_reward)


def test_kl_reference_is_frozen_and_reported(tiny: Path) -> None:
    t = step.Trainer(model_path=tiny, algorithm=util.algorithm(klCoef=0.5, learningRate=1e-2))
    assert t.reference is not None and not any(p.requires_grad for p in t.reference.parameters())
    before = [p.clone() for p in t.reference.parameters()]
    m0 = t.train_step(groups=util.synthetic_groups(step=0, prompts=2, group_size=4))
    m1 = t.train_step(groups=util.synthetic_groups(step=1, prompts=2, group_size=4))
    assert m0.kl == pytest.approx(0.0, abs=1e-7)   # policy == reference at step 0
    assert m1.kl > 0
    assert all(torch.equal(a, b) for a, b in zip(before, t.reference.parameters()))


def test_named_tensors_are_hf_names_of_the_live_weights(tiny: Path) -> None:
    t = step.Trainer(model_path=tiny, algorithm=util.algorithm())
    named = dict(t.named_tensors())
    assert "model.embed_tokens.weight" in named and "model.layers.0.self_attn.q_proj.weight" in named
    t.train_step(groups=util.synthetic_groups(step=0, prompts=2, group_size=4))
    assert torch.equal(dict(t.named_tensors())["model.norm.weight"], t.model.model.norm.weight)


def test_dist_config_of_the_role_config(tmp_path: Path) -> None:
    manifest = tmp_path / "job.json"
    manifest.write_text(json.dumps(tc.DOC))            # two trainer pods at t-0:31000 and t-1:31010
    c = parallel.DistConfig.of_role(config.from_env(tc.env_for(manifest, role="trainer", index=1)), backend="gloo")
    assert (c.rank, c.world_size, c.master_host, c.master_port) == (1, 2, "t-0", 31003)
    with pytest.raises(ValueError, match="KUBEFORGE_INDEX"):
        config.from_env({**tc.env_for(manifest, role="trainer", index=1), "KUBEFORGE_INDEX": "2"})


@pytest.mark.slow
def test_two_gloo_ranks_stay_bit_identical_equal_one_big_batch_and_resume(tiny: Path, tmp_path: Path) -> None:
    port, steps, prompts = util.free_port(), 3, 5   # 5 prompts: rank 0 gets 3, rank 1 gets 2 (uneven shares)
    losses = ["GRPO", "DAPO"]                       # DAPO: the token denominator must be reduced across ranks
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, str(HERE / "_trainer_util.py"), "worker", "--model", str(tiny),
                               "--out", str(tmp_path), "--losses", ",".join(losses), "--rank", str(r),
                               "--world", "2", "--port", str(port), "--steps", str(steps),
                               "--prompts", str(prompts)], env=env)
             for r in range(2)]
    for p in procs:
        assert p.wait(timeout=300) == 0

    def params(name: str) -> dict[str, torch.Tensor]:
        return dict(torch.load(tmp_path / name, weights_only=True))

    for loss in losses:
        r0, r1 = params(f"{loss}-rank0.pt"), params(f"{loss}-rank1.pt")
        assert all(torch.equal(r0[k], r1[k]) for k in r0)
        h0, h1 = (json.loads((tmp_path / f"{loss}-rank{r}.json").read_text()) for r in range(2))
        assert [m["loss"] for m in h0] == [m["loss"] for m in h1]
        assert h0[-1]["step"] == h1[-1]["step"] == steps
        # the same steps in one process on all groups: the same model up to float summation order
        single = step.Trainer(model_path=tiny, algorithm=util.algorithm(loss=loss))
        base = {k: v.clone() for k, v in single.model.state_dict().items()}
        for s in range(steps):
            m = single.train_step(groups=util.synthetic_groups(step=s, prompts=prompts, group_size=4))
            assert m.loss == pytest.approx(h0[s]["loss"], rel=1e-4, abs=1e-6)
            assert m.tokens == h0[s]["tokens"]
        for k, v in single.model.state_dict().items():
            assert torch.allclose(v, r0[k], atol=1e-5), k
        assert any(not torch.equal(base[k], r0[k]) for k in r0)   # and training did move the weights
    # resume on 2 ranks from rank 0's checkpoint (rank 1 has no folder): same weights as never stopping
    assert not (tmp_path / "ckpt-rank1").exists()
    c0, c1 = params("continued-rank0.pt"), params("continued-rank1.pt")
    s0, s1 = params("resumed-rank0.pt"), params("resumed-rank1.pt")
    assert all(torch.equal(c0[k], s0[k]) and torch.equal(c0[k], s1[k]) and torch.equal(c0[k], c1[k]) for k in c0)
