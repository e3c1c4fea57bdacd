"""The only module that talks to the Kubernetes API: raw REST over one pooled HTTPS connection set.

Role: the "apply" and "write" steps. Server-side apply (field manager ``contract.FIELD_MANAGER``, force) for every
desired child; deletes (404 is success) for objects that must be absent; one merge patch of ``/status``; events.
Why raw REST: the API needs a handful of verbs on known paths; a static kind → path table avoids discovery round
trips; credentials come from ``kubeconfig`` (no Kubernetes client library in the process), asked for on every
request (a rotated token file, an exec plugin's renewed token or certificate), and once more after a 401.
Concurrency: the client is synchronous and thread-safe (urllib3 pool); the router calls it from worker threads.
"""
from __future__ import annotations

import json
import ssl
import threading
import urllib.parse
from collections.abc import Mapping
from typing import Any

import urllib3

from kubeforge.api import contract
from kubeforge.operator import kubeconfig, metrics

Obj = dict[str, Any]

#: kind → (API path prefix, plural): every kind the operator reads or writes.
KINDS: dict[tuple[str, str], str] = {
    ("v1", "ConfigMap"): "configmaps", ("v1", "Service"): "services", ("v1", "ServiceAccount"): "serviceaccounts",
    ("v1", "Pod"): "pods", ("v1", "Event"): "events", ("v1", "Secret"): "secrets",
    ("apps/v1", "StatefulSet"): "statefulsets",
    ("coordination.k8s.io/v1", "Lease"): "leases",
    ("networking.k8s.io/v1", "NetworkPolicy"): "networkpolicies",
    ("rbac.authorization.k8s.io/v1", "Role"): "roles", ("rbac.authorization.k8s.io/v1", "RoleBinding"): "rolebindings",
    ("scheduling.x-k8s.io/v1alpha1", "PodGroup"): "podgroups",
    ("scheduling.volcano.sh/v1beta1", "PodGroup"): "podgroups",
    ("scheduling.run.ai/v2alpha2", "PodGroup"): "podgroups",
    (contract.API_VERSION, contract.KIND): contract.PLURAL,
    (contract.API_VERSION, contract.POOL_KIND): contract.POOL_PLURAL,
    ("kueue.x-k8s.io/v1beta2", "Workload"): "workloads",
}
KUEUE = "/apis/kueue.x-k8s.io/v1beta2"      # cluster-scoped Kueue objects the operator reads


def verb_resource(method: str, path: str, content_type: str = "application/json") -> tuple[str, str]:
    """The Kubernetes verb and resource (``plural[/subresource]``) of a REST call, for the request counter."""
    parts = path.split("?", 1)[0].strip("/").split("/")
    rest = parts[2:] if parts[:1] == ["api"] else parts[3:]
    if rest[:1] == ["namespaces"] and len(rest) >= 3:
        rest = rest[2:]
    if not rest:
        return "discover", ""   # API discovery (/apis/<group>/<version>): no resource, no RBAC rule
    resource = rest[0]
    if len(rest) > 2:
        resource += "/" + rest[2]
    verb = {"GET": "get" if len(rest) > 1 else "list", "POST": "create", "PUT": "update", "DELETE": "delete",
            "PATCH": "apply" if content_type == "application/apply-patch+yaml" else "patch"}.get(method, method)
    return verb, resource


#: The namespace of the kubelets' Leases (their heartbeats: docs/recovery.md).
NODE_LEASES = "kube-node-lease"


class ApiError(RuntimeError):
    """A non-2xx answer from the API server."""

    def __init__(self, status: int, method: str, path: str, body: str) -> None:
        self.status = status
        super().__init__(f"{method} {path}: HTTP {status}: {body[:500]}")


Credentials = kubeconfig.Credentials


def load_credentials(path: str | None = None) -> Credentials:
    """Credentials from ``path`` (or $KUBECONFIG / ~/.kube/config), else the in-cluster service account."""
    return kubeconfig.load(path)


def tls_context(creds: Credentials, auth: kubeconfig.Auth | None = None) -> ssl.SSLContext:
    """One TLS context for every connection of a pool: the CA and client certificate are loaded once, not per
    connection (urllib3 builds a context per connection unless it is given one). The client certificate is
    ``auth``'s when given (an exec plugin's), else the kubeconfig's."""
    if creds.verify:     # the kubeconfig's CA, else the system's
        ctx = ssl.create_default_context(cafile=creds.ca_file)
    else:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    cert, key = (auth.cert_file, auth.key_file) if auth is not None else (creds.cert_file, creds.key_file)
    if cert:
        ctx.load_cert_chain(cert, key)
    return ctx


def path_of(api_version: str, kind: str, namespace: str, name: str | None = None) -> str:
    """REST path of a namespaced object (or of its collection when ``name`` is None)."""
    plural = KINDS[(api_version, kind)]
    base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    out = f"{base}/namespaces/{namespace}/{plural}"
    return f"{out}/{name}" if name else out


class Cluster:
    """Typed verbs on the API server (everything the reconcile needs, nothing more)."""

    def __init__(self, creds: Credentials, *, pool_size: int = 16, timeout: float = 30.0) -> None:
        self._server = creds.server
        self._creds = creds
        self._kw: dict[str, Any] = {"maxsize": pool_size, "timeout": urllib3.Timeout(total=timeout), "retries": False}
        self._tls = self._server.startswith("https")
        if self._tls and not creds.verify:
            urllib3.disable_warnings()
        self._lock = threading.Lock()
        self._pool_cert: tuple[str | None, str | None] = (None, None)
        self._pool: urllib3.PoolManager | None = None
        self._session()

    # ---- transport ----
    def _session(self, rejected: kubeconfig.Auth | None = None) -> tuple[kubeconfig.Auth | None, urllib3.PoolManager]:
        """The credentials to present now (after a 401 to ``rejected``: fresh ones, None when there are none) and
        the pool for their client certificate. The pool is replaced when an exec plugin hands out another
        certificate (the old one's connections close as they come back); under the lock, so concurrent callers
        never swap an older certificate back in."""
        with self._lock:
            auth = self._creds.auth() if rejected is None else self._creds.reauth(rejected)
            cert = (auth.cert_file, auth.key_file) if auth is not None and self._tls else self._pool_cert
            if self._pool is None or cert != self._pool_cert:
                kw = dict(self._kw)
                if self._tls:     # urllib3 takes cert_reqs from the context's verify_mode
                    kw["ssl_context"] = tls_context(self._creds, auth)
                old, self._pool, self._pool_cert = self._pool, urllib3.PoolManager(**kw), cert
                if old is not None:
                    old.clear()
            return auth, self._pool

    @staticmethod
    def _authorised(headers: Mapping[str, str], auth: kubeconfig.Auth | None) -> dict[str, str]:
        out = {"Accept": "application/json", **headers}
        if auth is not None and auth.token:
            out["Authorization"] = f"Bearer {auth.token}"
        return out

    @property
    def _http(self) -> urllib3.PoolManager:
        """The current pool (``bench_operator`` streams a watch through it with ``_headers``)."""
        return self._session()[1]

    @property
    def _headers(self) -> dict[str, str]:
        """Accept and the current Authorization header."""
        return self._authorised({}, self._session()[0])

    def served_resources(self, api_version: str) -> list[str]:
        """The resource names the API server serves under ``api_version`` (``<group>/<version>``; API discovery,
        which needs no RBAC rule); [] when it serves no such version."""
        found = self.request("GET", f"/apis/{api_version}")
        return [str(r.get("name")) for r in (found or {}).get("resources", [])]

    def request(self, method: str, path: str, *, body: Any = None, query: Mapping[str, str] | None = None,
                content_type: str = "application/json") -> Obj | None:
        """One call; returns the decoded body, None on 404 for GET/DELETE; raises ApiError otherwise. A 401 is
        tried once more with fresh credentials when there are any (exec plugin run again, token file re-read)."""
        url = self._server + path + ("?" + urllib.parse.urlencode(query) if query else "")
        headers: dict[str, str] = {}
        data = None
        if body is not None:
            headers["Content-Type"] = content_type
            data = json.dumps(body).encode()
        labels = verb_resource(method, path, content_type)
        metrics.API_REQUESTS.labels(*labels).inc()
        auth, http = self._session()
        resp = http.request(method, url, body=data, headers=self._authorised(headers, auth))
        note = ""
        if resp.status == 401 and auth is not None:
            fresh, http = self._session(rejected=auth)
            if fresh is not None:
                metrics.API_REQUESTS.labels(*labels).inc()
                resp = http.request(method, url, body=data, headers=self._authorised(headers, fresh))
                note = f"fresh credentials from {self._creds.origin} refused too: "
            elif self._creds.plugin is not None or self._creds.token_file is not None:
                note = f"{self._creds.origin} gave no other credentials: "
        text = resp.data.decode("utf-8", "replace")
        if resp.status == 404 and method in ("GET", "DELETE"):
            return None
        if resp.status >= 300:
            raise ApiError(resp.status, method, path, (note if resp.status == 401 else "") + text)
        return json.loads(text) if text else {}

    # ---- verbs ----
    def get_lease(self, namespace: str, name: str) -> Obj | None:
        return self.request("GET", path_of("coordination.k8s.io/v1", "Lease", namespace, name))

    def create_lease(self, lease: Obj) -> None:
        self.request("POST", path_of("coordination.k8s.io/v1", "Lease", lease["metadata"]["namespace"]), body=lease)

    def replace_lease(self, lease: Obj) -> None:
        """PUT with the resourceVersion the caller read: a concurrent writer makes it fail (409)."""
        md = lease["metadata"]
        self.request("PUT", path_of("coordination.k8s.io/v1", "Lease", md["namespace"], md["name"]), body=lease)

    def get_rljob(self, namespace: str, name: str) -> Obj | None:
        return self.request("GET", path_of(contract.API_VERSION, contract.KIND, namespace, name))

    def list_rljobs(self, namespace: str) -> list[Obj]:
        """Every RLJob of a namespace (a GeneratorPool's pass finds the jobs attached to it: ``poolreconcile``)."""
        out = self.request("GET", path_of(contract.API_VERSION, contract.KIND, namespace)) or {}
        return list(out.get("items", []))

    def patch_object(self, obj: Obj, patch: Obj) -> Obj | None:
        """Merge-patch an object (a GeneratorPool's finalizers: ``poolreconcile``); a ``metadata.resourceVersion``
        in the patch makes a concurrent writer's change fail it (409) instead of being overwritten."""
        md = obj["metadata"]
        return self.request("PATCH", path_of(obj["apiVersion"], obj["kind"], md["namespace"], md["name"]),
                            body=patch, content_type="application/merge-patch+json")

    def list_pods(self, namespace: str, job: str) -> list[Obj]:
        return self.list_pods_at(namespace, job)[0]

    def list_pods_at(self, namespace: str, job: str, *, not_older_than: int = 0) -> tuple[list[Obj], int]:
        """The job's pods and the list's resourceVersion (0 when the server sent none). With ``not_older_than``
        (a resourceVersion this process has already seen) the API server may answer from its watch cache with any
        state at least that new; without it the LIST is a consistent read, which on a loaded server waits for
        its cache to catch up with etcd or reads the whole namespace's pods from etcd (measured at 10,000 pods:
        ~2 s per LIST, and 30 s timeouts under load)."""
        query = {"labelSelector": f"{contract.LABEL_JOB}={job}"}
        if not_older_than > 0:
            query.update(resourceVersion=str(not_older_than), resourceVersionMatch="NotOlderThan")
        out = self.request("GET", path_of("v1", "Pod", namespace), query=query) or {}
        try:
            rv = int(out.get("metadata", {}).get("resourceVersion") or 0)
        except ValueError:
            rv = 0
        return list(out.get("items", [])), rv

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> Obj | None:
        """A namespaced object of a kind in ``KINDS`` (None: absent)."""
        return self.request("GET", path_of(api_version, kind, namespace, name))

    def list_of_job(self, api_version: str, kind: str, namespace: str, job: str) -> list[Obj]:
        """The objects of a kind in ``KINDS`` labelled with the job (the grow Workloads: ``queueing.growth``)."""
        out = self.request("GET", path_of(api_version, kind, namespace),
                           query={"labelSelector": f"{contract.LABEL_JOB}={job}"}) or {}
        return list(out.get("items", []))

    def get_kueue(self, plural: str, name: str) -> Obj | None:
        """A cluster-scoped Kueue object (``resourceflavors``, ``workloadpriorityclasses``); None: absent."""
        return self.request("GET", f"{KUEUE}/{plural}/{name}")

    def patch_object_status(self, obj: Obj, patch: Obj) -> Obj | None:
        """Merge-patch another object's status subresource (a Workload's: ``queueing``); a ``resourceVersion`` in
        the patch makes a concurrent writer's change fail it (409) instead of being overwritten."""
        md = obj["metadata"]
        return self.request("PATCH", path_of(obj["apiVersion"], obj["kind"], md["namespace"], md["name"]) + "/status",
                            body=patch, content_type="application/merge-patch+json")

    def apply(self, obj: Obj) -> Obj | None:
        """Server-side apply of ``obj`` (force: the operator owns every field it renders)."""
        md = obj["metadata"]
        return self.request(
            "PATCH", path_of(obj["apiVersion"], obj["kind"], md["namespace"], md["name"]), body=obj,
            query={"fieldManager": contract.FIELD_MANAGER, "force": "true"},
            content_type="application/apply-patch+yaml")

    def delete(self, obj: Obj, *, propagation: str = "Background") -> None:
        """Delete ``obj`` if it exists."""
        md = obj["metadata"]
        self.request("DELETE", path_of(obj["apiVersion"], obj["kind"], md["namespace"], md["name"]),
                     body={"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": propagation})

    def get_node(self, name: str) -> Obj | None:
        """A Node (None: absent); read only for the nodes of a job's pods that are not ready (``nodeloss``)."""
        return self.request("GET", f"/api/v1/nodes/{name}")

    def get_node_lease(self, name: str) -> Obj | None:
        """A node's kubelet Lease in ``kube-node-lease`` (None: absent); read only for the node of a generator trainer
        0 reports silent, or of the last NodeLost failure (``peersilence``)."""
        return self.request("GET", f"/apis/coordination.k8s.io/v1/namespaces/{NODE_LEASES}/leases/{name}")

    def force_delete_pod(self, namespace: str, name: str, uid: str) -> None:
        """Delete a pod at once (grace period 0: the API server forgets it without its kubelet's word), only if it
        is still the pod of that UID; gone already (404) or re-created meanwhile (409) is fine."""
        body: Obj = {"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 0}
        if uid:
            body["preconditions"] = {"uid": uid}
        try:
            self.request("DELETE", path_of("v1", "Pod", namespace, name), body=body)
        except ApiError as exc:
            if exc.status not in (404, 409):
                raise

    def patch_status(self, namespace: str, name: str, status: Obj) -> Obj | None:
        """Merge-patch the RLJob's status subresource (null deletes a field); returns the updated RLJob."""
        return self.request("PATCH", path_of(contract.API_VERSION, contract.KIND, namespace, name) + "/status",
                     body={"status": status}, content_type="application/merge-patch+json")

    def patch_pod(self, namespace: str, name: str, patch: Obj) -> None:
        """Merge-patch a pod (the export request relay: ``exports.Relay``); a pod gone meanwhile is fine."""
        try:
            self.request("PATCH", path_of("v1", "Pod", namespace, name), body=patch,
                         content_type="application/merge-patch+json")
        except ApiError as exc:
            if exc.status != 404:
                raise

    def create_if_absent(self, obj: Obj) -> bool:
        """Create ``obj`` unless an object of that name exists (409 is fine); True when this call created it."""
        md = obj["metadata"]
        try:
            self.request("POST", path_of(obj["apiVersion"], obj["kind"], md["namespace"]), body=obj,
                         query={"fieldManager": contract.FIELD_MANAGER})
        except ApiError as exc:
            if exc.status == 409:
                return False
            raise
        return True

    def delete_webhook_configuration(self, name: str) -> None:
        """Delete a ValidatingWebhookConfiguration (gone already is fine)."""
        self.request("DELETE", f"/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/{name}")

    def delete_rljob(self, namespace: str, name: str) -> None:
        self.request("DELETE", path_of(contract.API_VERSION, contract.KIND, namespace, name),
                     body={"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background"})

    def post_event(self, job: Obj, *, type: str, reason: str, message: str, now: str) -> None:
        """A core/v1 Event about the RLJob."""
        md = job["metadata"]
        ns = md["namespace"]
        event = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"generateName": f"{md['name']}.", "namespace": ns},
            "involvedObject": {"apiVersion": contract.API_VERSION, "kind": contract.KIND, "name": md["name"],
                               "namespace": ns, "uid": md.get("uid")},
            "type": type, "reason": reason, "message": message[:1024],
            "firstTimestamp": now, "lastTimestamp": now, "count": 1,
            "source": {"component": contract.FIELD_MANAGER}, "reportingComponent": contract.FIELD_MANAGER,
        }
        self.request("POST", path_of("v1", "Event", ns), body=event)
