"""The operator's side of a GeneratorPool's runtime (docs/generator-pool.md, "Attaching on a cluster"): what the
engines read of the jobs attached to them, and what those jobs' roles dial.

- ``poolports``: each attached job's port block, kept while it is attached, freed when it goes, never shared;
- ``render.pool``: the jobs file (ConfigMap ``<pool>-pool-jobs``) and keys file (Secret ``<pool>-pool-keys``),
  read here by the runtime's own reader (``generator.pool.attach``) from the folder the pod projects them into;
  a job's key in the pool's Secret only; the pod template the same whatever is attached (no engine restarts);
- a pool pass (the in-memory fake of ``tests/operator/test_pool.py``): the ports recorded in the status and kept
  across passes, the keys read from each job's Secret, a job without its key yet not served and looked at again;
- a job's pass: its roles dial the engines at its own port block; no block yet, no pods.
"""
from __future__ import annotations

import base64
import json
import pathlib
from typing import Any

import pytest

import opbuilders
import test_pool  # tests/operator: the fakes of a pool's and a job's pass
from kubeforge.api import contract, load
from kubeforge.operator import names, poolports, poolreconcile, reconcile, render
from kubeforge.operator.render import context
from kubeforge.operator.render import pool as pool_render
from kubeforge.runtime.generator.pool import attach

POOL = load.parse_pool(test_pool.pool_doc())      # "shared", 2 engines, namespace "ns"


def lora_job(name: str, *, pool: str = "shared", **overrides: Any) -> Any:
    return opbuilders.job("tiny", metadata__name=name, spec__model__lora={"rank": 8},
                          spec__generatorPool={"name": pool}, **overrides)


def member(name: str, port_base: int, key: str, **overrides: Any) -> pool_render.Member:
    return pool_render.Member(job=lora_job(name, **overrides), port_base=port_base, key_hex=key * 32)


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
    """Write the pool's config, jobs ConfigMap and keys Secret into ``folder`` as the kubelet projects them (the
    StatefulSet's projected volume, its sources in order), with ``names.CONFIG_DIR`` mounted at ``folder``."""
    by_name = {o["metadata"]["name"]: o for o in objs}
    sts = next(o for o in objs if o["kind"] == "StatefulSet")
    vol = next(v for v in sts["spec"]["template"]["spec"]["volumes"] if v["name"] == names.CONFIG_VOLUME)
    for src in vol["projected"]["sources"]:
        ref = src.get("configMap") or src["secret"]
        obj = by_name[ref["name"]]
        for key, value in obj["data"].items():
            text = base64.b64decode(value).decode() if obj["kind"] == "Secret" else value
            (folder / key).write_text(text.replace(names.CONFIG_DIR + "/", f"{folder}/"))
    return by_name


def test_the_engines_read_the_rendered_files_with_the_runtimes_own_reader(tmp_path: pathlib.Path) -> None:
    ctx = pool_render.PoolContext(namespace="ns", uid="p-1", attached=("job-a", "job-b", "job-c"),
                                  members=(member("job-a", 29510, "a1"),
                                           member("job-b", 29530, "b2", spec__roles__trainer__replicas=2)))
    objs = pool_render.render(POOL, ctx)
    by_name = project(objs, tmp_path)
    env = {e["name"]: e.get("value") for e in objs[-1]["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env[contract.ENV_POOL_JOBS] == f"{names.CONFIG_DIR}/{names.POOL_JOBS_FILE}"
    assert env[contract.ENV_POOL_KEYS] == f"{names.CONFIG_DIR}/{names.POOL_KEYS_FILE}"
    for index in (0, 1):     # every engine serves a job at the same port base
        got = attach.read(jobs_path=str(tmp_path / names.POOL_JOBS_FILE),
                          keys_path=str(tmp_path / names.POOL_KEYS_FILE), pool="shared", index=index)
        assert [(a.name, a.port_base, a.key.hex()) for a in got] == \
            [("job-a", 29510, "a1" * 32), ("job-b", 29530, "b2" * 32)], "job-c has no key yet: not served"
        assert [p.render() for p in got[1].trainers] == \
            ["job-b-trainer-0.job-b.ns.svc:29500", "job-b-trainer-1.job-b.ns.svc:29500"]
        assert [p.render() for p in got[0].verifiers] == ["job-a-verifier-0.job-a.ns.svc:29500"]
        assert got[1].job.spec.roles.trainer.replicas == 2 and got[0].weight == got[0].spec.algorithm.group_size * \
            got[0].spec.algorithm.prompts_per_step
    entries = json.loads(by_name["shared-pool-jobs"]["data"][names.POOL_JOBS_FILE])["jobs"]
    assert [(e["name"], e["namespace"], e["slot"], e["portBases"]) for e in entries] == \
        [("job-a", "ns", 0, [29510, 29510]), ("job-b", "ns", 2, [29530, 29530])]
    assert json.loads(base64.b64decode(by_name["shared-pool-keys"]["data"][names.POOL_KEYS_FILE])) == \
        {"job-a": "a1" * 32, "job-b": "b2" * 32}
    assert by_name["shared-pool-keys"]["metadata"]["ownerReferences"][0]["kind"] == contract.POOL_KIND


def test_the_pod_template_is_the_same_whatever_is_attached() -> None:
    """Attaching or leaving changes the files, never the engines' pods (no restart; the kubelet refreshes the
    projected folder: no ``subPath`` mount, which it would not)."""
    alone = pool_render.statefulset(POOL, pool_render.PoolContext(namespace="ns", uid="p-1"))
    served = pool_render.statefulset(POOL, pool_render.PoolContext(
        namespace="ns", uid="p-1", attached=("job-a",), members=(member("job-a", 29510, "a1"),)))
    assert alone == served
    pod = served["spec"]["template"]["spec"]
    assert not any("subPath" in m or "subPathExpr" in m for m in pod["containers"][0]["volumeMounts"])
    vol = next(v for v in pod["volumes"] if v["name"] == names.CONFIG_VOLUME)["projected"]
    assert vol["defaultMode"] == 0o440 and [next(iter(s.values()))["name"] for s in vol["sources"]] == \
        ["shared-pool-config", "shared-pool-jobs", "shared-pool-keys"]


def test_no_job_pod_is_given_another_jobs_key() -> None:
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

    ctx = context.RenderContext(namespace="ns", uid="u-1", pool_engines=2, pool_port_base=29520)
    for name in ("job-a", "job-b"):
        desired = render.render(lora_job(name), ctx).desired
        assert secrets_named(desired) == {f"{name}-key"}, name
    pool_objs = pool_render.render(POOL, pool_render.PoolContext(namespace="ns", uid="p-1",
                                                                 members=(member("job-a", 29510, "a1"),)))
    assert secrets_named(pool_objs) == {"shared-pool-keys"}
    assert "a1" * 32 not in json.dumps([o for o in pool_objs if o["kind"] != "Secret"]), "the key: in the Secret only"
    assert "a1" * 32 not in repr(member("job-a", 29510, "a1"))


# ---------------------------------------------------------------- a pool pass


def key_secret(key: bytes) -> dict[str, Any]:
    return {"data": {contract.JOB_KEY_SECRET_KEY: base64.b64encode(key.hex().encode()).decode()}}


def body(name: str) -> dict[str, Any]:
    return load.dump(lora_job(name))


def test_a_pool_pass_serves_the_keyed_jobs_and_keeps_their_ports_across_passes() -> None:
    fake = test_pool.FakeCluster(test_pool.pool_doc(), [body("job-b"), body("job-a"), body("job-c")])
    fake.objects[("Secret", "job-a-key")] = key_secret(b"\x0a" * 32)
    fake.objects[("Secret", "job-b-key")] = key_secret(b"\x0b" * 32)
    out = test_pool.pass_of(fake)
    assert out.requeue_after == poolreconcile.KEY_WAIT_S, "job-c's key is not there yet: looked at again"
    assert fake.status is not None
    assert fake.status["jobPorts"] == [{"name": "job-a", "portBase": 29510}, {"name": "job-b", "portBase": 29520},
                                       {"name": "job-c", "portBase": 29530}]
    jobs = json.loads(fake.objects[("ConfigMap", "shared-pool-jobs")]["data"][names.POOL_JOBS_FILE])["jobs"]
    assert [(e["name"], e["portBases"]) for e in jobs] == [("job-a", [29510, 29510]), ("job-b", [29520, 29520])]
    keys = fake.objects[("Secret", "shared-pool-keys")]["data"][names.POOL_KEYS_FILE]
    assert json.loads(base64.b64decode(keys)) == {"job-a": "0a" * 32, "job-b": "0b" * 32}

    # job-c's key arrives, job-a goes, job-d attaches: b and c keep their blocks, d takes the one a freed
    assert fake.pool is not None
    fake.pool["status"] = fake.status
    fake.objects[("Secret", "job-c-key")] = key_secret(b"\x0c" * 32)
    fake.objects[("Secret", "job-d-key")] = key_secret(b"\x0d" * 32)
    fake.jobs = [body("job-b"), body("job-c"), body("job-d")]
    assert test_pool.pass_of(fake).requeue_after is None
    assert fake.status["jobPorts"] == [{"name": "job-b", "portBase": 29520}, {"name": "job-c", "portBase": 29530},
                                       {"name": "job-d", "portBase": 29510}]
    jobs = json.loads(fake.objects[("ConfigMap", "shared-pool-jobs")]["data"][names.POOL_JOBS_FILE])["jobs"]
    assert [(e["name"], e["portBases"][0]) for e in jobs] == [("job-b", 29520), ("job-c", 29530), ("job-d", 29510)]
    data = fake.objects[("ConfigMap", "shared-pool-jobs")]["data"]
    assert names.pool_job_manifest("job-a") not in data and names.pool_job_manifest("job-d") in data
    keys = fake.objects[("Secret", "shared-pool-keys")]["data"][names.POOL_KEYS_FILE]
    assert sorted(json.loads(base64.b64decode(keys))) == ["job-b", "job-c", "job-d"], "job-a's key is gone"


@pytest.mark.parametrize("secret", [None, {"data": {}}, {"data": {"key": "not base64!"}},
                                    {"data": {"key": base64.b64encode(b"zz" * 32).decode()}},
                                    {"data": {"key": base64.b64encode(b"ab" * 8).decode()}}])
def test_a_key_that_is_absent_or_no_key_serves_nothing(secret: dict[str, Any] | None) -> None:
    assert poolreconcile.key_hex(secret) is None


def test_an_attached_job_that_cannot_be_served_does_not_stop_the_others() -> None:
    bad = body("job-x")
    bad["spec"]["model"].pop("lora")
    members = poolreconcile.pool_members("shared", [bad, body("job-a"), {"metadata": {"name": "job-y"}, "spec": {}}],
                                         {"job-a": 29510, "job-x": 29520, "job-y": 29530},
                                         {"job-a": "aa" * 32, "job-x": "bb" * 32, "job-y": "cc" * 32})
    assert [m.name for m in members] == ["job-a"]


# ---------------------------------------------------------------- a job's pass


def job_pass(pool: dict[str, Any] | None) -> test_pool.JobFake:
    doc = load.dump(test_pool.pool_job())
    doc["metadata"].update(uid="u-1", generation=1, creationTimestamp="2026-11-22T12:00:00Z")
    job_fake = test_pool.JobFake(doc, test_pool.FakeCluster(pool))
    reconcile.reconcile(job_fake, ("ns", "tiny"), image="img", cache=reconcile.ApplyCache(),  # type: ignore[arg-type]
                        clock=lambda: opbuilders.T0)
    return job_fake


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
