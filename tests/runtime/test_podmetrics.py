"""A trainer pod with several ranks is one scrape target: local rank 0's /metrics carries every rank's series
(real HTTP servers, one per rank, as in the pod); a rank that does not answer is left out, within a bound."""
from __future__ import annotations

import copy
import json
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kubeforge.api import contract
from kubeforge.runtime import config, metrics, podmetrics
from kubeforge.runtime import startup as role_main

import test_config as tc

pytestmark = pytest.mark.timeout(60)


def _get(url: str) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return resp.status, resp.read().decode()


def _steps(text: str) -> dict[str, float]:
    return {s.labels["replica"]: s.value for f in text_string_to_metric_families(text) if f.name == "kubeforge_step"
            for s in f.samples}


def test_rank_0_serves_every_ranks_series_once_per_family() -> None:
    ranks = [metrics.Metrics(role="trainer", replica=r) for r in (4, 5, 6)]     # pod 2 of 3 ranks each
    servers = [metrics.serve(m, host="127.0.0.1", port_base=0) for m in ranks]
    try:
        for m, step in zip(ranks, (7, 8, 9)):
            m.step.set(step)
            m.phase_seconds.labels(phase="backward").observe(0.2)
        servers[0].siblings = podmetrics.Siblings([f"http://127.0.0.1:{s.port}/metrics" for s in servers[1:]])
        code, text = _get(f"http://127.0.0.1:{servers[0].port}/metrics")
        assert code == 200 and _steps(text) == {"4": 7.0, "5": 8.0, "6": 9.0}
        assert text.count("# TYPE kubeforge_step gauge") == 1          # one block per family (text format)
        counts = [s for f in text_string_to_metric_families(text) if f.name == "kubeforge_phase_seconds"
                  for s in f.samples if s.name.endswith("_count")]
        assert sorted(s.labels["replica"] for s in counts) == ["4", "5", "6"]
        # a sibling's own endpoint still serves only itself
        assert _steps(_get(f"http://127.0.0.1:{servers[1].port}/metrics")[1]) == {"5": 8.0}
        # a rank gone: rank 0 still answers, with the others, and does not wait beyond the bound
        servers[2].stop()
        t0 = time.monotonic()
        code, text = _get(f"http://127.0.0.1:{servers[0].port}/metrics")
        assert code == 200 and _steps(text) == {"4": 7.0, "5": 8.0}
        assert time.monotonic() - t0 < 5
    finally:
        for s in servers:
            s.stop()


def test_only_local_rank_0_of_a_multi_rank_pod_aggregates_and_its_urls_are_the_ranks_ports(tmp_path: Path) -> None:
    doc = copy.deepcopy(tc.DOC)
    doc["spec"]["roles"]["trainer"].update(ranksPerPod=3)
    doc["spec"]["algorithm"]["promptsPerStep"] = 8
    m = tmp_path / "job.json"
    m.write_text(json.dumps(doc))
    env = tc.env_for(m, role="trainer", index=1)
    local = [config.from_env({**env, contract.ENV_LOCAL_RANK: str(r)}) for r in range(3)]
    siblings = role_main.pod_metrics(local[0])
    try:
        assert siblings is not None
        host = role_main._loopback(local[0].bind_host)
        assert siblings.urls == [f"http://{host}:{c.port(contract.PORT_METRICS)}/metrics" for c in local[1:]]
    finally:
        siblings.close()
    assert role_main.pod_metrics(local[1]) is None and role_main.pod_metrics(config.from_env(env)) is None
    single = tmp_path / "one.json"
    single.write_text(json.dumps(tc.DOC))
    assert role_main.pod_metrics(config.from_env(tc.env_for(single, role="trainer", index=0))) is None
    assert podmetrics.sibling_urls(host="::1", pod_port_base=29500, ranks=2) == ["http://[::1]:29510/metrics"]
