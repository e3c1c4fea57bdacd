"""How trainer rank 0 reports progress: one small :class:`Reporter` interface, two implementations.

- :class:`JsonlReporter` (local runs): appends one JSON record per optimizer step to ``<run dir>/metrics.jsonl``
  (the launcher tails it for the progress bar and summarises it) and echoes a short line on stdout.
- :class:`PodAnnotationReporter` (``KUBEFORGE_REPORT=pod-annotation``): patches its own pod's
  ``contract.ANNOTATION_PROGRESS`` annotation with a :class:`~kubeforge.api.progress.ProgressReport` with the pod's
  service account (``podapi``); the operator turns it into ``status.progress`` and, once ``done``, success.

Invariant: after a resume from step ``s`` the JSONL file is rewritten to hold only records of steps ``<= s``, so
the file has exactly one record per step in order, however many times the trainer was restarted.
"""
from __future__ import annotations

import json
import os
import pathlib
import sys
from collections.abc import Mapping
from typing import Protocol

from kubeforge.api import contract, progress, rljob
from kubeforge.runtime import podapi


class Reporter(Protocol):
    def resumed(self, *, step: int) -> None:
        """The trainer (re)starts after ``step`` completed steps (0 on a fresh start)."""

    def step(self, record: progress.StepRecord) -> None:
        """One optimizer step finished."""

    def done(self, record: progress.StepRecord) -> None:
        """The last step finished; the job has succeeded."""

    def silent(self, generators: Mapping[int, float]) -> None:
        """The generators silent for ``peerSilenceSeconds`` now (index -> wall clock last heard), told whenever the
        set changes (empty: none any more)."""


class NullReporter:
    """Trainer ranks other than 0 report nothing."""

    def resumed(self, *, step: int) -> None:
        pass

    def step(self, record: progress.StepRecord) -> None:
        pass

    def done(self, record: progress.StepRecord) -> None:
        pass

    def silent(self, generators: Mapping[int, float]) -> None:
        pass


class StdoutReporter:
    """One JSON record per step on stdout (a pod's log; ``kubectl logs`` shows progress)."""

    def resumed(self, *, step: int) -> None:
        print(json.dumps({"resumed": step}), flush=True)

    def step(self, record: progress.StepRecord) -> None:
        print(record.encode(), flush=True)

    def done(self, record: progress.StepRecord) -> None:
        print(json.dumps({"done": True, **record.doc(only_set=True)}), flush=True)

    def silent(self, generators: Mapping[int, float]) -> None:
        print(json.dumps({"silent_generators": {str(g): round(t, 3) for g, t in generators.items()}}), flush=True)


class JsonlReporter:
    """One JSON record per step in a file (fsynced line by line) plus a short stdout line."""

    def __init__(self, *, path: pathlib.Path, echo: bool = True) -> None:
        self.path = path
        self.echo = echo

    def resumed(self, *, step: int) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        keep: list[str] = []
        if self.path.exists():
            for line in self.path.read_text().splitlines():
                rec = progress.StepRecord.decode(line)     # None: a torn line from a killed writer
                if rec is not None and rec.step <= step:
                    keep.append(rec.encode())
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text("".join(x + "\n" for x in keep))
        os.replace(tmp, self.path)

    def step(self, record: progress.StepRecord) -> None:
        with self.path.open("a") as f:
            f.write(record.encode() + "\n")
            f.flush()
            os.fsync(f.fileno())
        if self.echo:
            reward = record.mean_reward
            print(f"step {record.step} reward {reward if reward is None else round(reward, 4)} "
                  f"policy {record.policy_version}", file=sys.stdout, flush=True)

    def done(self, record: progress.StepRecord) -> None:
        if self.echo:
            print(f"done after step {record.step}", flush=True)

    def silent(self, generators: Mapping[int, float]) -> None:
        pass      # a local run's launcher sees its processes die: nothing to tell it


class PodAnnotationReporter:
    """Patches ``contract.ANNOTATION_PROGRESS`` on this pod (in-cluster config, the pod's service account).

    The final ``done`` patch keeps the mean reward of the step it closes (the trainer's done record carries only
    step and policy version), so the RLJob's ``status.progress`` still shows the last step's reward. The generators
    silent now ride on every patch, and a change of them patches the last step's report again at once (the loop
    may be stalled waiting for them: no step would carry it); before the first step of this process there is no
    report to carry them (the operator then waits for the node controller, docs/recovery.md).
    """

    def __init__(self, *, pod: str, namespace: str, api: podapi.Pod | None = None) -> None:
        self.pod = pod
        self.namespace = namespace
        self._api = api
        self._last: progress.StepRecord | None = None
        self._export: rljob.ExportInfo | None = None
        self._silent: dict[int, float] = {}

    def _client(self) -> podapi.Pod:
        if self._api is None:
            self._api = podapi.InClusterPod(pod=self.pod, namespace=self.namespace)
        return self._api

    def _patch(self, record: progress.StepRecord, *, done: bool) -> None:
        report = progress.ProgressReport.of_step(record, done=done, last_export=self._export)
        if self._silent:
            report = report.model_copy(update={"silent_generators": dict(self._silent)})
        try:
            self._client().patch_annotations({contract.ANNOTATION_PROGRESS: report.encode()})
        except Exception as exc:  # progress is advisory: training goes on; the next step retries
            print(f"progress annotation patch failed: {exc}", file=sys.stderr, flush=True)
            if done:
                raise

    def resumed(self, *, step: int) -> None:
        pass

    def step(self, record: progress.StepRecord) -> None:
        if record.export_request is not None:       # lastExport stays on the annotation once set
            self._export = rljob.ExportInfo(request=record.export_request, path=record.export, step=record.step)
        self._last = record
        self._patch(record, done=False)

    def done(self, record: progress.StepRecord) -> None:
        last = self._last
        if last is not None and last.step == record.step and record.mean_reward is None:
            record = record.model_copy(update={"mean_reward": last.mean_reward,
                                               "logprob_mismatch_kl": last.logprob_mismatch_kl})
        self._patch(record, done=True)

    def silent(self, generators: Mapping[int, float]) -> None:
        if set(generators) == set(self._silent):
            return
        self._silent = dict(generators)
        if self._last is not None:
            self._patch(self._last, done=False)


class Tee:
    """Report to several reporters (e.g. JSONL and stdout in a pod's log)."""

    def __init__(self, *reporters: Reporter) -> None:
        self.reporters = reporters

    def resumed(self, *, step: int) -> None:
        for r in self.reporters:
            r.resumed(step=step)

    def step(self, record: progress.StepRecord) -> None:
        for r in self.reporters:
            r.step(record)

    def done(self, record: progress.StepRecord) -> None:
        for r in self.reporters:
            r.done(record)

    def silent(self, generators: Mapping[int, float]) -> None:
        for r in self.reporters:
            r.silent(generators)
