"""Watch-fed caches: each RLJob's latest body and the typed facts of its pods, so a reconcile pass needs no GET of
the RLJob and no LIST of its pods (at 1,000 jobs those two calls per pass were most of the operator's API load).

Role: the operator's informer. kopf's watch events feed it (``handlers``), a pass reads it (``reconcile``).
Invariants:
- newest wins: an entry is replaced only by one with a resourceVersion at least as new (ints; the API server's
  are etcd revisions), and a deleted pod's UID is never brought back by a late event or an older LIST;
- the RLJob cache also takes the object the operator's own status write returned, so a pass never reads a status
  older than the one this process wrote last (no failure is handled twice from a stale status);
- a job's pods are "known" only after one LIST was merged in this process, and for at most ``max_age`` seconds
  after it: then the next pass lists again (bounds the damage of a missed DELETED event, e.g. across a watch
  that had to re-list). Until then ``pods()`` answers None and the pass lists, as before. ``max_age`` is 300 s:
  a LIST with a label selector makes the API server scan every pod of the namespace, so at 60 s the re-lists of
  1,000 jobs (10,000 pods) cost O(jobs x pods) every minute of a long start; a missed DELETED is rare (the watch
  resumes from its resourceVersion) and 5 minutes still bounds it. Each job's limit lies between half of
  ``max_age`` and ``max_age`` (a fixed spread from its key), so jobs started together do not all re-list together;
- such a LIST asks for a state not older than the newest resourceVersion this cache has seen (``newest``), which
  the API server answers from its watch cache, instead of a consistent read (etcd, or a wait for the cache); it is
  never older than what the watch already delivered, so what it lacks was deleted;
- a job listed once keeps its watch-fed pods (``stale``) for a pass whose re-LIST fails: the re-LIST is only the
  bound on a missed DELETED, and a pass that fails on it does nothing useful (the next pass lists again).
Memory: pods are kept as ``observed.PodFacts`` (a few hundred bytes), never as raw bodies.
"""
from __future__ import annotations

import json
import threading
import time
import zlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from kubeforge.api import contract
from kubeforge.operator import observed

Key = tuple[str, str]
Raw = Mapping[str, Any]


def _rv(obj: Raw) -> int:
    try:
        return int((obj.get("metadata") or {}).get("resourceVersion") or 0)
    except (TypeError, ValueError):
        return 0


class JobCache:
    """namespace/name -> the newest RLJob body seen (watch event or the operator's own write), kept as its JSON text
    without ``metadata.managedFields``: a few times smaller than the dicts at 1,000 jobs, and every reader gets a
    fresh copy by decoding it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._jobs: dict[Key, tuple[int, str]] = {}
        self._own: dict[Key, int] = {}          # resourceVersion of this process's last status write per job

    @staticmethod
    def key_of(obj: Raw) -> Key:
        md = obj.get("metadata") or {}
        return md.get("namespace", ""), md.get("name", "")

    def put(self, obj: Raw, *, own: bool = False) -> None:
        """Keep ``obj`` if it is at least as new as what is cached; ``own``: it is what this process's write
        returned, so the watch event that echoes it needs no pass (``echo``)."""
        key, rv = self.key_of(obj), _rv(obj)
        md = obj.get("metadata") or {}
        if "managedFields" in md:      # the API server's field ownership: no pass reads it (often half the body)
            obj = {**obj, "metadata": {k: v for k, v in md.items() if k != "managedFields"}}
        text = json.dumps(obj, separators=(",", ":"))
        with self._lock:
            old = self._jobs.get(key)
            if old is None or rv >= old[0]:
                self._jobs[key] = (rv, text)
            if own:
                self._own[key] = rv

    def echo(self, obj: Raw) -> bool:
        """True when ``obj`` is exactly the state this process's last status write produced."""
        with self._lock:
            return _rv(obj) != 0 and self._own.get(self.key_of(obj)) == _rv(obj)

    def get(self, key: Key) -> dict[str, Any] | None:
        """A fresh copy (the pass may mutate what it reads), or None when unknown."""
        with self._lock:
            hit = self._jobs.get(key)
        return json.loads(hit[1]) if hit is not None else None

    def forget(self, key: Key) -> None:
        with self._lock:
            self._jobs.pop(key, None)
            self._own.pop(key, None)


class PodCache:
    """job key -> {pod UID: (resourceVersion, facts)} from pod watch events, merged with one LIST per job."""

    def __init__(self, *, max_age: float = 300.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._lock = threading.Lock()
        self._pods: dict[Key, dict[str, tuple[int, observed.PodFacts]]] = {}
        self._listed: dict[Key, float] = {}     # job -> when its last LIST was merged
        self._gone: dict[str, float] = {}       # deleted pod UID -> when (tombstones, pruned after 10 min)
        self._newest = 0                        # the highest resourceVersion seen in an event or a LIST
        self._max_age = max_age
        self._clock = clock

    @staticmethod
    def key_of(pod: Raw) -> Key | None:
        md = pod.get("metadata") or {}
        job = (md.get("labels") or {}).get(contract.LABEL_JOB)
        return (md.get("namespace", ""), job) if job else None

    def event(self, kind: str | None, pod: Raw) -> None:
        """One watch event (``kind``: ADDED, MODIFIED, DELETED, or None for kopf's initial listing)."""
        key, md = self.key_of(pod), pod.get("metadata") or {}
        uid = md.get("uid")
        if key is None or not uid:
            return
        with self._lock:
            self._newest = max(self._newest, _rv(pod))
            if kind == "DELETED":
                self._drop(key, uid)
                return
            if uid in self._gone:
                return
            pods = self._pods.setdefault(key, {})
            old = pods.get(uid)
            if old is None or _rv(pod) >= old[0]:
                pods[uid] = (_rv(pod), observed.pod_facts(pod))

    def _drop(self, key: Key, uid: str) -> None:
        now = self._clock()
        self._gone[uid] = now
        if len(self._gone) > 4096:
            self._gone = {u: t for u, t in self._gone.items() if now - t < 600}
        pods = self._pods.get(key)
        if pods is not None:
            pods.pop(uid, None)

    def merge_list(self, key: Key, items: Sequence[Raw], list_rv: int) -> None:
        """Merge a LIST of the job's pods taken at ``list_rv``: cached pods absent from it and not newer than it
        were deleted meanwhile."""
        with self._lock:
            self._newest = max(self._newest, list_rv)
            pods = self._pods.setdefault(key, {})
            seen = set()
            for pod in items:
                uid = (pod.get("metadata") or {}).get("uid")
                if not uid or uid in self._gone:
                    continue
                seen.add(uid)
                old = pods.get(uid)
                if old is None or _rv(pod) >= old[0]:
                    pods[uid] = (_rv(pod), observed.pod_facts(pod))
            for uid, (rv, _) in list(pods.items()):
                if uid not in seen and rv <= list_rv:
                    self._drop(key, uid)
            self._listed[key] = self._clock()

    def pods(self, key: Key) -> list[observed.PodFacts] | None:
        """The job's pods, or None when this process has no fresh LIST of them merged (the pass lists)."""
        with self._lock:
            listed = self._listed.get(key)
            if listed is None or self._clock() - listed > self._age_limit(key):
                return None
            return [facts for _, facts in self._pods.get(key, {}).values()]

    def stale(self, key: Key) -> list[observed.PodFacts] | None:
        """The job's watch-fed pods however long ago its last LIST was merged; None when it never was."""
        with self._lock:
            if key not in self._listed:
                return None
            return [facts for _, facts in self._pods.get(key, {}).values()]

    def newest(self) -> int:
        """The highest resourceVersion seen (0: none yet): a LIST not older than it misses no pod the watch sent."""
        with self._lock:
            return self._newest

    def _age_limit(self, key: Key) -> float:
        spread = zlib.crc32(f"{key[0]}/{key[1]}".encode()) / 0xFFFFFFFF
        return self._max_age * (0.5 + 0.5 * spread)

    def forget(self, key: Key) -> None:
        with self._lock:
            self._pods.pop(key, None)
            self._listed.pop(key, None)

    def size(self) -> int:
        with self._lock:
            return sum(len(p) for p in self._pods.values())
