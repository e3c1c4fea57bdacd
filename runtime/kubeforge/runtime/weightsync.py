"""Weight sync: trainer rank 0 broadcasts new policy weights to every generator's engine worker(s).

API::

    world_size(generators=G, tensor_parallel_size=T) -> int            # 1 + G*T
    rank_base(generator_index=g, tensor_parallel_size=T) -> int        # 1 + g*T; worker rank = base + tp_rank
    sender = WeightSender(host=..., port=..., world_size=..., timeout=..., join_timeout=...)  # trainer rank 0
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

Neighbours: the trainer's rank 0 owns a ``WeightSender``; ``generator.extension`` owns a ``WeightReceiver`` inside
each vLLM worker (reached through ``collective_rpc``); the role loops tell generators over ZeroMQ when to call in.

The group is private: a ``TCPStore`` served by rank 0 (port ``contract.PORT_WEIGHTS`` of trainer 0) plus a
``ProcessGroupGloo`` (``ProcessGroupNCCL`` with GPUs) built directly on it, never through
``torch.distributed.init_process_group``, so it leaves vLLM's own groups and the trainers' data-parallel group
alone. Ranks: the sender is 0, generator ``g``'s worker with TP rank ``t`` is ``1 + g*T + t``.

One sync, every step a collective over the whole group::

    rank 0 (sender)                            ranks 1..N (receivers)
    header  int64[MAGIC, PROTOCOL, version, len(meta)]  ──broadcast──▶ check magic/protocol
    meta    uint8[JSON: names, shapes, dtypes,        ──broadcast──▶ validate, plan buffers
            bucket/offset of each tensor]
    bucket 0..B-1  uint8 buffers (~bucket_mb each;    ──broadcast──▶ views handed to load() as they arrive
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

import dataclasses
import hashlib
import hmac
import os
import datetime
import json
import math
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Protocol, runtime_checkable

import torch
import torch.distributed as dist

from kubeforge.api import contract

MAGIC = 0x4B46_5753  # "KFWS"
PROTOCOL = 1
ALIGN = 16  # bytes; every tensor starts at a multiple of this inside its bucket
DEFAULT_BUCKET_MB = 64
MAX_META_BYTES = 16 << 20  # JSON metadata: ~100 bytes per tensor; a 70B model has a few thousand tensors
MAX_TENSORS = 1 << 16      # tensors per sync
MAX_NAME_CHARS = 1024
MAX_DIMS = 8
DEFAULT_JOIN_TIMEOUT = 600.0  # generators join between rollout batches, maybe long after the trainer
JOIN_KEY, ALL_JOINED_KEY, ABANDONED_KEY = "joined", "all-joined", "abandoned"   # under the epoch's prefix
CLOSED_KEY = "closed"       # under the epoch's prefix: the sender closed (receivers waiting in the store stop)
LIVE_KEY = "receivers-live"  # under the epoch's prefix: receivers joined, not closed, not yet told of the close
DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "float64": torch.float64,
    "int64": torch.int64, "int32": torch.int32, "int8": torch.int8, "uint8": torch.uint8, "bool": torch.bool,
}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}

Loader = Callable[[Iterator[tuple[str, torch.Tensor]]], None]
Preparer = Callable[["Staged"], Any]


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

    @property
    def gb_per_s(self) -> float:
        """Payload throughput in GB/s (10^9 bytes)."""
        return self.bytes / self.seconds / 1e9 if self.seconds > 0 else 0.0

    def as_dict(self) -> dict[str, float | int | bool]:
        return {**dataclasses.asdict(self), "gb_per_s": self.gb_per_s}


def world_size(*, generators: int, tensor_parallel_size: int) -> int:
    """Size of the weight-sync group: trainer rank 0 plus every generator worker."""
    return 1 + generators * tensor_parallel_size


def rank_base(*, generator_index: int, tensor_parallel_size: int) -> int:
    """Rank of generator ``generator_index``'s TP rank 0 worker; its TP rank ``t`` worker is ``base + t``."""
    return 1 + generator_index * tensor_parallel_size


# ---------------------------------------------------------------- the process group


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
        self.root: Any = store if store is not None else open_store(host=host, port=port, rank=rank,
                                                                      join_timeout=join_timeout)
        self.store: Any = dist.PrefixStore(epoch_prefix(epoch), self.root)  # type: ignore[attr-defined]
        _barrier(self.store, world_size, timeout=join_timeout)  # everyone is here: the group connects within `timeout`
        key = auth_key if auth_key is not None else job_key_from_env()
        if key is not None:   # no weights flow between parties that cannot prove they hold the job key
            authenticate(self.store, rank=rank, world_size=world_size, key=key)
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


def epoch_prefix(epoch: int) -> str:
    return f"kubeforge/epoch-{epoch}/"


def open_store(*, host: str, port: int, rank: int, join_timeout: float) -> Any:
    """The weight-sync store: served by rank 0, a client elsewhere."""
    return dist.TCPStore(  # type: ignore[attr-defined]
        host, port, None, rank == 0, timeout=datetime.timedelta(seconds=join_timeout), wait_for_workers=False)


BARRIER_POLL_SECONDS = 0.05


def _barrier(store: Any, world_size: int, *, timeout: float) -> None:
    """Wait (at most ``timeout``) until all ``world_size`` ranks reached the store; an abandoned epoch ends the
    wait at once."""
    if store.check([ABANDONED_KEY]):
        raise WeightSyncError("weight sync: this epoch was abandoned (the membership re-formed)")
    if store.add(JOIN_KEY, 1) == world_size:
        store.set(ALL_JOINED_KEY, b"1")
    deadline = time.monotonic() + timeout
    while not store.check([ALL_JOINED_KEY]):
        if store.check([ABANDONED_KEY]):
            raise WeightSyncError("weight sync: this epoch was abandoned (the membership re-formed)")
        if time.monotonic() > deadline:
            raise WeightSyncError(f"weight sync: not every rank joined within {timeout:.0f}s")
        time.sleep(BARRIER_POLL_SECONDS)


def job_key_from_env() -> bytes | None:
    """The job key of the env contract (``KUBEFORGE_JOB_KEY``). Read here because the receiving end runs inside
    vLLM's worker processes, which inherit the generator's environment but not its parsed config."""
    raw = os.environ.get(contract.ENV_JOB_KEY, "")
    try:
        return bytes.fromhex(raw) or None
    except ValueError:
        raise WeightSyncError(f"weight sync: {contract.ENV_JOB_KEY} is not hex") from None


def _mac(key: bytes, *parts: bytes) -> bytes:
    k = hmac.new(key, b"kubeforge/weightsync", hashlib.sha256).digest()
    return hmac.new(k, b"|".join(parts), hashlib.sha256).digest()


def authenticate(store: Any, *, rank: int, world_size: int, key: bytes) -> None:
    """Mutual proof of the job key over the rendezvous store, before any process group forms: rank 0 publishes a
    nonce; each joiner answers with its own nonce and an HMAC over both; rank 0 checks every answer and returns an
    HMAC of its own, which the joiner checks. A joiner without the key is refused by rank 0; a store that is not
    our trainer's (or a trainer without the key) is refused by the joiner. WeightSyncError either way."""
    if rank == 0:
        n0 = os.urandom(16)
        store.set("auth/n0", n0)
        for r in range(1, world_size):
            got = bytes(store.get(f"auth/{r}"))
            nr, mac = got[:16], got[16:]
            if not hmac.compare_digest(mac, _mac(key, b"joiner", n0, nr, str(r).encode())):
                store.set(f"auth/ok/{r}", b"refused")
                raise WeightSyncError(f"weight sync: rank {r} failed rendezvous authentication (not the job key)")
            store.set(f"auth/ok/{r}", _mac(key, b"sender", nr, n0, str(r).encode()))
        return
    n0 = bytes(store.get("auth/n0"))
    nr = os.urandom(16)
    store.set(f"auth/{rank}", nr + _mac(key, b"joiner", n0, nr, str(rank).encode()))
    proof = bytes(store.get(f"auth/ok/{rank}"))
    if not hmac.compare_digest(proof, _mac(key, b"sender", nr, n0, str(rank).encode())):
        raise WeightSyncError("weight sync: the rendezvous did not prove the job key (not our trainer)")


def _open(*, host: str, port: int, world_size: int, rank: int, timeout: float, join_timeout: float,
          backend: str, epoch: int = 0, store: Any = None) -> TorchGroup:
    try:
        return TorchGroup(host=host, port=port, world_size=world_size, rank=rank, timeout=timeout,
                          join_timeout=join_timeout, backend=backend, epoch=epoch, store=store)
    except (RuntimeError, dist.DistError) as e:
        if isinstance(e, WeightSyncError):
            raise
        raise WeightSyncError(f"weight sync: rank {rank} could not join {host}:{port} (world {world_size}, epoch "
                              f"{epoch}): {e}") from e


# ---------------------------------------------------------------- planning and metadata (pure)


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def plan_buckets(sizes: list[int], *, bucket_bytes: int) -> list[tuple[int, int]]:
    """Place tensors of ``sizes`` bytes into buckets, in order: (bucket index, byte offset) per tensor.

    Consecutive tensors share a bucket while it stays within ``bucket_bytes``; a tensor larger than that travels
    alone. Offsets are aligned to :data:`ALIGN` so every view is aligned for its dtype.
    """
    out: list[tuple[int, int]] = []
    bucket, used = -1, 0
    for size in sizes:
        start = _aligned(used)
        if bucket < 0 or start + size > bucket_bytes:
            bucket, start = bucket + 1, 0
        out.append((bucket, start))
        used = start + size
    return out


def encode_meta(*, version: int, entries: list[dict[str, Any]], bucket_sizes: list[int]) -> bytes:
    return json.dumps({"version": version, "tensors": entries, "buckets": bucket_sizes},
                      separators=(",", ":")).encode()


def decode_meta(raw: bytes) -> tuple[int, list[dict[str, Any]], list[int]]:
    """Parse and validate the metadata message; raise WeightSyncError naming what is wrong."""
    try:
        doc = json.loads(raw.decode())
        version, entries, buckets = int(doc["version"]), list(doc["tensors"]), [int(b) for b in doc["buckets"]]
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as e:
        raise WeightSyncError(f"weight sync: malformed metadata: {e}") from e
    if len(entries) > MAX_TENSORS or len(buckets) > len(entries):
        raise WeightSyncError(f"weight sync: {len(entries)} tensors in {len(buckets)} buckets exceed the bounds "
                              f"({MAX_TENSORS} tensors, every bucket holding at least one)")
    extent = [0] * len(buckets)
    for i, entry in enumerate(entries):
        if (not isinstance(entry, dict) or not isinstance(entry.get("name"), str)
                or len(entry["name"]) > MAX_NAME_CHARS or not isinstance(entry.get("shape"), list)
                or len(entry["shape"]) > MAX_DIMS or any(type(d) is not int or d < 0 for d in entry["shape"])):
            raise WeightSyncError(f"weight sync: metadata entry {i} has a bad name or shape")
        try:
            numel = 1
            for d in entry["shape"]:
                numel *= int(d)
            nbytes = numel * torch.empty((), dtype=DTYPES[entry["dtype"]]).element_size()
            off = entry["offset"]
            ok = (isinstance(entry["name"], str) and 0 <= entry["bucket"] < len(buckets)
                  and off % ALIGN == 0 and 0 <= off and off + nbytes <= buckets[entry["bucket"]])
        except (KeyError, TypeError, ValueError) as err:
            raise WeightSyncError(f"weight sync: malformed metadata entry {i}: {err}") from err
        if not ok:
            raise WeightSyncError(f"weight sync: metadata entry {i} ({entry.get('name')!r}) is out of bounds")
        extent[entry["bucket"]] = max(extent[entry["bucket"]], off + nbytes)
    if extent != buckets:   # a bucket is exactly as large as the tensors placed in it: no allocation beyond them
        raise WeightSyncError(f"weight sync: bucket sizes {buckets[:8]} do not match their tensors {extent[:8]}")
    return version, entries, buckets


@runtime_checkable
class TensorMeta(Protocol):
    """What a receiver must know of a tensor before it arrives."""

    @property
    def name(self) -> str: ...
    @property
    def shape(self) -> tuple[int, ...]: ...
    @property
    def dtype(self) -> torch.dtype: ...


@runtime_checkable
class TensorStream(Protocol):
    """Named tensors produced lazily, described up front by ``meta`` (same order, same names, shapes, dtypes)."""

    @property
    def meta(self) -> Sequence[TensorMeta]: ...
    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]: ...


@dataclasses.dataclass(frozen=True)
class _Meta:
    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype


class _ListStream:
    """A ``TensorStream`` over tensors already in memory."""

    def __init__(self, tensors: list[tuple[str, torch.Tensor]]) -> None:
        self.tensors = tensors
        self.meta = [_Meta(n, tuple(t.shape), t.dtype) for n, t in tensors]

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        return iter(self.tensors)


def _unique(named: Iterable[tuple[str, torch.Tensor]]) -> list[tuple[str, torch.Tensor]]:
    """Detached, contiguous CPU/GPU tensors; a tensor sharing storage with an earlier one (a tied weight) is
    sent once, under its first name."""
    seen: set[tuple[int, tuple[int, ...]]] = set()
    out = []
    for name, t in named:
        key = (t.data_ptr(), tuple(t.shape))
        if key in seen:
            continue
        seen.add(key)
        out.append((name, t.detach().contiguous()))
    return out


class BucketBuffers:
    """One set of bucket buffers per layout: allocated when the bucket sizes (or device) change, reused otherwise."""

    def __init__(self) -> None:
        self.layout: tuple[str, tuple[int, ...]] | None = None
        self.buffers: list[torch.Tensor] = []
        self.allocations = 0     # how many times a layout was allocated (tests: once per layout)

    def get(self, sizes: Sequence[int], device: torch.device) -> list[torch.Tensor]:
        key = (str(device), tuple(int(x) for x in sizes))
        if key != self.layout:
            self.buffers = []      # release the old layout before allocating the new one
            self.buffers = [torch.empty(n, dtype=torch.uint8, device=device) for n in key[1]]
            self.layout = key
            self.allocations += 1
        return self.buffers


@dataclasses.dataclass(frozen=True, kw_only=True)
class Prepared:
    """A sync packed and ready to broadcast: the sender's buffers hold a snapshot of the tensors."""

    version: int
    meta: bytes
    buckets: list[torch.Tensor]
    bytes: int
    tensors: int
    pack_seconds: float


class InFlight:
    """A sync broadcasting in a background thread; :meth:`result` joins it."""

    def __init__(self, run: Callable[[], SyncStats], *, version: int) -> None:
        self.version = version
        self._stats: SyncStats | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(run,), name=f"weightsync-v{version}", daemon=True)
        self._thread.start()

    def _run(self, run: Callable[[], SyncStats]) -> None:
        try:
            self._stats = run()
        except BaseException as e:  # noqa: BLE001 - handed to the joining thread
            self._error = e

    def done(self) -> bool:
        return not self._thread.is_alive()

    def result(self, timeout: float | None = None) -> SyncStats:
        """The sync's stats once the broadcast and every receiver's ack completed; WeightSyncError otherwise. The
        broadcast itself is bounded by the group's timeout, so the join is too."""
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise WeightSyncError(f"weight sync v{self.version}: still broadcasting after {timeout}s")
        if self._error is not None:
            if isinstance(self._error, WeightSyncError):
                raise self._error
            raise WeightSyncError(f"weight sync v{self.version} failed: {self._error}") from self._error
        assert self._stats is not None
        return self._stats


# ---------------------------------------------------------------- the two ends


class WeightSender:
    """Trainer rank 0's end. ``send`` joins the group on first use (blocks until every receiver joined)."""

    def __init__(self, *, host: str, port: int, world_size: int, timeout: float = 120.0,
                 join_timeout: float = DEFAULT_JOIN_TIMEOUT, backend: str = "gloo",
                 bucket_mb: float = DEFAULT_BUCKET_MB) -> None:
        if world_size < 2:
            raise ValueError("weight sync: world_size must count the sender and at least one receiver")
        self._args = dict(host=host, port=port, world_size=world_size, rank=0, timeout=timeout,
                          join_timeout=join_timeout, backend=backend)
        self._host, self._port, self._join_timeout = host, port, join_timeout
        self.bucket_bytes = max(ALIGN, int(bucket_mb * (1 << 20)))
        self.group: Group | None = None
        self.epoch = 0
        self._store: Any = None
        self.buffers = BucketBuffers()      # overlapped syncs: the snapshot, one buffer per bucket
        self.staging = BucketBuffers()      # streaming syncs: one bucket-sized buffer
        self._flight: InFlight | None = None

    def connect(self) -> None:
        if self.group is None:
            if self._store is None:
                self._store = open_store(host=self._host, port=self._port, rank=0, join_timeout=self._join_timeout)
            self.group = _open(**self._args, epoch=self.epoch, store=self._store)  # type: ignore[arg-type]

    @property
    def world_size(self) -> int:
        return int(str(self._args["world_size"]))

    def reset(self, *, world_size: int | None = None) -> int:
        """Abandon the current epoch (its group is closed; anyone still joining it fails at once); the next
        ``send`` forms the next epoch, of ``world_size`` ranks when given (generators joined or left). Returns the
        new epoch."""
        self.wait()
        if world_size is not None:
            if world_size < 2:
                raise ValueError("weight sync: world_size must count the sender and at least one receiver")
            self._args["world_size"] = world_size
        if self._store is not None:
            try:
                prefixed: Any = dist.PrefixStore(epoch_prefix(self.epoch), self._store)  # type: ignore[attr-defined]
                prefixed.set(ABANDONED_KEY, b"1")
            except (RuntimeError, dist.DistError):
                pass
        if self.group is not None:
            self.group.close()
            self.group = None
        self.epoch += 1
        return self.epoch

    def send(self, named_tensors: Iterable[tuple[str, torch.Tensor]] | TensorStream, *,
             version: int) -> SyncStats:
        """Broadcast the tensors (HF names) as policy ``version``; return once every receiver has loaded them.

        Streaming: the metadata goes out first, then each tensor is produced (e.g. gathered from shards) only when
        its bucket is packed, into one reusable staging buffer (a tensor bigger than a bucket travels alone,
        uncopied), so at most one bucket is materialised. A plain iterable is listed first (tied weights once)."""
        self.wait()
        self.connect()
        assert self.group is not None
        group = self.group
        stream = named_tensors if isinstance(named_tensors, TensorStream) else _ListStream(_unique(named_tensors))
        metas, places, bucket_sizes, meta = self._plan(stream, version)
        staging = self.staging.get([max(bucket_sizes, default=0)], group.device)[0]
        return self._collectives(group, version, meta, _buckets(iter(stream), metas, places, bucket_sizes, staging),
                                 bytes=sum(_nbytes(m) for m in metas), tensors=len(metas), buckets=len(bucket_sizes))

    def _collectives(self, group: Group, version: int, meta: bytes, payload: Iterable[torch.Tensor],
                     **figures: int) -> SyncStats:
        """Header, metadata, every bucket, then the receivers' ack; the stats, or WeightSyncError."""
        start = time.perf_counter()
        try:
            announce(group)
            self._header(group, version, meta)
            for buf in payload:
                group.broadcast(buf)
            failures, count = self._ack(group)
        except (RuntimeError, dist.DistError) as e:
            if isinstance(e, WeightSyncError):
                raise
            raise WeightSyncError(f"weight sync v{version} failed: {e}") from e
        return self._stats(group, version, failures, count, seconds=time.perf_counter() - start, **figures)

    def _plan(self, stream: TensorStream, version: int) -> tuple[list[TensorMeta], list[tuple[int, int]], list[int],
                                                                   bytes]:
        metas = list(stream.meta)
        sizes = [_nbytes(m) for m in metas]
        places = plan_buckets(sizes, bucket_bytes=self.bucket_bytes)
        nb = places[-1][0] + 1 if places else 0
        bucket_sizes = [0] * nb
        for (b, off), size in zip(places, sizes):
            bucket_sizes[b] = max(bucket_sizes[b], off + size)
        entries = [{"name": m.name, "shape": list(m.shape), "dtype": _dtype_name(m.dtype), "bucket": b,
                    "offset": off} for m, (b, off) in zip(metas, places)]
        return metas, places, bucket_sizes, encode_meta(version=version, entries=entries, bucket_sizes=bucket_sizes)

    @staticmethod
    def _header(group: Group, version: int, meta: bytes) -> None:
        group.broadcast(torch.tensor([MAGIC, PROTOCOL, version, len(meta)], dtype=torch.int64, device=group.device))
        group.broadcast(torch.frombuffer(bytearray(meta), dtype=torch.uint8).to(group.device))

    @staticmethod
    def _ack(group: Group) -> tuple[int, int]:
        ack = torch.zeros(2, dtype=torch.int64, device=group.device)
        group.all_reduce_sum(ack)
        return int(ack[0]), int(ack[1])

    @staticmethod
    def _stats(group: Group, version: int, failures: int, count: int, **figures: Any) -> SyncStats:
        if failures or count != group.size - 1:
            raise WeightSyncError(f"weight sync v{version}: {failures} of {group.size - 1} receivers failed to "
                                  f"load ({count} acked)")
        return SyncStats(version=version, **figures)

    def start(self, named_tensors: Iterable[tuple[str, torch.Tensor]] | TensorStream, *,
              version: int) -> InFlight:
        """Snapshot the tensors into the send buffers now (the caller may update its parameters as soon as this
        returns), then broadcast them in a background thread; :meth:`InFlight.result` joins it."""
        prepared = self.prepare(named_tensors, version=version)
        flight = InFlight(lambda: self.broadcast(prepared), version=version)
        self._flight = flight
        return flight

    def wait(self) -> None:
        """Join the sync in flight, if any (its outcome belongs to whoever holds its :class:`InFlight`)."""
        flight, self._flight = self._flight, None
        if flight is not None:
            try:
                flight.result()
            except WeightSyncError:
                pass

    def prepare(self, named_tensors: Iterable[tuple[str, torch.Tensor]] | TensorStream, *,
                version: int) -> Prepared:
        """Plan the buckets and pack every tensor into this sender's per-layout buffers (one copy: the snapshot,
        a whole model's worth of memory, kept for the next sync of the same layout)."""
        self.wait()
        self.connect()
        assert self.group is not None
        start = time.perf_counter()
        stream = named_tensors if isinstance(named_tensors, TensorStream) else _ListStream(_unique(named_tensors))
        metas, places, bucket_sizes, meta = self._plan(stream, version)
        buffers = self.buffers.get(bucket_sizes, self.group.device)
        _pack(iter(stream), metas, places, buffers)
        return Prepared(version=version, meta=meta, buckets=buffers, bytes=sum(_nbytes(m) for m in metas),
                        tensors=len(metas), pack_seconds=time.perf_counter() - start)

    def broadcast(self, prepared: Prepared) -> SyncStats:
        """The collectives of one prepared sync: header, metadata, buckets, then the receivers' ack."""
        self.connect()
        assert self.group is not None
        return self._collectives(self.group, prepared.version, prepared.meta, prepared.buckets,
                                 bytes=prepared.bytes, tensors=prepared.tensors, buckets=len(prepared.buckets))

    def close(self) -> None:
        """Join the sync in flight and close the group; receivers prefetching in the store see the epoch closed and
        stop polling before the store (served here) goes away."""
        self.wait()
        if self._store is not None and self.group is not None:
            try:
                prefixed: Any = dist.PrefixStore(epoch_prefix(self.epoch), self._store)  # type: ignore[attr-defined]
                prefixed.set(CLOSED_KEY, b"1")
                deadline = time.monotonic() + CLOSE_WAIT_SECONDS
                while int(prefixed.add(LIVE_KEY, 0)) > 0 and time.monotonic() < deadline:
                    time.sleep(PREFETCH_POLL_SECONDS / 2)
            except (RuntimeError, dist.DistError):
                pass
        if self.group is not None:
            self.group.close()
            self.group = None


def _dtype_name(dtype: torch.dtype) -> str:
    if dtype not in DTYPE_NAMES:
        raise WeightSyncError(f"weight sync: dtype {dtype} cannot be sent")
    return DTYPE_NAMES[dtype]


def _nbytes(m: TensorMeta) -> int:
    return math.prod(m.shape) * torch.empty((), dtype=m.dtype).element_size()


def _buckets(tensors: Iterator[tuple[str, torch.Tensor]], metas: list[TensorMeta], places: list[tuple[int, int]],
             sizes: list[int], staging: torch.Tensor) -> Iterator[torch.Tensor]:
    """The bucket buffers in order, filled from ``tensors`` as they come (checked against ``metas``): a lone tensor
    travels as itself, uncopied; shared buckets are packed into ``staging`` (reused: each broadcast completes
    before the next bucket is packed)."""
    i = 0
    for bucket, size in enumerate(sizes):
        members = []
        while i < len(metas) and places[i][0] == bucket:
            members.append((_checked(next(tensors, (None, None)), metas[i], i).to(staging.device), places[i][1]))
            i += 1
        if len(members) == 1 and members[0][1] == 0:
            yield members[0][0].reshape(-1).view(torch.uint8)
            continue
        buf = staging[:size]
        for t, off in members:
            flat = t.reshape(-1).view(torch.uint8)
            buf[off:off + flat.numel()].copy_(flat)
        yield buf


def _checked(item: tuple[str | None, torch.Tensor | None], m: TensorMeta, i: int) -> torch.Tensor:
    name, t = item
    if t is None or name != m.name or tuple(t.shape) != tuple(m.shape) or t.dtype != m.dtype:
        raise WeightSyncError(f"weight sync: tensor {i} is {name!r} {getattr(t, 'shape', None)} "
                              f"{getattr(t, 'dtype', None)}, its metadata said {m.name!r} {m.shape} {m.dtype}")
    return t.detach().contiguous()


def _pack(tensors: Iterator[tuple[str, torch.Tensor]], metas: list[TensorMeta], places: list[tuple[int, int]],
          buffers: list[torch.Tensor]) -> None:
    """Copy each tensor of ``tensors`` (checked against ``metas``) into its place in ``buffers``, as it comes."""
    for i, (m, (bucket, off)) in enumerate(zip(metas, places)):
        flat = _checked(next(tensors, (None, None)), m, i).reshape(-1).view(torch.uint8)
        buffers[bucket][off:off + flat.numel()].copy_(flat)


SYNCS_KEY = "syncs"            # under the epoch's prefix: how many syncs the sender has begun in this epoch
PREFETCH_POLL_SECONDS = 0.02
CLOSE_WAIT_SECONDS = 2.0   # the sender's close waits at most this long for live receivers to see it (then goes)


def announce(group: Group) -> None:
    """Sender: count one more sync in the epoch's store before its header, so a receiver waiting in the background
    (``WeightReceiver.prefetch``) enters the collectives only when there is one (no collective waits between syncs,
    where the group's short timeout would expire)."""
    store = getattr(group, "store", None)
    if store is not None:
        store.add(SYNCS_KEY, 1)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Staged:
    """One sync received into the receiver's buffers and acknowledged, not yet loaded (while the prefetch's
    ``prepare`` runs, still arriving: ``tensors`` then waits for each bucket)."""

    version: int
    entries: list[dict[str, Any]]
    buffers: list[torch.Tensor]
    bytes: int
    seconds: float            # header to last bucket
    prepared: Any = None      # what the prefetch's ``prepare`` returned (None: none given, or it declined)
    prepare_error: BaseException | None = None   # what it raised (the received bytes are still staged)
    prepare_seconds: float = 0.0
    prepare_wait_seconds: float = 0.0   # of prepare_seconds: waiting for buckets still on the wire
    ready_seconds: float = 0.0          # header to received whole and prepared
    arrivals: _Arrivals | None = dataclasses.field(default=None, repr=False, compare=False)  # while arriving

    def tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """(HF name, view into the buffers): valid until the receiver's next sync. While the sync is still
        arriving (inside ``prepare``), each bucket's tensors come once that bucket has landed (bounded by the
        group's timeout; a broken receive raises ``WeightSyncError``)."""
        for e in self.entries:
            if self.arrivals is not None:
                self.arrivals.wait(e["bucket"])
            dtype = DTYPES[e["dtype"]]
            n = torch.Size(e["shape"]).numel() * torch.empty((), dtype=dtype).element_size()
            yield e["name"], self.buffers[e["bucket"]][e["offset"]:e["offset"] + n].view(dtype).view(e["shape"])


class _Arrivals:
    """The buckets of one prefetched sync, all enqueued at once as asynchronous broadcasts (the backend receives
    them in its own threads, in order) so the prefetch thread can prepare the buckets that have landed while the
    rest is on the wire. ``wait(b)`` returns once buckets 0..b have arrived; the last arrival acks the sync
    (received whole: the sender is free before the preparation ends). Every wait is bounded by the group's
    timeout; the first failure is kept and raised by every later wait."""

    def __init__(self, group: Group, buffers: list[torch.Tensor], start: float) -> None:
        self.group, self.start = group, start
        self.waits = [group.broadcast_async(buf) for buf in buffers]
        self.arrived = 0
        self.acked = False
        self.seconds = 0.0      # header to the last bucket
        self.waited = 0.0       # time spent blocked in wait()
        self.error: WeightSyncError | None = None

    def wait(self, bucket: int) -> None:
        if self.error is not None:
            raise self.error
        if self.arrived > bucket and (self.acked or self.arrived < len(self.waits)):
            return
        started = time.perf_counter()
        try:
            while self.arrived <= bucket:
                self.waits[self.arrived]()
                self.arrived += 1
            if self.arrived == len(self.waits) and not self.acked:
                self.seconds = time.perf_counter() - self.start
                self.group.all_reduce_sum(torch.tensor([0, 1], dtype=torch.int64, device=self.group.device))
                self.acked = True
        except (RuntimeError, dist.DistError) as e:
            self.error = e if isinstance(e, WeightSyncError) else WeightSyncError(
                f"weight sync receive failed on rank {self.group.rank} after {self.arrived} of {len(self.waits)} "
                f"buckets: {e}")
            raise self.error from e
        finally:
            self.waited += time.perf_counter() - started

    def finish(self) -> None:
        """Wait for whatever has not arrived yet and ack (WeightSyncError when the receive failed)."""
        self.wait(len(self.waits) - 1)


class WeightReceiver:
    """A generator worker's end. ``receive`` blocks until the sender's next sync and hands tensors to ``load``.

    Prefetch (``prefetch`` / ``take``): a background thread waits for the next sync (polling the epoch's sync count
    in the store, not in a collective) and receives it whole into the reusable buffers while the engine keeps
    generating (its ``prepare`` consuming each bucket as it lands); ``take`` joins it and hands over the staged sync, so loading is all that is left for the pause.
    The staged buffers stay valid until the next ``prefetch``/``receive``: start the next prefetch only after the
    staged tensors are loaded."""

    def __init__(self, *, host: str, port: int, world_size: int, rank: int, timeout: float = 120.0,
                 join_timeout: float = DEFAULT_JOIN_TIMEOUT, backend: str = "gloo", epoch: int = 0) -> None:
        if rank < 1:
            raise ValueError("weight sync: receivers have ranks >= 1 (rank 0 is the trainer)")
        self.group: Group = _open(host=host, port=port, world_size=world_size, rank=rank, timeout=timeout,
                                  join_timeout=join_timeout, backend=backend, epoch=epoch)
        self.buffers = BucketBuffers()
        self.seen = 0                      # syncs of this epoch received so far
        self._live = self._count_live(1)   # counted among the epoch's live receivers (the sender's close waits)
        self._stop = threading.Event()
        self._prefetch: threading.Thread | None = None
        self._staged: Staged | None = None
        self._error: BaseException | None = None

    def receive(self, load: Loader) -> SyncStats:
        """Receive one sync; ``load`` gets an iterator of (HF name, tensor) that receives buckets lazily."""
        if self._prefetch is not None:   # one was prefetched: load it (same stats, same errors)
            return self.load_staged(self.take(), load)
        group = self.group
        start = time.perf_counter()
        try:
            version, entries, buckets = self._begin(group)
            stream = _BucketStream(group, entries, self.buffers.get(buckets, group.device))
            error: BaseException | None = None
            try:
                load(iter(stream))
            except Exception as e:  # noqa: BLE001 - reported to the sender through the ack, then re-raised
                error = e
            stream.drain()
            group.all_reduce_sum(torch.tensor([1 if error else 0, 1], dtype=torch.int64, device=group.device))
        except (RuntimeError, dist.DistError) as e:
            if isinstance(e, WeightSyncError):
                raise
            raise WeightSyncError(f"weight sync receive failed on rank {group.rank}: {e}") from e
        if error is not None:
            raise WeightSyncError(f"weight sync v{version}: loading failed: {error}") from error
        return SyncStats(version=version, bytes=stream.bytes, seconds=time.perf_counter() - start,
                         tensors=len(entries), buckets=len(buckets))

    def _begin(self, group: Group) -> tuple[int, list[dict[str, Any]], list[int]]:
        """Header and metadata of the next sync."""
        header = torch.zeros(4, dtype=torch.int64, device=group.device)
        group.broadcast(header)
        magic, proto, version, meta_len = (int(x) for x in header.tolist())
        if magic != MAGIC or proto != PROTOCOL or not 0 < meta_len <= MAX_META_BYTES:
            raise WeightSyncError(f"weight sync: bad header {header.tolist()} (protocol {PROTOCOL} expected)")
        raw = torch.empty(meta_len, dtype=torch.uint8, device=group.device)
        group.broadcast(raw)
        meta_version, entries, buckets = decode_meta(bytes(raw.cpu().numpy()))
        self.seen += 1
        return meta_version, entries, buckets

    # ------------------------------------------------------------ prefetch

    def prefetch(self, prepare: Preparer | None = None) -> None:
        """Start receiving the next sync in the background (no-op while one is prefetching or staged). Once its
        metadata is in, every bucket is enqueued and ``prepare(staged)`` runs in the same thread while they land
        (``staged.tensors()`` waits for each bucket: the preparation is pipelined with the wire); the last bucket
        acks the sync. Its result (or error) travels in the ``Staged`` that ``take`` returns; a receive that breaks
        under it fails the prefetch instead."""
        if self._prefetch is not None:
            return
        self._staged, self._error = None, None
        self._stop.clear()
        self._prefetch = threading.Thread(target=self._prefetch_run, args=(prepare,), name="weightsync-prefetch",
                                          daemon=True)
        self._prefetch.start()

    @property
    def prefetching(self) -> bool:
        """A prefetch was started and not yet taken."""
        return self._prefetch is not None

    @property
    def staged(self) -> bool:
        """A prefetched sync is in the buffers, prepared (``take`` will not wait)."""
        return self._prefetch is not None and not self._prefetch.is_alive()

    def _prefetch_run(self, prepare: Preparer | None) -> None:
        group = self.group
        try:
            store = getattr(group, "store", None)
            while store is not None and int(store.add(SYNCS_KEY, 0)) <= self.seen:
                if self._stop.is_set():
                    return
                if store.check([ABANDONED_KEY]):
                    raise WeightSyncError("weight sync: this epoch was abandoned (the membership re-formed)")
                if store.check([CLOSED_KEY]):
                    if self._live:
                        self._live = not self._count_live(-1)   # seen: the sender may go (and its store with it)
                    raise WeightSyncError("weight sync: the sender closed the group")
                time.sleep(PREFETCH_POLL_SECONDS)
            start = time.perf_counter()
            version, entries, buckets = self._begin(group)
            buffers = self.buffers.get(buckets, group.device)
            nbytes = sum(torch.Size(e["shape"]).numel() * torch.empty((), dtype=DTYPES[e["dtype"]]).element_size()
                         for e in entries)
            arrivals = _Arrivals(group, buffers, start)   # every bucket enqueued: the wire runs on its own
            staged = Staged(version=version, entries=entries, buffers=buffers, bytes=nbytes, seconds=0.0,
                            arrivals=arrivals)
            prepared, error, prepare_s = None, None, 0.0
            if prepare is not None:   # pipelined: it consumes each bucket as it lands
                started = time.perf_counter()
                try:
                    prepared = prepare(staged)
                except Exception as e:  # noqa: BLE001 - handed to ``take`` with the staged sync
                    error = e
                prepare_s = time.perf_counter() - started
            waited = arrivals.waited
            # received whole (the rest waited for here) and acked: a failed receive fails the prefetch, whatever
            # the preparation made of the part it saw; a failed load is reported by the role's ACK
            arrivals.finish()
            staged = dataclasses.replace(staged, seconds=arrivals.seconds, prepared=prepared, prepare_error=error,
                                         prepare_seconds=prepare_s, prepare_wait_seconds=waited,
                                         ready_seconds=time.perf_counter() - start, arrivals=None)
        except BaseException as e:  # noqa: BLE001 - handed to ``take``
            self._error = e
            return
        self._staged = staged

    def take(self, timeout: float | None = None) -> Staged:
        """The prefetched sync (waits for it, at most ``timeout``; the collectives inside are bounded by the
        group's own timeout); WeightSyncError when the receive failed or none was started."""
        thread = self._prefetch
        if thread is None:
            raise WeightSyncError("weight sync: take() without prefetch()")
        thread.join(timeout)
        if thread.is_alive():
            raise WeightSyncError(f"weight sync: no sync arrived within {timeout}s")
        self._prefetch = None
        error, staged = self._error, self._staged
        self._error = self._staged = None
        if error is not None:
            if isinstance(error, WeightSyncError):
                raise error
            raise WeightSyncError(f"weight sync receive failed on rank {self.group.rank}: {error}") from error
        if staged is None:
            raise WeightSyncError("weight sync: the prefetch was stopped")
        return staged

    @staticmethod
    def load_staged(staged: Staged, load: Loader) -> SyncStats:
        """Hand a staged sync to ``load``; ``seconds`` is the load's own time (the generation pause)."""
        start = time.perf_counter()
        try:
            load(staged.tensors())
        except Exception as e:
            raise WeightSyncError(f"weight sync v{staged.version}: loading failed: {e}") from e
        return SyncStats(version=staged.version, bytes=staged.bytes, seconds=time.perf_counter() - start,
                         tensors=len(staged.entries), buckets=len(staged.buffers), receive_seconds=staged.seconds,
                         prepare_seconds=staged.prepare_seconds, prepare_wait_seconds=staged.prepare_wait_seconds,
                         ready_seconds=staged.ready_seconds)

    def _count_live(self, delta: int) -> bool:
        store = getattr(self.group, "store", None)
        if store is None:
            return False
        try:
            store.add(LIVE_KEY, delta)
        except (RuntimeError, dist.DistError):
            return False
        return True

    def close(self) -> None:
        self._stop.set()
        thread, self._prefetch = self._prefetch, None
        if thread is not None:
            thread.join(1.0)   # waiting in the store: returns within a poll; inside collectives: closing breaks it
        if self._live:         # not told of a close: the sender may still be there (never after it went: no store)
            self._live = not self._count_live(-1)
        self.group.close()
        if thread is not None:
            thread.join(5.0)


class _BucketStream:
    """Receives buckets in order, into the receiver's reusable buffers, as the loader iterates; ``drain``
    receives whatever the loader left."""

    def __init__(self, group: Group, entries: list[dict[str, Any]], buffers: list[torch.Tensor]) -> None:
        self.group, self.entries, self.buffers = group, entries, buffers
        self.received = 0
        self.bytes = 0

    def _next_bucket(self) -> torch.Tensor:
        buf = self.buffers[self.received]
        self.group.broadcast(buf)
        self.received += 1
        return buf

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        by_bucket: dict[int, list[dict[str, Any]]] = {}
        for e in self.entries:
            by_bucket.setdefault(e["bucket"], []).append(e)
        while self.received < len(self.buffers):
            b = self.received
            buf = self._next_bucket()
            for e in by_bucket.get(b, []):
                dtype = DTYPES[e["dtype"]]
                n = torch.Size(e["shape"]).numel() * torch.empty((), dtype=dtype).element_size()
                self.bytes += n
                yield e["name"], buf[e["offset"]:e["offset"] + n].view(dtype).view(e["shape"])

    def drain(self) -> None:
        while self.received < len(self.buffers):
            self._next_bucket()
