"""What the benchmarks share: the repo root, a free local port, the load average, the last JSON line of a child's
output, the memory available, random rollout groups for the trainer benches, and a description of the machine.

The benchmarks import it as ``common`` (``python bench/NAME.py`` puts bench/ first on ``sys.path``). Stdlib only at
import, so the operator bench (which needs no torch) can use it too; ``random_groups`` imports the runtime's types
when it is called.

    python bench/common.py      # this machine, one JSON line: CPU model, cores, vector instructions, memory, GPUs

That line is what the "machine" column of docs/benchmarks.md names.
"""
from __future__ import annotations

import json
import os
import pathlib
import random
import shutil
import socket
import subprocess
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parents[1]

#: the x86 instruction sets the figures depend on most (bf16 is emulated without AVX-512 BF16 or AMX)
VECTOR_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def load_average() -> list[float]:
    """The 1-, 5- and 15-minute load averages, as every bench prints them beside its figures."""
    return [round(x, 2) for x in os.getloadavg()]


def last_json(text: str) -> Any:
    """The last line of a child's stdout, parsed: every bench and the launcher print their result there."""
    return json.loads(text.strip().splitlines()[-1])


def available_gib(missing: float = 0.0) -> float:
    """``MemAvailable`` in GiB; ``missing`` where /proc/meminfo does not say."""
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 2**20
    return missing


def random_groups(*, prompts: int, group_size: int, prompt_len: int, completion_len: int, vocab: int, seed: int,
                  first_index: int = 0) -> list[Any]:
    """``prompts`` rollout groups of random token ids (seeded), rewards 0 or 1 at random: a trainer step's input
    without a generator."""
    from kubeforge.runtime import types

    rng = random.Random(seed)
    out = []
    for k in range(prompts):
        comps = [types.Completion(token_ids=[rng.randrange(1, vocab) for _ in range(completion_len)],
                                  logprobs=[-8.0] * completion_len, text="") for _ in range(group_size)]
        out.append(types.RolloutGroup(prompt=types.Prompt(index=first_index + k, text="", answer=""),
                                      prompt_token_ids=[rng.randrange(1, vocab) for _ in range(prompt_len)],
                                      completions=comps, policy_version=0,
                                      rewards=[float(rng.random() < 0.5) for _ in comps]))
    return out


def machine() -> dict[str, Any]:
    """This machine as docs/benchmarks.md names one: CPU model, the cores this process may use, the vector
    instructions present, total memory, and the GPUs ``nvidia-smi`` lists (none without it)."""
    cpuinfo = pathlib.Path("/proc/cpuinfo").read_text() if pathlib.Path("/proc/cpuinfo").exists() else ""
    model = next((ln.split(":", 1)[1].strip() for ln in cpuinfo.splitlines() if ln.startswith("model name")), "")
    flags = set(next((ln.split(":", 1)[1].split() for ln in cpuinfo.splitlines() if ln.startswith("flags")), []))
    total = next((int(ln.split()[1]) / 2**20 for ln in pathlib.Path("/proc/meminfo").read_text().splitlines()
                  if ln.startswith("MemTotal:")), 0.0)
    gpus: list[str] = []
    if shutil.which("nvidia-smi"):
        proc = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                              text=True, check=False, timeout=30)
        gpus = [ln.strip() for ln in proc.stdout.splitlines() if ln.strip()] if proc.returncode == 0 else []
    return {"cpu_model": model, "cpus": len(os.sched_getaffinity(0)),
            "vector_flags": [f for f in VECTOR_FLAGS if f in flags], "memory_gib": round(total, 1), "gpus": gpus}


if __name__ == "__main__":
    print(json.dumps(machine()))
