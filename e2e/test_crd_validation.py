"""The generated CRD on the REAL kube-apiserver of the test cluster: what it refuses, accepts, keeps immutable.

Role: the API-server half of the shared invalid-manifest table (``tests/api/invalid_manifests.py``); each case
here also runs through the local launcher (``kubeforge.api.load.parse``) so one test shows that both sides refuse
the same manifest naming the same field. Every example in ``examples/`` is accepted, and the API server's
defaults equal the model's. Immutability: model, algorithm and trainer replicas refuse updates; generator and
verifier replicas change freely. ``kubectl explain`` shows the model's descriptions.

Requests use server-side dry run and strict field validation (what ``kubectl apply`` does by default); only the
immutability test creates a real object, in a namespace of its own that is deleted afterwards.
"""
from __future__ import annotations

import copy
import importlib.util
import json
import os
import pathlib
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from kubeforge.api import contract, crd, load

kubernetes = pytest.importorskip("kubernetes")

pytestmark = pytest.mark.cluster

ROOT = pathlib.Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
FIELD_MANAGER = "kubeforge-e2e"


def _load_table() -> Any:
    """tests/api/invalid_manifests.py, imported by path (the tests/ folder is not a package)."""
    spec = importlib.util.spec_from_file_location("kubeforge_invalid_manifests",
                                                  ROOT / "tests" / "api" / "invalid_manifests.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


table = _load_table()


# ---------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def api(api_client: Any) -> Any:
    """The session's API client (e2e/conftest.py), with the CRD applied (server-side apply) and Established."""
    ext = kubernetes.client.ApiextensionsV1Api(api_client)
    ext.patch_custom_resource_definition(crd.CRD_NAME, crd.crd(), field_manager=FIELD_MANAGER, force=True,
                                         _content_type="application/apply-patch+yaml")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        conditions = ext.read_custom_resource_definition(crd.CRD_NAME).status.conditions or []
        if any(c.type == "Established" and c.status == "True" for c in conditions):
            return api_client
        time.sleep(0.2)
    pytest.fail(f"CRD {crd.CRD_NAME} not Established within 30 s")


@pytest.fixture(scope="module")
def ns(api: Any) -> Iterator[str]:
    """One namespace for the whole module (dry runs and one real RLJob), deleted afterwards."""
    core = kubernetes.client.CoreV1Api(api)
    name = f"kf-crd-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": name}})
    yield name
    core.delete_namespace(name, propagation_policy="Background")


def _custom(api: Any) -> Any:
    return kubernetes.client.CustomObjectsApi(api)


def create(api: Any, ns: str, doc: dict[str, Any], *, dry_run: bool = True) -> dict[str, Any]:
    """Create an RLJob (server-side dry run by default, strict field validation): the stored object."""
    return _custom(api).create_namespaced_custom_object(
        contract.GROUP, contract.VERSION, ns, contract.PLURAL, doc, field_validation="Strict",
        **({"dry_run": "All"} if dry_run else {}))  # type: ignore[no-any-return]


def refusal(api: Any, ns: str, doc: dict[str, Any]) -> dict[str, Any]:
    """The API server's Status for a create it must refuse (fails the test when it accepts)."""
    try:
        create(api, ns, doc)
    except kubernetes.client.ApiException as exc:
        status: dict[str, Any] = json.loads(exc.body)
        assert exc.status in (400, 422), status
        return status
    pytest.fail("the API server accepted an invalid manifest")


def named_fields(status: dict[str, Any]) -> list[str]:
    """Fields the Status names; the note that CEL rules were skipped (field ``<nil>``) is not a problem."""
    causes = (status.get("details") or {}).get("causes") or []
    return [c.get("field", "") for c in causes if "validation rules were not checked" not in c.get("message", "")]


# ---------------------------------------------------------------- the shared table


def test_the_base_manifest_is_accepted(api: Any, ns: str) -> None:
    create(api, ns, table.valid())


@pytest.mark.parametrize("case", table.CASES, ids=lambda c: c.id)
def test_api_server_and_launcher_refuse_alike(api: Any, ns: str, case: Any) -> None:
    manifest = case.manifest()
    status = refusal(api, ns, manifest)
    message = status["message"]
    assert case.path in message, message
    assert case.message.lower() in message.lower(), message
    assert all(f.startswith(case.path) for f in named_fields(status)), status
    # the local launcher, same manifest: same field, same words
    with pytest.raises(load.InvalidRLJob) as info:
        load.parse(copy.deepcopy(manifest))
    assert any(p.startswith(case.path) and case.message.lower() in p.lower() for p in info.value.problems)


def test_the_table_has_at_least_thirty_cases() -> None:
    assert len(table.CASES) >= 30


# ---------------------------------------------------------------- examples


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_is_accepted_with_the_model_defaults(api: Any, ns: str, path: pathlib.Path) -> None:
    doc = yaml.safe_load(path.read_text())
    stored = create(api, ns, doc)
    assert table.compact(stored["spec"]) == table.compact(load.dump(load.parse(doc))["spec"])


# ---------------------------------------------------------------- immutability


@pytest.fixture(scope="module")
def running_job(api: Any, ns: str) -> str:
    """A real RLJob (no operator acts on it here) whose spec omits algorithm and roles: defaults fill them in."""
    doc = table.valid()
    doc["metadata"]["name"] = "immutable"
    del doc["spec"]["algorithm"], doc["spec"]["roles"]
    create(api, ns, doc, dry_run=False)
    return "immutable"


def patch(api: Any, ns: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
    return _custom(api).patch_namespaced_custom_object(  # type: ignore[no-any-return]
        contract.GROUP, contract.VERSION, ns, contract.PLURAL, name, body, dry_run="All",
        field_validation="Strict")


@pytest.mark.parametrize("body,path", [
    ({"spec": {"model": {"builtin": "smollm2-135m-instruct"}}}, "spec.model"),
    ({"spec": {"model": {"dtype": "bfloat16"}}}, "spec.model"),
    ({"spec": {"algorithm": {"steps": 11}}}, "spec.algorithm"),
    ({"spec": {"algorithm": {"loss": "DAPO"}}}, "spec.algorithm"),
    ({"spec": {"roles": {"trainer": {"replicas": 2}}}}, "spec.roles.trainer"),
], ids=["model-builtin", "model-dtype", "algorithm-steps", "algorithm-loss", "trainer-replicas"])
def test_immutable_fields_refuse_updates(api: Any, ns: str, running_job: str, body: dict[str, Any],
                                         path: str) -> None:
    with pytest.raises(kubernetes.client.ApiException) as info:
        patch(api, ns, running_job, body)
    message = json.loads(info.value.body)["message"]
    assert info.value.status == 422 and f"{path}:" in message and "is immutable" in message, message


@pytest.mark.parametrize("body", [
    {"spec": {"roles": {"generator": {"replicas": 3}}}},
    {"spec": {"roles": {"verifier": {"replicas": 2}}}},
    {"spec": {"roles": {"trainer": {"env": [{"name": "B", "value": "x"}]}}}},
    {"spec": {"suspend": True}},
], ids=["generator-replicas", "verifier-replicas", "trainer-env", "suspend"])
def test_mutable_fields_accept_updates(api: Any, ns: str, running_job: str, body: dict[str, Any]) -> None:
    stored = patch(api, ns, running_job, body)
    assert _subset(body["spec"], stored["spec"]), stored["spec"]


def _subset(want: Any, have: Any) -> bool:
    """Every key of ``want`` is in ``have`` with the same value (recursively for maps)."""
    if isinstance(want, dict):
        return isinstance(have, dict) and all(k in have and _subset(v, have[k]) for k, v in want.items())
    return bool(want == have)


def test_status_keeps_typed_fields_and_prunes_others(api: Any, ns: str, running_job: str) -> None:
    """The status subresource stores the typed status; anything else (kopf's bookkeeping) is pruned."""
    body = {"status": {"phase": "Running", "ready": "3/3", "progress": {"step": 2, "meanReward": 0.5},
                       "kopf": {"progress": {"x": 1}}}}
    stored = _custom(api).patch_namespaced_custom_object_status(
        contract.GROUP, contract.VERSION, ns, contract.PLURAL, running_job, body, dry_run="All")
    assert stored["status"]["phase"] == "Running" and stored["status"]["progress"]["meanReward"] == 0.5
    assert "kopf" not in stored["status"]


# ---------------------------------------------------------------- kubectl explain


def test_kubectl_explain_shows_descriptions(api: Any, kube_cluster: Any) -> None:
    kubectl = pathlib.Path(kube_cluster.bin_dir) / "kubectl"
    if not kubectl.is_file():
        pytest.skip(f"kubectl not built at {kubectl}")
    env = {**os.environ, "KUBECONFIG": kube_cluster.kubeconfig}
    deadline = time.monotonic() + 30
    while True:  # discovery and the published OpenAPI follow the CRD within seconds
        run = subprocess.run([str(kubectl), "explain", "rljob.spec.algorithm"], capture_output=True, text=True,
                             env=env, timeout=60)
        if run.returncode == 0 or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert run.returncode == 0, run.stderr
    text = " ".join(run.stdout.split())
    assert "GRPO and its variants" in text
    assert "Completions sampled per prompt (a GRPO group)." in text
    assert "groupSize" in text and "enum: GRPO, DrGRPO, DAPO" in text
