"""``kubeforge run FILE``: validate, lay out the run directory, start and supervise every role, summarise.

```
 validate manifest ──▶ run dir + effective manifest ──▶ resolve model once (cache) ──▶ attempt 0
   attempt k: allocate ports → env per process (config.role_env) → start Group → watch:
       progress bar ◀── tail metrics.jsonl (trainer rank 0)
       exits ──▶ supervisor.judge (api.failures.decide) ──▶ running | succeeded | restart in place (RestartRole,
                 Ignore) | restart (RestartAll: attempt k+1) | failed
 stop every process group ──▶ summary.json, reward.png ──▶ summary JSON on stdout's last line
```

Invariants: invalid input exits 2 before any process starts, one message per problem naming the field path;
Ctrl-C (or SIGTERM) stops every process group and exits 130; a role that dies for good exits 1 naming the role,
its exit and the tail of its log; stdout carries only the final summary line.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import pathlib
import secrets
import signal
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

from kubeforge.api import agentenv, contract, failures, load, progress, rljob, roleenv, sandboxenv
from kubeforge.runtime import affinity, config, hardware
from kubeforge.runtime.launcher import localenv, placement, plot, ports, progressbar, rundir, summary, supervisor
from kubeforge.runtime.learner import fence

POLL_SECONDS = 0.5
FAILURES = "failures.jsonl"      # one line per failure decision (the fault campaign reads it)


class Interrupted(Exception):
    """Ctrl-C or SIGTERM reached the launcher."""


def _err(text: str) -> None:
    print(f"kubeforge: {text}", file=sys.stderr, flush=True)


def prepare(file: str, *, steps: int | None) -> rljob.RLJob:
    """Load, override and validate; raises :class:`load.InvalidRLJob` listing every problem."""
    job = load.load_file(file)
    if steps is not None:
        doc = load.dump(job)
        doc["spec"].setdefault("algorithm", {})["steps"] = steps
        job = load.parse(doc)
    problems = config.local_problems(job.spec) + placement.problems(job.spec.schedule, cpus=placement.usable_cpus())
    problems += localenv.problems(job, os.environ)
    if problems:
        raise load.InvalidRLJob(problems)
    return job


def fenced_writes(run: rundir.RunDir, records: list[progress.StepRecord]) -> dict[str, int]:
    """Writes of stale trainer epochs refused in this run (docs/fencing.md): the checkpoint store's records, and the
    generators' refused pushes as the trainer last recorded them."""
    return {"checkpoints": fence.count(run.checkpoints),
            "pushes": max((r.fenced_pushes for r in records), default=0)}


def process_specs(*, job: rljob.RLJob, run: rundir.RunDir, attempt: int,
                  bases: list[int] | None = None, job_key: bytes | None = None,
                  cpus: list[int] | None = None,
                  generators: list[roleenv.Peer] | None = None) -> list[supervisor.ProcSpec]:
    """One ProcSpec per role replica, with the env contract filled in (fresh ports per attempt; a fresh job key
    per attempt unless one is given: every socket of the attempt uses CURVE with it; each role's CPU list and
    thread-pool width under ``spec.schedule``, from ``cpus``, default the launcher's own) and the role's ``env``.
    ``generators``: a job on a GeneratorPool samples on the pool's engines there (``launcher.poolrun``), so it
    starts no generator of its own."""
    cpus = placement.usable_cpus() if cpus is None else cpus
    roles = job.spec.roles
    pinned = placement.plan(job.spec.schedule, cpus=cpus)
    pools = placement.threads(job.spec.schedule, cpus=cpus, generators=roles.generator.replicas)
    job_key = job_key or secrets.token_bytes(32)
    counts = {r: getattr(roles, r).replicas for r in contract.ROLES}
    if generators is not None:
        counts["generator"] = 0
    # a trainer process stands for a pod: with N ranks per pod it needs N consecutive port blocks (every process
    # gets as many: simpler than two disjoint allocations)
    bases = bases or ports.allocate(sum(counts.values()), blocks=roles.trainer.ranks())
    it = iter(bases)
    peers = {r: [roleenv.Peer(host="127.0.0.1", port_base=next(it)) for _ in range(counts[r])]
             for r in contract.ROLES}
    if generators is not None:
        peers["generator"] = list(generators)
    agent_key = secrets.token_bytes(32) if job.spec.agent is not None else None
    box = sandbox_specs(job=job, run=run) if job.spec.sandbox is not None else None
    out = [] if box is None else list(box[0])
    for role in ("trainer", "verifier", "generator"):
        for i in range(counts[role]):
            env = dict(os.environ)
            fixed = config.role_env(
                job=job, config_path=str(run.manifest), role=role, index=i, peers=peers,
                run_dir=str(run.root), checkpoint_dir=str(run.checkpoints), attempt=attempt,
                report=roleenv.REPORT_JSONL, job_key=job_key,
                trainer_epoch=attempt + 1)   # every process of an attempt is gone before the next starts
            # the role's own env as on a pod (render/env.py): over the launcher's, under the contract (the API
            # refuses KUBEFORGE_* names in it anyway)
            env.update(localenv.values(getattr(roles, role), os.environ))   # valueFrom: docs/launcher.md
            env.update(fixed)
            env["PYTHONUNBUFFERED"] = "1"
            env.pop(contract.ENV_CPUS, None)
            if role == "generator" and agent_key is not None:    # the agent pods' claims (agents/pods)
                env[contract.ENV_AGENT_KEY] = agent_key.hex()
            if role == "verifier" and box is not None:           # the sandbox pool's clients (docs/sandboxes.md)
                env.update({k: str(v) for k, v in box[1].items()})
            if role in pinned:
                env[contract.ENV_CPUS] = affinity.render(pinned[role])
            if role in pools:       # a width the user set (their environment or the role's env) wins
                env.setdefault(affinity.THREAD_VARS[0], str(pools[role]))
            name = f"{role}-{i}"
            out.append(supervisor.ProcSpec(
                name=name, role=role, argv=[sys.executable, "-m", "kubeforge.cli", "role", role], env=env,
                log=run.log(name), port_base=peers[role][i].port_base))
    if agent_key is not None:
        out += agent_specs(job=job, run=run, agent_key=agent_key, generators=peers["generator"])
    return out


def sandbox_specs(*, job: rljob.RLJob, run: rundir.RunDir) -> tuple[list[supervisor.ProcSpec], dict[str, str]]:
    """The sandbox processes of ``spec.sandbox`` (as its pods would be: the sandbox key, their settings, no job key,
    no manifest) and what the verifiers are told (their addresses and the key). Started first: a verifier's first
    claim finds them up. The supervisor restarts one that exits, in place, outside the failure policy
    (``supervisor.split_agents``): a sandbox pod's death costs the runs it held."""
    box = job.spec.sandbox
    assert box is not None
    key = secrets.token_bytes(32)
    out, peers = [], []
    for i, base in enumerate(ports.allocate(box.replicas, blocks=1)):
        env = {k: v for k, v in os.environ.items() if not k.startswith(contract.ENV_PREFIX)}
        env.update({k: str(v) for k, v in sandboxenv.render(
            index=i, job_name=job.metadata.name, port_base=base, bind_host="127.0.0.1", key=key, slots=box.slots,
            max_run_seconds=box.max_run_seconds, idle_seconds=box.idle_seconds).items()})
        env["PYTHONUNBUFFERED"] = "1"
        name = f"{contract.SANDBOX}-{i}"
        out.append(supervisor.ProcSpec(
            name=name, role=contract.SANDBOX,
            argv=[sys.executable, "-m", "kubeforge.cli", "role", contract.SANDBOX], env=env, log=run.log(name),
            port_base=base))
        peers.append(roleenv.Peer(host="127.0.0.1", port_base=base))
    return out, {k: str(v) for k, v in sandboxenv.client_env(sandboxes=peers, key=key).items()}


def agent_specs(*, job: rljob.RLJob, run: rundir.RunDir, agent_key: bytes,
                generators: list[roleenv.Peer]) -> list[supervisor.ProcSpec]:
    """The agent processes of ``spec.agent`` (as its pods would be: the agent key, the generators' addresses, the
    agent's own env; never the job key). The supervisor restarts one that exits, in place, outside the failure
    policy (``supervisor.split_agents``): an agent pod's death costs its episodes only."""
    agent = job.spec.agent
    assert agent is not None
    out = []
    for i, base in enumerate(ports.allocate(agent.replicas, blocks=1)):
        env = {k: v for k, v in os.environ.items() if k != contract.ENV_JOB_KEY}
        env.update(localenv.values(agent, os.environ))
        env.update({k: str(v) for k, v in agentenv.render(
            index=i, config_path=str(run.manifest), job_name=job.metadata.name, generators=generators,
            port_base=base, bind_host="127.0.0.1", agent_key=agent_key).items()})
        env["PYTHONUNBUFFERED"] = "1"
        name = f"{contract.AGENT}-{i}"
        out.append(supervisor.ProcSpec(
            name=name, role=contract.AGENT, argv=[sys.executable, "-m", "kubeforge.cli", "role", contract.AGENT],
            env=env, log=run.log(name), port_base=base))
    return out


@dataclasses.dataclass(kw_only=True)
class Tally:
    """Restarts so far: counted against maxRestarts, and by role (of the failure that caused each)."""

    restarts: int = 0
    by_role: dict[str, int] = dataclasses.field(default_factory=dict)
    log: pathlib.Path | None = None

    def record(self, decision: failures.Decision, *, attempt: int) -> None:
        """Count ``decision`` and append it to the run's ``failures.jsonl`` (one line per decision)."""
        cause = decision.cause
        if decision.counts:
            self.restarts += 1
            if cause is not None:
                self.by_role[cause.role] = self.by_role.get(cause.role, 0) + 1
        if self.log is not None:
            with self.log.open("a") as f:
                f.write(json.dumps({"time": time.time(), "attempt": attempt, "action": decision.action,
                                    "restart": list(decision.restart), "counts": decision.counts,
                                    "role": cause.role if cause else None, "name": cause.name if cause else None,
                                    "exit_code": cause.exit_code if cause else None,
                                    "reason": cause.reason if cause else None, "message": decision.message}) + "\n")


def _watch(group: supervisor.Group, *, job: rljob.RLJob, tally: Tally, attempt: int, bar: progressbar.Progress
           ) -> tuple[supervisor.Verdict, failures.Decision | None]:
    """Watch one attempt until it succeeds, fails or must restart whole; restarts in place on the way."""
    policy = job.spec.failure_policy
    dog = supervisor.Watchdog(group)
    while True:
        bar.poll()
        dog.check()
        exits, agents = supervisor.split_agents(group.poll())
        if agents:        # restarted in place, like a StatefulSet's pod: their episodes ended agent_lost
            bar.note(f"kubeforge: {', '.join(e.name for e in agents)} exited; restarting")
            group.restart([e.name for e in agents])
            dog.forget([e.name for e in agents])
        verdict, decision = supervisor.judge(exits=exits, trainers=job.spec.roles.trainer.replicas,
                                             restarts=tally.restarts, policy=policy, unhealthy=dog.unhealthy(exits))
        if decision is not None:
            tally.record(decision, attempt=attempt)
        if verdict is supervisor.Verdict.RESTART_IN_PLACE:
            assert decision is not None
            bar.note(f"kubeforge: {decision.message}")
            group.restart(decision.restart)
            dog.forget(decision.restart)
        elif verdict is not supervisor.Verdict.RUNNING:
            return verdict, decision
        time.sleep(POLL_SECONDS)


def supervise(job: rljob.RLJob, run: rundir.RunDir, bar: progressbar.Progress, tally: Tally | None = None
              ) -> tuple[int, int]:
    """Run attempts until success or failure; returns (exit status, restarts used)."""
    tally = tally or Tally(log=run.root / FAILURES)
    attempt = 0
    while True:
        group = supervisor.Group(process_specs(job=job, run=run, attempt=attempt))
        try:
            group.start()
            verdict, decision = _watch(group, job=job, tally=tally, attempt=attempt, bar=bar)
        finally:
            with _shielded():
                group.stop()
        bar.poll()
        if verdict is supervisor.Verdict.SUCCEEDED:
            return 0, tally.restarts
        assert decision is not None and decision.cause is not None
        if verdict is supervisor.Verdict.RESTART:
            attempt += 1
            bar.note(f"kubeforge: {decision.message}")
            continue
        dead = decision.cause.name
        bar.note(f"kubeforge: {decision.message}; stopping the run. Last lines of {run.log(dead)}:\n"
                 f"{supervisor.tail(run.log(dead))}")
        return 1, tally.restarts


@contextlib.contextmanager
def _shielded() -> Iterator[None]:
    """Ignore Ctrl-C/SIGTERM while stopping processes, so a second Ctrl-C cannot leave any behind."""
    old = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def _on_signal(signum: int, frame: Any) -> None:
    raise Interrupted(signal.Signals(signum).name)


def _resolve_model(job: rljob.RLJob) -> None:
    """Build/cache the model folder once, before roles race to do it (and fail early if it cannot be)."""
    from kubeforge.runtime import models   # transformers: loaded only when a run builds its model (tests inject one)

    models.resolve(job.spec.model)


def run(*, file: str, run_dir: str | None = None, steps: int | None = None,
        resolve_model: Callable[[rljob.RLJob], None] = _resolve_model) -> int:
    """The whole ``kubeforge run``; returns the process exit status."""
    try:
        job = prepare(file, steps=steps)
    except load.InvalidRLJob as exc:     # the refusal of `kubeforge validate`, word for word (load.refusal)
        sys.stderr.write(load.refusal(file, exc.problems))
        return load.EXIT_INVALID
    except OSError as exc:
        sys.stderr.write(load.refusal(file, [str(exc.strerror or exc)]))
        return load.EXIT_INVALID
    start = time.time()
    run = rundir.create(job_name=job.metadata.name, explicit=run_dir)
    run.manifest.write_text(json.dumps(load.dump(job), indent=1))
    old = {s: signal.signal(s, _on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    bar = progressbar.Progress(metrics=run.metrics, total=job.spec.algorithm.steps)
    try:
        _err(f"run directory {run.root}")
        slow = None if pathlib.Path("/proc/driver/nvidia/version").exists() else \
            hardware.slow_dtype_warning(str(job.spec.model.dtype))
        if slow is not None:
            _err(f"warning: {slow}")
        resolve_model(job)
        tally = Tally(log=run.root / FAILURES)
        status, restarts = supervise(job, run, bar, tally)
    except Interrupted as exc:
        bar.close()
        _err(f"interrupted ({exc}); every role process stopped")
        return 130
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    bar.close()
    result = finish(job, run, wall_seconds=time.time() - start, restarts=restarts, tally=tally, status=status)
    print(json.dumps(result), flush=True)
    return status


def finish(job: rljob.RLJob, run: rundir.RunDir, *, wall_seconds: float, restarts: int, tally: Tally,
           status: int) -> dict[str, Any]:
    """A run's summary (written to ``summary.json``) and its reward plot."""
    records = summary.by_step(summary.read_records(run.metrics))
    result = summary.summarize(records, wall_seconds=wall_seconds, metrics_path=str(run.metrics),
                               extra={"run_dir": str(run.root), "restarts": restarts,
                                      "restarts_by_role": tally.by_role, "succeeded": status == 0,
                                      "fenced_writes": fenced_writes(run, records)})
    if records:
        plot.reward_curve(records, path=run.plot, title=f"{job.metadata.name}: reward per step")
        result["plot_path"] = str(run.plot)
    run.summary.write_text(json.dumps(result, indent=1))
    return result
