"""Where a kubeforge train step spends its time: the demo's model and shape, torch profiler, one JSON line.

    .venv/bin/python bench/profile_train_step.py [--example examples/arithmetic-smollm2.yaml] [--steps 3]
                                                 [--threads N] [--top 15] [--share-prefix] [--ab]

Builds ``trainer.step.Trainer`` exactly as the trainer role does (the example's model, dtype, algorithm), feeds it
groups shaped like the example's steps (its real prompts, ``promptsPerStep`` x ``groupSize`` completions of
``maxNewTokens`` random tokens, alternating rewards so every group has signal), drops one warm-up step and prints
the step's phases (forward, backward, optimizer), the step's FLOPs (6 x parameters x tokens computed, the usual
estimate, plus the LM head on completion tokens only; with shared prompts each group's prompt counts once), the
achieved GFLOP/s, and the top operators by self CPU time under ``torch.profiler``. ``--ab`` instead alternates
shared-prompt and full-forward steps on the same batches (wall and process CPU seconds of each). Nothing else runs in this process; the load average is printed beside the figures.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time

import torch
import transformers

from kubeforge.api import load
from kubeforge.runtime import models, tasks, types
from kubeforge.runtime.trainer import step


def demo_groups(job_spec, tok, *, seed: int) -> list[types.RolloutGroup]:  # type: ignore[no-untyped-def]
    algo = job_spec.algorithm
    stream = tasks.stream(job_spec.task)
    rng = random.Random(seed)
    out = []
    for k in range(algo.prompts_per_step):
        p = stream.prompt_at(seed * algo.prompts_per_step + k)
        ids = tok.apply_chat_template([{"role": "user", "content": p.text}], add_generation_prompt=True,
                                      tokenize=True)
        ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
        comps = [types.Completion(token_ids=[rng.randrange(1000, 20000) for _ in range(algo.max_new_tokens)],
                                  logprobs=[-3.0] * algo.max_new_tokens, text="")
                 for _ in range(algo.group_size)]
        out.append(types.RolloutGroup(prompt=p, prompt_token_ids=ids, completions=comps, policy_version=0,
                                      rewards=[float(i % 2) for i in range(algo.group_size)]))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--example", default="examples/arithmetic-smollm2.yaml")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--dtype", default=None, help="override spec.model.dtype")
    ap.add_argument("--share-prefix", action="store_true", help="each distinct prompt once (logprobs: 'Shared "
                    "prompts'; the trainer's default is the full forward)")
    ap.add_argument("--ab", action="store_true", help="no profiler: alternate shared / full-forward steps and print "
                    "wall and process CPU seconds of each (CPU time is what a loaded machine distorts least)")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    job = load.load_file(a.example)
    spec = job.spec
    dtype = a.dtype or str(getattr(spec.model.dtype, "value", spec.model.dtype))
    path = models.resolve(spec.model)
    tok = transformers.AutoTokenizer.from_pretrained(str(path))
    trainer = step.Trainer(model_path=path, algorithm=spec.algorithm, dtype=dtype,
                           logit_temperature=spec.algorithm.temperature or 1.0)
    trainer.policy.share_prefix = a.share_prefix
    params = sum(p.numel() for p in trainer.model.parameters())
    trainer.train_step(groups=demo_groups(spec, tok, seed=0))          # warm-up
    if a.ab:
        ab(trainer, spec, tok, steps=a.steps)
        return
    walls, phases, tokens, rows = [], [], 0, 0
    prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
    with prof:
        for s in range(a.steps):
            gs = demo_groups(spec, tok, seed=s + 1)
            t0 = time.perf_counter()
            m = trainer.train_step(groups=gs)
            walls.append(time.perf_counter() - t0)
            phases.append(m.seconds)
            tokens = sum(len(c.token_ids) for g in gs for c in g.completions) + sum(
                len(g.prompt_token_ids) * (1 if trainer.policy.share_prefix else len(g.completions)) for g in gs)
            rows = m.tokens
    cfg = trainer.model.config
    head = 2 * cfg.hidden_size * cfg.vocab_size * rows * 3          # completion-only LM head, fwd + bwd
    flops = 6 * (params - cfg.hidden_size * cfg.vocab_size) * tokens + head
    med = statistics.median(walls)
    table = prof.key_averages()
    total_self = sum(e.self_cpu_time_total for e in table) or 1
    top = sorted(table, key=lambda e: e.self_cpu_time_total, reverse=True)[:a.top]
    print(json.dumps({
        "bench": "profile_train_step", "example": a.example, "dtype": dtype,
        "share_prefix": trainer.policy.share_prefix, "torch_threads": torch.get_num_threads(),
        "cpus": len(os.sched_getaffinity(0)), "load_average": [round(x, 2) for x in os.getloadavg()],
        "params": params, "tokens_computed_per_step": tokens, "completion_tokens": rows,
        "step_seconds": [round(w, 3) for w in walls], "step_seconds_median": round(med, 3),
        "phases_median": {k: round(statistics.median(p[k] for p in phases), 3) for k in phases[0]},
        "gflop_per_step": round(flops / 1e9, 1), "gflop_per_second": round(flops / med / 1e9, 1),
        "top_self_cpu": [{"op": e.key, "share": round(e.self_cpu_time_total / total_self, 3),
                          "calls": e.count} for e in top],
    }), flush=True)


def ab(trainer: step.Trainer, spec, tok, *, steps: int) -> None:  # type: ignore[no-untyped-def]
    """Interleaved A/B of shared prompts vs the full forward on the same batches (same load for both)."""
    got: dict[str, dict[str, list[float]]] = {k: {"wall": [], "cpu": []} for k in ("shared", "full")}
    for s in range(steps):
        gs = demo_groups(spec, tok, seed=s + 1)
        for name in (("shared", "full") if s % 2 == 0 else ("full", "shared")):
            trainer.policy.share_prefix = name == "shared"
            w0, c0 = time.perf_counter(), time.process_time()
            trainer.train_step(groups=gs)
            got[name]["wall"].append(time.perf_counter() - w0)
            got[name]["cpu"].append(time.process_time() - c0)
    med = {k: {m: round(statistics.median(v), 3) for m, v in d.items()} for k, d in got.items()}
    print(json.dumps({"bench": "profile_train_step --ab", "torch_threads": torch.get_num_threads(),
                      "load_average": [round(x, 2) for x in os.getloadavg()], "steps_each": steps,
                      "seconds": {k: {m: [round(x, 2) for x in v] for m, v in d.items()} for k, d in got.items()},
                      "median": med, "cpu_ratio_full_over_shared": round(med["full"]["cpu"] / med["shared"]["cpu"], 3),
                      "wall_ratio_full_over_shared": round(med["full"]["wall"] / med["shared"]["wall"], 3)}),
          flush=True)


if __name__ == "__main__":
    main()
