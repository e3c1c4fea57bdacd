"""GeneratorPools on the operator side (docs/generator-pool.md), pure parts and passes against an in-memory fake of
``apply.Cluster`` (the real API server: e2e/test_pool_cluster.py):
- a job on a pool renders no generators of its own, keeps them out of its gang, Role, Workload and status, and its
  roles dial the pool's engines;
- a pool renders its engines with vLLM LoRA enabled per its spec;
- the admission review reads the pool a job names;
- a pool pass puts its finalizer on, writes its status (engines ready, attached jobs) and, deleted, waits for its
  jobs before the finalizer comes off."""
from __future__ import annotations

import copy
import dataclasses
import json
from typing import Any

import pytest
import yaml

import opbuilders
import test_reconcile  # tests/operator: the fake API of a job's pass
from kubeforge.api import contract, generatorpool, load, rljob
from kubeforge.operator import admission, lifecycle, names, observed, poolreconcile, poolstatus, reconcile, render
from kubeforge.operator import status
from kubeforge.operator.render import context, network, rbac, workload
from kubeforge.operator.render import pool as pool_render
from kubeforge.operator.render.gang import base

CTX = context.RenderContext(namespace="ns", uid="u-1", image="img", pool_engines=2)
#: The operator's pool master key in these tests (the chart mounts one: ``--pool-master-key-file``).
MASTER = bytes(range(32))


def pool_job(**overrides: Any) -> rljob.RLJob:
    return opbuilders.job("tiny", **{"spec__model__lora": {"rank": 8}, "spec__generatorPool": {"name": "shared"},
                                     **overrides})


def pool_doc(**spec: Any) -> dict[str, Any]:
    return {"apiVersion": contract.API_VERSION, "kind": contract.POOL_KIND,
            "metadata": {"name": "shared", "namespace": "ns", "uid": "p-1", "generation": 1, "resourceVersion": "1"},
            "spec": {"model": {"builtin": "tiny"}, "maxAdapters": 4, "maxLoraRank": 8, "replicas": 2, **spec}}


# ---------------------------------------------------------------- a job on a pool


def test_a_job_on_a_pool_has_no_generators_of_its_own() -> None:
    job = pool_job()
    desired = render.render(job, CTX).desired
    sets = [o["metadata"]["name"] for o in desired if o["kind"] == "StatefulSet"]
    assert sets == ["tiny-verifier", "tiny-trainer"]
    assert base.replicas(job) == {"verifier": 1, "trainer": 1} and base.min_member(job) == 2
    assert base.surplus(pool_job(spec__roles__generator={"replicas": 3})) == 0
    with pytest.raises(load.InvalidRLJob, match="spec.roles.generator.minReplicas: Forbidden"):
        pool_job(spec__roles__generator={"replicas": 3, "minReplicas": 1})
    assert not any(n.startswith("tiny-generator") for n in rbac.pod_names(job))
    assert [p["name"] for p in workload.workload(job, CTX)["spec"]["podSets"]] == ["verifier", "trainer"]
    plan = lifecycle.decide(job, observed.observe([]), now=opbuilders.T0)
    assert set(status.role_statuses(job, observed.observe([]), plan)) == {"verifier", "trainer"}


def test_its_roles_dial_the_pools_engines_and_the_engines_may_reach_them() -> None:
    job = pool_job()
    for obj in render.render(job, CTX).desired:
        if obj["kind"] != "StatefulSet":
            continue
        env = {e["name"]: e.get("value") for e in obj["spec"]["template"]["spec"]["containers"][0]["env"]}
        assert env[contract.env_peers("generator")] == \
            "shared-pool-0.shared-pool.ns.svc:29500,shared-pool-1.shared-pool.ns.svc:29500"
        assert env[contract.env_replicas("generator")] == "2"
    peers = network.network_policy(job, CTX)["spec"]["ingress"][0]["from"]
    assert {"podSelector": {"matchLabels": {contract.LABEL_POOL: "shared"}}} in peers
    alone = network.network_policy(opbuilders.job("tiny"), CTX)["spec"]["ingress"][0]["from"]
    assert alone == [{"podSelector": {"matchLabels": {contract.LABEL_JOB: "tiny"}}}]


# ---------------------------------------------------------------- the pool's engines


def test_the_pool_renders_engines_with_lora_as_its_spec_says() -> None:
    pool = load.parse_pool(pool_doc(maxAdapters=6, maxLoraRank=12, maxModelLen=512))
    cm, _jobs, svc, netpol, sts = pool_render.render(pool, pool_render.PoolContext(
        namespace="ns", uid="p-1", attached=("job-a", "job-b")))
    engine = json.loads(cm["data"][names.POOL_ENGINE_FILE])
    assert engine == {"enable_lora": True, "max_loras": 6, "max_lora_rank": 16, "dtype": "float32",
                      "tensor_parallel_size": 1, "gpu_memory_utilization": 0.85, "enforce_eager": False,
                      "max_model_len": 512}
    assert load.parse_pool(yaml.safe_load(cm["data"][names.POOL_CONFIG_FILE])).spec == pool.spec
    assert svc["metadata"]["name"] == sts["spec"]["serviceName"] == contract.pool_service("shared") == "shared-pool"
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"] is True
    assert sts["spec"]["replicas"] == 2
    admitted = netpol["spec"]["ingress"][0]["from"]
    assert {"podSelector": {"matchExpressions": [{"key": contract.LABEL_JOB, "operator": "In",
                                                  "values": ["job-a", "job-b"]}]}} in admitted
    alone = pool_render.network_policy(pool, pool_render.PoolContext(namespace="ns", uid="p-1"))
    assert alone["spec"]["ingress"][0]["from"] == [{"podSelector": {"matchLabels": {contract.LABEL_POOL: "shared"}}}]
    for obj in (cm, svc, netpol, sts):
        md = obj["metadata"]
        assert md["labels"][contract.LABEL_POOL] == "shared" and contract.LABEL_JOB not in md["labels"]
        assert md["ownerReferences"][0]["kind"] == "GeneratorPool" and md["ownerReferences"][0]["uid"] == "p-1"
    pod = sts["spec"]["template"]
    assert pod["metadata"]["labels"][contract.LABEL_POOL] == "shared"
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    assert env[contract.ENV_ROLE] == "generator" and env[contract.ENV_POOL] == "shared"
    assert env[contract.ENV_CONFIG] == f"{names.CONFIG_DIR}/{names.POOL_CONFIG_FILE}"
    assert pod["spec"]["containers"][0]["args"] == ["role", "generator"]


def test_a_pools_env_may_not_set_kubeforges_own_variables() -> None:
    with pytest.raises(load.InvalidRLJob):
        load.parse_pool(pool_doc(env=[{"name": contract.ENV_POOL, "value": "x"}]))


# ---------------------------------------------------------------- admission reads the pool


def lookup(found: dict[str, Any] | None) -> admission.PoolLookup:
    return lambda namespace, name: copy.deepcopy(found) if (namespace, name) == ("ns", "shared") else None


def job_doc(**lora: Any) -> dict[str, Any]:
    return load.dump(pool_job(spec__model__lora={"rank": 8, **lora}))


def test_admission_checks_the_job_against_its_pool() -> None:
    assert admission.review("CREATE", job_doc(), pools=lookup(pool_doc())) == []
    assert admission.review("CREATE", job_doc(), pools=lookup(None)) == [], "a pool not there yet: admitted"
    too_big = admission.review("CREATE", job_doc(rank=16), pools=lookup(pool_doc()))
    assert len(too_big) == 1 and too_big[0].startswith("spec.model.lora.rank: Invalid value: 16")
    other = admission.review("CREATE", job_doc(), pools=lookup(pool_doc(model={"builtin": "smollm2-135m-instruct"})))
    assert len(other) == 1 and other[0].startswith("spec.model: Invalid value")


def test_admission_refuses_a_pool_being_deleted_and_one_it_cannot_read() -> None:
    deleting = pool_doc()
    deleting["metadata"]["deletionTimestamp"] = "2026-11-22T12:00:00Z"
    refused = admission.review("CREATE", job_doc(), pools=lookup(deleting))
    assert refused == ["spec.generatorPool.name: Forbidden: GeneratorPool 'shared' is being deleted: it takes no new "
                       "jobs (docs/generator-pool.md)"]

    def broken(namespace: str, name: str) -> dict[str, Any] | None:
        raise TimeoutError("slow API server")
    failed = admission.review("CREATE", job_doc(), pools=broken)
    assert len(failed) == 1 and failed[0].startswith("spec.generatorPool.name: Internal error")


def test_the_review_envelope_uses_the_requests_namespace() -> None:
    body = job_doc(rank=16)
    body["metadata"].pop("namespace", None)
    review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
              "request": {"uid": "r1", "operation": "CREATE", "namespace": "ns", "object": body}}
    out = admission.respond(review, pools=lookup(pool_doc()))["response"]
    assert out["allowed"] is False and "maxLoraRank" in out["status"]["message"]


# ---------------------------------------------------------------- status and finalizer (pure)


def test_attached_jobs_are_those_naming_the_pool() -> None:
    jobs = [{"metadata": {"name": n}, "spec": s} for n, s in (
        ("b", {"generatorPool": {"name": "shared"}}), ("a", {"generatorPool": {"name": "shared"}}),
        ("c", {"generatorPool": {"name": "other"}}), ("d", {}))]
    assert poolstatus.attached_jobs("shared", jobs) == ("a", "b")


def test_status_and_finalizer_follow_the_facts() -> None:
    pool = load.parse_pool(pool_doc())
    live = poolstatus.PoolFacts(ready_engines=1, attached=("a",), deleting=False)
    st = poolstatus.compute(pool, live, generation=1, now=opbuilders.T0)
    assert (st.ready_engines, st.replicas, st.ready, st.attached_jobs, st.attached) == (1, 2, "1/2", ["a"], 1)
    assert [(c.type, c.status, c.reason) for c in st.conditions] == [("Ready", "False", "EnginesNotReady")]
    assert st.resident_adapters is None and st.utilisation is None, "the engines' to report; none has"
    assert poolstatus.finalizers([], live) == [names.POOL_FINALIZER]
    assert poolstatus.finalizers([names.POOL_FINALIZER], live) is None
    draining = dataclasses.replace(live, deleting=True)
    assert poolstatus.finalizers([names.POOL_FINALIZER], draining) is None, "jobs still attached: it waits"
    st = poolstatus.compute(pool, draining, generation=1, now=opbuilders.T0)
    assert [(c.type, c.reason) for c in st.conditions][1] == ("Terminating", "WaitingForJobs")
    done = dataclasses.replace(draining, attached=())
    assert poolstatus.finalizers(["other", names.POOL_FINALIZER], done) == ["other"]


# ---------------------------------------------------------------- passes against a fake API


class FakeCluster:
    """The API a pool pass and a job's pass use, in memory."""

    def __init__(self, pool: dict[str, Any] | None, jobs: list[dict[str, Any]] | None = None) -> None:
        self.pool = pool
        self.jobs = jobs or []
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.status: dict[str, Any] | None = None

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        assert kind != "Secret", "the operator reads no Secret (its RBAC on Secrets is create)"
        if kind == contract.POOL_KIND:
            return copy.deepcopy(self.pool) if self.pool and name == self.pool["metadata"]["name"] else None
        return copy.deepcopy(self.objects.get((kind, name)))

    def create_if_absent(self, obj: dict[str, Any]) -> bool:
        return self.objects.setdefault((obj["kind"], obj["metadata"]["name"]), obj) is obj

    def list_rljobs(self, namespace: str) -> list[dict[str, Any]]:
        return copy.deepcopy(self.jobs)

    def patch_object(self, obj: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
        assert self.pool is not None
        assert patch["metadata"]["resourceVersion"] == self.pool["metadata"]["resourceVersion"]
        self.pool["metadata"]["finalizers"] = patch["metadata"]["finalizers"]
        self.pool["metadata"]["resourceVersion"] = str(int(self.pool["metadata"]["resourceVersion"]) + 1)
        return copy.deepcopy(self.pool)

    def patch_object_status(self, obj: dict[str, Any], patch: dict[str, Any]) -> None:
        self.status = patch["status"]

    def apply(self, obj: dict[str, Any]) -> None:
        self.objects[(obj["kind"], obj["metadata"]["name"])] = obj


def attached(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"generatorPool": {"name": "shared"}}}


def pass_of(fake: FakeCluster, *, master: bytes | None = MASTER) -> reconcile.Outcome:
    return poolreconcile.reconcile_pool(fake, poolreconcile.key("ns", "shared"), image="img",  # type: ignore[arg-type]
                                        cache=reconcile.ApplyCache(), master=master, clock=lambda: opbuilders.T0)


def test_a_pool_pass_holds_it_renders_it_and_writes_its_status() -> None:
    fake = FakeCluster(pool_doc(), [attached("job-b"), attached("job-a")])
    fake.objects[("StatefulSet", "shared-pool")] = {"status": {"readyReplicas": 2}}
    out = pass_of(fake)
    assert not out.gone and out.requeue_after is None
    assert fake.pool is not None and fake.pool["metadata"]["finalizers"] == [names.POOL_FINALIZER]
    assert {("ConfigMap", "shared-pool-config"), ("Service", "shared-pool"), ("StatefulSet", "shared-pool"),
            ("NetworkPolicy", "shared-pool-network")} <= set(fake.objects)
    values = fake.objects[("NetworkPolicy", "shared-pool-network")]["spec"]["ingress"][0]["from"][1]
    assert values["podSelector"]["matchExpressions"][0]["values"] == ["job-a", "job-b"]
    assert fake.status is not None
    assert (fake.status["readyEngines"], fake.status["attachedJobs"], fake.status["ready"]) == \
        (2, ["job-a", "job-b"], "2/2")
    assert fake.status["conditions"][0]["reason"] == poolstatus.ENGINES_READY


def test_a_deleted_pool_waits_for_its_jobs_then_lets_go() -> None:
    doc = pool_doc()
    doc["metadata"].update(deletionTimestamp="2026-11-22T12:00:00Z", finalizers=[names.POOL_FINALIZER])
    fake = FakeCluster(doc, [attached("job-a")])
    out = pass_of(fake)
    assert not out.gone and out.requeue_after == poolreconcile.DRAIN_POLL_S
    assert fake.pool is not None and fake.pool["metadata"]["finalizers"] == [names.POOL_FINALIZER]
    assert fake.objects == {}, "a deleted pool is not rendered again"
    assert fake.status is not None and fake.status["conditions"][1]["message"].endswith("job-a")
    fake.jobs = []
    assert pass_of(fake).gone and fake.pool["metadata"]["finalizers"] == []
    fake.pool = None
    assert pass_of(fake).gone


def test_a_jobs_pass_reads_its_pools_engines() -> None:
    doc = load.dump(pool_job())
    doc["metadata"].update(uid="u-1", generation=1, creationTimestamp="2026-11-22T12:00:00Z")
    fake = FakeCluster(with_port(pool_doc(replicas=3)))
    job_fake = JobFake(doc, fake)
    reconcile.reconcile(job_fake, ("ns", "tiny"), image="img", cache=reconcile.ApplyCache(),  # type: ignore[arg-type]
                        clock=lambda: opbuilders.T0, pool_master=MASTER)
    trainer = job_fake.objects[("StatefulSet", "tiny-trainer")]
    env = {e["name"]: e.get("value") for e in trainer["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env[contract.env_replicas("generator")] == "3"
    assert ("StatefulSet", "tiny-generator") not in job_fake.objects


def test_a_job_whose_pool_does_not_exist_gets_no_pods_until_it_does() -> None:
    doc = load.dump(pool_job())
    doc["metadata"].update(uid="u-1", generation=1, creationTimestamp="2026-11-22T12:00:00Z")
    pools = FakeCluster(None)
    job_fake = JobFake(doc, pools)
    cache = reconcile.ApplyCache()
    reconcile.reconcile(job_fake, ("ns", "tiny"), image="img", cache=cache,  # type: ignore[arg-type]
                        clock=lambda: opbuilders.T0, pool_master=MASTER)
    assert job_fake.objects[("StatefulSet", "tiny-trainer")]["spec"]["replicas"] == 0
    assert ("PodGroup", "tiny") not in job_fake.objects and "PoolNotFound" in job_fake.events
    pools.pool = with_port(pool_doc())
    reconcile.reconcile(job_fake, ("ns", "tiny"), image="img", cache=cache,  # type: ignore[arg-type]
                        clock=lambda: opbuilders.T0, pool_master=MASTER)
    assert job_fake.objects[("StatefulSet", "tiny-trainer")]["spec"]["replicas"] == 1
    assert ("PodGroup", "tiny") in job_fake.objects


def with_port(doc: dict[str, Any], job: str = "tiny", port_base: int = 29510) -> dict[str, Any]:
    """A pool body whose status gives ``job`` a port block (a pool pass does: ``poolports``)."""
    doc["status"] = {"jobPorts": [{"name": job, "portBase": port_base}]}
    return doc


class JobFake(test_reconcile.FakeCluster):
    """A job's pass: the RLJob's own calls (tests/operator/test_reconcile.py's fake) plus the pool it reads."""

    def __init__(self, job: dict[str, Any], pools: FakeCluster) -> None:
        super().__init__(job)
        self.pools = pools

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        return self.pools.get(api_version, kind, namespace, name)


def test_engine_args_are_what_the_runtime_generator_gets_for_one_adapter() -> None:
    """One home for vLLM's LoRA arguments: a job's own generators hold one adapter, a pool's engines maxAdapters."""
    assert rljob.lora_engine_args(rank=8, adapters=1) == {"enable_lora": True, "max_loras": 1, "max_lora_rank": 8}
    spec = load.parse_pool(pool_doc(maxLoraRank=200)).spec
    assert generatorpool.engine_args(spec)["max_lora_rank"] == 256
