"""vLLM generation of the demo's shape with 1 vs N torch threads, each in its own process, one JSON line last.

    .venv/bin/python bench/probes/generate_threads.py [--example examples/arithmetic-smollm2.yaml] [--threads 1 2]
                                                      [--reps 8]

Why: vLLM on CPU serves with one torch thread unless ``OMP_NUM_THREADS`` is set before the engine starts. Under
``spec.schedule.mode: Colocated`` the generator has the cores to itself during its phase, so a wider pool looked
like a free gain; this measures it. Each variant starts the example's engine (``generator.Engine``, the example's
model and dtype) in a fresh process with ``OMP_NUM_THREADS`` set, samples ``promptsPerStep`` prompts x
``groupSize`` completions of ``maxNewTokens`` tokens ``--reps`` times (the task stream's prompts 0, 1, ...) and
reports the median seconds per batch after two warm-up batches; the load average is printed beside them.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]


def child(example: str, reps: int) -> None:
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    import torch
    import yaml

    from kubeforge.api import rljob
    from kubeforge.runtime import models, tasks
    from kubeforge.runtime.generator import engine as engine_mod

    job = rljob.RLJob.model_validate(yaml.safe_load(pathlib.Path(example).read_text()))
    algo, stream = job.spec.algorithm, tasks.stream(job.spec.task)
    eng = engine_mod.Engine(model_dir=models.resolve(job.spec.model), dtype=job.spec.model.dtype,
                            role=job.spec.roles.generator, seed=job.spec.task.seed)
    k, times = algo.prompts_per_step, []
    for rep in range(reps):
        prompts = [stream.prompt_at(rep * k + i) for i in range(k)]
        t = time.perf_counter()
        eng.generate(prompts, n=algo.group_size, max_tokens=algo.max_new_tokens, temperature=algo.temperature,
                     seed=rep)
        times.append(time.perf_counter() - t)
    print(json.dumps({"threads": torch.get_num_threads(), "seconds": [round(x, 3) for x in times],
                      "median_seconds": round(statistics.median(times[2:]), 3)}), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--example", default=str(ROOT / "examples" / "arithmetic-smollm2.yaml"))
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--reps", type=int, default=8)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.example, max(3, args.reps))
        return
    out: dict[str, object] = {"bench": "generate_threads", "load_average": {"start": os.getloadavg()}}
    for n in args.threads:
        proc = subprocess.run([sys.executable, __file__, "--child", "--example", args.example, "--reps",
                               str(args.reps)], env={**os.environ, "OMP_NUM_THREADS": str(n)},
                              capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise SystemExit(f"{n} threads: failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
        out[f"threads_{n}"] = json.loads(proc.stdout.strip().splitlines()[-1])
        out["load_average"][f"after_{n}"] = os.getloadavg()  # type: ignore[index]
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
