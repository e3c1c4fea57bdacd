"""Meta-device build + shard-wise load from an HF folder (``learner/materialise.py``), one process (the 2-process
FSDP path is covered by test_trainer_fsdp.py: FSDP built this way equals DDP built from ``from_pretrained``)."""
from __future__ import annotations

from pathlib import Path

import pytest
import safetensors.torch
import torch
import transformers

import _trainer_util as util
from kubeforge.runtime.learner import materialise


def test_empty_has_no_parameter_storage_and_real_buffers(tmp_path: Path) -> None:
    tiny = util.build_tiny(tmp_path / "m")
    lm = materialise.empty(tiny)
    assert all(p.device.type == "meta" for p in lm.parameters())
    buffers = dict(lm.named_buffers())
    assert buffers and all(b.device.type == "cpu" for b in buffers.values())     # rotary inv_freq computed


def test_load_fills_every_parameter_and_keeps_buffers(tmp_path: Path) -> None:
    tiny = util.build_tiny(tmp_path / "m")
    ref = transformers.AutoModelForCausalLM.from_pretrained(str(tiny), dtype=torch.float32)
    lm = materialise.empty(tiny)
    materialise.load(lm, path=tiny, device=torch.device("cpu"))
    want = dict(ref.named_parameters())
    got = dict(lm.named_parameters())
    assert got.keys() == want.keys()
    for k in want:
        assert torch.equal(got[k], want[k]), k
    for k, b in ref.named_buffers():
        assert torch.equal(dict(lm.named_buffers())[k], b), k
    ids = torch.tensor([[1, 2, 3, 4]])
    assert torch.equal(lm(ids).logits, ref(ids).logits)


def test_a_tensor_missing_from_the_folder_is_named(tmp_path: Path) -> None:
    tiny = util.build_tiny(tmp_path / "m")
    f = tiny / "model.safetensors"
    state = safetensors.torch.load_file(str(f))
    state.pop("model.norm.weight")
    safetensors.torch.save_file(state, str(f), metadata={"format": "pt"})
    lm = materialise.empty(tiny)
    with pytest.raises(ValueError, match=r"spec.model.path: .* has no tensor 'model.norm.weight'"):
        materialise.load(lm, path=tiny, device=torch.device("cpu"))


def test_a_bfloat16_folder_loads_into_float32_masters(tmp_path: Path) -> None:
    tiny = util.build_tiny(tmp_path / "m")
    half = tmp_path / "bf16"
    transformers.AutoModelForCausalLM.from_pretrained(str(tiny), dtype=torch.bfloat16).save_pretrained(half)
    ref = transformers.AutoModelForCausalLM.from_pretrained(str(half), dtype=torch.float32)
    lm = materialise.empty(half)
    materialise.load(lm, path=half, device=torch.device("cpu"))
    for k, p in ref.named_parameters():
        got = lm.get_parameter(k)
        assert got.dtype == torch.float32 and torch.equal(got, p), k
