"""The run summary: a pure function of the trainer's per-step metrics records and the wall time.

Definitions (what each figure means, so bench/ and tests compare like with like):
- ``steps``: distinct optimizer steps recorded (after a resume the trainer rewrites the file from its checkpoint,
  so each step appears once; if a step still appears twice, the last record wins).
- ``completions_per_second``: completions trained on in steps 2..N divided by the time between the end of step 1
  and the end of step N (step 1 carries engine warm-up and is dropped, as verl/prime-rl do); with one step, over
  that step's own duration.
- ``reward_first`` / ``reward_last``: mean of the per-step mean reward over the first / last 10 steps.
- ``eval_accuracy_before`` / ``eval_accuracy_after``: held-out greedy accuracy (``spec.evaluation``) before the
  first step and at the last evaluation (null without evaluation).
- ``logprob_mismatch_kl``: mean over the run's steps of the per-step trainer–sampler k3 KL per token (before
  each update; ``grpo/mismatch``); ``logprob_mismatch_max_ratio``: the largest token ratio of the run.
- ``episode_turns_mean``: mean over the steps of the per-step mean policy turns per episode (null without
  ``spec.environment``); ``tool_calls_total`` / ``tool_errors_total``: tool calls (and failed ones) of every episode
  trained on; ``env_masked_tokens``: environment tokens kept in context but masked out of the loss;
  ``infra_masked_rollouts``: rollout groups kept out of training because a pod they depended on was lost (an
  episode's environment server: ``env_lost``), summed over the steps' records (trainer rank 0's share).
- ``mfu``: median over the steps of each step's model FLOPs utilisation (its matmul FLOP/s over the GEMM peak
  measured in the trainer's process: ``learner/utilisation``); ``flops_per_second`` and ``peak_flops_per_second``:
  the medians of the two (null when no step reports them).
- ``weight_sync_seconds``: mean wall time of one trainer → generators weight push (send, load, ack);
  ``weight_sync_gb_per_second``: total bytes pushed / total push time (GB = 1e9 bytes).
"""
from __future__ import annotations

import pathlib
import statistics
from collections.abc import Iterable, Mapping
from typing import Any

from kubeforge.api import progress

WINDOW = 10


def read_records(path: pathlib.Path) -> list[progress.StepRecord]:
    """Parse a metrics JSONL file; unreadable lines (a torn last line after kill -9) are skipped."""
    if not path.exists():
        return []
    return [rec for rec in map(progress.StepRecord.decode, path.read_text().splitlines()) if rec is not None]


def by_step(records: Iterable[progress.StepRecord]) -> list[progress.StepRecord]:
    """One record per step, ordered by step; the last record of a step wins."""
    last = {rec.step: rec for rec in records}
    return [last[s] for s in sorted(last)]


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def _throughput(recs: list[progress.StepRecord]) -> float | None:
    if not recs:
        return None
    if len(recs) == 1:
        dt = recs[0].step_seconds or 0.0
        return recs[0].completions / dt if dt > 0 else None
    dt = recs[-1].time - recs[0].time
    done = sum(r.completions for r in recs[1:])
    return done / dt if dt > 0 else None


def summarize(records: Iterable[progress.StepRecord], *, wall_seconds: float, metrics_path: str,
              extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The summary dict printed as JSON on the last line of ``kubeforge run``."""
    recs = by_step(records)
    rewards = [r.mean_reward for r in recs if r.mean_reward is not None]
    mismatch = [r.logprob_mismatch_kl for r in recs if r.logprob_mismatch_kl is not None]
    max_ratios = [r.logprob_mismatch_max_ratio for r in recs if r.logprob_mismatch_max_ratio is not None]
    sync_s = [r.weight_sync_seconds for r in recs if r.weight_sync_seconds is not None]
    sync_bytes = sum(float(r.weight_sync_bytes or 0) for r in recs if r.weight_sync_seconds is not None)
    out: dict[str, Any] = {
        "steps": len(recs),
        "last_step": recs[-1].step if recs else 0,
        "wall_seconds": round(wall_seconds, 3),
        "completions": sum(r.completions for r in recs),
        "completions_per_second": _round(_throughput(recs)),
        "reward_first": _round(_mean(rewards[:WINDOW])),
        "reward_last": _round(_mean(rewards[-WINDOW:])),
        "logprob_mismatch_kl": _round(_mean(mismatch), 8),
        "logprob_mismatch_max_ratio": _round(max(max_ratios) if max_ratios else None, 6),
        "mfu": _round(_median([r.mfu for r in recs if r.mfu is not None])),
        "flops_per_second": _round(_median([r.flops_per_second for r in recs if r.flops_per_second is not None]), 0),
        "peak_flops_per_second": _round(_median([r.peak_flops_per_second for r in recs
                                                 if r.peak_flops_per_second is not None]), 0),
        "weight_sync_seconds": _round(_mean(sync_s), 4),
        "weight_sync_gb_per_second": _round(sync_bytes / 1e9 / sum(sync_s) if sum(sync_s) > 0 else None, 4),
        "weight_syncs": len(sync_s),
        "dropped_stale": sum(r.dropped_stale for r in recs),
        "masked_stale_tokens": sum(r.masked_stale_tokens for r in recs),
        "token_lag_mean": _round(_mean([r.token_lag_mean for r in recs if r.token_lag_mean is not None])),
        "episode_turns_mean": _round(_mean([r.episode_turns_mean for r in recs if r.episode_turns_mean is not None])),
        "tool_calls_total": sum(r.tool_calls for r in recs),
        "tool_errors_total": sum(r.tool_errors for r in recs),
        "env_masked_tokens": sum(r.env_masked_tokens for r in recs),
        "infra_masked_rollouts": sum(r.infra_masked_rollouts for r in recs),
        "eval_accuracy_before": next((r.eval_accuracy_base for r in recs if r.eval_accuracy_base is not None), None),
        "eval_accuracy_after": next((r.eval_accuracy for r in reversed(recs) if r.eval_accuracy is not None), None),
        "metrics_path": metrics_path,
    }
    out.update(extra or {})
    return out


def _round(x: float | None, nd: int = 4) -> float | None:
    return None if x is None else round(x, nd)
