"""The operator's side of a GeneratorPool's runtime (docs/generator-pool.md, "Attaching on a cluster"): what the
engines read of the jobs attached to them, and what those jobs' roles dial.

- ``poolports``: each attached job's port block, kept while it is attached, freed when it goes, never shared;
- ``render.pool``: the jobs file (ConfigMap ``<pool>-pool-jobs``) and the pool's key (Secret
  ``<pool>-pool-key-<key id>``), read here by the runtime's own reader (``generator.pool.attach``) from the folder
  the pod projects them into; each job's key the engines derive is the one its own pass wrote into its Secret; no
  job's pod given another's key; the pod template the same whatever is attached (no engine restarts);
- a pool pass (the in-memory fake of ``tests/operator/test_pool.py``, which refuses any read of a Secret): the ports
  recorded in the status and kept across passes, the pool's key Secret created, a suspended job out of the jobs
  file with its block kept, back when it resumes;
- a job's pass: its roles dial the engines at its own port block; no block yet, no pods; its key Secret named by
  its derived key, so one left over with another key (made before, restored, another master) is never used.
"""
from __future__ import annotations

import base64
import json
import pathlib
from typing import Any

import pytest

import opbuilders
import test_pool  # tests/operator: the fakes of a pool's and a job's pass
from kubeforge.api import contract, load, poolkeys
from kubeforge.operator import names, poolports, poolreconcile, poolstatus, reconcile, render
from kubeforge.operator.render import context
from kubeforge.operator.render import pool as pool_render
from kubeforge.runtime.generator.pool import attach

POOL = load.parse_pool(test_pool.pool_doc())      # "shared", 2 engines, namespace "ns", uid "p-1"
MASTER = test_pool.MASTER
POOL_KEY = poolkeys.pool_key(MASTER, namespace="ns", pool="shared", uid="p-1")
KEY_ID = poolkeys.key_id(POOL_KEY)


def lora_job(name: str, *, pool: str = "shared", **overrides: Any) -> Any:
    return opbuilders.job("tiny", metadata__name=name, spec__model__lora={"rank": 8},
                          spec__generatorPool={"name": pool}, **overrides)


def member(name: str, port_base: int, **overrides: Any) -> pool_render.Member:
    return pool_render.Member(job=lora_job(name, **overrides), uid=f"uid-{name}", port_base=port_base)


def job_key(name: str, uid: str | None = None) -> bytes:
    return poolkeys.job_key(POOL_KEY, namespace="ns", job=name, uid=uid or f"uid-{name}")


# ---------------------------------------------------------------- port blocks


def test_port_blocks_follow_the_engines_own_block_and_fit_the_port_range() -> None:
    assert poolports.base(0) == contract.DEFAULT_PORT_BASE + contract.PORTS_PER_PROCESS == 29510
    assert [poolports.slot(poolports.base(s)) for s in (0, 1, poolports.CAPACITY - 1)] == \
        [0, 1, poolports.CAPACITY - 1]
    assert poolports.base(poolports.CAPACITY - 1) + contract.PORTS_PER_PROCESS - 1 <= poolports.MAX_PORT
    assert poolports.base(poolports.CAPACITY) + contract.PORTS_PER_PROCESS - 1 > poolports.MAX_PORT
    for not_ours in (contract.DEFAULT_PORT_BASE, 29515, poolports.base(poolports.CAPACITY), 80):
        assert poolports.slot(not_ours) is None, not_ours


def test_a_job_keeps_its_block_while_attached_and_a_leaver_frees_its_own() -> None:
    first = poolports.assign({}, ["c", "a", "b"])
    assert first == {"a": 29510, "b": 29520, "c": 29530}, "newcomers: lowest free blocks, in name order"
    assert poolports.assign(first, ["b", "a", "c"]) == first, "the same inputs, the same blocks"
    # a leaves, a newcomer "0" (sorts first) attaches: b and c keep theirs, "0" takes the block a freed
    second = poolports.assign(first, ["c", "b", "0"])
    assert second == {"0": 29510, "b": 29520, "c": 29530}
    third = poolports.assign(second, ["c", "z", "y", "0"])
    assert third == {"0": 29510, "c": 29530, "y": 29520, "z": 29540}
    assert len(set(third.values())) == len(third)


def test_a_record_that_is_not_one_of_ours_is_reassigned_and_none_is_shared() -> None:
    got = poolports.assign({"a": 29520, "b": 29520, "c": 29515, "gone": 29510}, ["a", "b", "c"])
    assert got == {"a": 29520, "b": 29510, "c": 29530}, "b's doubled and c's misaligned records are replaced"
    assert poolports.previous({"jobPorts": [{"name": "a", "portBase": 29510}, {"name": "b"}, "x",
                                            {"name": "a", "portBase": 29520}]}) == {"a": 29510}
    assert poolports.previous(None) == {} and poolports.port_base_of({"status": None}, "a") is None


def test_jobs_beyond_the_ports_there_are_get_none() -> None:
    got = poolports.assign({"b": poolports.base(1)}, ["a", "b", "c", "d"], capacity=3)
    assert got == {"a": poolports.base(0), "b": poolports.base(1), "c": poolports.base(2)}, "d waits, unserved"


# ---------------------------------------------------------------- what the engines read


def project(objs: tuple[dict[str, Any], ...], folder: pathlib.Path) -> dict[str, dict[str, Any]]:
    """Write the pool's config, jobs ConfigMap and key Secret into ``folder`` as the kubelet projects them (the
    StatefulSet's projected volume, its sources in order), with ``names.CONFIG_DIR`` mounted at ``folder``."""
    by_name = {o["metadata"]["name"]: o for o in objs}
    sts = next(o for o in objs if o["kind"] == "StatefulSet")
    vol = next(v for v in sts["spec"]["template"]["spec"]["volumes"] if v["name"] == names.CONFIG_VOLUME)
    for src in vol["projected"]["sources"]:
        ref = src.get("configMap") or src["secret"]
        obj = by_name[ref["name"]]
        data = obj.get("data") or {}
        files = {k: base64.b64decode(v).decode() if obj["kind"] == "Secret" else v for k, v in data.items()}
        files.update(obj.get("stringData") or {})
        for key, text in files.items():
            (folder / key).write_text(text.replace(names.CONFIG_DIR + "/", f"{folder}/"))
    return by_name


def rendered(ctx: pool_render.PoolContext) -> tuple[dict[str, Any], ...]:
    """What a pool pass writes: the applied children and the key Secret it creates."""
    return (*pool_render.render(POOL, ctx), pool_render.key_secret(POOL, ctx, key_hex=POOL_KEY.hex()))


def test_the_engines_read_the_rendered_files_with_the_runtimes_own_reader(tmp_path: pathlib.Path) -> None:
    ctx = pool_render.PoolContext(namespace="ns", uid="p-1", key_id=KEY_ID, attached=("job-a", "job-b", "job-c"),
                                  members=(member("job-a", 29510),
                                           member("job-b", 29530, spec__roles__trainer__replicas=2)))
    objs = rendered(ctx)
    by_name = project(objs, tmp_path)
    env = {e["name"]: e.get("value") for e in objs[-2]["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env[contract.ENV_POOL_JOBS] == f"{names.CONFIG_DIR}/{names.POOL_JOBS_FILE}"
    assert env[contract.ENV_POOL_KEY] == f"{names.CONFIG_DIR}/{names.POOL_KEY_FILE}"
    for index in (0, 1):     # every engine serves a job at the same port base, with the key its pass derived
        got = attach.read(jobs_path=str(tmp_path / names.POOL_JOBS_FILE),
                          key_path=str(tmp_path / names.POOL_KEY_FILE), pool="shared", index=index)
        assert [(a.name, a.port_base, a.key) for a in got] == \
            [("job-a", 29510, job_key("job-a")), ("job-b", 29530, job_key("job-b"))], "job-c is no member"
        assert [p.render() for p in got[1].trainers] == \
            ["job-b-trainer-0.job-b.ns.svc:29500", "job-b-trainer-1.job-b.ns.svc:29500"]
        assert [p.render() for p in got[0].verifiers] == ["job-a-verifier-0.job-a.ns.svc:29500"]
        assert got[1].job.spec.roles.trainer.replicas == 2 and got[0].weight == got[0].spec.algorithm.group_size * \
            got[0].spec.algorithm.prompts_per_step
    entries = json.loads(by_name["shared-pool-jobs"]["data"][names.POOL_JOBS_FILE])["jobs"]
    assert [(e["name"], e["namespace"], e["uid"], e["slot"], e["portBases"]) for e in entries] == \
        [("job-a", "ns", "uid-job-a", 0, [29510, 29510]), ("job-b", "ns", "uid-job-b", 2, [29530, 29530])]
    secret = by_name[f"shared-pool-key-{KEY_ID}"]
    assert secret["stringData"] == {names.POOL_KEY_FILE: POOL_KEY.hex()}
    assert secret["metadata"]["ownerReferences"][0]["kind"] == contract.POOL_KIND
    assert job_key("job-a") != job_key("job-b") and job_key("job-a") != job_key("job-a", "uid-other"), \
        "a job re-created under its name gets a new key"


def test_the_pod_template_is_the_same_whatever_is_attached() -> None:
    """Attaching or leaving changes the files, never the engines' pods (no restart; the kubelet refreshes the
    projected folder: no ``subPath`` mount, which it would not)."""
    alone = pool_render.statefulset(POOL, pool_render.PoolContext(namespace="ns", uid="p-1", key_id=KEY_ID))
    served = pool_render.statefulset(POOL, pool_render.PoolContext(
        namespace="ns", uid="p-1", key_id=KEY_ID, attached=("job-a",), members=(member("job-a", 29510),)))
    assert alone == served
    pod = served["spec"]["template"]["spec"]
    assert not any("subPath" in m or "subPathExpr" in m for m in pod["containers"][0]["volumeMounts"])
    vol = next(v for v in pod["volumes"] if v["name"] == names.CONFIG_VOLUME)["projected"]
    assert vol["defaultMode"] == 0o440 and [next(iter(s.values()))["name"] for s in vol["sources"]] == \
        ["shared-pool-config", "shared-pool-jobs", f"shared-pool-key-{KEY_ID}"]


def secrets_named(obj: Any) -> set[str]:
    out: set[str] = set()
    if isinstance(obj, dict):
        for k, v in obj.items():
            if k in ("secretKeyRef", "secret", "secretRef") and isinstance(v, dict) and "name" in v:
                out.add(v["name"])
            out |= secrets_named(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            out |= secrets_named(v)
    return out


def test_no_job_pod_is_given_another_jobs_key() -> None:
    for name in ("job-a", "job-b"):
        own = names.pool_job_key_secret(name, poolkeys.key_id(job_key(name)))
        ctx = context.RenderContext(namespace="ns", uid=f"uid-{name}", pool_engines=2, pool_port_base=29520,
                                    key_secret=own)
        desired = render.render(lora_job(name), ctx).desired
        assert secrets_named(desired) == {own}, name
    pool_objs = rendered(pool_render.PoolContext(namespace="ns", uid="p-1", key_id=KEY_ID,
                                                 members=(member("job-a", 29510),)))
    assert secrets_named(pool_objs) == {f"shared-pool-key-{KEY_ID}"}
    assert POOL_KEY.hex() not in json.dumps([o for o in pool_objs if o["kind"] != "Secret"]), "in the Secret only"


# ---------------------------------------------------------------- a pool pass


def body(name: str, **status: Any) -> dict[str, Any]:
    doc = load.dump(lora_job(name))
    doc["metadata"]["uid"] = f"uid-{name}"
    if status:
        doc["status"] = status
    return doc


def served(fake: test_pool.FakeCluster) -> list[tuple[str, int]]:
    jobs = json.loads(fake.objects[("ConfigMap", "shared-pool-jobs")]["data"][names.POOL_JOBS_FILE])["jobs"]
    return [(e["name"], e["portBases"][0]) for e in jobs]


def test_a_pool_pass_serves_the_attached_jobs_and_keeps_their_ports_across_passes() -> None:
    fake = test_pool.FakeCluster(test_pool.pool_doc(), [body("job-b"), body("job-a"), body("job-c")])
    out = test_pool.pass_of(fake)       # the fake refuses any GET of a Secret
    assert out.requeue_after is None
    assert fake.status is not None
    assert fake.status["jobPorts"] == [{"name": "job-a", "portBase": 29510}, {"name": "job-b", "portBase": 29520},
                                       {"name": "job-c", "portBase": 29530}]
    assert served(fake) == [("job-a", 29510), ("job-b", 29520), ("job-c", 29530)], "every job listed: no key to wait"
    assert fake.objects[("Secret", f"shared-pool-key-{KEY_ID}")]["stringData"] == \
        {names.POOL_KEY_FILE: POOL_KEY.hex()}
    assert not any(kind == "Secret" and n != f"shared-pool-key-{KEY_ID}" for kind, n in fake.objects)

    # job-a goes, job-d attaches: b and c keep their blocks, d takes the one a freed
    assert fake.pool is not None
    fake.pool["status"] = fake.status
    fake.jobs = [body("job-b"), body("job-c"), body("job-d")]
    assert test_pool.pass_of(fake).requeue_after is None
    assert fake.status["jobPorts"] == [{"name": "job-b", "portBase": 29520}, {"name": "job-c", "portBase": 29530},
                                       {"name": "job-d", "portBase": 29510}]
    assert served(fake) == [("job-b", 29520), ("job-c", 29530), ("job-d", 29510)]
    data = fake.objects[("ConfigMap", "shared-pool-jobs")]["data"]
    assert names.pool_job_manifest("job-a") not in data and names.pool_job_manifest("job-d") in data


SUSPENDED = {"conditions": [{"type": "Suspended", "status": "True", "reason": "Evicted"}]}
RUNNING = {"conditions": [{"type": "Suspended", "status": "False", "reason": "NotSuspended"}]}


def test_a_suspended_job_leaves_the_jobs_file_keeps_its_block_and_comes_back_when_it_resumes() -> None:
    """Kueue evicting a job (its Suspended condition, written by its own pass) or ``spec.suspend``: the engines
    stop serving it (its share and adapter slot released); its port block is kept, so nothing else takes it and
    its pods' template does not change; resumed, it is served again at the same block."""
    fake = test_pool.FakeCluster(test_pool.pool_doc(), [body("job-a", **RUNNING), body("job-b", **RUNNING)])
    test_pool.pass_of(fake)
    assert served(fake) == [("job-a", 29510), ("job-b", 29520)]
    assert fake.pool is not None
    fake.pool["status"] = fake.status
    fake.jobs = [body("job-a", **SUSPENDED), body("job-b", **RUNNING), body("job-c")]
    test_pool.pass_of(fake)
    assert served(fake) == [("job-b", 29520), ("job-c", 29530)], "job-a suspended: not served"
    assert fake.status is not None and fake.status["attachedJobs"] == ["job-a", "job-b", "job-c"]
    assert {e["name"]: e["portBase"] for e in fake.status["jobPorts"]} == \
        {"job-a": 29510, "job-b": 29520, "job-c": 29530}, "its block kept: job-c did not take it"
    fake.pool["status"] = fake.status
    fake.jobs = [body("job-a", **RUNNING), body("job-b", **RUNNING), body("job-c", **RUNNING)]
    test_pool.pass_of(fake)
    assert served(fake) == [("job-a", 29510), ("job-b", 29520), ("job-c", 29530)], "resumed: served again"


def test_a_finished_job_leaves_the_jobs_file_and_keeps_its_block_until_it_is_deleted() -> None:
    """A job that Succeeded or Failed still names the pool (attached until deleted), but its pods are gone: the
    engines drop it (its channel and adapter slot) instead of keeping both until the job is deleted; its block is
    kept (no newcomer takes it while engines that have not re-read the file still hold its socket)."""
    fake = test_pool.FakeCluster(test_pool.pool_doc(), [body("job-a", **RUNNING), body("job-b", **RUNNING),
                                                        body("job-c", **RUNNING)])
    test_pool.pass_of(fake)
    assert served(fake) == [("job-a", 29510), ("job-b", 29520), ("job-c", 29530)]
    assert fake.pool is not None
    fake.pool["status"] = fake.status
    fake.jobs = [body("job-a", phase="Succeeded", **RUNNING), body("job-b", phase="Failed", **RUNNING),
                 body("job-c", phase="Running", **RUNNING), body("job-d")]
    test_pool.pass_of(fake)
    assert served(fake) == [("job-c", 29530), ("job-d", 29540)], "job-a Succeeded, job-b Failed: not served"
    assert fake.status is not None and fake.status["attachedJobs"] == ["job-a", "job-b", "job-c", "job-d"]
    assert {e["name"]: e["portBase"] for e in fake.status["jobPorts"]} == \
        {"job-a": 29510, "job-b": 29520, "job-c": 29530, "job-d": 29540}, "their blocks kept until deleted"
    data = fake.objects[("ConfigMap", "shared-pool-jobs")]["data"]
    assert names.pool_job_manifest("job-a") not in data and names.pool_job_manifest("job-c") in data


@pytest.mark.parametrize(("phase", "done"), [("Succeeded", True), ("Failed", True), ("Running", False),
                                             ("Suspended", False), ("Pending", False), (None, False)])
def test_what_counts_as_finished(phase: str | None, done: bool) -> None:
    doc: dict[str, Any] = {"spec": {}, "status": {"phase": phase} if phase else {}}
    assert poolstatus.finished(doc) is done
    assert poolstatus.held(doc) is done


@pytest.mark.parametrize(("doc", "held"), [
    ({"spec": {"suspend": True}}, True),
    ({"spec": {}, "status": SUSPENDED}, True),
    ({"spec": {}, "status": RUNNING}, False),
    ({"spec": {"suspend": True}, "status": RUNNING}, True),        # its pass has not seen the suspend yet
    ({"metadata": {"labels": {contract.LABEL_KUEUE_QUEUE: "q"}}, "spec": {}}, True),    # queued, nothing said yet
    ({"metadata": {"labels": {contract.LABEL_KUEUE_QUEUE: "q"}}, "spec": {}, "status": RUNNING}, False),
    ({"spec": {}}, False),
])
def test_what_counts_as_suspended(doc: dict[str, Any], held: bool) -> None:
    assert poolstatus.suspended(doc) is held


def test_without_a_master_key_a_pool_renders_nothing_and_says_why() -> None:
    fake = test_pool.FakeCluster(test_pool.pool_doc(), [body("job-a")])
    test_pool.pass_of(fake, master=None)
    assert fake.objects == {}, "no engines that could not mount their key"
    assert fake.status is not None
    ready = next(c for c in fake.status["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("False", poolstatus.NO_MASTER_KEY)
    assert "--pool-master-key-file" in ready["message"]


def test_an_attached_job_that_cannot_be_served_does_not_stop_the_others() -> None:
    bad = body("job-x")
    bad["spec"]["model"].pop("lora")
    members = poolreconcile.pool_members("shared", [bad, body("job-a"), {"metadata": {"name": "job-y"}, "spec": {}}],
                                         {"job-a": 29510, "job-x": 29520, "job-y": 29530})
    assert [(m.name, m.uid) for m in members] == [("job-a", "uid-job-a")]


# ---------------------------------------------------------------- a job's pass


def job_pass(pool: dict[str, Any] | None, *, master: bytes | None = MASTER,
             job_fake: test_pool.JobFake | None = None) -> test_pool.JobFake:
    if job_fake is None:
        doc = load.dump(test_pool.pool_job())
        doc["metadata"].update(uid="u-1", generation=1, creationTimestamp="2026-11-22T12:00:00Z")
        job_fake = test_pool.JobFake(doc, test_pool.FakeCluster(pool))
    reconcile.reconcile(job_fake, ("ns", "tiny"), image="img", cache=reconcile.ApplyCache(),  # type: ignore[arg-type]
                        clock=lambda: opbuilders.T0, pool_master=master)
    return job_fake


def key_ref(job_fake: test_pool.JobFake) -> str:
    sts = job_fake.objects[("StatefulSet", "tiny-trainer")]
    (ref,) = [e["valueFrom"]["secretKeyRef"]["name"] for e in sts["spec"]["template"]["spec"]["containers"][0]["env"]
              if e["name"] == contract.ENV_JOB_KEY]
    return str(ref)


def test_a_jobs_roles_dial_the_engines_at_its_own_port_block() -> None:
    job_fake = job_pass(test_pool.with_port(test_pool.pool_doc(), port_base=29540))
    for role in ("trainer", "verifier"):
        sts = job_fake.objects[("StatefulSet", f"tiny-{role}")]
        env = {e["name"]: e.get("value") for e in sts["spec"]["template"]["spec"]["containers"][0]["env"]}
        assert env[contract.env_peers("generator")] == \
            "shared-pool-0.shared-pool.ns.svc:29540,shared-pool-1.shared-pool.ns.svc:29540"
        assert env[contract.ENV_PORT_BASE] == str(contract.DEFAULT_PORT_BASE), "its own pods keep theirs"
        assert sts["spec"]["replicas"] == 1


def test_a_job_the_pool_has_given_no_block_yet_gets_no_pods() -> None:
    job_fake = job_pass(test_pool.pool_doc())
    assert job_fake.objects[("StatefulSet", "tiny-trainer")]["spec"]["replicas"] == 0
    assert "PoolNotFound" not in job_fake.events, "the pool is there: its pass gives the block"


def test_a_jobs_key_is_derived_from_its_pools_and_is_the_one_the_engines_derive() -> None:
    job_fake = job_pass(test_pool.with_port(test_pool.pool_doc()))
    key = poolkeys.job_key(POOL_KEY, namespace="ns", job="tiny", uid="u-1")
    name = names.pool_job_key_secret("tiny", poolkeys.key_id(key))
    assert job_fake.objects[("Secret", name)]["stringData"] == {contract.JOB_KEY_SECRET_KEY: key.hex()}
    assert key_ref(job_fake) == name and ("Secret", "tiny-key") not in job_fake.objects
    entry = pool_render.jobs_entry(POOL, pool_render.PoolContext(namespace="ns", uid="p-1"), pool_render.Member(
        job=test_pool.pool_job(), uid="u-1", port_base=29510))
    assert poolkeys.job_key(POOL_KEY, namespace=str(entry["namespace"]), job=str(entry["name"]),
                            uid=str(entry["uid"])) == key, "what an engine derives from the jobs file"


def test_a_key_secret_left_with_another_key_is_never_used() -> None:
    """A Secret ``<job>-key`` made before (a job made by an older operator, a pool that did not exist yet) or one
    restored from a backup (new UIDs, so another derived key), or a master key changed: the operator cannot read a
    Secret to compare, so the Secret a job on a pool uses is named by its derived key's fingerprint; one holding any
    other key has another name, and the pass creates the right one beside it and points the pods at it."""
    doc = load.dump(test_pool.pool_job())
    doc["metadata"].update(uid="u-1", generation=1, creationTimestamp="2026-11-22T12:00:00Z")
    job_fake = test_pool.JobFake(doc, test_pool.FakeCluster(test_pool.with_port(test_pool.pool_doc())))
    foreign = {"kind": "Secret", "metadata": {"name": "tiny-key"}, "stringData": {"key": "ff" * 32}}
    job_fake.objects[("Secret", "tiny-key")] = foreign
    job_pass(None, job_fake=job_fake)
    first = key_ref(job_fake)
    assert first.startswith("tiny-key-") and job_fake.objects[("Secret", "tiny-key")] is foreign, "left alone"
    other_master = bytes(32)
    job_pass(None, job_fake=job_fake, master=other_master)
    key = poolkeys.job_key(poolkeys.pool_key(other_master, namespace="ns", pool="shared", uid="p-1"),
                           namespace="ns", job="tiny", uid="u-1")
    assert key_ref(job_fake) == names.pool_job_key_secret("tiny", poolkeys.key_id(key)) != first
    assert job_fake.objects[("Secret", key_ref(job_fake))]["stringData"]["key"] == key.hex()


def test_a_job_gets_no_key_before_its_pool_exists_nor_without_a_master_key() -> None:
    job_fake = job_pass(None)
    assert not [n for kind, n in job_fake.objects if kind == "Secret"], "nothing to derive it from yet"
    job_fake = job_pass(test_pool.with_port(test_pool.pool_doc()), master=None)
    assert not [n for kind, n in job_fake.objects if kind == "Secret"]
    assert job_fake.objects[("StatefulSet", "tiny-trainer")]["spec"]["replicas"] == 0, "held: no key, no pods"


def test_a_job_with_generators_of_its_own_keeps_a_drawn_key_under_its_plain_name() -> None:
    fake = test_pool.JobFake(load.dump(opbuilders.job("tiny")) | {}, test_pool.FakeCluster(None))
    fake.job["metadata"].update(uid="u-1", generation=1, creationTimestamp="2026-11-22T12:00:00Z")
    job_pass(None, job_fake=fake)
    assert key_ref(fake) == "tiny-key" and len(fake.objects[("Secret", "tiny-key")]["stringData"]["key"]) == 64
