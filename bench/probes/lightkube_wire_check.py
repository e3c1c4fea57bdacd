"""Does bench/probes/lightkube_cluster.py send the same requests as apply.Cluster? Both make every verb's call
against a local HTTP server that records method, path, query, content type and body; the differences are printed.

    PYTHONPATH=bench/probes:api:operator:runtime python bench/probes/lightkube_wire_check.py   # (lightkube installed)
"""
from __future__ import annotations

import http.server
import json
import threading
import urllib.parse
from collections.abc import Callable
from typing import Any

import lightkube_cluster

from kubeforge.api import contract
from kubeforge.operator import apply, kubeconfig

Call = tuple[str, str, tuple[Any, ...], str | None, Any]
SEEN: list[Call] = []
ANSWER = json.dumps({"apiVersion": "v1", "kind": "X", "items": [],
                     "metadata": {"name": "n", "namespace": "ns", "resourceVersion": "7"}}).encode()


class Recorder(http.server.BaseHTTPRequestHandler):
    def _any(self) -> None:
        size = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(size) if size else b""
        url = urllib.parse.urlsplit(self.path)
        query = tuple(sorted(urllib.parse.parse_qs(url.query).items()))
        SEEN.append((self.command, url.path, query, self.headers.get("Content-Type"),
                     json.loads(body) if body else None))
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(ANSWER)))
        self.end_headers()
        self.wfile.write(ANSWER)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _any

    def log_message(self, *args: Any) -> None:
        pass


def calls() -> list[Callable[[apply.Cluster], object]]:
    sts = {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "s", "namespace": "ns"},
           "spec": {"replicas": 1}}
    job = {"apiVersion": contract.API_VERSION, "kind": contract.KIND,
           "metadata": {"name": "j", "namespace": "ns", "uid": "u"}}
    wl = {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload", "metadata": {"name": "w", "namespace": "ns"}}
    lease = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "spec": {},
             "metadata": {"name": "l", "namespace": "ns", "resourceVersion": "3"}}
    return [
        lambda c: c.apply(sts), lambda c: c.delete(sts), lambda c: c.delete(sts, propagation="Orphan"),
        lambda c: c.patch_status("ns", "j", {"phase": "Running"}), lambda c: c.list_pods_at("ns", "j"),
        lambda c: c.list_pods_at("ns", "j", not_older_than=5), lambda c: c.get("apps/v1", "StatefulSet", "ns", "s"),
        lambda c: c.get_rljob("ns", "j"), lambda c: c.list_of_job("kueue.x-k8s.io/v1beta2", "Workload", "ns", "j"),
        lambda c: c.get_kueue("resourceflavors", "f"), lambda c: c.patch_object_status(wl, {"status": {"a": 1}}),
        lambda c: c.get_node("n1"), lambda c: c.force_delete_pod("ns", "p", "uid1"),
        lambda c: c.patch_pod("ns", "p", {"metadata": {}}), lambda c: c.create_if_absent(sts),
        lambda c: c.delete_webhook_configuration("w"), lambda c: c.delete_rljob("ns", "j"),
        lambda c: c.post_event(job, type="Normal", reason="R", message="m", now="2026-01-01T00:00:00Z"),
        lambda c: c.get_lease("ns", "l"), lambda c: c.create_lease(lease), lambda c: c.replace_lease(lease),
    ]


def main() -> int:
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    creds = kubeconfig.Credentials(server=f"http://127.0.0.1:{srv.server_port}", token="tok", origin="probe")
    got: dict[str, list[Call]] = {}
    for name, cls in (("urllib3", apply.Cluster), ("lightkube", lightkube_cluster.LightkubeCluster)):
        client = cls(creds, pool_size=4)
        SEEN.clear()
        for call in calls():
            call(client)
        got[name] = list(SEEN)
    differ = 0
    for i, (ours, theirs) in enumerate(zip(got["urllib3"], got["lightkube"])):
        if ours != theirs:
            differ += 1
            print(f"call {i}:\n  urllib3   {ours}\n  lightkube {theirs}")
    print(f"{len(got['urllib3'])} and {len(got['lightkube'])} requests; {differ} differ")
    srv.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
