"""``kubeforge run pool.yaml job-a.yaml job-b.yaml`` before any process starts (``launcher.poolrun``): what it
refuses, the files the engines read (``generator.pool.attach``), each job's env contract pointing at the engines,
and the pool's summary from the engines' ledgers."""
from __future__ import annotations

import json
import os
import pathlib
import stat
import sys

import pytest
import yaml

from kubeforge.api import contract, load, roleenv
from kubeforge.runtime.generator.pool import attach
from kubeforge.runtime.launcher import main, poolrun, supervisor

ROOT = pathlib.Path(__file__).resolve().parents[2]
POOL = ROOT / "examples" / "pool"
FILES = [str(POOL / "pool.yaml"), str(POOL / "job-a.yaml"), str(POOL / "job-b.yaml")]


def test_the_examples_prepare() -> None:
    (pool_file, pool), jobs = poolrun.prepare(FILES, steps=3)
    assert pool.metadata.name == "shared" and [j.metadata.name for _, j in jobs] == ["pool-job-a", "pool-job-b"]
    assert all(j.spec.algorithm.steps == 3 for _, j in jobs)


def test_the_learning_examples_prepare() -> None:
    """``examples/pool/smollm2/``: the pool and its two jobs pass together (same base model and dtype, ranks within
    the pool's), each job on the pool with a task of its own."""
    files = [str(POOL / "smollm2" / n) for n in ("pool.yaml", "job-a.yaml", "job-b.yaml")]
    (_, pool), jobs = poolrun.prepare(files, steps=None)
    assert pool.metadata.name == "smollm2"
    assert [j.metadata.name for _, j in jobs] == ["pool-smollm2-a", "pool-smollm2-b"]
    assert all(j.spec.generator_pool is not None and j.spec.generator_pool.name == "smollm2" for _, j in jobs)
    assert len({str(j.spec.task.arithmetic) for _, j in jobs}) == 2


def edited(tmp_path: pathlib.Path, name: str, **roles: object) -> str:
    doc = yaml.safe_load((POOL / name).read_text())
    doc["spec"]["roles"].update(roles)
    out = tmp_path / name
    out.write_text(yaml.safe_dump(doc))
    return str(out)


def test_what_a_pool_does_not_serve_is_refused_naming_the_field(tmp_path: pathlib.Path) -> None:
    job = edited(tmp_path, "job-a.yaml", generator={"tensorParallelSize": 2})
    with pytest.raises(load.InvalidRLJob) as exc:
        poolrun.prepare([FILES[0], job], steps=None)
    assert exc.value.problems == [f"{job}: spec.roles.generator.tensorParallelSize: Invalid value: 2: should be the "
                                  "GeneratorPool's tensorParallelSize (1): the weight-sync ranks are the engines'"]
    with pytest.raises(load.InvalidRLJob) as exc:
        poolrun.prepare(FILES[1:], steps=None)
    assert exc.value.problems[-1].startswith("kubeforge run takes one GeneratorPool and the jobs that name it")
    with pytest.raises(load.InvalidRLJob) as exc:
        poolrun.prepare([FILES[0], FILES[1], FILES[1]], steps=None)
    assert any("metadata.name: Duplicate value" in p for p in exc.value.problems)


def test_the_run_returns_2_before_any_process_starts(tmp_path: pathlib.Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    assert poolrun.run(files=FILES[1:], run_dir=str(tmp_path / "r")) == load.EXIT_INVALID
    assert "kubeforge: kubeforge run takes one GeneratorPool" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_layout_points_every_job_at_the_engines_and_the_engines_at_every_job(tmp_path: pathlib.Path) -> None:
    (_, pool), jobs = poolrun.prepare(FILES, steps=None)
    specs, runs = poolrun._layout(pool, jobs, tmp_path)
    assert [s.name for s in specs] == ["pool-0"]
    env = specs[0].env
    assert env[contract.ENV_POOL] == "shared" and env[contract.ENV_ROLE] == "generator"
    assert stat.S_IMODE(os.stat(env[contract.ENV_POOL_KEY]).st_mode) == 0o600
    attached = attach.read(jobs_path=env[contract.ENV_POOL_JOBS], key_path=env[contract.ENV_POOL_KEY],
                           pool="shared", index=0)
    assert [a.name for a in attached] == ["pool-job-a", "pool-job-b"]
    assert [a.weight for a in attached] == [64, 64]                     # promptsPerStep x groupSize
    bases = {specs[0].port_base}
    for jr, a in zip(runs, attached):
        assert a.key == jr.key and a.port_base == jr.engines[0].port_base
        procs = main.process_specs(job=jr.job, run=jr.run, attempt=0, bases=list(jr.bases), job_key=jr.key,
                                   generators=jr.engines)
        assert sorted(p.role for p in procs) == ["trainer", "verifier"]     # no generator of its own
        for p in procs:
            assert p.env[contract.env_peers("generator")] == f"127.0.0.1:{a.port_base}"
            assert p.env[contract.ENV_JOB_KEY] == jr.key.hex()
        trainer = next(p for p in procs if p.role == "trainer")
        assert a.trainers == (roleenv.Peer(host="127.0.0.1", port_base=trainer.port_base),)
        bases |= {a.port_base, *(p.port_base for p in procs)}
    assert len(bases) == 1 + 2 * 3                                        # every block distinct
    assert runs[0].key != runs[1].key


def test_attach_refuses_a_job_without_an_identity_and_a_pool_without_a_key(tmp_path: pathlib.Path) -> None:
    (_, pool), jobs = poolrun.prepare(FILES, steps=None)
    specs, _ = poolrun._layout(pool, jobs, tmp_path)
    jobs_path = pathlib.Path(specs[0].env[contract.ENV_POOL_JOBS])
    key_path = specs[0].env[contract.ENV_POOL_KEY]
    doc = json.loads(jobs_path.read_text())
    del doc["jobs"][1]["uid"]
    jobs_path.write_text(json.dumps(doc))
    with pytest.raises(attach.AttachError) as exc:
        attach.read(jobs_path=str(jobs_path), key_path=key_path, pool="shared", index=0)
    assert exc.value.problems == [f"{jobs_path}: jobs[1]: Required value: namespace and uid, the job's identity its "
                                  "key is derived from"]
    pathlib.Path(key_path).write_text("00" * 8)
    with pytest.raises(attach.AttachError) as exc:
        attach.read(jobs_path=str(jobs_path), key_path=key_path, pool="shared", index=0)
    assert exc.value.problems == [f"{key_path}: Invalid value: the pool's key, at least 32 hex characters (a pool "
                                  "serves no job unauthenticated)"]
    pathlib.Path(key_path).write_text("00" * 32)
    with pytest.raises(attach.AttachError, match="must name GeneratorPool 'other'"):
        attach.read(jobs_path=str(jobs_path), key_path=key_path, pool="other", index=0)


def test_the_pool_summary_adds_up_the_engines_ledgers(tmp_path: pathlib.Path) -> None:
    (_, pool), _ = poolrun.prepare(FILES, steps=None)
    ledger = {"engine": 0, "jobs": {
        "pool-job-a": {"engine_seconds": 3.0, "completions": 64, "adapter_swaps": 1, "adapter_versions": [0, 1, 2]},
        "pool-job-b": {"engine_seconds": 1.0, "completions": 32, "adapter_swaps": 0, "adapter_versions": [0, 1]}}}
    (tmp_path / "pool-0.json").write_text(json.dumps(ledger))
    results = [{"job": "pool-job-a", "succeeded": True, "steps": 2}, {"job": "pool-job-b", "succeeded": False}]
    out = poolrun.pool_summary(pool, root=tmp_path, results=results, wall_seconds=12.34)
    assert out["pool"] == "shared" and out["succeeded"] is False and out["completions"] == 96
    assert out["jobs"]["pool-job-a"]["engine_share"] == 0.75 and out["jobs"]["pool-job-b"]["engine_share"] == 0.25
    assert out["jobs"]["pool-job-a"]["adapter_versions"] == [0, 1, 2]


def test_a_lost_engine_is_restarted_with_the_running_jobs_at_most_engine_restarts_times(
        tmp_path: pathlib.Path) -> None:
    (_, pool), jobs = poolrun.prepare(FILES, steps=None)
    specs, runs = poolrun._layout(pool, jobs, tmp_path)
    engine = supervisor.ProcSpec(name="pool-0", role="generator", argv=[sys.executable, "-c", "raise SystemExit(3)"],
                                 env=dict(os.environ), log=tmp_path / "logs" / "pool-0.log")
    group = supervisor.Group([engine])
    group.start()
    dog = supervisor.Watchdog(group)
    runs[1].status = 0                                  # job b ended: its trainer would never answer a READY
    restarts: dict[str, int] = {}
    pids = []
    for n in range(1, poolrun.ENGINE_RESTARTS + 1):
        group.procs["pool-0"].wait()
        pids.append(group.procs["pool-0"].pid)
        dead = group.poll()
        assert [e.code for e in dead] == [3]
        assert poolrun._restart_engines(group, dog, dead, runs, root=tmp_path, restarts=restarts)
        assert restarts == {"pool-0": n} and group.procs["pool-0"].pid not in pids    # started again in place
        attached = attach.read(jobs_path=str(tmp_path / "jobs.json"), key_path=str(tmp_path / "pool.key"),
                               pool="shared", index=0)
        assert [a.name for a in attached] == ["pool-job-a"] and attached[0].key == runs[0].key
        assert stat.S_IMODE(os.stat(tmp_path / "pool.key").st_mode) == 0o600
    group.procs["pool-0"].wait()
    assert not poolrun._restart_engines(group, dog, group.poll(), runs, root=tmp_path, restarts=restarts)
    assert runs[0].status == 1 and "pool engine pool-0 ended (exit code 3) after 3 restarts" in runs[0].message
    assert runs[1].status == 0                          # an ended job keeps its verdict
    group.stop(grace=1.0)


def test_a_job_that_ends_leaves_the_engines_jobs_file(tmp_path: pathlib.Path) -> None:
    """As the operator drops a Succeeded or Failed job from a pool's jobs file, the launcher rewrites it to the jobs
    still running once one ends: the engines close the ended job's channel and unload its adapter."""
    (_, pool), jobs = poolrun.prepare(FILES, steps=None)
    _, runs = poolrun._layout(pool, jobs, tmp_path)

    def listed() -> list[str]:
        return [a.name for a in attach.read(jobs_path=str(tmp_path / "jobs.json"),
                                            key_path=str(tmp_path / "pool.key"), pool="shared", index=0)]

    names = frozenset(jr.name for jr in runs)
    assert poolrun.drop_finished(tmp_path, runs, listed=names) == names and listed() == ["pool-job-a", "pool-job-b"]
    runs[0].status = 0                                  # job a succeeded
    now = poolrun.drop_finished(tmp_path, runs, listed=names)
    assert now == {"pool-job-b"} and listed() == ["pool-job-b"]
    runs[1].status = 1                                  # the last job's end: nothing left to serve, file kept
    assert poolrun.drop_finished(tmp_path, runs, listed=now) == now and listed() == ["pool-job-b"]
