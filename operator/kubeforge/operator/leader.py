"""One active operator among replicas: a coordination.k8s.io/v1 Lease, held by renewing it.

Role: with ``--leader-elect``, ``main`` blocks in ``Elector.acquire`` before kopf starts; the winner renews the
Lease every ``renew_s`` from a thread and, when it cannot renew for a whole ``duration_s`` (API unreachable,
another holder), exits the process (the pod restarts as a standby: never two active operators).

Invariants:
- The identity is per process (``identity``: pod name + a random suffix), so a leader whose process was killed
  and restarted in the same pod is a new candidate: it cannot mistake the dead process's Lease for its own.
- On SIGTERM the leader releases the Lease (deletes it: a standby creates it anew at once, and an uninstalled
  release leaves none); a killed leader's Lease expires after ``duration_s`` and a standby takes it over.
- The Lease is owned by the holder's pod (``ownerReferences``, when the pod is known and in the Lease's
  namespace): when the pods go (``helm uninstall``), the garbage collector removes a Lease nobody released.

``decide`` is the pure rule; ``Elector`` does the API calls through ``apply.Cluster`` (optimistic concurrency:
every write carries the ``resourceVersion`` it read, a conflict means someone else wrote first).
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import logging
import secrets
import threading
import time
from collections.abc import Callable
from typing import Any

from kubeforge.operator import apply

log = logging.getLogger("kubeforge.operator.leader")
Obj = dict[str, Any]


class Action(str, enum.Enum):
    CREATE = "create"     # no Lease yet
    TAKE = "take"         # free or expired: take it over
    RENEW = "renew"       # ours
    WAIT = "wait"         # someone else holds a live Lease


def _parse(ts: str | None) -> dt.datetime | None:
    if not ts:
        return None
    return dt.datetime.fromisoformat(ts.replace("Z", "+00:00"))


def fmt(now: dt.datetime) -> str:
    """MicroTime as the API writes it."""
    return now.astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def identity(pod_name: str) -> str:
    """A holder identity for this process: the pod's name and a random suffix (unique per process start)."""
    return f"{pod_name}_{secrets.token_hex(4)}"


def pod_of(holder: str) -> str:
    """The pod name inside an ``identity``."""
    return holder.rsplit("_", 1)[0]


def decide(lease: Obj | None, *, me: str, now: dt.datetime) -> Action:
    """What ``me`` should do about ``lease`` at ``now``."""
    if lease is None:
        return Action.CREATE
    spec = lease.get("spec") or {}
    holder = spec.get("holderIdentity") or ""
    if holder == me:
        return Action.RENEW
    renewed = _parse(spec.get("renewTime")) or _parse(spec.get("acquireTime"))
    duration = int(spec.get("leaseDurationSeconds") or 0)
    if not holder or renewed is None or now >= renewed + dt.timedelta(seconds=duration):
        return Action.TAKE
    return Action.WAIT


def desired(lease: Obj | None, *, me: str, now: dt.datetime, duration_s: int, namespace: str, name: str,
            owner: Obj | None = None) -> Obj:
    """The Lease ``me`` writes for a CREATE, TAKE or RENEW; ``owner`` (an ownerReference to the holder's pod)
    replaces the previous holder's."""
    spec = dict((lease or {}).get("spec") or {})
    taking = spec.get("holderIdentity") != me
    spec.update(holderIdentity=me, leaseDurationSeconds=duration_s, renewTime=fmt(now))
    if taking:
        spec["acquireTime"] = fmt(now)
        spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + (1 if lease else 0)
    md: Obj = {"name": name, "namespace": namespace}
    if owner is not None:
        md["ownerReferences"] = [owner]
    elif lease is not None and lease["metadata"].get("ownerReferences") and not taking:
        md["ownerReferences"] = lease["metadata"]["ownerReferences"]
    if lease is not None:
        md["resourceVersion"] = lease["metadata"]["resourceVersion"]
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": md, "spec": spec}


@dataclasses.dataclass
class Elector:
    cluster: apply.Cluster
    namespace: str
    name: str
    identity: str
    duration_s: int = 6
    renew_s: float = 2.0
    retry_s: float = 1.0
    owner: Obj | None = None      # ownerReference written into the Lease (the holder's pod)
    clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.timezone.utc)
    _halt: threading.Event = dataclasses.field(default_factory=threading.Event, init=False, repr=False)
    _renewer: threading.Thread | None = dataclasses.field(default=None, init=False, repr=False)

    def _try(self) -> bool:
        """One attempt to hold the Lease; True when held after it."""
        try:
            lease = self.cluster.get_lease(self.namespace, self.name)
            now = self.clock()
            action = decide(lease, me=self.identity, now=now)
            if action is Action.WAIT:
                return False
            body = desired(lease, me=self.identity, now=now, duration_s=self.duration_s, namespace=self.namespace,
                           name=self.name, owner=self.owner)
            if action is Action.CREATE:
                self.cluster.create_lease(body)
            else:
                self.cluster.replace_lease(body)
            if action is not Action.RENEW:
                log.info("leader: %s holds lease %s/%s", self.identity, self.namespace, self.name)
            return True
        except Exception as exc:  # noqa: BLE001 - any failed try is one: an escaped error ended the renew thread
            # (urllib3's connection errors are no OSError, nor is a failed exec plugin), and the leader then never
            # noticed losing its Lease while a standby took it over
            log.warning("leader: lease %s/%s: %s", self.namespace, self.name, exc)
            return False

    def acquire(self, stop: threading.Event | None = None) -> bool:
        """Block until this process holds the Lease (True) or ``stop`` is set (False)."""
        log.info("leader: %s waiting for lease %s/%s", self.identity, self.namespace, self.name)
        while not (stop and stop.is_set()):
            if self._try():
                return True
            time.sleep(self.retry_s)
        return False

    def keep(self, on_lost: Callable[[], None]) -> threading.Thread:
        """Renew in a daemon thread until ``release``; ``on_lost`` when a whole lease duration passed without a
        renewal."""
        def loop() -> None:
            last = time.monotonic()
            while not self._halt.wait(self.renew_s):
                if self._try():
                    last = time.monotonic()
                elif time.monotonic() - last >= self.duration_s and not self._halt.is_set():
                    log.error("leader: lost lease %s/%s", self.namespace, self.name)
                    on_lost()
                    return
        self._renewer = threading.Thread(target=loop, name="lease-renew", daemon=True)
        self._renewer.start()
        return self._renewer

    def release(self) -> None:
        """Stop renewing, then give the Lease up by deleting it (a standby creates it at its next try)."""
        self._halt.set()
        if self._renewer is not None and self._renewer is not threading.current_thread():
            self._renewer.join(timeout=self.duration_s)
        try:
            lease = self.cluster.get_lease(self.namespace, self.name)
            if lease is None or (lease.get("spec") or {}).get("holderIdentity") != self.identity:
                return
            self.cluster.delete({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {
                "name": self.name, "namespace": self.namespace}})
            log.info("leader: released lease %s/%s", self.namespace, self.name)
        except (apply.ApiError, OSError) as exc:
            log.warning("leader: release failed: %s", exc)


def pod_owner(name: str, uid: str) -> Obj:
    """An ownerReference to a pod (no blockOwnerDeletion: it needs no extra permission)."""
    return {"apiVersion": "v1", "kind": "Pod", "name": name, "uid": uid}
