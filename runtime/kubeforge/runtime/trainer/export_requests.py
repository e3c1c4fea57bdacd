"""Export on request: a user asks a running job for its current policy as an HF folder; trainer rank 0 sees it.

Role: after every step ``trainer.loop.Loop`` hands rank 0's :class:`Requests` to :meth:`OnRequest.after_step`: a
pending request is agreed by every rank (one broadcast: under FSDP every rank gathers), every rank calls
``Trainer.export`` (rank 0 writes
``<checkpoint dir>/export-step-N``, atomically; an existing one is kept), and the step's record carries
``export`` (the folder) and ``export_request`` (the id served): ``metrics.jsonl`` locally, the progress annotation
(``lastExport``) on a cluster.

Where requests come from (one small interface, two real sources, a list for unit tests):
- locally: ``kubeforge export RUN_DIR`` writes a fresh id into ``RUN_DIR/export-request`` (:class:`FileRequests`);
- in a cluster: the annotation ``contract.ANNOTATION_EXPORT_REQUEST`` on trainer 0's pod (its value is the id; a
  new value is a new request), read with the pod's own service account (:class:`PodAnnotationRequests`). Users
  annotate the RLJob; the operator copies a request not served yet onto trainer 0's pod (operator ``exports``).

Invariants: a request is served once (its id is remembered: in ``export-request.served`` locally, so a restarted
job does not serve it again; on a cluster in memory and in the pod's progress annotation, so a restarted container
does not serve it again, and the operator relays to a new attempt's pod only what status shows unserved);
reading a request never raises (a failed read is "none").
"""
from __future__ import annotations

import json
import pathlib
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any, Protocol

from kubeforge.api import contract, progress
from kubeforge.runtime import podapi

REQUEST_FILE = "export-request"


class Requests(Protocol):
    def pending(self) -> str | None:
        """The id of a request not served yet, or None."""

    def served(self, request: str) -> None:
        """Mark ``request`` served (after its export was written)."""


class Exporter(Protocol):
    def export(self, *, directory: str) -> Any:
        """Write the policy as an HF folder under ``directory`` (every rank calls it; rank 0 writes)."""


class OnRequest:
    """Serving export requests after a step, on every rank (``learner`` is ``step.Trainer``)."""

    def __init__(self, *, learner: Exporter, beat: Callable[[str], None] = lambda activity: None) -> None:
        self.learner = learner
        self.beat = beat

    def after_step(self, record: progress.StepRecord, *, requests: Requests | None, directory: str) -> None:
        """Rank 0's pending export request (if any; ``requests`` is None on the other ranks), agreed by every rank
        (one broadcast), served by all into ``directory``; rank 0's ``record`` names the folder and the request."""
        request = requests.pending() if requests is not None else None
        agree = getattr(self.learner, "agree", None)
        if agree is not None:
            request = agree(request)
        if request is None:
            return
        self.beat("export")
        path = self.learner.export(directory=directory)
        if requests is not None:
            requests.served(str(request))
            record.export = str(path) if path else None
            record.export_request = str(request)
            print(f"trainer-0: export request {request}: {path}", flush=True)


class ListRequests:
    """In-process: requests queued by a test."""

    def __init__(self) -> None:
        self.queue: list[str] = []
        self.done: list[str] = []

    def pending(self) -> str | None:
        return self.queue[0] if self.queue else None

    def served(self, request: str) -> None:
        self.queue.remove(request)
        self.done.append(request)


class FileRequests:
    """``RUN_DIR/export-request`` holds the newest request id; ``export-request.served`` the last one served."""

    def __init__(self, run_dir: pathlib.Path) -> None:
        self.path = run_dir / REQUEST_FILE
        self.done = run_dir / f"{REQUEST_FILE}.served"

    def pending(self) -> str | None:
        try:
            want = self.path.read_text().strip()
        except OSError:
            return None
        try:
            have = self.done.read_text().strip()
        except OSError:
            have = ""
        return want if want and want != have else None

    def served(self, request: str) -> None:
        tmp = self.done.with_suffix(".tmp")
        tmp.write_text(request + "\n")
        tmp.replace(self.done)


def request(run_dir: pathlib.Path) -> str:
    """Ask the job running in ``run_dir`` for an export (what ``kubeforge export`` does); the request's id."""
    rid = uuid.uuid4().hex[:12]
    tmp = run_dir / f"{REQUEST_FILE}.tmp"
    tmp.write_text(rid + "\n")
    tmp.replace(run_dir / REQUEST_FILE)
    return rid


class PodAnnotationRequests:
    """``contract.ANNOTATION_EXPORT_REQUEST`` on this pod (a GET with the pod's service account per step)."""

    def __init__(self, *, pod: str, namespace: str, api: podapi.Pod | None = None) -> None:
        self.pod, self.namespace, self._api = pod, namespace, api
        self.last: str | None = None

    def _client(self) -> podapi.Pod:
        if self._api is None:
            self._api = podapi.InClusterPod(pod=self.pod, namespace=self.namespace)
        return self._api

    def pending(self) -> str | None:
        try:
            annotations = self._client().annotations()
            value = annotations.get(contract.ANNOTATION_EXPORT_REQUEST)
        except Exception as exc:  # advisory: the next step asks again
            print(f"export request read failed: {exc}", file=sys.stderr, flush=True)
            return None
        if value and self.last is None:   # a restarted container: what this pod already served is in its progress
            self.last = _served_on_pod(annotations.get(contract.ANNOTATION_PROGRESS))
        return str(value) if value and value != self.last else None

    def served(self, request: str) -> None:
        self.last = request


def _served_on_pod(text: str | None) -> str | None:
    """``lastExport.request`` of a progress annotation (what an earlier process in this pod served), else None."""
    report = progress.ProgressReport.decode(text)
    return report.last_export.request if report is not None and report.last_export is not None else None


def served_record(run_dir: pathlib.Path, request_id: str) -> progress.StepRecord | None:
    """The step record of ``run_dir/metrics.jsonl`` that served ``request_id``, if any."""
    try:
        lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        rec = progress.StepRecord.decode(line)
        if rec is not None and rec.export_request == request_id:
            return rec
    return None


def cli(*, run_dir: str, wait_s: float, poll_s: float = 1.0) -> int:
    """``kubeforge export RUN_DIR``: request, then wait (bounded) for the folder; prints a JSON line last."""
    root = pathlib.Path(run_dir)
    if not (root / "metrics.jsonl").exists() and not (root / "rljob.yaml").exists():
        print(f"kubeforge export: {run_dir}: not a run directory of `kubeforge run`", file=sys.stderr)
        return 2
    rid = request(root)
    deadline = time.monotonic() + wait_s
    while True:
        rec = served_record(root, rid)
        if rec is not None:
            print(json.dumps({"request": rid, "export": rec.export, "step": rec.step}), flush=True)
            return 0
        if time.monotonic() >= deadline:
            print(json.dumps({"request": rid, "export": None, "pending": True}), flush=True)
            return 1 if wait_s > 0 else 0
        time.sleep(poll_s)
