"""The machine's GEMM peak, measured in this process: the denominator of the trainer's ``mfu``.

Role: ``step.Trainer`` asks :func:`gemm_flops_per_second` once at construction, on its device and in its compute
dtype, so the step's achieved FLOP/s (``flops``) and the peak come from the same cores, threads and dtype, under the
same load. Measured, not looked up: a CPU's peak depends on its vector units, the threads torch uses and what else
runs beside it; a figure from a datasheet would hide all three.

How: square ``n x n`` matmuls (``n = SIZE``: large enough to leave the per-call overhead well below 1 % on a CPU,
small enough to keep the probe short), ``WARMUP`` unmeasured, then ``TRIALS`` trials of ``REPEAT`` matmuls each;
the best trial's rate is the peak (the least disturbed one: other processes only ever slow a trial down). Cached per
(device, dtype, torch threads) for the life of the process. About 1 s on 2 CPU cores in float32 (less in bf16 with
AMX). :func:`remeasure` probes again and keeps the best of every probe: a step that ran faster than the peak shows
that the peak was probed while something else held the cores (``utilisation.Meter.settle``). Invariant: the rate is
``2 n^3`` FLOPs per matmul, the count ``flops`` uses.
"""
from __future__ import annotations

import time

import torch

SIZE = 1024
WARMUP = 2
TRIALS = 5
REPEAT = 3

_CACHE: dict[tuple[str, torch.dtype, int], float] = {}


def gemm_flops_per_second(*, device: torch.device, dtype: torch.dtype, size: int = SIZE) -> float:
    """Best measured FLOP/s of an ``size``-square matmul on ``device`` in ``dtype`` (cached; module docstring)."""
    key = (str(device), dtype, torch.get_num_threads())
    if key not in _CACHE:
        _CACHE[key] = _measure(device=device, dtype=dtype, size=size)
    return _CACHE[key]


def remeasure(*, device: torch.device, dtype: torch.dtype, size: int = SIZE) -> float:
    """Probe again; the cached peak becomes the best of this probe and every earlier one, and is returned."""
    key = (str(device), dtype, torch.get_num_threads())
    _CACHE[key] = max(_CACHE.get(key, 0.0), _measure(device=device, dtype=dtype, size=size))
    return _CACHE[key]


def _measure(*, device: torch.device, dtype: torch.dtype, size: int) -> float:
    gen = torch.Generator(device="cpu").manual_seed(0)
    a = torch.randn(size, size, generator=gen).to(device=device, dtype=dtype)
    b = torch.randn(size, size, generator=gen).to(device=device, dtype=dtype)
    out = torch.empty(size, size, device=device, dtype=dtype)
    with torch.no_grad():
        for _ in range(WARMUP):
            torch.mm(a, b, out=out)
        _sync(device)
        best = float("inf")
        for _ in range(TRIALS):
            t0 = time.perf_counter()
            for _ in range(REPEAT):
                torch.mm(a, b, out=out)
            _sync(device)
            best = min(best, time.perf_counter() - t0)
    return 2.0 * size ** 3 * REPEAT / best


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
