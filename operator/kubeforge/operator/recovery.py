"""The last recovery in parts (``status.recoveryBreakdown``; docs/recovery.md): pure, from timestamps.

```
 fault ─detect─▶ detected ─reschedule─▶ scheduled ─podStart─▶ running ─engineStart─▶ ready
       ─weights─▶ the generators hold the current policy ─firstStep─▶ the next trained step
```

Where each mark comes from: the fault and its detection from the failure this pass acted on (a lost node's last
heartbeat, else the failure's own time; the pass's clock); scheduled, running and ready from the replacement pod
that was ready last (the API server's times); the current policy held and the next step from trainer 0's progress
report (its ``weightsAt``, and the ``time`` of the first step record made after the detection).

Neighbours: ``status.compute`` calls :func:`track` every pass with the failure ``lifecycle.decide`` acted on (if
any), the pods (``observed``) and trainer 0's report; :func:`breakdown` is the arithmetic alone.

Invariants: a new failure starts a new breakdown; one whose ``seconds`` is set never changes again (a replayed pass
recomputes the same value from the same status). A mark earlier than the one before it (clocks that disagree, a
pod restarted in place keeps its old scheduling) counts from the one before, so every part is >= 0 and the known
parts add up to ``seconds``. An unknown mark leaves its part null and the next part counts from the mark before.
"""
from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Iterable, Sequence

from kubeforge.api import progress, rljob
from kubeforge.operator import observed, timefmt

ORDER = ("detected", "scheduled", "running", "ready", "weights", "first_step")
PART_OF = {"detected": "detect", "scheduled": "reschedule", "running": "pod_start", "ready": "engine_start",
           "weights": "weights", "first_step": "first_step"}
# a replacement is a pod created, or (restarted in place) running again, at most this long before the detection:
# the API server's times have whole seconds
SLACK = dt.timedelta(seconds=1)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Marks:
    """When each stage was reached (None: not known, or not yet)."""

    fault: dt.datetime
    detected: dt.datetime | None = None
    scheduled: dt.datetime | None = None
    running: dt.datetime | None = None
    ready: dt.datetime | None = None
    weights: dt.datetime | None = None
    first_step: dt.datetime | None = None


def breakdown(marks: Marks) -> dict[str, float | None]:
    """Seconds of each part, and ``seconds`` (fault -> first step) once the first step is known."""
    parts: dict[str, float | None] = {}
    before = marks.fault
    for name in ORDER:
        mark: dt.datetime | None = getattr(marks, name)
        if mark is None:
            parts[PART_OF[name]] = None
            continue
        mark = max(mark, before)
        parts[PART_OF[name]] = round((mark - before).total_seconds(), 3)
        before = mark
    parts["seconds"] = (round((before - marks.fault).total_seconds(), 3)
                        if marks.first_step is not None else None)
    return parts


def _next_step(report: progress.ProgressReport | None, *, prev: rljob.RecoveryBreakdown, detected: dt.datetime,
               now: dt.datetime) -> dt.datetime | None:
    """When the first step after the detection was trained: a report whose step record was made after it (a
    resumed trainer retrains the steps since its checkpoint: the first of them counts); without a record time (an
    older trainer), a step beyond the one at the detection, seen now."""
    if report is None:
        return None
    made = _epoch(report.time)
    if made is not None:
        return made if made > detected else None
    return now if report.step > prev.step else None


def _epoch(seconds: float | None) -> dt.datetime | None:
    return dt.datetime.fromtimestamp(seconds, dt.timezone.utc) if seconds else None


def critical(pods: Iterable[observed.PodFacts], *, attempt: int, detected: dt.datetime) -> observed.PodFacts | None:
    """The replacement that decides the recovery: a pod of ``attempt`` created (or running again) since the
    detection; one not ready yet over any ready one, else the one ready last."""
    def since(p: observed.PodFacts) -> bool:
        m = p.marks
        return m is not None and any(t is not None and t >= detected - SLACK
                                     for t in (timefmt.parse(m.created), timefmt.parse(m.running)))

    found = [p for p in pods if p.attempt == attempt and not p.terminating and since(p)]
    if not found:
        return None
    waiting = [p for p in found if p.marks is not None and p.marks.ready is None]
    if waiting:
        return sorted(waiting, key=lambda p: p.name)[0]
    return max(found, key=lambda p: (timefmt.parse(p.marks.ready if p.marks else None) or detected, p.name))


def track(prev: rljob.RecoveryBreakdown | None, *, failure: observed.Failure | None,
          pods: Sequence[observed.PodFacts], attempt: int, report: progress.ProgressReport | None, step: int,
          now: dt.datetime) -> rljob.RecoveryBreakdown | None:
    """This pass's ``status.recoveryBreakdown``: a new one when ``failure`` was acted on now, the previous one
    with what is known by now while it is open, unchanged once closed. ``step`` is the status's progress step."""
    if failure is not None:
        began = timefmt.parse(failure.since) or timefmt.parse(failure.time) or now
        prev = rljob.RecoveryBreakdown(fault_time=timefmt.fmt(min(began, now)), detected_time=timefmt.fmt(now),
                                       step=step)
    if prev is None or prev.seconds is not None:
        return prev
    fault, detected = timefmt.parse(prev.fault_time), timefmt.parse(prev.detected_time)
    if fault is None or detected is None:
        return prev
    pod = critical(pods, attempt=attempt, detected=detected)
    m = pod.marks if pod is not None and pod.marks is not None else observed.PodMarks()
    weights = _epoch(report.weights_at) if report is not None else None
    weights = weights if weights is not None and weights >= detected - SLACK else None
    first = _next_step(report, prev=prev, detected=detected, now=now)
    if first is not None and report is not None and report.weights_at is not None and (
            weights is None or first < weights):
        # a trainer that kept running (RestartRole) trains what was sampled before the fault, and its pushes to a
        # lost generator fail: the recovery's step is one trained after a whole push made since the detection (a
        # resumed trainer's, or the one to a replacement generator at its READY; an older trainer reports none)
        first = None
    marks = Marks(fault=fault, detected=detected, scheduled=timefmt.parse(m.scheduled),
                  running=timefmt.parse(m.running), ready=timefmt.parse(m.ready), weights=weights, first_step=first)
    return prev.model_copy(update={**breakdown(marks), "pod": pod.name if pod is not None else prev.pod})
