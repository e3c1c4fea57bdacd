"""What both ends of a weight sync agree on: the header's magic and protocol version, the bounds a receiver holds
the metadata to, the dtypes that travel, the ranks of the group; the one error and the stats a sync reports.

Neighbours: every other module of this package; ``generator.start`` and ``trainer.start`` size the group with
:func:`world_size` and :func:`rank_base`.
"""
from __future__ import annotations

import dataclasses

import torch

MAGIC = 0x4B46_5753  # "KFWS"
PROTOCOL = 2  # 2: a sync may offer a delta, which the receivers vote on before its payload
ALIGN = 16  # bytes; every tensor starts at a multiple of this inside its bucket
DEFAULT_BUCKET_MB = 64
MAX_META_BYTES = 16 << 20  # JSON metadata: ~100 bytes per tensor; a 70B model has a few thousand tensors
MAX_TENSORS = 1 << 16      # tensors per sync
MAX_NAME_CHARS = 1024
MAX_DIMS = 8
DEFAULT_JOIN_TIMEOUT = 600.0  # generators join between rollout batches, maybe long after the trainer
DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "float64": torch.float64,
    "int64": torch.int64, "int32": torch.int32, "int8": torch.int8, "uint8": torch.uint8, "bool": torch.bool,
}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}


class WeightSyncError(RuntimeError):
    """A sync failed: a peer timed out or died, a loader failed, or a message was malformed."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class SyncStats:
    """What one sync moved and how long it took (sender: header to ack; receiver: header to ack, or for a
    prefetched sync the load alone, with the background receive's header-to-last-bucket in ``receive_seconds``)."""

    version: int
    bytes: int
    seconds: float
    tensors: int
    buckets: int
    receive_seconds: float = 0.0
    prepare_seconds: float = 0.0      # prefetched: the background preparation (building kernels), which starts with
                                      # the receive and consumes each bucket as it lands (so it overlaps the wire)
    prepare_wait_seconds: float = 0.0  # the part of prepare_seconds spent waiting for buckets still on the wire
    ready_seconds: float = 0.0        # prefetched: header to prepared (received whole and built), before the load
    swapped: bool = False             # the engine installed prebuilt kernels (swap reload), not an in-place reload
    delta: bool = False               # the payload was a delta against the receivers' version (``bytes`` is its size)
    full_bytes: int = 0               # the full copy's payload (``bytes`` when the sync went out full)
    changed: float | None = None      # sender: the fraction of elements whose bits changed since the receivers'
                                      # version (None: not compared, as when there is no base)
    encode_seconds: float = 0.0       # sender: comparing and encoding (part of packing the snapshot)

    @property
    def gb_per_s(self) -> float:
        """Payload throughput in GB/s (10^9 bytes)."""
        return self.bytes / self.seconds / 1e9 if self.seconds > 0 else 0.0

    def as_dict(self) -> dict[str, float | int | bool]:
        """The fields (``changed`` only when known) and ``gb_per_s``."""
        fields = {k: v for k, v in dataclasses.asdict(self).items() if v is not None}
        return {**fields, "gb_per_s": self.gb_per_s}


def world_size(*, generators: int, tensor_parallel_size: int) -> int:
    """Size of the weight-sync group: trainer rank 0 plus every generator worker."""
    return 1 + generators * tensor_parallel_size


def rank_base(*, generator_index: int, tensor_parallel_size: int) -> int:
    """Rank of generator ``generator_index``'s TP rank 0 worker; its TP rank ``t`` worker is ``base + t``."""
    return 1 + generator_index * tensor_parallel_size
