"""Built-in models: tiny is the same in every process, its tokenizer is one token per character, the cache builds
atomically and once."""
from __future__ import annotations

import hashlib
import pathlib
import string
import subprocess
import sys
import threading
import time

import pytest
import safetensors.torch
import tokenizers
import transformers

from kubeforge.api import rljob
from kubeforge.runtime import models
from kubeforge.runtime.models import cache, smollm2, tiny

TEXT = string.printable.replace("\r", "").replace("\x0b", "").replace("\x0c", "") + "Copy: 12+34=? -7*3\n"


def weights_digest(folder: pathlib.Path) -> str:
    tensors = safetensors.torch.load_file(folder / "model.safetensors")
    h = hashlib.sha256()
    for name in sorted(tensors):
        h.update(name.encode())
        h.update(tensors[name].contiguous().view(-1).view(dtype=__import__("torch").uint8).numpy().tobytes())
    return h.hexdigest()


def test_tiny_builds_the_same_weights_twice(tmp_path: pathlib.Path) -> None:
    import torch

    first = models.resolve(rljob.ModelSpec(builtin="tiny"), cache_root=tmp_path / "a")
    torch.manual_seed(999)  # the caller's RNG state must not matter
    torch.rand(10)
    second = models.resolve(rljob.ModelSpec(builtin="tiny"), cache_root=tmp_path / "b")
    assert first != second
    assert weights_digest(first) == weights_digest(second)


@pytest.mark.slow
def test_tiny_is_the_same_in_every_process(tmp_path: pathlib.Path) -> None:
    here = models.resolve(rljob.ModelSpec(builtin="tiny"), cache_root=tmp_path / "a")
    code = ("import pathlib, sys; from kubeforge.api import rljob; from kubeforge.runtime import models; "
            "print(models.resolve(rljob.ModelSpec(builtin='tiny'), cache_root=pathlib.Path(sys.argv[1])))")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "b")], check=True, capture_output=True,
                         text=True).stdout.strip().splitlines()[-1]
    there = pathlib.Path(out)
    assert here != there
    assert weights_digest(here) == weights_digest(there)


def test_tiny_architecture_suits_vllm_cpu(tmp_path: pathlib.Path) -> None:
    cfg = transformers.AutoConfig.from_pretrained(models.resolve(rljob.ModelSpec(builtin="tiny")))
    assert cfg.model_type == "qwen2" and cfg.hidden_size // cfg.num_attention_heads == 64
    assert cfg.tie_word_embeddings and cfg.vocab_size >= len(tiny.vocabulary())


@pytest.mark.parametrize("loader", ["auto", "tokenizers"])
def test_tiny_tokenizer_round_trips_one_token_per_character(loader: str) -> None:
    folder = models.resolve(rljob.ModelSpec(builtin="tiny"))
    if loader == "auto":  # what vLLM and the trainer use
        tok = transformers.AutoTokenizer.from_pretrained(folder)
        ids = tok.encode(TEXT, add_special_tokens=True)
        decoded = tok.decode(ids)
        eos, pad = tok.eos_token_id, tok.pad_token_id
        assert tok.decode([eos, *ids[:3]], skip_special_tokens=True) == TEXT[:3]
    else:  # the bare tokenizer.json
        raw = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
        ids = raw.encode(TEXT).ids
        decoded = raw.decode(ids)
        eos, pad = raw.token_to_id(tiny.EOS), raw.token_to_id(tiny.PAD)
    assert len(ids) == len(TEXT)
    assert ids == [len(tiny.SPECIALS) + ord(c) for c in TEXT]
    assert decoded == TEXT
    assert (pad, eos) == (0, 1)


def test_cache_builds_once_under_concurrency(tmp_path: pathlib.Path) -> None:
    calls: list[int] = []

    def build(target: pathlib.Path) -> None:
        calls.append(1)
        time.sleep(0.3)
        (target / "config.json").write_text("{}")

    results: list[pathlib.Path] = []
    threads = [threading.Thread(target=lambda: results.append(cache.ensure("m-v1", build, cache_root=tmp_path)))
               for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and len(set(results)) == 1
    assert (results[0] / "config.json").is_file()


def test_a_failed_build_leaves_nothing_behind(tmp_path: pathlib.Path) -> None:
    def build(target: pathlib.Path) -> None:
        (target / "half").write_text("x")
        raise OSError("disk full")

    with pytest.raises(OSError):
        cache.ensure("m-v1", build, cache_root=tmp_path)
    assert [p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")] == []


def test_a_build_without_config_is_refused_and_a_folder_without_one_is_rebuilt(tmp_path: pathlib.Path) -> None:
    def tokenizer_only(target: pathlib.Path) -> None:     # what save_pretrained leaves on a rank other than 0
        (target / "tokenizer.json").write_text("{}")

    with pytest.raises(cache.BuildError, match="config.json"):
        cache.ensure("m-v1", tokenizer_only, cache_root=tmp_path)
    assert not (tmp_path / "m-v1").exists()
    broken = tmp_path / "m-v1"                             # published by an older build: marked, no config
    broken.mkdir()
    (broken / cache.COMPLETE_MARKER).write_text("ok\n")
    got = cache.ensure("m-v1", lambda t: (t / "config.json").write_text("{}"), cache_root=tmp_path)
    assert got == broken and (got / "config.json").is_file()


def test_path_models_must_be_hf_folders(tmp_path: pathlib.Path) -> None:
    with pytest.raises(models.ModelNotFound, match="spec.model.path"):
        models.resolve(rljob.ModelSpec(path=str(tmp_path)))
    (tmp_path / "config.json").write_text("{}")
    assert models.resolve(rljob.ModelSpec(path=str(tmp_path))) == tmp_path


@pytest.mark.slow
def test_smollm2_becomes_a_plain_hf_folder() -> None:
    folder = models.resolve(rljob.ModelSpec(builtin="smollm2-135m-instruct"))
    cfg = transformers.AutoConfig.from_pretrained(folder)
    assert cfg.model_type == "llama" and getattr(cfg, "quantization_config", None) is None
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    assert tok.chat_template and tok.decode(tok.encode("23+45=")) == "23+45="
    assert folder.name == smollm2.NAME


def test_prompt_encoding_uses_the_chat_template_only_when_asked_and_present() -> None:
    """Generators and the held-out evaluation share one encoder, so both see the same ids for a prompt."""
    from kubeforge.runtime.models import prompts

    class Tok:
        chat_template: str | None = "t"

        def apply_chat_template(self, turns: list[dict[str, str]], *, add_generation_prompt: bool,
                                tokenize: bool) -> dict[str, list[int]]:
            assert add_generation_prompt and tokenize and turns == [{"role": "user", "content": "2+2"}]
            return {"input_ids": [7, 8, 9]}  # a BatchEncoding-like mapping

        def encode(self, text: str, *, add_special_tokens: bool) -> list[int]:
            assert add_special_tokens
            return [ord(c) for c in text]

    tok = Tok()
    assert prompts.encode(tok, "2+2", chat_template=True) == [7, 8, 9]
    assert prompts.encode(tok, "2+2", chat_template=False) == [50, 43, 50]
    tok.chat_template = None
    assert prompts.encode(tok, "2+2", chat_template=True) == [50, 43, 50]
