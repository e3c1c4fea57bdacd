"""A generator's engine start on CPU, in parts: the tiny model's vLLM engine from a fresh interpreter, as a
replacement generator pod starts it (no vLLM cache of its own: ``VLLM_CACHE_ROOT`` an empty folder).

    python bench/generator_start.py [--subprocess-registry] [--enforce-eager]

Prints one JSON line: ``import_torch_s``, ``import_vllm_s``, ``engine_s`` (``Engine(...)``: vLLM's config, the
model registry's inspection, model load, KV cache, warm-up), ``registry_in_process`` (``engine.inspect_in_process``;
``--subprocess-registry`` keeps vLLM's own subprocess, the behaviour before it), ``total_s``, the load average.
The replacement generator of ``make e2e-nodes``' node loss spends most of its start here (docs/recovery.md).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="generator_start", description=__doc__.split("\n")[0])
    p.add_argument("--subprocess-registry", action="store_true", help="keep vLLM's registry subprocess")
    p.add_argument("--enforce-eager", action="store_true", help="the real pods' setting (no torch.compile)")
    args = p.parse_args(argv)
    os.environ["VLLM_CACHE_ROOT"] = tempfile.mkdtemp(prefix="kf-vllm-cache-")   # a new pod's: nothing cached
    t0 = time.perf_counter()
    import torch  # noqa: F401

    t1 = time.perf_counter()
    import vllm  # noqa: F401

    t2 = time.perf_counter()
    from kubeforge.api import rljob
    from kubeforge.runtime import models
    from kubeforge.runtime.generator import engine

    if args.subprocess_registry:
        engine.inspect_in_process = lambda registry: False    # type: ignore[assignment]
    model_dir = models.resolve(rljob.ModelSpec(builtin="tiny"))
    t3 = time.perf_counter()
    eng = engine.Engine(model_dir=model_dir, dtype="float32", seed=0,
                        role=rljob.GeneratorRole(kv_cache_gib=1, enforce_eager=args.enforce_eager))
    t4 = time.perf_counter()
    eng.close()
    load = os.getloadavg()
    print(json.dumps({"import_torch_s": round(t1 - t0, 2), "import_vllm_s": round(t2 - t1, 2),
                      "model_s": round(t3 - t2, 2), "engine_s": round(t4 - t3, 2),
                      "registry_in_process": not args.subprocess_registry, "enforce_eager": args.enforce_eager,
                      "total_s": round(t4 - t0, 2), "load_average": [round(x, 2) for x in load]}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
