"""``gang.backend: Auto`` (issue 37 item 3): the choice from the facts (pure), and the reconcile pass that gathers
the facts, renders the choice, keeps it, and says it once (condition GangScheduling, one event)."""
from __future__ import annotations

import copy
from typing import Any

import pytest

import opbuilders
from kubeforge.api import contract, load
from kubeforge.operator import gangauto, reasons, reconcile

from test_reconcile import FakeCluster

PODGROUPS = {"kind": "APIResourceList", "groupVersion": gangauto.PODGROUP_API,
             "resources": [{"name": "podgroups", "kind": "PodGroup"}, {"name": "podgroups/status"}]}


class Discovery(FakeCluster):
    """The fake cluster with API discovery: PodGroups served or not (a 404: none served, as ``apply.Cluster.served_resources``)."""

    def __init__(self, job: dict[str, Any], *, podgroups: bool) -> None:
        super().__init__(job)
        self.podgroups, self.discovered = podgroups, 0

    def served_resources(self, api_version: str) -> list[str]:
        assert api_version == gangauto.PODGROUP_API
        self.discovered += 1
        return [r["name"] for r in copy.deepcopy(PODGROUPS)["resources"]] if self.podgroups else []


def auto_job(**labels: str) -> dict[str, Any]:
    doc = load.dump(opbuilders.job("tiny", spec__gang__backend="Auto"))
    doc["metadata"].update(uid="u-1", generation=1, creationTimestamp="2026-11-22T12:00:00Z")
    doc["metadata"].setdefault("labels", {}).update(labels)
    return doc


@pytest.mark.parametrize(("labels", "served", "scheduler", "backend", "reason"), [
    ({contract.LABEL_KUEUE_QUEUE: "team-a"}, True, "default-scheduler", "None", reasons.AUTO_CHOSE_KUEUE),
    ({}, True, "default-scheduler", "Coscheduling", reasons.AUTO_CHOSE_COSCHEDULING),
    ({}, True, "", "None", reasons.AUTO_CHOSE_NONE),        # the CRD alone is not enough
    ({}, False, "default-scheduler", "None", reasons.AUTO_CHOSE_NONE),
    ({}, False, "", "None", reasons.AUTO_CHOSE_NONE),
])
def test_the_choice_follows_the_facts_in_order(labels: dict[str, str], served: bool, scheduler: str, backend: str,
                                              reason: str) -> None:
    job = load.parse(auto_job(**labels))
    c = gangauto.choose(job, podgroups_served=served, coscheduling_scheduler=scheduler)
    assert (c.backend, c.reason, c.gang) == (backend, reason, reason != reasons.AUTO_CHOSE_NONE)
    if reason == reasons.AUTO_CHOSE_NONE:        # the message says which fact was missing
        assert ("names no scheduler" in c.message) == served and ("serves no podgroups" in c.message) == (not served)


def _pass(cluster: Discovery, scheduler: str) -> None:
    reconcile.reconcile(cluster, ("ns", "tiny"), image="img", cache=reconcile.ApplyCache(),  # type: ignore[arg-type]
                        clock=lambda: opbuilders.T0, coscheduling_scheduler=scheduler)


def _condition(cluster: FakeCluster) -> dict[str, Any]:
    return {c["type"]: c for c in cluster.job["status"]["conditions"]}[reasons.GANG_SCHEDULING]


def test_podgroups_served_and_a_scheduler_named_render_coscheduling_and_say_so_once() -> None:
    cluster = Discovery(auto_job(), podgroups=True)
    _pass(cluster, "default-scheduler")
    assert ("PodGroup", "tiny") in cluster.objects
    pods = [o["spec"]["template"]["spec"] for o in cluster.objects.values() if o["kind"] == "StatefulSet"]
    assert pods and all(p["schedulerName"] == "default-scheduler" for p in pods)
    cond = _condition(cluster)
    assert (cond["status"], cond["reason"]) == ("True", reasons.AUTO_CHOSE_COSCHEDULING)
    assert "default-scheduler" in cond["message"]
    assert cluster.events.count(reasons.AUTO_CHOSE_COSCHEDULING) == 1
    # the next pass keeps the choice from the status: no discovery, no second event, even if the CRD went away
    cluster.podgroups = False
    _pass(cluster, "default-scheduler")
    assert cluster.discovered == 1 and cluster.events.count(reasons.AUTO_CHOSE_COSCHEDULING) == 1
    assert _condition(cluster)["reason"] == reasons.AUTO_CHOSE_COSCHEDULING and ("PodGroup", "tiny") in cluster.objects


@pytest.mark.parametrize("podgroups", [False, True])
def test_without_a_named_scheduler_auto_runs_without_a_gang(podgroups: bool) -> None:
    cluster = Discovery(auto_job(), podgroups=podgroups)
    _pass(cluster, "")
    assert not any(kind == "PodGroup" for kind, _ in cluster.objects)
    pods = [o["spec"]["template"] for o in cluster.objects.values() if o["kind"] == "StatefulSet"]
    assert pods and all("schedulerName" not in p["spec"] and "scheduling.x-k8s.io/pod-group" not in
                        p["metadata"]["labels"] for p in pods)
    cond = _condition(cluster)
    assert (cond["status"], cond["reason"]) == ("False", reasons.AUTO_CHOSE_NONE)
    assert cluster.events.count(reasons.AUTO_CHOSE_NONE) == 1


def test_an_explicit_backend_is_not_resolved_and_carries_no_condition() -> None:
    doc = load.dump(opbuilders.job("tiny"))          # manifests/tiny.yaml names Coscheduling
    doc["metadata"].update(uid="u-1", generation=1, creationTimestamp="2026-11-22T12:00:00Z")
    cluster = Discovery(doc, podgroups=False)
    _pass(cluster, "")
    assert cluster.discovered == 0 and ("PodGroup", "tiny") in cluster.objects
    assert reasons.GANG_SCHEDULING not in {c["type"] for c in cluster.job["status"]["conditions"]}
