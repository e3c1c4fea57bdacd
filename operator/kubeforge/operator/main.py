"""``kubeforge operator``: parse flags, wire the parts together, run kopf until stopped.

    argv ──▶ Options ──▶ credentials ──▶ apply.Cluster ─┐
                                 └──▶ kopf login       ├─▶ Router(work=reconcile) ◀── kopf handlers (events)
    metrics.serve(--metrics-port)   kopf liveness on --health-port (/healthz)

Namespace scoping: ``--namespace`` (repeatable) watches those namespaces only; ``--all-namespaces`` (the default
when none is named) watches the whole cluster. Logs are JSON lines (``--log-format text`` for humans).
``--pool-master-key-file`` (or ``$KUBEFORGE_POOL_MASTER_KEY_FILE``): the key the keys of GeneratorPools and their jobs
are derived from (``kubeforge.api.poolkeys``; the chart mounts it from a Secret of the release's namespace); a
file given but unreadable or short stops the operator at start; without one, pools are not rendered.
``--leader-elect``: several replicas, one active (``leader``: a Lease in ``--leader-namespace``); a standby serves
/metrics, a plain /healthz and (in-cluster) the admission webhook until it holds the Lease, then starts kopf.

Stopping: kopf runs in a thread of its own and this process handles SIGTERM/SIGINT itself (kopf's own handling
ends in a SIGKILL after its exit timeout, which would skip the Lease's release): on a signal, kopf is asked to stop
(``STOP_GRACE_S`` at most), then the Lease is released, well within a pod's 30 s grace period.
"""
from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import dataclasses
import http.server
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Sequence
from typing import Any

import kopf

from kubeforge.api import contract, poolkeys
from kubeforge.operator import apply, handlers, leader, memory, metrics, names, reconcile, router as router_mod
from kubeforge.operator import admission, nodeloss, poolreconcile, watchcache
from kubeforge.operator import webhook


@dataclasses.dataclass(frozen=True, kw_only=True)
class Options:
    namespaces: tuple[str, ...] = ()
    all_namespaces: bool = True
    kubeconfig: str | None = None
    metrics_port: int = 8080
    health_port: int = 8081
    runtime_image: str = names.DEFAULT_RUNTIME_IMAGE
    runtime_image_features: tuple[str, ...] = names.DEFAULT_RUNTIME_FEATURES
    coscheduling_scheduler: str = ""
    image_pull_secrets: tuple[str, ...] = ()
    workers: int = 16
    status_interval: float = 5.0
    node_loss_grace_seconds: float = nodeloss.GRACE_S
    log_format: str = "json"
    verbose: bool = False
    webhook: bool = True
    webhook_addr: str = "127.0.0.1"
    webhook_port: int = 0
    webhook_host: str | None = None
    webhook_cert_dir: str | None = None
    leader_elect: bool = False
    leader_lease: str = "kubeforge-operator"
    leader_namespace: str | None = None
    leader_lease_s: int = 6
    leader_renew_s: float = 2.0
    pool_master_key_file: str | None = None


STOP_GRACE_S = 15.0


def parse_args(argv: Sequence[str]) -> Options:
    p = argparse.ArgumentParser(prog="kubeforge operator", description="Run the RLJob operator.")
    scope = p.add_mutually_exclusive_group()
    scope.add_argument("-n", "--namespace", action="append", default=[], help="Watch this namespace (repeatable).")
    scope.add_argument("-A", "--all-namespaces", action="store_true", help="Watch every namespace (default).")
    p.add_argument("--kubeconfig", help="Kubeconfig path (default: $KUBECONFIG, ~/.kube/config, in-cluster).")
    p.add_argument("--metrics-port", type=int, default=8080, help="Prometheus /metrics port (0: off).")
    p.add_argument("--health-port", type=int, default=8081, help="Liveness /healthz port (0: off).")
    p.add_argument("--runtime-image", default=names.DEFAULT_RUNTIME_IMAGE, help="Image of roles that name none.")
    p.add_argument("--runtime-image-features", default=",".join(names.DEFAULT_RUNTIME_FEATURES),
                   help=f"What that image carries beyond kubeforge, a comma list of {', '.join(admission.FEATURES)} "
                   f"('' for none); the webhook refuses jobs that need what it lacks (default: what `make images` "
                   f"builds).")
    p.add_argument("--coscheduling-scheduler-name", default="", metavar="NAME",
                   help="The scheduler that serves PodGroups (scheduler-plugins' Coscheduling): the schedulerName "
                   "of Coscheduling pods, and what lets gang.backend Auto choose Coscheduling (docs/operator.md).")
    p.add_argument("--image-pull-secret", action="append", default=[], metavar="NAME",
                   help="imagePullSecrets of every role pod whose role names none (repeatable).")
    p.add_argument("--workers", type=int, default=16, help="Reconcile worker threads.")
    p.add_argument("--status-interval", type=float, default=5.0, help="Seconds before a status write of one job "
                   "that changes only counts, messages or a condition's reason; each further such write in a row "
                   "waits twice as long, up to 6 times this (a phase, a condition's status or a failure is written "
                   "at once; 0: every change at once).")
    p.add_argument("--node-loss-grace-seconds", type=float, default=nodeloss.GRACE_S,
                   help=f"Seconds a node may be not Ready before the job's pods on it are failed (NodeLost) and "
                   f"force-deleted, {nodeloss.GRACE_MIN_S:.0f}-{nodeloss.GRACE_MAX_S:.0f} (docs/node-loss.md).")
    p.add_argument("--pool-master-key-file", default=os.environ.get("KUBEFORGE_POOL_MASTER_KEY_FILE") or None,
                   metavar="PATH", help="File holding the pool master key (at least 32 bytes): the keys of "
                   "GeneratorPools and of the jobs attached to them are derived from it (docs/generator-pool.md); "
                   "without it no pool is rendered (default: $KUBEFORGE_POOL_MASTER_KEY_FILE).")
    p.add_argument("--log-format", choices=["json", "text"], default="json")
    p.add_argument("-v", "--verbose", action="store_true")
    w = p.add_argument_group("admission webhook (docs/security.md)")
    w.add_argument("--no-webhook", dest="webhook", action="store_false", help="Do not serve the webhook.")
    w.add_argument("--webhook-addr", default="127.0.0.1", help="Bind address (0.0.0.0 in a pod).")
    w.add_argument("--webhook-port", type=int, default=0, help="HTTPS port (0: a free one; 9443 with a cert dir).")
    w.add_argument("--webhook-host", default=None, help="Host in the webhook URL and certificate (default: the "
                   "bind address).")
    w.add_argument("--webhook-cert-dir", default=None, help="tls.crt/tls.key from the cluster (Helm); without it "
                   "a self-signed certificate is made and the ValidatingWebhookConfiguration is managed here.")
    p.add_argument("--leader-elect", action="store_true", help="Run active only while holding a Lease (replicas > 1).")
    p.add_argument("--leader-lease", default="kubeforge-operator", help="Name of the Lease.")
    p.add_argument("--leader-namespace", help="Namespace of the Lease (default: $POD_NAMESPACE).")
    p.add_argument("--leader-lease-seconds", type=int, default=6, help="Lease duration: a killed leader is replaced "
                   "after at most this long.")
    p.add_argument("--leader-renew-seconds", type=float, default=2.0, help="How often the leader renews the Lease.")
    a = p.parse_args(list(argv))
    features = tuple(f for f in a.runtime_image_features.split(",") if f)
    unknown = sorted(set(features) - set(admission.FEATURES))
    if unknown:
        p.error(f"--runtime-image-features: unknown {', '.join(unknown)} (known: {', '.join(admission.FEATURES)})")
    return Options(namespaces=tuple(a.namespace), all_namespaces=a.all_namespaces or not a.namespace,
                   kubeconfig=a.kubeconfig, metrics_port=a.metrics_port, health_port=a.health_port,
                   runtime_image=a.runtime_image, runtime_image_features=features,
                   coscheduling_scheduler=a.coscheduling_scheduler_name,
                   image_pull_secrets=tuple(a.image_pull_secret), workers=a.workers,
                   status_interval=a.status_interval, node_loss_grace_seconds=a.node_loss_grace_seconds,
                   log_format=a.log_format, verbose=a.verbose,
                   webhook=a.webhook, webhook_addr=a.webhook_addr, webhook_port=a.webhook_port,
                   webhook_host=a.webhook_host, webhook_cert_dir=a.webhook_cert_dir,
                   leader_elect=a.leader_elect, leader_lease=a.leader_lease,
                   leader_namespace=a.leader_namespace or os.environ.get("POD_NAMESPACE"),
                   leader_lease_s=a.leader_lease_seconds, leader_renew_s=a.leader_renew_seconds,
                   pool_master_key_file=a.pool_master_key_file)


def pool_master(opts: Options) -> bytes | None:
    """The pool master key the options name (None: none named; ``poolkeys.MasterKeyError``: named but unusable)."""
    if not opts.pool_master_key_file:
        logging.getLogger("kubeforge.operator").warning(
            "no --pool-master-key-file: GeneratorPools are not rendered and jobs on them get no pods")
        return None
    return poolkeys.read_master(opts.pool_master_key_file)


def runtime_image(opts: Options) -> admission.RuntimeImage:
    """The image roles that name none run, as the webhook reviews against it."""
    return admission.RuntimeImage(image=opts.runtime_image, features=frozenset(opts.runtime_image_features))


def pool_lookup(cluster: apply.Cluster) -> admission.PoolLookup:
    """How the admission webhook reads the GeneratorPool a job names."""
    return lambda namespace, name: cluster.get(contract.API_VERSION, contract.POOL_KIND, namespace, name)


def build(opts: Options) -> tuple[router_mod.Router, kopf.OperatorRegistry, apply.Cluster, webhook.Webhook | None]:
    """The router (with its reconcile work), the kopf registry routing into it, the API client, the webhook kopf
    serves (self-registered mode only: in-cluster, ``main`` serves it with ``webhook.AdmissionServer``)."""
    creds = apply.load_credentials(opts.kubeconfig)
    cluster = apply.Cluster(creds, pool_size=max(opts.workers * 4, 16))
    cache = reconcile.ApplyCache()
    appliers = concurrent.futures.ThreadPoolExecutor(max_workers=opts.workers * 2, thread_name_prefix="apply")
    jobs, pods = watchcache.JobCache(), watchcache.PodCache()
    pacer = reconcile.StatusPacer(interval=opts.status_interval)
    master = pool_master(opts)

    def work(key: tuple[str, str], failures: list[Any]) -> reconcile.Outcome:
        return reconcile.reconcile(cluster, key, image=opts.runtime_image, cache=cache, pool=appliers,
                                   seen_failures=failures, jobs=jobs, pods=pods, pacer=pacer,
                                   node_loss_grace=nodeloss.clamp_grace(opts.node_loss_grace_seconds),
                                   coscheduling_scheduler=opts.coscheduling_scheduler,
                                   image_pull_secrets=opts.image_pull_secrets, pool_master=master)

    router = router_mod.Router(work, invalidate=cache.forget, workers=opts.workers)

    def pool_work(key: tuple[str, str], _failures: list[Any]) -> reconcile.Outcome:
        return poolreconcile.reconcile_pool(cluster, key, image=opts.runtime_image, cache=cache, pool=appliers,
                                            image_pull_secrets=opts.image_pull_secrets, master=master)

    pool_router = router_mod.Router(pool_work, invalidate=cache.forget, workers=max(1, opts.workers // 4))
    router.companions.append(pool_router)
    hook = webhook.prepare(addr=opts.webhook_addr, port=opts.webhook_port,
                           host=opts.webhook_host or opts.webhook_addr, cert_dir=opts.webhook_cert_dir) \
        if opts.webhook and not opts.webhook_cert_dir else None
    registry = handlers.build_registry(router, creds, hook, jobs=jobs, pods=pods, runtime=runtime_image(opts),
                                       pools=pool_lookup(cluster), pool_router=pool_router)
    return router, registry, cluster, hook


async def serve(opts: Options, *, stop_flag: Any = None, ready_flag: Any = None,
                metrics_started: bool = False) -> None:
    """Run the operator until ``stop_flag`` is set (or forever)."""
    router, registry, cluster, hook = build(opts)
    if not metrics_started:
        metrics.serve(opts.metrics_port)
    try:
        await kopf.operator(
            registry=registry, standalone=True, clusterwide=opts.all_namespaces, namespaces=list(opts.namespaces),
            liveness_endpoint=f"http://0.0.0.0:{opts.health_port}/healthz" if opts.health_port else None,
            stop_flag=stop_flag, ready_flag=ready_flag)
    finally:
        router.shutdown()
        if hook is not None and hook.managed:  # a webhook nobody serves would refuse every RLJob
            try:
                cluster.delete_webhook_configuration(webhook.MANAGED_NAME)
            except Exception as exc:  # noqa: BLE001 - best effort on the way out
                logging.getLogger("kubeforge.operator").warning("could not delete the webhook configuration: %s", exc)


def run_in_thread(opts: Options) -> tuple[threading.Thread, threading.Event]:
    """Start the operator in a daemon thread (tests); set the returned event to stop it."""
    stop, ready = threading.Event(), threading.Event()
    thread = threading.Thread(target=lambda: asyncio.run(serve(opts, stop_flag=stop, ready_flag=ready)),
                              name="kubeforge-operator", daemon=True)
    thread.start()
    ready.wait(60)
    return thread, stop


class _Healthz(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self.send_response(200 if self.path == "/healthz" else 404)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def standby(opts: Options, term: threading.Event) -> leader.Elector | None:
    """With --leader-elect: block until this process holds the Lease (serving a plain /healthz meanwhile) and keep
    renewing it (exit at once if it is lost); None when ``term`` was set first."""
    if not opts.leader_namespace:
        raise SystemExit("--leader-elect needs --leader-namespace or $POD_NAMESPACE")
    pod = os.environ.get("POD_NAME") or socket.gethostname()
    uid = os.environ.get("POD_UID")
    owner = leader.pod_owner(pod, uid) if uid and opts.leader_namespace == os.environ.get("POD_NAMESPACE") else None
    elector = leader.Elector(apply.Cluster(apply.load_credentials(opts.kubeconfig), pool_size=2),
                             namespace=opts.leader_namespace, name=opts.leader_lease, identity=leader.identity(pod),
                             duration_s=opts.leader_lease_s, renew_s=opts.leader_renew_s, owner=owner)
    health = None
    if opts.health_port:
        health = http.server.ThreadingHTTPServer(("0.0.0.0", opts.health_port), _Healthz)
        threading.Thread(target=health.serve_forever, name="standby-healthz", daemon=True).start()
    try:
        if not elector.acquire(term):
            return None
    finally:
        if health is not None:
            health.shutdown()
            health.server_close()
    elector.keep(lambda: os._exit(1))    # never two active operators: a leader that lost its Lease leaves at once
    return elector


def main(argv: Sequence[str] | None = None) -> int:
    memory.limit_arenas()                # before any thread starts (memory.py)
    opts = parse_args(argv or [])
    try:                   # an unusable key file stops the operator here, before it takes the Lease
        if opts.pool_master_key_file:
            poolkeys.read_master(opts.pool_master_key_file)
    except poolkeys.MasterKeyError as exc:
        raise SystemExit(f"kubeforge operator: --pool-master-key-file: {exc}") from exc
    fmt = kopf.LogFormat.JSON if opts.log_format == "json" else kopf.LogFormat.FULL
    kopf.configure(verbose=opts.verbose, log_format=fmt)
    logging.getLogger("kubeforge").setLevel(logging.DEBUG if opts.verbose else logging.INFO)
    if not opts.verbose:   # kopf logs every handler success at INFO: one line per watch event
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    term = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: term.set())
    metrics.serve(opts.metrics_port)     # a standby is scraped too
    if opts.webhook and opts.webhook_cert_dir:   # in-cluster: every replica answers reviews, standbys too
        runtime = runtime_image(opts)
        lookup = pool_lookup(apply.Cluster(apply.load_credentials(opts.kubeconfig)))
        webhook.AdmissionServer(webhook.prepare(addr=opts.webhook_addr, port=opts.webhook_port,
                                                host=opts.webhook_host or opts.webhook_addr,
                                                cert_dir=opts.webhook_cert_dir),
                                lambda doc: webhook.answer(doc, runtime=runtime, pools=lookup)).start()
    elector = None
    if opts.leader_elect:
        metrics.LEADER.set(0)
        elector = standby(opts, term)
        if elector is None:
            return 0
    metrics.LEADER.set(1)
    stop = threading.Event()
    failed: list[BaseException] = []

    def run() -> None:
        try:
            asyncio.run(serve(opts, stop_flag=stop, metrics_started=True))
        except BaseException as exc:  # noqa: BLE001 - reported by main
            failed.append(exc)

    kopf_thread = threading.Thread(target=run, name="kopf", daemon=True)
    kopf_thread.start()
    trimmed = time.monotonic()
    while kopf_thread.is_alive() and not term.wait(0.5):
        if time.monotonic() - trimmed > memory.TRIM_EVERY_S:
            memory.trim()
            trimmed = time.monotonic()
    stop.set()
    t0 = time.monotonic()
    kopf_thread.join(STOP_GRACE_S)
    if kopf_thread.is_alive():
        logging.getLogger("kubeforge.operator").warning("kopf did not stop in %.0f s", STOP_GRACE_S)
    if elector is not None:
        elector.release()
    log = logging.getLogger("kubeforge.operator")
    log.info("stopped in %.1f s", time.monotonic() - t0)
    code = 0 if term.is_set() and not failed else 1
    if failed:
        log.error("operator failed: %r", failed[0])
    if kopf_thread.is_alive():     # do not wait for its worker threads at interpreter exit
        logging.shutdown()
        os._exit(code)
    return code
