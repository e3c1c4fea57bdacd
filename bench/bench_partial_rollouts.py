"""Partial rollouts vs whole-batch generation: generator idle fraction, completions/s and reward per step.

    .venv/bin/python bench/bench_partial_rollouts.py [--steps 12] [--max-new-tokens 64] [--eos-prob 0.08]

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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--eos-prob", type=float, default=0.08)
    args = ap.parse_args()
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
