"""Wiring of a verifier: the scorer, its data port, a sender to every trainer rank, the generators' environment
server (``agents.hosts.env_server``, when the job has an environment), then the loop.

Neighbours: ``role.run`` calls :func:`main`; ``verifiers.Scorer`` scores (the library of scorers); ``verifier.loop``
is the loop it runs; ``observe.VerifierObserver`` turns its events into Prometheus series (and, in a local run,
``verifier-<i>.jsonl`` in the run directory).
"""
from __future__ import annotations

import threading

from kubeforge.api import contract
from kubeforge.runtime import config, metrics, observe, startup, transport, verifiers
from kubeforge.runtime.agents.hosts import env_server
from kubeforge.runtime.verifier import loop


def main(cfg: config.RoleConfig, m: metrics.Metrics, server: metrics.MetricsServer, stop: threading.Event) -> int:
    scorer = verifiers.Scorer(cfg.spec.verifiers, reward=cfg.spec.reward, environment=cfg.spec.environment)
    inbox = transport.open_receiver(startup.bind(cfg, contract.PORT_DATA), on_drop=m.drop_hook())
    trainers = transport.open_sender(startup.data_addresses(cfg, "trainer"), role="verifier", index=cfg.index,
                                    send_timeout=startup.role_deadline(cfg))
    log = cfg.run_dir / f"verifier-{cfg.index}.jsonl" if cfg.run_dir is not None else None
    observer = observe.VerifierObserver(m, scorer.errors, scorer=scorer, log_path=log)
    envs = serve_environments(cfg, m, stop)
    server.set_ready(True)
    try:
        loop.run(inbox=inbox, trainers=trainers, score=scorer.apply, observer=observer,
                 should_stop=stop.is_set, beat=server.heartbeat, deadline=startup.role_deadline(cfg))
    finally:
        if envs is not None:
            envs.close(wait_s=SERVER_CLOSE_S)
            print(f"{cfg.name}: {envs.served.line()}", flush=True)
        observer.close()
        scorer.close()
        trainers.close()
        inbox.close()
    return 0


ENV_WORKERS = 2     # environment worker processes per verifier (docs/agents.md, "Where environments run")
SERVER_CLOSE_S = 15.0   # at exit: how long the environment server may take to end a step in flight and its workers


def serve_environments(cfg: config.RoleConfig, m: metrics.Metrics,
                       stop: threading.Event) -> env_server.EnvServer | None:
    """The generators' environment steps, served at this verifier's PORT_ENV on a thread (``agents.hosts.env_server``),
    when the job has a built-in or Python environment; None otherwise."""
    env = cfg.spec.environment
    if env is None or not env_server.serves(cfg.spec):
        return None
    server, _ = env_server.start(startup.bind(cfg, contract.PORT_ENV), env, workers=ENV_WORKERS,
                                 on_drop=m.drop_hook(), on_step=m.env_step_seconds.observe, should_stop=stop.is_set)
    return server
