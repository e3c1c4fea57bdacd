"""The operator's credentials (``kubeconfig``): kubeconfig forms, merging, the pod's account, clear refusals; one
TLS context per pool that really verifies the server; the operator process never imports the Kubernetes client."""
from __future__ import annotations

import base64
import http.server
import json
import os
import pathlib
import ssl
import subprocess
import sys
import threading
from collections.abc import Iterator
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
