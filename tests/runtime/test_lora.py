"""LoRA in the trainer: adapters only are trained, synced and checkpointed; merged model and adapter exported."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import safetensors.torch
import torch
import transformers

import _trainer_util as util
from kubeforge.api import rljob
from kubeforge.runtime.learner import lora, step
from kubeforge.runtime.models import adapter

SPEC = rljob.LoraSpec(rank=4, alpha=8, targetModules=["q_proj", "v_proj", "down_proj"])


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return util.build_tiny(tmp_path_factory.mktemp("tiny") / "model")


def trained(tiny: Path, steps: int = 3, **kw: object) -> step.Trainer:
    t = step.Trainer(model_path=tiny, algorithm=util.algorithm(learningRate=2e-2), lora=SPEC, **kw)  # type: ignore
    for s in range(steps):
        t.train_step(groups=util.synthetic_groups(step=s, prompts=3, group_size=4))
    return t


def test_only_adapters_train_and_sync(tiny: Path) -> None:
    base = transformers.AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32)
    t = trained(tiny)
    names = {n for n, p in t.model.named_parameters() if p.requires_grad}
    assert names and all(".lora_A." in n or ".lora_B." in n for n in names)
    assert len(names) == 2 * 3 * 2                                     # 2 layers x 3 targets x (A, B)
    for n, p in base.named_parameters():                               # the base never moves
        assert torch.equal(p, t.model.get_parameter(n)), n
    assert any(float(t.model.get_parameter(n).abs().max()) > 0 for n in names if ".lora_B." in n)
    stream = t.named_tensors()
    assert {e.name for e in stream.meta} == names
    got = dict(stream)
    assert got["model.layers.0.self_attn.q_proj.lora_A.weight"].shape == (4, 128)
    assert got["model.layers.0.mlp.down_proj.lora_B.weight"].shape == (128, 4)
    assert len(t.optimizer.state) == len(names)                        # AdamW state for adapters only


def test_merged_model_equals_the_adapted_policy(tiny: Path) -> None:
    t = trained(tiny)
    merged = transformers.AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32)
    result = merged.load_state_dict(dict(lora.merged_tensors(t.model, dtype=torch.float32)), strict=False)
    assert result.missing_keys == ["lm_head.weight"] and not result.unexpected_keys   # tied: sent once
    ids = torch.tensor([[1, 5, 7, 2, 9, 3]])
    with torch.no_grad():
        assert torch.allclose(merged(ids).logits, t.model(ids).logits, atol=1e-5)
        plain = transformers.AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32)
        assert not torch.allclose(plain(ids).logits, t.model(ids).logits, atol=1e-3)   # the adapter matters


def test_export_writes_merged_model_and_peft_adapter(tiny: Path, tmp_path: Path) -> None:
    t = trained(tiny, steps=2)
    out = t.export(directory=tmp_path)
    assert out is not None
    merged = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    assert not any("lora" in n for n, _ in merged.named_parameters())
    ids = torch.tensor([[1, 5, 7, 2]])
    with torch.no_grad():
        assert torch.allclose(merged(ids).logits, t.model(ids).logits, atol=1e-5)
    cfg = json.loads((out / step.ADAPTER / adapter.CONFIG).read_text())
    assert (cfg["peft_type"], cfg["r"], cfg["lora_alpha"]) == ("LORA", 4, 8)
    assert cfg["target_modules"] == ["down_proj", "q_proj", "v_proj"]
    weights = safetensors.torch.load_file(str(out / step.ADAPTER / adapter.WEIGHTS))
    assert all(k.startswith("base_model.model.model.layers.") for k in weights) and len(weights) == 12


def test_lora_checkpoint_round_trip(tiny: Path, tmp_path: Path) -> None:
    a = trained(tiny, steps=2)
    a.save_checkpoint(directory=tmp_path, keep=1, data_cursor=6)
    b = step.Trainer(model_path=tiny, algorithm=util.algorithm(learningRate=2e-2), lora=SPEC)
    assert b.resume(directory=tmp_path) is not None
    g = util.synthetic_groups(step=2, prompts=3, group_size=4)
    assert a.train_step(groups=g).loss == b.train_step(groups=g).loss
    assert all(torch.equal(p, q) for p, q in zip(a.model.parameters(), b.model.parameters()))


def test_unknown_target_modules_are_refused(tiny: Path) -> None:
    with pytest.raises(ValueError, match="spec.model.lora.targetModules"):
        step.Trainer(model_path=tiny, algorithm=util.algorithm(),
                     lora=rljob.LoraSpec(targetModules=["no_such_proj"]))


def test_adapters_start_the_same_in_every_process(tiny: Path) -> None:
    torch.manual_seed(1)
    a = step.Trainer(model_path=tiny, algorithm=util.algorithm(), lora=SPEC)
    torch.manual_seed(2)
    b = step.Trainer(model_path=tiny, algorithm=util.algorithm(), lora=SPEC)
    assert all(torch.equal(p, q) for p, q in zip(a.model.parameters(), b.model.parameters()))
