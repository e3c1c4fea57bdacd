"""The stock-scheduler variant of the test cluster (``make cluster-up SCHEDULER=default``, the ``stock_cluster``
fixture): the kube-scheduler process is the stock binary built from k8s.io/kubernetes (``kube-scheduler-stock``),
the cluster serves no ``scheduling.x-k8s.io`` API, and pods are placed one by one: a StatefulSet whose pods carry a
pod-group label of 5 members runs its 4 pods at once (the Coscheduling cluster would hold them; e2e/
test_cluster_smoke.py shows that side)."""
from __future__ import annotations

import json
import os
import uuid

import pytest

from kfcluster import binaries, harness, lifecycle, testing
from kfcluster import config as cfg

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(600)]


def test_stock_cluster_runs_the_stock_scheduler_without_podgroups(stock_cluster: lifecycle.Cluster) -> None:
    cluster = stock_cluster
    assert cluster.scheduler == cfg.SCHEDULER_DEFAULT
    pid = int(open(os.path.join(cluster.kwok_dir, "clusters", cluster.name, "pids", "kube-scheduler.pid")).read())
    assert os.path.realpath(f"/proc/{pid}/exe") == str(binaries.bin_dir() / "kube-scheduler-stock")
    k = harness.K(kubectl=cluster.kubectl.binary, kubeconfig=cluster.kubeconfig)
    assert "scheduling.x-k8s.io" not in k.run("api-versions").stdout
    ns = k.namespace(f"stock-{uuid.uuid4().hex[:6]}")
    try:
        sts = testing.statefulset(name="g", replicas=4, spec=testing.pod_spec(gpus=1),
                                  labels={testing.PODGROUP_LABEL: "five"})   # a gang of 5 that never completes
        k.run("apply", "-n", ns, "-f", "-", stdin=json.dumps(sts))
        def running() -> list[str]:
            pods = k.items("pods", ns, "app=g")
            up = [p["metadata"]["name"] for p in pods if p["status"].get("phase") == "Running"
                  and p["spec"].get("nodeName", "").startswith("kwok-")]
            return up if len(up) == 4 else []
        assert harness.wait("the 4 pods Running, no gang held", running, timeout_s=120)
    finally:
        k.run("delete", "namespace", ns, "--wait=false", check=False)
