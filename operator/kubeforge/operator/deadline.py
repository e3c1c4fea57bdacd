"""Deadline policy: ``activeDeadlineSeconds`` counts from ``status.startTime`` (reset on resume, as for a Job)."""
from __future__ import annotations

import datetime as dt

from kubeforge.api import rljob
from kubeforge.operator import timefmt


def remaining(job: rljob.RLJob, start_time: str | None, now: dt.datetime) -> float | None:
    """Seconds left before the deadline (<= 0: exceeded), or None without a deadline or a start."""
    start = timefmt.parse(start_time)
    if job.spec.active_deadline_seconds is None or start is None:
        return None
    return job.spec.active_deadline_seconds - (now - start).total_seconds()
