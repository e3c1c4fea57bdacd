"""Completion policy: training is over when trainer rank 0 says ``done`` or reports the last step.

StatefulSet pods restart forever, so the trainer must say it finished (``contract.ANNOTATION_PROGRESS``).
"""
from __future__ import annotations

from kubeforge.api import rljob
from kubeforge.operator import observed


def done(job: rljob.RLJob, report: observed.ProgressReport | None) -> bool:
    return report is not None and (report.done or report.step >= job.spec.algorithm.steps)
