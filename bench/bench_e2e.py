"""End-to-end benchmark of ``kubeforge run``: the pipelined runtime vs its own synchronous baseline, same machine, now.

    .venv/bin/python bench/bench_e2e.py [--example examples/tiny.yaml] [--steps 20]

Runs the example twice with ``kubeforge run`` (real processes, real vLLM, real ZeroMQ and gloo):
- baseline: ``maxPolicyLag: 0`` — strictly on-policy, generation and training alternate (no overlap);
- pipelined: the example's own ``maxPolicyLag`` (>= 1) — work for the next step is sampled while the trainer trains.
Prints one JSON line per run (the launcher's summary) and a last line with the ratios
(``completions_per_second`` pipelined / baseline, and the weight-sync figures of each). Nothing is asserted and
nothing is hard-coded: the figures are whatever this machine does now. The vLLM start-up is excluded from
``completions_per_second`` by the launcher's definition (steps 2..N), not from ``wall_seconds``.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import subprocess
import sys
import tempfile

import yaml

import common

ROOT = common.ROOT


def run(example: pathlib.Path, *, steps: int, lag: int | None, tmp: pathlib.Path, label: str) -> dict[str, object]:
    doc = yaml.safe_load(example.read_text())
    doc["spec"]["algorithm"]["steps"] = steps
    if lag is not None:
        doc["spec"]["algorithm"]["maxPolicyLag"] = lag
    path = tmp / f"{label}.yaml"
    path.write_text(yaml.safe_dump(doc))
    proc = subprocess.run([sys.executable, "-m", "kubeforge.cli", "run", str(path), "--run-dir", str(tmp / label)],
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"{label} run failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    result: dict[str, object] = common.last_json(proc.stdout)
    result["label"] = label
    result["max_policy_lag"] = doc["spec"]["algorithm"]["maxPolicyLag"]
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--example", default=str(ROOT / "examples" / "tiny.yaml"))
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args()
    example = pathlib.Path(args.example)
    with tempfile.TemporaryDirectory(prefix="kf-bench-") as d:
        tmp = pathlib.Path(d)
        base = run(example, steps=args.steps, lag=0, tmp=tmp, label="baseline-lag0")
        print(json.dumps(base), flush=True)
        piped = run(example, steps=args.steps, lag=None, tmp=tmp, label="pipelined")
        print(json.dumps(piped), flush=True)
    b, p = base["completions_per_second"], piped["completions_per_second"]
    print(json.dumps({
        "bench": "e2e", "example": str(example), "steps": args.steps,
        "completions_per_second": {"baseline": b, "pipelined": p},
        "ratio_pipelined_over_baseline": round(float(p) / float(b), 3) if b and p else None,  # type: ignore[arg-type]
        "weight_sync_seconds": {"baseline": base["weight_sync_seconds"], "pipelined": piped["weight_sync_seconds"]},
        "weight_sync_gb_per_second": {"baseline": base["weight_sync_gb_per_second"],
                                      "pipelined": piped["weight_sync_gb_per_second"]},
    }))


if __name__ == "__main__":
    main()
