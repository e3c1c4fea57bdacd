"""The trainers' data-parallel group: gradient averaging and rank-0 broadcasts over torch.distributed.

Role: every trainer replica holds a full copy of the policy and trains on its own share of each step's groups
(``prompt.index % world``); after backward the gradients are averaged, so every rank takes the same optimizer step
and the replicas stay bit-identical. Neighbours: ``step.Trainer`` (calls every collective in the same order on
every rank), ``checkpoint`` (rank 0 loads; the rest receive by broadcast), ``config``/the env contract (where the
group's rendezvous lives).

Rendezvous (``DistConfig``, built by the trainer's start-up from its ``RoleConfig``): rank = the trainer's global
rank, world = the trainer ranks, master = trainer 0's host at its port base + ``contract.PORT_DIST``. Backend gloo
on CPU, NCCL on CUDA. World size 1 creates no process group at all.

Invariants: collectives are issued in the same order on every rank (each ``train_step`` does: all-reduce of the
loss denominators and step stats, then one all-reduce of the flattened gradients). A rank with no groups still
joins with zero gradients.
"""
from __future__ import annotations

import dataclasses
import datetime
import json
from collections.abc import Iterable
from typing import Any, Protocol

import torch
import torch.distributed as dist

from kubeforge.api import contract, roleenv


class Role(Protocol):
    """A trainer process's place in the job (``config.RoleConfig``, the env contract parsed)."""

    @property
    def index(self) -> int: ...
    def replicas(self, role: str) -> int: ...
    def peer(self, role: str, index: int) -> roleenv.Peer: ...


@dataclasses.dataclass(frozen=True, kw_only=True)
class DistConfig:
    rank: int = 0
    world_size: int = 1
    master_host: str = "127.0.0.1"
    master_port: int = contract.DEFAULT_PORT_BASE + contract.PORT_DIST
    backend: str = "gloo"
    timeout_s: float = 300.0

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"{contract.ENV_INDEX}: rank {self.rank} outside trainer world size {self.world_size}")

    @classmethod
    def of_role(cls, cfg: Role, *, backend: str) -> DistConfig:
        """The trainer group of a trainer process: its global rank among every trainer rank, trainer 0 the master."""
        master = cfg.peer("trainer", 0)
        return cls(rank=cfg.index, world_size=cfg.replicas("trainer"), master_host=master.host,
                   master_port=master.port(contract.PORT_DIST), backend=backend)


class DataParallel:
    """The process group (or nothing, for one rank) and the few collectives the trainer needs."""

    def __init__(self, *, config: DistConfig, device: torch.device | str = "cpu") -> None:
        self.config = config
        self.rank = config.rank
        self.world_size = config.world_size
        self.device = torch.device(device)
        if self.world_size > 1 and not dist.is_initialized():
            dist.init_process_group(
                backend=config.backend, init_method=f"tcp://{config.master_host}:{config.master_port}",
                rank=config.rank, world_size=config.world_size,
                timeout=datetime.timedelta(seconds=config.timeout_s))

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def all_reduce_sum(self, values: list[float]) -> list[float]:
        """Element-wise sum over ranks of a short list of numbers (float64)."""
        t = torch.tensor(values, dtype=torch.float64, device=self._comm_device())
        if self.world_size > 1:
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return [float(x) for x in t.cpu().tolist()]

    def all_reduce_max(self, values: list[float]) -> list[float]:
        """Element-wise maximum over ranks of a short list of numbers (float64)."""
        t = torch.tensor(values, dtype=torch.float64, device=self._comm_device())
        if self.world_size > 1:
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return [float(x) for x in t.cpu().tolist()]

    def average_gradients(self, params: Iterable[torch.nn.Parameter]) -> None:
        """Replace every gradient by its mean over ranks (one flat all-reduce; missing grads count as 0)."""
        ps = list(params)
        for p in ps:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        if self.world_size == 1:
            return
        flat = torch.cat([p.grad.reshape(-1) for p in ps if p.grad is not None]).to(self._comm_device())
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        flat /= self.world_size
        flat = flat.to(self.device)
        offset = 0
        for p in ps:
            g = p.grad
            assert g is not None
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()

    def broadcast_tensors(self, tensors: Iterable[torch.Tensor]) -> None:
        """Overwrite ``tensors`` on every rank with rank 0's values, in place."""
        if self.world_size == 1:
            return
        for t in tensors:
            if t.device.type == self._comm_device().type:
                dist.broadcast(t.data, src=0)
            else:  # e.g. AdamW's CPU step counter under NCCL
                tmp = t.detach().to(self._comm_device())
                dist.broadcast(tmp, src=0)
                t.data.copy_(tmp.to(t.device))

    def broadcast_json(self, obj: Any) -> Any:
        """Rank 0's JSON-serialisable ``obj`` on every rank (others pass anything, e.g. None)."""
        if self.world_size == 1:
            return obj
        data = json.dumps(obj).encode() if self.is_main else b""
        size = torch.tensor([len(data)], dtype=torch.long, device=self._comm_device())
        dist.broadcast(size, src=0)
        buf = torch.zeros(int(size.item()), dtype=torch.uint8, device=self._comm_device())
        if self.is_main:
            buf.copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))
        dist.broadcast(buf, src=0)
        return json.loads(bytes(buf.cpu().tolist()).decode())

    def barrier(self) -> None:
        if self.world_size > 1:
            dist.barrier()

    def close(self) -> None:
        """Destroy the process group (idempotent)."""
        if self.world_size > 1 and dist.is_initialized():
            dist.destroy_process_group()

    def _comm_device(self) -> torch.device:
        return self.device if self.config.backend == "nccl" else torch.device("cpu")
