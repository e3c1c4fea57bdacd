"""The record of one running test cluster (``<workdir>/cluster.json``) and the package's log line.

Role: the shared piece of ``lifecycle`` (which starts and stops clusters and writes this record) and ``kueue``
(which adds its manager to a running cluster and records its ports): both import it, neither imports the other
back (``lifecycle`` imports ``kueue`` to start it; ``tests/test_harness_imports.py`` keeps the package free of
import circles). ``lifecycle`` re-exports ``Cluster`` and ``log``, so ``lifecycle.Cluster`` stays the name callers use.
Invariant: ``save`` replaces the file atomically; ``load`` reads what ``save`` wrote. Stdlib only.
"""
from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import sys
import time

from kfcluster import config as cfg
from kfcluster import kube


def log(msg: str) -> None:
    print(f"[kfcluster {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Cluster:
    """A running cluster, as recorded in ``<workdir>/cluster.json``."""

    name: str
    workdir: str
    kubeconfig: str
    server: str
    ports: dict[str, int]
    bin_dir: str
    kwok_dir: str
    real_node: bool = False
    nodes: tuple[str, ...] = ()
    kueue: bool = False
    #: ``ClusterConfig.scheduler`` it was started with (records older than the field: Coscheduling)
    scheduler: str = cfg.SCHEDULER_COSCHEDULING

    @property
    def kubectl(self) -> kube.Kubectl:
        return kube.Kubectl(binary=os.path.join(self.bin_dir, "kubectl"), kubeconfig=self.kubeconfig)

    def save(self) -> None:
        path = pathlib.Path(self.workdir, "cluster.json")
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(dataclasses.asdict(self), indent=2) + "\n")
        tmp.replace(path)

    @classmethod
    def load(cls, workdir: str) -> Cluster:
        data = json.loads(pathlib.Path(workdir, "cluster.json").read_text())
        data["nodes"] = tuple(data.get("nodes", ()))
        return cls(**data)
