"""Multi-turn episodes vs single-turn completions on one vLLM engine: sampled policy tokens per second.

    .venv/bin/python bench/bench_multiturn.py [--example examples/tool-calculator.yaml] [--reps 3]

What it measures: the example's engine (``generator.Engine``: its model, dtype, ``maxNewTokens``, temperature)
samples ``promptsPerStep`` prompts x ``groupSize`` per batch two ways, alternating, ``--reps`` times after one
warm-up batch of each:

- ``multi_turn``: episodes of the example's environment exactly as a generator runs them
  (``agents.runner.EpisodeSampler`` over ``generator.start.EngineTurns``, the environments in
  ``agents.hosts.workers.SubprocessHost`` worker processes): every turn is one batched vLLM call on the episode so far
  (prompt + earlier turns + the environment's answers, re-sent as token ids), then one environment step.
- ``single_turn``: plain completions of the same prompts (``Engine.generate``) with the episodes' token budget per
  completion (``maxNewTokens`` x ``maxTurns``, capped by ``maxTokensPerEpisode``).

The figure is policy tokens sampled per second (environment tokens, which the policy does not sample, are not
counted; prefill of the growing context is what multi-turn pays for), the median over the reps, and their ratio.
Each line also carries completions (episodes) per second, the turns per episode and the tool calls, since an
untrained model's episodes are often one turn long. The load average is printed beside the figures.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import sys
import time
import types as pytypes
from typing import Any

import common

ROOT = common.ROOT


def run(example: str, reps: int) -> dict[str, Any]:
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from kubeforge.api import load
    from kubeforge.runtime import models, tasks
    from kubeforge.runtime.agents import runner
    from kubeforge.runtime.agents.hosts import workers
    from kubeforge.runtime.generator import engine as engine_mod
    from kubeforge.runtime.generator import start as gen_start

    spec = load.load_file(example).spec
    env, algo = spec.environment, spec.algorithm
    if env is None:
        raise SystemExit(f"{example}: no spec.environment (a multi-turn example is needed)")
    stream = tasks.stream(spec.task)
    eng = engine_mod.Engine(model_dir=models.resolve(spec.model), dtype=spec.model.dtype, role=spec.roles.generator,
                            seed=spec.task.seed)
    host = workers.SubprocessHost(env, workers=gen_start.ENV_WORKERS)
    sampler = runner.EpisodeSampler(engine=gen_start.EngineTurns(eng, pytypes.SimpleNamespace(spec=spec)), host=host,
                                    spec=env, algorithm=algo, chat_template=spec.task.chat_template, seed=0,
                                    max_context=int(eng.kwargs["max_model_len"]))
    budget = env.episode_tokens(algo.max_new_tokens)
    k = algo.prompts_per_step
    rows: dict[str, list[dict[str, float]]] = {"multi_turn": [], "single_turn": []}
    try:
        for rep in range(reps + 1):           # rep 0: warm-up of each mode, dropped
            prompts = [stream.prompt_at(rep * k + i) for i in range(k)]
            t = time.perf_counter()
            groups = sampler.sample(prompts)
            dt = time.perf_counter() - t
            stats = [s for g in groups for s in (g.episode_stats or ())]
            policy = sum(e - s for g in groups for spans in (g.policy_spans or ()) for s, e in spans)
            multi = {"seconds": dt, "policy_tokens": policy, "completions": len(stats),
                     "turns_mean": sum(s.turns for s in stats) / max(len(stats), 1),
                     "tool_calls": sum(s.tool_calls for s in stats)}
            t = time.perf_counter()
            out = eng.generate(prompts, n=algo.group_size, max_tokens=budget, temperature=algo.temperature,
                               top_p=algo.top_p, top_k=algo.top_k, seed=rep, chat_template=spec.task.chat_template)
            dt = time.perf_counter() - t
            single = {"seconds": dt, "policy_tokens": sum(len(c.token_ids) for _, cs in out for c in cs),
                      "completions": sum(len(cs) for _, cs in out)}
            if rep:
                rows["multi_turn"].append(multi)
                rows["single_turn"].append(single)
            print(json.dumps({"rep": rep, "multi_turn": multi, "single_turn": single}), file=sys.stderr, flush=True)
    finally:
        host.shutdown()
        eng.close()
    result: dict[str, Any] = {}
    for mode, rs in rows.items():
        result[mode] = {"tokens_per_second": round(statistics.median(r["policy_tokens"] / r["seconds"] for r in rs), 2),
                        "completions_per_second": round(statistics.median(r["completions"] / r["seconds"] for r in rs),
                                                        3),
                        "policy_tokens_per_completion": round(sum(r["policy_tokens"] for r in rs)
                                                              / sum(r["completions"] for r in rs), 2),
                        "seconds": [round(r["seconds"], 2) for r in rs]}
    result["multi_turn"]["turns_mean"] = round(statistics.mean(r["turns_mean"] for r in rows["multi_turn"]), 3)
    result["multi_turn"]["tool_calls"] = int(sum(r["tool_calls"] for r in rows["multi_turn"]))
    result["single_turn"]["max_tokens"] = budget
    result["ratio_tokens_per_second"] = round(result["multi_turn"]["tokens_per_second"]
                                              / result["single_turn"]["tokens_per_second"], 3)
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--example", default=str(ROOT / "examples" / "tool-calculator.yaml"))
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    start = common.load_average()
    out: dict[str, Any] = {"bench": "multiturn", "example": pathlib.Path(args.example).name}
    out.update(run(args.example, max(1, args.reps)))
    out["load_average"] = {"start": start, "end": common.load_average()}
    out["machine"] = common.machine()
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
