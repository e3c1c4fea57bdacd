"""The operator's credentials against the real kube-apiserver: kubeconfigs whose user is an exec credential plugin
(a script written here, as ``aws eks get-token`` or ``gke-gcloud-auth-plugin`` would be) or a ``tokenFile``.

The tokens are real: the plugin asks the TokenRequest API (with the admin kubeconfig) for a token of a
ServiceAccount bound to cluster-admin, each bound to a Secret of its own, so deleting that Secret revokes the
token (the API server answers 401 once its token cache, 10 s, has let it go). The certificate plugin hands out the
admin kubeconfig's client certificate. The operator runs as a host process because kubeconfig credentials are what
an operator outside the cluster uses (in a pod it uses its ServiceAccount's token), and this kwok-tier suite has no
node that runs containers.

```
 exec token plugin ─▶ apply.Cluster: apply, list, whoami ── revoke ──▶ 401 ─▶ plugin again ─▶ whoami
 exec cert plugin  ─▶ apply.Cluster: whoami (the admin's certificate)
 tokenFile         ─▶ whoami ── file swapped, old token revoked ──▶ whoami ok (the file read again)
 exec token plugin ─▶ kubeforge operator --leader-elect: Lease held, RLJob reconciled (kopf's watch, SSA, status)
```
"""
from __future__ import annotations

import base64
import json
import pathlib
import ssl
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from kfcluster import harness
from kfcluster.harness import wait

from kubeforge.operator import apply, kubeconfig  # noqa: E402

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]
SA = "kubeforge-credentials"
V1 = "client.authentication.k8s.io/v1"
WHOAMI = "/apis/authentication.k8s.io/v1/selfsubjectreviews"

# Each run: a Secret of its own, then a token bound to it (TokenRequest), printed as an ExecCredential.
TOKEN_PLUGIN = """#!{python}
import json, os, pathlib, subprocess, sys
runs = pathlib.Path(os.environ["KF_RUNS"])
n = len(runs.read_text().splitlines()) if runs.exists() else 0
with runs.open("a") as f:
    f.write(os.environ.get("KUBERNETES_EXEC_INFO", "") + "\\n")
ns, secret = os.environ["KF_NAMESPACE"], f"{{os.environ['KF_PREFIX']}}-{{n}}"
kubectl = [os.environ["KF_KUBECTL"], "--kubeconfig", os.environ["KF_ADMIN"]]
subprocess.run(kubectl + ["create", "secret", "generic", secret, "-n", ns], check=True, stdout=subprocess.DEVNULL)
uid = subprocess.run(kubectl + ["get", "secret", secret, "-n", ns, "-o", "jsonpath={{.metadata.uid}}"], check=True,
                     capture_output=True, text=True).stdout
request = {{"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {{
    "expirationSeconds": 600, "boundObjectRef": {{"apiVersion": "v1", "kind": "Secret", "name": secret, "uid": uid}}}}}}
path = f"/api/v1/namespaces/{{ns}}/serviceaccounts/{sa}/token"
out = subprocess.run(kubectl + ["create", "--raw", path, "-f", "-"], input=json.dumps(request), check=True,
                     capture_output=True, text=True).stdout
status = json.loads(out)["status"]
print(json.dumps({{"apiVersion": "{v1}", "kind": "ExecCredential",
                  "status": {{"token": status["token"], "expirationTimestamp": status["expirationTimestamp"]}}}}))
"""

CERT_PLUGIN = """#!{python}
import json, pathlib
print(json.dumps({{"apiVersion": "{v1}", "kind": "ExecCredential", "status": {{
    "clientCertificateData": pathlib.Path({cert!r}).read_text(),
    "clientKeyData": pathlib.Path({key!r}).read_text()}}}}))
"""


class Account:
    """A namespace with a ServiceAccount bound to cluster-admin, and the admin kubeconfig's server and CA."""

    def __init__(self, cluster: Any, k: harness.K, ns: str, workdir: pathlib.Path) -> None:
        self.cluster, self.k, self.ns, self.dir = cluster, k, ns, workdir
        self.admin = kubeconfig.load(cluster.kubeconfig)

    def kubeconfig(self, name: str, user: dict[str, Any]) -> str:
        """A kubeconfig for the test cluster whose user is ``user``."""
        entry: dict[str, Any] = {"server": self.admin.server}
        if self.admin.ca_file:
            entry["certificate-authority-data"] = base64.b64encode(
                pathlib.Path(self.admin.ca_file).read_bytes()).decode()
        else:
            entry["insecure-skip-tls-verify"] = not self.admin.verify
        doc = {"apiVersion": "v1", "kind": "Config", "current-context": "kf",
               "clusters": [{"name": "kf", "cluster": entry}], "users": [{"name": name, "user": user}],
               "contexts": [{"name": "kf", "context": {"cluster": "kf", "user": name}}]}
        path = self.dir / f"{name}.kubeconfig"
        path.write_text(yaml.safe_dump(doc))
        return str(path)

    def token_plugin(self, name: str) -> tuple[str, pathlib.Path]:
        """A kubeconfig whose user runs the token plugin (its settings through ``exec.env``), and its run log."""
        script = self.dir / f"{name}-plugin"
        script.write_text(TOKEN_PLUGIN.format(python=sys.executable, sa=SA, v1=V1))
        script.chmod(0o755)
        runs = self.dir / f"{name}-runs"
        env = {"KF_RUNS": str(runs), "KF_NAMESPACE": self.ns, "KF_PREFIX": name, "KF_KUBECTL": self.k.kubectl,
               "KF_ADMIN": self.cluster.kubeconfig}
        return self.kubeconfig(name, {"exec": {
            "apiVersion": V1, "command": str(script), "interactiveMode": "Never",
            "env": [{"name": k, "value": v} for k, v in env.items()],
            "installHint": "written by e2e/test_kubeconfig_credentials.py"}}), runs

    def token(self, secret: str) -> str:
        """A token of the ServiceAccount bound to a new Secret ``secret`` (deleting it revokes the token)."""
        self.k.run("create", "secret", "generic", secret, "-n", self.ns)
        uid = self.k.get("secret", secret, "-n", self.ns)["metadata"]["uid"]
        request = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {
            "expirationSeconds": 600, "boundObjectRef": {"apiVersion": "v1", "kind": "Secret", "name": secret,
                                                         "uid": uid}}}
        out = self.k.run("create", "--raw", f"/api/v1/namespaces/{self.ns}/serviceaccounts/{SA}/token", "-f", "-",
                         stdin=json.dumps(request)).stdout
        return str(json.loads(out)["status"]["token"])

    def revoke(self, secret: str, token: str) -> None:
        """Delete the Secret ``token`` is bound to and wait until the API server refuses it."""
        self.k.run("delete", "secret", secret, "-n", self.ns)
        wait(f"the token bound to {secret} refused", lambda: self.status_of(token) == 401, timeout_s=60,
             interval_s=1)

    def status_of(self, token: str) -> int:
        """The HTTP status of a whoami with ``token`` (outside the operator's client)."""
        ctx = ssl.create_default_context(cafile=self.admin.ca_file) if self.admin.verify else \
            ssl._create_unverified_context()
        req = urllib.request.Request(self.admin.server + WHOAMI, method="POST", data=json.dumps(
            {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}).encode(),
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, context=ctx, timeout=10) as resp:
                return int(resp.status)
        except urllib.error.HTTPError as exc:
            return int(exc.code)


@pytest.fixture(scope="module")
def account(kube_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Account]:
    k = harness.K(kubectl=kube_cluster.kubectl.binary, kubeconfig=kube_cluster.kubeconfig)
    ns = k.namespace(f"kcfg-{uuid.uuid4().hex[:6]}")
    binding = f"{ns}-{SA}"
    k.run("create", "serviceaccount", SA, "-n", ns)
    k.run("create", "clusterrolebinding", binding, "--clusterrole=cluster-admin", f"--serviceaccount={ns}:{SA}")
    try:
        yield Account(kube_cluster, k, ns, tmp_path_factory.mktemp("credentials"))
    finally:
        k.run("delete", "clusterrolebinding", binding, check=False)
        k.run("delete", "namespace", ns, "--wait=false", check=False)


def whoami(cluster: apply.Cluster) -> str:
    review = cluster.request("POST", WHOAMI, body={"apiVersion": "authentication.k8s.io/v1",
                                                   "kind": "SelfSubjectReview"}) or {}
    return str(review["status"]["userInfo"]["username"])


def runs(log: pathlib.Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def test_exec_plugin_token_applies_lists_and_is_renewed_after_revocation(account: Account) -> None:
    cfg, log = account.token_plugin("exec")
    creds = apply.load_credentials(cfg)
    cluster = apply.Cluster(creds, pool_size=4)
    assert whoami(cluster) == f"system:serviceaccount:{account.ns}:{SA}"
    assert runs(log) == [{"apiVersion": V1, "kind": "ExecCredential", "spec": {"interactive": False}}]
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "from-exec", "namespace": account.ns},
          "data": {"by": "exec plugin"}}
    assert (cluster.apply(cm) or {})["data"] == {"by": "exec plugin"}
    listed = cluster.request("GET", f"/api/v1/namespaces/{account.ns}/configmaps") or {}
    assert "from-exec" in {item["metadata"]["name"] for item in listed["items"]}
    assert cluster.list_pods(account.ns, "nothing") == []
    first = creds.auth()
    assert first.token and first.refresh_at and first.refresh_at > time.time() + 500   # ~10 min, renewed 30 s early
    account.revoke("exec-0", first.token)
    assert whoami(cluster) == f"system:serviceaccount:{account.ns}:{SA}"       # 401, plugin again, same request ok
    assert len(runs(log)) == 2 and creds.auth().token != first.token


def test_exec_plugin_client_certificate(account: Account) -> None:
    admin = account.admin
    if not admin.cert_file or not admin.key_file:
        pytest.skip("the test cluster's kubeconfig authenticates without a client certificate")
    script = account.dir / "cert-plugin"
    script.write_text(CERT_PLUGIN.format(python=sys.executable, v1=V1, cert=admin.cert_file, key=admin.key_file))
    script.chmod(0o755)
    cfg = account.kubeconfig("cert", {"exec": {"apiVersion": V1, "command": str(script), "interactiveMode": "Never"}})
    cluster = apply.Cluster(apply.load_credentials(cfg), pool_size=2)
    assert not whoami(cluster).startswith("system:serviceaccount:")      # the admin's certificate, no token
    assert cluster.request("GET", f"/api/v1/namespaces/{account.ns}") is not None


def test_token_file_is_read_again_when_rotated(account: Account) -> None:
    token_file = account.dir / "token"
    old = account.token("file-0")
    token_file.write_text(old + "\n")
    cluster = apply.Cluster(apply.load_credentials(account.kubeconfig("file", {"tokenFile": str(token_file)})),
                            pool_size=2)
    assert whoami(cluster) == f"system:serviceaccount:{account.ns}:{SA}"
    new = account.token("file-1")
    swap = account.dir / "token.new"
    swap.write_text(new + "\n")
    swap.replace(token_file)                                    # as a kubelet rotates a projected token
    account.revoke("file-0", old)
    assert whoami(cluster) == f"system:serviceaccount:{account.ns}:{SA}"


def test_operator_runs_on_an_exec_plugin_kubeconfig(account: Account, tmp_path: pathlib.Path) -> None:
    """The whole operator on exec credentials: its leader election (apply.Cluster), kopf's watches (the login
    handler) and its reconcile (SSA of the children, the status write)."""
    k, ns = account.k, account.ns
    k.ensure_crd()
    cfg, log = account.token_plugin("operator")
    op = harness.Operator(kubeconfig=cfg, log_path=tmp_path / "operator.log", extra=(
        "--namespace", ns, "--no-webhook", "--leader-elect", "--leader-namespace", ns, "--leader-lease", "kcfg"),
        env={"POD_NAME": "kcfg-op"}).start()
    try:
        doc = yaml.safe_load((harness.ROOT / "examples" / "tiny.yaml").read_text())
        doc["metadata"]["namespace"] = ns
        k.apply(doc)
        wait("the RLJob's status written", lambda: k.get("rljob", "tiny", "-n", ns).get("status", {}).get("phase"),
             timeout_s=90)
        assert k.items("statefulsets", ns, "kubeforge.dev/job=tiny"), "no StatefulSet applied"
        holder = k.get("lease", "kcfg", "-n", ns)["spec"]["holderIdentity"]
        assert holder.startswith("kcfg-op_")
        assert len(runs(log)) == 1, "the leader election and the operator share one plugin run"
    finally:
        op.stop()
        k.run("delete", "rljob", "tiny", "-n", ns, "--wait=false", check=False)
