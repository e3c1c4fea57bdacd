"""This pod's own object on the API server, with the pod's service account: the two calls the runtime makes on a
cluster (trainer 0 patches its progress annotation every step and reads its export-request annotation).

Role: ``trainer.report.PodAnnotationReporter`` and ``trainer.export_requests.PodAnnotationRequests`` talk to a
:class:`Pod` (two methods); :class:`InClusterPod` is the real one. It uses the standard library only (``urllib`` over
one TLS context), so neither the runtime nor the operator image carries a Kubernetes client library.

In-cluster credentials, as every pod gets them: the API server at ``KUBERNETES_SERVICE_HOST`` /
``KUBERNETES_SERVICE_PORT``, the CA and the bearer token in ``/var/run/secrets/kubernetes.io/serviceaccount``. The
token file is read at every call: the kubelet rotates projected tokens in place.

Invariants: every call is bounded (``timeout``); any failure (no credentials, refused, a non-2xx answer, a body
that is not a pod) raises :class:`PodAPIError` naming what failed, and callers decide (progress is advisory).
"""
from __future__ import annotations

import dataclasses
import json
import os
import ssl
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
ENV_HOST, ENV_PORT = "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"
MERGE_PATCH = "application/merge-patch+json"


class PodAPIError(RuntimeError):
    """A call about this pod failed (the message says which and why)."""


class Pod(Protocol):
    def annotations(self) -> dict[str, str]:
        """The pod's annotations now."""

    def patch_annotations(self, annotations: Mapping[str, str]) -> None:
        """Set these annotations on the pod (the others stay)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class InCluster:
    """Where the API server is and how this pod proves who it is."""

    server: str          # https://host:port
    token_file: Path
    ca_file: Path

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ, *,
                 account_dir: Path = SERVICE_ACCOUNT_DIR) -> InCluster:
        host, port = env.get(ENV_HOST, ""), env.get(ENV_PORT, "")
        if not host or not port:
            raise PodAPIError(f"not in a pod: {ENV_HOST} and {ENV_PORT} must be set")
        for name in ("token", "ca.crt"):
            if not (account_dir / name).is_file():
                raise PodAPIError(f"no service account {name} in {account_dir} (automountServiceAccountToken off?)")
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"   # an IPv6 address
        return cls(server=f"https://{host}:{port}", token_file=account_dir / "token",
                   ca_file=account_dir / "ca.crt")


class InClusterPod:
    """:class:`Pod` for ``namespace/pod`` through the API server, with the pod's service account."""

    def __init__(self, *, pod: str, namespace: str, cluster: InCluster | None = None, timeout: float = 10.0) -> None:
        self.pod, self.namespace, self.timeout = pod, namespace, timeout
        self.cluster = cluster or InCluster.from_env()
        self._tls = ssl.create_default_context(cafile=str(self.cluster.ca_file))
        self.url = (f"{self.cluster.server}/api/v1/namespaces/{urllib.parse.quote(namespace, safe='')}"
                    f"/pods/{urllib.parse.quote(pod, safe='')}")

    def annotations(self) -> dict[str, str]:
        doc = self._call("GET", None, None)
        meta = doc.get("metadata")
        if not isinstance(meta, dict) or meta.get("name") != self.pod:
            raise PodAPIError(f"GET pod {self.namespace}/{self.pod}: the answer is not that pod")
        found = meta.get("annotations") or {}
        return {str(k): str(v) for k, v in found.items()} if isinstance(found, dict) else {}

    def patch_annotations(self, annotations: Mapping[str, str]) -> None:
        body = json.dumps({"metadata": {"annotations": dict(annotations)}}).encode()
        self._call("PATCH", body, MERGE_PATCH)

    def _call(self, method: str, body: bytes | None, content_type: str | None) -> dict[str, Any]:
        what = f"{method} pod {self.namespace}/{self.pod}"
        try:
            token = self.cluster.token_file.read_text().strip()
        except OSError as exc:
            raise PodAPIError(f"{what}: cannot read the service account token: {exc}") from exc
        headers = {"Authorization": f"Bearer {token}", "Accept": "application/json"}
        if content_type is not None:
            headers["Content-Type"] = content_type
        req = urllib.request.Request(self.url, data=body, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout, context=self._tls) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read(2000).decode(errors="replace")
            raise PodAPIError(f"{what}: HTTP {exc.code}: {_message(detail)}") from exc
        except (urllib.error.URLError, OSError) as exc:
            raise PodAPIError(f"{what}: {getattr(exc, 'reason', exc)}") from exc
        try:
            doc = json.loads(raw)
        except ValueError as exc:
            raise PodAPIError(f"{what}: the answer is not JSON") from exc
        if not isinstance(doc, dict):
            raise PodAPIError(f"{what}: the answer is not an object")
        return doc


def _message(detail: str) -> str:
    """The API server's Status message, else the body's start."""
    try:
        doc = json.loads(detail)
        return str(doc.get("message") or detail[:300])
    except (ValueError, AttributeError):
        return detail[:300]
