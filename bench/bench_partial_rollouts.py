"""Partial rollouts vs whole-batch generation: generator idle fraction, completions/s and reward per step.

    .venv/bin/python bench/bench_partial_rollouts.py [--steps 12] [--max-new-tokens 64] [--eos-prob 0.08]
    .venv/bin/python bench/bench_partial_rollouts.py --skewed [--model tiny] [--steps 8] [--prompts 16] \
        [--group-size 8] [--max-new-tokens 128] [--long-fraction 0.0625] [--max-policy-lag 1] [--reps 2]

``--skewed`` (issue 42 item 5): the generator alone, in this process, on one vLLM engine: a workload whose
completion lengths are drawn from a skewed mixture and enforced by the engine (most short, a few near
``maxNewTokens``; ``bench/skewed.py`` says how and why), served by the generator's two production loops in turn,
whole batch (``partialRollouts: false``) then partial rollouts, same seed, ``--reps`` alternations after a
two-step warm-up of each, from a stand-in for trainer 0 that issues work as its loop does (``maxPolicyLag`` steps
early, a SYNC after each complete step) and trains in no time (``--train-seconds``), so only the generator's
scheduling differs. Idle fraction = the part of the
engine's slot-seconds (one step's requests, promptsPerStep x groupSize) left empty, stragglers alone or the engine
not stepping, counted in this process's CPU seconds (the engine runs in it; on a shared machine, wall time is
mostly other people's work), so it is the part of the CPU spent on steps, weighted by their empty slots;
completions/s = the stand-in's (all steps complete), per wall second and per CPU second of this process
(``ratio`` and ``ratio_cpu``). Before the runs, the same engine's cost of one
decode step at batch 1, 2, 4, ... up to (1 + maxPolicyLag) x promptsPerStep x groupSize (the most the partial loop
can run at once): partial rollouts fill the slots, which pays only as far as a bigger batch costs less than
proportionally more per step. The gain's ceiling is 1 + maxPolicyLag: the next steps' work is all there is to run
beside the stragglers, and as steps are trained in order, step s + 1 + maxPolicyLag's work goes out only once step
s is complete, so two long steps within one window run one after the other in either mode. After the runs, the same workload replayed on those step costs alone (no engine, no
loop time: ``skewed.Simulated``): its ratio against the measured one tells the engine's share of the result from the
loops'. ``generate_full_batch``: the whole-batch loop's own vLLM path (``LLM.generate``) per step at a full
batch, against the step-driven backend's step there. Step costs are medians of wall and CPU seconds; the replay
and the ratios use CPU. The last line: both modes (medians over
the reps), their ratio, the step costs, the replay, the CPU.

Without ``--skewed``, end to end:

The workload (honest about what it is): the tiny example's copy task (``examples/tiny.yaml``: one character to copy,
groupSize and promptsPerStep as below) on a copy of the built-in tiny model whose head is untied and whose EOS row
is set so that a completion stops with probability about ``--eos-prob`` per token on average (calibrated here on
the model's own hidden states; per position it varies, so lengths are skewed: most completions stop early, a few
run to ``maxNewTokens``). The random tiny model learns to answer with one character and stop, so lengths shrink as
it learns: the skew is largest in the first steps. Everything else is the example's.

The same job runs twice with ``kubeforge run`` (real processes, vLLM, ZeroMQ, gloo), same seed: baseline
``partialRollouts: false`` (a SYNC waits for the batch's longest completion), then ``partialRollouts: true``.
Generator idle fraction = 1 - (seconds the generator spent sampling: ``Engine.generate`` calls, or engine steps) /
(wall time from its first WORK to its last sample), from the generator's closing ``kf-generator-activity`` line.
completions/s is the launcher's summary (steps 2..N). Prints one JSON line per run and a last line with both modes
side by side, their ratio, reward per step, the lengths seen and the machine. Nothing is asserted.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import yaml

import common

ROOT = common.ROOT


def skewed_model(out: pathlib.Path, *, eos_prob: float, seed: int = 0) -> dict[str, Any]:
    """The tiny model with an untied head whose EOS row gives about ``eos_prob`` per token (see the docstring)."""
    import torch
    import transformers

    from kubeforge.api import rljob
    from kubeforge.runtime import models

    src = models.resolve(rljob.ModelSpec(builtin="tiny"))
    model = transformers.AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval()
    eos = int(model.config.eos_token_id)
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, model.config.vocab_size, (16, 48), generator=gen)
    with torch.no_grad():
        h = model.model(ids).last_hidden_state.reshape(-1, model.config.hidden_size)
        head = model.get_output_embeddings().weight.detach().clone()
        base = h @ head.T
        direction = h.mean(0) / h.mean(0).norm()
        along = h @ direction

        def mean_p(alpha: float) -> float:
            logits = base.clone()
            logits[:, eos] = alpha * along
            return float(torch.softmax(logits, -1)[:, eos].mean())

        lo, hi = -50.0, 50.0
        for _ in range(60):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if mean_p(mid) < eos_prob else (lo, mid)
        head[eos] = lo * direction
    model.config.tie_word_embeddings = False
    model.lm_head = torch.nn.Linear(model.config.hidden_size, model.config.vocab_size, bias=False)
    model.lm_head.weight = torch.nn.Parameter(head)
    model.save_pretrained(out, safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        if (src / name).exists():
            shutil.copy(src / name, out / name)
    return {"eos_prob_target": eos_prob, "eos_prob_calibrated": round(mean_p(lo), 4)}


def run(*, model: pathlib.Path, steps: int, partial: bool, max_new_tokens: int, tmp: pathlib.Path,
        label: str) -> dict[str, Any]:
    doc = yaml.safe_load((ROOT / "examples" / "tiny.yaml").read_text())
    doc["metadata"]["name"] = f"bench-{label}"
    doc["spec"]["model"] = {"path": str(model)}
    algo = doc["spec"]["algorithm"]
    algo.update(steps=steps, maxNewTokens=max_new_tokens, partialRollouts=partial)
    doc["spec"]["checkpoint"]["everySteps"] = steps
    path = tmp / f"{label}.yaml"
    path.write_text(yaml.safe_dump(doc))
    run_dir = tmp / label
    proc = subprocess.run([sys.executable, "-m", "kubeforge.cli", "run", str(path), "--run-dir", str(run_dir)],
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"{label} run failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    summary: dict[str, Any] = common.last_json(proc.stdout)
    log = (run_dir / "logs" / "generator-0.log").read_text(errors="replace")
    lines = re.findall(r"kf-generator-activity (\{.*\})", log)
    activity = json.loads(lines[-1]) if lines else {}
    records = [json.loads(ln) for ln in (run_dir / "metrics.jsonl").read_text().splitlines() if ln.strip()]
    by_step = {r["step"]: r for r in records if r.get("mean_reward") is not None}
    rewards = [round(by_step[s]["mean_reward"], 4) for s in sorted(by_step)]
    tokens = [by_step[s]["tokens"] / max(by_step[s]["completions"], 1) for s in sorted(by_step)]
    return {"label": label, "partial_rollouts": partial,
            "generator_idle_fraction": activity.get("idle_fraction"),
            "completions_per_second": summary.get("completions_per_second"),
            "wall_seconds": summary.get("wall_seconds"), "reward_per_step": rewards,
            "mean_tokens_per_completion_per_step": [round(t, 2) for t in tokens],
            "generator": activity, "masked_stale_tokens": summary.get("masked_stale_tokens"),
            "token_lag_mean": summary.get("token_lag_mean"), "dropped_stale": summary.get("dropped_stale")}


def skewed_steps(eng: Any, *, length: Callable[[str], int], temperature: float) -> Any:
    """``vllm_steps.VllmSteps`` whose requests run exactly ``length(request_id)`` tokens (EOS ignored)."""
    from kubeforge.runtime.generator import vllm_steps

    class SkewedSteps(vllm_steps.VllmSteps):
        def params(self, request_id: str, *, seed: int | None) -> Any:
            return self._make(**{**self._params, "max_tokens": length(request_id), "ignore_eos": True}, seed=seed)

    return SkewedSteps(eng, max_tokens=1, temperature=temperature, top_p=1.0, chat_template=False)


def step_costs(eng: Any, *, batches: list[int], decode_steps: int, seed: int) -> list[dict[str, Any]]:
    """Median seconds of one decode step at each batch size, wall and this process's CPU (the engine runs in it):
    ``b`` samples of one prompt through the same pool and backend the modes use (the prefill step left out)."""
    import statistics

    import skewed
    from kubeforge.runtime.generator import stepper

    out = []
    for b in batches:
        pool = stepper.Pool(skewed_steps(eng, length=lambda rid: decode_steps + 1, temperature=1.0), group_size=b)
        pool.add(skewed.prompts_of(0, prompts_per_step=1, seed=seed), step=0, version=0, seed=seed)
        pool.step()                               # the prefill and first token
        wall, cpu = [], []
        while pool.busy():
            t0, c0 = time.perf_counter(), time.process_time()
            pool.step()
            wall.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
        w, c = statistics.median(wall), statistics.median(cpu)
        out.append({"batch": b, "seconds_per_step": round(w, 5), "cpu_seconds_per_step": round(c, 5),
                    "cpu_seconds_per_token": round(c / b, 6)})
    return out


def generate_cost(eng: Any, *, batch: int, decode_steps: int, seed: int) -> dict[str, float]:
    """Seconds per decode step (wall, CPU) of the whole-batch loop's own path at ``batch`` (``vllm.LLM.generate``,
    as ``Engine.generate`` calls it: one request of ``n = batch`` samples, final outputs only), the prefill spread
    over the steps: the baseline of the step-driven backend's per-step overhead (DELTA outputs, the pool)."""
    from vllm import SamplingParams

    import skewed

    ids = eng.encode(skewed.prompts_of(0, prompts_per_step=1, seed=seed)[0], chat_template=False)
    params = SamplingParams(n=batch, max_tokens=decode_steps + 1, ignore_eos=True, logprobs=0, seed=seed)
    t0, c0 = time.perf_counter(), time.process_time()
    eng.llm.generate([{"prompt_token_ids": ids}], params, use_tqdm=False)
    return {"seconds_per_step": round((time.perf_counter() - t0) / (decode_steps + 1), 5),
            "cpu_seconds_per_step": round((time.process_time() - c0) / (decode_steps + 1), 5)}


def skewed_main(args: argparse.Namespace) -> None:
    import statistics

    import skewed
    from kubeforge.api import rljob
    from kubeforge.runtime import models
    from kubeforge.runtime.generator import engine

    started = time.time()
    load_before = common.load_average()
    skew = skewed.Skew(max_new_tokens=args.max_new_tokens, long_fraction=args.long_fraction, seed=args.seed)
    capacity = args.prompts * args.group_size
    eng = engine.Engine(model_dir=models.resolve(rljob.ModelSpec(builtin=args.model)), dtype=args.dtype,
                        seed=args.seed, role=rljob.GeneratorRole(kv_cache_gib=1))
    print(f"engine up in {eng.start_seconds:.1f} s", file=sys.stderr, flush=True)
    most = (1 + args.max_policy_lag) * capacity
    batches = sorted({min(2 ** k, most) for k in range(most.bit_length() + 1)})
    costs = step_costs(eng, batches=batches, decode_steps=args.cost_steps, seed=args.seed)
    generate_full = generate_cost(eng, batch=capacity, decode_steps=args.cost_steps, seed=args.seed)
    print(json.dumps({"step_cost": costs, "generate_full_batch": generate_full}), flush=True)

    def length(request_id: str) -> int:
        key, sample = skewed.request_key(request_id)
        return int(skew.length(key=key, sample=sample))

    runs: dict[str, list[dict[str, Any]]] = {"off": [], "on": []}
    for rep in range(-1, args.reps):          # rep -1: two steps of each mode, a warm-up not counted
        for mode in ("off", "on"):
            steps = skewed_steps(eng, length=length, temperature=1.0)
            c0 = time.process_time()
            out = skewed.run_mode(partial_rollouts=mode == "on", backend=steps,
                                  steps=args.steps if rep >= 0 else min(2, args.steps),
                                  prompts_per_step=args.prompts, group_size=args.group_size,
                                  max_policy_lag=args.max_policy_lag, seed=args.seed,
                                  train_seconds=args.train_seconds, synced=steps.synced,
                                  reset=eng.llm.reset_prefix_cache, clock=time.process_time)
            cpu = time.process_time() - c0
            out.update(cpu_seconds=round(cpu, 3), completions_per_cpu_s=round(out["completions"] / cpu, 3))
            if rep >= 0:
                runs[mode].append(out)
            print(json.dumps({"mode": mode, "rep": rep, **out}), flush=True)
    eng.close()
    # the same workload replayed on the measured step costs alone (skewed.Simulated): what the modes would give
    # if the engine's forward were all that counted; the gap to the measured ratio is the loops' own time
    cost = skewed.interpolate([(c["batch"], c["cpu_seconds_per_step"]) for c in costs])
    replay = {}
    for mode in ("off", "on"):
        sim = skewed.Simulated(length=length, cost=cost)
        out = skewed.run_mode(partial_rollouts=mode == "on", backend=sim, steps=args.steps,
                              prompts_per_step=args.prompts, group_size=args.group_size,
                              max_policy_lag=args.max_policy_lag, seed=args.seed, clock=sim.clock)
        replay[mode] = {"completions_per_s": round(out["completions"] / out["engine_wall_seconds"], 3),
                        "idle_fraction": out["idle_fraction"], "engine_steps": out["engine_steps"]}
    print(json.dumps({"replay_on_step_costs": replay}), flush=True)

    def med(mode: str, key: str) -> float:
        return round(statistics.median(float(r[key]) for r in runs[mode]), 4)

    by_batch = {c["batch"]: c["cpu_seconds_per_step"] for c in costs}
    tokens = sorted({r["tokens"] for mode in runs for r in runs[mode]})
    print(json.dumps({
        "bench": "partial_rollouts", "workload": "skewed", "model": args.model, "dtype": args.dtype,
        "idle_fraction_off": med("off", "idle_fraction"), "idle_fraction_on": med("on", "idle_fraction"),
        "completions_per_s_off": med("off", "completions_per_s"), "completions_per_s_on": med("on", "completions_per_s"),
        "ratio": round(med("on", "completions_per_s") / med("off", "completions_per_s"), 3),
        "completions_per_cpu_s_off": med("off", "completions_per_cpu_s"),
        "completions_per_cpu_s_on": med("on", "completions_per_cpu_s"),
        "ratio_cpu": round(med("on", "completions_per_cpu_s") / med("off", "completions_per_cpu_s"), 3),
        "ceiling": 1 + args.max_policy_lag,
        "mean_batch_off": med("off", "mean_batch"), "mean_batch_on": med("on", "mean_batch"),
        "engine_steps_off": med("off", "engine_steps"), "engine_steps_on": med("on", "engine_steps"),
        "switches_on": med("on", "switches"), "switched_completions_on": med("on", "switched_completions"),
        "step_cost": costs, "generate_full_batch": generate_full,
        "replay_on_step_costs": {**replay, "ratio": round(replay["on"]["completions_per_s"]
                                                          / replay["off"]["completions_per_s"], 3)},
        "cpu_step_cost_ratio_full_over_one": (round(by_batch[capacity] / by_batch[1], 2)
                                              if capacity in by_batch else None),
        "cpu_step_cost_ratio_most_over_full": (round(by_batch[most] / by_batch[capacity], 2)
                                           if capacity in by_batch and most in by_batch else None),
        "tokens_per_mode": tokens, "same_tokens": len(tokens) == 1,
        "completion_length": {"mean_drawn": round(skew.mean(), 2), "short": [1, skew.short_max],
                              "long": [skew.long_min, skew.max_new_tokens], "long_fraction": skew.long_fraction},
        "settings": {"steps": args.steps, "prompts_per_step": args.prompts, "group_size": args.group_size,
                     "max_new_tokens": args.max_new_tokens, "max_policy_lag": args.max_policy_lag,
                     "train_seconds": args.train_seconds, "reps": args.reps, "seed": args.seed,
                     "engine_start_seconds": round(eng.start_seconds, 1)},
        "cpu": common.machine()["cpu_model"], "machine": common.machine(), "load_average_before": load_before,
        "load_average_after": common.load_average(), "bench_seconds": round(time.time() - started, 1),
    }))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--skewed", action="store_true", help="the generator alone on skewed lengths (the docstring)")
    ap.add_argument("--steps", type=int, default=None, help="12; --skewed: 8")
    ap.add_argument("--max-new-tokens", type=int, default=None, help="64; --skewed: 128")
    ap.add_argument("--eos-prob", type=float, default=0.08)
    ap.add_argument("--model", default="tiny", help="--skewed: a built-in model")
    ap.add_argument("--dtype", default="float32", help="--skewed")
    ap.add_argument("--prompts", type=int, default=16, help="--skewed: promptsPerStep")
    ap.add_argument("--group-size", type=int, default=8, help="--skewed")
    ap.add_argument("--long-fraction", type=float, default=1 / 16, help="--skewed: completions near the cap")
    ap.add_argument("--max-policy-lag", type=int, default=1, help="--skewed")
    ap.add_argument("--train-seconds", type=float, default=0.0, help="--skewed: the stand-in's time per step")
    ap.add_argument("--reps", type=int, default=2, help="--skewed: alternations of the two modes")
    ap.add_argument("--cost-steps", type=int, default=16, help="--skewed: decode steps timed per batch size")
    ap.add_argument("--seed", type=int, default=0, help="--skewed")
    args = ap.parse_args()
    if args.skewed:
        args.steps = 8 if args.steps is None else args.steps
        args.max_new_tokens = 128 if args.max_new_tokens is None else args.max_new_tokens
        skewed_main(args)
        return
    args.steps = 12 if args.steps is None else args.steps
    args.max_new_tokens = 64 if args.max_new_tokens is None else args.max_new_tokens
    started = time.time()
    load_before = common.load_average()
    with tempfile.TemporaryDirectory(prefix="kf-bench-partial-") as d:
        tmp = pathlib.Path(d)
        calibration = skewed_model(tmp / "model", eos_prob=args.eos_prob)
        out = {}
        for label, partial in (("whole-batch", False), ("partial", True)):
            out[label] = run(model=tmp / "model", steps=args.steps, partial=partial,
                             max_new_tokens=args.max_new_tokens, tmp=tmp, label=label)
            print(json.dumps(out[label]), flush=True)
    base, part = out["whole-batch"], out["partial"]

    def ratio(key: str) -> float | None:
        a, b = base[key], part[key]
        return round(float(b) / float(a), 3) if a and b else None

    print(json.dumps({
        "bench": "partial_rollouts", "steps": args.steps, "max_new_tokens": args.max_new_tokens,
        "workload": "copy task (examples/tiny.yaml) on the tiny model with a calibrated EOS head: skewed lengths",
        **calibration,
        "generator_idle_fraction": {"whole_batch": base["generator_idle_fraction"],
                                    "partial": part["generator_idle_fraction"]},
        "completions_per_second": {"whole_batch": base["completions_per_second"],
                                   "partial": part["completions_per_second"]},
        "ratio_partial_over_whole_batch": {"completions_per_second": ratio("completions_per_second"),
                                           "generator_idle_fraction": ratio("generator_idle_fraction")},
        "reward_per_step": {"whole_batch": base["reward_per_step"], "partial": part["reward_per_step"]},
        "mean_tokens_per_completion_per_step": {"whole_batch": base["mean_tokens_per_completion_per_step"],
                                                "partial": part["mean_tokens_per_completion_per_step"]},
        "partial_switched_completions": part["generator"].get("switched_completions"),
        "partial_masked_stale_tokens": part["masked_stale_tokens"], "partial_token_lag_mean": part["token_lag_mean"],
        "machine": common.machine(), "load_average_before": load_before, "load_average_after": common.load_average(),
        "bench_seconds": round(time.time() - started, 1),
    }))


if __name__ == "__main__":
    main()
