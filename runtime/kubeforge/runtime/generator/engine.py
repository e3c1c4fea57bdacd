"""The vLLM engine wrapper: one ``vllm.LLM`` per generator process, sampling groups with behaviour logprobs.

API (used by ``generator/start`` and tests)::

    eng = Engine(model_dir=path, dtype="float32", role=rljob.GeneratorRole(...), seed=0)
    out = eng.generate(prompts, n=4, max_tokens=16, temperature=1.0, top_p=1.0, top_k=0, seed=7,
                       chat_template=True)
          # -> [(prompt_token_ids, [types.Completion x n]) per prompt], in prompt order
    eng.greedy(prompts, max_tokens=8)                      # -> [types.Completion] (temperature 0)
    eng.continue_ids(contexts, max_tokens=[..], seeds=[..], stop=[..])   # -> one turn per context (episodes)
    eng.join_weight_sync(host=..., port=..., world_size=..., rank_base=..., timeout=...)   # once
    stats = eng.receive_weights()                          # one sync: swap its prebuilt kernels in, reset prefix cache
    eng.close()

Neighbours: ``extension.WeightSyncExtension`` runs inside vLLM's worker(s); ``weightsync`` is the protocol;
``models.resolve`` gives ``model_dir``.

Process model: by default the engine core runs in the calling process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``,
set here unless the caller set it), so no ``if __name__ == "__main__"`` guard is needed, ``collective_rpc``
is a direct call and tests can share one engine with the test process. Tensor parallelism > 1 still starts
worker processes (spawned: their caller needs the guard).

Invariants:
- Logprobs: ``logprobs_mode="processed_logprobs"``; each completion token carries
  ``log_softmax(logits / T)[token]`` in float32 (T = 1 when greedy), after vLLM's top-k and top-p masking
  (top_k > 0, top_p < 1; none when greedy). See docs/runtime.md "Logprob convention": the trainer computes the
  same quantity (``learner/truncation`` reproduces the masking).
- KV cache blocks are 32 tokens (a multiple of 32 as CPU attention needs; small enough that a stale prefix cache
  shows up in tests), KV space is ``role.kv_cache_gib`` (``VLLM_CPU_KVCACHE_SPACE``); on CPU no AOT compile cache
  (``env_defaults``).
- ``receive_weights`` must not overlap ``generate`` (both run on the caller's thread; the roles alternate): the
  swap of new weights happens only there, so a batch in flight always runs on one version's weights.
- Swap reload (``swap_reload=True``, the default without LoRA): each worker keeps a model-format shadow of the
  weights (one more copy of the model's weights in memory, allocated on the first sync and reused) and builds the
  next sync's kernels in the background; ``swap_reload=False`` reloads in place in the pause (no extra memory).
"""
from __future__ import annotations

import json
import os
import pathlib
import shutil
import tempfile
import time
from collections.abc import Mapping
from typing import Any

import numpy as np
import transformers

from kubeforge.api import rljob
from kubeforge.runtime import types, weightsync
from kubeforge.runtime.models import adapter
from kubeforge.runtime.models import prompts as prompt_ids

EXTENSION = "kubeforge.runtime.generator.extension.WeightSyncExtension"
BLOCK_SIZE = 32
DEFAULT_MAX_MODEL_LEN = 2048
LOGPROBS_MODE = "processed_logprobs"
SEED_STRIDE = 1_000_003
CURRENT: Any = object()     # ``generate``'s default adapter: the engine's own (``lora_request``)


def engine_kwargs(*, model_dir: pathlib.Path, dtype: str, role: rljob.GeneratorRole, seed: int,
                  max_model_len: int | None = None, lora: rljob.LoraSpec | None = None) -> dict[str, Any]:
    """Keyword arguments of ``vllm.LLM`` for a generator (pure: tests and the bench read them)."""
    extra: dict[str, Any] = {}
    if lora is not None:      # one adapter at a time: the current policy's
        extra = dict(rljob.lora_engine_args(rank=lora.rank, adapters=1))
    return {
        **extra,
        "model": str(model_dir),
        "dtype": dtype,
        "seed": seed,
        "tensor_parallel_size": role.tensor_parallel_size,
        "gpu_memory_utilization": role.gpu_memory_utilization,
        "max_model_len": max_model_len or role.max_model_len or _default_max_len(model_dir),
        "enforce_eager": role.enforce_eager,
        "block_size": BLOCK_SIZE,
        "logprobs_mode": LOGPROBS_MODE,
        "worker_extension_cls": EXTENSION,
        "enable_prefix_caching": True,
    }


def _default_max_len(model_dir: pathlib.Path) -> int:
    cfg = json.loads((model_dir / "config.json").read_text())
    return int(min(cfg.get("max_position_embeddings", DEFAULT_MAX_MODEL_LEN), DEFAULT_MAX_MODEL_LEN))


def request_seed(seed: int, *, prompt_index: int, n: int) -> int:
    """Seed of prompt ``prompt_index``'s request; vLLM gives its ``n`` samples ``seed + i``, so none collide."""
    return (seed * SEED_STRIDE + prompt_index * n) % (1 << 62)


def env_defaults(role: rljob.GeneratorRole, *, in_process: bool, cuda: bool) -> dict[str, str]:
    """vLLM's environment unless the caller set it: the KV space, the engine core in this process, and on CPU no
    AOT compile cache. That cache never loads on the CPU build (vLLM 0.32 with torch 2.13: "'function' object has
    no attribute 'finalize_loading'"), so every start compiled the model again: the demo's engine came up in
    ~165 s, ~28 s without it (torch.compile's own caches still hit), and decoding was no slower
    (docs/benchmarks.md, "vLLM start")."""
    out = {"VLLM_CPU_KVCACHE_SPACE": str(role.kv_cache_gib)}
    if in_process:
        out["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    if not cuda:
        out["VLLM_USE_AOT_COMPILE"] = "0"
    return out


def inspect_in_process(registry: Any) -> bool:
    """Make vLLM's model registry inspect an architecture in this process instead of a fresh interpreter; True when
    done. vLLM inspects a model class it has no cached record of (``<VLLM_CACHE_ROOT>/modelinfos``) in a subprocess
    (``_run_in_subprocess``), to keep CUDA uninitialised in the caller. That subprocess imports vLLM and torch
    again: 23 s of a replacement generator's 59 s start on 2 loaded cores (docs/recovery.md), on every pod start,
    since a pod's cache dies with it. Without CUDA there is nothing to keep uninitialised, and the engine imports
    the same model class right after. Only for callers without CUDA; a vLLM without that hook is left as it is
    (slower, never wrong)."""
    if not callable(getattr(registry, "_run_in_subprocess", None)):
        return False
    registry._run_in_subprocess = _call
    return True


def _call(fn: Any) -> Any:
    return fn()


class Engine:
    """A warm vLLM engine plus the glue for prompts, logprobs and weight sync."""

    def __init__(self, *, model_dir: pathlib.Path, dtype: str = "float32",
                 role: rljob.GeneratorRole | None = None, seed: int = 0, max_model_len: int | None = None,
                 in_process: bool = True, lora: rljob.LoraSpec | None = None, swap_reload: bool = True,
                 engine_args: Mapping[str, Any] | None = None) -> None:
        """``engine_args`` go over the generator's own (a GeneratorPool's: LoRA for ``maxAdapters`` adapters,
        ``generatorpool.engine_args``)."""
        role = role or rljob.GeneratorRole()
        import torch

        for key, value in env_defaults(role, in_process=in_process, cuda=torch.cuda.is_available()).items():
            os.environ.setdefault(key, value)       # the caller's (the role's env) wins
        import vllm  # late: importing vLLM is slow and reads the env set above

        if not torch.cuda.is_available():
            from vllm.model_executor.models import registry

            inspect_in_process(registry)
        self._vllm = vllm
        self.model_dir = pathlib.Path(model_dir)
        self.kwargs = {**engine_kwargs(model_dir=self.model_dir, dtype=dtype, role=role, seed=seed,
                                       max_model_len=max_model_len, lora=lora), **(engine_args or {})}
        self.lora = lora
        self.swap_reload = swap_reload and lora is None   # LoRA syncs carry adapters: nothing to rebuild
        self.lora_request: Any = None          # the adapter being served (None: the base model, policy v0)
        self._adapters = pathlib.Path(tempfile.mkdtemp(prefix="kubeforge-lora-")) if lora is not None else None
        start = time.perf_counter()
        self.llm = vllm.LLM(**self.kwargs)
        self.start_seconds = time.perf_counter() - start
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(self.model_dir)
        self.joined = False

    # ------------------------------------------------------------ sampling

    def encode(self, prompt: types.Prompt, *, chat_template: bool) -> list[int]:
        """Prompt token ids; the chat template wraps the text when asked and the tokenizer has one."""
        return prompt_ids.encode(self.tokenizer, prompt.text, chat_template=chat_template)

    def generate(self, prompts: list[types.Prompt], *, n: int, max_tokens: int, temperature: float = 1.0,
                 top_p: float = 1.0, top_k: int = 0, seed: int | None = None, chat_template: bool = True,
                 lora_request: Any = CURRENT) -> list[tuple[list[int], list[types.Completion]]]:
        """Sample ``n`` completions of every prompt; each token comes with its behaviour logprob. ``lora_request``:
        the adapter to sample with (default: the one this engine's own sync loaded; a pool passes each job's)."""
        vllm = self._vllm
        encoded = [self.encode(p, chat_template=chat_template) for p in prompts]
        params = [vllm.SamplingParams(
            n=n, max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=top_k, logprobs=0,
            seed=None if seed is None else request_seed(seed, prompt_index=p.index, n=n))
            for p in prompts]
        inputs: Any = [{"prompt_token_ids": ids} for ids in encoded]
        adapter = self.lora_request if lora_request is CURRENT else lora_request
        outputs = self.llm.generate(inputs, params, use_tqdm=False, lora_request=adapter)
        return [(ids, [_completion(c) for c in out.outputs]) for ids, out in zip(encoded, outputs)]

    def continue_ids(self, contexts: list[list[int]], *, max_tokens: list[int], seeds: list[int] | None,
                     stop: list[str], temperature: float = 1.0, top_p: float = 1.0,
                     top_k: int = 0) -> list[types.Completion]:
        """One sample per context of token ids (an episode's next policy turn), all in one batched call; a stop
        string stays in the turn's text and ids (``include_stop_str_in_output``). ``seeds`` None: the engine's own
        seeded generator (a batch of many contexts is prefilled in chunks, and vLLM 0.32 on CPU cannot rewind a
        per-request generator for a chunk's discarded sample: "CPU Generator does not use offset")."""
        vllm = self._vllm
        per = seeds if seeds is not None else [None] * len(contexts)
        params = [vllm.SamplingParams(n=1, max_tokens=m, temperature=temperature, top_p=top_p, top_k=top_k,
                                      logprobs=0, seed=s, stop=list(stop) or None,
                                      include_stop_str_in_output=bool(stop))
                  for m, s in zip(max_tokens, per)]
        inputs: Any = [{"prompt_token_ids": list(c)} for c in contexts]
        outputs = self.llm.generate(inputs, params, use_tqdm=False, lora_request=self.lora_request)
        return [_completion(out.outputs[0]) for out in outputs]

    def greedy(self, prompts: list[types.Prompt], *, max_tokens: int = 8,
               chat_template: bool = False) -> list[types.Completion]:
        """One greedy completion per prompt (temperature 0), for tests and evaluation."""
        out = self.generate(prompts, n=1, max_tokens=max_tokens, temperature=0.0, chat_template=chat_template)
        return [completions[0] for _, completions in out]

    # ------------------------------------------------------------ weight sync

    def join_weight_sync(self, *, host: str, port: int, world_size: int, rank_base: int, timeout: float,
                         join_timeout: float = weightsync.DEFAULT_JOIN_TIMEOUT, backend: str = "gloo",
                         epoch: int = 0) -> list[int]:
        """Every worker joins the trainer's weight-sync group (blocks until the whole group is there, at most
        ``join_timeout``); each later collective is bounded by ``timeout``. Returns the workers' ranks."""
        ranks = self.llm.collective_rpc(
            "kf_join_weight_sync",
            args=(host, port, world_size, rank_base, float(timeout), float(join_timeout), backend, int(epoch),
                  self.swap_reload))
        self.joined = True
        return [int(r) for r in ranks]

    def receive_weights(self, *, refresh_tied: bool = True, load: bool = True,
                        swap: bool = True) -> weightsync.SyncStats:
        """Load one sync (its bytes prefetched and its kernels built in the background since the last one: see
        ``extension``; waits for whatever is not done yet), then drop cached prefixes; stats of worker 0 plus the
        reset, ``seconds`` = the whole call (the generation pause). A sync that does not fit the model raises
        ``WeightSyncError`` and the engine keeps serving its previous weights.

        ``swap=False`` loads with vLLM's in-place reload instead (benchmarks compare the two); ``refresh_tied`` is
        for tests only (False: in place, leaving a tied lm_head stale); ``load=False`` receives and discards
        (benchmarks only)."""
        start = time.perf_counter()
        if self.lora is not None:
            return self._receive_adapter(start)
        results = self.llm.collective_rpc("kf_receive_weights", args=(refresh_tied, load, swap))
        self.llm.reset_prefix_cache()
        first = results[0]
        return weightsync.SyncStats(version=int(first["version"]), bytes=int(first["bytes"]),
                                    seconds=time.perf_counter() - start, tensors=int(first["tensors"]),
                                    buckets=int(first["buckets"]),
                                    receive_seconds=float(first.get("receive_seconds", 0.0)),
                                    prepare_seconds=float(first.get("prepare_seconds", 0.0)),
                                    prepare_wait_seconds=float(first.get("prepare_wait_seconds", 0.0)),
                                    ready_seconds=float(first.get("ready_seconds", 0.0)),
                                    swapped=bool(first.get("swapped", False)),
                                    delta=bool(first.get("delta", False)), full_bytes=int(first.get("full_bytes", 0)))

    def weights_staged(self) -> bool:
        """Every worker holds the next sync whole in its buffers (received in the background while generating):
        ``receive_weights`` will only load."""
        return self.joined and all(bool(x) for x in self.llm.collective_rpc("kf_weights_staged"))

    def _receive_adapter(self, start: float) -> weightsync.SyncStats:
        """LoRA: receive the adapter, serve it as a new ``LoRARequest`` (a new id per version), drop older ones."""
        from vllm.lora.request import LoRARequest

        assert self.lora is not None and self._adapters is not None
        config = adapter.adapter_config(self.lora, base=str(self.model_dir))
        first = self.llm.collective_rpc("kf_receive_adapter", args=(str(self._adapters), json.dumps(config)))[0]
        version = int(first["version"])
        self.lora_request = LoRARequest(f"policy-v{version}", version + 1, str(first["path"]))
        for old in self._adapters.iterdir():
            if old.name != f"v{version}" and not old.name.startswith("."):
                shutil.rmtree(old, ignore_errors=True)
        self.llm.reset_prefix_cache()
        return weightsync.SyncStats(version=version, bytes=int(first["bytes"]), seconds=time.perf_counter() - start,
                                    tensors=int(first["tensors"]), buckets=int(first["buckets"]))

    def leave_weight_sync(self) -> None:
        if self.joined:
            self.llm.collective_rpc("kf_leave_weight_sync")
            self.joined = False

    def close(self) -> None:
        """Leave the sync group and stop the engine core (and its workers)."""
        try:
            self.leave_weight_sync()
        finally:
            shutdown = getattr(self.llm.llm_engine, "shutdown", None) or getattr(
                getattr(self.llm.llm_engine, "engine_core", None), "shutdown", None)
            if shutdown is not None:
                shutdown()
            if self._adapters is not None:
                shutil.rmtree(self._adapters, ignore_errors=True)


def _completion(c: Any) -> types.Completion:
    """vLLM's output as packed arrays (token ids uint32, behaviour logprobs float64): what travels on the wire."""
    ids = types.token_array(np.asarray(c.token_ids, dtype=np.int64))
    lps = c.logprobs or []
    if len(lps) != len(ids):
        raise RuntimeError(f"vLLM returned {len(lps)} logprobs for {len(ids)} tokens")
    if lps:
        logprobs = np.fromiter((lps[i][tok].logprob for i, tok in enumerate(ids.tolist())), dtype=types.LOGPROB_DTYPE,
                               count=len(ids))
    else:
        logprobs = np.empty(0, dtype=types.LOGPROB_DTYPE)
    return types.Completion(token_ids=ids, logprobs=logprobs, text=c.text, finish_reason=str(c.finish_reason or ""))
