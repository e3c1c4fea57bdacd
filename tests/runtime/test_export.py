"""Export: the trained policy as an HF folder next to the checkpoints; any HF folder as ``model.path``."""
from __future__ import annotations

import json
from pathlib import Path

import torch
import transformers

import _trainer_util as util
from kubeforge.api import rljob
from kubeforge.runtime import models
from kubeforge.runtime.models import tiny as tiny_model
from kubeforge.runtime.learner import hf_export as export, step


def test_any_hf_folder_trains_and_exports_a_loadable_folder(tmp_path: Path) -> None:
    # a random-initialised Qwen2 (its own config, no download) with a tokenizer, saved as a plain HF folder
    src = tmp_path / "qwen2-random"
    cfg = transformers.Qwen2Config(vocab_size=tiny_model.VOCAB_SIZE, hidden_size=64, intermediate_size=128,
                                   num_hidden_layers=3, num_attention_heads=2, num_key_value_heads=1, head_dim=32,
                                   max_position_embeddings=128, tie_word_embeddings=False, pad_token_id=0)
    torch.manual_seed(3)
    transformers.Qwen2ForCausalLM(cfg).save_pretrained(src)
    tiny_model.tokenizer().save_pretrained(src)
    path = models.resolve(rljob.ModelSpec(path=str(src)))
    t = step.Trainer(model_path=path, algorithm=util.algorithm(), dtype="bfloat16")
    for s in range(2):
        t.train_step(groups=util.synthetic_groups(step=s, prompts=3, group_size=4))
    out = t.export(directory=tmp_path / "ckpt")
    assert out is not None and out.name == export.dir_name(2) and out.parent == tmp_path / "ckpt"
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= {
        f.name for f in out.iterdir()}
    assert not [f for f in (tmp_path / "ckpt").iterdir() if f.name.startswith(".tmp-")]
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    loaded = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    mine = {n: p.detach().to(torch.bfloat16).float() for n, p in t.model.named_parameters()}
    theirs = dict(loaded.named_parameters())
    assert mine.keys() == theirs.keys() and "lm_head.weight" in theirs     # untied head exported too
    assert all(torch.equal(mine[n], theirs[n].detach()) for n in mine)
    tok = transformers.AutoTokenizer.from_pretrained(out)
    assert tok.decode(tok.encode("12+7=")) == "12+7="
    assert t.export(directory=tmp_path / "ckpt") == out                       # idempotent


def test_large_models_export_in_shards_with_an_index(tmp_path: Path) -> None:
    tiny = util.build_tiny(tmp_path / "tiny")
    t = step.Trainer(model_path=tiny, algorithm=util.algorithm())
    stream = t.named_tensors()
    sizes = [int(torch.Size(e.shape).numel()) * 4 for e in stream.meta]
    out = export.write(target=tmp_path / "x", tensors=stream, sizes=sizes, config=t.model.config, source=tiny,
                       dtype=torch.float32, shard_bytes=200_000)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    files = sorted({v for v in index["weight_map"].values()})
    assert len(files) >= 3 and all((out / f).is_file() for f in files)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    assert all(torch.equal(p.detach(), dict(loaded.named_parameters())[n].detach())
               for n, p in t.model.named_parameters())


def test_plan_shards() -> None:
    assert export.plan_shards([5, 5, 5, 20, 1], shard_bytes=10) == [0, 0, 1, 2, 3]
    assert export.plan_shards([], shard_bytes=10) == []
