"""The operator's admission webhook on the REAL kube-apiserver: the cluster refuses what the launcher refuses.

The operator runs on the host (as in the e2e harness and in development): it makes a self-signed certificate,
serves kopf's webhook on a free port and registers a ValidatingWebhookConfiguration pointing at itself. Every
``SEMANTIC_CASES`` case of the shared table (``tests/api/invalid_manifests.py``: cross-field and semantic rules the
CRD's schema cannot say) is then sent with ``kubectl apply --dry-run=server``: the API server must refuse it naming
the case's field with the launcher's words, and ``kubeforge.api.load.parse`` must refuse the same manifest alike.
A graceful stop removes the configuration again. A host process because that self-registration (its own certificate
and configuration, removed at stop) is the off-cluster mode under test, and this kwok-tier suite has no node that
runs containers; the chart's webhook (a Service and a TLS Secret) is tested in ``e2e/test_helm_install.py``.
"""
from __future__ import annotations

import copy
import importlib.util
import json
import pathlib
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from kfcluster import harness
from kfcluster.harness import wait
from kubeforge.api import load

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(600)]
ROOT = pathlib.Path(__file__).resolve().parents[1]
CONFIG = "validatingwebhookconfiguration/kubeforge.dev"


def _table() -> Any:
    spec = importlib.util.spec_from_file_location("kubeforge_invalid_manifests_admission",
                                                  ROOT / "tests" / "api" / "invalid_manifests.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


table = _table()


@pytest.fixture(scope="module")
def env(kube_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[harness.K, str]]:
    k = harness.K(kubectl=kube_cluster.kubectl.binary, kubeconfig=kube_cluster.kubeconfig)
    k.ensure_crd()
    ns = k.namespace(f"adm-{uuid.uuid4().hex[:6]}")
    op = harness.Operator(kubeconfig=kube_cluster.kubeconfig,
                          log_path=tmp_path_factory.mktemp("operator") / "operator.log").start()
    probe = table.SEMANTIC_CASES[0].manifest()
    probe["metadata"]["namespace"] = ns
    # kopf registers the configuration once its server listens: wait until a refusal comes from the webhook
    wait("the webhook refuses", lambda: "denied the request" in apply_dry_run(k, probe).stderr, timeout_s=90)
    try:
        yield k, ns
    finally:
        op.stop()
        gone = k.run("get", CONFIG, check=False)
        k.run("delete", "namespace", ns, "--wait=false", check=False)
        assert gone.returncode != 0 and "NotFound" in gone.stderr, "a clean stop leaves no webhook configuration"


def apply_dry_run(k: harness.K, doc: dict[str, Any]) -> Any:
    return k.run("apply", "--dry-run=server", "-f", "-", stdin=json.dumps(doc), check=False)


def test_the_configuration_points_at_the_operator(env: tuple[harness.K, str]) -> None:
    k, _ = env
    cfg = json.loads(k.run("get", CONFIG, "-o", "json").stdout)
    (hook,) = cfg["webhooks"]
    assert hook["failurePolicy"] == "Fail" and hook["sideEffects"] == "None"
    assert hook["clientConfig"]["url"].startswith("https://127.0.0.1:") and hook["clientConfig"]["caBundle"]
    assert hook["rules"][0]["resources"] == ["rljobs"] and sorted(hook["rules"][0]["operations"]) == ["CREATE",
                                                                                                      "UPDATE"]


def test_the_base_manifest_and_the_examples_are_admitted(env: tuple[harness.K, str]) -> None:
    k, ns = env
    doc = table.valid()
    doc["metadata"]["namespace"] = ns
    run = apply_dry_run(k, doc)
    assert run.returncode == 0, run.stderr
    for path in sorted((ROOT / "examples").glob("*.yaml")):
        run = k.run("apply", "--dry-run=server", "-n", ns, "-f", str(path), check=False)
        assert run.returncode == 0, (path.name, run.stderr)


@pytest.mark.parametrize("case", table.SEMANTIC_CASES, ids=lambda c: c.id)
def test_the_cluster_refuses_what_the_launcher_refuses(env: tuple[harness.K, str], case: Any) -> None:
    k, ns = env
    doc = case.manifest()
    doc["metadata"]["namespace"] = ns
    run = apply_dry_run(k, doc)
    assert run.returncode != 0, f"the API server admitted {case.id}"
    err = run.stderr
    assert "denied the request" in err and case.path in err and case.message.lower() in err.lower(), err
    with pytest.raises(load.InvalidRLJob) as info:
        load.parse(copy.deepcopy(case.manifest()))
    assert any(p.startswith(case.path) and case.message.lower() in p.lower() for p in info.value.problems)
    # the webhook names every problem the launcher names, with the same words
    assert all(p in err for p in info.value.problems), (info.value.problems, err)
