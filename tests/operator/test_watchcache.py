"""The watch caches (``watchcache``): newest wins, deleted pods stay deleted, a LIST is needed first and again
after ``max_age``, the operator's own status write is recognised when it comes back; and a reconcile pass that
uses them sends no GET and no LIST once primed."""
from __future__ import annotations

import copy
from typing import Any

import opbuilders
import pytest
from test_reconcile import FakeCluster, raw_job

from kubeforge.operator import apply, reconcile, watchcache

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


def test_the_job_cache_keeps_no_managed_fields_and_leaves_the_event_body_alone() -> None:
    jobs = watchcache.JobCache()
    job = raw_job()
    job["metadata"].update(namespace="ns", resourceVersion="4",
                           managedFields=[{"manager": "kubectl", "operation": "Update", "fieldsV1": {"f:spec": {}}}])
    jobs.put(job)
    got = jobs.get(KEY)
    assert got is not None and "managedFields" not in got["metadata"]
    assert got["metadata"]["resourceVersion"] == "4" and got["spec"] == job["spec"]
    assert "managedFields" in job["metadata"]           # kopf's body is not changed


class CountingCluster(FakeCluster):
    def __init__(self, job: dict[str, Any]) -> None:
        super().__init__(job)
        self.gets = self.lists = 0
        self.rv = 10

    def get_rljob(self, namespace: str, name: str) -> dict[str, Any] | None:
        self.gets += 1
        return super().get_rljob(namespace, name)

    def list_pods_at(self, namespace: str, job: str, *, not_older_than: int = 0) -> tuple[list[dict[str, Any]], int]:
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


def test_jobs_listed_together_re_list_spread_over_the_second_half_of_max_age() -> None:
    clock = Clock()
    cache = watchcache.PodCache(max_age=100, clock=clock)
    keys = [("ns", f"job-{i}") for i in range(200)]
    for key in keys:
        cache.merge_list(key, [], list_rv=1)
    due = []
    for t in range(0, 102):
        clock.t = t
        due.append(sum(cache.pods(k) is None for k in keys))
    assert due[49] == 0 and due[101] == len(keys)               # none before max_age/2, all after max_age
    assert 0.3 * len(keys) < due[75] < 0.7 * len(keys)          # spread, not all at once


class RelistCluster(CountingCluster):
    def __init__(self, job: dict[str, Any]) -> None:
        super().__init__(job)
        self.asked: list[int] = []
        self.fail = False

    def list_pods_at(self, namespace: str, job: str, *, not_older_than: int = 0) -> tuple[list[dict[str, Any]], int]:
        self.asked.append(not_older_than)
        if self.fail:
            raise TimeoutError("The read operation timed out")
        return super().list_pods_at(namespace, job)


def test_a_re_list_asks_for_no_older_than_the_watch_and_a_failed_one_keeps_the_pass_on_the_watch_fed_pods() -> None:
    clock = Clock()
    fake = RelistCluster(raw_job())
    fake.job["metadata"].update(namespace="ns", resourceVersion="10")
    jobs, pods, cache = watchcache.JobCache(), watchcache.PodCache(max_age=60, clock=clock), reconcile.ApplyCache()

    def run() -> reconcile.Outcome:
        return reconcile.reconcile(fake, KEY, image="img", cache=cache, clock=lambda: opbuilders.T0, jobs=jobs,
                                   pods=pods)

    fake.fail = True
    with pytest.raises(TimeoutError):     # never listed: without its pods the pass cannot go on
        run()
    fake.fail = False
    run()
    assert fake.asked == [0, 0]           # nothing seen yet: a consistent LIST
    pods.event("ADDED", pod(0, uid="a", rv=12))
    clock.t = 61                          # the job's LIST is older than max_age: the next pass lists again
    fake.fail = True
    out = run()                           # ... and that LIST times out: the pass goes on with the watched pod
    assert fake.asked[-1] == 12 and out.phase == "Pending"
    assert pods.pods(KEY) is None         # not counted as listed: the next pass tries again
    fake.fail = False
    run()
    assert fake.asked[-1] == 12 and pods.pods(KEY) is not None


def test_the_cluster_asks_the_api_server_for_a_state_not_older_than_the_one_given() -> None:
    class Recording(apply.Cluster):
        def __init__(self) -> None:              # no connection: only the request is recorded
            self.queries: list[dict[str, str]] = []

        def request(self, method: str, path: str, *, body: Any = None, query: Any = None,
                    content_type: str = "application/json") -> dict[str, Any]:
            self.queries.append(dict(query or {}))
            return {"metadata": {"resourceVersion": "42"}, "items": []}

    c = Recording()
    assert c.list_pods_at("ns", "tiny") == ([], 42)
    assert c.list_pods_at("ns", "tiny", not_older_than=40) == ([], 42)
    assert "resourceVersion" not in c.queries[0]
    assert c.queries[1] == {"labelSelector": "kubeforge.dev/job=tiny", "resourceVersion": "40",
                            "resourceVersionMatch": "NotOlderThan"}
