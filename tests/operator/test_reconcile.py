"""The reconcile pass against an in-memory fake of ``apply.Cluster`` (the real one is tested in e2e/)."""
from __future__ import annotations

import copy
from typing import Any

import opbuilders
from kubeforge.api import load
from kubeforge.operator import reconcile


class FakeCluster:
    def __init__(self, job: dict[str, Any]) -> None:
        self.job = job
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.status_writes = 0
        self.events: list[str] = []
        self.applies = 0

    def get_rljob(self, namespace: str, name: str) -> dict[str, Any] | None:
        return copy.deepcopy(self.job)

    def list_pods(self, namespace: str, job: str) -> list[dict[str, Any]]:
        return []

    def get_node_lease(self, name: str) -> dict[str, Any] | None:
        return None      # no Lease readable: only the Ready condition speaks for a node

    def get_node(self, name: str) -> dict[str, Any] | None:
        return {"metadata": {"name": name}, "status": {"conditions": [{"type": "Ready", "status": "True"}]}}

    def apply(self, obj: dict[str, Any]) -> None:
        self.applies += 1
        self.objects[(obj["kind"], obj["metadata"]["name"])] = obj

    def delete(self, obj: dict[str, Any]) -> None:
        self.objects.pop((obj["kind"], obj["metadata"]["name"]), None)

    def create_if_absent(self, obj: dict[str, Any]) -> bool:
        return self.objects.setdefault((obj["kind"], obj["metadata"]["name"]), obj) is obj

    def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        self.status_writes += 1
        self.job["status"] = status

    def post_event(self, job: dict[str, Any], *, type: str, reason: str, message: str, now: str) -> None:
        self.events.append(reason)

    def delete_rljob(self, namespace: str, name: str) -> None:
        self.job = None  # type: ignore[assignment]


def raw_job(**overrides: Any) -> dict[str, Any]:
    doc = load.dump(opbuilders.job("tiny", **overrides))
    doc["metadata"].update(uid="u-1", generation=1, creationTimestamp="2026-11-22T12:00:00Z")
    return doc


def test_replayed_pass_writes_status_once_and_skips_unchanged_objects() -> None:
    fake = FakeCluster(raw_job())
    cache = reconcile.ApplyCache()
    out = reconcile.reconcile(fake, ("ns", "tiny"), image="img", cache=cache, clock=lambda: opbuilders.T0)
    assert out.phase == "Pending" and fake.status_writes == 1 and fake.events == ["Pending"]
    assert ("PodGroup", "tiny") in fake.objects and fake.applies == 10
    reconcile.reconcile(fake, ("ns", "tiny"), image="img", cache=cache, clock=lambda: opbuilders.T0)
    assert fake.status_writes == 1 and fake.applies == 10 and fake.events == ["Pending"]


def test_suspend_then_resume_recreates_the_gang_object() -> None:
    fake = FakeCluster(raw_job())
    cache = reconcile.ApplyCache()
    reconcile.reconcile(fake, ("ns", "tiny"), image="img", cache=cache, clock=lambda: opbuilders.T0)
    fake.job["spec"]["suspend"] = True
    reconcile.reconcile(fake, ("ns", "tiny"), image="img", cache=cache, clock=lambda: opbuilders.T0)
    assert ("PodGroup", "tiny") not in fake.objects
    assert fake.objects[("StatefulSet", "tiny-trainer")]["spec"]["replicas"] == 0
    fake.job["spec"]["suspend"] = False
    reconcile.reconcile(fake, ("ns", "tiny"), image="img", cache=cache, clock=lambda: opbuilders.T0)
    assert ("PodGroup", "tiny") in fake.objects
    assert fake.objects[("StatefulSet", "tiny-trainer")]["spec"]["replicas"] == 1


def test_gone_job_is_reported() -> None:
    fake = FakeCluster(raw_job())
    fake.job = None  # type: ignore[assignment]
    assert reconcile.reconcile(fake, ("ns", "tiny"), image="img", cache=reconcile.ApplyCache()).gone


def test_invalid_stored_job_gets_a_warning_event_and_no_children() -> None:
    doc = raw_job()
    doc["spec"]["algorithm"]["groupSize"] = 1
    fake = FakeCluster(doc)
    out = reconcile.reconcile(fake, ("ns", "tiny"), image="img", cache=reconcile.ApplyCache())
    assert not out.gone and fake.objects == {} and fake.events == ["InvalidSpec"]


def test_the_job_key_secret_is_made_once_and_never_replaced() -> None:
    cluster = FakeCluster(raw_job())
    cache = reconcile.ApplyCache()
    reconcile.reconcile(cluster, ("ns", "tiny"), image="img", cache=cache)  # type: ignore[arg-type]
    first = cluster.objects[("Secret", "tiny-key")]
    key = first["stringData"]["key"]
    assert len(bytes.fromhex(key)) == 32 and first["metadata"]["ownerReferences"][0]["kind"] == "RLJob"
    reconcile.reconcile(cluster, ("ns", "tiny"), image="img", cache=reconcile.ApplyCache())  # type: ignore[arg-type]
    assert cluster.objects[("Secret", "tiny-key")]["stringData"]["key"] == key
    sts = cluster.objects[("StatefulSet", "tiny-trainer")]
    env = {e["name"]: e for e in sts["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["KUBEFORGE_JOB_KEY"]["valueFrom"]["secretKeyRef"] == {"name": "tiny-key", "key": "key"}


def test_an_apply_the_api_server_refuses_reaches_the_status_and_an_event() -> None:
    import pytest

    from kubeforge.operator import apply

    class Refusing(FakeCluster):
        def apply(self, obj: dict[str, Any]) -> None:
            if obj["kind"] == "StatefulSet":
                raise apply.ApiError(422, "PATCH", "/apis/apps/v1/.../tiny-trainer",
                                     'StatefulSet "tiny-trainer" is invalid: spec.template.spec.containers[0].image')
            super().apply(obj)

    cluster = Refusing(raw_job())
    with pytest.raises(apply.ApiError):
        reconcile.reconcile(cluster, ("ns", "tiny"), image="img", cache=reconcile.ApplyCache())  # type: ignore[arg-type]
    cond = {c["type"]: c for c in cluster.job["status"]["conditions"]}["ChildrenApplied"]
    assert cond["status"] == "False" and cond["reason"] == "ApplyFailed" and "is invalid" in cond["message"]
    assert "ApplyFailed" in cluster.events


def test_a_gang_backend_the_cluster_does_not_serve_is_named_with_what_to_install() -> None:
    """Coscheduling on a plain cluster: the PodGroup apply gets a 404 (no such API); the condition says what is
    missing and how to run without it, instead of only the API server's 404."""
    import pytest

    from kubeforge.operator import apply

    class NoPodGroups(FakeCluster):
        def apply(self, obj: dict[str, Any]) -> None:
            if obj["kind"] == "PodGroup":
                raise apply.ApiError(404, "PATCH", "/apis/scheduling.x-k8s.io/v1alpha1/namespaces/ns/podgroups/tiny",
                                     "404 page not found")
            super().apply(obj)

    cluster = NoPodGroups(raw_job())
    with pytest.raises(apply.ApiError):
        reconcile.reconcile(cluster, ("ns", "tiny"), image="img", cache=reconcile.ApplyCache())  # type: ignore[arg-type]
    cond = {c["type"]: c for c in cluster.job["status"]["conditions"]}["ChildrenApplied"]
    assert cond["status"] == "False" and cond["reason"] == "ApplyFailed"
    assert cond["message"].startswith("spec.gang.backend Coscheduling: this cluster does not serve the "
                                      "scheduling.x-k8s.io API; install scheduler-plugins")
    assert "spec.gang.backend: None" in cond["message"] and "404 page not found" in cond["message"]


def test_a_404_of_another_api_is_left_as_the_api_server_said() -> None:
    from kubeforge.api import load as api_load
    from kubeforge.operator.render import gang

    job = api_load.parse(raw_job())
    msg = "PATCH /apis/monitoring.coreos.com/v1/namespaces/ns/podmonitors/x: HTTP 404: not found"
    assert gang.explain_refusal(job, 404, msg) == msg
    pg = "PATCH /apis/scheduling.x-k8s.io/v1alpha1/namespaces/ns/podgroups/tiny: HTTP 404: x"
    assert gang.explain_refusal(job, 422, pg) == pg       # only a 404 means "not served"


def test_an_image_that_cannot_be_pulled_shows_in_the_ready_condition_and_an_event() -> None:
    cluster = FakeCluster(raw_job())
    cache = reconcile.ApplyCache()
    reconcile.reconcile(cluster, ("ns", "tiny"), image="img", cache=cache)  # type: ignore[arg-type]
    pod = opbuilders.pod("tiny", "trainer", 0, ready=False)
    pod["status"]["containerStatuses"] = [{"name": "trainer", "restartCount": 0, "state": {"waiting": {
        "reason": "ImagePullBackOff", "message": 'Back-off pulling image "nope:1"'}}}]
    cluster.list_pods = lambda namespace, job: [pod]  # type: ignore[method-assign]
    reconcile.reconcile(cluster, ("ns", "tiny"), image="img", cache=cache)  # type: ignore[arg-type]
    ready = {c["type"]: c for c in cluster.job["status"]["conditions"]}["Ready"]
    assert ready["status"] == "False" and ready["reason"] == "ImagePullBackOff", ready
    assert "tiny-trainer-0" in ready["message"] and "nope:1" in ready["message"]
    assert cluster.events.count("ImagePullBackOff") == 1
    reconcile.reconcile(cluster, ("ns", "tiny"), image="img", cache=cache)  # type: ignore[arg-type]
    assert cluster.events.count("ImagePullBackOff") == 1               # once per transition, not per pass


def test_a_pass_with_the_same_spec_and_context_neither_renders_nor_applies(monkeypatch: Any) -> None:
    fake = FakeCluster(raw_job())
    cache = reconcile.ApplyCache()
    reconcile.reconcile(fake, ("ns", "tiny"), image="img", cache=cache, clock=lambda: opbuilders.T0)
    calls: list[int] = []
    real = reconcile.render.render
    monkeypatch.setattr(reconcile.render, "render", lambda job, ctx: calls.append(1) or real(job, ctx))
    reconcile.reconcile(fake, ("ns", "tiny"), image="img", cache=cache, clock=lambda: opbuilders.T0)
    assert calls == [] and fake.applies == 10
    fake.job["metadata"]["generation"] = 2                         # the spec changed: render and apply again
    reconcile.reconcile(fake, ("ns", "tiny"), image="img", cache=cache, clock=lambda: opbuilders.T0)
    assert calls == [1]
    cache.forget(("ns", "tiny"))                                   # a child was deleted: everything goes out again
    reconcile.reconcile(fake, ("ns", "tiny"), image="img", cache=cache, clock=lambda: opbuilders.T0)
    assert calls == [1, 1] and fake.applies == 20


def test_status_writes_of_detail_only_are_paced_and_never_lost() -> None:
    fake = FakeCluster(raw_job())
    cache, t = reconcile.ApplyCache(), [100.0]
    pacer = reconcile.StatusPacer(interval=5.0, clock=lambda: t[0])
    key = ("ns", "tiny")

    def run() -> reconcile.Outcome:
        return reconcile.reconcile(fake, key, image="img", cache=cache, pacer=pacer,  # type: ignore[arg-type]
                                   clock=lambda: opbuilders.T0)

    assert run().phase == "Pending" and fake.status_writes == 1
    placed = [opbuilders.pod("tiny", "generator", 0, phase="Pending", ready=False)] + \
        [opbuilders.pod("tiny", r, 0, phase="Pending", ready=False, node=None) for r in ("verifier", "trainer")]
    fake.list_pods = lambda namespace, job: placed  # type: ignore[method-assign]
    t[0] += 1.0
    out = run()                                # one pod bound: the gang's message only -> held back, re-run asked
    assert fake.status_writes == 1 and out.requeue_after == 4.0
    t[0] += 4.0
    run()                                      # due: the detail goes out
    gang_cond = {c["type"]: c for c in fake.job["status"]["conditions"]}["GangScheduled"]
    assert fake.status_writes == 2 and gang_cond["message"] == "1/3 pods bound to nodes"
    fake.list_pods = lambda namespace, job: opbuilders.gang("tiny")  # type: ignore[method-assign]
    t[0] += 1.0
    assert run().phase == "Running" and fake.status_writes == 3   # a phase change is written at once
    assert fake.events == ["Pending", "Running"]


def test_api_requests_are_counted_by_verb_and_resource() -> None:
    from kubeforge.operator import apply

    assert apply.verb_resource("GET", "/apis/kubeforge.dev/v1alpha1/namespaces/ns/rljobs/a") == ("get", "rljobs")
    assert apply.verb_resource("GET", "/api/v1/namespaces/ns/pods?labelSelector=x") == ("list", "pods")
    assert apply.verb_resource("PATCH", "/apis/kubeforge.dev/v1alpha1/namespaces/ns/rljobs/a/status",
                               "application/merge-patch+json") == ("patch", "rljobs/status")
    assert apply.verb_resource("PATCH", "/apis/apps/v1/namespaces/ns/statefulsets/a-trainer",
                               "application/apply-patch+yaml") == ("apply", "statefulsets")
    assert apply.verb_resource("POST", "/api/v1/namespaces/ns/events") == ("create", "events")
    assert apply.verb_resource("DELETE", "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/k") \
        == ("delete", "validatingwebhookconfigurations")


def test_a_statefulset_whose_immutable_fields_changed_is_recreated_with_its_pods_orphaned() -> None:
    import pytest

    from kubeforge.operator import apply

    class Immutable(FakeCluster):
        """A StatefulSet made by an older operator (another serviceName): the API server refuses the change."""

        def __init__(self, job: dict[str, Any]) -> None:
            super().__init__(job)
            self.objects[("StatefulSet", "tiny-trainer")] = {"spec": {"serviceName": "tiny-trainer"}}
            self.deleted: list[tuple[str, str]] = []

        def apply(self, obj: dict[str, Any]) -> None:
            old = self.objects.get((obj["kind"], obj["metadata"]["name"]))
            if obj["kind"] == "StatefulSet" and old and old["spec"]["serviceName"] != obj["spec"]["serviceName"]:
                raise apply.ApiError(422, "PATCH", "/apis/apps/v1/.../tiny-trainer", 'StatefulSet.apps '
                                     '"tiny-trainer" is invalid: spec: Forbidden: updates to statefulset spec for '
                                     "fields other than 'replicas', 'ordinals', 'template', 'updateStrategy'")
            super().apply(obj)

        def delete(self, obj: dict[str, Any], *, propagation: str = "Background") -> None:
            self.deleted.append((obj["metadata"]["name"], propagation))
            super().delete(obj)

    fake = Immutable(raw_job())
    cache = reconcile.ApplyCache()
    with pytest.raises(apply.ApiError) as err:           # transient: the router retries the pass
        reconcile.reconcile(fake, ("ns", "tiny"), image="img", cache=cache)  # type: ignore[arg-type]
    assert err.value.status == 409 and fake.deleted == [("tiny-trainer", "Orphan")]
    assert "status" not in fake.job or "ApplyFailed" not in str(fake.job["status"])
    reconcile.reconcile(fake, ("ns", "tiny"), image="img", cache=cache)  # type: ignore[arg-type]
    assert fake.objects[("StatefulSet", "tiny-trainer")]["spec"]["serviceName"] == "tiny"
    assert [o["metadata"]["name"] for (kind, _), o in fake.objects.items() if kind == "Service"] == ["tiny"]


def _replay_restart(stretch: float) -> tuple[int, list[str]]:
    """A restart of a job of 10 pods (generator 4, verifier 4, trainer 2, as bench_operator's), replayed pod event by
    pod event through the pass with the pacer: one pod fails, the attempt drains, the new pods are created and
    rejected by the gang scheduler until all exist, then bound and ready; ``stretch`` slows every step (a loaded
    control plane). Returns the status writes from the failure on and the phases written."""
    sizes = {"generator": 4, "verifier": 4, "trainer": 2}
    fake = FakeCluster(raw_job(**{f"spec__roles__{r}": {"replicas": n} for r, n in sizes.items()}))
    cache, t = reconcile.ApplyCache(), [-100.0]
    pacer = reconcile.StatusPacer(interval=5.0, clock=lambda: t[0])
    slots = [(r, i) for r, n in sizes.items() for i in range(n)]

    def pod(slot: tuple[str, int], **kw: Any) -> dict[str, Any]:
        return opbuilders.pod("tiny", *slot, world="verifier=4,trainer=2", **kw)

    pods = {s: pod(s) for s in slots}
    events: list[tuple[float, dict[str, Any] | None, tuple[str, int]]] = [
        (0.0, pod(slots[0], phase="Failed", ready=False, exit_now=1), slots[0])]
    for k, s in enumerate(slots):
        events += [(1 + k * 0.3, pod(s, deleting=True), s), (3 + k * 0.6, None, s),
                   (10 + k * 0.8, pod(s, attempt=1, phase="Pending", ready=False, node=None), s),
                   (19 + k * 0.5, pod(s, attempt=1, phase="Pending", ready=False), s), (20 + k * 0.5, pod(s, attempt=1), s)]
        if k < len(slots) - 1:   # the gang scheduler rejects each pod until the whole gang exists
            events.append((10.3 + k * 0.8, pod(s, attempt=1, phase="Pending", ready=False, node=None,
                                               unschedulable=f"pod group tiny has {k + 1}/10 members"), s))
    events.sort(key=lambda e: e[0])
    fake.list_pods = lambda namespace, job: list(pods.values())  # type: ignore[method-assign]

    def run() -> reconcile.Outcome:
        return reconcile.reconcile(fake, ("ns", "tiny"), image="img", cache=cache, pacer=pacer,  # type: ignore[arg-type]
                                   clock=lambda: opbuilders.T0)

    assert run().phase == "Running"
    base, due, phases, end = fake.status_writes, None, [], events[-1][0] * stretch + 60
    while events or due is not None:
        if due is not None and (not events or due <= events[0][0] * stretch):
            t[0], due = due, None
        else:
            when, body, slot = events.pop(0)
            t[0] = when * stretch
            if body is None:
                pods.pop(slot)
            else:
                pods[slot] = body
        before = fake.status_writes
        out = run()
        if fake.status_writes > before:
            phases.append(fake.job["status"]["phase"])
        if out.requeue_after is not None and t[0] + out.requeue_after <= end:   # the router's re-run
            due = min(due if due is not None else end, t[0] + out.requeue_after)
    writes = fake.status_writes
    t[0] = end + 3600
    run()                        # nothing held back is lost: long after, a pass finds the stored status exact
    assert fake.status_writes == writes
    return writes - base, phases


def test_a_restart_writes_its_phases_at_once_and_little_else() -> None:
    """bench_operator measured ~12 status writes per restarted job: the gang condition's reason flipping while it
    stayed False (WaitingForPods, Unschedulable, WaitingForPods) was written at once, and the scheduler's changing
    messages went out every 5 s while a gang formed slowly. Before, this replay made 8 writes (13 at 3x slower);
    pacing the placement reasons alone left 7 (12); with detail writes in a row backing off, the four phases go out
    at once and the detail adds at most three writes."""
    for stretch in (1.0, 3.0):
        writes, phases = _replay_restart(stretch)
        assert [p for i, p in enumerate(phases) if i == 0 or phases[i - 1] != p] == \
            ["Restarting", "Pending", "Starting", "Running"]
        assert writes <= 7, (stretch, writes, phases)


def test_detail_writes_in_a_row_wait_longer_each_time_and_substance_resets_the_wait() -> None:
    t = [0.0]
    pacer, key = reconcile.StatusPacer(interval=5.0, max_interval=20.0, clock=lambda: t[0]), ("ns", "a")
    assert pacer.wait(key) == 0.0
    pacer.wrote(key)
    waits = []
    for _ in range(4):
        waits.append(pacer.wait(key))
        t[0] += waits[-1]
        pacer.wrote(key, detail=True)
    assert waits == [5.0, 10.0, 20.0, 20.0]
    pacer.wrote(key)
    assert pacer.wait(key) == 5.0


def test_a_partially_admitted_kueue_job_asks_for_the_rest_and_grows_without_touching_the_trainer() -> None:
    """Reconcile of an RLJob Kueue admitted with 2 of 4 generators: one grow Workload per missing generator; once
    Kueue admits one, the generators number 3 and the trainer's pods stay those of the same attempt and world."""
    main_name = "tiny"

    class Kueue(FakeCluster):
        def __init__(self, job: dict[str, Any]) -> None:
            super().__init__(job)
            self.workloads: dict[str, dict[str, Any]] = {}

        def get(self, api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
            return copy.deepcopy(self.workloads.get(name))

        def list_of_job(self, api_version: str, kind: str, namespace: str, job: str) -> list[dict[str, Any]]:
            return [copy.deepcopy(w) for w in self.workloads.values()]

        def get_kueue(self, plural: str, name: str) -> dict[str, Any] | None:
            return {"spec": {"nodeLabels": {"pool": "a"}}}

        def apply(self, obj: dict[str, Any]) -> None:
            super().apply(obj)
            if obj["kind"] == "Workload":
                self.workloads.setdefault(obj["metadata"]["name"], copy.deepcopy(obj))

        def delete(self, obj: dict[str, Any]) -> None:
            super().delete(obj)
            if obj["kind"] == "Workload":
                self.workloads.pop(obj["metadata"]["name"], None)

        def admit(self, name: str, count: int) -> None:
            self.workloads[name]["status"] = {
                "conditions": [{"type": "QuotaReserved", "status": "True"}, {"type": "Admitted", "status": "True"}],
                "admission": {"podSetAssignments": [{"name": "generator", "count": count, "flavors": {"g": "f"}}]
                              + ([{"name": r, "count": 1} for r in ("verifier", "trainer")] if name == main_name
                                 else [])}}

    doc = raw_job(spec__roles__generator={"replicas": 4, "minReplicas": 1})
    doc["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "team"}
    fake = Kueue(doc)
    cache = reconcile.ApplyCache()

    def run() -> None:
        reconcile.reconcile(fake, ("ns", "tiny"), image="img", cache=cache, clock=lambda: opbuilders.T0)

    run()
    assert list(fake.workloads) == ["tiny"]                           # queued: no grow Workload yet
    fake.admit("tiny", 2)
    run()
    assert sorted(fake.workloads) == ["tiny", "tiny.generator-2", "tiny.generator-3"]
    grow = fake.workloads["tiny.generator-2"]["spec"]["podSets"][0]
    assert grow["count"] == 1 and grow["template"]["spec"]["nodeSelector"]["pool"] == "a"
    trainer = fake.objects[("StatefulSet", "tiny-trainer")]
    assert fake.objects[("StatefulSet", "tiny-gen-surplus")]["spec"]["replicas"] in (0, 1)   # 0 until placed
    fake.admit("tiny.generator-2", 1)
    run()
    after = fake.objects[("StatefulSet", "tiny-trainer")]
    # OnDelete: a changed template (the generator peers) replaces no pod; the attempt and world stay: no new attempt
    assert after["spec"]["updateStrategy"] == {"type": "OnDelete"}
    assert after["spec"]["template"]["metadata"] == trainer["spec"]["template"]["metadata"]
    surplus = fake.objects[("StatefulSet", "tiny-gen-surplus")]
    peers = next(e["value"] for e in surplus["spec"]["template"]["spec"]["containers"][0]["env"]
                 if e["name"] == "KUBEFORGE_GENERATOR_REPLICAS")
    assert peers == "3"                                                # 2 admitted + 1 grown
    assert "(+1 as quota freed)" in next(c["message"] for c in fake.job["status"]["conditions"]
                                        if c["type"] == "Admitted")
