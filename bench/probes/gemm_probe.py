"""How fast this CPU multiplies float32 matrices of the train step's shapes: torch.mm alone, 1 and N threads.

    .venv/bin/python bench/probes/gemm_probe.py [--threads 1 2] [--reps 30]

Why: ``bench/profile_train_step.py`` reports the step's achieved GFLOP/s and the share of ``aten::mm`` in it; this
gives the ceiling to read them against (what torch's BLAS reaches on the same shapes with nothing else in the step).
Shapes: the demo's packed step (SmolLM2-135M, ~600 tokens x hidden 576 x MLP 1536, both orientations of the MLP
projections, an attention projection, a weight gradient) and one large square product. One JSON line: GFLOP/s per
shape and thread count, the load average beside them.
"""
from __future__ import annotations

import argparse
import json
import os
import time

import torch

SHAPES = ((600, 576, 1536), (600, 1536, 576), (600, 576, 576), (1536, 600, 576), (2048, 2048, 2048))


def gflops(m: int, k: int, n: int, *, reps: int) -> float:
    a, b = torch.randn(m, k), torch.randn(k, n)
    for _ in range(3):
        torch.mm(a, b)
    t = time.perf_counter()
    for _ in range(reps):
        torch.mm(a, b)
    return 2 * m * k * n * reps / (time.perf_counter() - t) / 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, len(os.sched_getaffinity(0))])
    ap.add_argument("--reps", type=int, default=30)
    args = ap.parse_args()
    mkl = bool(torch.backends.mkl.is_available())  # type: ignore[no-untyped-call]
    out: dict[str, object] = {"bench": "gemm_probe", "mkl": mkl,
                              "load_average_start": [round(x, 2) for x in os.getloadavg()]}
    for threads in dict.fromkeys(args.threads):
        torch.set_num_threads(threads)
        out[f"gflop_per_s_threads_{threads}"] = {f"{m}x{k}x{n}": round(gflops(m, k, n, reps=args.reps), 1)
                                                 for m, k, n in SHAPES}
    out["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
