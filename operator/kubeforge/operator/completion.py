"""Completion policy: training is over only when trainer rank 0 says ``done``.

StatefulSet pods restart forever, so the trainer must say it finished (``contract.ANNOTATION_PROGRESS``). It says
so after its final checkpoint is complete, never when it merely reports the last step: the step is reported
before the checkpoint is written, and a job marked Succeeded scales its pods to zero (which would kill that write).
"""
from __future__ import annotations

from kubeforge.api import progress, rljob


def done(job: rljob.RLJob, report: progress.ProgressReport | None) -> bool:
    return report is not None and report.done
