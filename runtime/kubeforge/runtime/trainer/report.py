"""How trainer rank 0 reports progress: one small :class:`Reporter` interface, two implementations.

- :class:`JsonlReporter` (local runs): appends one JSON record per optimizer step to ``<run dir>/metrics.jsonl``
  (the launcher tails it for the progress bar and summarises it) and echoes a short line on stdout.
- :class:`PodAnnotationReporter` (``KUBEFORGE_REPORT=pod-annotation``): patches its own pod's
  ``contract.ANNOTATION_PROGRESS`` annotation with ``{step, meanReward, policyVersion, done}`` with the pod's
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
from typing import Any, Protocol

from kubeforge.api import contract
from kubeforge.runtime import podapi


class Reporter(Protocol):
    def resumed(self, *, step: int) -> None:
        """The trainer (re)starts after ``step`` completed steps (0 on a fresh start)."""

    def step(self, record: Mapping[str, Any]) -> None:
        """One optimizer step finished; ``record`` has at least step, mean_reward, policy_version."""

    def done(self, record: Mapping[str, Any]) -> None:
        """The last step finished; the job has succeeded."""


class NullReporter:
    """Trainer ranks other than 0 report nothing."""

    def resumed(self, *, step: int) -> None:
        pass

    def step(self, record: Mapping[str, Any]) -> None:
        pass

    def done(self, record: Mapping[str, Any]) -> None:
        pass


class StdoutReporter:
    """One JSON record per step on stdout (a pod's log; ``kubectl logs`` shows progress)."""

    def resumed(self, *, step: int) -> None:
        print(json.dumps({"resumed": step}), flush=True)

    def step(self, record: Mapping[str, Any]) -> None:
        print(json.dumps(dict(record)), flush=True)

    def done(self, record: Mapping[str, Any]) -> None:
        print(json.dumps({"done": True, **dict(record)}), flush=True)


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
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue          # a torn line from a killed writer
                if isinstance(rec, dict) and isinstance(rec.get("step"), int) and rec["step"] <= step:
                    keep.append(json.dumps(rec))
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text("".join(x + "\n" for x in keep))
        os.replace(tmp, self.path)

    def step(self, record: Mapping[str, Any]) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps(dict(record)) + "\n")
            f.flush()
            os.fsync(f.fileno())
        if self.echo:
            reward = record.get("mean_reward")
            print(f"step {record['step']} reward {reward if reward is None else round(reward, 4)} "
                  f"policy {record.get('policy_version')}", file=sys.stdout, flush=True)

    def done(self, record: Mapping[str, Any]) -> None:
        if self.echo:
            print(f"done after step {record.get('step')}", flush=True)


def progress_annotation(record: Mapping[str, Any], *, done: bool) -> str:
    """The annotation value: ``{"step", "meanReward", "policyVersion", "done"}`` (plus ``evalAccuracy`` once the
    job has evaluated) as compact JSON."""
    doc = {"step": int(record.get("step", 0)), "meanReward": record.get("mean_reward"),
           "policyVersion": int(record.get("policy_version", 0)), "done": done}
    if record.get("eval_accuracy") is not None:
        doc["evalAccuracy"] = record["eval_accuracy"]
    if record.get("export_request") is not None:
        doc["lastExport"] = {"request": record["export_request"], "path": record.get("export"),
                             "step": int(record.get("export_step", record.get("step", 0)))}
    return json.dumps(doc, separators=(",", ":"))


class PodAnnotationReporter:
    """Patches ``contract.ANNOTATION_PROGRESS`` on this pod (in-cluster config, the pod's service account).

    The final ``done`` patch keeps the mean reward of the step it closes (the trainer's done record carries only
    step and policy version), so the RLJob's ``status.progress`` still shows the last step's reward.
    """

    def __init__(self, *, pod: str, namespace: str, api: podapi.Pod | None = None) -> None:
        self.pod = pod
        self.namespace = namespace
        self._api = api
        self._last: Mapping[str, Any] = {}
        self._export: dict[str, Any] = {}

    def _client(self) -> podapi.Pod:
        if self._api is None:
            self._api = podapi.InClusterPod(pod=self.pod, namespace=self.namespace)
        return self._api

    def _patch(self, record: Mapping[str, Any], *, done: bool) -> None:
        try:
            self._client().patch_annotations({contract.ANNOTATION_PROGRESS: progress_annotation(record, done=done)})
        except Exception as exc:  # progress is advisory: training goes on; the next step retries
            print(f"progress annotation patch failed: {exc}", file=sys.stderr, flush=True)
            if done:
                raise

    def resumed(self, *, step: int) -> None:
        pass

    def step(self, record: Mapping[str, Any]) -> None:
        if record.get("export_request") is not None:       # lastExport stays on the annotation once set
            self._export = {"export": record.get("export"), "export_request": record["export_request"],
                            "export_step": record.get("step")}
        record = {**record, **self._export}
        self._last = record
        self._patch(record, done=False)

    def done(self, record: Mapping[str, Any]) -> None:
        same_step = self._last.get("step") == record.get("step")
        reward = {"mean_reward": self._last.get("mean_reward")} if same_step and "mean_reward" not in record else {}
        self._patch({**record, **reward}, done=True)


class Tee:
    """Report to several reporters (e.g. JSONL and stdout in a pod's log)."""

    def __init__(self, *reporters: Reporter) -> None:
        self.reporters = reporters

    def resumed(self, *, step: int) -> None:
        for r in self.reporters:
            r.resumed(step=step)

    def step(self, record: Mapping[str, Any]) -> None:
        for r in self.reporters:
            r.step(record)

    def done(self, record: Mapping[str, Any]) -> None:
        for r in self.reporters:
            r.done(record)
