"""Verifier throughput: completions scored per second on one core (this process is single-threaded for rule
verifiers), against baselines measured in the same run, same machine.

    .venv/bin/python bench/bench_verifiers.py [--groups 400] [--group-size 16] [--repeat 3]

Cases (every completion distinct and the score cache off, so nothing is served from the cache):
- ``rules``: the rule verifiers (ExactAnswer, a format Regex with its time limit, Length) through ``Scorer``
  (one batched call per verifier per group, WeightedSum). Baseline ``rules-per-completion``: the same verifiers
  called once per completion and verifier, rewards summed in Python (how a per-response reward loop scores).
- ``weak20``: 20 rule verifiers (ExactAnswer, 15 Regex, 4 Length) aggregated by WeakSupervision (label model fitted
  on a 4096-completion window, refit every step here, i.e. more often than a job would). Baseline ``weighted20``:
  the same 20 verifiers with WeightedSum, so the ratio is the cost of the weak supervision itself.
- ``label-model-fit``: one ``LabelModel.fit`` on 4096 x 20 votes (ms).
Reported: completions per CPU-second of this single-threaded process (= per core; robust to a busy machine)
and per wall-clock second (best of ``repeat``), the ratios of the CPU rates, and LabelModel.fit CPU time. The
last line of stdout is a JSON summary.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import time
from typing import Any

import numpy as np

from kubeforge.api import rljob
from kubeforge.runtime import types, verifiers
from kubeforge.runtime.verifiers import registry
from kubeforge.runtime.verifiers.weak import LabelModel

PATTERNS = [r"^\s*-?\d+\s*$", r"\d", r"^\d", r"\d$", r"^-", r"[a-z]", r"\s", r"^\S+$", r"answer", r"\d{2}",
            r"\d{3}", r"^[0-9+\- ]+$", r"=", r"[02468]\s*$", r"(\d)\1"]


def vspec(**kw: Any) -> rljob.VerifierSpec:
    return rljob.VerifierSpec.model_validate(kw)


def rule_specs() -> list[rljob.VerifierSpec]:
    return [vspec(name="answer", type="ExactAnswer"),
            vspec(name="format", type="Regex", weight=0.1, regex={"pattern": PATTERNS[0]}),
            vspec(name="short", type="Length", weight=0.1, length={"maxChars": 12, "slopeChars": 8})]


def twenty_specs() -> list[rljob.VerifierSpec]:
    specs = [vspec(name="answer", type="ExactAnswer")]
    specs += [vspec(name=f"re{i}", type="Regex", regex={"pattern": p}) for i, p in enumerate(PATTERNS)]
    specs += [vspec(name=f"len{i}", type="Length", length={"maxChars": m, "slopeChars": 4})
              for i, m in enumerate((2, 4, 8, 16))]
    assert len(specs) == 20
    return specs


def groups(n: int, size: int, seed: int = 0) -> list[types.RolloutGroup]:
    rng = random.Random(seed)
    out = []
    for k in range(n):
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        ans = str(a + b)
        texts = []
        for j in range(size):
            guess = a + b + rng.choice((0, 0, 1, -1, 10))
            texts.append(rng.choice((f"{guess}", f" {guess} ", f"{a} + {b} = {guess}", f"The answer is {guess}.",
                                     f"{guess} apples", "no idea")) + f" #{k}.{j}" * rng.randint(0, 1))
        out.append(types.RolloutGroup(prompt=types.Prompt(index=k, text=f"What is {a} + {b}?", answer=ans),
                                      prompt_token_ids=[1], policy_version=0, step=k // 16,
                                      completions=[types.Completion(token_ids=[], logprobs=[], text=t) for t in texts]))
    return out


def rate(fn: Any, completions: int, repeat: int) -> tuple[float, float]:
    """(completions per CPU-second of this process, completions per wall-clock second), best of ``repeat``. The
    process is single-threaded, so per CPU-second is per core, and unlike wall time it holds on a busy machine."""
    best_cpu = best_wall = 0.0
    for _ in range(repeat):
        c0, t0 = time.process_time(), time.perf_counter()
        fn()
        best_cpu = max(best_cpu, completions / max(time.process_time() - c0, 1e-9))
        best_wall = max(best_wall, completions / (time.perf_counter() - t0))
    return best_cpu, best_wall


def scorer_case(specs: list[rljob.VerifierSpec], reward: dict[str, Any], gs: list[types.RolloutGroup]) -> Any:
    def run() -> None:
        s = verifiers.Scorer(specs, reward=rljob.RewardSpec.model_validate({**reward, "cacheSize": 0}))
        for g in gs:
            s.score_group(g)
        s.close()
    return run


def per_completion_case(specs: list[rljob.VerifierSpec], gs: list[types.RolloutGroup]) -> Any:
    built = [(s.weight, registry.build(s)) for s in specs]

    def run() -> None:
        for g in gs:
            for c in g.completions:
                sum(w * v.score(g.prompt, [c.text])[0] for w, v in built)
    return run


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--groups", type=int, default=400)
    ap.add_argument("--group-size", type=int, default=16)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    gs = groups(args.groups, args.group_size)
    n = args.groups * args.group_size
    weak = {"aggregation": "WeakSupervision",   # the API defaults: window 4096, refit every 10 steps (160 groups)
            "weakSupervision": {"refitEverySteps": 10, "minItems": 64, "window": 4096}}
    res: dict[str, Any] = {"completions": n, "group_size": args.group_size, "cpus": len(os.sched_getaffinity(0)),
                           "loadavg_1m": os.getloadavg()[0]}
    cases = {"rules": scorer_case(rule_specs(), {}, gs), "rules_per_completion": per_completion_case(rule_specs(), gs),
             "weak20": scorer_case(twenty_specs(), weak, gs), "weighted20": scorer_case(twenty_specs(), {}, gs)}
    for k, fn in cases.items():
        res[k], res[f"{k}_wall"] = rate(fn, n, args.repeat)
    votes = (np.random.default_rng(0).random((4096, 20)) < 0.4).astype(float)
    c0 = time.process_time()
    for _ in range(5):
        LabelModel().fit(votes)
    res["label_model_fit_ms"] = (time.process_time() - c0) / 5 * 1000
    print(f"{'case':<24}{'completions/CPU-s (1 core)':>28}{'completions/s (wall)':>22}")
    for k in cases:
        print(f"{k:<24}{res[k]:>28,.0f}{res[k + '_wall']:>22,.0f}")
    res["rules_vs_per_completion"] = res["rules"] / res["rules_per_completion"]
    res["weak20_vs_weighted20"] = res["weak20"] / res["weighted20"]
    print(f"rules / per-completion baseline: {res['rules_vs_per_completion']:.2f}x; "
          f"weak20 / weighted20: {res['weak20_vs_weighted20']:.2f}x; "
          f"LabelModel.fit 4096x20: {res['label_model_fit_ms']:.1f} ms; load average {res['loadavg_1m']:.1f}")
    print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in res.items()}))


if __name__ == "__main__":
    main()
