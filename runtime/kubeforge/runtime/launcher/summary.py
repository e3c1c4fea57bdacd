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
- ``weight_sync_seconds``: mean wall time of one trainer → generators weight push (send, load, ack);
  ``weight_sync_gb_per_second``: total bytes pushed / total push time (GB = 1e9 bytes).
"""
from __future__ import annotations

import json
import pathlib
from collections.abc import Iterable, Mapping
from typing import Any

WINDOW = 10


def read_records(path: pathlib.Path) -> list[dict[str, Any]]:
    """Parse a metrics JSONL file; unreadable lines (a torn last line after kill -9) are skipped."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict) and isinstance(rec.get("step"), int):
            out.append(rec)
    return out


def by_step(records: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """One record per step, ordered by step; the last record of a step wins."""
    last: dict[int, Mapping[str, Any]] = {}
    for rec in records:
        last[int(rec["step"])] = rec
    return [last[s] for s in sorted(last)]


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def _throughput(recs: list[Mapping[str, Any]]) -> float | None:
    if not recs:
        return None
    if len(recs) == 1:
        dt = float(recs[0].get("step_seconds") or 0.0)
        return float(recs[0].get("completions", 0)) / dt if dt > 0 else None
    dt = float(recs[-1]["time"]) - float(recs[0]["time"])
    done = sum(float(r.get("completions", 0)) for r in recs[1:])
    return done / dt if dt > 0 else None


def summarize(records: Iterable[Mapping[str, Any]], *, wall_seconds: float, metrics_path: str,
              extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The summary dict printed as JSON on the last line of ``kubeforge run``."""
    recs = by_step(records)
    rewards = [float(r["mean_reward"]) for r in recs if r.get("mean_reward") is not None]
    syncs = [r for r in recs if r.get("weight_sync_seconds") is not None]
    sync_s = [float(r["weight_sync_seconds"]) for r in syncs]
    sync_bytes = sum(float(r.get("weight_sync_bytes") or 0) for r in syncs)
    out: dict[str, Any] = {
        "steps": len(recs),
        "last_step": int(recs[-1]["step"]) if recs else 0,
        "wall_seconds": round(wall_seconds, 3),
        "completions": int(sum(float(r.get("completions", 0)) for r in recs)),
        "completions_per_second": _round(_throughput(recs)),
        "reward_first": _round(_mean(rewards[:WINDOW])),
        "reward_last": _round(_mean(rewards[-WINDOW:])),
        "weight_sync_seconds": _round(_mean(sync_s), 4),
        "weight_sync_gb_per_second": _round(sync_bytes / 1e9 / sum(sync_s) if sum(sync_s) > 0 else None, 4),
        "weight_syncs": len(syncs),
        "dropped_stale": int(sum(float(r.get("dropped_stale", 0)) for r in recs)),
        "eval_accuracy_before": next((r["eval_accuracy_base"] for r in recs if r.get("eval_accuracy_base")
                                      is not None), None),
        "eval_accuracy_after": next((r["eval_accuracy"] for r in reversed(recs) if r.get("eval_accuracy")
                                     is not None), None),
        "metrics_path": metrics_path,
    }
    out.update(extra or {})
    return out


def _round(x: float | None, nd: int = 4) -> float | None:
    return None if x is None else round(x, nd)
