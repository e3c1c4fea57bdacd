"""``kubeforge role generator|verifier|trainer``: env contract → real parts (ZeroMQ, vLLM, torch) → role loop.

```
 config.from_env (fails with one message per problem, exit 2) → Metrics + /metrics /healthz /readyz /startz server
   verifier : bind data port ─ senders to every trainer ─ ready ─ roles.verifier.run
   generator: bind data port ─ senders to verifiers, to trainer 0's control port ─ start vLLM ─ ready
              ─ roles.generator.run
   trainer  : data-parallel group ─ learner (model) ─ bind data port (rank 0: control port too) ─ sender to every
              generator ─ rank 0: weight sender + reporter ─ ready ─ roles.trainer.Loop.run
```

Every receiver is bound before any sender waits for its peers, so start order never matters. SIGTERM/SIGINT end the
generator and verifier loops between messages (exit 0); the trainer exits 0 only after its last step, and on
SIGTERM stops at the next safe point (a checkpoint write in progress finishes) with exit code 143.
"""
from __future__ import annotations

import os
import signal
import socket
import sys
import threading
from collections.abc import Callable, Mapping
from typing import Any

from kubeforge.api import contract
from kubeforge.runtime import affinity, config, metrics, transport

EXIT_CONFIG = 2


def _stop_flag() -> threading.Event:
    stop = threading.Event()

    def handler(signum: int, frame: Any) -> None:
        stop.set()

    for s in (signal.SIGTERM, signal.SIGINT):
        signal.signal(s, handler)
    return stop


def watch_signals(callback: Callable[[], object]) -> threading.Thread:
    """Call ``callback`` once, on a daemon thread, as soon as SIGTERM or SIGINT arrives, even while the main thread is
    blocked inside C code (a gloo receive in a weight sync), where Python-level handlers only run once it returns.
    CPython's C-level handler writes each signal number to the wakeup socket this thread reads
    (``signal.set_wakeup_fd``; main thread only). The Python handlers (``_stop_flag``) still run as before."""
    r, w = socket.socketpair()
    w.setblocking(False)
    signal.set_wakeup_fd(w.fileno(), warn_on_full_buffer=False)
    wanted = {int(signal.SIGTERM), int(signal.SIGINT)}

    def watch() -> None:
        keep = w                     # the write end must outlive this call: its fd is the wakeup fd
        while keep is not None:
            data = r.recv(64)
            if not data:
                return
            if wanted.intersection(data):
                callback()
                return

    t = threading.Thread(target=watch, name="signal-watch", daemon=True)
    t.start()
    return t


def load_config(role: str, environ: Mapping[str, str]) -> config.RoleConfig:
    env = dict(environ)
    env.setdefault(contract.ENV_ROLE, role)
    if env[contract.ENV_ROLE] != role:
        raise config.ConfigError([f"{contract.ENV_ROLE}: Invalid value: {env[contract.ENV_ROLE]!r}: the command "
                                  f"runs role {role!r}"])
    return config.from_env(env)


def run(*, role: str, environ: Mapping[str, str] | None = None) -> int:
    """Entry point of ``kubeforge role ROLE``; returns the exit status."""
    try:
        cfg = load_config(role, os.environ if environ is None else environ)
    except config.ConfigError as exc:
        for p in exc.problems:
            print(f"kubeforge role {role}: {p}", file=sys.stderr, flush=True)
        return EXIT_CONFIG
    if cfg.supervises:     # a trainer pod with several ranks: start them; they serve metrics and probes
        from kubeforge.runtime.roles import ranks
        return ranks.supervise(ranks=cfg.spec.roles.trainer.ranks(),
                               environ=os.environ if environ is None else environ, name=cfg.name)
    try:    # first: torch's and vLLM's thread pools inherit the mask (spec.schedule: Disaggregated)
        pinned = affinity.apply_from_env(os.environ if environ is None else environ)
    except (ValueError, OSError) as exc:
        print(f"kubeforge role {role}: {exc}", file=sys.stderr, flush=True)
        return EXIT_CONFIG
    if cfg.job_key is not None:   # every socket below speaks CURVE with the job's keys (docs/security.md)
        transport.use_curve(transport.CurveKeys.from_job_key(cfg.job_key))
    else:
        print(f"{cfg.name}: WARNING: no {contract.ENV_JOB_KEY}: role traffic is not authenticated", flush=True)
    m = metrics.Metrics(role=role, replica=cfg.index)
    server = metrics.serve(m, host=cfg.bind_host, port_base=cfg.port_base)
    server.deadline = role_deadline(cfg)
    server.start_deadline = start_deadline(cfg)     # until ready (engine loaded): a start is not a hang
    server.siblings = pod_metrics(cfg)
    print(f"{cfg.name}: pid {os.getpid()} metrics on {cfg.bind_host}:{server.port} (attempt {cfg.attempt})"
          + (f", pinned to CPUs {affinity.render(pinned)}" if pinned else ""), flush=True)
    try:
        if role == "verifier":
            return _verifier(cfg, m, server, _stop_flag())
        if role == "generator":
            from kubeforge.runtime.roles import start_generator
            return start_generator.main(cfg, m, server, _stop_flag())
        from kubeforge.runtime.roles import start_trainer
        return start_trainer.main(cfg, m, server, _stop_flag())
    finally:
        server.stop()


def pod_metrics(cfg: config.RoleConfig) -> Any:
    """Local rank 0 of a trainer pod with several ranks: the sibling ranks its ``/metrics`` also serves
    (``podmetrics.Siblings``); None for every other process."""
    n = cfg.spec.roles.trainer.ranks()
    if cfg.role != "trainer" or cfg.local_rank != 0 or n < 2:
        return None
    from kubeforge.runtime import podmetrics
    return podmetrics.Siblings(podmetrics.sibling_urls(host=_loopback(cfg.bind_host), pod_port_base=cfg.port_base,
                                                       ranks=n))


def _loopback(bind_host: str) -> str:
    """Where this process reaches a sibling that binds ``bind_host`` (a wildcard is reached over loopback)."""
    return "127.0.0.1" if bind_host in ("0.0.0.0", "", "*") else ("::1" if bind_host == "::" else bind_host)


def role_deadline(cfg: config.RoleConfig) -> float:
    """The bound of every wait in a role: ``spec.failurePolicy.progressDeadlineSeconds``."""
    return float(cfg.spec.failure_policy.progress_deadline_seconds)


def start_deadline(cfg: config.RoleConfig) -> float:
    """The bound of a role's start, and of waiting for a peer's start (a vLLM engine load makes no heartbeat):
    ``spec.failurePolicy`` ``start_deadline_seconds()``, a multiple of the progress deadline."""
    return float(cfg.spec.failure_policy.start_deadline_seconds())


def data_addresses(cfg: config.RoleConfig, role: str) -> list[str]:
    """Every replica of ``role``'s data port, by index."""
    return [transport.tcp_address(p.host, p.port(contract.PORT_DATA)) for p in cfg.peers[role]]


def bind(cfg: config.RoleConfig, offset: int) -> str:
    return transport.tcp_address(cfg.bind_host, cfg.port(offset))


def _verifier(cfg: config.RoleConfig, m: metrics.Metrics, server: metrics.MetricsServer,
              stop: threading.Event) -> int:
    from kubeforge.runtime import verifiers
    from kubeforge.runtime.roles import observe
    from kubeforge.runtime.roles import verifier as loop

    scorer = verifiers.Scorer(cfg.spec.verifiers, reward=cfg.spec.reward)
    inbox = transport.open_receiver(bind(cfg, contract.PORT_DATA), on_drop=m.drop_hook())
    trainers = transport.open_sender(data_addresses(cfg, "trainer"), role="verifier", index=cfg.index,
                                    send_timeout=role_deadline(cfg))
    log = cfg.run_dir / f"verifier-{cfg.index}.jsonl" if cfg.run_dir is not None else None
    observer = observe.VerifierObserver(m, scorer.errors, scorer=scorer, log_path=log)
    server.set_ready(True)
    try:
        loop.run(inbox=inbox, trainers=trainers, score=scorer.apply, observer=observer,
                 should_stop=stop.is_set, beat=server.heartbeat, deadline=role_deadline(cfg))
    finally:
        observer.close()
        scorer.close()
        trainers.close()
        inbox.close()
    return 0
