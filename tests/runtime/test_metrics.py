"""metrics: the families exist with role/replica labels; /metrics, /healthz, /readyz over HTTP on loopback; clean
stop frees the port; per-process registries are independent."""
from __future__ import annotations

import socket
import urllib.error
import urllib.request
from typing import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kubeforge.api import contract
from kubeforge.runtime import metrics, transport

pytestmark = pytest.mark.timeout(60)

FAMILIES = {
    "kubeforge_tokens_generated", "kubeforge_completions_generated", "kubeforge_rollouts_sent",
    "kubeforge_rollouts_received", "kubeforge_rollouts_dropped", "kubeforge_verifier_score",
    "kubeforge_verifier_errors", "kubeforge_reward", "kubeforge_reward_mean", "kubeforge_loss", "kubeforge_kl",
    "kubeforge_clip_fraction", "kubeforge_grad_norm", "kubeforge_policy_lag", "kubeforge_policy_version",
    "kubeforge_weight_sync_bytes", "kubeforge_weight_sync_seconds", "kubeforge_phase_seconds", "kubeforge_step",
}


def get(url: str) -> tuple[int, str, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.headers.get("Content-Type", ""), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Content-Type", ""), e.read().decode()


@pytest.fixture
def served() -> Iterator[tuple[metrics.Metrics, metrics.MetricsServer, str]]:
    m = metrics.Metrics(role="trainer", replica=1)
    server = metrics.serve(m, host="127.0.0.1", port_base=0)
    yield m, server, f"http://127.0.0.1:{server.port}"
    server.stop()


def samples(body: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(body) for s in fam.samples}


def test_scrape_metrics(served: tuple[metrics.Metrics, metrics.MetricsServer, str]) -> None:
    m, _, url = served
    m.tokens_generated.inc(120)
    m.loss.set(0.75)
    m.rollouts_dropped.labels(reason="stale").inc(2)
    m.drop_hook()("malformed")
    m.phase_seconds.labels(phase="backward").observe(0.3)
    m.weight_sync_bytes.inc(4096)
    m.observe_scores(rewards=[1.0, 0.5], scores={"answer": [1.0, 0.0]}, errors={"answer": 1, "format": 0})
    status, ctype, body = get(url + "/metrics")
    assert status == 200 and ctype.startswith("text/plain")
    names = {fam.name for fam in text_string_to_metric_families(body)}
    assert FAMILIES <= names, FAMILIES - names
    got = samples(body)
    base = (("replica", "1"), ("role", "trainer"))
    assert got[("kubeforge_tokens_generated_total", base)] == 120
    assert got[("kubeforge_loss", base)] == 0.75
    assert got[("kubeforge_rollouts_dropped_total", (("reason", "stale"),) + base)] == 2
    assert got[("kubeforge_rollouts_dropped_total", (("reason", "malformed"),) + base)] == 1
    assert got[("kubeforge_verifier_errors_total", base + (("verifier", "answer"),))] == 1
    assert ("kubeforge_verifier_errors_total", base + (("verifier", "format"),)) not in got
    assert got[("kubeforge_verifier_score_count", base + (("verifier", "answer"),))] == 2
    assert got[("kubeforge_reward_sum", base)] == 1.5
    assert got[("kubeforge_phase_seconds_count", (("phase", "backward"),) + base)] == 1
    assert got[("kubeforge_weight_sync_bytes_total", base)] == 4096


def test_health_and_readiness(served: tuple[metrics.Metrics, metrics.MetricsServer, str]) -> None:
    m, server, url = served
    assert get(url + "/healthz")[0] == 200
    assert get(url + "/readyz")[0] == 503
    server.set_ready()
    assert get(url + "/readyz")[:1] == (200,)
    assert samples(get(url + "/metrics")[2])[("kubeforge_ready", (("replica", "1"), ("role", "trainer")))] == 1
    server.set_ready(False)
    assert get(url + "/readyz")[0] == 503
    server.set_healthy(False)
    assert get(url + "/healthz")[0] == 503
    assert get(url + "/nope")[0] == 404


def test_a_start_is_not_a_hang(served: tuple[metrics.Metrics, metrics.MetricsServer, str]) -> None:
    """Before its first ready (a vLLM engine still loading, no heartbeat) a role is starting: /startz is 503 (the
    pod's startupProbe holds the liveness probe off) and /healthz stays 200 past the progress deadline, up to the
    start deadline. The first ready is a heartbeat and ends the start; from then on the progress deadline rules."""
    import json
    import time

    _, server, url = served
    server.deadline, server.start_deadline = 0.3, 60.0
    time.sleep(0.6)                                       # past the progress deadline, still loading
    code, _, body = get(url + "/healthz")
    assert code == 200 and json.loads(body)["started"] is False
    assert get(url + "/startz")[0] == 503
    server.set_ready()
    code, _, body = get(url + "/healthz")
    assert code == 200 and json.loads(body)["started"] is True and json.loads(body)["activity"] == "started"
    assert get(url + "/startz")[0] == 200
    time.sleep(0.6)                                       # started, then no heartbeat: unhealthy
    assert get(url + "/healthz")[0] == 503
    server.set_ready(False)                               # not ready again: still started (liveness applies)
    assert get(url + "/startz")[0] == 200 and get(url + "/healthz")[0] == 503


def test_a_start_that_never_ends_is_a_hang() -> None:
    import time

    server = metrics.serve(metrics.Metrics(role="generator", replica=0), host="127.0.0.1", port_base=0)
    try:
        server.deadline, server.start_deadline = 60.0, 0.3
        time.sleep(0.6)
        assert get(f"http://127.0.0.1:{server.port}/healthz")[0] == 503
        assert get(f"http://127.0.0.1:{server.port}/startz")[0] == 503
    finally:
        server.stop()


def test_receiver_drops_reach_metrics() -> None:
    m = metrics.Metrics(role="verifier", replica=0)
    rx = transport.open_receiver("mem://metrics-drops", on_drop=m.drop_hook())
    tx = transport.open_sender(["mem://metrics-drops"], role="generator", index=0, ready_timeout=1)
    try:
        assert isinstance(tx, transport.MemSender)
        tx.send_frame(b"garbage")
        assert rx.recv(0.2) is None
        body = m.render().decode()
        assert 'kubeforge_rollouts_dropped_total{reason="foreign",replica="0",role="verifier"} 1.0' in body
    finally:
        tx.close()
        rx.close()


def test_stop_frees_the_port_and_registries_are_independent() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        base = s.getsockname()[1] - contract.PORT_METRICS
    a = metrics.Metrics(role="generator", replica=0)
    b = metrics.Metrics(role="generator", replica=0)  # a second registry: no duplicate-series error
    a.tokens_generated.inc()
    server = metrics.serve(a, host="127.0.0.1", port_base=base)
    assert server.port == base + contract.PORT_METRICS
    assert get(f"http://127.0.0.1:{server.port}/healthz")[0] == 200
    server.stop()
    server.stop()  # idempotent
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{server.port}/healthz", timeout=2)
    again = metrics.serve(b, host="127.0.0.1", port_base=base)  # the port is free again
    try:
        assert "kubeforge_tokens_generated_total" in get(f"http://127.0.0.1:{again.port}/metrics")[2]
        assert samples(get(f"http://127.0.0.1:{again.port}/metrics")[2])[
            ("kubeforge_tokens_generated_total", (("replica", "0"), ("role", "generator")))] == 0
    finally:
        again.stop()
