"""Which of the operator's credential behaviours (tests/operator/test_kubeconfig.py) lightkube's own kubeconfig
loading gives, checked against lightkube itself (issue 38 item 5; figures in docs/operator.md).

    uv pip install lightkube            # in a separate venv: the project does not depend on it
    python bench/probes/lightkube_auth_probe.py

Each check builds a ``lightkube.Client`` from a kubeconfig dict with an in-memory transport that answers like an
API server (a GET of a ConfigMap; 401 unless the bearer token is the expected one), and prints one line:
``<behaviour>: yes|no (<what happened>)``. No cluster, no network.
"""
from __future__ import annotations

import importlib.metadata
import json
import os
import pathlib
import stat
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx2
import lightkube
from lightkube.config.kubeconfig import KubeConfig
from lightkube.resources.core_v1 import ConfigMap

CM = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x", "namespace": "default"}}


def client(user: dict[str, Any], good: Callable[[str], bool], seen: list[str]) -> lightkube.Client:
    def answer(req: httpx2.Request) -> httpx2.Response:
        token = req.headers.get("Authorization", "").removeprefix("Bearer ")
        seen.append(token)
        if good(token):
            return httpx2.Response(200, json=CM)
        return httpx2.Response(401, json={"kind": "Status", "apiVersion": "v1", "code": 401,
                                          "message": "Unauthorized", "status": "Failure"})

    cfg = KubeConfig.from_dict({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": "https://api.invalid"}}],
        "users": [{"name": "u", "user": user}], "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]})
    return lightkube.Client(config=cfg, transport=httpx2.MockTransport(answer), trust_env=False)


def plugin(tmp: pathlib.Path, name: str, body: str) -> str:
    path = tmp / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def cred(api: str, status: dict[str, Any]) -> str:
    return json.dumps({"apiVersion": api, "kind": "ExecCredential", "status": status})


def check(name: str, fn: Callable[[], str]) -> None:
    try:
        print(f"{name}: {fn()}", flush=True)
    except Exception as exc:  # noqa: BLE001 - the probe reports what lightkube raised
        print(f"{name}: no ({type(exc).__name__}: {str(exc)[:160]})", flush=True)


def main() -> int:
    print(f"lightkube {importlib.metadata.version('lightkube')}", flush=True)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="lk-probe-"))
    v1, v1b1 = "client.authentication.k8s.io/v1", "client.authentication.k8s.io/v1beta1"

    def exec_user(cmd: str, api: str) -> dict[str, Any]:
        return {"exec": {"apiVersion": api, "command": cmd, "interactiveMode": "Never"}}

    def token_plugin(api: str) -> str:
        seen: list[str] = []
        cmd = plugin(tmp, f"tok-{api.rsplit('/', 1)[1]}", f"echo '{cred(api, {'token': 'T1'})}'\n")
        client(exec_user(cmd, api), lambda t: t == "T1", seen).get(ConfigMap, "x", namespace="default")
        return f"yes (token sent: {seen[-1]})"

    check("exec plugin, apiVersion v1beta1, token", lambda: token_plugin(v1b1))
    check("exec plugin, apiVersion v1 (the GA one), token", lambda: token_plugin(v1))

    def exec_info() -> str:
        out = tmp / "info.json"
        body = f"printf '%s' \"$KUBERNETES_EXEC_INFO\" > {out}\necho '{cred(v1b1, {'token': 'T1'})}'\n"
        cmd = plugin(tmp, "info", body)
        client(exec_user(cmd, v1b1), lambda t: t == "T1", []).get(ConfigMap, "x", namespace="default")
        got = out.read_text()
        return f"yes ({got[:80]})" if got else "no (KUBERNETES_EXEC_INFO not set)"

    check("exec plugin gets KUBERNETES_EXEC_INFO", exec_info)

    def exec_cert() -> str:
        status = {"clientCertificateData": "-----BEGIN CERTIFICATE-----\n", "clientKeyData": "-----BEGIN KEY-----\n"}
        cmd = plugin(tmp, "cert", f"cat <<'END'\n{cred(v1b1, status)}\nEND\n")
        client(exec_user(cmd, v1b1), lambda t: True, []).get(ConfigMap, "x", namespace="default")
        return "yes"

    check("exec plugin answering with a client certificate", exec_cert)

    def renew_before_expiry() -> str:
        count = tmp / "count"
        soon = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 1))
        body = (f"echo x >> {count}\nn=$(wc -l < {count})\n"
                f"echo '{{\"apiVersion\":\"{v1b1}\",\"kind\":\"ExecCredential\",\"status\":{{\"token\":\"T'$n'\","
                f"\"expirationTimestamp\":\"{soon}\"}}}}'\n")
        cmd = plugin(tmp, "expiring", body)
        seen: list[str] = []
        c = client(exec_user(cmd, v1b1), lambda t: True, seen)
        c.get(ConfigMap, "x", namespace="default")
        time.sleep(2.0)
        c.get(ConfigMap, "x", namespace="default")
        runs = len(count.read_text().splitlines())
        return (f"yes (plugin ran {runs}x; tokens {seen})" if runs > 1
                else f"no (credential expired 1 s after issue; plugin ran {runs}x, tokens sent {seen})")

    check("exec credential renewed when its expirationTimestamp passes", renew_before_expiry)

    def hanging() -> str:
        cmd = plugin(tmp, "hang", "sleep 30\n")
        t0 = time.monotonic()
        box: list[str] = []
        th = threading.Thread(target=lambda: check_quiet(cmd, box), daemon=True)
        th.start()
        th.join(12)
        if th.is_alive():
            return f"no (still waiting on the plugin after {time.monotonic() - t0:.0f} s; no timeout)"
        return f"yes ({box})"

    def check_quiet(cmd: str, box: list[str]) -> None:
        try:
            client(exec_user(cmd, v1b1), lambda t: True, []).get(ConfigMap, "x", namespace="default")
            box.append("answered")
        except Exception as exc:  # noqa: BLE001
            box.append(repr(exc)[:120])

    check("a plugin that never answers is bounded", hanging)

    def missing() -> str:
        user = exec_user("kf-no-such-plugin", v1b1)
        user["exec"]["installHint"] = "install kf-no-such-plugin"
        client(user, lambda t: True, []).get(ConfigMap, "x", namespace="default")
        return "yes"

    check("a missing plugin named with its installHint", missing)

    def token_file(name: str, *, old_refused: bool) -> str:
        """The file rotated in place; the old token still valid for a while (as the kubelet does), or refused."""
        tf = tmp / name
        tf.write_text("A")
        seen: list[str] = []
        current = {"tok": "A"}
        c = client({"tokenFile": str(tf)}, lambda t: t == current["tok"], seen)
        c.get(ConfigMap, "x", namespace="default")
        tf.write_text("B")
        if old_refused:
            current["tok"] = "B"
        c.get(ConfigMap, "x", namespace="default")
        return f"yes (sent {seen})" if seen[-1] == "B" else f"no: the old token was sent after the rotation ({seen})"

    check("token file re-read when rotated (before any 401)", lambda: token_file("token", old_refused=False))
    check("token file re-read after a 401", lambda: token_file("token2", old_refused=True))
    return 0


if __name__ == "__main__":
    os.environ.pop("KUBECONFIG", None)
    sys.exit(main())
