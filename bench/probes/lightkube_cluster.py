"""The A/B prototype of issue 38 item 5: ``apply.Cluster``'s verbs through lightkube (1.0) instead of urllib3.

Not product code (the project does not depend on lightkube; the decision and figures are in docs/operator.md,
"One Kubernetes client?"). ``lightkube_ab/sitecustomize.py`` puts it into the operator process of a bench run:

    uv venv /tmp/kf-kclient-venv --python 3.11
    uv pip install --python /tmp/kf-kclient-venv/bin/python -e '.[dev]' lightkube
    KF_OPERATOR_CLIENT=lightkube PYTHONPATH=bench/probes/lightkube_ab:bench/probes:api:operator:runtime \
        /tmp/kf-kclient-venv/bin/python bench/bench_operator.py --nodes 100 --jobs 100 --workers 32

Same seam as ``apply.Cluster`` (plain dicts in and out, ``apply.ApiError`` on refusals, the request counter),
the same requests on the wire (a DELETE's propagation policy goes as a query parameter instead of a body), every
kind as a lightkube generic resource (dict-backed: no typed-model decoding of pods or StatefulSets). Where
lightkube's public API has no parameter the reconcile needs (a LIST with ``resourceVersionMatch=NotOlderThan``, a
DELETE with a UID precondition) it goes through lightkube's private request builder and connection
(``Client._client``). Credentials: the server, CA, client certificate and the current token of ``apply``'s
credentials, fixed at start (lightkube's loader has no exec plugin of apiVersion v1, no certificate from a plugin,
no renewal before expiry: ``lightkube_auth_probe.py``).
"""
from __future__ import annotations

import json
import threading
from typing import Any

import httpx2
import lightkube
from lightkube import generic_resource
from lightkube.config.kubeconfig import KubeConfig
from lightkube.core import exceptions as lk_exc
from lightkube.types import CascadeType, PatchType

from kubeforge.api import contract
from kubeforge.operator import apply, metrics

Obj = dict[str, Any]
_LOCK = threading.Lock()
_RES: dict[tuple[str, str, bool], Any] = {}


def _resource(api_version: str, kind: str, plural: str, *, namespaced: bool = True) -> Any:
    key = (api_version, kind, namespaced)
    with _LOCK:
        res = _RES.get(key)
        if res is None:
            group, _, version = api_version.rpartition("/")
            make = generic_resource.create_namespaced_resource if namespaced else \
                generic_resource.create_global_resource
            res = _RES[key] = make(group, version, kind, plural)
        return res


def _kind(api_version: str, kind: str) -> Any:
    return _resource(api_version, kind, apply.KINDS[(api_version, kind)])


def _config(creds: apply.Credentials) -> KubeConfig:
    user: dict[str, Any] = {}
    auth = creds.auth()
    if auth is not None and auth.token:
        user["token"] = auth.token
    cert, key = (auth.cert_file, auth.key_file) if auth is not None else (creds.cert_file, creds.key_file)
    if cert:
        user.update({"client-certificate": cert, "client-key": key})
    cluster: dict[str, Any] = {"server": creds.server}
    if creds.ca_file:
        cluster["certificate-authority"] = creds.ca_file
    if not creds.verify:
        cluster["insecure-skip-tls-verify"] = True
    return KubeConfig.from_dict({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": cluster}], "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]})


class LightkubeCluster(apply.Cluster):
    """``apply.Cluster`` whose calls go through a ``lightkube.Client``."""

    def __init__(self, creds: apply.Credentials, *, pool_size: int = 16, timeout: float = 30.0) -> None:
        self._creds = creds
        self._server = creds.server
        self.lk = lightkube.Client(config=_config(creds),
                                   timeout=httpx2.Timeout(timeout), trust_env=False)

    # ---- plumbing ----
    @staticmethod
    def _count(verb: str, resource: str) -> None:
        metrics.API_REQUESTS.labels(verb, resource).inc()

    @staticmethod
    def _error(exc: lk_exc.ApiError, method: str, what: str) -> apply.ApiError:
        return apply.ApiError(exc.status.code or 0, method, what, exc.status.message or "")

    def request(self, method: str, path: str, *, body: Any = None, query: Any = None,
                content_type: str = "application/json") -> Obj | None:
        """Any other call, on lightkube's connection (the bench's POSTs; the calls lightkube has no verb for)."""
        self._count(*apply.verb_resource(method, path, content_type))
        http = self.lk._client._client
        headers = {"Accept": "application/json"}
        content = None
        if body is not None:
            headers["Content-Type"] = content_type
            content = json.dumps(body).encode()
        resp = http.request(method, path, params=dict(query or {}), content=content, headers=headers)
        if resp.status_code == 404 and method in ("GET", "DELETE"):
            return None
        if resp.status_code >= 300:
            raise apply.ApiError(resp.status_code, method, path, resp.text)
        return resp.json() if resp.content else {}

    def _get(self, res: Any, name: str, namespace: str | None, what: str) -> Obj | None:
        try:
            obj = self.lk.get(res, name, namespace=namespace) if namespace is not None else self.lk.get(res, name)
        except lk_exc.ApiError as exc:
            if exc.status.code == 404:
                return None
            raise self._error(exc, "GET", what) from None
        return dict(obj)

    # ---- verbs ----
    def get(self, api_version: str, kind: str, namespace: str, name: str) -> Obj | None:
        self._count("get", apply.KINDS[(api_version, kind)])
        return self._get(_kind(api_version, kind), name, namespace, f"{kind} {namespace}/{name}")

    def get_lease(self, namespace: str, name: str) -> Obj | None:
        return self.get("coordination.k8s.io/v1", "Lease", namespace, name)

    def get_rljob(self, namespace: str, name: str) -> Obj | None:
        return self.get(contract.API_VERSION, contract.KIND, namespace, name)

    def create_lease(self, lease: Obj) -> None:
        self._count("create", "leases")
        try:
            self.lk.create(_kind("coordination.k8s.io/v1", "Lease")(lease))
        except lk_exc.ApiError as exc:
            raise self._error(exc, "POST", "lease") from None

    def replace_lease(self, lease: Obj) -> None:
        self._count("update", "leases")
        try:
            self.lk.replace(_kind("coordination.k8s.io/v1", "Lease")(lease))
        except lk_exc.ApiError as exc:
            raise self._error(exc, "PUT", "lease") from None

    def list_pods_at(self, namespace: str, job: str, *, not_older_than: int = 0) -> tuple[list[Obj], int]:
        # lightkube's list() takes no resourceVersion: its request builder, with the parameters added
        self._count("list", "pods")
        params: dict[str, Any] = {"labelSelector": f"{contract.LABEL_JOB}={job}"}
        if not_older_than > 0:
            params.update(resourceVersion=str(not_older_than), resourceVersionMatch="NotOlderThan")
        br = self.lk._client.prepare_request("list", res=_kind("v1", "Pod"), namespace=namespace, params=params)
        try:
            it = self.lk._client.list(br)
            items = [dict(p) for p in it]
        except lk_exc.ApiError as exc:
            raise self._error(exc, "GET", f"pods {namespace}") from None
        try:
            rv = int(it.resourceVersion or 0)
        except ValueError:
            rv = 0
        return items, rv

    def list_of_job(self, api_version: str, kind: str, namespace: str, job: str) -> list[Obj]:
        self._count("list", apply.KINDS[(api_version, kind)])
        try:
            return [dict(o) for o in self.lk.list(_kind(api_version, kind), namespace=namespace,
                                                  labels={contract.LABEL_JOB: job})]
        except lk_exc.ApiError as exc:
            raise self._error(exc, "GET", f"{kind} {namespace}") from None

    def get_kueue(self, plural: str, name: str) -> Obj | None:
        self._count("get", plural)
        kind = {"resourceflavors": "ResourceFlavor", "workloadpriorityclasses": "WorkloadPriorityClass",
                "clusterqueues": "ClusterQueue"}.get(plural, plural)
        res = _resource("kueue.x-k8s.io/v1beta2", kind, plural, namespaced=False)
        return self._get(res, name, None, f"{plural}/{name}")

    def _merge_status(self, res: Any, namespace: str, name: str, patch: Obj, resource: str) -> Obj | None:
        self._count("patch", resource + "/status")
        try:
            return dict(self.lk.patch(res.Status, name, patch, namespace=namespace, patch_type=PatchType.MERGE))
        except lk_exc.ApiError as exc:
            raise self._error(exc, "PATCH", f"{resource}/status {namespace}/{name}") from None

    def patch_object_status(self, obj: Obj, patch: Obj) -> Obj | None:
        md = obj["metadata"]
        return self._merge_status(_kind(obj["apiVersion"], obj["kind"]), md["namespace"], md["name"], patch,
                                  apply.KINDS[(obj["apiVersion"], obj["kind"])])

    def patch_status(self, namespace: str, name: str, status: Obj) -> Obj | None:
        return self._merge_status(_kind(contract.API_VERSION, contract.KIND), namespace, name, {"status": status},
                                  contract.PLURAL)

    def apply(self, obj: Obj) -> Obj | None:
        self._count("apply", apply.KINDS[(obj["apiVersion"], obj["kind"])])
        try:
            return dict(self.lk.apply(_kind(obj["apiVersion"], obj["kind"])(obj),
                                      field_manager=contract.FIELD_MANAGER, force=True))
        except lk_exc.ApiError as exc:
            raise self._error(exc, "PATCH", f"{obj['kind']} {obj['metadata']['name']}") from None

    def delete(self, obj: Obj, *, propagation: str = "Background") -> None:
        md = obj["metadata"]
        self._count("delete", apply.KINDS[(obj["apiVersion"], obj["kind"])])
        try:
            self.lk.delete(_kind(obj["apiVersion"], obj["kind"]), md["name"], namespace=md["namespace"],
                           cascade=CascadeType(propagation))
        except lk_exc.ApiError as exc:
            if exc.status.code != 404:
                raise self._error(exc, "DELETE", f"{obj['kind']} {md['name']}") from None

    def delete_rljob(self, namespace: str, name: str) -> None:
        self.delete({"apiVersion": contract.API_VERSION, "kind": contract.KIND,
                     "metadata": {"namespace": namespace, "name": name}})

    def get_node(self, name: str) -> Obj | None:
        self._count("get", "nodes")
        return self._get(_resource("v1", "Node", "nodes", namespaced=False), name, None, f"node {name}")

    # force_delete_pod: lightkube's delete() has no preconditions: the inherited raw call (``request``)

    def patch_pod(self, namespace: str, name: str, patch: Obj) -> None:
        self._count("patch", "pods")
        try:
            self.lk.patch(_kind("v1", "Pod"), name, patch, namespace=namespace, patch_type=PatchType.MERGE)
        except lk_exc.ApiError as exc:
            if exc.status.code != 404:
                raise self._error(exc, "PATCH", f"pod {namespace}/{name}") from None

    def create_if_absent(self, obj: Obj) -> bool:
        self._count("create", apply.KINDS[(obj["apiVersion"], obj["kind"])])
        try:
            self.lk.create(_kind(obj["apiVersion"], obj["kind"])(obj), field_manager=contract.FIELD_MANAGER)
        except lk_exc.ApiError as exc:
            if exc.status.code == 409:
                return False
            raise self._error(exc, "POST", f"{obj['kind']} {obj['metadata']['name']}") from None
        return True

    def delete_webhook_configuration(self, name: str) -> None:
        self._count("delete", "validatingwebhookconfigurations")
        res = _resource("admissionregistration.k8s.io/v1", "ValidatingWebhookConfiguration",
                        "validatingwebhookconfigurations", namespaced=False)
        try:
            self.lk.delete(res, name)
        except lk_exc.ApiError as exc:
            if exc.status.code != 404:
                raise self._error(exc, "DELETE", name) from None

    def post_event(self, job: Obj, *, type: str, reason: str, message: str, now: str) -> None:
        md = job["metadata"]
        event = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"generateName": f"{md['name']}.", "namespace": md["namespace"]},
            "involvedObject": {"apiVersion": contract.API_VERSION, "kind": contract.KIND, "name": md["name"],
                               "namespace": md["namespace"], "uid": md.get("uid")},
            "type": type, "reason": reason, "message": message[:1024],
            "firstTimestamp": now, "lastTimestamp": now, "count": 1,
            "source": {"component": contract.FIELD_MANAGER}, "reportingComponent": contract.FIELD_MANAGER,
        }
        self._count("create", "events")
        try:
            self.lk.create(_kind("v1", "Event")(event))
        except lk_exc.ApiError as exc:
            raise self._error(exc, "POST", "event") from None
