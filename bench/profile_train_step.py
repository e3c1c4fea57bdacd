"""Where a kubeforge train step spends its time: the demo's model and shape, torch profiler, one JSON line.

    .venv/bin/python bench/profile_train_step.py [--example examples/arithmetic-smollm2.yaml] [--steps 3]
                                                 [--threads N] [--top 15] [--share-prefix] [--ab]
                                                 [--compare share-prefix|autocast|attention|pack|compile|keep-probs]
                                                 [--compile] [--pack]

Builds ``learner.step.Trainer`` exactly as the trainer role does (the example's model, dtype, algorithm), feeds it
groups shaped like the example's steps (its real prompts, ``promptsPerStep`` x ``groupSize`` completions of
``maxNewTokens`` random tokens, alternating rewards so every group has signal), drops one warm-up step and prints
the step's phases (forward, backward, optimizer), the step's FLOPs as the trainer counts them (``learner/flops.py``:
the matmuls of the token shapes it ran, attention included), the achieved GFLOP/s, the GEMM peak measured in the
process (``learner/peak.py``) and their ratio ``mfu``, and the top operators by self CPU time under ``torch.profiler``. ``--compare`` instead alternates
two variants of the step on the same batches and prints wall and process CPU seconds of each (CPU time is what a
loaded machine distorts least): ``share-prefix`` (each distinct prompt once vs the full forward; ``--ab`` is its
old name) or ``autocast`` (the trainer's bf16 compute copy, ``learner/compute_copy.py``, vs autocast over the float32
masters, the path before it) or ``attention`` (eager attention for short rows vs SDPA on the compute copy,
``learner/logprobs.py`` "Short rows") or ``pack`` (each group packed into one row, its prompt once, vs the full
forward; logprobs "Shared prompts") or ``compile`` (compiled decoder blocks vs eager: ``learner/compiled.py``; the
compile itself happens in the warm-up step, whose seconds are printed as ``warmup_seconds``) or ``keep-probs`` (the
LM head's probabilities kept from forward to backward vs recomputed there: ``learner/lmhead.py``). ``--compile`` and
``--pack`` turn those on for the profile (packing is already the trainer's default for its CPU compute copy;
``tokens_computed_per_step`` then counts each prompt once). Nothing else runs in this process; the load average is printed beside the figures.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import transformers

from kubeforge.api import load
from kubeforge.runtime import models, tasks, types
from kubeforge.runtime.learner import compiled, logprobs, step


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
    ap.add_argument("--ab", action="store_true", help="the same as --compare share-prefix")
    ap.add_argument("--compile", action="store_true", help="compiled decoder blocks (spec.roles.trainer.compile)")
    ap.add_argument("--pack", action="store_true", help="each group packed into one row (logprobs: 'Shared "
                    "prompts')")
    ap.add_argument("--compare", choices=sorted(VARIANTS), default=None, help="no profiler: alternate the two "
                    "variants' steps and print wall and process CPU seconds of each")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    job = load.load_file(a.example)
    spec = job.spec
    dtype = a.dtype or str(getattr(spec.model.dtype, "value", spec.model.dtype))
    path = models.resolve(spec.model)
    tok = transformers.AutoTokenizer.from_pretrained(str(path))
    trainer = step.Trainer(model_path=path, algorithm=spec.algorithm, dtype=dtype,
                           logit_temperature=spec.algorithm.temperature or 1.0,
                           scale=step.Scale(compile=a.compile or a.compare == "compile"))
    trainer.policy.share_prefix = trainer.compute_policy.share_prefix = a.share_prefix
    if a.pack:
        _pack(trainer, True)
    params = sum(p.numel() for p in trainer.model.parameters())
    w0 = time.perf_counter()
    trainer.train_step(groups=demo_groups(spec, tok, seed=0))          # warm-up
    warmup = time.perf_counter() - w0
    if a.ab or a.compare:
        if a.compare == "compile":                                     # the eager side's warm-up too
            _compiled(trainer, False)
            trainer.train_step(groups=demo_groups(spec, tok, seed=0))
        ab(trainer, spec, tok, steps=a.steps, variants=VARIANTS[a.compare or "share-prefix"], warmup=warmup)
        return
    walls, phases, tokens, rows, flops, mfus = [], [], 0, 0, 0.0, []
    prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
    with prof:
        for s in range(a.steps):
            gs = demo_groups(spec, tok, seed=s + 1)
            t0 = time.perf_counter()
            m = trainer.train_step(groups=gs)
            walls.append(time.perf_counter() - t0)
            phases.append(m.seconds)
            once = a.share_prefix or trainer.compute_policy.pack_max_tokens > 0     # each prompt computed once
            tokens = sum(len(c.token_ids) for g in gs for c in g.completions) + sum(
                len(g.prompt_token_ids) * (1 if once else len(g.completions)) for g in gs)
            rows, flops = m.tokens, m.flops or 0.0
            mfus.append(m.mfu or 0.0)
    med = statistics.median(walls)
    table = prof.key_averages()
    total_self = sum(e.self_cpu_time_total for e in table) or 1
    top = sorted(table, key=lambda e: e.self_cpu_time_total, reverse=True)[:a.top]
    print(json.dumps({
        "bench": "profile_train_step", "example": a.example, "dtype": dtype,
        "share_prefix": a.share_prefix, "pack_max_tokens": trainer.compute_policy.pack_max_tokens,
        "compiled": trainer.compile_state, "warmup_seconds": round(warmup, 2), "compute_copy": trainer.shadow is not None, "torch_threads": torch.get_num_threads(),
        "cpus": len(os.sched_getaffinity(0)), "load_average": [round(x, 2) for x in os.getloadavg()],
        "params": params, "tokens_computed_per_step": tokens, "completion_tokens": rows,
        "step_seconds": [round(w, 3) for w in walls], "step_seconds_median": round(med, 3),
        "phases_median": {k: round(statistics.median(p[k] for p in phases), 3) for k in phases[0]},
        "gflop_per_step": round(flops / 1e9, 1), "gflop_per_second": round(flops / med / 1e9, 1),
        "peak_gflop_per_second": round(trainer.meter.peak / 1e9, 1), "mfu_median": round(statistics.median(mfus), 4),
        "top_self_cpu": [{"op": e.key, "share": round(e.self_cpu_time_total / total_self, 3),
                          "calls": e.count} for e in top],
    }), flush=True)


def _share_prefix(trainer: step.Trainer, on: bool) -> None:
    trainer.policy.share_prefix = trainer.compute_policy.share_prefix = on


_COPIES: dict[int, Any] = {}     # id(trainer) -> its compute copy while autocast runs


def _compute_copy(trainer: step.Trainer, on: bool) -> None:
    copy = _COPIES.setdefault(id(trainer), trainer.shadow)
    if copy is None:
        raise SystemExit("--compare autocast: this trainer has no compute copy (float32 compute or FSDP)")
    trainer.shadow = copy if on else None
    if on:
        copy.refresh(trainable_only=False)      # the masters moved while autocast ran


_EAGER: dict[int, int] = {}      # id(trainer) -> the compute policy's eager-attention limit


def _eager_attention(trainer: step.Trainer, on: bool) -> None:
    limit = _EAGER.setdefault(id(trainer), trainer.compute_policy.eager_attention_max_tokens)
    if not limit:
        raise SystemExit("--compare attention: this trainer does not use eager attention")
    trainer.compute_policy.eager_attention_max_tokens = limit if on else 0


def _pack(trainer: step.Trainer, on: bool) -> None:
    trainer.compute_policy.pack_max_tokens = logprobs.PACK_MAX_TOKENS if on else 0


def _compiled(trainer: step.Trainer, on: bool) -> None:
    if on and not compiled.is_compiled(trainer.compute_policy.lm):
        compiled.compile_blocks(trainer.compute_policy.lm)
    elif not on:
        compiled.uncompile_blocks(trainer.compute_policy.lm)


def _keep_probs(trainer: step.Trainer, on: bool) -> None:
    for pol in {id(trainer.policy): trainer.policy, id(trainer.compute_policy): trainer.compute_policy}.values():
        pol.keep_elements = logprobs.KEEP_ELEMENTS if on else 0


# name -> (label when on, label when off, switch)
VARIANTS: dict[str, tuple[str, str, Callable[[step.Trainer, bool], None]]] = {
    "share-prefix": ("shared", "full", _share_prefix),
    "autocast": ("compute_copy", "autocast", _compute_copy),
    "attention": ("eager", "sdpa", _eager_attention),
    "pack": ("packed", "full", _pack),
    "compile": ("compiled", "eager", _compiled),
    "keep-probs": ("kept", "recomputed", _keep_probs),
}


def ab(trainer: step.Trainer, spec, tok, *, steps: int,  # type: ignore[no-untyped-def]
       variants: tuple[str, str, Callable[[step.Trainer, bool], None]], warmup: float) -> None:
    """Interleaved A/B of two variants on the same batches (same load for both)."""
    on_name, off_name, switch = variants
    got: dict[str, dict[str, list[float]]] = {k: {"wall": [], "cpu": []} for k in (on_name, off_name)}
    for s in range(steps):
        gs = demo_groups(spec, tok, seed=s + 1)
        for name in ((on_name, off_name) if s % 2 == 0 else (off_name, on_name)):
            switch(trainer, name == on_name)
            w0, c0 = time.perf_counter(), time.process_time()
            trainer.train_step(groups=gs)
            got[name]["wall"].append(time.perf_counter() - w0)
            got[name]["cpu"].append(time.process_time() - c0)
    med = {k: {m: round(statistics.median(v), 3) for m, v in d.items()} for k, d in got.items()}
    print(json.dumps({"bench": "profile_train_step --compare", "variants": [on_name, off_name],
                      "torch_threads": torch.get_num_threads(), "warmup_seconds": round(warmup, 2),
                      "load_average": [round(x, 2) for x in os.getloadavg()], "steps_each": steps,
                      "seconds": {k: {m: [round(x, 2) for x in v] for m, v in d.items()} for k, d in got.items()},
                      "median": med,
                      f"cpu_ratio_{off_name}_over_{on_name}": round(med[off_name]["cpu"] / med[on_name]["cpu"], 3),
                      f"wall_ratio_{off_name}_over_{on_name}": round(med[off_name]["wall"] / med[on_name]["wall"],
                                                                     3)}),
          flush=True)


if __name__ == "__main__":
    main()
