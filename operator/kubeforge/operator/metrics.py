"""The operator's Prometheus series, on a registry of its own, served on ``--metrics-port``.

Series: reconciles and errors per triggering handler, reconcile duration and latency (event to pass done), RLJobs
by phase (this process's view), the time from an RLJob's creation to its gang first Running, failures acted on (by role, reason, action) and the
time from a restart decision to every role ready again, the writes of stale trainer epochs refused; the API requests it sent (by verb and resource), the pod
re-LISTs that failed; whether
this process is the active replica, and the admission reviews its webhook server answered.
"""
from __future__ import annotations

import threading

import prometheus_client as prom

REGISTRY = prom.CollectorRegistry()
RECONCILES = prom.Counter("kubeforge_operator_reconciles_total", "Reconcile passes, by the handler that asked.",
                          ["handler"], registry=REGISTRY)
ERRORS = prom.Counter("kubeforge_operator_reconcile_errors_total", "Reconcile passes that raised, by handler.",
                      ["handler"], registry=REGISTRY)
EVENTS = prom.Counter("kubeforge_operator_events_total", "Watch events routed, by handler.", ["handler"],
                      registry=REGISTRY)
DURATION = prom.Histogram("kubeforge_operator_reconcile_duration_seconds", "Wall time of one reconcile pass.",
                          buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10), registry=REGISTRY)
LATENCY = prom.Histogram("kubeforge_operator_reconcile_latency_seconds",
                         "Seconds from the first event asking for a pass of a job to the end of the pass that "
                         "served it (queueing behind that job's running pass included).",
                         buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60), registry=REGISTRY)
JOBS = prom.Gauge("kubeforge_operator_rljobs", "RLJobs by phase.", ["phase"], registry=REGISTRY)
GANG_RUNNING = prom.Histogram("kubeforge_operator_gang_running_seconds",
                              "Seconds from an RLJob's creation to all its pods Running and ready (first time).",
                              buckets=(1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1800), registry=REGISTRY)

RESTARTS = prom.Counter("kubeforge_operator_failures_total", "Failures acted on by the failure policy, by the "
                       "failed role, its termination reason and the action taken (RestartAll, RestartRole, Fail, "
                       "Ignore).", ["role", "reason", "action"], registry=REGISTRY)
FENCED = prom.Counter("kubeforge_operator_fenced_writes_total", "Writes of stale trainer epochs refused, by kind: "
                     "checkpoint (the checkpoint store), push (the generators), report (progress the operator "
                     "ignored); grows by what status.fencedWrites gains (docs/fencing.md).", ["kind"],
                     registry=REGISTRY)
RECOVERY = prom.Histogram("kubeforge_operator_recovery_seconds", "Seconds from a restart decision to every role "
                          "ready again, by action.", ["action"],
                          buckets=(1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1800), registry=REGISTRY)

LEADER = prom.Gauge("kubeforge_operator_leader", "1 while this process is the active operator (holds the Lease, "
                    "or runs without leader election), 0 while it stands by.", registry=REGISTRY)
API_REQUESTS = prom.Counter("kubeforge_operator_api_requests_total", "Requests this process sent to the API server, "
                            "by verb (get, list, create, apply, patch, update, delete) and resource (plural, with "
                            "its subresource: rljobs/status).", ["verb", "resource"], registry=REGISTRY)
STATUS_DEFERRED = prom.Counter("kubeforge_operator_status_writes_deferred_total", "Status writes of detail only "
                               "(counts, messages) held back because the job's status was written less than the "
                               "pacing interval ago (the pass runs again when it is due).", registry=REGISTRY)
POD_RELIST_FAILED = prom.Counter("kubeforge_operator_pod_relist_failures_total", "Periodic re-LISTs of a job's "
                                 "pods that failed (API error, timeout); the pass used the watch-fed pods instead.",
                                 registry=REGISTRY)
ADMISSION = prom.Counter("kubeforge_operator_admission_reviews_total", "Admission reviews answered by the operator's "
                         "own webhook server, by result (allowed, denied, malformed: answered 400 and dropped).",
                         ["result"], registry=REGISTRY)

_phases: dict[tuple[str, str], str] = {}
_lock = threading.Lock()


def set_phase(key: tuple[str, str], phase: str | None) -> None:
    """Track one job's phase (None: the job is gone) and refresh the by-phase gauge."""
    with _lock:
        if phase is None:
            _phases.pop(key, None)
        else:
            _phases[key] = phase
        counts: dict[str, int] = {}
        for p in _phases.values():
            counts[p] = counts.get(p, 0) + 1
    for p in ("Pending", "Starting", "Running", "Restarting", "Suspended", "Succeeded", "Failed"):
        JOBS.labels(p).set(counts.get(p, 0))


def serve(port: int) -> None:
    """Serve /metrics on ``port`` (0: disabled)."""
    if port:
        prom.start_http_server(port, registry=REGISTRY)
