"""The runtime's own pod calls (runtime/podapi.py) against a real HTTPS server playing the API server: in-cluster
credentials from the env and the service-account folder, the token re-read at every call, the merge patch of the
annotations, errors named, the server verified with the account's CA, every call bounded. The real-node suite
(e2e/test_e2e_real.py) runs the same calls in a pod against the real API server."""
from __future__ import annotations

import http.server
import json
import pathlib
import shutil
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from kubeforge.operator import webhook
from kubeforge.runtime import podapi


class FakeAPIServer:
    """Answers GET/PATCH of pods/<name> in namespace ``ns``; records every request."""

    def __init__(self, pki: tuple[pathlib.Path, pathlib.Path]) -> None:
        self.requests: list[dict[str, Any]] = []
        self.annotations: dict[str, str] = {"kept": "yes"}
        self.status = 200
        self.delay = 0.0
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _answer(self) -> None:
                size = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(size) if size else b""
                outer.requests.append({"method": self.command, "path": self.path,
                                       "auth": self.headers.get("Authorization"),
                                       "type": self.headers.get("Content-Type"), "body": body})
                time.sleep(outer.delay)
                if outer.status != 200:
                    doc: dict[str, Any] = {"kind": "Status", "message": f"pods is forbidden ({outer.status})"}
                else:
                    if self.command == "PATCH":
                        outer.annotations.update(json.loads(body)["metadata"]["annotations"])
                    name = self.path.rsplit("/", 1)[-1]
                    doc = {"kind": "Pod", "metadata": {"name": name, "annotations": dict(outer.annotations)}}
                raw = json.dumps(doc).encode()
                self.send_response(outer.status)
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            do_GET = do_PATCH = _answer   # noqa: N815 - http.server's names

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(*pki)
        self.server.socket = ctx.wrap_socket(self.server.socket, server_side=True)
        self.port = int(self.server.server_address[1])
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> tuple[pathlib.Path, pathlib.Path]:
    return webhook.self_signed("127.0.0.1", tmp_path_factory.mktemp("pki"))


@pytest.fixture()
def apiserver(pki: tuple[pathlib.Path, pathlib.Path]) -> Iterator[FakeAPIServer]:
    s = FakeAPIServer(pki)
    yield s
    s.close()


@pytest.fixture()
def account(tmp_path: pathlib.Path, pki: tuple[pathlib.Path, pathlib.Path]) -> pathlib.Path:
    d = tmp_path / "serviceaccount"
    d.mkdir()
    (d / "token").write_text("tok-1\n")
    shutil.copy(pki[0], d / "ca.crt")
    return d


def pod(apiserver: FakeAPIServer, account: pathlib.Path, **kw: Any) -> podapi.InClusterPod:
    env = {podapi.ENV_HOST: "127.0.0.1", podapi.ENV_PORT: str(apiserver.port)}
    cluster = podapi.InCluster.from_env(env, account_dir=account)
    return podapi.InClusterPod(pod="job-trainer-0", namespace="ns", cluster=cluster, **kw)


def test_reads_and_merge_patches_its_own_annotations(apiserver: FakeAPIServer, account: pathlib.Path) -> None:
    p = pod(apiserver, account)
    assert p.annotations() == {"kept": "yes"}
    p.patch_annotations({"kubeforge.dev/progress": '{"step":1}'})
    assert p.annotations() == {"kept": "yes", "kubeforge.dev/progress": '{"step":1}'}
    get, patch = apiserver.requests[0], apiserver.requests[1]
    assert get["method"] == "GET" and get["path"] == "/api/v1/namespaces/ns/pods/job-trainer-0"
    assert patch["method"] == "PATCH" and patch["type"] == podapi.MERGE_PATCH
    assert json.loads(patch["body"]) == {"metadata": {"annotations": {"kubeforge.dev/progress": '{"step":1}'}}}
    assert {r["auth"] for r in apiserver.requests} == {"Bearer tok-1"}


def test_the_token_is_read_at_every_call(apiserver: FakeAPIServer, account: pathlib.Path) -> None:
    p = pod(apiserver, account)
    p.annotations()
    (account / "token").write_text("tok-2")          # the kubelet rotated the projected token
    p.patch_annotations({"a": "b"})
    assert [r["auth"] for r in apiserver.requests] == ["Bearer tok-1", "Bearer tok-2"]


def test_a_refusal_names_the_call_and_the_servers_message(apiserver: FakeAPIServer, account: pathlib.Path) -> None:
    apiserver.status = 403
    with pytest.raises(podapi.PodAPIError, match=r"PATCH pod ns/job-trainer-0: HTTP 403: pods is forbidden"):
        pod(apiserver, account).patch_annotations({"a": "b"})


def test_the_server_must_hold_a_certificate_of_the_accounts_ca(apiserver: FakeAPIServer, account: pathlib.Path,
                                                                tmp_path: pathlib.Path) -> None:
    other, _ = webhook.self_signed("127.0.0.1", tmp_path)      # a CA that did not sign the server's certificate
    shutil.copy(other, account / "ca.crt")
    with pytest.raises(podapi.PodAPIError, match="CERTIFICATE_VERIFY_FAILED"):
        pod(apiserver, account).annotations()
    assert apiserver.requests == []


def test_every_call_is_bounded(apiserver: FakeAPIServer, account: pathlib.Path) -> None:
    apiserver.delay = 3.0
    started = time.monotonic()
    with pytest.raises(podapi.PodAPIError, match="GET pod ns/job-trainer-0"):
        pod(apiserver, account, timeout=0.5).annotations()
    assert time.monotonic() - started < 2.5


def test_outside_a_pod_the_missing_credential_is_named(tmp_path: pathlib.Path, account: pathlib.Path) -> None:
    with pytest.raises(podapi.PodAPIError, match="KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT"):
        podapi.InCluster.from_env({}, account_dir=account)
    (account / "token").unlink()
    with pytest.raises(podapi.PodAPIError, match="no service account token"):
        podapi.InCluster.from_env({podapi.ENV_HOST: "10.0.0.1", podapi.ENV_PORT: "443"}, account_dir=account)


def test_an_ipv6_service_host_is_bracketed(account: pathlib.Path) -> None:
    c = podapi.InCluster.from_env({podapi.ENV_HOST: "fd00::1", podapi.ENV_PORT: "443"}, account_dir=account)
    assert c.server == "https://[fd00::1]:443"


def test_the_runtimes_pod_calls_never_import_a_kubernetes_client() -> None:
    code = ("import sys; from kubeforge.runtime.trainer import export_requests as exports, report; "
            "report.PodAnnotationReporter(pod='p', namespace='n'); exports.PodAnnotationRequests(pod='p', namespace='n')"
            "; assert 'kubernetes' not in sys.modules, 'kubernetes imported'")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
