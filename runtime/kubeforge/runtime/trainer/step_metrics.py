"""``StepMetrics``: what one optimizer step reports (global over all trainer ranks).

Neighbours: ``step.Trainer.train_step`` fills it; the trainer role loop writes ``as_dict()`` to the metrics JSONL
and Prometheus gauges. Token definition: ``tokens`` counts completion tokens trained on (prompt tokens excluded).
"""
from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True, kw_only=True)
class StepMetrics:
    step: int                       # optimizer steps done after this one (1 after the first)
    policy_version: int             # version of the weights after this step
    loss: float
    kl: float                       # mean k3 KL per token (0 without a reference model)
    clip_fraction: float
    ratio_mean: float
    entropy: float                  # mean next-token entropy (nats) over completion tokens
    grad_norm: float                # before clipping
    mean_reward: float
    groups: int
    completions: int
    tokens: int                     # completion tokens, all ranks
    zero_signal_groups: int         # groups whose rewards were all equal (no gradient from them)
    seconds: dict[str, float]       # per phase: collate, forward, backward, allreduce, optimizer, total
    learning_rate: float = 0.0      # the rate this step used (spec.algorithm.learningRateSchedule)
    resampled_groups: int = 0       # dynamic sampling: zero-signal groups dropped and replaced, all ranks
    unfilled_groups: int = 0        # dynamic sampling: slots still without signal after maxRounds, all ranks
    resample_rounds: int = 0        # dynamic sampling: the most refills a slot of the step needed
    # trainer–sampler mismatch before the update (grpo/mismatch.py): k3 KL(behaviour || trainer) per token, the
    # largest token ratio trainer / behaviour, completions masked (mismatchMask), sampled tokens outside the
    # trainer's own top-k/top-p set (trainer/truncation.py)
    logprob_mismatch_kl: float = 0.0
    logprob_mismatch_max_ratio: float = 0.0
    mismatch_masked_fraction: float = 0.0
    truncation_outside_tokens: int = 0

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
