"""The weight-sync store: a ``TCPStore`` served by trainer rank 0, its per-epoch key prefixes, the join barrier.

Every epoch's group lives under ``kubeforge/epoch-<n>/`` of one store (the sender's server for its lifetime). Keys
under an epoch's prefix: ``joined``/``all-joined`` (the barrier), ``abandoned`` (a re-formed membership ends every
wait in it at once), ``closed`` and ``receivers-live`` (the sender's close waits, bounded, for the live receivers to
see it), ``syncs`` (how many syncs the sender has begun: a prefetching receiver polls it).

Neighbours: ``process_group`` opens the store and passes the barrier; ``sender`` abandons and closes epochs and counts
syncs; ``receiver`` polls the sync count and the close.
"""
from __future__ import annotations

import datetime
import time
from typing import Any

import torch.distributed as dist

from kubeforge.runtime.weightsync import protocol

JOIN_KEY, ALL_JOINED_KEY, ABANDONED_KEY = "joined", "all-joined", "abandoned"   # under the epoch's prefix
CLOSED_KEY = "closed"       # under the epoch's prefix: the sender closed (receivers waiting in the store stop)
LIVE_KEY = "receivers-live"  # under the epoch's prefix: receivers joined, not closed, not yet told of the close
SYNCS_KEY = "syncs"            # under the epoch's prefix: how many syncs the sender has begun in this epoch
PREFETCH_POLL_SECONDS = 0.02
CLOSE_WAIT_SECONDS = 2.0   # the sender's close waits at most this long for live receivers to see it (then goes)


def epoch_prefix(epoch: int) -> str:
    return f"kubeforge/epoch-{epoch}/"


def open_store(*, host: str, port: int, rank: int, join_timeout: float) -> Any:
    """The weight-sync store: served by rank 0, a client elsewhere."""
    return dist.TCPStore(  # type: ignore[attr-defined]
        host, port, None, rank == 0, timeout=datetime.timedelta(seconds=join_timeout), wait_for_workers=False)


BARRIER_POLL_SECONDS = 0.05


def barrier(store: Any, world_size: int, *, timeout: float) -> None:
    """Wait (at most ``timeout``) until all ``world_size`` ranks reached the store; an abandoned epoch ends the
    wait at once."""
    if store.check([ABANDONED_KEY]):
        raise protocol.WeightSyncError("weight sync: this epoch was abandoned (the membership re-formed)")
    if store.add(JOIN_KEY, 1) == world_size:
        store.set(ALL_JOINED_KEY, b"1")
    deadline = time.monotonic() + timeout
    while not store.check([ALL_JOINED_KEY]):
        if store.check([ABANDONED_KEY]):
            raise protocol.WeightSyncError("weight sync: this epoch was abandoned (the membership re-formed)")
        if time.monotonic() > deadline:
            raise protocol.WeightSyncError(f"weight sync: not every rank joined within {timeout:.0f}s")
        time.sleep(BARRIER_POLL_SECONDS)
