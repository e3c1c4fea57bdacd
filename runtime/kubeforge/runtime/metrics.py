"""Prometheus metrics of one role process, and its HTTP endpoints: ``/metrics``, ``/healthz``, ``/readyz``,
``/startz``.

Neighbours: ``role.run`` creates one ``Metrics(role=..., replica=...)`` per process, the role loops' observers
(``observe``) update it;
``transport`` receivers report refused frames through ``Metrics.drop_hook()``; the verifier role feeds
``observe_scores``; ``serve`` exposes everything on ``port_base + contract.PORT_METRICS`` (the pod's metrics port,
scraped by Prometheus; the kubelet probes ``/startz``, ``/healthz`` and ``/readyz``).

Invariants:
- Each process has its own ``CollectorRegistry`` (never the global default one), so tests can build many.
- Every series carries ``role`` and ``replica`` labels; families with more labels say which (``reason``,
  ``verifier``, ``phase``). Names are ``kubeforge_*``; counters end in ``_total``.
- On local rank 0 of a trainer pod with several ranks, ``/metrics`` also carries the sibling ranks' series
  (``podmetrics``: the pod is one scrape target; ``replica`` is each rank's global rank).
- ``/readyz`` is 503 until the role calls ``set_ready(True)`` (e.g. engine loaded, sockets handshaken);
  ``/healthz`` is 200 while the process serves and its last ``heartbeat`` is younger than the progress deadline
  (``spec.failurePolicy.progressDeadlineSeconds``), 503 after ``set_healthy(False)`` or once the heartbeat is
  older: the pod's liveness probe (and the local launcher's watchdog) then restarts the role. The body is JSON:
  ``{"healthy", "started", "activity", "heartbeatAgeSeconds"}`` (activity: what the role was last doing, e.g.
  ``sync``).
- A start is not a hang: until the role first reports ready (``set_ready(True)``: model or vLLM engine loaded) it
  is "starting", ``/startz`` is 503 and ``/healthz`` stays 200 for ``start_deadline`` seconds from the server's start
  (``FailurePolicySpec.start_deadline_seconds()``, a multiple of the progress deadline), however long the engine
  load goes without a heartbeat. The pod's startupProbe asks ``/startz`` (the kubelet runs no liveness probe before
  it passes); the local watchdog asks ``/healthz``. The first ready is also a heartbeat, and from then on the
  progress deadline applies.

Threads and shutdown::

    role main thread ──updates──▶ Metrics (prometheus_client objects are thread-safe)
    MetricsServer thread ── serve_forever ──▶ GET /metrics → generate_latest(registry)
    server.stop(): shutdown() (serve_forever returns) → server_close() (socket freed) → join(thread)
"""
from __future__ import annotations

import http.server
import json
import threading
import time
from typing import Any, Callable, Sequence

import prometheus_client as prom

from kubeforge.api import contract

BASE_LABELS = ("role", "replica")
DROP_REASONS = ("stale", "malformed", "foreign", "version", "unauthenticated")
PHASES = ("wait", "generate", "score", "forward", "backward", "optimizer", "sync", "checkpoint", "step")
_SECONDS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
_UNIT = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
_TURNS = (1, 2, 3, 4, 6, 8, 12, 16, 32, 64)
_LAG = (0, 1, 2, 3, 4, 6, 8, 16)


class Family:
    """A labelled metric family with ``role``/``replica`` bound: ``family.labels(reason="stale").inc()``."""

    def __init__(self, metric: Any, base: dict[str, str]) -> None:
        self._metric = metric
        self._base = base

    def labels(self, **labels: str) -> Any:
        return self._metric.labels(**self._base, **labels)


class Metrics:
    """Every metric family of a kubeforge role process, bound to its role and replica."""

    def __init__(self, *, role: str, replica: int, registry: prom.CollectorRegistry | None = None) -> None:
        self.registry = registry or prom.CollectorRegistry(auto_describe=True)
        self.role, self.replica = role, replica
        self._base = {"role": role, "replica": str(replica)}
        c, g, h = self._counter, self._gauge, self._histogram
        # generator
        self.tokens_generated = c("tokens_generated_total", "Completion tokens sampled.")
        self.completions_generated = c("completions_generated_total", "Completions sampled.")
        self.generate_seconds = h("generate_seconds", "Wall time of one generate call (a WORK batch).", _SECONDS)
        # multi-turn episodes (spec.environment; generator)
        self.episode_turns = h("episode_turns", "Policy turns of each episode.", _TURNS)
        self.tool_calls = c("tool_calls_total", "Tool calls of the episodes sampled.")
        self.tool_errors = c("tool_errors_total", "Tool calls that failed (an invalid expression, a crash).")
        self.env_step_seconds = h("env_step_seconds", "Wall time of one environment step.", _SECONDS)
        self.env_masked_tokens = c("env_masked_tokens_total", "Environment tokens of the episodes sampled (in "
                                   "context, masked out of the loss).")
        self.env_failures = Family(self._raw(prom.Counter, "env_failures_total", "Episodes ended by their "
                                             "environment's failure, by kind: env_error, env_timeout, env_garbage, "
                                             "env_flood.", ("kind",)), self._base)
        # the agents endpoint (spec.environment type Verifiers; generator: agents.endpoint.server)
        self.endpoint_requests = Family(self._raw(prom.Counter, "endpoint_requests_total", "HTTP requests to the "
                                                  "agents endpoint, by outcome: answered, refused, disconnected "
                                                  "(the client left a stream before its end).", ("outcome",)),
                                        self._base)
        self.endpoint_refusals = Family(self._raw(prom.Counter, "endpoint_refusals_total", "Requests the agents "
                                                  "endpoint refused, by reason (the OpenAI error.code: "
                                                  "episode_busy, sampler_timeout, unsupported_sampling, ...).",
                                                  ("reason",)), self._base)
        self.endpoint_branches = Family(self._raw(prom.Counter, "endpoint_branches_total", "Answered calls by "
                                                  "where they go in the episode's recording: extends (its branch "
                                                  "goes on), or why a new branch started: first, "
                                                  "history_rewritten, template_unstable.", ("reason",)), self._base)
        self.endpoint_tokens = Family(self._raw(prom.Counter, "endpoint_tokens_total", "Tokens of the calls the "
                                                "agents endpoint sampled, by kind: prompt, completion.", ("kind",)),
                                      self._base)
        self.endpoint_tool_parses = Family(self._raw(prom.Counter, "endpoint_tool_parses_total", "Replies of calls "
                                                     "that offered tools, read for the model's tool calls, by "
                                                     "outcome: tool_calls, text, malformed (markup that does not "
                                                     "parse, returned as content), unmet (tool_choice required or "
                                                     "a function, and no such call).", ("outcome",)), self._base)
        self.endpoint_request_seconds = Family(self._raw(prom.Histogram, "endpoint_request_seconds", "Wall time "
                                                         "of one answered chat completion, body read to last byte, "
                                                         "by stream (true, false).", ("stream",),
                                                         buckets=_SECONDS), self._base)
        self.endpoint_first_token_seconds = h("endpoint_first_token_seconds", "Time from a streamed chat "
                                              "completion's body read to its first content sent.", _SECONDS)
        # a sandbox pod (spec.sandbox; sandboxes.server): leases, runs, resets, refusals
        self.sandbox_claims = Family(self._raw(prom.Counter, "sandbox_claims_total", "Claims a sandbox pod "
                                               "answered, by outcome: claimed (a lease handed out), empty (no slot "
                                               "free within the claim's wait).", ("outcome",)), self._base)
        self.sandbox_runs = Family(self._raw(prom.Counter, "sandbox_runs_total", "Programs a sandbox pod ran, by "
                                             "status: ok, timeout (killed past its limit), crashed (a limit hit, a "
                                             "flood, no result).", ("status",)), self._base)
        self.sandbox_resets = Family(self._raw(prom.Counter, "sandbox_resets_total", "Leases reset and freed, by "
                                               "reason: release, idle (no call for idleSeconds), dirty (a run timed "
                                               "out or crashed: never reused).", ("reason",)), self._base)
        self.sandbox_refusals = Family(self._raw(prom.Counter, "sandbox_refusals_total", "Requests a sandbox pod "
                                                 "refused, by reason: unauthorized, malformed, too_large, "
                                                 "not_found, unknown_lease, busy.", ("reason",)), self._base)
        self.sandbox_leases = g("sandbox_leases", "Leases a sandbox pod holds now (claimed, not yet reset).")
        self.sandbox_run_seconds = h("sandbox_run_seconds", "Wall time of one sandboxed run, process start to "
                                     "result.", _SECONDS)
        self.fenced_pushes = c("fenced_pushes_total", "Weight pushes (SYNC) refused: sent by a trainer epoch older "
                               "than one this generator has seen (docs/fencing.md).")
        # a GeneratorPool's engine (generator.pool), by attached job: labelled `rljob` as a job's own roles are (a
        # label named `job` would collide with Prometheus' target label and arrive renamed)
        self.pool_engine_seconds = Family(self._raw(prom.Counter, "pool_engine_seconds", "Engine time spent "
                                                    "sampling a job's work (its share of the engine: its rate over "
                                                    "the sum of every job's).", ("rljob",)), self._base)
        self.pool_completions = Family(self._raw(prom.Counter, "pool_completions", "Completions a pool engine "
                                                 "sampled for a job.", ("rljob",)), self._base)
        self.pool_queue_wait_seconds = Family(self._raw(prom.Histogram, "pool_queue_wait_seconds", "Time a job's "
                                                        "WORK waited in the pool engine's queue before sampling.",
                                                        ("rljob",), buckets=_SECONDS), self._base)
        self.pool_adapter_swaps = Family(self._raw(prom.Counter, "pool_adapter_swaps", "Loads of a job's adapter "
                                                   "that evicted another one (more jobs than maxAdapters).",
                                                   ("rljob",)), self._base)
        self.pool_adapter_swap_seconds = Family(self._raw(prom.Histogram, "pool_adapter_swap_seconds", "Wall time "
                                                          "of one adapter swap (unload plus load).", ("rljob",),
                                                          buckets=_SECONDS), self._base)
        # data plane
        self.rollouts_sent = c("rollouts_sent_total", "Rollout groups sent (generator: ROLLOUT; verifier: SCORED).")
        self.rollouts_received = c("rollouts_received_total", "Rollout groups received.")
        self.rollouts_dropped = Family(self._raw(prom.Counter, "rollouts_dropped_total", "Groups or frames dropped, "
                                                 "by reason: stale (policy lag), malformed, foreign, version, "
                                                 "unauthenticated.",
                                                 ("reason",)), self._base)
        self.infra_masked_rollouts = Family(self._raw(prom.Counter, "infra_masked_rollouts_total", "Rollout "
                                                      "groups kept out of training because a pod they depended on "
                                                      "was lost, by reason: env_lost (an episode's environment "
                                                      "server died, went silent or forgot it), agent_lost (its "
                                                      "agent pod died or went silent); sampled again, never "
                                                      "scored 0 and trained on (trainer).", ("reason",)), self._base)
        # verifier
        self.verifier_score = Family(self._raw(prom.Histogram, "verifier_score", "Score of each completion by each "
                                               "verifier.", ("verifier",), buckets=_UNIT), self._base)
        self.verifier_errors = Family(self._raw(prom.Counter, "verifier_errors_total", "Verifier calls that failed "
                                                "(their group scored 0).", ("verifier",)), self._base)
        self.verifier_fallbacks = Family(self._raw(prom.Counter, "verifier_fallbacks_total", "Completions a "
                                                   "verifier gave no score (error, timeout, NaN): fallback or "
                                                   "abstention.", ("verifier",)), self._base)
        self.verifier_accuracy = Family(self._raw(prom.Gauge, "verifier_accuracy", "Estimated accuracy of each "
                                                  "verifier (WeakSupervision's label model; NaN when not "
                                                  "estimated or dropped).", ("verifier",)), self._base)
        self.verifier_weight = Family(self._raw(prom.Gauge, "verifier_weight", "Weight of each verifier in the "
                                                "reward (WeightedSum: its weight; WeakSupervision: its log-odds "
                                                "weight, 0 when dropped).", ("verifier",)), self._base)
        self.verifier_cache = Family(self._raw(prom.Counter, "verifier_cache_total", "Score cache lookups by "
                                               "result (hit, miss).", ("result",)), self._base)
        self.reward = h("reward", "Reward (the aggregation of verifier scores) of each completion.", _UNIT)
        self.reward_mean = g("reward_mean", "Mean reward of the last optimizer step.")
        # trainer
        self.step = g("step", "Last completed optimizer step.")
        self.loss = g("loss", "Loss of the last optimizer step.")
        self.kl = g("kl", "Mean k3 KL to the reference model at the last step.")
        self.clip_fraction = g("clip_fraction", "Fraction of tokens whose importance ratio was clipped (last step).")
        self.grad_norm = g("grad_norm", "Gradient norm before clipping (last step).")
        self.logprob_mismatch_kl = g("logprob_mismatch_kl", "Trainer-sampler logprob mismatch before the update: "
                                     "k3 KL(behaviour || trainer) per token (last step).")
        self.logprob_mismatch_max_ratio = g("logprob_mismatch_max_ratio", "Largest token ratio trainer / behaviour "
                                            "probability before the update (last step).")
        self.mismatch_masked_fraction = g("mismatch_masked_fraction", "Completions masked by "
                                          "spec.algorithm.mismatchMask (last step).")
        self.mfu = g("mfu", "Model FLOPs utilisation of the last step: its matmul FLOP/s (forward + backward, all "
                     "ranks) over the GEMM peak measured in the trainer's process, same cores and dtype.")
        self.flops_per_second = g("flops_per_second", "Matmul FLOP/s the last train step achieved (all ranks).")
        self.peak_flops_per_second = g("peak_flops_per_second", "GEMM peak measured in the trainer's process in its "
                                       "compute dtype (summed over ranks).")
        self.policy_version = g("policy_version", "Policy version of this process's weights.")
        self.policy_lag = h("policy_lag", "Trainer version minus the version a consumed group was sampled with.",
                            _LAG)
        self.buffer_groups = g("buffer_groups", "Scored groups waiting in the trainer's buffer.")
        # weight sync
        self.weight_sync_bytes = c("weight_sync_bytes_total", "Bytes of weights broadcast or received.")
        self.weight_sync_seconds = h("weight_sync_seconds", "Wall time of one weight sync.", _SECONDS)
        self.phase_seconds = Family(self._raw(prom.Histogram, "phase_seconds", "Wall time of each phase of a step.",
                                              ("phase",), buckets=_SECONDS), self._base)
        self.ready = g("ready", "1 once the role reported ready.")

    # -- constructors: every family carries role/replica (+ extra labels)
    def _raw(self, cls: Any, name: str, doc: str, extra: Sequence[str] = (), **kw: Any) -> Any:
        return cls(f"kubeforge_{name}", doc, labelnames=BASE_LABELS + tuple(extra), registry=self.registry, **kw)

    def _counter(self, name: str, doc: str) -> Any:
        return self._raw(prom.Counter, name.removesuffix("_total"), doc).labels(**self._base)

    def _gauge(self, name: str, doc: str) -> Any:
        return self._raw(prom.Gauge, name, doc).labels(**self._base)

    def _histogram(self, name: str, doc: str, buckets: Sequence[float]) -> Any:
        return self._raw(prom.Histogram, name, doc, buckets=buckets).labels(**self._base)

    # -- helpers the roles use
    def drop_hook(self) -> Callable[[str], None]:
        """A ``transport`` ``on_drop`` callback counting refused frames in ``rollouts_dropped``."""
        return lambda reason: self.rollouts_dropped.labels(reason=reason).inc()

    def observe_scores(self, *, rewards: Sequence[float], scores: dict[str, list[float]],
                       errors: dict[str, int] | None = None) -> None:
        """Record one scored group (rewards and per-verifier scores); ``errors`` are new failures per verifier."""
        for r in rewards:
            self.reward.observe(r)
        for name, vals in scores.items():
            child = self.verifier_score.labels(verifier=name)
            for v in vals:
                child.observe(v)
        for name, n in (errors or {}).items():
            if n:
                self.verifier_errors.labels(verifier=name).inc(n)

    def render(self) -> bytes:
        """The Prometheus text exposition of this registry."""
        return prom.generate_latest(self.registry)


# ---------------------------------------------------------------- HTTP server


class MetricsServer:
    """``/metrics``, ``/healthz``, ``/readyz`` on one port, served from a daemon thread."""

    def __init__(self, metrics: Metrics, *, host: str, port: int) -> None:
        self.metrics = metrics
        self._ready = threading.Event()
        self._healthy = threading.Event()
        self._healthy.set()
        self.deadline: float | None = None
        self.start_deadline: float | None = None   # while starting (None: ``deadline``)
        self.siblings: Any = None   # podmetrics.Siblings on local rank 0 of a multi-rank trainer pod
        self.activity = "start"
        self._born = self._beat = time.monotonic()
        self._started = threading.Event()
        self._httpd = http.server.ThreadingHTTPServer((host, port), _handler(self))
        self._httpd.daemon_threads = True
        self.host, self.port = self._httpd.server_address[0], int(self._httpd.server_address[1])
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.1},
                                        name=f"metrics-{metrics.role}-{metrics.replica}", daemon=True)
        self._thread.start()
        self._stopped = False

    @property
    def is_ready(self) -> bool:
        return self._ready.is_set()

    @property
    def is_healthy(self) -> bool:
        return self._healthy.is_set()

    @property
    def is_started(self) -> bool:
        return self._started.is_set()

    def set_ready(self, ready: bool = True) -> None:
        """Ready (or not) for traffic; the first ready also ends the start (a heartbeat: liveness starts from it)."""
        if ready and not self._started.is_set():
            self.heartbeat("started")
            self._started.set()
        (self._ready.set if ready else self._ready.clear)()
        self.metrics.ready.set(1 if ready else 0)

    def set_healthy(self, healthy: bool = True) -> None:
        (self._healthy.set if healthy else self._healthy.clear)()

    def heartbeat(self, activity: str) -> None:
        """The role made progress (or is idle waiting for work: that is progress too); ``activity`` names it."""
        self.activity, self._beat = activity, time.monotonic()

    def health(self) -> dict[str, Any]:
        """Healthy while the last heartbeat is younger than ``deadline``; while starting, while the start is younger
        than ``start_deadline`` (a vLLM engine load makes no heartbeat)."""
        now, started = time.monotonic(), self.is_started
        age = now - self._beat
        if started:
            limit, spent = self.deadline, age
        else:
            limit, spent = self.start_deadline if self.start_deadline is not None else self.deadline, now - self._born
        ok = self.is_healthy and (limit is None or spent <= limit)
        return {"healthy": ok, "started": started, "activity": self.activity, "heartbeatAgeSeconds": round(age, 3)}

    def render(self) -> bytes:
        """``/metrics``: this process's series, plus its sibling ranks' when it stands for a pod of several."""
        own = self.metrics.render()
        return own if self.siblings is None else bytes(self.siblings.render(own))

    def stop(self) -> None:
        """Stop serving and free the port; idempotent."""
        if self._stopped:
            return
        self._stopped = True
        if self.siblings is not None:
            self.siblings.close()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)


def _handler(server: MetricsServer) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                self._reply(200, server.render(), prom.CONTENT_TYPE_LATEST)
            elif path == "/healthz":
                doc = server.health()
                self._reply(200 if doc["healthy"] else 503, (json.dumps(doc) + "\n").encode(), "application/json")
            elif path == "/startz":
                ok = server.is_started
                self._reply(200 if ok else 503, b"started\n" if ok else b"starting\n")
            elif path == "/readyz":
                ok = server.is_ready
                self._reply(200 if ok else 503, b"ready\n" if ok else b"not ready\n")
            else:
                self._reply(404, b"not found\n")

        def _reply(self, code: int, body: bytes, ctype: str = "text/plain; charset=utf-8") -> None:
            try:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            except (BrokenPipeError, ConnectionResetError):   # a probe or scraper that gave up: nothing to say
                pass

        def log_message(self, format: str, *args: Any) -> None:  # scrapes every few seconds: keep logs quiet
            pass

    return Handler


def serve(metrics: Metrics, *, host: str, port_base: int) -> MetricsServer:
    """Serve ``metrics`` on ``port_base + contract.PORT_METRICS`` (port_base 0: an ephemeral port, for tests)."""
    return MetricsServer(metrics, host=host, port=port_base + contract.PORT_METRICS if port_base else 0)
