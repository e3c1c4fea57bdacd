"""Where the operator's API server is and how it authenticates: a kubeconfig, else the pod's service account.

Role: ``apply.load_credentials`` (the operator, its leader election, the operator bench). Neighbours: ``apply``
(asks :meth:`Credentials.auth` for what to present on each request, and builds one TLS context per client
certificate), ``handlers`` (hands the same to kopf's login, again whenever kopf asks).

What it reads (the forms a cluster admin hands an operator): the current context of ``$KUBECONFIG`` (a
``:``-separated list, merged as kubectl does: the first file that names an entry wins) or ``~/.kube/config``; the
cluster's ``server``, ``certificate-authority[-data]`` and ``insecure-skip-tls-verify``; the user's ``token`` or
``tokenFile``, ``client-certificate[-data]`` and ``client-key[-data]``, or an ``exec`` credential plugin.
``*-data`` values (base64) are written to 0600 files (one per value and load) in a private directory (removed at
exit), because OpenSSL loads client keys from files. Relative paths are relative to the file that names them. In
a pod: ``KUBERNETES_SERVICE_HOST``/``_PORT`` with the mounted token and CA. Anything else (``auth-provider``,
basic auth) is refused naming the field, rather than connecting unauthenticated.

Credentials that change while the operator runs:
- ``tokenFile`` and the pod's token are read again whenever the file changed (a kubelet rotates a bound service
  account token by swapping a symlink; a stat per request notices) and after the API server answered 401; when
  both ``token`` and ``tokenFile`` are set the file wins while it can be read, as with kubectl.
- ``exec`` (:class:`ExecPlugin`, client.authentication.k8s.io/v1 and v1beta1 ``ExecCredential``, as kubectl runs
  them): the command runs with its ``args``, ``env`` and ``KUBERNETES_EXEC_INFO``, non-interactively, stdin
  closed, killed (its whole process group) after ``EXEC_TIMEOUT_S``; its token and/or client certificate are
  kept until shortly before ``expirationTimestamp`` (``REFRESH_BEFORE_S``, at most half their lifetime) and it
  runs again then, and once after a 401 (:meth:`Credentials.reauth`). A plugin that is missing (with its
  ``installHint``), fails, hangs or prints no usable ``ExecCredential`` raises :class:`ConfigError` naming
  ``users[<name>].exec``. It runs once at load, so a broken one stops the operator at start; processes that load
  the same kubeconfig share one plugin (one run, one cache).

Why not the ``kubernetes`` package: it was used only for this, and importing it costs the long-running operator
~5 MiB of resident memory and a second of start-up (docs/operator.md, "Memory"); neither image installs it.
"""
from __future__ import annotations

import atexit
import base64
import binascii
import dataclasses
import datetime as dt
import json
import logging
import os
import pathlib
import shutil
import signal
import ssl
import subprocess
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

SERVICE_ACCOUNT = pathlib.Path("/var/run/secrets/kubernetes.io/serviceaccount")
UNSUPPORTED_USER = ("auth-provider", "username", "password")
EXEC_API_VERSIONS = ("client.authentication.k8s.io/v1", "client.authentication.k8s.io/v1beta1")
EXEC_TIMEOUT_S = 30.0        # a plugin that has not answered by then is killed (it would block every request)
REFRESH_BEFORE_S = 30.0      # a plugin's credentials are renewed this long before they expire (at most half-life)
EXEC_EXTENSION = "client.authentication.k8s.io/exec"   # the cluster extension handed to provideClusterInfo plugins

log = logging.getLogger("kubeforge.operator.kubeconfig")


class ConfigError(ValueError):
    """No usable credentials; the message names the file and field."""


@dataclasses.dataclass(frozen=True)
class Auth:
    """What one request presents: a bearer token and/or a client certificate. ``refresh_at`` (epoch seconds): when
    :meth:`Credentials.auth` will hand out new ones (an exec plugin's credentials; None: never)."""
    token: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    refresh_at: float | None = None


class TokenFile:
    """A token file, read again whenever it changed (device, inode, size or mtime) or when asked to (after a 401);
    while it cannot be read (mid-rotation) the last token read stands."""

    def __init__(self, path: pathlib.Path, token: str | None) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._token = token
        self._seen: tuple[int, int, int, int] | None = self._stat()

    def _stat(self) -> tuple[int, int, int, int] | None:
        try:
            st = self.path.stat()
        except OSError:
            return None
        return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns

    def read(self, *, force: bool = False) -> str | None:
        seen = self._stat()
        with self._lock:
            if seen is not None and (force or seen != self._seen):
                try:
                    self._token = self.path.read_text().strip() or self._token
                    self._seen = seen
                except OSError:
                    pass
            return self._token


@dataclasses.dataclass(frozen=True, kw_only=True)
class Credentials:
    """The API server and how to authenticate to it. ``token``, ``cert_file`` and ``key_file`` are the values read
    at load; :meth:`auth` is what to present now (the token file's current token, the exec plugin's credentials)."""
    server: str
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    verify: bool = True
    token: str | None = None
    token_file: TokenFile | None = dataclasses.field(default=None, compare=False, repr=False)
    plugin: ExecPlugin | None = dataclasses.field(default=None, compare=False, repr=False)
    origin: str = ""      # the kubeconfig user (or the pod's account) they came from, for error messages

    def auth(self) -> Auth:
        """The credentials to present on the next request (may run the exec plugin: :class:`ConfigError`)."""
        if self.plugin is not None:
            return self.plugin.get()
        token = self.token_file.read() if self.token_file is not None else self.token
        return Auth(token=token, cert_file=self.cert_file, key_file=self.key_file)

    def reauth(self, rejected: Auth) -> Auth | None:
        """After the API server answered 401 to ``rejected``: different credentials to try once (the plugin run
        again, unless another caller already did; the token file read again), else None (nothing new: give up)."""
        if self.plugin is not None:
            fresh = self.plugin.renew(rejected)
        elif self.token_file is not None:
            fresh = Auth(token=self.token_file.read(force=True), cert_file=self.cert_file, key_file=self.key_file)
        else:
            return None
        return fresh if fresh != rejected else None


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
        self._lock = threading.Lock()

    def write(self, name: str, b64: str, *, field: str) -> str:
        try:
            raw = base64.b64decode(b64, validate=True)
        except (binascii.Error, ValueError):
            raise ConfigError(f"{field}: Invalid value: not base64") from None
        return self.write_bytes(name, raw)

    def write_bytes(self, name: str, raw: bytes) -> str:
        with self._lock:
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


def _timestamp(value: Any) -> float | None:
    """An RFC 3339 ``expirationTimestamp`` as epoch seconds (no zone: UTC); ValueError when it is not one."""
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise ValueError(f"not a timestamp: {value!r}")
    when = dt.datetime.fromisoformat(value.strip().replace("Z", "+00:00").replace("z", "+00:00"))
    return (when if when.tzinfo else when.replace(tzinfo=dt.timezone.utc)).timestamp()


class ExecPlugin:
    """A client-go credential plugin (``users[].user.exec``), run as kubectl runs it, its answer cached until
    shortly before it expires. Thread-safe: one run at a time; callers wait for it and share its answer."""

    def __init__(self, spec: Mapping[str, Any], *, field: str, base: pathlib.Path, cluster: Mapping[str, Any],
                 ca_file: str | None, static: Auth) -> None:
        self.field = field
        if not isinstance(spec, Mapping):
            raise ConfigError(f"{field}: Invalid value: expected a mapping")
        command = spec.get("command")
        if not command or not isinstance(command, str):
            raise ConfigError(f"{field}.command: Required value")
        self.api_version = spec.get("apiVersion")
        if not self.api_version:
            raise ConfigError(f"{field}.apiVersion: Required value")
        if self.api_version not in EXEC_API_VERSIONS:
            raise ConfigError(f"{field}.apiVersion: Unsupported value: {self.api_version!r} (supported: "
                              f"{', '.join(EXEC_API_VERSIONS)})")
        mode = spec.get("interactiveMode") or ("IfAvailable" if self.api_version.endswith("/v1beta1") else None)
        if mode is None:
            raise ConfigError(f"{field}.interactiveMode: Required value (Never or IfAvailable)")
        if mode == "Always":
            raise ConfigError(f"{field}.interactiveMode: Unsupported value: \"Always\": the operator has no terminal "
                              "(use Never or IfAvailable)")
        if mode not in ("Never", "IfAvailable"):
            raise ConfigError(f"{field}.interactiveMode: Unsupported value: {mode!r}")
        args = spec.get("args") or []
        if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
            raise ConfigError(f"{field}.args: Invalid value: expected a list of strings")
        env: dict[str, str] = {}
        for i, item in enumerate(spec.get("env") or []):
            if not isinstance(item, Mapping) or not item.get("name"):
                raise ConfigError(f"{field}.env[{i}].name: Required value")
            env[str(item["name"])] = str(item.get("value") if item.get("value") is not None else "")
        # A command with a path separator is relative to the kubeconfig naming it; a bare name is looked up on PATH.
        self.command = str(base / command) if os.sep in command and not os.path.isabs(command) else command
        self.argv = [self.command, *args]
        self.install_hint = str(spec.get("installHint") or "").strip()
        request: dict[str, Any] = {"interactive": False}
        if spec.get("provideClusterInfo"):
            request["cluster"] = _cluster_info(cluster, ca_file)
        info = {"apiVersion": self.api_version, "kind": "ExecCredential", "spec": request}
        self.env = {**env, "KUBERNETES_EXEC_INFO": json.dumps(info, separators=(",", ":"))}
        self.timeout = EXEC_TIMEOUT_S
        self._static = static
        self._lock = threading.Lock()
        self._auth: Auth | None = None
        self._files: list[list[str]] = []     # the certificate files of the last two answers (older ones removed)

    def get(self) -> Auth:
        """The cached credentials, or the plugin's fresh ones when there are none or they are due."""
        with self._lock:
            current = self._auth
            if current is None or (current.refresh_at is not None and time.time() >= current.refresh_at):
                self._auth = current = self._run()
            return current

    def renew(self, rejected: Auth) -> Auth:
        """After a 401 to ``rejected``: run the plugin again, unless another caller already replaced them."""
        with self._lock:
            if self._auth is None or self._auth == rejected:
                self._auth = self._run()
            return self._auth

    def _run(self) -> Auth:
        started = time.time()
        try:
            proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, env={**os.environ, **self.env}, start_new_session=True)
        except FileNotFoundError:
            hint = f"; installHint: {self.install_hint}" if self.install_hint else ""
            raise ConfigError(f"{self.field}.command: Not found: {self.command!r} is not installed or not on "
                              f"PATH{hint}") from None
        except OSError as exc:
            raise ConfigError(f"{self.field}.command: {self.command!r} cannot run: {exc}") from None
        try:
            out, err = proc.communicate(timeout=self.timeout)
        except subprocess.TimeoutExpired:
            exited = proc.poll() is not None
            _kill(proc)
            why = ("exited, but a process it started kept its output open" if exited else "did not answer")
            raise ConfigError(f"{self.field}: {self.command!r} {why} within {self.timeout:g} s (killed with what "
                              "it started; it must print an ExecCredential without asking anything)") from None
        stderr = err.decode("utf-8", "replace").strip()
        if proc.returncode != 0:
            raise ConfigError(f"{self.field}: {self.command!r} failed (exit status {proc.returncode})"
                              + (f": {stderr[-800:]}" if stderr else ""))
        if stderr:
            log.debug("%s: %s wrote to stderr: %s", self.field, self.command, stderr[-800:])
        return self._parse(out, started)

    def _parse(self, out: bytes, started: float) -> Auth:
        what = f"{self.field}: {self.command!r} printed"
        try:
            doc = json.loads(out)
        except ValueError:
            shown = out[:200].decode("utf-8", "replace")
            raise ConfigError(f"{what} no ExecCredential (not JSON: {shown!r})") from None
        if not isinstance(doc, dict) or doc.get("kind") != "ExecCredential":
            raise ConfigError(f"{what} no ExecCredential (kind: {doc.get('kind') if isinstance(doc, dict) else doc!r})")
        if doc.get("apiVersion") != self.api_version:
            raise ConfigError(f"{what} apiVersion {doc.get('apiVersion')!r}; {self.field}.apiVersion asks for "
                              f"{self.api_version!r}")
        status = doc.get("status")
        if not isinstance(status, dict):
            raise ConfigError(f"{what} an ExecCredential without status")
        token, cert, key = status.get("token"), status.get("clientCertificateData"), status.get("clientKeyData")
        for name, value in (("token", token), ("clientCertificateData", cert), ("clientKeyData", key)):
            if value is not None and not isinstance(value, str):
                raise ConfigError(f"{what} a status.{name} that is not a string")
        if not token and not cert and not key:
            raise ConfigError(f"{what} neither status.token nor status.clientCertificateData/clientKeyData")
        if bool(cert) != bool(key):
            raise ConfigError(f"{what} only one of status.clientCertificateData and status.clientKeyData")
        try:
            expires = _timestamp(status.get("expirationTimestamp"))
        except ValueError:
            raise ConfigError(f"{what} a status.expirationTimestamp that is not RFC 3339: "
                              f"{status.get('expirationTimestamp')!r}") from None
        cert_file, key_file = self._static.cert_file, self._static.key_file
        if cert and key:
            cert_file, key_file = self._certificate(cert.encode(), key.encode(), what=what)
        refresh_at = None
        if expires is not None:
            refresh_at = expires - min(REFRESH_BEFORE_S, max(expires - started, 0.0) / 2)
        return Auth(token=token or self._static.token, cert_file=cert_file, key_file=key_file, refresh_at=refresh_at)

    def _certificate(self, cert: bytes, key: bytes, *, what: str) -> tuple[str, str]:
        """The answer's PEM pair as private files (checked to load as a pair); the pair before the previous one is
        removed (every pool built from those has its TLS context already)."""
        files = [_FILES.write_bytes("exec-client.crt", cert), _FILES.write_bytes("exec-client.key", key)]
        try:
            ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_cert_chain(files[0], files[1])
        except (ssl.SSLError, ValueError) as exc:
            _remove(files)
            raise ConfigError(f"{what} a client certificate and key that do not load as a pair: {exc}") from None
        self._files.append(files)
        while len(self._files) > 2:
            _remove(self._files.pop(0))
        return files[0], files[1]


def _remove(paths: Sequence[str]) -> None:
    for path in paths:
        try:
            os.unlink(path)
        except OSError:
            pass


def _kill(proc: subprocess.Popen[bytes]) -> None:
    """Kill the plugin and whatever it started (its own session), and reap it without waiting for its pipes."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        proc.kill()
    for pipe in (proc.stdout, proc.stderr):
        if pipe is not None:
            pipe.close()
    proc.wait()


def _cluster_info(cluster: Mapping[str, Any], ca_file: str | None) -> dict[str, Any]:
    """``spec.cluster`` of the ExecCredential request (``provideClusterInfo``), as kubectl fills it."""
    info: dict[str, Any] = {"server": str(cluster.get("server") or "")}
    if ca_file:
        info["certificate-authority-data"] = base64.b64encode(pathlib.Path(ca_file).read_bytes()).decode()
    for key in ("insecure-skip-tls-verify", "tls-server-name", "proxy-url", "disable-compression"):
        if cluster.get(key):
            info[key] = cluster[key]
    for ext in cluster.get("extensions") or []:
        if isinstance(ext, Mapping) and ext.get("name") == EXEC_EXTENSION:
            info["config"] = ext.get("extension")
    return info


_PLUGINS: dict[str, ExecPlugin] = {}
_PLUGINS_LOCK = threading.Lock()


def _plugin(user: Mapping[str, Any], *, field: str, base: pathlib.Path, cluster: Mapping[str, Any],
            ca_file: str | None, static: Auth) -> ExecPlugin:
    """The process's plugin for this user and cluster (the operator and its leader election load the kubeconfig
    separately: one plugin run and one cache for both, as client-go shares its authenticators)."""
    try:
        key = json.dumps([user, cluster, str(base)], sort_keys=True, default=str)
    except TypeError:         # keys that are not strings (YAML allows them): the order as written
        key = repr([user, cluster, str(base)])
    with _PLUGINS_LOCK:
        plugin = _PLUGINS.get(key)
        if plugin is None:
            plugin = _PLUGINS[key] = ExecPlugin(user["exec"], field=field, base=base, cluster=cluster,
                                                ca_file=ca_file, static=static)
    return plugin


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
                              f"a token, tokenFile, client certificate or exec plugin")
    cbase = origin["clusters"][cname].parent
    ubase = origin["users"][uname].parent if uname in origin["users"] else cbase
    token = str(user["token"]) if user.get("token") else None
    token_file = None
    if user.get("tokenFile"):
        path = ubase / str(user["tokenFile"])
        if token is None and not path.is_file():
            raise ConfigError(f"{where}: users[{uname}].tokenFile: Not found: {path}")
        token_file = TokenFile(path, token)
        token = token_file.read(force=True)
    ca_file = _file(cluster, "certificate-authority", base=cbase, name="ca.crt", field=f"clusters[{cname}]")
    cert_file = _file(user, "client-certificate", base=ubase, name="client.crt", field=f"users[{uname}]")
    key_file = _file(user, "client-key", base=ubase, name="client.key", field=f"users[{uname}]")
    plugin = None
    if user.get("exec"):
        plugin = _plugin(user, field=f"{where}: users[{uname}].exec", base=ubase, cluster=cluster,
                         ca_file=ca_file, static=Auth(token=token, cert_file=cert_file, key_file=key_file))
        plugin.get()      # a missing or broken plugin stops the operator here, not at its first request
        token_file = None
    return Credentials(
        server=server, verify=not cluster.get("insecure-skip-tls-verify", False), token=token, token_file=token_file,
        ca_file=ca_file, cert_file=cert_file, key_file=key_file, plugin=plugin,
        origin=f"{where}: users[{uname}]" + (".exec" if plugin else ".tokenFile" if token_file else ""))


def in_cluster(environ: Mapping[str, str], *, account: pathlib.Path = SERVICE_ACCOUNT) -> Credentials:
    """The pod's service account (``ConfigError`` outside a pod); its token is re-read when the kubelet rotates it."""
    host, port = environ.get("KUBERNETES_SERVICE_HOST"), environ.get("KUBERNETES_SERVICE_PORT")
    token = account / "token"
    if not host or not port or not token.is_file():
        raise ConfigError("no kubeconfig found and not in a pod (KUBERNETES_SERVICE_HOST, KUBERNETES_SERVICE_PORT "
                          f"and {token} are needed)")
    ca = account / "ca.crt"
    host = f"[{host}]" if ":" in host else host
    source = TokenFile(token, None)
    return Credentials(server=f"https://{host}:{port}", token=source.read(force=True), token_file=source,
                       ca_file=str(ca) if ca.is_file() else None, origin=str(token))


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
