"""The learner's state in and out of a checkpoint: written by rank 0 alone (replicated) or by every rank its
shards (FSDP, through DCP), and restored on every rank.

Role: ``step.Trainer.save_checkpoint`` and ``step.Trainer.resume`` call :func:`save` and :func:`restore`.
Neighbours: ``checkpoint`` is the folder format (atomic: temp, fsync, rename, COMPLETE marker; ``latest``);
``sharding`` the DCP I/O; ``parallel`` the group whose broadcasts and barriers keep the ranks together.

Invariants:
- Rank 0 finds and verifies the newest complete checkpoint and claims the store for the trainer epoch (``fence``:
  a stale epoch is refused before it trains); every rank learns its state, or the refusal, from rank 0 (one
  broadcast). A commit refused by the fence raises ``checkpoint.Fenced`` on every rank (sharded: rank 0 says so).
- A sharded checkpoint resumes only a sharded learner and a replicated one only a replicated learner: the other
  way is refused, naming ``spec.roles.trainer.sharding``.
- Replicated with several ranks: rank 0's weights and AdamW state reach every rank (broadcasts), the state first
  materialised where AdamW creates it lazily, so every rank holds the same tensors.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch

from kubeforge.runtime.learner import checkpoint, fence, parallel, sharding


@dataclasses.dataclass(frozen=True, kw_only=True)
class Parts:
    """What a checkpoint holds of one rank's learner."""

    model: torch.nn.Module              # the HF model (its state dict, replicated)
    policy: torch.nn.Module             # the root module FSDP shards (its DCP state, sharded)
    optimizer: torch.optim.Optimizer
    params: list[torch.nn.Parameter]    # the trained parameters, in the optimizer's order
    group: parallel.DataParallel
    layout: str                         # spec.roles.trainer.sharding: sharding.DDP or sharding.FSDP
    epoch: int = 0                      # the trainer epoch that writes (docs/fencing.md; 0: unfenced)


def save(parts: Parts, *, directory: str | Path, keep: int, step: int, state: dict[str, Any]) -> Path | None:
    """Write the checkpoint of ``step`` with ``state`` (JSON); the folder on rank 0, None elsewhere. FSDP: every
    rank must call it."""
    group = parts.group
    if parts.layout != sharding.FSDP:
        if not group.is_main:
            return None
        return checkpoint.save(root=directory, step=step, model_state=parts.model.state_dict(),
                               optimizer_state=parts.optimizer.state_dict(), state=state, keep=keep,
                               epoch=parts.epoch)
    tmp = checkpoint.begin(root=directory, step=step) if group.is_main else None
    tmp = Path(group.broadcast_json(str(tmp) if tmp else None))
    sharding.dcp_save(tmp / checkpoint.DCP, root=parts.policy, optimizer=parts.optimizer)
    group.barrier()
    final, refused = None, None
    if group.is_main:
        try:
            final = checkpoint.seal(tmp, root=directory, step=step, state=state, keep=keep, epoch=parts.epoch)
        except checkpoint.Fenced as exc:
            refused = str(exc)
    refused = group.broadcast_json(refused)          # also the barrier after the seal
    if refused is not None:
        raise checkpoint.Fenced(refused)
    return final


def restore(parts: Parts, *, directory: str | Path) -> dict[str, Any] | None:
    """Load the newest complete checkpoint under ``directory`` into ``parts`` on every rank; its state, or None
    when there is none."""
    group = parts.group
    loaded = checkpoint.load_latest(directory) if group.is_main else None
    info: dict[str, Any] | None = None
    if loaded is not None:
        info = {"state": loaded.state, "sharded": str(loaded.sharded) if loaded.sharded else None}
    if group.is_main:
        try:
            fence.claim(Path(directory), epoch=parts.epoch,
                        resumed_from=checkpoint.step_of(loaded.path) if loaded is not None else 0)
        except fence.Fenced as exc:
            info = {"fenced": str(exc)}
    info = group.broadcast_json(info)
    if info is None:
        return None
    if "fenced" in info:
        raise fence.Fenced(info["fenced"])
    fsdp = parts.layout == sharding.FSDP
    if fsdp != (info["sharded"] is not None):
        raise checkpoint.CheckpointError(
            f"{directory}: a {'sharded' if info['sharded'] else 'replicated'} checkpoint cannot resume "
            f"spec.roles.trainer.sharding {parts.layout}")
    if fsdp:
        sharding.dcp_load(info["sharded"], root=parts.policy, optimizer=parts.optimizer)
        return dict(info["state"])
    if loaded is not None:
        parts.model.load_state_dict(loaded.model_state)
        parts.optimizer.load_state_dict(loaded.optimizer_state)
    if group.world_size > 1:
        _ensure_optimizer_state(parts)
        group.broadcast_tensors(parts.params)
        group.broadcast_tensors(_optimizer_tensors(parts))
    return dict(info["state"])


def _ensure_optimizer_state(parts: Parts) -> None:
    """Materialise AdamW's lazily created state (as AdamW itself would) so every rank has the same tensors."""
    for p in parts.params:
        st = parts.optimizer.state[p]
        if not st:
            st["step"] = torch.tensor(0.0, dtype=torch.float32, device=p.device)
            st["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            st["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)


def _optimizer_tensors(parts: Parts) -> list[torch.Tensor]:
    out: list[torch.Tensor] = []
    for p in parts.params:
        st = parts.optimizer.state[p]
        out.extend(st[k] for k in sorted(st) if isinstance(st[k], torch.Tensor))
    return out
