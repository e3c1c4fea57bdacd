"""``kubeforge run pool.yaml job-a.yaml job-b.yaml ...``: a GeneratorPool's engines and its jobs' trainers and
verifiers as local processes; one summary JSON line per job, then the pool's summary JSON as the last line.

```
 check (pool + jobs together, then each job's local rules, then what a pool serves locally) ──▶ run dir
   <root>/pool.json, jobs.json, pool.key (0600) ──▶ <root>/<job>/ per job (the single-job run dir layout)
 keys: a master per run ──▶ the pool's key ──▶ each job's (kubeforge.api.poolkeys, as the operator derives them)
 ports: per engine a block of its own + a block per job (the job's KUBEFORGE_PEERS_GENERATOR lists these), per
        job's trainer/verifier process a block; fixed for the whole run (a job's restart reuses them)
 start the engines, then every job's processes ──▶ watch:
     a job's exits ──▶ supervisor.judge with ITS failurePolicy (restart in place / a new attempt of that job alone /
                       succeeded / failed): a job's failure costs only that job
     a job's end ──▶ the jobs file rewritten to the jobs still running (the engines drop the ended job's channel)
     an engine's exit ──▶ restarted in place (same ports, the jobs file rewritten to the jobs still running), at
                       most ENGINE_RESTARTS times per engine; its jobs' trainers push their current adapters to it
                       again (its READY: ``trainer.membership``'s restart path) and re-issue its work; beyond the
                       bound every job still running fails
 every job done ──▶ SIGTERM the engines (each writes <root>/pool-<i>.json) ──▶ summaries
```

Neighbours: ``launcher.main`` (a single job: ``process_specs``, ``finish``, the restart policy) whose pieces this
reuses; ``generator.pool.attach`` is the format of the engines' jobs and key files; ``kubeforge.cli`` sends a pool
and its jobs here once ``kubeforge validate`` would pass them.

Invariants: stdout carries only the summary lines (the pool's last: a contract); invalid input exits 2 before any
process starts; Ctrl-C stops every process and exits 130; the exit status is 0 only when every job succeeded. An
engine restart loses no step and repeats none in any job: its trainers keep running (no job restarts for it), the
restarted engine samples nothing for a job before that job's adapter push (``generator.join.Joining``), and each
trainer's buffer drops the duplicates of re-issued work. The engines' ledgers (``pool-<i>.json``) are the last
incarnation's: an engine killed without a word writes none.
"""
from __future__ import annotations

import dataclasses
import json
import pathlib
import secrets
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

from kubeforge.api import contract, generatorpool, load, poolkeys, rljob, roleenv, validate_pool
from kubeforge.runtime.launcher import main, ports, progressbar, rundir, supervisor

ENGINE = "pool"    # the engines' process names: pool-<i>
ENGINE_RESTARTS = 3    # restarts of one engine per run before its jobs fail (a job's own maxRestarts defaults to 3)


def _err(text: str) -> None:
    print(f"kubeforge: {text}", file=sys.stderr, flush=True)


def local_problems(job: rljob.RLJob, pool: generatorpool.GeneratorPool) -> list[str]:
    """What a pool engine does not serve yet, beyond ``validate_pool.problems`` (docs/generator-pool.md, "Left")."""
    out = list(validate_pool.problems(job, pool))      # (partial rollouts: refused with LoRA by the model)
    if job.spec.environment is not None:
        out.append("spec.environment: Unsupported value: a GeneratorPool's engines sample single-turn tasks "
                   "(episodes on a pool are not built yet)")
    if job.spec.roles.generator.tensor_parallel_size != pool.spec.tensor_parallel_size:
        out.append(f"spec.roles.generator.tensorParallelSize: Invalid value: "
                   f"{job.spec.roles.generator.tensor_parallel_size}: should be the GeneratorPool's "
                   f"tensorParallelSize ({pool.spec.tensor_parallel_size}): the weight-sync ranks are the engines'")
    return out


def prepare(files: list[str], *, steps: int | None
            ) -> tuple[tuple[str, generatorpool.GeneratorPool], list[tuple[str, rljob.RLJob]]]:
    """The pool and its jobs, each checked; raises ``load.InvalidRLJob`` with ``FILE: problem`` lines."""
    pools: list[tuple[str, generatorpool.GeneratorPool]] = []
    jobs: list[tuple[str, rljob.RLJob]] = []
    problems: list[str] = []
    for file in files:
        try:
            doc = load.parse_any_text(pathlib.Path(file).read_text())
        except (load.InvalidRLJob, OSError) as exc:
            problems += [f"{file}: {p}" for p in getattr(exc, "problems", [str(exc)])]
            continue
        if isinstance(doc, generatorpool.GeneratorPool):
            pools.append((file, doc))
            continue
        try:
            job = main.prepare(file, steps=steps)
        except load.InvalidRLJob as exc:
            problems += [f"{file}: {p}" for p in exc.problems]
            continue
        jobs.append((file, job))
    if problems or len(pools) != 1 or not jobs:
        raise load.InvalidRLJob(problems or [f"kubeforge run takes one GeneratorPool and the jobs that name it; got "
                                             f"{len(pools)} pools and {len(jobs)} jobs"])
    pool_file, pool = pools[0]
    names = [j.metadata.name for _, j in jobs]
    if len(set(names)) != len(names):
        problems.append(f"metadata.name: Duplicate value: jobs on one pool need distinct names ({names})")
    for file, job in jobs:
        if job.spec.generator_pool is None or job.spec.generator_pool.name != pool.metadata.name:
            problems.append(f"{file}: spec.generatorPool.name: Invalid value: should name GeneratorPool "
                            f"{pool.metadata.name!r} ({pool_file})")
            continue
        problems += [f"{file}: {p}" for p in local_problems(job, pool)]
    if problems:
        raise load.InvalidRLJob(problems)
    return (pool_file, pool), jobs


@dataclasses.dataclass(kw_only=True)
class JobRun:
    """One job of the run: its run dir, key, ports (fixed for the run), current attempt and verdict."""

    file: str
    job: rljob.RLJob
    run: rundir.RunDir
    key: bytes
    bases: list[int]
    engines: list[roleenv.Peer]          # the job's generators: the pool's engines at the job's port bases
    tally: main.Tally
    bar: progressbar.Progress
    entry: dict[str, Any]                # its record in the engines' jobs file (``attach.write``)
    attempt: int = 0
    group: supervisor.Group | None = None
    dog: supervisor.Watchdog | None = None
    status: int | None = None            # None: running; 0 succeeded; 1 failed
    message: str = ""

    @property
    def name(self) -> str:
        return self.job.metadata.name

    def start(self) -> None:
        specs = main.process_specs(job=self.job, run=self.run, attempt=self.attempt, bases=list(self.bases),
                                   job_key=self.key, generators=self.engines)
        self.group = supervisor.Group(specs)
        self.group.start()
        self.dog = supervisor.Watchdog(self.group)

    def step(self) -> None:
        """One look at the job's processes (``main._watch``'s body for one job)."""
        assert self.group is not None and self.dog is not None
        self.bar.poll()
        self.dog.check()
        exits = self.group.poll()
        verdict, decision = supervisor.judge(exits=exits, trainers=self.job.spec.roles.trainer.replicas,
                                             restarts=self.tally.restarts, policy=self.job.spec.failure_policy,
                                             unhealthy=self.dog.unhealthy(exits))
        if decision is not None:
            self.tally.record(decision, attempt=self.attempt)
        if verdict is supervisor.Verdict.RUNNING:
            return
        if verdict is supervisor.Verdict.SUCCEEDED:
            self.stop()
            self.status = 0
            return
        assert decision is not None
        _err(f"{self.name}: {decision.message}")
        if verdict is supervisor.Verdict.RESTART_IN_PLACE:
            self.group.restart(decision.restart)
            self.dog.forget(decision.restart)
        elif verdict is supervisor.Verdict.RESTART:
            self.stop()
            self.attempt += 1
            self.start()
        else:
            self.stop()
            dead = decision.cause.name if decision.cause is not None else ""
            self.fail(f"{decision.message}; last lines of {self.run.log(dead)}:\n{supervisor.tail(self.run.log(dead))}")

    def fail(self, message: str) -> None:
        self.stop()
        self.status, self.message = 1, message
        _err(f"{self.name}: {message}")

    def stop(self) -> None:
        if self.group is not None:
            self.group.stop()


def _layout(pool: generatorpool.GeneratorPool, jobs: list[tuple[str, rljob.RLJob]], root: pathlib.Path,
            ) -> tuple[list[supervisor.ProcSpec], list[JobRun]]:
    """Ports, keys, the engines' files and process specs, and one ``JobRun`` per job."""
    engines = pool.spec.replicas
    per_job = [j.spec.roles.trainer.replicas + j.spec.roles.verifier.replicas for _, j in jobs]
    blocks = max(j.spec.roles.trainer.ranks() for _, j in jobs)
    bases = iter(ports.allocate(engines * (1 + len(jobs)) + sum(per_job), blocks=blocks))
    engine_bases = [next(bases) for _ in range(engines)]
    runs: list[JobRun] = []
    entries: list[dict[str, Any]] = []
    namespace = pool.metadata.namespace or "default"
    pool_key = poolkeys.pool_key(secrets.token_bytes(32), namespace=namespace, pool=pool.metadata.name,
                                 uid=secrets.token_hex(16))
    for (file, job), count in zip(jobs, per_job):
        uid = secrets.token_hex(16)
        at = [next(bases) for _ in range(engines)]
        own = [next(bases) for _ in range(count)]     # in contract.ROLES order, as main.process_specs hands them out
        run = rundir.create(job_name=job.metadata.name, explicit=str(root / job.metadata.name))
        run.manifest.write_text(json.dumps(load.dump(job), indent=1))
        handed = iter(own)
        peers = {r: [f"127.0.0.1:{next(handed)}" for _ in range(getattr(job.spec.roles, r).replicas)]
                 for r in contract.ROLES if r != "generator"}
        jr = JobRun(file=file, job=job, run=run, bases=own,
                    key=poolkeys.job_key(pool_key, namespace=namespace, job=job.metadata.name, uid=uid),
                    engines=[roleenv.Peer(host="127.0.0.1", port_base=b) for b in at],
                    tally=main.Tally(log=run.root / main.FAILURES),
                    bar=progressbar.Progress(metrics=run.metrics, total=job.spec.algorithm.steps, enabled=False),
                    entry={"name": job.metadata.name, "namespace": namespace, "uid": uid,
                           "manifest": str(run.manifest), "portBases": at,
                           "peers": {"trainer": peers["trainer"], "verifier": peers["verifier"]}})
        runs.append(jr)
    from kubeforge.runtime.generator.pool import attach   # the engines' file format (plain JSON, no vLLM)

    attach.write_key(root / "pool.key", pool_key)
    write_attached(root, runs)
    manifest = root / "pool.json"
    manifest.write_text(json.dumps(load.dump(pool), indent=1))
    specs = []
    for i, base in enumerate(engine_bases):
        env = {**_inherited(), contract.ENV_ROLE: "generator", contract.ENV_POOL: pool.metadata.name,
               contract.ENV_CONFIG: str(manifest), contract.ENV_INDEX: str(i), contract.ENV_PORT_BASE: str(base),
               contract.ENV_BIND_HOST: "127.0.0.1", contract.ENV_RUN_DIR: str(root),
               contract.ENV_POOL_JOBS: str(root / "jobs.json"), contract.ENV_POOL_KEY: str(root / "pool.key"),
               "PYTHONUNBUFFERED": "1"}
        specs.append(supervisor.ProcSpec(name=f"{ENGINE}-{i}", role="generator",
                                         argv=[sys.executable, "-m", "kubeforge.cli", "role", "generator"], env=env,
                                         log=root / "logs" / f"{ENGINE}-{i}.log", port_base=base))
    return specs, runs


def write_attached(root: pathlib.Path, runs: list[JobRun]) -> None:
    """The engines' jobs file (``generator.pool.attach``) of ``runs``, replaced whole (a reader never sees half a
    file; the engines derive each listed job's key from the pool's key file, written once). A restarted engine is
    given only the jobs still running: it announces itself to each listed job's trainer 0, and the trainer of a job
    that ended would never answer."""
    from kubeforge.runtime.generator.pool import attach   # the engines' file format (plain JSON, no vLLM)

    jobs = root / ".jobs.json.tmp"
    attach.write(jobs, [jr.entry for jr in runs])
    jobs.replace(root / "jobs.json")


def _inherited() -> dict[str, str]:
    """The launcher's environment, as every role process gets it (``main.process_specs``), less a job key: an
    engine has none of its own."""
    import os

    return {k: v for k, v in os.environ.items() if k != contract.ENV_JOB_KEY}


def _resolve(jobs: list[tuple[str, rljob.RLJob]], resolve_model: Callable[[rljob.RLJob], None]) -> None:
    for _, job in jobs:
        resolve_model(job)


def supervise(pool_group: supervisor.Group, runs: list[JobRun], *, root: pathlib.Path,
              restarts: dict[str, int]) -> None:
    """Watch the engines and every job until every job is done; a lost engine is restarted in place (counted in
    ``restarts`` by engine), at most ``ENGINE_RESTARTS`` times each."""
    dog = supervisor.Watchdog(pool_group)
    listed = frozenset(jr.name for jr in runs)
    while any(jr.status is None for jr in runs):
        dog.check()
        dead = pool_group.poll()
        if dead and not _restart_engines(pool_group, dog, dead, runs, root=root, restarts=restarts):
            return
        for jr in runs:
            if jr.status is None:
                jr.step()
        listed = drop_finished(root, runs, listed=listed)
        time.sleep(main.POLL_SECONDS)


def drop_finished(root: pathlib.Path, runs: list[JobRun], *, listed: frozenset[str]) -> frozenset[str]:
    """The engines' jobs file rewritten to the jobs still running once one of those ``listed`` in it has ended
    (succeeded or failed), as the operator drops a finished job from a pool's jobs file: the engines close its
    channel and unload its adapter (``serve.regroup``) instead of keeping both to the end of the run. Returns the
    jobs listed now (the last job's end rewrites nothing: the engines stop next)."""
    running = [jr for jr in runs if jr.status is None]
    now = frozenset(jr.name for jr in running)
    if now != listed and running:
        write_attached(root, running)
        return now
    return listed


def _restart_engines(pool_group: supervisor.Group, dog: supervisor.Watchdog, dead: list[supervisor.Exit],
                     runs: list[JobRun], *, root: pathlib.Path, restarts: dict[str, int]) -> bool:
    """Restart the engines in ``dead`` with the jobs still running; False (every such job failed) once one of them
    has used up its restarts."""
    running = [jr for jr in runs if jr.status is None]
    for e in dead:
        why = "unhealthy (no progress)" if dog.unhealthy([e]) else supervisor.describe(e.code)
        if restarts.get(e.name, 0) >= ENGINE_RESTARTS:
            for jr in running:
                jr.fail(f"pool engine {e.name} ended ({why}) after {ENGINE_RESTARTS} restarts")
            return False
        restarts[e.name] = restarts.get(e.name, 0) + 1
        _err(f"pool engine {e.name} ended ({why}); restart {restarts[e.name]}/{ENGINE_RESTARTS}: the trainers of "
             f"{', '.join(jr.name for jr in running)} push their adapters to it again")
    write_attached(root, running)
    pool_group.restart([e.name for e in dead])
    dog.forget([e.name for e in dead])
    return True


def run(*, files: list[str], run_dir: str | None = None, steps: int | None = None,
        resolve_model: Callable[[rljob.RLJob], None] = main._resolve_model) -> int:
    """The whole ``kubeforge run`` of a pool and its jobs; returns the process exit status."""
    try:
        (pool_file, pool), jobs = prepare(files, steps=steps)
    except load.InvalidRLJob as exc:
        sys.stderr.write("".join(f"kubeforge: {p}\n" for p in exc.problems))
        return load.EXIT_INVALID
    start = time.time()
    root = rundir.create(job_name=pool.metadata.name, explicit=run_dir).root
    specs, runs = _layout(pool, jobs, root)
    engines = supervisor.Group(specs)
    restarts: dict[str, int] = {}
    old = {s: signal.signal(s, main._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        _err(f"run directory {root} (pool {pool.metadata.name}: {pool.spec.replicas} engine(s); jobs "
             f"{', '.join(jr.name for jr in runs)})")
        _resolve(jobs, resolve_model)
        engines.start()
        for jr in runs:
            jr.start()
        supervise(engines, runs, root=root, restarts=restarts)
    except main.Interrupted as exc:
        with main._shielded():
            for jr in runs:
                jr.stop()
            engines.stop()
        _err(f"interrupted ({exc}); every process stopped")
        return 130
    finally:
        with main._shielded():
            for jr in runs:
                jr.stop()
            engines.stop(grace=30.0)      # each engine writes its summary at SIGTERM
        for s, h in old.items():
            signal.signal(s, h)
    results = []
    for jr in runs:
        jr.bar.close()
        result = main.finish(jr.job, jr.run, wall_seconds=time.time() - start, restarts=jr.tally.restarts,
                             tally=jr.tally, status=jr.status if jr.status is not None else 1)
        results.append({"job": jr.name, **result})
        print(json.dumps(results[-1]), flush=True)
    summary = pool_summary(pool, root=root, results=results, wall_seconds=time.time() - start, restarts=restarts)
    (root / "summary.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary), flush=True)
    return 0 if all(jr.status == 0 for jr in runs) else 1


def pool_summary(pool: generatorpool.GeneratorPool, *, root: pathlib.Path, results: list[dict[str, Any]],
                 wall_seconds: float, restarts: dict[str, int] | None = None) -> dict[str, Any]:
    """The pool's summary (the last line): its engines' ledgers (``generator.pool.serve.summary``: each engine's last
    incarnation) and each job's outcome beside them; ``engine_restarts`` by engine."""
    engines: list[dict[str, Any]] = []
    for i in range(pool.spec.replicas):
        path = root / f"pool-{i}.json"
        engines.append(json.loads(path.read_text()) if path.exists() else {"engine": i, "missing": str(path)})
    jobs: dict[str, Any] = {}
    for r in results:
        per = [e.get("jobs", {}).get(r["job"], {}) for e in engines]
        jobs[r["job"]] = {"succeeded": r.get("succeeded"), "steps": r.get("steps"),
                          "reward_first": r.get("reward_first"), "reward_last": r.get("reward_last"),
                          "completions": sum(int(p.get("completions", 0)) for p in per),
                          "engine_seconds": round(sum(float(p.get("engine_seconds", 0.0)) for p in per), 3),
                          "adapter_swaps": sum(int(p.get("adapter_swaps", 0)) for p in per),
                          "adapter_versions": sorted({v for p in per for v in p.get("adapter_versions", [])})}
    total = sum(j["engine_seconds"] for j in jobs.values())
    for j in jobs.values():
        j["engine_share"] = round(j["engine_seconds"] / total, 4) if total else 0.0
    return {"pool": pool.metadata.name, "engines": pool.spec.replicas, "max_adapters": pool.spec.max_adapters,
            "succeeded": all(bool(r.get("succeeded")) for r in results), "wall_seconds": round(wall_seconds, 1),
            "completions": sum(j["completions"] for j in jobs.values()), "jobs": jobs, "engine_ledgers": engines,
            "engine_restarts": {f"{ENGINE}-{i}": (restarts or {}).get(f"{ENGINE}-{i}", 0)
                                for i in range(pool.spec.replicas)},
            "run_dir": str(root)}
