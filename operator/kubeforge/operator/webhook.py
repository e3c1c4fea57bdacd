"""Serving the admission webhook: kopf's HTTPS server, with a certificate made here or mounted from the cluster.

Two ways to run (``main`` chooses from the flags):
- **Self-registered** (``kubeforge operator`` outside the cluster: development and the e2e harness): a self-signed
  certificate for ``--webhook-host`` (default 127.0.0.1, where a local API server reaches the host) is made in
  memory and written to a private temp dir for the TLS server; kopf serves on ``--webhook-port`` (0: a free port)
  and manages the ``ValidatingWebhookConfiguration`` ``MANAGED_NAME`` (URL + the certificate as ``caBundle``). It
  is deleted again when the operator exits cleanly.
- **In-cluster** (Helm): ``--webhook-cert-dir`` holds ``tls.crt``/``tls.key`` (a Secret made by the chart); the chart
  owns the configuration and its Service; the operator only serves.

Neighbours: ``handlers`` registers the kopf validation handler and applies :func:`configure` to kopf's settings;
``admission`` decides.
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import ipaddress
import pathlib
import socket
import tempfile

import kopf

MANAGED_NAME = "kubeforge.dev"
HANDLER_ID = "validate.rljobs"
CERT_DAYS = 365


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
