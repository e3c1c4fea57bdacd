"""The operator's part of fencing (docs/fencing.md): the trainer epoch it hands out and the progress reports of
stale trainers it ignores and counts. Pure: facts in, values out.

Role: ``lifecycle.decide`` asks :func:`epoch` for ``status.trainerEpoch`` and :func:`screen` whether trainer 0's
report may be read; :func:`counted` gives ``status.fencedWrites``. Neighbours: ``render/statefulset.py`` puts the
epoch on the trainer pod template's label (``contract.LABEL_TRAINER_EPOCH``), which the trainer reads as its env;
``reconcile`` force-deletes a lost trainer pod only once the StatefulSet controller has seen that template
(:func:`template_observed`).

Invariants:
- The epoch only grows, and grows in the pass that starts a new attempt or acts on a ``NodeLost`` failure (the
  only way a pod is replaced without the kubelet's word that its containers stopped). It is recomputed from the
  previous status, so a replayed pass gives the same value.
- A report is stale when its epoch is below its pod's label: the stale trainer patched its pod by name, and the
  name now belongs to its replacement. A stale report never moves progress and never completes the job.
- Each distinct stale report is counted once (``lastReport``); the store's and the generators' counts are taken
  from the current trainer's report and never go down.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kubeforge.api import contract, progress, rljob
from kubeforge.operator import observed

FIRST = 1


def epoch(previous: int, *, new_attempt: bool, fresh: Sequence[observed.Failure]) -> int:
    """``status.trainerEpoch`` after this pass (``previous``: the last status's; 0 before any)."""
    lost = any(f.reason == rljob.FailureReason.NODE_LOST.value for f in fresh)
    return max(previous, FIRST) + (1 if (new_attempt or lost) and previous >= FIRST else 0)


def ident(report: progress.ProgressReport) -> str:
    """A stale report's identity: its epoch, step and whether it says done."""
    return f"epoch {report.trainer_epoch} step {report.step}{' done' if report.done else ''}"


def screen(pod: observed.PodFacts) -> tuple[progress.ProgressReport | None, str | None]:
    """Trainer 0's report on ``pod`` if it may be read, else (None, its identity) when a stale epoch wrote it. A pod
    without the label (made before fencing) has every report read."""
    report = pod.progress
    if report is None or pod.trainer_epoch is None or report.trainer_epoch >= pod.trainer_epoch:
        return report, None
    return None, ident(report)


def counted(previous: rljob.FencedWrites, *, report: progress.ProgressReport | None,
            stale: str | None) -> rljob.FencedWrites:
    """``status.fencedWrites`` after this pass: ``report`` read from the current trainer (or None), ``stale`` the
    identity of a stale report seen (or None)."""
    new_stale = stale is not None and stale != previous.last_report
    return rljob.FencedWrites(
        checkpoints=max(previous.checkpoints, report.fenced_checkpoints if report is not None else 0),
        pushes=max(previous.pushes, report.fenced_pushes if report is not None else 0),
        reports=previous.reports + (1 if new_stale else 0),
        last_report=stale if new_stale else previous.last_report)


def gained(before: rljob.FencedWrites | None, after: rljob.FencedWrites) -> dict[str, int]:
    """What each kind gained from ``before`` to ``after`` (the operator's counter series grows by it)."""
    was = before or rljob.FencedWrites()
    out = {"checkpoint": after.checkpoints - was.checkpoints, "push": after.pushes - was.pushes,
           "report": after.reports - was.reports}
    return {k: v for k, v in out.items() if v > 0}


def generation_observed(statefulset: dict[str, Any] | None) -> bool:
    """The StatefulSet controller has seen the StatefulSet's latest spec (a pod it creates now comes from the
    latest template); with no StatefulSet nothing can re-create the pod."""
    if statefulset is None:
        return True
    md, st = statefulset.get("metadata") or {}, statefulset.get("status") or {}
    return int(st.get("observedGeneration") or 0) >= int(md.get("generation") or 0) > 0


def template_observed(statefulset: dict[str, Any] | None, *, trainer_epoch: int) -> bool:
    """The StatefulSet controller has seen the trainer template labelled ``trainer_epoch`` (so a pod it creates
    now carries it); with no StatefulSet nothing can re-create the pod, so there is nothing to wait for."""
    if statefulset is None:
        return True
    labels = (((statefulset.get("spec") or {}).get("template") or {}).get("metadata") or {}).get("labels") or {}
    return labels.get(contract.LABEL_TRAINER_EPOCH) == str(trainer_epoch) and generation_observed(statefulset)
