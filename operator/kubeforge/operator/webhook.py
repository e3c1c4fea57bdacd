"""Serving the admission webhook: kopf's HTTPS server, with a certificate made here or mounted from the cluster.

Two ways to run (``main`` chooses from the flags):
- **Self-registered** (``kubeforge operator`` outside the cluster: development and the e2e harness): a self-signed
  certificate for ``--webhook-host`` (default 127.0.0.1, where a local API server reaches the host) is made in
  memory and written to a private temp dir for the TLS server; kopf serves on ``--webhook-port`` (0: a free port)
  and manages the ``ValidatingWebhookConfiguration`` ``MANAGED_NAME`` (URL + the certificate as ``caBundle``). It
  is deleted again when the operator exits cleanly.
- **In-cluster** (Helm): ``--webhook-cert-dir`` holds ``tls.crt``/``tls.key`` (a Secret made by the chart); the chart
  owns the configuration and its Service; the operator only serves, with its own HTTPS server
  (``AdmissionServer``), started before leader election: every replica answers, the standbys too, so the Service
  may route a review to any of them (the review is a pure function of the object). The certificate is re-read when
  its file changes (the kubelet updates a mounted Secret in place).

Neighbours: ``handlers`` registers the kopf validation handler and applies :func:`configure` to kopf's settings;
``admission`` decides.
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import http.server
import ipaddress
import json
import logging
import os
import pathlib
import socket
import ssl
import tempfile
import threading
from collections.abc import Callable
from typing import Any

import kopf

from kubeforge.operator import admission, metrics

log = logging.getLogger("kubeforge.operator.webhook")

MANAGED_NAME = "kubeforge.dev"
HANDLER_ID = "validate.rljobs"
CERT_DAYS = 365
PATH = f"/{HANDLER_ID}"
MAX_BODY = 8 * 2**20          # an AdmissionReview carries the object and the old one (each at most ~1.5 MiB)
TIMEOUT_S = 10.0              # per connection: the API server's own timeout is at most 30 s


@dataclasses.dataclass(frozen=True, kw_only=True)
class Webhook:
    """How the webhook is served: bind address and port, the URL host, the certificate files, and whether the
    operator manages the ValidatingWebhookConfiguration itself."""

    addr: str
    port: int
    host: str
    certfile: str
    keyfile: str
    managed: bool


def self_signed(host: str, directory: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path]:
    """A self-signed P-256 certificate for ``host`` (an IP or a DNS name; localhost too), its key beside it."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = [x509.DNSName("localhost")]
    try:
        names.append(x509.IPAddress(ipaddress.ip_address(host)))
    except ValueError:
        names.append(x509.DNSName(host))
    if host != "127.0.0.1":
        names.append(x509.IPAddress(ipaddress.ip_address("127.0.0.1")))
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"kubeforge-webhook {host}")])
    now = dt.datetime.now(dt.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=CERT_DAYS))
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, content_commitment=False,
                                         key_encipherment=False, data_encipherment=False, key_agreement=False,
                                         crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .sign(key, hashes.SHA256()))
    certfile, keyfile = directory / "tls.crt", directory / "tls.key"
    certfile.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    keyfile.touch(mode=0o600)
    keyfile.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    return certfile, keyfile


def free_port(addr: str) -> int:
    with socket.socket(socket.AF_INET6 if ":" in addr else socket.AF_INET) as s:
        s.bind((addr, 0))
        return int(s.getsockname()[1])


def prepare(*, addr: str, port: int, host: str, cert_dir: str | None) -> Webhook:
    """The webhook's serving plan: mounted certificate (in-cluster) or a fresh self-signed one (self-registered)."""
    if cert_dir:
        d = pathlib.Path(cert_dir)
        return Webhook(addr=addr, port=port or 9443, host=host, certfile=str(d / "tls.crt"),
                       keyfile=str(d / "tls.key"), managed=False)
    d = pathlib.Path(tempfile.mkdtemp(prefix="kubeforge-webhook-"))
    certfile, keyfile = self_signed(host, d)
    return Webhook(addr=addr, port=port or free_port(addr), host=host, certfile=str(certfile), keyfile=str(keyfile),
                   managed=True)


def configure(settings: kopf.OperatorSettings, hook: Webhook) -> None:
    """Point kopf's admission settings at the server (and, self-registered, at the managed configuration)."""
    settings.admission.server = kopf.WebhookServer(
        addr=hook.addr, port=hook.port, host=hook.host, certfile=hook.certfile, pkeyfile=hook.keyfile)
    if hook.managed:
        settings.admission.managed = MANAGED_NAME


def configuration_ref() -> dict[str, object]:
    """The managed ValidatingWebhookConfiguration, as an object reference (for deleting it on exit)."""
    return {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": MANAGED_NAME}}


def answer(doc: Any, *, runtime: admission.RuntimeImage | None = None,
           pools: admission.PoolLookup | None = None) -> dict[str, Any]:
    """The AdmissionReview answer (``admission.respond``), counted by result."""
    out = admission.respond(doc, runtime=runtime, pools=pools)
    metrics.ADMISSION.labels("allowed" if out["response"]["allowed"] else "denied").inc()
    return out


class _Context:
    """A TLS server context for the certificate files, rebuilt when either file changes."""

    def __init__(self, certfile: str, keyfile: str) -> None:
        self.certfile, self.keyfile = certfile, keyfile
        self._stamp: tuple[int, int] | None = None
        self._ctx: ssl.SSLContext | None = None
        self._lock = threading.Lock()

    def get(self) -> ssl.SSLContext:
        stamp = (os.stat(self.certfile).st_mtime_ns, os.stat(self.keyfile).st_mtime_ns)
        with self._lock:
            if self._ctx is None or stamp != self._stamp:
                ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
                ctx.minimum_version = ssl.TLSVersion.TLSv1_2
                ctx.load_cert_chain(self.certfile, self.keyfile)
                if self._ctx is not None:
                    log.info("webhook: certificate reloaded from %s", self.certfile)
                self._ctx, self._stamp = ctx, stamp
            return self._ctx


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"     # the API server keeps connections open

    def setup(self) -> None:
        self.request.settimeout(TIMEOUT_S)
        self.request.do_handshake()
        super().setup()

    def _send(self, code: int, body: bytes, ctype: str = "application/json") -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self._send(200 if self.path == "/healthz" else 404, b"ok\n" if self.path == "/healthz" else b"",
                   "text/plain")

    def do_POST(self) -> None:  # noqa: N802
        if self.path.split("?", 1)[0] != PATH:
            self._send(404, b"")
            return
        try:
            length = int(self.headers.get("Content-Length") or -1)
        except ValueError:
            length = -1
        if not 0 <= length <= MAX_BODY:
            metrics.ADMISSION.labels("malformed").inc()
            self.close_connection = True
            self._send(400 if length < 0 else 413, b'{"error": "a Content-Length up to 8 MiB is required"}')
            return
        try:
            out = self.server.answer(json.loads(self.rfile.read(length)))
        except (ValueError, admission.MalformedReview) as exc:   # JSONDecodeError is a ValueError
            metrics.ADMISSION.labels("malformed").inc()
            self._send(400, json.dumps({"error": str(exc)[:200]}).encode())
            return
        self._send(200, json.dumps(out).encode())

    def log_message(self, *args: Any) -> None:
        pass


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    answer: Callable[[Any], dict[str, Any]]
    tls: _Context

    def get_request(self) -> tuple[Any, Any]:
        sock, addr = self.socket.accept()
        return self.tls.get().wrap_socket(sock, server_side=True, do_handshake_on_connect=False), addr

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.debug("webhook: connection from %s failed", client_address, exc_info=True)


class _Server6(_Server):
    address_family = socket.AF_INET6


class AdmissionServer:
    """The webhook over HTTPS on ``hook.addr:hook.port`` (in-cluster mode), answering with ``answer``."""

    def __init__(self, hook: Webhook, answer_fn: Callable[[Any], dict[str, Any]] = answer) -> None:
        server_class = _Server6 if ":" in hook.addr else _Server
        self._server = server_class((hook.addr, hook.port), _Handler)
        self._server.answer = answer_fn
        self._server.tls = _Context(hook.certfile, hook.keyfile)
        self._server.tls.get()     # a bad certificate fails here, at start, not at the first review
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(target=self._server.serve_forever, name="webhook", daemon=True)

    def start(self) -> AdmissionServer:
        self._thread.start()
        log.info("webhook: serving %s on port %d", PATH, self.port)
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
