"""A sandbox pod's server: ``slots`` leases, each one episode's sandbox; runs in fresh confined processes; resets.

```
 HTTP thread per request ─ auth (bearer sandbox key) ─ protocol.* decode ─┬─ claim: a free slot, or wait <= 10 s
                                                                           ├─ run: lease busy ─ Sandbox.run (fresh
                                                                           │   process, own session, rlimits,
                                                                           │   Landlock) ─ reaper.ended ─ answer
                                                                           └─ release: reset ─ slot free
 janitor thread (1 s): leases idle past idle_seconds ─ reset ─ slot free
```

Invariants:
- A lease is handed to one claim; a slot is free again only after its reset: the lease's sessions killed, strays
  swept (``reaper``), its directory removed. A run that times out or crashes (a limit hit, a flood) closes its
  lease (``open: false``) and resets it at once: nothing is reused dirty, and that episode's next run claims anew.
- Every refusal is counted by reason (``protocol.REASONS``) and answered with its HTTP code; nothing is acted on
  for a request that does not decode whole.
- Every wait is bounded: a claim's long poll by ``protocol.MAX_CLAIM_WAIT``, a run by its limit (at most
  ``max_run_seconds``) plus the sandbox's start-up and kill.

Neighbours: ``start`` builds it in a sandbox pod (``dedicated``: its reaper sweeps); tests and the bench build it
in-process; ``client`` speaks to it.
"""
from __future__ import annotations

import collections
import dataclasses
import hmac
import http.server
import json
import os
import secrets
import shutil
import socketserver
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

from kubeforge.runtime import metrics as kf_metrics
from kubeforge.runtime.sandboxes import protocol, reaper
from kubeforge.runtime.verifiers import sandbox

JANITOR_SECONDS = 1.0


@dataclasses.dataclass(kw_only=True)
class _Lease:
    lease_id: str
    directory: str
    last: float
    busy: bool = False
    closing: str = ""        # why it must be reset once its run returns (release, idle, dirty)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Settings:
    key: bytes
    slots: int = 8
    max_run_seconds: float = 30.0
    idle_seconds: float = 60.0
    index: int = 0


class Pool:
    """The leases of one sandbox pod (thread-safe; see the module docstring)."""

    def __init__(self, settings: Settings, *, dedicated: bool = False, root: str | None = None,
                 metrics: kf_metrics.Metrics | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.settings, self.metrics, self.clock = settings, metrics, clock
        self.reaper = reaper.Reaper(dedicated=dedicated)
        self.root = tempfile.mkdtemp(prefix="kf-sandboxes-", dir=root)
        os.chmod(self.root, 0o711)        # a run dropped to nobody (started as root) must reach its directory
        self._leases: dict[str, _Lease] = {}
        self._cond = threading.Condition()
        self.counts: collections.Counter[str] = collections.Counter()   # claims, empty, runs:<status>, resets:<why>
        sandbox.probe()                   # before any sweep: the probe's own children must not look like strays

    # ---------------------------------------------------------------- the protocol's three operations
    def claim(self, wait: float) -> str | None:
        deadline = self.clock() + wait
        with self._cond:
            while len(self._leases) >= self.settings.slots:
                left = deadline - self.clock()
                if left <= 0:
                    self._count("claims", "empty")
                    return None
                self._cond.wait(timeout=min(left, 0.5))
            lease = _Lease(lease_id=secrets.token_hex(16), directory="", last=self.clock())
            lease.directory = os.path.join(self.root, lease.lease_id)
            os.mkdir(lease.directory, 0o711)
            self._leases[lease.lease_id] = lease
            self._count("claims", "claimed")
            self._gauge()
            return lease.lease_id

    def run(self, lease_id: str, req: protocol.RunRequest) -> tuple[sandbox.Result, bool]:
        """Run on the lease; (result, the lease still open)."""
        with self._cond:
            lease = self._leases.get(lease_id)
            if lease is None or lease.closing:
                raise protocol.Refused("unknown_lease", lease_id[:8])
            if lease.busy:
                raise protocol.Refused("busy", f"{lease_id[:8]}: a run is in flight")
            lease.busy = True
        pid: list[int] = []

        def started(p: int) -> None:
            pid.append(p)
            self.reaper.started(p)

        try:
            box = sandbox.Sandbox(req.limits, root=lease.directory, concurrent=self.settings.slots)
            result = box.run(req.source, req.tests, guard=self.reaper.guard, on_start=started)
        except OSError as exc:        # the process could not start (e.g. the pod's own limits): not the program's
            result = sandbox.Result(passed=0, total=len(req.tests), status="crashed", error=f"sandbox: {exc}",
                                    seconds=0.0)
        finally:
            self.reaper.ended(pid[0] if pid else None)
        self._count("runs", result.status)
        if self.metrics is not None:
            self.metrics.sandbox_run_seconds.observe(result.seconds)
        dirty = result.status != "ok"
        with self._cond:
            lease.busy, lease.last = False, self.clock()
            if dirty and not lease.closing:
                lease.closing = "dirty"
            reset = bool(lease.closing)
        if reset:
            self._reset(lease)
        return result, not reset

    def release(self, lease_id: str) -> None:
        with self._cond:
            lease = self._leases.get(lease_id)
            if lease is None or lease.closing:
                raise protocol.Refused("unknown_lease", lease_id[:8])
            lease.closing = "release"
            if lease.busy:       # its run resets it when it returns
                return
        self._reset(lease)

    # ---------------------------------------------------------------- resets
    def expire(self) -> int:
        """Reset every lease idle past ``idle_seconds``; how many."""
        now, idle = self.clock(), []
        with self._cond:
            for lease in self._leases.values():
                if not lease.busy and not lease.closing and now - lease.last > self.settings.idle_seconds:
                    lease.closing = "idle"
                    idle.append(lease)
        for lease in idle:
            self._reset(lease)
        return len(idle)

    def _reset(self, lease: _Lease) -> None:
        self.reaper.sweep()
        shutil.rmtree(lease.directory, ignore_errors=True)
        with self._cond:
            self._leases.pop(lease.lease_id, None)
            self._count("resets", lease.closing)
            self._gauge()
            self._cond.notify_all()

    def leases(self) -> int:
        with self._cond:
            return len(self._leases)

    def close(self) -> None:
        with self._cond:
            for lease in self._leases.values():
                lease.closing = lease.closing or "release"
        self.reaper.sweep()
        shutil.rmtree(self.root, ignore_errors=True)

    def _count(self, kind: str, what: str) -> None:
        self.counts[f"{kind}:{what}"] += 1
        m = self.metrics
        if m is None:
            return
        family = {"claims": m.sandbox_claims, "runs": m.sandbox_runs, "resets": m.sandbox_resets}[kind]
        family.labels(**{"claims": {"outcome": what}, "runs": {"status": what},
                         "resets": {"reason": what}}[kind]).inc()

    def _gauge(self) -> None:
        if self.metrics is not None:
            self.metrics.sandbox_leases.set(len(self._leases))


class Server:
    """The HTTP face of a :class:`Pool` on ``host:port`` (0: any free port), plus its janitor thread."""

    def __init__(self, pool: Pool, *, host: str, port: int) -> None:
        self.pool = pool
        self.refusals: collections.Counter[str] = collections.Counter()
        self.httpd = _HTTPServer((host, port), _handler(self))
        self.port = int(self.httpd.server_address[1])
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self.httpd.serve_forever, name="sandbox-http", daemon=True),
                         threading.Thread(target=self._janitor, name="sandbox-janitor", daemon=True)]
        for t in self._threads:
            t.start()

    def refuse(self, reason: str) -> None:
        self.refusals[reason] += 1
        if self.pool.metrics is not None:
            self.pool.metrics.sandbox_refusals.labels(reason=reason).inc()

    def _janitor(self) -> None:
        while not self._stop.wait(JANITOR_SECONDS):
            self.pool.expire()

    def stop(self) -> None:
        self._stop.set()
        self.httpd.shutdown()
        self.httpd.server_close()
        for t in self._threads:
            t.join(timeout=5)
        self.pool.close()

    def summary(self) -> str:
        return (f"sandbox-{self.pool.settings.index}: {dict(sorted(self.pool.counts.items()))}, refused "
                f"{dict(sorted(self.refusals.items()))}, strays killed {self.pool.reaper.killed}")


class _HTTPServer(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    request_queue_size = 256         # 100 episodes may claim at once


#: Oversized bodies up to this size are read and dropped before the 413 (larger ones: the connection is closed).
DRAIN_MAX = 4 * protocol.MAX_BODY
#: The socket timeout of a request's reads.
READ_TIMEOUT_S = 30.0


def _handler(server: Server) -> type[http.server.BaseHTTPRequestHandler]:
    want = server.pool.settings.key.hex().encode()

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        timeout = READ_TIMEOUT_S          # a client that stops sending mid-request holds its thread this long at most

        def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
            try:
                self._authorize()
                out = self._route(protocol.body(self._read()))
            except protocol.Refused as exc:
                server.refuse(exc.reason)
                self._reply(protocol.STATUS[exc.reason], {"error": exc.reason, "detail": exc.detail[:200]})
                return
            self._reply(200, out)

        def do_GET(self) -> None:  # noqa: N802
            server.refuse("not_found")
            self._reply(404, {"error": "not_found"})

        def _authorize(self) -> None:
            got = self.headers.get("Authorization", "").encode()
            if not hmac.compare_digest(got, b"Bearer " + want):
                raise protocol.Refused("unauthorized", "a missing or wrong sandbox key")

        def _read(self) -> bytes:
            try:
                n = int(self.headers.get("Content-Length") or "0")
            except ValueError:
                raise protocol.Refused("malformed", "Content-Length") from None
            if n < 0 or n > protocol.MAX_BODY:
                self.close_connection = True      # the body is not kept: the connection cannot be reused
                # read and drop a bounded oversized body before answering: a close with unread bytes resets the
                # connection and the client, still sending, gets a broken pipe instead of its 413
                left = n if n <= DRAIN_MAX else 0
                while left > 0:
                    chunk = self.rfile.read(min(left, 1 << 16))
                    if not chunk:
                        break
                    left -= len(chunk)
                raise protocol.Refused("too_large", f"{n} bytes")
            return self.rfile.read(n)

        def _route(self, body: dict[str, Any]) -> dict[str, Any]:
            pool = server.pool
            if self.path == protocol.CLAIM:
                lease = pool.claim(protocol.claim_request(body))
                return {"lease": lease, "idle": pool.settings.idle_seconds, "pod": pool.settings.index}
            lease_id, op = protocol.lease_route(self.path)
            if op == "run":
                req = protocol.run_request(body, max_run_seconds=pool.settings.max_run_seconds)
                result, still = pool.run(lease_id, req)
                return protocol.run_body(result, open_=still)
            pool.release(lease_id)
            return {"released": True}

        def _reply(self, code: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


def serve(settings: Settings, *, host: str, port: int, dedicated: bool = False,
          metrics: kf_metrics.Metrics | None = None) -> Server:
    """A pool and its HTTP server, serving now."""
    pool = Pool(settings, dedicated=dedicated, metrics=metrics)
    server = Server(pool, host=host, port=port)
    print(f"sandbox-{settings.index}: {settings.slots} slots on {host}:{server.port}, mechanisms "
          f"{', '.join(sandbox.mechanisms())}", file=sys.stderr, flush=True)
    return server
