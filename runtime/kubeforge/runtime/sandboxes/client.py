"""The client side of the sandbox pool: claim a lease, run programs on it, release it (docs/sandboxes.md).

```
 Episode.run(source, tests) ─ no open lease? ─ Pool.claim: pods round robin from a per-client offset; a quick pass
        │                                        (wait 0), then long polls, all within claim_seconds
        └─ Lease.run ─ POST .../run ─▶ result; "open": false (timed out, crashed: reset by the pod) ─ lease dropped,
                                        the next run claims anew
 Episode.close() ─ Lease.release (best effort: the pod's idle timer frees a lease whose release was lost)
```

Invariants: every call is bounded (``HTTP_TIMEOUT``; a run by its limit plus ``RUN_SLACK``); nothing raises out of
``Episode.run`` or ``Lease.run``: a pod that cannot be reached or answers nonsense is a ``crashed`` result naming
the sandbox, so the program's episode pays, not the caller. Standard library only (environment workers import it).

Neighbours: ``agents.envs.code_feedback`` (one :class:`Episode` per episode) and ``verifiers.code`` (one lease per
completion) build it from the environment with :func:`from_env`; ``server`` answers.
"""
from __future__ import annotations

import itertools
import os
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from kubeforge.api import contract, sandboxenv
from kubeforge.runtime import httpjson
from kubeforge.runtime.sandboxes import protocol
from kubeforge.runtime.verifiers import sandbox

HTTP_TIMEOUT = 10.0
RUN_SLACK = 10.0             # on top of a run's limit: the sandbox's start-up and kill, the HTTP round trip
CLAIM_SECONDS = 60.0         # how long an episode waits for a free sandbox before its run fails
UNAVAILABLE = "sandbox unavailable"


class Unavailable(Exception):
    """No lease within the claim's bound (every pod full, or none reachable)."""


class Lease:
    def __init__(self, pool: Pool, base: str, lease_id: str) -> None:
        self.pool, self.base, self.lease_id = pool, base, lease_id
        self.open = True

    def run(self, source: str, tests: Sequence[str], limits: sandbox.Limits) -> sandbox.Result:
        body = {"source": source, "tests": list(tests), "limits": protocol.limits_body(limits)}
        try:
            answer = self.pool.post(self.base, f"{protocol.LEASES}{self.lease_id}/run", body,
                                    timeout=limits.timeout_s + sandbox.STARTUP_S + RUN_SLACK)
            result, self.open = protocol.run_answer(answer)
        except (OSError, ValueError) as exc:
            self.open = False
            return sandbox.Result(passed=0, total=len(tests), status="crashed", error=f"sandbox lost: {exc}",
                                  seconds=0.0)
        return result

    def release(self) -> None:
        if not self.open:
            return
        self.open = False
        try:
            self.pool.post(self.base, f"{protocol.LEASES}{self.lease_id}/release", {}, timeout=HTTP_TIMEOUT)
        except OSError:
            pass            # the pod frees it after its idle time


class Pool:
    """The sandbox pods of a job, by base URL (``http://host:port``)."""

    _offsets = itertools.count()

    def __init__(self, bases: Sequence[str], *, key: bytes, claim_seconds: float = CLAIM_SECONDS) -> None:
        if not bases:
            raise ValueError("a sandbox pool needs at least one pod")
        self.bases, self.token, self.claim_seconds = list(bases), key.hex(), claim_seconds
        self._next = next(self._offsets) + os.getpid()     # clients start on different pods
        self._lock = threading.Lock()

    def claim(self, *, seconds: float | None = None) -> Lease:
        """A lease on some pod; ``Unavailable`` past ``seconds`` (default ``claim_seconds``)."""
        deadline = time.monotonic() + (self.claim_seconds if seconds is None else seconds)
        with self._lock:
            start = self._next
            self._next += 1
        n, last, i = len(self.bases), "no pod answered", -1
        while True:
            i += 1
            left = deadline - time.monotonic()
            if left <= 0 and i >= n:
                raise Unavailable(f"{UNAVAILABLE}: no free sandbox in {self.claim_seconds:g} s ({last})")
            base = self.bases[(start + i) % n]
            wait = 0.0 if i < n else max(0.0, min(left, protocol.MAX_CLAIM_WAIT))   # a quick pass, then long polls
            try:
                got = self.post(base, protocol.CLAIM, {"wait": wait}, timeout=wait + HTTP_TIMEOUT)
            except OSError as exc:
                last = str(exc)
                if i >= n:
                    time.sleep(min(0.5, max(left, 0.0)))   # a pod that refuses at once: do not spin
                continue
            lease = got.get("lease")
            if isinstance(lease, str) and protocol.LEASE_ID.match(lease):
                return Lease(self, base, lease)
            last = "every pod full"

    def post(self, base: str, path: str, body: dict[str, Any], *, timeout: float) -> dict[str, Any]:
        """One JSON POST with the sandbox key; the answer's object. ``OSError`` for anything but a 200 JSON object."""
        return httpjson.post(base, path, self.token, body, timeout=timeout, max_bytes=protocol.MAX_ANSWER)


class Episode:
    """One episode's sandbox: claimed at its first run, kept while its runs end well, released at ``close``."""

    def __init__(self, pool: Pool, limits: sandbox.Limits) -> None:
        self.pool, self.limits = pool, limits
        self.lease: Lease | None = None
        self.claims = 0

    def run(self, source: str, tests: list[str]) -> sandbox.Result:
        if self.lease is None or not self.lease.open:
            try:
                self.lease = self.pool.claim()
            except Unavailable as exc:
                return sandbox.Result(passed=0, total=len(tests), status="crashed", error=str(exc), seconds=0.0)
            self.claims += 1
        return self.lease.run(source, tests, self.limits)

    def close(self) -> None:
        if self.lease is not None:
            self.lease.release()
            self.lease = None


def from_env(env: Mapping[str, str] | None = None) -> Pool | None:
    """The job's pool from ``contract.ENV_SANDBOXES`` / ``ENV_SANDBOX_KEY`` (None: the job has no ``spec.sandbox``:
    run the local sandbox). Raises ``ValueError`` naming the variable when they are malformed."""
    got = sandboxenv.read_client(os.environ if env is None else env)
    if got is None:
        return None
    peers, key = got
    return Pool([f"http://{p.host}:{p.port(contract.PORT_SANDBOX)}" for p in peers], key=key)
