"""Harness for tests and benches that run the real operator against the test cluster (no cluster needed to import).

``Operator`` runs ``python -m kubeforge.operator`` as a subprocess (so a test can SIGKILL it mid-flight) with its
logs in a file; ``K`` wraps the cluster's kubectl for the few reads tests need. Used by ``e2e/test_operator.py``
(and the other e2e tests that run the operator) and ``bench/bench_operator.py``: it lives in ``kfcluster`` so that
both import it the same way (``from kfcluster import harness``). Stdlib only, as the rest of the package.
"""
from __future__ import annotations

import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parents[2]
CRD = ROOT / "crds" / "kubeforge.dev_rljobs.yaml"
POOL_CRD = ROOT / "crds" / "kubeforge.dev_generatorpools.yaml"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Operator:
    """The operator as a child process."""

    def __init__(self, *, kubeconfig: str, log_path: pathlib.Path, extra: tuple[str, ...] = (),
                 env: dict[str, str] | None = None) -> None:
        self.kubeconfig, self.log_path, self.extra, self.env = kubeconfig, log_path, extra, env or {}
        self.metrics_port, self.health_port = free_port(), free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, *, timeout_s: float = 60.0) -> Operator:
        cmd = [sys.executable, "-m", "kubeforge.operator", "--kubeconfig", self.kubeconfig,
               "--metrics-port", str(self.metrics_port), "--health-port", str(self.health_port),
               "--runtime-image", "kubeforge/runtime:test", *(self.extra or ("--all-namespaces",))]
        if not any(a.startswith("--pool-master-key-file") for a in cmd):    # as the chart mounts one
            cmd.append(f"--pool-master-key-file={self.pool_master_key_file()}")
        log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env={**os.environ, **self.env})
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"operator exited {self.proc.returncode}; log: {self.log_path}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.health_port}/healthz", timeout=2) as r:
                    if r.status == 200:
                        return self
            except OSError:
                pass
            time.sleep(0.3)
        raise TimeoutError(f"operator not healthy after {timeout_s}s; log: {self.log_path}")

    def pool_master_key_file(self) -> pathlib.Path:
        """The operator's pool master key (docs/generator-pool.md, "Keys"): drawn once beside its log, so a
        restarted operator (same log path) keeps its pools' keys."""
        path = self.log_path.parent / "pool-master.key"
        if not path.exists():
            path.touch(mode=0o600)
            path.write_bytes(os.urandom(32))
        return path

    def kill(self) -> None:
        """SIGKILL: no graceful shutdown, as a crashed or evicted operator."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as r:
            return r.read().decode()

    def cpu_seconds(self) -> float:
        """User + system CPU time the operator process has used."""
        assert self.proc is not None
        fields = pathlib.Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def peak_rss_kib(self) -> int:
        """VmHWM of the operator process (peak resident set)."""
        assert self.proc is not None
        return peak_rss_kib(self.proc.pid)


def peak_rss_kib(pid: int) -> int:
    """VmHWM (peak resident set, KiB) of process ``pid``; 0 when it is gone."""
    try:
        for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


class K:
    """kubectl for one kubeconfig (JSON in, JSON out)."""

    def __init__(self, *, kubectl: str, kubeconfig: str) -> None:
        self.kubectl, self.kubeconfig = kubectl, kubeconfig

    def run(self, *args: str, stdin: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
        p = subprocess.run([self.kubectl, f"--kubeconfig={self.kubeconfig}", *args], input=stdin,
                           capture_output=True, text=True, timeout=120)
        if check and p.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)}: {p.stderr.strip()}")
        return p

    def apply(self, doc: Any) -> None:
        self.run("apply", "-f", "-", stdin=doc if isinstance(doc, str) else json.dumps(doc))

    def get(self, *args: str) -> Any:
        return json.loads(self.run("get", *args, "-o", "json").stdout)

    def items(self, kind: str, namespace: str, selector: str | None = None) -> list[dict[str, Any]]:
        args = [kind, "-n", namespace] + (["-l", selector] if selector else [])
        return list(self.get(*args)["items"])

    def ensure_crd(self) -> None:
        """The RLJob and GeneratorPool CRDs from crds/, applied and Established."""
        for path, name in ((CRD, "rljobs.kubeforge.dev"), (POOL_CRD, "generatorpools.kubeforge.dev")):
            self.run("apply", "--server-side", "--force-conflicts", "-f", str(path))
            # Polled: right after the apply the CRD can have no status.conditions yet, and `kubectl wait` then fails
            # at once ("<nil> is of the type <nil>") instead of waiting (seen on a fresh bench cluster).
            wait(f"CRD {name} Established", lambda: self.run(   # called at once: `name` is this iteration's
                "get", f"crd/{name}", "-o", "jsonpath={.status.conditions[?(@.type==\"Established\")].status}",
                check=False).stdout.strip() == "True", timeout_s=60)

    def report(self, namespace: str, pod: str, **progress: Any) -> None:
        """Write ``progress`` on trainer pod ``pod`` as trainer rank 0 does (kwok runs no code): the progress
        annotation, stamped with the trainer epoch of the pod's label as the trainer stamps it from its env; a
        report without it would read as a stale trainer's and be fenced (docs/fencing.md)."""
        labels = self.get("pod", pod, "-n", namespace)["metadata"].get("labels") or {}
        epoch = labels.get("kubeforge.dev/trainer-epoch")
        doc = {**progress, **({"trainerEpoch": int(epoch)} if epoch else {})}
        self.run("annotate", "pod", pod, "-n", namespace, f"kubeforge.dev/progress={json.dumps(doc)}", "--overwrite")

    def namespace(self, name: str) -> str:
        self.run("create", "namespace", name, check=False)
        return name


def wait(what: str, probe: Any, *, timeout_s: float = 90.0, interval_s: float = 0.3) -> Any:
    """Poll ``probe`` until truthy; on timeout raise with the last value seen."""
    deadline, last = time.monotonic() + timeout_s, None
    while True:
        try:
            last = probe()
            if last:
                return last
        except Exception as exc:  # noqa: BLE001 - reported at the deadline
            last = exc
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s}s waiting for {what}; last: {last!r}")
        time.sleep(interval_s)


def env_kubeconfig() -> str | None:
    return os.environ.get("KUBECONFIG")
