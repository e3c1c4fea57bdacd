"""The trainer's GPU paths in one short run, for a machine with CUDA (``python3 bench/bench_gpu.py``).

1. ``parity``: one GRPO step of the same random-initialised model on the same batch, once on CPU and once on the
   GPU (float32 both): loss and gradient norm and their relative differences. The CPU path packs each group's
   prompt once (``learner/logprobs.py`` "Shared prompts"); the GPU path runs every row whole, so this checks two
   different computations of the same step against each other.
2. ``step``: the trainer's step (``learner.step.Trainer``, as the trainer role builds it) on the GPU for two model
   shapes built from their configs, no download: the demo model's (SmolLM2-135M) and Qwen2-0.5B's. For each:
   ``--prompts`` x ``--group-size`` completions of ``--completion-len`` tokens after ``--prompt-len`` prompt tokens,
   in ``float32`` (the baseline, in the same run), ``bfloat16`` (float32 masters, a bf16 compute copy) and
   ``bfloat16`` with compiled decoder blocks (``spec.roles.trainer.compile``). Median step seconds after
   ``--warmup`` steps, tokens/s, peak GPU memory, and each variant's ratio against float32.
3. ``nccl``: two processes join one NCCL group on the GPUs this machine shows (``cuda:<rank % devices>``), as the
   trainer's data-parallel group, FSDP2 and the NCCL weight sync need, and all-reduce once. With one GPU NCCL
   refuses two ranks on the same device; the part then reports the error it gave.

    python3 bench/bench_gpu.py [--steps 5] [--warmup 2] [--prompts 8] [--group-size 8] [--prompt-len 64]
                               [--completion-len 256] [--shapes smollm2-135m,qwen2-0.5b] [--skip-compile]
                               [--parts parity,step,nccl] [--device cuda:0]

``--device cpu`` is a dry run of parts 1 and 2 on a machine without a GPU (the script's own check, tiny sizes).

Prints one JSON line per part as it finishes and one JSON object with every part last. A part that fails reports
its error and the run goes on. Nothing is asserted: the figures are reported, never hard-coded.
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
import traceback
from typing import Any

import torch
import transformers

from kubeforge.runtime.learner import parallel, step

import bench_trainer_scale as scale_bench
import common

SHAPES: dict[str, tuple[type, dict[str, Any]]] = {
    # SmolLM2-135M-Instruct's config (the demo model), random weights
    "smollm2-135m": (transformers.LlamaConfig, dict(
        vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
        num_key_value_heads=3, max_position_embeddings=8192, tie_word_embeddings=True, rms_norm_eps=1e-5,
        rope_theta=100000.0, pad_token_id=2)),
    "qwen2-0.5b": (transformers.Qwen2Config, scale_bench.QWEN2_05B),
}


def build(shape: str, directory: str, *, layers: int | None = None) -> int:
    """Save a random-initialised model of ``shape`` (float32) to ``directory``; returns its parameter count."""
    cls, cfg = SHAPES[shape]
    kwargs = dict(cfg)
    if layers is not None:
        kwargs["num_hidden_layers"] = layers
    config = cls(**kwargs)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config)
    model.save_pretrained(directory)
    return sum(p.numel() for p in model.parameters())


def batch(a: argparse.Namespace, *, vocab: int, seed: int) -> list[Any]:
    return common.random_groups(prompts=a.prompts, group_size=a.group_size, prompt_len=a.prompt_len,
                                completion_len=a.completion_len, vocab=vocab, seed=seed)


def rel(x: float, y: float) -> float:
    return abs(x - y) / max(abs(x), abs(y), 1e-12)


def parity(a: argparse.Namespace) -> dict[str, Any]:
    """One step on CPU and on the GPU from the same weights and batch (float32)."""
    with tempfile.TemporaryDirectory() as d:
        build("smollm2-135m", d, layers=4)
        small = argparse.Namespace(**{**vars(a), "prompts": 4, "group_size": 4, "prompt_len": 32,
                                      "completion_len": 32})
        gs = batch(small, vocab=49152, seed=1)
        out: dict[str, Any] = {"model": "smollm2-135m shape, 4 layers", "completions": 16}
        for side, device in (("cpu", "cpu"), ("device", a.device)):
            t = step.Trainer(model_path=d, algorithm=scale_bench.algorithm(small.completion_len), device=device)
            m = t.train_step(groups=gs)
            out[side] = {"device": device, "loss": m.loss, "grad_norm": m.grad_norm, "entropy": m.entropy}
            del t
    for k in ("loss", "grad_norm", "entropy"):
        out[f"{k}_rel_diff"] = rel(out["cpu"][k], out["device"][k])
    return out


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def run_variant(a: argparse.Namespace, path: str, *, dtype: str, compile_blocks: bool, vocab: int
                ) -> dict[str, Any]:
    cuda = a.device.startswith("cuda")
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    t = step.Trainer(model_path=path, algorithm=scale_bench.algorithm(a.completion_len), dtype=dtype,
                     device=a.device, scale=step.Scale(compile=compile_blocks))
    build_s = time.perf_counter() - t0
    times, phases, first = [], [], 0.0
    for s in range(a.warmup + a.steps):
        gs = batch(a, vocab=vocab, seed=100 + s)
        synchronize(a.device)
        t0 = time.perf_counter()
        m = t.train_step(groups=gs)
        synchronize(a.device)
        dt = time.perf_counter() - t0
        if s == 0:
            first = dt
        if s >= a.warmup:
            times.append(dt)
            phases.append(m.seconds)
    med = statistics.median(times)
    rows = a.prompts * a.group_size
    out = {"dtype": dtype, "compile": compile_blocks, "compile_state": t.compile_state,
           "build_seconds": round(build_s, 2), "first_step_seconds": round(first, 3),
           "step_seconds_median": round(med, 4), "step_seconds": [round(x, 4) for x in times],
           "tokens_per_s": round(rows * (a.prompt_len + a.completion_len) / med),
           "completion_tokens_per_s": round(rows * a.completion_len / med),
           "phases_median": {k: round(statistics.median(p[k] for p in phases), 4) for k in phases[0]},
           "peak_gpu_memory_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if cuda else None}
    del t
    return out


def steps(a: argparse.Namespace, shape: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as d:
        params = build(shape, d)
        vocab = int(SHAPES[shape][1]["vocab_size"])
        out: dict[str, Any] = {"model": f"{shape} shape (random weights)", "params": params,
                               "completions": a.prompts * a.group_size, "prompt_len": a.prompt_len,
                               "completion_len": a.completion_len, "steps_measured": a.steps}
        variants = [("float32", False), ("bfloat16", False)] + ([] if a.skip_compile else [("bfloat16", True)])
        for dtype, comp in variants:
            key = dtype + ("_compiled" if comp else "")
            try:
                out[key] = run_variant(a, d, dtype=dtype, compile_blocks=comp, vocab=vocab)
            except Exception as exc:  # noqa: BLE001 - reported, the other variants still run
                out[key] = {"error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()[-1500:]}
        base = out["float32"].get("step_seconds_median")
        for key in ("bfloat16", "bfloat16_compiled"):
            v = out.get(key, {}).get("step_seconds_median")
            if base and v:
                out[f"{key}_over_float32_step_time"] = round(v / base, 3)
    return out


def nccl_worker(rank: int, port: int) -> None:
    devices = torch.cuda.device_count()
    torch.cuda.set_device(rank % devices)
    group = parallel.DataParallel(config=parallel.DistConfig(rank=rank, world_size=2, master_port=port,
                                                             backend="nccl", timeout_s=60),
                                  device=f"cuda:{rank % devices}")
    total = group.all_reduce_sum([float(rank + 1)])
    print(json.dumps({"rank": rank, "device": rank % devices, "sum": total[0]}), flush=True)
    group.close()


def nccl(a: argparse.Namespace) -> dict[str, Any]:
    port = common.free_port()
    env = {**os.environ, "NCCL_DEBUG": "WARN"}
    procs = [subprocess.Popen([sys.executable, __file__, "--nccl-worker", str(r), "--port", str(port)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for r in range(2)]
    out: dict[str, Any] = {"gpus": torch.cuda.device_count(), "nccl_version": ".".join(
        str(x) for x in torch.cuda.nccl.version())}
    ranks = []
    for r, p in enumerate(procs):
        try:
            text, err = p.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            p.kill()
            text, err = p.communicate()
        lines = text.strip().splitlines()
        ranks.append({"rc": p.returncode, "result": json.loads(lines[-1]) if p.returncode == 0 and lines else None,
                      "stderr_tail": "" if p.returncode == 0 else _reason(err)})
    out["ranks"] = ranks
    out["joined"] = all(r["rc"] == 0 for r in ranks)
    return out


def _reason(err: str) -> str:
    """The lines of a failed rank's stderr that say why (NCCL's warning and the exception), else its tail."""
    lines = err.splitlines()
    keep = [ln for i, ln in enumerate(lines)
            if "NCCL WARN" in ln or "Error" in ln or (i > 0 and "Last error" in lines[i - 1])]
    return "\n".join(keep[-6:]) if keep else err[-800:]


def env(device: str) -> dict[str, Any]:
    out: dict[str, Any] = {"torch": torch.__version__, "cuda": torch.version.cuda,
                           "transformers": transformers.__version__, "python": sys.version.split()[0],
                           "device": device, "gpus": torch.cuda.device_count()}
    if device.startswith("cuda"):
        p = torch.cuda.get_device_properties(torch.device(device))
        out.update(gpu=p.name, gpu_memory_gib=round(p.total_memory / 2**30, 1))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nccl-worker", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--completion-len", type=int, default=256)
    ap.add_argument("--shapes", default="smollm2-135m,qwen2-0.5b")
    ap.add_argument("--skip-compile", action="store_true")
    ap.add_argument("--parts", default="parity,step,nccl")
    ap.add_argument("--device", default="cuda:0", help="cpu: a dry run of parity and step without a GPU")
    a = ap.parse_args()
    if a.nccl_worker is not None:
        nccl_worker(a.nccl_worker, a.port)
        return
    if a.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("bench_gpu: no CUDA device (this benchmark is for a GPU machine; --device cpu dry-runs it)")
    result: dict[str, Any] = {"env": env(a.device)}
    print(json.dumps(result["env"]), flush=True)
    parts = a.parts.split(",")
    jobs: list[tuple[str, Any]] = []
    if "parity" in parts:
        jobs.append(("parity", lambda: parity(a)))
    if "step" in parts:
        jobs += [(f"step_{s}", lambda s=s: steps(a, s)) for s in a.shapes.split(",")]
    if "nccl" in parts and a.device.startswith("cuda"):
        jobs.append(("nccl", lambda: nccl(a)))
    for name, job in jobs:
        t0 = time.perf_counter()
        try:
            result[name] = job()
        except Exception as exc:  # noqa: BLE001 - reported, the other parts still run
            result[name] = {"error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()[-2000:]}
        result[name]["part_seconds"] = round(time.perf_counter() - t0, 1)
        print(json.dumps({name: result[name]}), flush=True)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
