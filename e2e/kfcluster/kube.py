"""kubectl, from the versioned cache, against one cluster; plus polling with clear timeouts.

Role: the only place that shells out to kubectl. Neighbours: ``lifecycle`` (bring-up checks, node
creation) and the pytest fixtures (waits). Invariant: every wait has a deadline and its error names what
was awaited and the last thing seen.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


class WaitTimeout(TimeoutError):
    """A condition was not met in time; the message says which and what was last observed."""


def wait_for(what: str, probe: Callable[[], T | None], *, timeout_s: float, interval_s: float = 0.25) -> T:
    """Call ``probe`` until it returns a truthy value (returned); raise ``WaitTimeout`` at the deadline.

    A probe may raise; the last exception is reported if the deadline passes.
    """
    deadline = time.monotonic() + timeout_s
    last: object = None
    while True:
        try:
            value = probe()
            if value:
                return value
            last = value
        except Exception as exc:  # noqa: BLE001 - reported at the deadline
            last = exc
        if time.monotonic() >= deadline:
            raise WaitTimeout(f"timed out after {timeout_s:.0f}s waiting for {what}; last: {last!r}")
        time.sleep(interval_s)


class Kubectl:
    """``kubectl --kubeconfig=...`` with the cached binary."""

    def __init__(self, *, binary: str, kubeconfig: str) -> None:
        self.binary = binary
        self.kubeconfig = kubeconfig

    def run(self, *args: str, stdin: str | None = None, check: bool = True,
            timeout_s: float = 60.0) -> subprocess.CompletedProcess[str]:
        cmd = [self.binary, f"--kubeconfig={self.kubeconfig}", *args]
        proc = subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=timeout_s)
        if check and proc.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()}")
        return proc

    def apply(self, doc: dict[str, Any] | str, *, server_side: bool = False, timeout_s: float = 60.0) -> None:
        text = doc if isinstance(doc, str) else json.dumps(doc)
        extra = ["--server-side", "--force-conflicts"] if server_side else []
        self.run("apply", *extra, "-f", "-", stdin=text, timeout_s=timeout_s)

    def get_json(self, *args: str) -> Any:
        return json.loads(self.run("get", *args, "-o", "json").stdout)

    def readyz(self) -> bool:
        return self.run("get", "--raw", "/readyz", check=False, timeout_s=10).stdout.strip() == "ok"
