"""TTL policy: a finished job is deleted ``ttlSecondsAfterFinished`` after its completion time."""
from __future__ import annotations

import datetime as dt

from kubeforge.api import rljob
from kubeforge.operator import timefmt


def remaining(job: rljob.RLJob, completion_time: str | None, now: dt.datetime) -> float | None:
    """Seconds until the job must be deleted (<= 0: now), or None without a TTL or before it finished."""
    done = timefmt.parse(completion_time)
    if job.spec.ttl_seconds_after_finished is None or done is None:
        return None
    return job.spec.ttl_seconds_after_finished - (now - done).total_seconds()
