"""Where the operator's API server is and how it authenticates: a kubeconfig, else the pod's service account.

Role: ``apply.load_credentials`` (the operator, its leader election, the operator bench). Neighbours: ``apply``
(turns the result into one TLS context and a connection pool), ``handlers`` (hands the same to kopf's login).

What it reads (the forms a cluster admin hands an operator): the current context of ``$KUBECONFIG`` (a
``:``-separated list, merged as kubectl does: the first file that names an entry wins) or ``~/.kube/config``; the
cluster's ``server``, ``certificate-authority[-data]`` and ``insecure-skip-tls-verify``; the user's ``token`` or
``tokenFile``, ``client-certificate[-data]`` and ``client-key[-data]``. ``*-data`` values (base64) are written
to 0600 files (one per value and load) in a private directory (removed at exit), because OpenSSL loads client
keys from files. Relative paths are relative to the file that names them. In a pod: ``KUBERNETES_SERVICE_HOST``/``_PORT`` with the mounted
token and CA. Anything else (``exec`` plugins, ``auth-provider``, basic auth) is refused naming the field, rather
than connecting unauthenticated.

Why not the ``kubernetes`` package: it was used only for this, and importing it costs the long-running operator
~5 MiB of resident memory and a second of start-up (docs/operator.md, "Memory").
"""
from __future__ import annotations

import atexit
import base64
import binascii
import dataclasses
import os
import pathlib
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

SERVICE_ACCOUNT = pathlib.Path("/var/run/secrets/kubernetes.io/serviceaccount")
UNSUPPORTED_USER = ("exec", "auth-provider", "username", "password")


class ConfigError(ValueError):
    """No usable credentials; the message names the file and field."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Credentials:
    server: str
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    verify: bool = True
    token: str | None = None


def _merged(files: Sequence[pathlib.Path]) -> tuple[dict[str, Any], dict[str, dict[str, pathlib.Path]]]:
    """kubectl's merge of several kubeconfigs: per named cluster/user/context and for ``current-context`` the
    first file wins. Returns the merged document and, per section and name, the file it came from."""
    doc: dict[str, Any] = {"clusters": {}, "users": {}, "contexts": {}, "current-context": None}
    origin: dict[str, dict[str, pathlib.Path]] = {"clusters": {}, "users": {}}
    for path in files:
        try:
            data = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path}: not YAML: {exc}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: not a kubeconfig (expected a mapping)")
        for section, body in (("clusters", "cluster"), ("users", "user"), ("contexts", "context")):
            for entry in data.get(section) or []:
                if isinstance(entry, dict) and entry.get("name") and entry["name"] not in doc[section]:
                    doc[section][entry["name"]] = entry.get(body) or {}
                    if section in origin:
                        origin[section][entry["name"]] = path
        if not doc["current-context"] and data.get("current-context"):
            doc["current-context"] = data["current-context"]
    return doc, origin


class _Materialiser:
    """Writes each ``*-data`` value to a private file of its own, in one directory per process (removed at exit)."""

    def __init__(self) -> None:
        self._dir: pathlib.Path | None = None

    def write(self, name: str, b64: str, *, field: str) -> str:
        try:
            raw = base64.b64decode(b64, validate=True)
        except (binascii.Error, ValueError):
            raise ConfigError(f"{field}: Invalid value: not base64") from None
        if self._dir is None:
            self._dir = pathlib.Path(tempfile.mkdtemp(prefix="kubeforge-kubeconfig-"))
            atexit.register(shutil.rmtree, self._dir, True)
        fd, path = tempfile.mkstemp(dir=self._dir, prefix=f"{name}-")    # 0600; a file per value, never reused
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
        return path


_FILES = _Materialiser()


def _file(entry: Mapping[str, Any], key: str, *, base: pathlib.Path, name: str, field: str) -> str | None:
    """``key-data`` (written to a file) or ``key`` (a path, relative to ``base``), else None."""
    if entry.get(f"{key}-data"):
        return _FILES.write(name, str(entry[f"{key}-data"]), field=f"{field}.{key}-data")
    if entry.get(key):
        path = base / str(entry[key])
        if not path.is_file():
            raise ConfigError(f"{field}.{key}: Not found: {path}")
        return str(path)
    return None


def from_kubeconfig(files: Sequence[str | pathlib.Path]) -> Credentials:
    """Credentials of the current context of the merged ``files``; :class:`ConfigError` naming what is wrong."""
    paths = [pathlib.Path(f).expanduser() for f in files]
    present = [p for p in paths if p.is_file()]
    if not present:
        raise ConfigError(f"no kubeconfig at {', '.join(str(p) for p in paths)}")
    doc, origin = _merged(present)
    where = ":".join(str(p) for p in present)
    current = doc["current-context"]
    if not current:
        raise ConfigError(f"{where}: current-context: Required value")
    context = doc["contexts"].get(current)
    if context is None:
        raise ConfigError(f"{where}: current-context: Not found: no context {current!r}")
    cname, uname = context.get("cluster"), context.get("user")
    cluster = doc["clusters"].get(cname)
    if cluster is None:
        raise ConfigError(f"{where}: contexts[{current}].cluster: Not found: no cluster {cname!r}")
    server = str(cluster.get("server") or "").rstrip("/")
    if not server:
        raise ConfigError(f"{where}: clusters[{cname}].server: Required value")
    user: Mapping[str, Any] = (doc["users"].get(uname) or {}) if uname else {}
    for key in UNSUPPORTED_USER:
        if user.get(key):
            raise ConfigError(f"{where}: users[{uname}].{key}: Unsupported value: the operator authenticates with "
                              f"a token, tokenFile or client certificate")
    cbase = origin["clusters"][cname].parent
    ubase = origin["users"][uname].parent if uname in origin["users"] else cbase
    token = str(user["token"]) if user.get("token") else None
    if token is None and user.get("tokenFile"):
        token_file = ubase / str(user["tokenFile"])
        if not token_file.is_file():
            raise ConfigError(f"{where}: users[{uname}].tokenFile: Not found: {token_file}")
        token = token_file.read_text().strip()
    return Credentials(
        server=server, verify=not cluster.get("insecure-skip-tls-verify", False), token=token,
        ca_file=_file(cluster, "certificate-authority", base=cbase, name="ca.crt", field=f"clusters[{cname}]"),
        cert_file=_file(user, "client-certificate", base=ubase, name="client.crt", field=f"users[{uname}]"),
        key_file=_file(user, "client-key", base=ubase, name="client.key", field=f"users[{uname}]"))


def in_cluster(environ: Mapping[str, str], *, account: pathlib.Path = SERVICE_ACCOUNT) -> Credentials:
    """The pod's service account (``ConfigError`` outside a pod)."""
    host, port = environ.get("KUBERNETES_SERVICE_HOST"), environ.get("KUBERNETES_SERVICE_PORT")
    token = account / "token"
    if not host or not port or not token.is_file():
        raise ConfigError("no kubeconfig found and not in a pod (KUBERNETES_SERVICE_HOST, KUBERNETES_SERVICE_PORT "
                          f"and {token} are needed)")
    ca = account / "ca.crt"
    host = f"[{host}]" if ":" in host else host
    return Credentials(server=f"https://{host}:{port}", token=token.read_text().strip(),
                       ca_file=str(ca) if ca.is_file() else None)


def load(explicit: str | None = None, *, environ: Mapping[str, str] | None = None,
         account: pathlib.Path = SERVICE_ACCOUNT) -> Credentials:
    """``explicit`` (a path), else ``$KUBECONFIG``, else ``~/.kube/config`` when present, else the pod's account."""
    env = os.environ if environ is None else environ
    if explicit:
        return from_kubeconfig([explicit])
    listed = [p for p in env.get("KUBECONFIG", "").split(os.pathsep) if p]
    if listed:
        return from_kubeconfig(listed)
    home = pathlib.Path(env.get("HOME") or pathlib.Path.home()) / ".kube" / "config"
    if home.is_file():
        return from_kubeconfig([home])
    return in_cluster(env, account=account)
