"""``kubeforge role agent``: an agent pod's process (``spec.agent``): the env contract (``api.agentenv``) and the
manifest, a metrics/probe server, then the ``worker`` until SIGTERM.

Neighbours: ``runtime.role`` dispatches here before any role's config is read (this process is not a role: no
peers of its own, no job key). Exit 2 on a bad contract or manifest, 0 after SIGTERM.
"""
from __future__ import annotations

import os
import sys
import threading
from collections.abc import Mapping

from kubeforge.api import agentenv, contract, load
from kubeforge.runtime import metrics, startup
from kubeforge.runtime.agents.pods import worker

EXIT_CONFIG = 2


def run(environ: Mapping[str, str] | None = None) -> int:
    env = os.environ if environ is None else environ
    parsed, problems = agentenv.read(env)
    job = None
    if not problems:
        try:
            job = load.load_file(parsed.config_path)
        except (OSError, load.InvalidRLJob) as exc:
            problems.append(f"{parsed.config_path}: {exc}")
    if job is not None and job.spec.agent is None:
        problems.append("spec.agent: Required value: this job runs no agent pods")
    if problems or job is None or job.spec.agent is None:
        for p in problems:
            print(f"kubeforge role agent: {p}", file=sys.stderr, flush=True)
        return EXIT_CONFIG
    stop = threading.Event()
    startup.watch_signals(stop.set)
    m = metrics.Metrics(role="agent", replica=parsed.index)
    server = metrics.serve(m, host=parsed.bind_host, port_base=parsed.port_base)
    server.set_ready()
    agent = job.spec.agent
    work = worker.Worker(generators=[f"http://{g.host}:{g.port(contract.PORT_AGENTS)}"
                                     for g in parsed.generators],
                         ready=[f"http://{g.host}:{g.port(contract.PORT_METRICS)}/readyz" for g in parsed.generators],
                         agent_key=parsed.agent_key, program=agent.program, concurrency=agent.concurrency,
                         environ=env, stop=stop)
    print(f"agent-{parsed.index}: pid {os.getpid()}, {agent.concurrency} slots, generators "
          f"{', '.join(work.generators)}", flush=True)
    beat = threading.Thread(target=_beat, args=(server, stop), name="agent-beat", daemon=True)
    beat.start()
    try:
        work.run()
    finally:
        server.stop()
    print(f"agent-{parsed.index}: episodes {dict(work.ends)}", flush=True)
    return 0


def _beat(server: metrics.MetricsServer, stop: threading.Event) -> None:
    """The process is alive while its slots run (a hung slot still beats: the generator's lease catches it)."""
    while not stop.wait(5.0):
        server.heartbeat("agents")
