"""Weight sync: trainer rank 0 broadcasts new policy weights to every generator's engine worker(s).

API::

    world_size(generators=G, tensor_parallel_size=T) -> int            # 1 + G*T
    rank_base(generator_index=g, tensor_parallel_size=T) -> int        # 1 + g*T; worker rank = base + tp_rank
    sender = WeightSender(host=..., port=..., world_size=..., timeout=..., join_timeout=..., delta=False)  # rank 0
    stats = sender.send(named_tensors, version=v)                      # -> SyncStats(bytes, seconds, ...)
    stats = sender.send(stream, version=v)   # a TensorStream: meta first, tensors produced bucket by bucket
    flight = sender.start(named_tensors, version=v)  # snapshot now, broadcast in a background thread
    stats = flight.result()                          # join it (WeightSyncError if the broadcast failed)
    receiver = WeightReceiver(host=..., port=..., world_size=..., rank=..., timeout=...)    # a vLLM worker
    stats = receiver.receive(load)   # load(iterator of (name, tensor)) consumes the new weights
    receiver.prefetch(prepare)       # receive the next sync in the background, into the reusable buffers, and
                                     # prepare(staged) there too while it arrives (the engine builds its next
                                     # kernels off the pause, layer by layer as their bytes land)
    staged = receiver.take()         # join it; receiver.load_staged(staged, load) loads it (the pause)
    sender.close(); receiver.close()

Neighbours: the trainer's rank 0 owns a ``WeightSender`` (``trainer.pusher``); ``generator.extension`` owns a
``WeightReceiver`` inside each vLLM worker (reached through ``collective_rpc``); the role loops tell generators over
ZeroMQ when to call in.

Modules, one concept each: ``protocol`` (header magic and version, bounds, dtypes, ranks; ``WeightSyncError``,
``SyncStats``), ``rendezvous`` (the store, its epochs, the join barrier), ``auth`` (the job key proven at the
rendezvous), ``process_group`` (the private gloo/NCCL group), ``metadata`` (what a receiver must know of the tensors;
tensor streams), ``bucketing`` (placing and packing tensors into buckets; reusable buffers), ``delta`` (the lossless
per-tensor codec), ``deltas`` (a sync's deltas at both ends), ``sender`` and ``receiver`` (the two ends). This package's face hands on the names its callers use; its modules import each other,
never the face.

The group is private: a ``TCPStore`` served by rank 0 (port ``contract.PORT_WEIGHTS`` of trainer 0) plus a
``ProcessGroupGloo`` (``ProcessGroupNCCL`` with GPUs) built directly on it, never through
``torch.distributed.init_process_group``, so it leaves vLLM's own groups and the trainers' data-parallel group
alone. Ranks: the sender is 0, generator ``g``'s worker with TP rank ``t`` is ``1 + g*T + t``.

One sync, every step a collective over the whole group::

    rank 0 (sender)                            ranks 1..N (receivers)
    header  int64[MAGIC, PROTOCOL, version, len(meta)]  ──broadcast──▶ check magic/protocol
    meta    uint8[JSON: names, shapes, dtypes,        ──broadcast──▶ validate, plan buffers
            bucket/offset of each tensor; a delta
            offered: its base version, each tensor's
            encoding/count/place]
    vote    int64[yes count]  ◀──all-reduce(sum)──    (a delta offered) 1 when its buffers hold the base whole
    bucket 0..B-1  the delta's when all voted yes,
            else the full ones: uint8 buffers
            (~bucket_mb each;                          ──broadcast──▶ views handed to load() as they arrive
            a big tensor travels alone, uncopied)
    ack    int64[failures, count]  ◀──all-reduce(sum)── 0 or 1 per receiver, after load() returned
                                                          (prefetched: after the last bucket, before loading)

Before the header the sender adds 1 to the epoch's ``syncs`` count in the store: a receiver prefetching in the
background polls that count and enters the collectives only once a sync has begun.

Invariants:
- Nothing is pickled: metadata is JSON bytes in a uint8 tensor, decoded and validated by the receiver.
- Every receiver takes part in every step even when its ``load`` fails (it drains the remaining buckets and
  acks a failure), so one failing loader never leaves the others blocked.
- Joining waits up to ``join_timeout`` (long: a generator joins between rollout batches, an engine may still be
  starting) for every rank at a store barrier; after that every collective is bounded by ``timeout`` (short): a
  peer that dies mid-sync makes the others raise ``WeightSyncError`` instead of hanging. After an error the
  group is unusable; it is closed and re-formed under a new **epoch**.
- Epochs: the sender keeps one store (its server) for its lifetime; each epoch's group lives under the key prefix
  ``kubeforge/epoch-<n>/``. ``WeightSender.reset()`` abandons the current epoch (a mark in the store that ends
  every barrier still waiting in it with ``WeightSyncError``, at once) and the next ``send`` forms epoch n+1 with
  whoever joins it. So a generator that restarts, or one that reads an old SYNC, never waits on a dead epoch.
- Deltas (``delta=True``; docs/runtime.md): the sender offers one only against the version its snapshot holds and every
  receiver acknowledged; the receivers' full buffers are the base a delta is applied to, so a loader always gets
  whole tensors, bit for bit the sender's. One receiver without the base makes the whole sync full.
- Buffers are reused: both ends keep one set of bucket buffers per layout (the bucket sizes), allocated on the
  first sync of that layout and reused by every later one; a new layout (another model, LoRA on/off) replaces
  them. A loader may keep the views it was given only until it returns (vLLM's layer-wise reload copies them into
  the engine's own tensors before it returns; the LoRA path clones).
- The streaming ``send`` packs shared buckets into one reusable staging buffer (a tensor larger than a bucket
  travels as itself), so its memory stays one bucket; ``start`` keeps a snapshot of the whole model instead.
- Overlap (``start``): the sender packs (snapshots) every tensor into its buffers on the caller's thread, so the
  caller may change its parameters as soon as ``start`` returns; one background thread then runs the collectives
  (header, metadata, buckets, ack). At most one sync is in flight: ``start``, ``send``, ``reset`` and ``close`` join
  the previous one first, so syncs reach the receivers in version order.
"""
from __future__ import annotations

from kubeforge.runtime.weightsync.auth import authenticate, job_key_from_env
from kubeforge.runtime.weightsync.bucketing import BucketBuffers, plan_buckets
from kubeforge.runtime.weightsync.metadata import TensorMeta, TensorStream, decode_meta, encode_meta
from kubeforge.runtime.weightsync.process_group import Group, TorchGroup
from kubeforge.runtime.weightsync.protocol import (DEFAULT_BUCKET_MB, DEFAULT_JOIN_TIMEOUT, SyncStats, WeightSyncError,
                                                   rank_base, world_size)
from kubeforge.runtime.weightsync.receiver import Loader, Preparer, Staged, WeightReceiver
from kubeforge.runtime.weightsync.rendezvous import CLOSE_WAIT_SECONDS
from kubeforge.runtime.weightsync.sender import InFlight, Prepared, WeightSender, announce

__all__ = [
    "CLOSE_WAIT_SECONDS", "DEFAULT_BUCKET_MB", "DEFAULT_JOIN_TIMEOUT", "BucketBuffers", "Group", "InFlight", "Loader",
    "Preparer", "Prepared", "Staged", "SyncStats", "TensorMeta", "TensorStream", "TorchGroup", "WeightReceiver",
    "WeightSender", "WeightSyncError", "announce", "authenticate", "decode_meta", "encode_meta", "job_key_from_env",
    "plan_buckets", "rank_base", "world_size",
]
