"""The learning-rate schedule: a pure function of (spec, step, steps), so resuming needs no scheduler state.

Neighbours: ``step.Trainer.train_step`` sets every AdamW param group's ``lr`` to
``learningRate * factor(...)`` before the optimizer step and reports it in the step's metrics.

Shape (``step`` is the 0-based index of the optimizer step about to run, ``steps`` the job's total):
- warm-up: ``(step + 1) / warmupSteps`` while ``step < warmupSteps`` (the last warm-up step runs at full rate);
- Constant: 1 afterwards;
- Cosine: from 1 right after the warm-up down to ``minRatio`` at the last step,
  ``minRatio + (1 - minRatio) * (1 + cos(pi * t)) / 2`` with ``t`` going 0 -> 1 over the remaining steps.
"""
from __future__ import annotations

import math

from kubeforge.api import rljob


def factor(spec: rljob.LRScheduleSpec, *, step: int, steps: int) -> float:
    """Multiplier of ``learningRate`` for optimizer step ``step`` (0-based) of ``steps``."""
    warm = spec.warmup_steps
    if step < warm:
        return (step + 1) / warm
    if spec.type == rljob.LRScheduleType.CONSTANT.value:
        return 1.0
    span = steps - warm - 1
    t = min(1.0, (step - warm) / span) if span > 0 else 1.0
    return spec.min_ratio + (1.0 - spec.min_ratio) * 0.5 * (1.0 + math.cos(math.pi * t))
