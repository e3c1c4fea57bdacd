"""The generator engine: vLLM settings (pure) and sampling with behaviour logprobs on the shared tiny engine."""
from __future__ import annotations

import importlib
import pathlib

import pytest

from kubeforge.api import rljob
from kubeforge.runtime import types
from kubeforge.runtime.generator import engine

PROMPTS = [types.Prompt(index=i, text=t, answer="") for i, t in enumerate(["Copy: ab\n", "12+34=?", "x"])]


def test_engine_settings(tiny_model_dir: pathlib.Path) -> None:
    kw = engine.engine_kwargs(model_dir=tiny_model_dir, dtype="float32", seed=3,
                              role=rljob.GeneratorRole(tensor_parallel_size=2, enforce_eager=True))
    assert kw["block_size"] % 32 == 0
    assert kw["logprobs_mode"] == "processed_logprobs"
    assert kw["max_model_len"] == 512  # the tiny model's own limit, below the default cap
    assert kw["tensor_parallel_size"] == 2 and kw["enforce_eager"] and kw["seed"] == 3
    module, _, cls = kw["worker_extension_cls"].rpartition(".")
    ext = getattr(importlib.import_module(module), cls)
    assert all(m.startswith(("kf_", "_")) for m in vars(ext) if callable(getattr(ext, m)))
    assert engine.engine_kwargs(model_dir=tiny_model_dir, dtype="float32", seed=0,
                                role=rljob.GeneratorRole(max_model_len=64))["max_model_len"] == 64


def test_env_defaults_skip_the_aot_cache_on_cpu_only() -> None:
    role = rljob.GeneratorRole(kv_cache_gib=3)
    cpu = engine.env_defaults(role, in_process=True, cuda=False)
    assert cpu == {"VLLM_CPU_KVCACHE_SPACE": "3", "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_USE_AOT_COMPILE": "0"}
    gpu = engine.env_defaults(role, in_process=False, cuda=True)
    assert gpu == {"VLLM_CPU_KVCACHE_SPACE": "3"}


@pytest.mark.vllm
def test_the_engine_started_without_the_aot_cache(tiny_engine: engine.Engine) -> None:
    import os

    import torch
    assert torch.cuda.is_available() or os.environ["VLLM_USE_AOT_COMPILE"] == "0"


def test_the_registry_inspects_in_this_process_when_asked() -> None:
    import os
    import types as pytypes

    def spawn(fn: object) -> object:
        raise AssertionError("a subprocess was started")

    registry = pytypes.SimpleNamespace(_run_in_subprocess=spawn)
    assert engine.inspect_in_process(registry)
    assert registry._run_in_subprocess(lambda: os.getpid()) == os.getpid()
    assert not engine.inspect_in_process(pytypes.SimpleNamespace())     # a vLLM without the hook: left as it is


@pytest.mark.vllm
def test_a_cpu_engine_inspects_an_uncached_model_class_without_a_subprocess(
        tiny_engine: engine.Engine, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The real registry of the engine's vLLM: with no cached record of Qwen2 (the tiny model's class), the class is
    inspected in this process (a subprocess would re-import vLLM: ~20 s on 2 loaded cores) and the record cached."""
    import subprocess

    import torch
    from vllm.model_executor.models import registry

    if torch.cuda.is_available():
        pytest.skip("with CUDA the registry keeps its subprocess")
    assert registry._run_in_subprocess is engine._call

    def no_subprocess(*args: object, **kwargs: object) -> object:
        raise AssertionError(f"a subprocess was started: {args}")

    monkeypatch.setattr(subprocess, "run", no_subprocess)
    monkeypatch.setattr(registry._LazyRegisteredModel, "_get_cache_dir", staticmethod(lambda: tmp_path))
    model = registry._LazyRegisteredModel(module_name="vllm.model_executor.models.qwen2", class_name="Qwen2ForCausalLM")
    info = model.inspect_model_cls()
    assert info.architecture == "Qwen2ForCausalLM"
    assert list(tmp_path.glob("*.json")), "the record was not cached"


def test_request_seeds_never_collide() -> None:
    n = 4
    seeds = {engine.request_seed(7, prompt_index=k, n=n) + i for k in range(100) for i in range(n)}
    assert len(seeds) == 400


@pytest.mark.vllm
def test_generate_returns_groups_with_logprobs(tiny_engine: engine.Engine) -> None:
    out = tiny_engine.generate(PROMPTS, n=3, max_tokens=6, temperature=1.0, seed=5, chat_template=True)
    assert len(out) == len(PROMPTS)
    for prompt, (prompt_ids, comps) in zip(PROMPTS, out):
        assert prompt_ids == tiny_engine.tokenizer.encode(prompt.text)  # tiny has no chat template: plain text
        assert len(comps) == 3
        for c in comps:
            assert 1 <= len(c.token_ids) <= 6 and len(c.logprobs) == len(c.token_ids)
            assert all(lp <= 0.0 for lp in c.logprobs)
            # vLLM's incremental detokenizer holds back a trailing incomplete UTF-8 sequence (random bytes)
            assert tiny_engine.tokenizer.decode(c.token_ids, skip_special_tokens=True).startswith(c.text)
            assert c.finish_reason in ("length", "stop")
    again = tiny_engine.generate(PROMPTS, n=3, max_tokens=6, temperature=1.0, seed=5)
    assert [[c.token_ids.tolist() for c in g] for _, g in again] == [[c.token_ids.tolist() for c in g] for _, g in out]
    other = tiny_engine.generate(PROMPTS, n=3, max_tokens=6, temperature=1.0, seed=6)
    assert [[c.token_ids.tolist() for c in g] for _, g in other] != [[c.token_ids.tolist() for c in g] for _, g in out]


@pytest.mark.vllm
def test_greedy_is_deterministic(tiny_engine: engine.Engine) -> None:
    a = tiny_engine.greedy(PROMPTS, max_tokens=5)
    b = tiny_engine.greedy(PROMPTS, max_tokens=5)
    assert [c.token_ids.tolist() for c in a] == [c.token_ids.tolist() for c in b]
    assert all(len(c.logprobs) == len(c.token_ids) for c in a)
