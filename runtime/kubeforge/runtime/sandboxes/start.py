"""``kubeforge role sandbox``: a sandbox pod's process (``spec.sandbox``): the env contract (``api.sandboxenv``),
a metrics/probe server, the sandbox server until SIGTERM.

Neighbours: ``runtime.role`` dispatches here before any role's config is read (this process is not a role: no
manifest, no peers, no job key). It is the child subreaper of its runs (``reaper``: ``dedicated``). Without
Landlock it makes itself non-dumpable (``isolation.status``), so a run cannot read the sandbox key from
``/proc/<this pid>/environ``. Exit 2 on a bad contract, 0 after SIGTERM.
"""
from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from kubeforge.api import contract, sandboxenv
from kubeforge.runtime import isolation, metrics, startup
from kubeforge.runtime.sandboxes import server as sandbox_server

EXIT_CONFIG = 2


def run(environ: Mapping[str, str] | None = None) -> int:
    env = os.environ if environ is None else environ
    parsed, problems = sandboxenv.read(env)
    if problems:
        for p in problems:
            print(f"kubeforge role sandbox: {p}", file=sys.stderr, flush=True)
        return EXIT_CONFIG
    print(f"sandbox-{parsed.index}: isolation {isolation.status().detail}", file=sys.stderr, flush=True)
    stop = startup._stop_flag()     # SIGTERM (the pod deleted) ends the loop below: a clean exit 0
    m = metrics.Metrics(role=contract.SANDBOX, replica=parsed.index)
    probes = metrics.serve(m, host=parsed.bind_host, port_base=parsed.port_base)
    settings = sandbox_server.Settings(key=parsed.key, slots=parsed.slots, max_run_seconds=parsed.max_run_seconds,
                                       idle_seconds=parsed.idle_seconds, index=parsed.index)
    srv = sandbox_server.serve(settings, host=parsed.bind_host, port=parsed.port_base + contract.PORT_SANDBOX,
                               dedicated=True, metrics=m)
    probes.set_ready()
    try:
        while not stop.wait(5.0):
            probes.heartbeat("sandbox")
    finally:
        srv.stop()
        probes.stop()
    print(srv.summary(), flush=True)
    return 0
