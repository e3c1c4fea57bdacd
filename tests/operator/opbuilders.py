"""Test builders: RLJobs from the examples with overrides, and raw pods as the API server would show them."""
from __future__ import annotations

import copy
import datetime as dt
import json
import pathlib
from typing import Any

import yaml

from kubeforge.api import contract, load, rljob
from kubeforge.operator import names

ROOT = pathlib.Path(__file__).resolve().parents[2]
T0 = dt.datetime(2026, 11, 22, 12, 0, 0, tzinfo=dt.timezone.utc)


def example(name: str = "tiny") -> dict[str, Any]:
    return yaml.safe_load((pathlib.Path(__file__).parent / "manifests" / f"{name}.yaml").read_text())


def set_path(doc: dict[str, Any], path: str, value: Any) -> None:
    keys = path.split(".")
    cur = doc
    for k in keys[:-1]:
        cur = cur.setdefault(k, {})
    cur[keys[-1]] = value


def job(name: str = "tiny", *, status: dict[str, Any] | None = None, **overrides: Any) -> rljob.RLJob:
    """An example RLJob; overrides are dotted wire paths with '__' for '.' (spec__suspend=True)."""
    doc = copy.deepcopy(example(name))
    doc["metadata"]["namespace"] = "ns"
    for k, v in overrides.items():
        set_path(doc, k.replace("__", "."), v)
    if status is not None:
        doc["status"] = status
    return load.parse(doc)


def pod(job_name: str, role: str, index: int, *, attempt: int = 0, phase: str = "Running", ready: bool = True,
        node: str | None = "kwok-gpu-0", restarts: int = 0, last_exit: int | None = None, exit_now: int | None = None,
        unschedulable: str | None = None, progress: dict[str, Any] | None = None, world: str | None = None,
        deleting: bool = False, gang_held: int | None = None) -> dict[str, Any]:
    """A raw pod of ``job_name`` (``gang_held``: a generator at or beyond it is a surplus generator's pod)."""
    ann = {names.ANNOTATION_WORLD: world or "verifier=1,trainer=1"}
    if progress is not None:
        ann[contract.ANNOTATION_PROGRESS] = json.dumps(progress)
    cs: dict[str, Any] = {"name": role, "restartCount": restarts, "ready": ready,
                          "state": {"running": {}} if exit_now is None else
                          {"terminated": {"exitCode": exit_now, "reason": "Error",
                                          "finishedAt": "2026-11-22T12:00:05Z"}}}
    if last_exit is not None:
        cs["lastState"] = {"terminated": {"exitCode": last_exit, "reason": "Error",
                                          "finishedAt": "2026-11-22T12:00:03Z"}}
    conds = [{"type": "Ready", "status": "True" if ready else "False"}]
    if unschedulable:
        conds.append({"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": unschedulable})
    md: dict[str, Any] = {
        "name": names.pod(job_name, role, index, gang_held=gang_held), "namespace": "ns", "annotations": ann,
        "labels": {contract.LABEL_JOB: job_name, contract.LABEL_ROLE: role, contract.LABEL_ATTEMPT: str(attempt),
                   names.LABEL_POD_INDEX: str(index)}}
    if deleting:
        md["deletionTimestamp"] = "2026-11-22T12:00:06Z"
    return {"metadata": md, "spec": {"nodeName": node} if node and not unschedulable else {},
            "status": {"phase": phase, "conditions": conds, "containerStatuses": [cs]}}


def gang(job_name: str = "tiny", **kw: Any) -> list[dict[str, Any]]:
    """One pod per role (the examples' shape)."""
    return [pod(job_name, r, 0, **kw) for r in contract.ROLES]
