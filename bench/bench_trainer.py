"""Trainer step throughput vs a plain forward/backward baseline, measured in the same run.

What is compared, on the same model, batch and optimizer settings (CPU by default):
- baseline: HF ``model(input_ids, attention_mask, labels=...)`` (cross entropy over completion tokens, full
  logits), backward, grad-norm clip, AdamW step — the least a training step can do;
- trainer: ``kubeforge.runtime.learner.step.Trainer.train_step`` (collate from RolloutGroups, advantages, logprob
  gather with ``logits_to_keep``, entropy, the GRPO loss, the all-reduce bookkeeping for world size 1, clip, AdamW).
The two are interleaved step by step so machine noise hits both alike; warm-up steps are dropped.
Tokens = completion tokens trained on (prompt tokens excluded). Utilisation (``mfu``): the trainer's achieved
FLOP/s (``learner/flops.py``: forward + backward matmuls of the step as run) over the GEMM peak measured in the same
process, threads and dtype (``learner/peak.py``), medians over the measured steps. Prints one JSON object last.

    .venv/bin/python bench/bench_trainer.py [--steps 8] [--hidden 256] [--layers 4] [--vocab 4096]
    .venv/bin/python bench/bench_trainer.py --model ~/.cache/kubeforge/models/smollm2-135m-instruct-v1 \
        --prompts 4 --group-size 8 --prompt-len 48 --completion-len 16 --dtype bfloat16 --no-baseline   # the demo
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch
import transformers

from kubeforge.api import rljob
from kubeforge.runtime.learner import batch as batch_mod
from kubeforge.runtime.learner import step

import common


def build_model(path: Path, *, hidden: int, layers: int, vocab: int) -> None:
    cfg = transformers.Qwen2Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=hidden * 3,
                                   num_hidden_layers=layers, num_attention_heads=hidden // 64,
                                   num_key_value_heads=hidden // 64, max_position_embeddings=512,
                                   tie_word_embeddings=True, pad_token_id=0)
    torch.manual_seed(0)
    transformers.Qwen2ForCausalLM(cfg).save_pretrained(path)


def baseline_step(model: torch.nn.Module, opt: torch.optim.Optimizer, b: batch_mod.Batch, max_norm: float) -> None:
    p = b.input_ids.shape[1] - b.completion_len
    labels = torch.full_like(b.input_ids, -100)
    labels[:, p:] = torch.where(b.completion_mask > 0, b.completion_ids, torch.full_like(b.completion_ids, -100))
    out = model(input_ids=b.input_ids, attention_mask=b.attention_mask, position_ids=b.position_ids, labels=labels)
    opt.zero_grad(set_to_none=True)
    torch.autograd.backward([out.loss])
    torch.nn.utils.clip_grad_norm_(list(model.parameters()), max_norm)
    opt.step()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--completion-len", type=int, default=32)
    ap.add_argument("--loss", default="GRPO")
    ap.add_argument("--model", type=Path, help="an HF folder to train (default: a random Qwen2 of the sizes above)")
    ap.add_argument("--dtype", default="float32", choices=sorted(step.DTYPES), help="the trainer's compute dtype")
    ap.add_argument("--no-baseline", action="store_true", help="time the trainer alone")
    a = ap.parse_args()
    algo = rljob.AlgorithmSpec.model_validate({"loss": a.loss, "learningRate": 1e-5,
                                               "maxNewTokens": a.completion_len})
    with tempfile.TemporaryDirectory() as d:
        path = a.model or Path(d)
        if a.model is None:
            build_model(path, hidden=a.hidden, layers=a.layers, vocab=a.vocab)
        trainer = step.Trainer(model_path=path, algorithm=algo, dtype=a.dtype)
        base = step.load_model(path=path, dtype="float32", device=torch.device("cpu"))
    cfg = base.config
    a.hidden, a.layers, a.vocab = cfg.hidden_size, cfg.num_hidden_layers, cfg.vocab_size
    base.train()
    opt = torch.optim.AdamW(base.parameters(), lr=1e-5)
    times: dict[str, list[float]] = {"trainer": [], "baseline": []}
    phases: list[dict[str, float]] = []
    use: list[tuple[float, float, float]] = []     # mfu, achieved, peak per measured step
    tokens = 0
    for s in range(a.warmup + a.steps):
        gs = common.random_groups(prompts=a.prompts, group_size=a.group_size, prompt_len=a.prompt_len,
                                  completion_len=a.completion_len, vocab=a.vocab, seed=s)
        t0 = time.perf_counter()
        m = trainer.train_step(groups=gs)
        t1 = time.perf_counter()
        if not a.no_baseline:
            b = batch_mod.collate(groups=gs, pad_id=0, scale_by_std=True)
            baseline_step(base, opt, b, algo.max_grad_norm)
        t2 = time.perf_counter()
        if s >= a.warmup:
            times["trainer"].append(t1 - t0)
            times["baseline"].append(t2 - t1)
            phases.append(m.seconds)
            tokens = m.tokens
            use.append((m.mfu or 0.0, m.flops_per_second or 0.0, m.peak_flops_per_second or 0.0))
    med = {k: statistics.median(v) for k, v in times.items()}
    result = {
        "model": {"hidden": a.hidden, "layers": a.layers, "vocab": a.vocab,
                  "params": sum(p.numel() for p in base.parameters())},
        "batch": {"completions": a.prompts * a.group_size, "prompt_len": a.prompt_len,
                  "completion_len": a.completion_len, "completion_tokens": tokens},
        "steps_measured": a.steps, "torch_threads": torch.get_num_threads(),
        "trainer_step_s_median": round(med["trainer"], 4),
        "trainer_tokens_per_s": round(tokens / med["trainer"], 1),
        "dtype": a.dtype, "mfu": round(statistics.median(u[0] for u in use), 4),
        "achieved_gflops": round(statistics.median(u[1] for u in use) / 1e9, 2),
        "peak_gflops": round(statistics.median(u[2] for u in use) / 1e9, 2),
        "step_gflop": round((m.flops or 0.0) / 1e9, 2), "machine": common.machine(),
        **({} if a.no_baseline else {
            "baseline_step_s_median": round(med["baseline"], 4), "baseline_tokens_per_s": round(tokens / med["baseline"], 1),
            "trainer_over_baseline_time": round(med["trainer"] / med["baseline"], 3)}),
        "trainer_phases_s_median": {k: round(statistics.median(p[k] for p in phases), 4) for k in phases[0]},
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
