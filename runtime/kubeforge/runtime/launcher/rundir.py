"""Layout of a local run directory ``runs/<name>-<timestamp>/``.

```
runs/tiny-20261122-053000/
  rljob.yaml        the effective manifest every role reads (KUBEFORGE_CONFIG)
  metrics.jsonl     one record per optimizer step, written by trainer rank 0
  reward.png        reward curve
  summary.json      the summary also printed on stdout's last line
  checkpoints/      trainer checkpoints (KUBEFORGE_CHECKPOINT_DIR)
  logs/<role>-<i>.log  each process's stdout and stderr (appended across restarts)
```
"""
from __future__ import annotations

import dataclasses
import pathlib
import time

METRICS = "metrics.jsonl"


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunDir:
    root: pathlib.Path

    @property
    def manifest(self) -> pathlib.Path:
        return self.root / "rljob.yaml"

    @property
    def metrics(self) -> pathlib.Path:
        return self.root / METRICS

    @property
    def plot(self) -> pathlib.Path:
        return self.root / "reward.png"

    @property
    def summary(self) -> pathlib.Path:
        return self.root / "summary.json"

    @property
    def checkpoints(self) -> pathlib.Path:
        return self.root / "checkpoints"

    def log(self, name: str) -> pathlib.Path:
        return self.root / "logs" / f"{name}.log"


def create(*, job_name: str, explicit: str | None, base: str = "runs", now: float | None = None) -> RunDir:
    """Make the run directory (and its subfolders); an explicit one may already exist (a resumed run)."""
    if explicit:
        root = pathlib.Path(explicit)
    else:
        stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
        root = pathlib.Path(base) / f"{job_name}-{stamp}"
    root = root.resolve()
    (root / "logs").mkdir(parents=True, exist_ok=True)
    (root / "checkpoints").mkdir(exist_ok=True)
    return RunDir(root=root)
