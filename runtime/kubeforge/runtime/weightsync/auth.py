"""Rendezvous authentication: both ends prove they hold the job key before any process group forms.

Neighbours: ``process_group`` calls :func:`authenticate` on every rank at the epoch's store, with the key of
:func:`job_key_from_env` unless one is passed in.
"""
from __future__ import annotations

import hashlib
import hmac
import os
from typing import Any

from kubeforge.api import contract, roleenv
from kubeforge.runtime.weightsync import protocol


def job_key_from_env() -> bytes | None:
    """The job key of the env contract (``KUBEFORGE_JOB_KEY``). Read here because the receiving end runs inside
    vLLM's worker processes, which inherit the generator's environment but not its parsed config."""
    problems: list[str] = []
    key = roleenv.job_key(os.environ.get(contract.ENV_JOB_KEY, ""), problems)   # the role's own parser's rule
    if problems:
        raise protocol.WeightSyncError(f"weight sync: {'; '.join(problems)}")
    return key


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
                raise protocol.WeightSyncError(
                    f"weight sync: rank {r} failed rendezvous authentication (not the job key)")
            store.set(f"auth/ok/{r}", _mac(key, b"sender", nr, n0, str(r).encode()))
        return
    n0 = bytes(store.get("auth/n0"))
    nr = os.urandom(16)
    store.set(f"auth/{rank}", nr + _mac(key, b"joiner", n0, nr, str(rank).encode()))
    proof = bytes(store.get(f"auth/ok/{rank}"))
    if not hmac.compare_digest(proof, _mac(key, b"sender", nr, n0, str(rank).encode())):
        raise protocol.WeightSyncError("weight sync: the rendezvous did not prove the job key (not our trainer)")
