"""Export on request in a cluster: the RLJob's ``kubeforge.dev/export-request`` reaches trainer rank 0's pod.

Role: a pure decision (:func:`relay`) the reconcile pass applies with one merge patch of a pod's annotations.
The user asks on the object they own (``kubectl annotate rljob NAME kubeforge.dev/export-request=<id>
--overwrite``); the trainer reads the request on its own pod (``runtime/trainer/export_requests.py``), serves it
after its next step, and reports ``lastExport`` in its progress annotation, which ``lifecycle`` copies into
``status.progress.lastExport``.

Invariants:
- A request is relayed while it is not served: ``status.progress.lastExport.request`` differs from it. So a new
  attempt's trainer 0 gets a request its predecessor did not serve, and never one that was served.
- Only trainer 0 of the current attempt, running and not terminating, is patched, and only when its annotation
  differs (a pass that finds it in place does nothing).
"""
from __future__ import annotations

import dataclasses

from kubeforge.api import contract, rljob
from kubeforge.operator import names, observed


@dataclasses.dataclass(frozen=True, kw_only=True)
class Relay:
    """Set ``contract.ANNOTATION_EXPORT_REQUEST`` = ``request`` on ``pod``."""

    pod: str
    request: str

    def patch(self) -> dict[str, object]:
        """The merge patch of the pod."""
        return {"metadata": {"annotations": {contract.ANNOTATION_EXPORT_REQUEST: self.request}}}


def requested(annotations: dict[str, str] | None) -> str | None:
    """The export request on the RLJob (its annotation's value, stripped), or None."""
    value = (annotations or {}).get(contract.ANNOTATION_EXPORT_REQUEST, "").strip()
    return value or None


def relay(job: rljob.RLJob, obs: observed.Observed, *, attempt: int, served: rljob.ExportInfo | None,
          annotations: dict[str, str] | None) -> Relay | None:
    """The patch that hands the RLJob's pending export request to trainer 0 of ``attempt``, or None."""
    want = requested(annotations)
    if want is None or (served is not None and served.request == want):
        return None
    rank0 = names.pod(job.metadata.name, "trainer", 0)
    for p in obs.of_attempt(attempt):
        if p.name == rank0 and not p.terminating and p.phase == "Running":
            return None if p.export_request == want else Relay(pod=rank0, request=want)
    return None
