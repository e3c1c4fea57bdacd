"""The keys of a GeneratorPool and of the jobs attached to it, derived (docs/generator-pool.md, "Keys").

Role: one home for the derivation both sides do. The operator holds a master key outside the API (a file mounted
from the Secret the chart made in its own namespace: ``read_master``) and derives, per pool, the pool's key
(written into a Secret only the pool's engines mount) and, per attached job, the job's key (written into the job's
own key Secret); a pool engine derives each attached job's key from the pool's key and the job's identity in its
jobs file (``generator.pool.attach``); the local launcher does the same from a master of its own per run. So the
operator never reads a Secret, and an engine never holds a key a job has not.

Invariants: every key is HMAC-SHA256 of its parent over labelled, NUL-separated fields (a name cannot hold a NUL,
so no two inputs share bytes); a job's key depends on its pool's key, namespace, name and UID, a pool's on the
master, its namespace, name and UID, so a job or a pool re-created under the same name gets new keys, and nothing
derived reveals its parent. ``key_id`` is a public fingerprint of a key (it names the Secret holding it, so that a
Secret holding any other key is never taken for it).
"""
from __future__ import annotations

import hashlib
import hmac
import pathlib

#: The least master key the operator accepts, in bytes.
MASTER_MIN_BYTES = 32
#: Hex characters of ``key_id`` (40 bits: names a Secret, proves nothing).
KEY_ID_HEX = 10


class MasterKeyError(ValueError):
    """The master key file is absent, unreadable or too short."""


def _mac(key: bytes, *fields: str) -> bytes:
    return hmac.new(key, "\x00".join(fields).encode(), hashlib.sha256).digest()


def pool_key(master: bytes, *, namespace: str, pool: str, uid: str) -> bytes:
    """The key of GeneratorPool ``namespace/pool`` (its UID ``uid``)."""
    return _mac(master, "pool", namespace, pool, uid)


def job_key(pool_key: bytes, *, namespace: str, job: str, uid: str) -> bytes:
    """The key of RLJob ``namespace/job`` (its UID ``uid``) attached to the pool whose key is ``pool_key``."""
    return _mac(pool_key, "job", namespace, job, uid)


def key_id(key: bytes) -> str:
    """A public fingerprint of ``key`` (``KEY_ID_HEX`` hex characters)."""
    return _mac(key, "kubeforge key id").hex()[:KEY_ID_HEX]


def read_master(path: str) -> bytes:
    """The master key in file ``path``: its bytes as they are, at least ``MASTER_MIN_BYTES`` of them."""
    try:
        raw = pathlib.Path(path).read_bytes()
    except OSError as exc:
        raise MasterKeyError(f"pool master key {path}: cannot be read: {exc.strerror or exc}") from exc
    if len(raw) < MASTER_MIN_BYTES:
        raise MasterKeyError(f"pool master key {path}: Invalid value: {len(raw)} bytes, at least "
                             f"{MASTER_MIN_BYTES} are needed")
    return raw
