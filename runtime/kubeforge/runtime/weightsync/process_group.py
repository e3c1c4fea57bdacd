"""The process group of a weight sync: trainer rank 0 and every generator worker, private to the sync.

A ``ProcessGroupGloo`` (``ProcessGroupNCCL`` with GPUs) built directly on the epoch's prefix of the weight-sync
store, never through ``torch.distributed.init_process_group``, so it leaves vLLM's own groups and the trainers'
data-parallel group alone. Ranks: the sender is 0, generator ``g``'s worker with TP rank ``t`` is ``1 + g*T + t``.

Neighbours: ``rendezvous`` (the rendezvous and the barrier), ``auth`` (the job key is proven before the group forms);
``sender`` and ``receiver`` open one with :func:`open_group`.
"""
from __future__ import annotations

import datetime
from collections.abc import Callable
from typing import Any, Protocol

import torch
import torch.distributed as dist

from kubeforge.runtime.weightsync import auth, protocol, rendezvous


class Group(Protocol):
    """The collectives the protocol needs; rank 0 is always the root."""

    rank: int
    size: int
    device: torch.device

    def broadcast(self, tensor: torch.Tensor) -> None: ...
    def broadcast_async(self, tensor: torch.Tensor) -> Callable[[], None]: ...   # returns its wait (bounded)
    def all_reduce_sum(self, tensor: torch.Tensor) -> None: ...
    def close(self) -> None: ...


class TorchGroup:
    """A private ``ProcessGroupGloo`` (CPU) or ``ProcessGroupNCCL`` (GPU) over a ``TCPStore`` served by rank 0, under
    the key prefix of ``epoch`` (rank 0 may pass the store it already serves)."""

    def __init__(self, *, host: str, port: int, world_size: int, rank: int, timeout: float,
                 join_timeout: float, backend: str = "gloo", device: torch.device | None = None, epoch: int = 0,
                 store: Any = None, auth_key: bytes | None = None) -> None:
        if not 0 <= rank < world_size:
            raise ValueError(f"weight sync: rank {rank} outside world of {world_size}")
        td = datetime.timedelta(seconds=timeout)
        self.rank, self.size, self.epoch = rank, world_size, epoch
        self.root: Any = store if store is not None else rendezvous.open_store(host=host, port=port, rank=rank,
                                                                      join_timeout=join_timeout)
        self.store: Any = dist.PrefixStore(rendezvous.epoch_prefix(epoch), self.root)  # type: ignore[attr-defined]
        # everyone is here: the group connects within `timeout`
        rendezvous.barrier(self.store, world_size, timeout=join_timeout)
        key = auth_key if auth_key is not None else auth.job_key_from_env()
        if key is not None:   # no weights flow between parties that cannot prove they hold the job key
            auth.authenticate(self.store, rank=rank, world_size=world_size, key=key)
        self.store.set_timeout(td)
        if backend == "gloo":
            self.device = torch.device("cpu")
            self.pg: Any = dist.ProcessGroupGloo(self.store, rank, world_size, td)
        elif backend == "nccl":
            self.device = device or torch.device("cuda", torch.cuda.current_device())
            opts = dist.ProcessGroupNCCL.Options()
            opts._timeout = td
            self.pg = dist.ProcessGroupNCCL(self.store, rank, world_size, opts)
        else:
            raise ValueError(f"weight sync: unknown backend {backend!r} (gloo | nccl)")

    def broadcast(self, tensor: torch.Tensor) -> None:
        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        self.pg.broadcast([tensor], opts).wait()

    def broadcast_async(self, tensor: torch.Tensor) -> Callable[[], None]:
        """Enqueue the broadcast (the backend progresses it in its own threads); the returned wait blocks until
        it completed, at most the group's timeout."""
        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        work = self.pg.broadcast([tensor], opts)
        return lambda: work.wait()

    def all_reduce_sum(self, tensor: torch.Tensor) -> None:
        opts = dist.AllreduceOptions()
        opts.reduceOp = dist.ReduceOp.SUM  # type: ignore[assignment]
        self.pg.allreduce([tensor], opts).wait()

    def close(self) -> None:
        shutdown = getattr(self.pg, "shutdown", None)
        if shutdown is not None:
            try:
                shutdown()
            except Exception:  # already broken: nothing left to release
                pass
        self.pg = None
        self.store = None


def open_group(*, host: str, port: int, world_size: int, rank: int, timeout: float, join_timeout: float,
          backend: str, epoch: int = 0, store: Any = None, auth_key: bytes | None = None) -> TorchGroup:
    """The group; ``auth_key`` is the job key proven at the rendezvous (None: the env contract's: a pool engine
    serving several jobs passes each job's own)."""
    try:
        return TorchGroup(host=host, port=port, world_size=world_size, rank=rank, timeout=timeout,
                          join_timeout=join_timeout, backend=backend, epoch=epoch, store=store, auth_key=auth_key)
    except (RuntimeError, dist.DistError) as e:
        if isinstance(e, protocol.WeightSyncError):
            raise
        raise protocol.WeightSyncError(f"weight sync: rank {rank} could not join {host}:{port} (world {world_size}, "
                                       f"epoch {epoch}): {e}") from e
