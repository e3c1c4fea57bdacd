"""Whether this host's CPU computes a half-precision dtype natively, and the warning when it does not.

Role: the local launcher (before it starts the roles) and the trainer and generator roles (when they compute on the
CPU) call :func:`slow_dtype_warning` with ``spec.model.dtype`` and print what it returns. Neighbours: none (reads
``/proc/cpuinfo`` only; no torch import, so the launcher stays quick to start).

Why: bf16 (and fp16) matmuls are fast on a CPU only with AMX or AVX-512 BF16 (FP16) instructions; without them
torch emulates them. Measured on a 2-core AMD EPYC with AVX2 only (one thread, 512 x 576 x 1536): float32
56.6 GFLOP/s, bfloat16 1.2 GFLOP/s, 47x slower, where an AMX CPU runs bf16 4-5x faster than float32. The dtype is
the user's choice and stays as written; the warning names the field and the value that is fast here.
"""
from __future__ import annotations

import pathlib

CPUINFO = pathlib.Path("/proc/cpuinfo")
NATIVE = {"bfloat16": ("amx_bf16", "avx512_bf16"), "float16": ("amx_fp16", "avx512_fp16")}


def cpu_flags(path: pathlib.Path = CPUINFO) -> frozenset[str] | None:
    """The flags of the first CPU in ``path``; None when they cannot be read (not Linux, not x86)."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return frozenset(value.split())
    return None


def slow_dtype_warning(dtype: str, *, flags: frozenset[str] | None = None) -> str | None:
    """A one-line warning when ``dtype`` (``spec.model.dtype``) has no native support on this CPU; None when it has,
    when the dtype is float32, or when the CPU's flags are unknown (nothing is claimed then)."""
    need = NATIVE.get(dtype)
    if need is None:
        return None
    have = cpu_flags() if flags is None else flags
    if have is None or any(f in have for f in need):
        return None
    return (f"spec.model.dtype is {dtype}, but this CPU has none of {', '.join(need)}: its {dtype} matmuls are "
            f"emulated, typically tens of times slower than float32 here; set spec.model.dtype: float32 to run on "
            f"this CPU (keep {dtype} for GPUs and CPUs with those instructions)")
