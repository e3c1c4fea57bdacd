"""The Lease rule of ``leader``: who may take, renew or must wait (pure, injected time)."""
from __future__ import annotations

import datetime as dt
import threading
import time

import pytest
import urllib3

from kubeforge.operator import kubeconfig, leader

T0 = dt.datetime(2026, 11, 23, 12, 0, 0, tzinfo=dt.timezone.utc)


def lease(holder: str, *, renewed: dt.datetime = T0, duration: int = 8) -> dict:
    return {"metadata": {"name": "l", "namespace": "ns", "resourceVersion": "7"},
            "spec": {"holderIdentity": holder, "leaseDurationSeconds": duration, "renewTime": leader.fmt(renewed),
                     "acquireTime": leader.fmt(renewed), "leaseTransitions": 2}}


def test_no_lease_creates_it() -> None:
    assert leader.decide(None, me="a", now=T0) is leader.Action.CREATE


def test_own_lease_is_renewed_even_late() -> None:
    assert leader.decide(lease("a"), me="a", now=T0 + dt.timedelta(seconds=60)) is leader.Action.RENEW


def test_another_holders_live_lease_waits_until_it_expires() -> None:
    assert leader.decide(lease("b"), me="a", now=T0 + dt.timedelta(seconds=7.9)) is leader.Action.WAIT
    assert leader.decide(lease("b"), me="a", now=T0 + dt.timedelta(seconds=8)) is leader.Action.TAKE


def test_a_released_lease_is_taken_at_once() -> None:
    assert leader.decide(lease(""), me="a", now=T0) is leader.Action.TAKE


def test_taking_over_counts_a_transition_and_keeps_the_resource_version() -> None:
    body = leader.desired(lease("b"), me="a", now=T0, duration_s=8, namespace="ns", name="l")
    assert body["spec"]["holderIdentity"] == "a" and body["spec"]["leaseTransitions"] == 3
    assert body["metadata"]["resourceVersion"] == "7" and body["spec"]["acquireTime"] == leader.fmt(T0)
    renewed = leader.desired(body | {"metadata": {**body["metadata"]}}, me="a", now=T0 + dt.timedelta(seconds=2),
                             duration_s=8, namespace="ns", name="l")
    assert renewed["spec"]["leaseTransitions"] == 3 and renewed["spec"]["acquireTime"] == leader.fmt(T0)


def test_identity_is_per_process_and_names_the_pod() -> None:
    a, b = leader.identity("op-7d9-abc"), leader.identity("op-7d9-abc")
    assert a != b, "a process restarted in the same pod is a new candidate"
    assert leader.pod_of(a) == leader.pod_of(b) == "op-7d9-abc"


def test_a_restarted_process_waits_for_its_predecessors_lease() -> None:
    """The bug this fixes: the restarted process took its killed predecessor's Lease back at once (same identity),
    so no standby ever took over."""
    dead, reborn = leader.identity("op-a"), leader.identity("op-a")
    assert leader.decide(lease(dead), me=reborn, now=T0 + dt.timedelta(seconds=1)) is leader.Action.WAIT
    assert leader.decide(lease(dead), me=reborn, now=T0 + dt.timedelta(seconds=8)) is leader.Action.TAKE


def test_the_lease_is_owned_by_its_holders_pod() -> None:
    owner = leader.pod_owner("op-b", "uid-b")
    created = leader.desired(None, me="b", now=T0, duration_s=6, namespace="ns", name="l", owner=owner)
    assert created["metadata"]["ownerReferences"] == [owner]
    taken = leader.desired(lease("a") | {"metadata": {**lease("a")["metadata"], "ownerReferences": [
        leader.pod_owner("op-a", "uid-a")]}}, me="b", now=T0 + dt.timedelta(seconds=9), duration_s=6,
        namespace="ns", name="l", owner=owner)
    assert taken["metadata"]["ownerReferences"] == [owner], "the new holder's pod replaces the old one's"
    assert "ownerReferences" not in leader.desired(None, me="b", now=T0, duration_s=6, namespace="ns", name="l")


class FakeLeases:
    """apply.Cluster's lease verbs over one in-memory Lease, with resourceVersion conflicts."""

    def __init__(self) -> None:
        self.lease: dict | None = None
        self.rv = 0
        self.writes: list[str] = []

    def get_lease(self, namespace: str, name: str) -> dict | None:
        return None if self.lease is None else {**self.lease, "metadata": dict(self.lease["metadata"])}

    def _store(self, body: dict, verb: str) -> None:
        self.rv += 1
        self.lease = {**body, "metadata": {**body["metadata"], "resourceVersion": str(self.rv)}}
        self.writes.append(verb)

    def create_lease(self, body: dict) -> None:
        assert self.lease is None
        self._store(body, "create")

    def replace_lease(self, body: dict) -> None:
        assert self.lease is not None and body["metadata"]["resourceVersion"] == self.lease["metadata"]["resourceVersion"]
        self._store(body, "replace")

    def delete(self, obj: dict) -> None:
        self.lease = None
        self.writes.append("delete")


def test_release_stops_renewing_before_deleting_so_the_lease_stays_gone() -> None:
    """Renewing after the release would re-create the Lease (CREATE on a missing one) and leave it behind."""
    leases = FakeLeases()
    e = leader.Elector(leases, namespace="ns", name="l", identity="me", renew_s=0.01)  # type: ignore[arg-type]
    assert e.acquire()
    lost: list[bool] = []
    e.keep(lambda: lost.append(True))
    time.sleep(0.1)
    e.release()
    n = len(leases.writes)
    time.sleep(0.1)
    assert leases.lease is None and leases.writes[-1] == "delete" and len(leases.writes) == n
    assert not lost


def test_release_leaves_another_holders_lease_alone() -> None:
    leases = FakeLeases()
    leases.create_lease(leader.desired(None, me="other", now=dt.datetime.now(dt.timezone.utc), duration_s=6,
                                       namespace="ns", name="l"))
    e = leader.Elector(leases, namespace="ns", name="l", identity="me")  # type: ignore[arg-type]
    assert not e._try()
    e.release()
    assert leases.lease is not None and leases.lease["spec"]["holderIdentity"] == "other"


class Unreachable(FakeLeases):
    """The API server gone after the Lease was taken, failing as the real client fails: not with an OSError."""

    def __init__(self, error: Exception) -> None:
        super().__init__()
        self.error, self.down = error, False

    def get_lease(self, namespace: str, name: str) -> dict | None:
        if self.down:
            raise self.error
        return super().get_lease(namespace, name)


@pytest.mark.parametrize("error", [
    urllib3.exceptions.NewConnectionError(None, "Failed to establish a new connection: [Errno 111] refused"),
    urllib3.exceptions.ReadTimeoutError(None, "/", "Read timed out."),
    kubeconfig.ConfigError("users[u].exec: 'aws' did not answer within 30 s"),
])
def test_a_leader_that_cannot_renew_leaves_whatever_the_error(error: Exception) -> None:
    """The bug this fixes: only ApiError and OSError counted as a failed try; urllib3's errors (connection refused,
    timeouts) and credential errors ended the renew thread instead, so ``on_lost`` never ran and the old leader
    kept reconciling beside the standby that took its expired Lease."""
    leases = Unreachable(error)
    e = leader.Elector(leases, namespace="ns", name="l", identity="me", duration_s=1,  # type: ignore[arg-type]
                       renew_s=0.01)
    assert e.acquire()
    lost = threading.Event()
    leases.down = True
    thread = e.keep(lost.set)
    assert lost.wait(5), "the leader never noticed it lost its Lease"
    thread.join(5)
    assert not e._try()
