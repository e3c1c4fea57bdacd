"""What every role's start-up shares: config loading, signals, deadlines, addresses, the pod's metrics.

Neighbours: ``role.run`` (the ``kubeforge role ROLE`` dispatch) loads the config and builds the metrics server with
these; each role folder's ``start.main`` (``verifier/``, ``generator/``, ``trainer/``) binds and connects with
:func:`bind` and :func:`data_addresses` and bounds its waits by :func:`role_deadline`. This module imports no role.
"""
from __future__ import annotations

import signal
import socket
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from kubeforge.api import contract
from kubeforge.runtime import config, podmetrics, transport

EXIT_CONFIG = 2


class StopFlag(threading.Event):
    """Set at SIGTERM/SIGINT; ``at`` is when the first one arrived (``time.monotonic``), None before."""

    at: float | None = None


def _stop_flag() -> StopFlag:
    stop = StopFlag()

    def handler(signum: int, frame: Any) -> None:
        if stop.at is None:
            stop.at = time.monotonic()
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


def pod_metrics(cfg: config.RoleConfig) -> Any:
    """Local rank 0 of a trainer pod with several ranks: the sibling ranks its ``/metrics`` also serves
    (``podmetrics.Siblings``); None for every other process."""
    n = cfg.spec.roles.trainer.ranks()
    if cfg.role != "trainer" or cfg.local_rank != 0 or n < 2:
        return None
    return podmetrics.Siblings(podmetrics.sibling_urls(host=_loopback(cfg.bind_host), pod_port_base=cfg.port_base,
                                                       ranks=n))


def _loopback(bind_host: str) -> str:
    """Where this process reaches a sibling that binds ``bind_host`` (a wildcard is reached over loopback)."""
    return "127.0.0.1" if bind_host in ("0.0.0.0", "", "*") else ("::1" if bind_host == "::" else bind_host)


def role_deadline(cfg: config.RoleConfig) -> float:
    """The bound of every wait in a role: ``spec.failurePolicy.progressDeadlineSeconds``."""
    return float(cfg.spec.failure_policy.progress_deadline_seconds)


def peer_beat_seconds(cfg: config.RoleConfig) -> float:
    """How often a generator tells trainer 0 it is alive (``spec.failurePolicy.peerSilenceSeconds`` / 4)."""
    return cfg.spec.failure_policy.peer_beat_seconds()


def start_deadline(cfg: config.RoleConfig) -> float:
    """The bound of a role's start, and of waiting for a peer's start (a vLLM engine load makes no heartbeat):
    ``spec.failurePolicy`` ``start_deadline_seconds()``, a multiple of the progress deadline."""
    return float(cfg.spec.failure_policy.start_deadline_seconds())


def data_addresses(cfg: config.RoleConfig, role: str) -> list[str]:
    """Every replica of ``role``'s data port, by index."""
    return [transport.tcp_address(p.host, p.port(contract.PORT_DATA)) for p in cfg.peers[role]]


def bind(cfg: config.RoleConfig, offset: int) -> str:
    return transport.tcp_address(cfg.bind_host, cfg.port(offset))
