"""``kubeforge role generator|verifier|trainer`` (and ``agent``: ``agents/pods/start.py``): env contract → real parts (ZeroMQ, vLLM, torch) → role loop.

```
 config.from_env (fails with one message per problem, exit 2) → Metrics + /metrics /healthz /readyz /startz server
   verifier : bind data port ─ senders to every trainer ─ ready ─ verifier.loop.run
   generator: bind data port ─ senders to verifiers, to trainer 0's control port ─ start vLLM ─ ready
              ─ generator.loop.run
   trainer  : data-parallel group ─ learner (model) ─ bind data port (rank 0: control port too) ─ sender to every
              generator ─ rank 0: weight sender + reporter ─ ready ─ trainer.loop.Loop.run
```

This module only dispatches: each role's wiring is its folder's ``start.main`` (``verifier/start.py``,
``generator/start.py``, ``trainer/start.py``); the helpers they share (signals, deadlines, addresses, the pod's
metrics, config loading) are ``startup``. The role folders never import this module.

Every receiver is bound before any sender waits for its peers, so start order never matters. SIGTERM/SIGINT end the
generator and verifier loops between messages (exit 0); the trainer exits 0 only after its last step, and on
SIGTERM stops at the next safe point (a checkpoint write in progress finishes) with exit code 143.
"""
from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from kubeforge.api import contract
from kubeforge.runtime import affinity, config, metrics, startup, transport
from kubeforge.runtime.trainer import ranks


def run(*, role: str, environ: Mapping[str, str] | None = None) -> int:
    """Entry point of ``kubeforge role ROLE``; returns the exit status."""
    env = os.environ if environ is None else environ
    if role == contract.AGENT:     # an agent pod's process (spec.agent): not a role, no job key, no peers of its own
        import kubeforge.runtime.agents.pods.start
        return kubeforge.runtime.agents.pods.start.run(env)
    if role == contract.SANDBOX:   # a sandbox pod's process (spec.sandbox): not a role, no manifest, no job key
        import kubeforge.runtime.sandboxes.start
        return kubeforge.runtime.sandboxes.start.run(env)
    if role == "generator" and env.get(contract.ENV_POOL):   # a GeneratorPool's engine: its config is the pool's
        import kubeforge.runtime.generator.pool.start
        return kubeforge.runtime.generator.pool.start.run(env)
    try:
        cfg = startup.load_config(role, os.environ if environ is None else environ)
    except config.ConfigError as exc:
        for p in exc.problems:
            print(f"kubeforge role {role}: {p}", file=sys.stderr, flush=True)
        return startup.EXIT_CONFIG
    if cfg.supervises:     # a trainer pod with several ranks: start them; they serve metrics and probes
        return ranks.supervise(ranks=cfg.spec.roles.trainer.ranks(),
                               environ=os.environ if environ is None else environ, name=cfg.name,
                               grace_s=contract.TRAINER_RANKS_GRACE_SECONDS)
    try:    # first: torch's and vLLM's thread pools inherit the mask (spec.schedule: Disaggregated)
        pinned = affinity.apply_text(cfg.cpus)
    except (ValueError, OSError) as exc:
        print(f"kubeforge role {role}: {exc}", file=sys.stderr, flush=True)
        return startup.EXIT_CONFIG
    if cfg.job_key is not None:   # every socket below speaks CURVE with the job's keys (docs/security.md)
        transport.use_curve(transport.CurveKeys.from_job_key(cfg.job_key))
    else:
        print(f"{cfg.name}: WARNING: no {contract.ENV_JOB_KEY}: role traffic is not authenticated", flush=True)
    m = metrics.Metrics(role=role, replica=cfg.index)
    server = metrics.serve(m, host=cfg.bind_host, port_base=cfg.port_base)
    server.deadline = startup.role_deadline(cfg)
    server.start_deadline = startup.start_deadline(cfg)     # until ready (engine loaded): a start is not a hang
    server.siblings = startup.pod_metrics(cfg)
    print(f"{cfg.name}: pid {os.getpid()} metrics on {cfg.bind_host}:{server.port} (attempt {cfg.attempt})"
          + (f", pinned to CPUs {affinity.render(pinned)}" if pinned else ""), flush=True)
    # Each role's start is imported here, for its role only: the generator's loads vLLM, the trainer's torch and
    # transformers, the verifier's the scorers' libraries; a process pays the import time of its own role alone.
    try:
        if role == "verifier":
            import kubeforge.runtime.verifier.start
            return kubeforge.runtime.verifier.start.main(cfg, m, server, startup._stop_flag())
        if role == "generator":
            import kubeforge.runtime.generator.start
            return kubeforge.runtime.generator.start.main(cfg, m, server, startup._stop_flag())
        import kubeforge.runtime.trainer.start
        return kubeforge.runtime.trainer.start.main(cfg, m, server, startup._stop_flag())
    finally:
        server.stop()
