"""The checkpoint store's fence: trainer epochs claim the store, and a commit of an older epoch is refused or, if it
landed anyway, never read.

Role: ``checkpoint`` calls it on every commit and read; ``persist.restore`` (rank 0) claims the store at start.
Neighbours: the epoch comes from the env contract (``KUBEFORGE_TRAINER_EPOCH``: the operator's
``status.trainerEpoch`` on the trainer pod's label, or the local launcher's counter). Design: docs/fencing.md.

Layout under the checkpoint root::

    fence/claim-000000003.json          {"epoch": 3, "resumed_from": 40}: epoch 3 started from step 40
    fence/fenced-e000000002-step000000045    a commit of epoch 2 refused (or found invalid): one file per stale step
    step-000000045/FENCE                "2": the epoch that wrote this checkpoint (absent: epoch 0)

Invariants:
- A claim is created once per epoch (``O_EXCL``), never rewritten: an in-place restart of the same epoch keeps the
  first one, so what it made invisible stays invisible.
- Validity (:func:`valid`): a checkpoint of step n and epoch e is read only if no claim of a higher epoch resumed
  from a step below n. The rule needs no lock and no ordering between writers: a stale commit that lands after the
  claim, on a shared volume or a reattached one, is invisible to every reader whatever the interleaving.
- Epoch 0 is "unfenced" (no env: unit tests, older launchers): it claims nothing and writes no ``FENCE``; its
  commits are still refused once any epoch has claimed the store.
- Records are counted, never read back as data: the count of ``fenced-*`` files is ``fenced_checkpoints``.
"""
from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Sequence
from pathlib import Path

DIR = "fence"
EPOCH_FILE = "FENCE"
CLAIM_PREFIX = "claim-"
RECORD_PREFIX = "fenced-"


class Fenced(Exception):
    """This writer's epoch is older than one that claimed the store: it must stop (docs/fencing.md)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Claim:
    epoch: int
    resumed_from: int        # the step the epoch's trainer resumed from (0: a fresh start)


def claims(root: Path) -> list[Claim]:
    """Every claim under ``root``, lowest epoch first (unreadable ones skipped: a claim is written atomically)."""
    d = root / DIR
    if not d.is_dir():
        return []
    out = []
    for f in d.iterdir():
        if not f.name.startswith(CLAIM_PREFIX):
            continue
        try:
            doc = json.loads(f.read_text())
            out.append(Claim(epoch=int(doc["epoch"]), resumed_from=int(doc["resumed_from"])))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return sorted(out, key=lambda c: c.epoch)


def valid(found: Sequence[Claim], *, step: int, epoch: int) -> bool:
    """A checkpoint of ``step`` written by ``epoch`` may be read under the claims ``found``."""
    return all(not (c.epoch > epoch and step > c.resumed_from) for c in found)


def newer(root: Path, epoch: int) -> list[Claim]:
    """Claims of epochs above ``epoch``."""
    return [c for c in claims(root) if c.epoch > epoch]


def claim(root: Path, *, epoch: int, resumed_from: int) -> Claim | None:
    """Claim the store for ``epoch`` (resuming from step ``resumed_from``); the claim in force for it, None for
    epoch 0. :class:`Fenced` when a higher epoch has claimed it: this trainer is stale."""
    if epoch <= 0:
        return None
    above = newer(root, epoch)
    if above:
        raise Fenced(f"{root}: trainer epoch {epoch} is stale: epoch {above[-1].epoch} claimed the checkpoints")
    d = root / DIR
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"{CLAIM_PREFIX}{epoch:09d}.json"
    mine = Claim(epoch=epoch, resumed_from=resumed_from)
    if not _create(path, json.dumps(dataclasses.asdict(mine)) + "\n"):
        for c in claims(root):
            if c.epoch == epoch:
                return c             # an earlier start of this epoch (restarted in place) claimed first
    return mine


def record(root: Path, *, epoch: int, step: int, why: str) -> bool:
    """Note that a commit of ``step`` by ``epoch`` was fenced; True when this is the first note of it."""
    d = root / DIR
    d.mkdir(parents=True, exist_ok=True)
    name = f"{RECORD_PREFIX}e{epoch:09d}-step{step:09d}"
    return _create(d / name, json.dumps({"epoch": epoch, "step": step, "why": why}) + "\n")


def count(root: Path | str) -> int:
    """Commits fenced in this store so far (one per stale epoch and step)."""
    d = Path(root) / DIR
    if not d.is_dir():
        return 0
    return sum(1 for f in d.iterdir() if f.name.startswith(RECORD_PREFIX))


def epoch_of(folder: Path) -> int:
    """The epoch that wrote a checkpoint folder (0 when it names none)."""
    try:
        return int((folder / EPOCH_FILE).read_text().strip() or 0)
    except (OSError, ValueError):
        return 0


def _create(path: Path, text: str) -> bool:
    """Write ``path`` whole unless it exists (a temp file linked into place: no reader sees it half written);
    False when it existed."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    with open(tmp, "rb+") as f:
        os.fsync(f.fileno())
    try:
        os.link(tmp, path)
    except FileExistsError:
        return False
    finally:
        tmp.unlink(missing_ok=True)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return True
