"""An agent pod's process: claims episodes from the generators' endpoints and runs the user's program once per
episode, with that episode's credential only.

```
 slot 0..concurrency-1 (threads), each:                                       generator i (PORT_AGENTS)
   POST /agents/claim {"wait": CLAIM_WAIT} (agent key) ───────────────────────▶ dispatch.claim
   ◀─ {episode, path, api_key, model, task, seconds} or {"episode": null} (next generator)
   program (own session) ─ stdin: task.prompt; env: OPENAI_BASE_URL, OPENAI_API_KEY, OPENAI_DEFAULT_MODEL
      └─ its model calls ─ Bearer <episode key> ──────────────────────────────▶ /episodes/<id>/v1/chat/completions
   every HEARTBEAT_SECONDS: POST /agents/episodes/<id>/heartbeat ─────────────▶ {"open": false}: kill the program
   exit, or past task.seconds (killed): POST /agents/episodes/<id>/done {"exit_code", "timed_out"}
```

Invariants: the program's environment is the pod's without any ``KUBEFORGE_*`` variable (it never sees the agent
key; the job key is not in the pod at all); every HTTP call is bounded (``HTTP_TIMEOUT`` plus the claim's long
poll); a program is killed (its whole session) past its episode's time, when the generator says the episode
ended, and at shutdown. A generator is claimed from only once its ``/readyz`` (metrics port, bound from its start)
says ready: its endpoint binds right after, and dialling a port nobody listens on yet during vLLM's minute-long
start could, on one machine, connect to itself and hold the port the endpoint needs. One that fails a claim is
asked for readiness again, after ``RETRY_SECONDS``.
Only the standard library: the pod's image needs nothing more.
"""
from __future__ import annotations

import collections
import http.client
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from typing import Any

from kubeforge.api import contract
from kubeforge.runtime import httpjson

CLAIM_WAIT = 5.0          # the claim's long poll at one generator, seconds
HTTP_TIMEOUT = 10.0       # any other call to a generator
HEARTBEAT_SECONDS = 2.0   # dispatch.HEARTBEAT_SECONDS (the generator's lease is several of these)
RETRY_SECONDS = 1.0


class Worker:
    """``concurrency`` slots, each claiming and running one episode at a time (see the module docstring)."""

    def __init__(self, *, generators: Sequence[str], agent_key: bytes, program: Sequence[str], concurrency: int,
                 environ: Mapping[str, str], stop: threading.Event, ready: Sequence[str] | None = None) -> None:
        self.generators = list(generators)        # base URLs: http://host:port
        self.ready_urls = list(ready) if ready is not None else [""] * len(self.generators)   # /readyz, "": none
        self._ready = [not u for u in self.ready_urls]
        self.agent_key, self.program, self.concurrency = agent_key.hex(), list(program), concurrency
        self.environ = {k: v for k, v in environ.items() if not k.startswith(contract.ENV_PREFIX)}
        self.stop = stop
        self.ends: collections.Counter[str] = collections.Counter()   # stop, error, timeout, ended (by generator)
        self._lock = threading.Lock()

    def run(self) -> None:
        slots = [threading.Thread(target=self._slot, args=(i,), name=f"agent-slot-{i}", daemon=True)
                 for i in range(self.concurrency)]
        for t in slots:
            t.start()
        for t in slots:
            t.join()

    def _slot(self, i: int) -> None:
        turn = i
        while not self.stop.is_set():
            g = turn % len(self.generators)
            base = self.generators[g]
            turn += 1
            if not self._ready[g]:
                self._ready[g] = _ready(self.ready_urls[g])
                if not self._ready[g]:
                    self.stop.wait(RETRY_SECONDS)
                    continue
            try:
                claim = _post(base, "/agents/claim", self.agent_key, {"wait": CLAIM_WAIT},
                              timeout=CLAIM_WAIT + HTTP_TIMEOUT)
            except OSError:             # gone, or restarting: ask its readiness again, later
                self._ready[g] = not self.ready_urls[g]
                self.stop.wait(RETRY_SECONDS)
                continue
            if claim.get("episode"):
                self._episode(base, claim)

    def _episode(self, base: str, claim: dict[str, Any]) -> None:
        ep, key = str(claim["episode"]), str(claim["api_key"])
        env = {**self.environ, "OPENAI_BASE_URL": base + str(claim["path"]), "OPENAI_API_KEY": key,
               "OPENAI_DEFAULT_MODEL": str(claim["model"]), "OPENAI_AGENTS_DISABLE_TRACING": "1"}
        prompt = str(dict(claim.get("task") or {}).get("prompt", ""))
        deadline = time.monotonic() + float(claim.get("seconds") or 60.0)
        try:
            proc = subprocess.Popen(self.program, stdin=subprocess.PIPE, env=env, start_new_session=True)
        except OSError as exc:
            print(f"agent: cannot start {self.program[0]!r}: {exc}", file=sys.stderr, flush=True)
            self._report(base, ep, key, exit_code=127, timed_out=False, outcome="error")
            return
        _feed(proc, prompt)
        code, outcome = self._watch(proc, base=base, ep=ep, key=key, deadline=deadline)
        self._report(base, ep, key, exit_code=code, timed_out=outcome == "timeout", outcome=outcome)

    def _watch(self, proc: subprocess.Popen[bytes], *, base: str, ep: str, key: str,
               deadline: float) -> tuple[int, str]:
        """Wait for the program, beating; kill it past the deadline, at shutdown, or once the episode ended."""
        while True:
            try:
                code = proc.wait(timeout=min(HEARTBEAT_SECONDS, max(deadline - time.monotonic(), 0.01)))
                return code, "stop" if code == 0 else "error"
            except subprocess.TimeoutExpired:
                pass
            if time.monotonic() >= deadline:
                return _kill(proc), "timeout"
            if self.stop.is_set():
                return _kill(proc), "error"
            try:
                still = _post(base, f"/agents/episodes/{ep}/heartbeat", key, {}, timeout=HTTP_TIMEOUT)["open"]
            except (OSError, KeyError):
                still = True            # one missed beat is not an end: the generator's lease decides
            if still is False:
                _kill(proc)
                return -1, "ended"

    def _report(self, base: str, ep: str, key: str, *, exit_code: int, timed_out: bool, outcome: str) -> None:
        with self._lock:
            self.ends[outcome] += 1
        if outcome == "ended":
            return
        try:
            _post(base, f"/agents/episodes/{ep}/done", key, {"exit_code": exit_code, "timed_out": timed_out},
                  timeout=HTTP_TIMEOUT)
        except OSError as exc:      # the generator's lease ends the episode (agent_lost)
            print(f"agent: episode {ep[:8]}: end not reported: {exc}", file=sys.stderr, flush=True)


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=HTTP_TIMEOUT) as resp:
            return int(resp.status) == 200
    except (OSError, http.client.HTTPException):
        return False


def _feed(proc: subprocess.Popen[bytes], prompt: str) -> None:
    assert proc.stdin is not None
    try:
        proc.stdin.write(prompt.encode())
        proc.stdin.close()
    except OSError:                 # the program exited without reading: its exit code tells
        pass


def _kill(proc: subprocess.Popen[bytes]) -> int:
    """Kill the program's whole session (a framework's own children too); its exit code."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        return proc.wait(timeout=HTTP_TIMEOUT)
    except subprocess.TimeoutExpired:
        return -9


def _post(base: str, path: str, token: str, body: dict[str, Any], *, timeout: float) -> dict[str, Any]:
    """One JSON POST with a bearer token; the answer's JSON object, or OSError (``httpjson.post``)."""
    return httpjson.post(base, path, token, body, timeout=timeout)
