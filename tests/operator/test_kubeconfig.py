"""The operator's credentials (``kubeconfig``): kubeconfig forms, merging, the pod's account, clear refusals; one
TLS context per pool that really verifies the server; the operator process never imports the Kubernetes client.
Credentials that change while it runs: token files re-read when they change, exec credential plugins (scripts this
file writes) cached until shortly before they expire and run again after a 401, never hanging the operator."""
from __future__ import annotations

import base64
import concurrent.futures
import datetime as dt
import http.server
import json
import os
import pathlib
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
import yaml

from kubeforge.operator import apply, kubeconfig, webhook


def b64(path: pathlib.Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def write(path: pathlib.Path, *, current: str | None = "ctx", clusters: dict[str, Any] | None = None,
          users: dict[str, Any] | None = None, contexts: dict[str, Any] | None = None) -> pathlib.Path:
    doc: dict[str, Any] = {
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": n, "cluster": c} for n, c in (clusters or {}).items()],
        "users": [{"name": n, "user": u} for n, u in (users or {}).items()],
        "contexts": [{"name": n, "context": c} for n, c in (contexts or {}).items()]}
    if current:
        doc["current-context"] = current
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> tuple[pathlib.Path, pathlib.Path]:
    return webhook.self_signed("127.0.0.1", tmp_path_factory.mktemp("pki"))


def test_embedded_data_becomes_private_files(tmp_path: pathlib.Path, pki: tuple[pathlib.Path, pathlib.Path]) -> None:
    cert, key = pki
    cfg = write(tmp_path / "config", clusters={"c": {"server": "https://127.0.0.1:6443/",
                                                     "certificate-authority-data": b64(cert)}},
                users={"u": {"client-certificate-data": b64(cert), "client-key-data": b64(key)}},
                contexts={"ctx": {"cluster": "c", "user": "u"}})
    creds = kubeconfig.load(str(cfg))
    assert creds.server == "https://127.0.0.1:6443" and creds.verify and creds.token is None
    assert creds.ca_file and creds.cert_file and creds.key_file
    assert pathlib.Path(creds.ca_file).read_bytes() == cert.read_bytes()
    assert pathlib.Path(creds.key_file).read_bytes() == key.read_bytes()
    assert pathlib.Path(creds.key_file).stat().st_mode & 0o777 == 0o600
    apply.tls_context(creds)        # the client certificate and key load as a pair
    again = kubeconfig.load(str(cfg))
    assert again.key_file != creds.key_file and pathlib.Path(creds.key_file).is_file()   # earlier files stay valid


def test_paths_are_relative_to_their_file_and_tokens_are_read(tmp_path: pathlib.Path,
                                                              pki: tuple[pathlib.Path, pathlib.Path]) -> None:
    d = tmp_path / "conf"
    d.mkdir()
    (d / "ca.pem").write_bytes(pki[0].read_bytes())
    (d / "token").write_text("from-file\n")
    cfg = write(d / "config", clusters={"c": {"server": "https://h:1", "certificate-authority": "ca.pem"}},
                users={"u": {"tokenFile": "token"}}, contexts={"ctx": {"cluster": "c", "user": "u"}})
    creds = kubeconfig.load(str(cfg))
    assert creds.ca_file == str(d / "ca.pem") and creds.token == "from-file"
    write(d / "config", clusters={"c": {"server": "https://h:1", "insecure-skip-tls-verify": True}},
          users={"u": {"token": "inline"}}, contexts={"ctx": {"cluster": "c", "user": "u"}})
    creds = kubeconfig.load(str(cfg))
    assert creds.token == "inline" and not creds.verify and creds.ca_file is None
    assert apply.tls_context(creds).verify_mode == ssl.CERT_NONE


def test_kubeconfig_list_merges_first_wins(tmp_path: pathlib.Path) -> None:
    a = write(tmp_path / "a", current="two", clusters={"c": {"server": "https://first:1"}},
              users={"u": {"token": "t-first"}}, contexts={"one": {"cluster": "c", "user": "u"}})
    b = write(tmp_path / "b", current="one", clusters={"c": {"server": "https://second:1"}},
              users={"u": {"token": "t-second"}}, contexts={"two": {"cluster": "c", "user": "u"}})
    creds = kubeconfig.load(environ={"KUBECONFIG": f"{tmp_path / 'missing'}:{a}:{b}"})
    assert creds.server == "https://first:1" and creds.token == "t-first"      # context "two" lives in b


@pytest.mark.parametrize("user,field", [
    ({"exec": {"command": "aws"}}, "users[u].exec"),
    ({"auth-provider": {"name": "oidc"}}, "users[u].auth-provider"),
    ({"username": "admin", "password": "x"}, "users[u].username"),
    ({"client-key-data": "***not base64***"}, "users[u].client-key-data"),
])
def test_unusable_users_are_refused_naming_the_field(tmp_path: pathlib.Path, user: dict[str, Any], field: str) -> None:
    cfg = write(tmp_path / "config", clusters={"c": {"server": "https://h:1"}}, users={"u": user},
                contexts={"ctx": {"cluster": "c", "user": "u"}})
    with pytest.raises(kubeconfig.ConfigError, match=field.replace("[", r"\[").replace("]", r"\]")):
        kubeconfig.load(str(cfg))


@pytest.mark.parametrize("kw,message", [
    ({"current": None}, "current-context: Required value"),
    ({"current": "nope"}, "no context 'nope'"),
    ({"contexts": {"ctx": {"cluster": "gone", "user": "u"}}}, r"contexts\[ctx\].cluster: Not found"),
    ({"clusters": {"c": {}}}, r"clusters\[c\].server: Required value"),
    ({"clusters": {"c": {"server": "https://h:1", "certificate-authority": "nowhere.pem"}}},
     r"clusters\[c\].certificate-authority: Not found"),
    ({"users": {"u": {"tokenFile": "no-token"}}}, r"users\[u\].tokenFile: Not found"),
])
def test_broken_kubeconfigs_name_what_is_wrong(tmp_path: pathlib.Path, kw: dict[str, Any], message: str) -> None:
    args: dict[str, Any] = {"clusters": {"c": {"server": "https://h:1"}}, "users": {"u": {}},
                            "contexts": {"ctx": {"cluster": "c", "user": "u"}}, **kw}
    with pytest.raises(kubeconfig.ConfigError, match=message):
        kubeconfig.load(str(write(tmp_path / "config", **args)))


def test_pod_account_when_no_kubeconfig(tmp_path: pathlib.Path, pki: tuple[pathlib.Path, pathlib.Path]) -> None:
    account = tmp_path / "sa"
    account.mkdir()
    home = tmp_path / "home"
    env = {"HOME": str(home), "KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    with pytest.raises(kubeconfig.ConfigError, match="not in a pod"):
        kubeconfig.load(environ=env, account=account)
    (account / "token").write_text("sa-token\n")
    (account / "ca.crt").write_bytes(pki[0].read_bytes())
    creds = kubeconfig.load(environ=env, account=account)
    assert (creds.server, creds.token, creds.ca_file) == ("https://10.96.0.1:443", "sa-token", str(account / "ca.crt"))
    v6 = kubeconfig.load(environ={**env, "KUBERNETES_SERVICE_HOST": "fd00::1"}, account=account)
    assert v6.server == "https://[fd00::1]:443"
    (home / ".kube").mkdir(parents=True)
    write(home / ".kube" / "config", clusters={"c": {"server": "https://home:1"}}, users={"u": {}},
          contexts={"ctx": {"cluster": "c", "user": "u"}})
    assert kubeconfig.load(environ=env, account=account).server == "https://home:1"      # a kubeconfig wins


@pytest.fixture()
def https_server(pki: tuple[pathlib.Path, pathlib.Path]) -> Iterator[int]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            body = json.dumps({"path": self.path, "auth": self.headers.get("Authorization")}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(*pki)
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()


def test_cluster_verifies_the_server_with_the_kubeconfig_ca(tmp_path: pathlib.Path, https_server: int,
                                                            pki: tuple[pathlib.Path, pathlib.Path]) -> None:
    server = f"https://127.0.0.1:{https_server}"
    good = write(tmp_path / "good", clusters={"c": {"server": server, "certificate-authority-data": b64(pki[0])}},
                 users={"u": {"token": "tok"}}, contexts={"ctx": {"cluster": "c", "user": "u"}})
    got = apply.Cluster(apply.load_credentials(str(good)), pool_size=2).request("GET", "/version")
    assert got == {"path": "/version", "auth": "Bearer tok"}
    other, _ = webhook.self_signed("127.0.0.1", tmp_path)       # a CA that did not sign the server's certificate
    bad = write(tmp_path / "bad", clusters={"c": {"server": server, "certificate-authority-data": b64(other)}},
                users={"u": {}}, contexts={"ctx": {"cluster": "c", "user": "u"}})
    with pytest.raises(Exception, match="CERTIFICATE_VERIFY_FAILED"):
        apply.Cluster(apply.load_credentials(str(bad)), pool_size=2).request("GET", "/version")


def test_operator_process_never_imports_the_kubernetes_client() -> None:
    """What ``entry`` does before kopf's import, in a fresh interpreter: kopf and the operator load without it."""
    code = ("import sys; from kubeforge.operator import memory; blocked = memory.skip_unused_imports(); "
            "import kubeforge.operator.main, kopf; "
            "print(blocked, sorted(m for m in sys.modules if m.split('.')[0] == 'kubernetes' and sys.modules[m]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True,
                         env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert out.stdout.split("\n")[-2] == "['kubernetes', 'pykube'] []", out.stdout + out.stderr



# ---- exec credential plugins and token files ----

V1 = "client.authentication.k8s.io/v1"
V1BETA1 = "client.authentication.k8s.io/v1beta1"
PLUGIN = """#!{python}
import json, os, pathlib, subprocess, sys, time
here = pathlib.Path(__file__).parent
plan = json.loads((here / "plan.json").read_text())
runs = here / "runs"
n = len(runs.read_text().splitlines()) if runs.exists() else 0
seen = {{"argv": sys.argv[1:], "greeting": os.environ.get("GREETING"), "info": os.environ.get("KUBERNETES_EXEC_INFO")}}
with runs.open("a") as f:
    f.write(json.dumps(seen) + "\\n")
step = plan[min(n, len(plan) - 1)]
if step.get("orphan"):       # a child that keeps stdout open and outlives the plugin
    child = subprocess.Popen(["sleep", "60"])
    (here / "orphan.pid").write_text(str(child.pid))
time.sleep(step.get("sleep", 0))
sys.stderr.write(step.get("stderr", ""))
if "raw" in step:
    sys.stdout.write(step["raw"])
elif "status" in step:
    print(json.dumps({{"apiVersion": step.get("apiVersion", "{version}"), "kind": "ExecCredential",
                      "status": step["status"]}}))
sys.exit(step.get("exit", 0))
"""


class Plugin:
    """An exec plugin script in its own directory: it answers the n-th run with ``plan[n]`` (the last one repeats)
    and records each run's arguments and environment."""

    def __init__(self, directory: pathlib.Path, plan: list[dict[str, Any]], *, version: str = V1) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.dir, self.path = directory, directory / "plugin"
        self.path.write_text(PLUGIN.format(python=sys.executable, version=version))
        self.path.chmod(0o755)
        self.plan(plan)

    def plan(self, plan: list[dict[str, Any]]) -> None:
        (self.dir / "plan.json").write_text(json.dumps(plan))

    @property
    def runs(self) -> list[dict[str, Any]]:
        path = self.dir / "runs"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def exec_config(tmp_path: pathlib.Path, exec_: dict[str, Any], *, server: str = "https://h:1",
                cluster: dict[str, Any] | None = None, user: dict[str, Any] | None = None) -> pathlib.Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    return write(tmp_path / "config", clusters={"c": {"server": server, **(cluster or {})}},
                 users={"u": {"exec": exec_, **(user or {})}}, contexts={"ctx": {"cluster": "c", "user": "u"}})


def plugin_user(plugin: Plugin, **kw: Any) -> dict[str, Any]:
    return {"apiVersion": V1, "command": str(plugin.path), "interactiveMode": "Never", **kw}


def iso(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def test_exec_plugin_token_is_run_as_kubectl_runs_it(tmp_path: pathlib.Path) -> None:
    plugin = Plugin(tmp_path / "bin", [{"status": {"token": "tok-1"}}])
    cfg = exec_config(tmp_path, plugin_user(plugin, args=["--cluster", "prod"],
                                            env=[{"name": "GREETING", "value": "hello"}]))
    creds = kubeconfig.load(str(cfg))
    assert creds.auth() == kubeconfig.Auth(token="tok-1") and creds.token is None
    assert creds.auth() is creds.auth()                     # cached: no expiry, no second run
    again = kubeconfig.load(str(cfg))                       # the leader election's own load shares the plugin
    assert again.auth() is creds.auth() and len(plugin.runs) == 1
    run = plugin.runs[0]
    assert run["argv"] == ["--cluster", "prod"] and run["greeting"] == "hello"
    assert json.loads(run["info"]) == {"apiVersion": V1, "kind": "ExecCredential", "spec": {"interactive": False}}


def test_exec_plugin_v1beta1_with_cluster_info(tmp_path: pathlib.Path, pki: tuple[pathlib.Path, pathlib.Path]) -> None:
    """v1beta1 needs no interactiveMode (kubectl defaults it); provideClusterInfo hands the plugin the server, the CA
    and the cluster's exec extension; a relative command is relative to the kubeconfig."""
    plugin = Plugin(tmp_path / "bin", [{"status": {"token": "beta"}}], version=V1BETA1)
    cfg = exec_config(tmp_path, {"apiVersion": V1BETA1, "command": "bin/plugin", "provideClusterInfo": True},
                      server="https://eks.example:443", cluster={
                          "certificate-authority-data": b64(pki[0]),
                          "extensions": [{"name": "client.authentication.k8s.io/exec",
                                          "extension": {"region": "eu-west-1"}}]})
    assert kubeconfig.load(str(cfg)).auth().token == "beta"
    info = json.loads(plugin.runs[0]["info"])
    assert info["apiVersion"] == V1BETA1 and info["spec"]["interactive"] is False
    assert info["spec"]["cluster"] == {"server": "https://eks.example:443", "certificate-authority-data": b64(pki[0]),
                                       "config": {"region": "eu-west-1"}}


def test_exec_plugin_client_certificate(tmp_path: pathlib.Path, pki: tuple[pathlib.Path, pathlib.Path]) -> None:
    cert, key = pki
    Plugin(tmp_path / "bin", [{"status": {"clientCertificateData": cert.read_text(),
                                          "clientKeyData": key.read_text()}}])
    creds = kubeconfig.load(str(exec_config(tmp_path, {"apiVersion": V1, "command": "bin/plugin",
                                                       "interactiveMode": "IfAvailable"})))
    auth = creds.auth()
    assert auth.token is None and auth.cert_file and auth.key_file and auth.refresh_at is None
    assert pathlib.Path(auth.cert_file).read_bytes() == cert.read_bytes()
    assert pathlib.Path(auth.key_file).read_bytes() == key.read_bytes()
    assert pathlib.Path(auth.key_file).stat().st_mode & 0o777 == 0o600
    apply.tls_context(creds, auth)


def test_exec_credentials_are_renewed_shortly_before_they_expire(tmp_path: pathlib.Path) -> None:
    now = time.time()
    plugin = Plugin(tmp_path / "bin", [{"status": {"token": "long", "expirationTimestamp": iso(now + 3600)}}])
    creds = kubeconfig.load(str(exec_config(tmp_path, plugin_user(plugin))))
    assert creds.auth().refresh_at == pytest.approx(now + 3600 - kubeconfig.REFRESH_BEFORE_S, abs=0.01)
    # Short-lived ones are renewed at half their life at the latest: 4 s -> about 2 s after they were fetched.
    plugin = Plugin(tmp_path / "short" / "bin", [
        {"status": {"token": f"short-{i}", "expirationTimestamp": iso(time.time() + 4 + 4 * i)}} for i in range(2)])
    t0 = time.time()
    short = kubeconfig.load(str(exec_config(tmp_path / "short", plugin_user(plugin))))
    first = short.auth()
    assert first.token == "short-0" and first.refresh_at is not None and t0 < first.refresh_at < t0 + 2.1
    assert short.auth() is first
    time.sleep(max(first.refresh_at - time.time(), 0) + 0.05)
    assert short.auth().token == "short-1"
    assert len(plugin.runs) == 2


class FakeApi:
    """An HTTPS API server that answers 200 to the tokens in ``accept`` (any when None) and 401 otherwise; with
    ``client_ca`` it requires a client certificate signed by it and reports its serial number."""

    def __init__(self, pki: tuple[pathlib.Path, pathlib.Path], client_ca: pathlib.Path | None = None) -> None:
        self.accept: set[str] | None = None
        self.seen: list[str | None] = []
        api = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                auth = self.headers.get("Authorization")
                api.seen.append(auth)
                ok = api.accept is None or (auth or "").removeprefix("Bearer ") in api.accept
                peer = self.connection.getpeercert() if client_ca else None     # type: ignore[attr-defined]
                body = json.dumps({"auth": auth, "serial": peer and peer["serialNumber"]} if ok else {
                    "kind": "Status", "status": "Failure", "reason": "Unauthorized", "code": 401}).encode()
                self.send_response(200 if ok else 401)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(*pki)
        if client_ca:
            ctx.verify_mode = ssl.CERT_REQUIRED
            ctx.load_verify_locations(cafile=str(client_ca))
        self.server.socket = ctx.wrap_socket(self.server.socket, server_side=True)
        self.url = f"https://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture()
def fake_api(pki: tuple[pathlib.Path, pathlib.Path]) -> Iterator[FakeApi]:
    api = FakeApi(pki)
    yield api
    api.close()


def test_a_401_runs_the_plugin_again_once(tmp_path: pathlib.Path, fake_api: FakeApi,
                                          pki: tuple[pathlib.Path, pathlib.Path]) -> None:
    plugin = Plugin(tmp_path / "bin", [{"status": {"token": "tok-0"}}, {"status": {"token": "tok-1"}},
                                       {"status": {"token": "tok-2"}}, {"status": {"token": "tok-2"}}])
    cfg = exec_config(tmp_path, plugin_user(plugin), server=fake_api.url,
                      cluster={"certificate-authority-data": b64(pki[0])})
    cluster = apply.Cluster(apply.load_credentials(str(cfg)), pool_size=8)
    fake_api.accept = {"tok-1"}                   # the cached token was revoked: every thread sees a 401 at once
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        got = list(pool.map(lambda _: cluster.request("GET", "/api/v1/namespaces"), range(8)))
    assert {g["auth"] for g in got if g} == {"Bearer tok-1"}
    assert len(plugin.runs) == 2, "one run at load, one after the 401s (the other threads took its answer)"
    fake_api.accept = {"never"}                   # fresh credentials refused too: one more run, then a clear error
    with pytest.raises(apply.ApiError, match=r"HTTP 401: .*fresh credentials from .*users\[u\]\.exec refused too"):
        cluster.request("GET", "/api/v1/namespaces")
    assert len(plugin.runs) == 3 and fake_api.seen[-2:] == ["Bearer tok-1", "Bearer tok-2"]
    with pytest.raises(apply.ApiError, match=r"HTTP 401: .*users\[u\]\.exec gave no other credentials"):
        cluster.request("GET", "/api/v1/namespaces")          # the plugin prints the refused token again
    assert len(plugin.runs) == 4 and fake_api.seen[-1] == "Bearer tok-2"


def test_a_static_token_refused_is_an_error_at_once(tmp_path: pathlib.Path, fake_api: FakeApi,
                                                   pki: tuple[pathlib.Path, pathlib.Path]) -> None:
    cfg = write(tmp_path / "config",
                clusters={"c": {"server": fake_api.url, "certificate-authority-data": b64(pki[0])}},
                users={"u": {"token": "static"}}, contexts={"ctx": {"cluster": "c", "user": "u"}})
    fake_api.accept = {"other"}
    with pytest.raises(apply.ApiError, match="HTTP 401: {"):
        apply.Cluster(apply.load_credentials(str(cfg)), pool_size=2).request("GET", "/version")
    assert fake_api.seen == ["Bearer static"]


def _client_pki(directory: pathlib.Path, names: Sequence[str]) -> tuple[pathlib.Path, dict[str, tuple[str, str, int]]]:
    """A CA and client certificates signed by it: the CA's path and, per name, (cert PEM, key PEM, serial)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = dt.datetime.now(dt.timezone.utc)

    def cert(subject: str, key: Any, issuer: str, signer: Any, ca: bool) -> Any:
        b = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
             .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)])).public_key(key.public_key())
             .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=5))
             .not_valid_after(now + dt.timedelta(days=1))
             .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
        if not ca:
            b = b.add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        return b.sign(signer, hashes.SHA256())

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = directory / "client-ca.crt"
    ca.write_bytes(cert("client-ca", ca_key, "client-ca", ca_key, True).public_bytes(serialization.Encoding.PEM))
    out = {}
    for name in names:
        key = ec.generate_private_key(ec.SECP256R1())
        c = cert(name, key, "client-ca", ca_key, False)
        out[name] = (c.public_bytes(serialization.Encoding.PEM).decode(), key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()).decode(),
            c.serial_number)
    return ca, out


def test_a_renewed_client_certificate_gets_a_pool_of_its_own(tmp_path: pathlib.Path,
                                                             pki: tuple[pathlib.Path, pathlib.Path]) -> None:
    ca, certs = _client_pki(tmp_path, ["first", "second"])
    api = FakeApi(pki, client_ca=ca)
    try:
        plugin = Plugin(tmp_path / "bin", [
            {"status": {"clientCertificateData": certs["first"][0], "clientKeyData": certs["first"][1],
                        "expirationTimestamp": iso(time.time() + 15)}},   # 15 s: 4 ran out under load before the first request
            {"status": {"clientCertificateData": certs["second"][0], "clientKeyData": certs["second"][1]}}])
        cfg = exec_config(tmp_path, plugin_user(plugin), server=api.url,
                          cluster={"certificate-authority-data": b64(pki[0])})
        cluster = apply.Cluster(apply.load_credentials(str(cfg)), pool_size=2)
        got = cluster.request("GET", "/version")
        assert got and int(got["serial"], 16) == certs["first"][2] and got["auth"] is None
        first = cluster._session()[0]
        assert first is not None and first.refresh_at is not None
        time.sleep(max(first.refresh_at - time.time(), 0) + 0.05)
        got = cluster.request("GET", "/version")
        assert got and int(got["serial"], 16) == certs["second"][2]
        assert len(plugin.runs) == 2 and pathlib.Path(first.cert_file or "").is_file()   # kept one generation
    finally:
        api.close()


@pytest.mark.parametrize("step,message", [
    ({"raw": "<html>login page</html>"}, r"printed no ExecCredential \(not JSON: '<html>login page"),
    ({"raw": json.dumps({"kind": "Config"})}, r"printed no ExecCredential \(kind: 'Config'\)"),
    ({"status": {"token": "t"}, "apiVersion": V1BETA1}, r"printed apiVersion '.*/v1beta1'; .*exec\.apiVersion asks"),
    ({"raw": json.dumps({"apiVersion": V1, "kind": "ExecCredential"})}, "an ExecCredential without status"),
    ({"status": {}}, "neither status.token nor status.clientCertificateData/clientKeyData"),
    ({"status": {"clientCertificateData": "-----BEGIN CERTIFICATE-----"}}, "only one of status.clientCertificateData"),
    ({"status": {"clientCertificateData": "x", "clientKeyData": "y"}}, "do not load as a pair"),
    ({"status": {"token": "t", "expirationTimestamp": "tomorrow"}}, "expirationTimestamp that is not RFC 3339"),
    ({"status": {"token": 7}}, "status.token that is not a string"),
    ({"exit": 1, "stderr": "error: SSO session expired; run aws sso login"},
     r"failed \(exit status 1\): error: SSO session expired"),
])
def test_a_broken_plugin_answer_is_a_clear_error(tmp_path: pathlib.Path, step: dict[str, Any], message: str) -> None:
    plugin = Plugin(tmp_path / "bin", [step])
    with pytest.raises(kubeconfig.ConfigError, match=r"users\[u\]\.exec: .*" + message):
        kubeconfig.load(str(exec_config(tmp_path, plugin_user(plugin))))


def test_a_hanging_plugin_is_killed_with_what_it_started(tmp_path: pathlib.Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    # 5 s, not 1: the plugin (a Python script) must have started its child before the deadline for the test to see
    # that child killed, and a loaded machine took more than 1 s to start it (failed once beside the suites); it
    # sleeps 60 s, so the deadline still ends the wait
    monkeypatch.setattr(kubeconfig, "EXEC_TIMEOUT_S", 5.0)
    plugin = Plugin(tmp_path / "bin", [{"orphan": True, "sleep": 60, "status": {"token": "late"}}])
    t0 = time.monotonic()
    with pytest.raises(kubeconfig.ConfigError,
                       match=r"users\[u\]\.exec: .* did not answer within 5 s \(killed with what"):
        kubeconfig.load(str(exec_config(tmp_path, plugin_user(plugin))))
    assert time.monotonic() - t0 < 20
    orphan = int((plugin.dir / "orphan.pid").read_text())
    deadline = time.monotonic() + 5
    while pathlib.Path(f"/proc/{orphan}").exists() and "Z" not in _state(orphan) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not pathlib.Path(f"/proc/{orphan}").exists() or "Z" in _state(orphan), "the plugin's child survived"


def test_an_exiting_plugin_whose_child_holds_stdout_does_not_hang(tmp_path: pathlib.Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    # 5 s, not 1: the plugin (a Python script) must have started and exited before the deadline for the message
    # to say so, and a loaded machine took more than 1 s to start it (seen once in make test); its child holds the
    # pipe for 60 s, so the deadline still ends the wait
    monkeypatch.setattr(kubeconfig, "EXEC_TIMEOUT_S", 5.0)
    plugin = Plugin(tmp_path / "bin", [{"orphan": True, "status": {"token": "t"}}])
    t0 = time.monotonic()
    with pytest.raises(kubeconfig.ConfigError, match="exited, but a process it started kept its output open within"):
        kubeconfig.load(str(exec_config(tmp_path, plugin_user(plugin))))
    assert time.monotonic() - t0 < 20


def _state(pid: int) -> str:
    try:
        return pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "Z"


def test_a_missing_plugin_names_the_field_and_its_install_hint(tmp_path: pathlib.Path) -> None:
    hint = "Install it with: kubeforge-setup --plugin"
    cfg = exec_config(tmp_path, {"apiVersion": V1, "command": "kubeforge-test-no-such-plugin",
                                 "interactiveMode": "Never", "installHint": hint})
    with pytest.raises(kubeconfig.ConfigError, match=r"users\[u\]\.exec\.command: Not found: "
                       r"'kubeforge-test-no-such-plugin' .*installHint: Install it with: kubeforge-setup --plugin"):
        kubeconfig.load(str(cfg))
    script = tmp_path / "not-executable"
    script.write_text("#!/bin/sh\n")
    with pytest.raises(kubeconfig.ConfigError, match=r"users\[u\]\.exec\.command: .* cannot run: .*Permission"):
        kubeconfig.load(str(exec_config(tmp_path / "x", {"apiVersion": V1, "command": str(script),
                                                         "interactiveMode": "Never"})))


@pytest.mark.parametrize("exec_,field", [
    ({"apiVersion": V1}, "exec.command: Required value"),
    ({"command": "aws"}, "exec.apiVersion: Required value"),
    ({"command": "aws", "apiVersion": "client.authentication.k8s.io/v1alpha1"}, "exec.apiVersion: Unsupported"),
    ({"command": "aws", "apiVersion": V1}, "exec.interactiveMode: Required value"),
    ({"command": "aws", "apiVersion": V1, "interactiveMode": "Always"}, "exec.interactiveMode: .*no terminal"),
    ({"command": "aws", "apiVersion": V1BETA1, "env": [{"value": "x"}]}, r"exec.env\[0\].name: Required value"),
    ({"command": "aws", "apiVersion": V1BETA1, "args": "--region eu"}, "exec.args: Invalid value"),
])
def test_invalid_exec_configs_are_refused_before_running(tmp_path: pathlib.Path, exec_: dict[str, Any],
                                                         field: str) -> None:
    with pytest.raises(kubeconfig.ConfigError, match=r"users\[u\]\." + field):
        kubeconfig.load(str(exec_config(tmp_path, exec_)))


def test_a_token_file_is_read_again_when_it_changes(tmp_path: pathlib.Path, fake_api: FakeApi,
                                                    pki: tuple[pathlib.Path, pathlib.Path]) -> None:
    """As a kubelet rotates a projected service account token: the new file swapped in by a symlink."""
    tokens = tmp_path / "tokens"
    tokens.mkdir()
    (tokens / "a").write_text("token-a\n")
    link = tmp_path / "token"
    link.symlink_to(tokens / "a")
    cfg = write(tmp_path / "config",
                clusters={"c": {"server": fake_api.url, "certificate-authority-data": b64(pki[0])}},
                users={"u": {"tokenFile": "token"}}, contexts={"ctx": {"cluster": "c", "user": "u"}})
    creds = apply.load_credentials(str(cfg))
    cluster = apply.Cluster(creds, pool_size=2)
    assert cluster.request("GET", "/version") == {"auth": "Bearer token-a", "serial": None}
    (tokens / "b").write_text("token-b\n")
    (tmp_path / "token.new").symlink_to(tokens / "b")
    (tmp_path / "token.new").replace(link)
    assert cluster.request("GET", "/version") == {"auth": "Bearer token-b", "serial": None}
    assert creds.token == "token-a"                   # the value at load; auth() is what requests present
    # Rewritten in place with the same size and mtime, the change goes unseen until the API server refuses it.
    before = (tokens / "b").stat()
    (tokens / "b").write_text("token-c\n")
    os.utime(tokens / "b", ns=(before.st_atime_ns, before.st_mtime_ns))
    fake_api.accept = {"token-c"}
    assert cluster.request("GET", "/version") == {"auth": "Bearer token-c", "serial": None}
    assert fake_api.seen[-2:] == ["Bearer token-b", "Bearer token-c"]
    (tmp_path / "token").unlink()                     # gone for a moment: the last token read stands
    assert creds.auth().token == "token-c"


def test_token_file_wins_over_token_while_readable(tmp_path: pathlib.Path) -> None:
    (tmp_path / "token").write_text("from-file\n")
    cfg = write(tmp_path / "config", clusters={"c": {"server": "https://h:1"}},
                users={"u": {"token": "inline", "tokenFile": "token"}}, contexts={"ctx": {"cluster": "c", "user": "u"}})
    assert kubeconfig.load(str(cfg)).auth().token == "from-file"
    (tmp_path / "token").unlink()
    assert kubeconfig.load(str(cfg)).auth().token == "inline"


def test_the_pods_token_is_read_again_when_rotated(tmp_path: pathlib.Path) -> None:
    account = tmp_path / "sa"
    account.mkdir()
    (account / "token").write_text("first\n")
    env = {"HOME": str(tmp_path), "KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    creds = kubeconfig.load(environ=env, account=account)
    (account / "token.new").write_text("second, a bit longer\n")
    (account / "token.new").replace(account / "token")
    assert (creds.token, creds.auth().token) == ("first", "second, a bit longer")


def test_kopf_login_hands_out_current_credentials_and_fresh_ones_when_asked_again(tmp_path: pathlib.Path) -> None:
    """kopf asks its login handler again when the credentials it has expire and after a 401: the plugin's expiry
    becomes kopf's ``expiration``; asked again while they are current, the plugin runs again."""
    expires = time.time() + 3600
    plugin = Plugin(tmp_path / "bin", [{"status": {"token": f"tok-{i}", "expirationTimestamp": iso(expires)}}
                                       for i in range(3)])
    creds = kubeconfig.load(str(exec_config(tmp_path, plugin_user(plugin))))
    login = _login_handler(creds)
    first = login()
    assert first.token == "tok-0" and first.scheme == "Bearer"
    assert first.expiration == dt.datetime.fromtimestamp(expires - kubeconfig.REFRESH_BEFORE_S, dt.timezone.utc)
    assert login().token == "tok-1" and len(plugin.runs) == 2      # asked again: the token was refused
    static = kubeconfig.load(str(write(tmp_path / "static", clusters={"c": {"server": "https://h:1"}},
                                       users={"u": {"token": "s"}}, contexts={"ctx": {"cluster": "c", "user": "u"}})))
    login = _login_handler(static)
    assert login() == login() and login().expiration is None       # nothing new: kopf gives up, as before


def _login_handler(creds: kubeconfig.Credentials) -> Any:
    from kopf._core.intents.causes import Activity

    from kubeforge.operator import handlers

    reg = handlers.build_registry(None, creds)  # type: ignore[arg-type]
    [handler] = reg._activities.get_handlers(activity=Activity.AUTHENTICATION)
    return handler.fn
