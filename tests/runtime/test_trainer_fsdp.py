"""FSDP2 over 2 real trainer processes (gloo): same step as DDP, sharded checkpoints that resume onto 1 and onto 2
ranks with contiguous steps, micro-batches and activation checkpointing across ranks, bf16 mixed precision."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import safetensors.torch
import torch

import _trainer_util as util
from kubeforge.runtime.learner import checkpoint

HERE = Path(__file__).resolve().parent
PROMPTS = 5        # rank 0 gets 3 groups, rank 1 gets 2: uneven shares, uneven micro-batch counts


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return util.build_tiny(tmp_path_factory.mktemp("tiny") / "model")


def run(tiny: Path, out: Path, *, tag: str, sharding: str, world: int, steps: int, ckpt: Path, micro: int = 0,
        resume: bool = False, ac: bool = False, dtype: str = "float32",
        lora: bool = False, episodes: str = "") -> tuple[dict[str, torch.Tensor], list[dict]]:
    """Launch ``world`` real trainer processes; (rank 0's full parameters after the last step, step metrics)."""
    port = util.free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, str(HERE / "_trainer_util.py"), "scale-worker", "--model", str(tiny), "--out", str(out),
           "--ckpt", str(ckpt), "--sharding", sharding, "--tag", tag, "--dtype", dtype, "--world", str(world),
           "--port", str(port), "--steps", str(steps), "--prompts", str(PROMPTS), "--micro", str(micro)]
    cmd += ["--resume"] * resume + ["--ac"] * ac + ["--lora"] * lora + ["--episodes", episodes] * bool(episodes)
    procs = [subprocess.Popen([*cmd, "--rank", str(r)], env=env) for r in range(world)]
    codes = [p.wait(timeout=300) for p in procs]
    assert codes == [0] * world
    history = json.loads((out / f"{tag}.json").read_text())
    return params(out, f"{tag}-{history[-1]['step']}"), history


def params(out: Path, name: str) -> dict[str, torch.Tensor]:
    return dict(torch.load(out / f"{name}.pt", weights_only=True))


def close(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], atol: float) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.allclose(a[k], b[k], atol=atol), (k, float((a[k] - b[k]).abs().max()))


@pytest.mark.slow
def test_fsdp_matches_ddp_resumes_sharded_onto_one_and_two_ranks_and_runs_bf16(tiny: Path, tmp_path: Path) -> None:
    # DDP for 4 steps is the reference; FSDP (micro-batches of <= 20 tokens, activation checkpointing) for 3
    _, h_ddp = run(tiny, tmp_path, tag="ddp", sharding="DDP", world=2, steps=4, ckpt=tmp_path / "ddp-ckpt")
    fsdp, h_fsdp = run(tiny, tmp_path, tag="fsdp", sharding="FSDP", world=2, steps=3, ckpt=tmp_path / "ckpt",
                       micro=20, ac=True)
    for a, b in zip(h_ddp, h_fsdp):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-5, abs=1e-7)
        assert (b["tokens"], b["completions"], b["step"]) == (a["tokens"], a["completions"], a["step"])
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-4)
    close(params(tmp_path, "ddp-3"), fsdp, atol=5e-5)   # lr 1e-3 x 3 AdamW steps move weights by up to 3e-3
    start = safetensors.torch.load_file(str(tiny / "model.safetensors"))
    assert sum(float((fsdp[k] - start[k]).abs().max()) > 1e-4 for k in fsdp) > len(fsdp) // 2   # training moved them
    latest = checkpoint.latest(tmp_path / "ckpt")
    assert latest is not None and latest.name == checkpoint.dir_name(3)
    assert (latest / checkpoint.DCP / ".metadata").is_file()
    assert sorted(p.name for p in (latest / checkpoint.DCP).glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]

    # resume the sharded checkpoint onto 2 and onto 1 rank: step 4 follows step 3, as if never stopped
    on2, h2 = run(tiny, tmp_path, tag="on2", sharding="FSDP", world=2, steps=1, ckpt=tmp_path / "ckpt", resume=True)
    on1, h1 = run(tiny, tmp_path, tag="on1", sharding="FSDP", world=1, steps=1, ckpt=tmp_path / "ckpt", resume=True)
    for h in (h2, h1):
        assert h[0]["step"] == 4 == h_ddp[3]["step"]
        assert h[0]["loss"] == pytest.approx(h_ddp[3]["loss"], rel=1e-4, abs=1e-6)
    close(params(tmp_path, "ddp-4"), on2, atol=5e-5)
    close(params(tmp_path, "ddp-4"), on1, atol=5e-5)

    # bf16 compute under FSDP2's mixed precision: float32 masters, close to the float32 step, bf16 stream
    b16, h16 = run(tiny, tmp_path, tag="b16", sharding="FSDP", world=2, steps=1, ckpt=tmp_path / "b16-ckpt",
                   dtype="bfloat16", micro=16)
    assert all(v.dtype == torch.bfloat16 for v in b16.values())          # streamed in the generators' dtype
    assert h16[0]["loss"] == pytest.approx(h_ddp[0]["loss"], rel=0.05, abs=0.02)
    close({k: v.float() for k, v in params(tmp_path, "ddp-1").items()}, {k: v.float() for k, v in b16.items()},
          atol=3e-3)    # one step moves by <= 1e-3 (a flipped sign: 2e-3), bf16 rounding ~1e-4


@pytest.mark.long   # FSDP x LoRA: the long tier (docs/testing.md); FSDP = DDP and the sharded resume stay in make test
@pytest.mark.slow
def test_fsdp_lora_matches_ddp_lora(tiny: Path, tmp_path: Path) -> None:
    ddp, h_ddp = run(tiny, tmp_path, tag="ddp", sharding="DDP", world=2, steps=2, ckpt=tmp_path / "a", lora=True)
    fsdp, h_fsdp = run(tiny, tmp_path, tag="fsdp", sharding="FSDP", world=2, steps=2, ckpt=tmp_path / "b",
                       lora=True, micro=24)
    assert ddp.keys() == fsdp.keys() and all(".lora_" in k for k in ddp)        # the stream: adapters only
    for a, b in zip(h_ddp, h_fsdp):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-5, abs=1e-7)
    close(ddp, fsdp, atol=2e-4)                                                  # lr 1e-2 x 2 steps
    assert any(float(v.abs().max()) > 0 for k, v in fsdp.items() if ".lora_B." in k)


@pytest.mark.long   # FSDP x episodes: the long tier (docs/testing.md); the masking itself is checked without FSDP in make test
@pytest.mark.slow
def test_environment_tokens_give_no_gradient_under_fsdp(tiny: Path, tmp_path: Path) -> None:
    """Episodes (policy turn, environment turn, policy turn) on 2 FSDP ranks with micro-batches: perturbing the
    environment tokens' behaviour logprobs leaves the step (loss, gradient norm, every parameter) bit-identical;
    the same perturbation without the policy spans changes it (the check can fail)."""
    def one(kind: str) -> tuple[dict[str, torch.Tensor], dict]:
        p, h = run(tiny, tmp_path, tag=kind, sharding="FSDP", world=2, steps=1, ckpt=tmp_path / f"ckpt-{kind}",
                   micro=20, episodes=kind)
        return p, h[0]

    zero, h_zero = one("zero")
    perturbed, h_perturbed = one("random")
    assert (h_perturbed["loss"], h_perturbed["grad_norm"]) == (h_zero["loss"], h_zero["grad_norm"])
    assert all(torch.equal(zero[k], perturbed[k]) for k in zero)
    _, u_zero = one("zero-unmasked")
    _, u_perturbed = one("random-unmasked")
    assert (u_perturbed["loss"], u_perturbed["grad_norm"]) != (u_zero["loss"], u_zero["grad_norm"])
    assert h_zero["tokens"] < u_zero["tokens"]            # the environment tokens are out of the loss's count
