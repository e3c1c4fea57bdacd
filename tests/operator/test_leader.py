"""The Lease rule of ``leader``: who may take, renew or must wait (pure, injected time)."""
from __future__ import annotations

import datetime as dt

from kubeforge.operator import leader

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
