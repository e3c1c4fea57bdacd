"""The watch caches (``watchcache``): newest wins, deleted pods stay deleted, a LIST is needed first and again
after ``max_age``, the operator's own status write is recognised when it comes back; and a reconcile pass that
uses them sends no GET and no LIST once primed."""
from __future__ import annotations

import copy
from typing import Any

import opbuilders
from test_reconcile import FakeCluster, raw_job

from kubeforge.operator import reconcile, watchcache

KEY = ("ns", "tiny")


def pod(index: int, *, uid: str, rv: int, phase: str = "Running", attempt: int = 0) -> dict[str, Any]:
    p = opbuilders.pod("tiny", "generator", index, phase=phase, attempt=attempt)
    p["metadata"].update(uid=uid, resourceVersion=str(rv))
    return p


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_pods_are_unknown_until_a_list_is_merged_and_again_after_max_age() -> None:
    clock = Clock()
    cache = watchcache.PodCache(max_age=60, clock=clock)
    cache.event("ADDED", pod(0, uid="a", rv=5))
    assert cache.pods(KEY) is None                      # events alone never make a job's pod set complete
    cache.merge_list(KEY, [pod(0, uid="a", rv=5), pod(1, uid="b", rv=6)], list_rv=6)
    assert sorted(p.name for p in cache.pods(KEY) or []) == ["tiny-generator-0", "tiny-generator-1"]
    clock.t = 61
    assert cache.pods(KEY) is None


def test_newest_wins_and_a_deleted_pod_never_comes_back() -> None:
    cache = watchcache.PodCache()
    cache.merge_list(KEY, [pod(0, uid="a", rv=5, phase="Pending")], list_rv=5)
    cache.event("MODIFIED", pod(0, uid="a", rv=9, phase="Running"))
    cache.event("MODIFIED", pod(0, uid="a", rv=7, phase="Pending"))        # a late, older event
    assert [p.phase for p in cache.pods(KEY) or []] == ["Running"]
    cache.event("DELETED", pod(0, uid="a", rv=10))
    cache.event("MODIFIED", pod(0, uid="a", rv=9))                         # late event of a deleted pod
    cache.merge_list(KEY, [pod(0, uid="a", rv=9)], list_rv=9)               # an older LIST still showing it
    assert cache.pods(KEY) == []


def test_a_list_drops_pods_deleted_before_it_but_keeps_pods_newer_than_it() -> None:
    cache = watchcache.PodCache()
    cache.event(None, pod(0, uid="old", rv=3))     # kopf's initial listing
    cache.event("ADDED", pod(1, uid="new", rv=12))
    cache.merge_list(KEY, [], list_rv=10)          # "old" was gone at 10 (its DELETED event missed); "new" is later
    assert [p.name for p in cache.pods(KEY) or []] == ["tiny-generator-1"]


def test_the_job_cache_keeps_the_newest_body_and_recognises_its_own_write() -> None:
    jobs = watchcache.JobCache()
    job = raw_job()
    job["metadata"].update(namespace="ns", resourceVersion="4")
    jobs.put(job)
    written = copy.deepcopy(job)
    written["metadata"]["resourceVersion"] = "6"
    written["status"] = {"phase": "Pending"}
    jobs.put(written, own=True)
    jobs.put(job)                                   # the watch event of rv 4 arriving after the write
    got = jobs.get(KEY)
    assert got is not None and got["metadata"]["resourceVersion"] == "6" and got["status"] == {"phase": "Pending"}
    got["status"]["phase"] = "mutated"
    assert (jobs.get(KEY) or {})["status"]["phase"] == "Pending"     # readers get copies
    assert jobs.echo(written) and not jobs.echo(job)
    jobs.forget(KEY)
    assert jobs.get(KEY) is None and not jobs.echo(written)


class CountingCluster(FakeCluster):
    def __init__(self, job: dict[str, Any]) -> None:
        super().__init__(job)
        self.gets = self.lists = 0
        self.rv = 10

    def get_rljob(self, namespace: str, name: str) -> dict[str, Any] | None:
        self.gets += 1
        return super().get_rljob(namespace, name)

    def list_pods_at(self, namespace: str, job: str) -> tuple[list[dict[str, Any]], int]:
        self.lists += 1
        return [], self.rv

    def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> dict[str, Any]:
        super().patch_status(namespace, name, status)
        self.rv += 1
        self.job["metadata"]["resourceVersion"] = str(self.rv)
        return copy.deepcopy(self.job)


def test_a_primed_pass_reads_job_and_pods_from_the_caches() -> None:
    fake = CountingCluster(raw_job())
    fake.job["metadata"].update(namespace="ns", resourceVersion="10")
    jobs, pods, cache = watchcache.JobCache(), watchcache.PodCache(), reconcile.ApplyCache()
    out = reconcile.reconcile(fake, KEY, image="img", cache=cache, clock=lambda: opbuilders.T0, jobs=jobs, pods=pods)
    assert out.phase == "Pending" and (fake.gets, fake.lists, fake.status_writes) == (1, 1, 1)
    assert jobs.echo(fake.job)                       # the write's result is cached and known as this process's
    pods.event("ADDED", pod(0, uid="a", rv=12))
    reconcile.reconcile(fake, KEY, image="img", cache=cache, clock=lambda: opbuilders.T0, jobs=jobs, pods=pods)
    assert (fake.gets, fake.lists) == (1, 1)         # no GET, no LIST: both came from the caches
    assert fake.status_writes == 2                   # the cached pod changed the status (a role has a pod now)
