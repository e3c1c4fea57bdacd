"""Atomic trainer checkpoints: model, optimizer, step, data cursor, policy version and RNG states, together.

Role: rank 0 writes one every ``checkpoint.everySteps``; on start every trainer resumes from the newest COMPLETE one
(``step.Trainer.resume``), so a restart neither loses nor repeats a step. Neighbours: ``step.Trainer`` (what to
save and restore), the launcher/operator (only the directory: ``checkpoint.path`` or ``KUBEFORGE_CHECKPOINT_DIR``).

Layout of ``<root>/step-000000010/``::

    model.pt        the policy's state_dict (tensors only)                     } replicated (DDP) trainers,
    optimizer.pt    the optimizer's state_dict (tensors, numbers, lists: loads } written by rank 0
                    with weights_only=True)
    dcp/            or: a torch.distributed.checkpoint folder (sharded, FSDP): every rank writes its shards
    state.json      step, policy version, data cursor, RNG states (python, numpy, torch), extras: plain JSON
    MANIFEST.json   relative path -> {bytes, sha256} of every file above
    COMPLETE        sha256 of MANIFEST.json; written last

Sharded writes (:func:`begin` on rank 0, its temp path broadcast, every rank writes into ``dcp/``, a barrier,
:func:`seal` on rank 0) follow the same protocol as :func:`save`; DCP reshards on load, so a sharded checkpoint
resumes onto any number of ranks.

Write protocol: write into ``<root>/.tmp-...``, fsync every file and the folder, rename it to ``step-N``, fsync the
root, then write ``COMPLETE`` (temp + link + fsync). Readers trust only folders with a ``COMPLETE`` marker whose
manifest matches the files (sizes in :func:`latest`, sha256 in :func:`load`), so a crash at any point leaves either
the previous checkpoint or the new one, never a half-written one. Nothing is unpickled: tensors load with
``torch.load(weights_only=True)``, the rest is JSON.

Fencing (``fence``; docs/fencing.md): a writer with a trainer epoch records it in ``FENCE``; a commit is refused
(:class:`Fenced`, before and after its rename) once a higher epoch claimed the store, readers skip a checkpoint that
a higher epoch's claim made invalid, a folder already at ``step-N`` is moved aside (never deleted in place, never
if a higher epoch wrote it), and ``COMPLETE`` never replaces a marker it did not write for its own manifest: a
stale writer can neither publish a checkpoint anyone reads nor spoil the current one.
"""
from __future__ import annotations

import base64
import dataclasses
import errno
import hashlib
import json
import os
import random
import shutil
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from kubeforge.runtime.learner import fence

PREFIX = "step-"
TMP_PREFIX = ".tmp-"
MODEL = "model.pt"
OPTIMIZER = "optimizer.pt"
STATE = "state.json"
MANIFEST = "MANIFEST.json"
COMPLETE = "COMPLETE"
DCP = "dcp"
FILES = (MODEL, OPTIMIZER, STATE)


class CheckpointError(Exception):
    """A checkpoint folder is incomplete or corrupt."""


Fenced = fence.Fenced     # a commit refused: a newer trainer epoch claimed the store


@dataclasses.dataclass(frozen=True, kw_only=True)
class Loaded:
    path: Path
    model_state: dict[str, torch.Tensor]      # empty for a sharded checkpoint
    optimizer_state: dict[str, Any]           # empty for a sharded checkpoint
    state: dict[str, Any]

    @property
    def sharded(self) -> Path | None:
        """The DCP folder of a sharded checkpoint, else None."""
        d = self.path / DCP
        return d if d.is_dir() else None


# ---------------------------------------------------------------- RNG states as JSON


def capture_rng() -> dict[str, Any]:
    """Python, numpy and torch (CPU, and CUDA when present) RNG states as JSON-serialisable data."""
    version, internal, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    out: dict[str, Any] = {
        "python": [version, list(internal), gauss],
        "numpy": [kind, [int(k) for k in keys], int(pos), int(has_gauss), float(cached)],
        "torch": base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode(),
    }
    if torch.cuda.is_available():
        out["cuda"] = [base64.b64encode(s.numpy().tobytes()).decode() for s in torch.cuda.get_rng_state_all()]
    return out


def _bytes_tensor(text: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8).clone()


def restore_rng(rng: Mapping[str, Any]) -> None:
    """Inverse of :func:`capture_rng`."""
    version, internal, gauss = rng["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = rng["numpy"]
    np.random.set_state((kind, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(_bytes_tensor(rng["torch"]))
    if "cuda" in rng and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([_bytes_tensor(s) for s in rng["cuda"]])


# ---------------------------------------------------------------- writing


def _fsync_file(path: Path) -> None:
    with open(path, "rb+") as f:
        os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _write_text_atomic(path: Path, text: str) -> None:
    """Write ``path`` whole (temp + link + fsync) unless it exists: ``FileExistsError`` then (a marker is never
    replaced behind the writer's back; :func:`_mark` decides)."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    _fsync_file(tmp)
    try:
        os.link(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    _fsync_dir(path.parent)


def dir_name(step: int) -> str:
    return f"{PREFIX}{step:09d}"


def save(*, root: Path | str, step: int, model_state: Mapping[str, torch.Tensor],
         optimizer_state: Mapping[str, Any], state: Mapping[str, Any], keep: int, epoch: int = 0) -> Path:
    """Write checkpoint ``step`` atomically (see module docstring) as trainer ``epoch``, then prune to the newest
    ``keep``; :class:`Fenced` when a newer epoch claimed the store."""
    tmp = begin(root=root, step=step)
    torch.save({k: v.detach().cpu() for k, v in model_state.items()}, tmp / MODEL)
    torch.save(dict(optimizer_state), tmp / OPTIMIZER)
    return seal(tmp, root=root, step=step, state=state, keep=keep, epoch=epoch)


def begin(*, root: Path | str, step: int) -> Path:
    """A fresh temp folder for checkpoint ``step`` (its writers fill it, then :func:`seal` publishes it)."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f"{TMP_PREFIX}{dir_name(step)}-{os.getpid()}-{time.time_ns()}"
    tmp.mkdir()
    return tmp


def seal(tmp: Path, *, root: Path | str, step: int, state: Mapping[str, Any], keep: int, epoch: int = 0) -> Path:
    """Add ``state.json`` (and ``FENCE`` for an epoch) and the manifest of every file in ``tmp``, fsync, rename to
    ``step-N``, mark COMPLETE, prune to the newest ``keep``. :class:`Fenced` (recorded) when a newer epoch claimed
    the store before the rename, or after it with a resume point below ``step``."""
    root = Path(root)
    (tmp / STATE).write_text(json.dumps(dict(state), sort_keys=True))
    if epoch > 0:
        (tmp / fence.EPOCH_FILE).write_text(f"{epoch}\n")
    manifest = {}
    for f in sorted(p for p in tmp.rglob("*") if p.is_file()):
        name = f.relative_to(tmp).as_posix()
        _fsync_file(f)
        manifest[name] = {"bytes": f.stat().st_size, "sha256": _sha256(f)}
    for d in sorted((p for p in tmp.rglob("*") if p.is_dir()), reverse=True):
        _fsync_dir(d)
    (tmp / MANIFEST).write_text(json.dumps(manifest, sort_keys=True, indent=1))
    _fsync_file(tmp / MANIFEST)
    _fsync_dir(tmp)
    mark = _sha256(tmp / MANIFEST)
    if fence.newer(root, epoch):
        shutil.rmtree(tmp, ignore_errors=True)
        _refuse(root, epoch=epoch, step=step, why="a newer epoch claimed the store before the commit")
    final = _publish(tmp, root=root, step=step, epoch=epoch)
    _mark(final, mark)
    if not fence.valid(fence.newer(root, epoch), step=step, epoch=epoch):
        _refuse(root, epoch=epoch, step=step, why="a newer epoch claimed the store during the commit")
    prune(root=root, keep=keep)
    return final


def _refuse(root: Path, *, epoch: int, step: int, why: str) -> None:
    fence.record(root, epoch=epoch, step=step, why=why)
    raise Fenced(f"{root}: checkpoint of step {step} by trainer epoch {epoch} refused: {why}")


def _publish(tmp: Path, *, root: Path, step: int, epoch: int, tries: int = 5) -> Path:
    """Rename ``tmp`` to ``step-N``. A folder already there (a crash before COMPLETE, or another epoch's commit of
    the same step) is moved aside first, unless a newer epoch wrote it (then this writer is stale); the rename never
    replaces a complete folder (a non-empty target refuses it), so a concurrent commit makes this one retry."""
    final = root / dir_name(step)
    for _ in range(tries):
        if final.exists():
            other = fence.epoch_of(final)
            if other > epoch:
                shutil.rmtree(tmp, ignore_errors=True)
                _refuse(root, epoch=epoch, step=step, why=f"epoch {other} committed this step")
            aside = root / f"{TMP_PREFIX}aside-{final.name}-{os.getpid()}-{time.time_ns()}"
            try:
                os.rename(final, aside)
            except FileNotFoundError:
                continue                 # someone else moved it: look again
            _note_if_fenced(root, aside, step=step, epoch=other)
            shutil.rmtree(aside, ignore_errors=True)
        try:
            os.rename(tmp, final)
        except OSError as e:
            if e.errno in (errno.ENOTEMPTY, errno.EEXIST):
                continue                 # another writer published this step in between
            raise
        _fsync_dir(root)
        return final
    raise CheckpointError(f"{final}: could not publish after {tries} tries (concurrent writers of one step)")


def _mark(final: Path, mark: str) -> None:
    """Write COMPLETE for the manifest whose sha256 is ``mark``. A marker already there that is not ours was put by
    a writer whose folder this one displaced: replaced only while the folder is still ours."""
    try:
        _write_text_atomic(final / COMPLETE, mark + "\n")
        return
    except FileExistsError:
        pass
    if (final / COMPLETE).read_text().strip() == mark:
        return
    if _sha256(final / MANIFEST) != mark:
        raise CheckpointError(f"{final}: displaced by another writer before its marker")
    tmp = final / f"{COMPLETE}.{os.getpid()}.tmp"
    tmp.write_text(mark + "\n")
    _fsync_file(tmp)
    os.replace(tmp, final / COMPLETE)
    _fsync_dir(final)


def _note_if_fenced(root: Path, folder: Path, *, step: int, epoch: int) -> None:
    """Record a complete checkpoint that the claims made invalid (a stale epoch's commit) as fenced."""
    try:
        _manifest(folder)
    except CheckpointError:
        return
    if not fence.valid(fence.claims(root), step=step, epoch=epoch):
        fence.record(root, epoch=epoch, step=step, why="a stale commit found by a newer epoch")


def prune(*, root: Path | str, keep: int) -> None:
    """Keep the newest ``keep`` complete checkpoints; delete older ones, incomplete or fenced ones older than the
    newest complete one (a fenced one is recorded first), and leftover temp folders of other (dead) writers."""
    root = Path(root)
    complete = _complete_dirs(root)
    newest = step_of(complete[-1]) if complete else -1
    for d in complete[:-keep] if keep > 0 else complete:
        shutil.rmtree(d, ignore_errors=True)
    for d in root.iterdir():
        if d.name.startswith(TMP_PREFIX) and f"-{os.getpid()}-" not in d.name:
            shutil.rmtree(d, ignore_errors=True)
        elif d.name.startswith(PREFIX) and d not in complete and 0 <= step_of(d):
            _note_if_fenced(root, d, step=step_of(d), epoch=fence.epoch_of(d))
            if step_of(d) < newest:
                shutil.rmtree(d, ignore_errors=True)


# ---------------------------------------------------------------- reading


def step_of(path: Path) -> int:
    """The step of a checkpoint folder (-1 when its name is not ``step-N``)."""
    try:
        return int(path.name[len(PREFIX):])
    except ValueError:
        return -1


def _manifest(path: Path) -> dict[str, Any]:
    marker = path / COMPLETE
    if not marker.is_file():
        raise CheckpointError(f"{path}: no {COMPLETE} marker")
    try:
        manifest = json.loads((path / MANIFEST).read_text())
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{path}: unreadable {MANIFEST}: {e}") from e
    if not isinstance(manifest, dict):
        raise CheckpointError(f"{path}: {MANIFEST} is not a mapping")
    sharded = any(str(k).startswith(DCP + "/") for k in manifest)
    for name in set(manifest) | ({STATE} if sharded else set(FILES)):
        entry = manifest.get(name)
        f = path / name
        if not isinstance(entry, dict) or not f.is_file() or f.stat().st_size != entry.get("bytes"):
            raise CheckpointError(f"{path}: {name} missing or of the wrong size")
    return dict(manifest)


def _complete_dirs(root: Path) -> list[Path]:
    """Complete checkpoint folders (marker + sizes match) that no claim fenced, oldest first."""
    if not root.is_dir():
        return []
    claims = fence.claims(root)
    out = []
    for d in root.iterdir():
        if d.is_dir() and d.name.startswith(PREFIX) and step_of(d) >= 0:
            try:
                _manifest(d)
            except CheckpointError:
                continue
            if claims and not fence.valid(claims, step=step_of(d), epoch=fence.epoch_of(d)):
                continue                 # a stale epoch's commit after a newer epoch resumed below it
            out.append(d)
    return sorted(out, key=step_of)


def latest(root: Path | str) -> Path | None:
    """The newest complete checkpoint folder under ``root`` (partial ones ignored), or None."""
    complete = _complete_dirs(Path(root))
    return complete[-1] if complete else None


def load(path: Path | str) -> Loaded:
    """Load one checkpoint, verifying the marker and every file's sha256; ``CheckpointError`` otherwise."""
    path = Path(path)
    manifest = _manifest(path)
    if (path / COMPLETE).read_text().strip() != _sha256(path / MANIFEST):
        raise CheckpointError(f"{path}: {COMPLETE} does not match {MANIFEST}")
    for name in manifest:
        if _sha256(path / name) != manifest[name]["sha256"]:
            raise CheckpointError(f"{path}: {name} checksum mismatch")
    try:
        model_state: dict[str, torch.Tensor] = {}
        optimizer_state: dict[str, Any] = {}
        if MODEL in manifest:
            model_state = torch.load(path / MODEL, map_location="cpu", weights_only=True)
            optimizer_state = torch.load(path / OPTIMIZER, map_location="cpu", weights_only=True)
        state = json.loads((path / STATE).read_text())
    except Exception as e:  # a corrupt file that still matched its checksum cannot happen; be explicit anyway
        raise CheckpointError(f"{path}: cannot load: {e}") from e
    return Loaded(path=path, model_state=model_state, optimizer_state=optimizer_state, state=state)


def load_latest(root: Path | str) -> Loaded | None:
    """The newest checkpoint that loads and verifies, trying older ones when a newer one is corrupt."""
    for d in reversed(_complete_dirs(Path(root))):
        try:
            return load(d)
        except CheckpointError:
            continue
    return None
