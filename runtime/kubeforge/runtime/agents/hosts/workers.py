"""``SubprocessHost``: environment steps in a pool of worker processes (``worker``), what the roles use.

```
 runner ─step([(episode, text), ...])─▶ SubprocessHost ─┬─ thread ─pipe─▶ worker 0  (episodes 0, W, 2W, ...)
                                                        ├─ thread ─pipe─▶ worker 1
                                                        └─ ...             each answers one request at a time
```

Each episode lives in one worker (``id % W``); the workers step side by side, a worker its episodes one after the
other. A worker that misses the deadline (``turnTimeoutSeconds``), sends a frame above the byte bound or dies is
killed and restarted: the episode it was serving ends (``env_timeout`` / ``env_flood`` / ``env_error``), and the other
live episodes of that worker are replayed into the new one (reset, then their earlier turns: the built-in
environments are deterministic; a Python environment should be too, see docs/agents.md) so the failure costs that
episode only. Exceptions, garbage and oversized observations that arrive whole are judged by ``host``.

Workers start through ``isolation``: a minimal environment (no job key, no credentials), their own session, an
address-space bound (``memory_mib``), and -- where the kernel has Landlock -- no read of the pod's secret files or of
other processes' ``/proc`` (docs/security.md).
"""
from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

from kubeforge.api import contract, rljob
from kubeforge.runtime import isolation, types
from kubeforge.runtime.agents.hosts import host, pipe

START_TIMEOUT_S = 30.0


@dataclasses.dataclass
class _Episode:
    prompt: types.Prompt
    texts: list[str] = dataclasses.field(default_factory=list)
    dead: str = ""


class _Worker:
    def __init__(self, spec_json: str, env: dict[str, str], bounds: isolation.Bounds) -> None:
        self.child = isolation.Confined([sys.executable, "-m", "kubeforge.runtime.agents.hosts.worker", spec_json],
                                        settings=env, bounds=bounds, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self.proc = self.child.proc
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.wfd, self.rfd = self.proc.stdin.fileno(), self.proc.stdout.fileno()
        self.started = False

    def call(self, req: dict[str, Any], *, timeout: float, max_bytes: int) -> Any:
        pipe.write(self.wfd, req)
        # the first answer also waits for the interpreter to start and import the environment
        wait = timeout if self.started else timeout + START_TIMEOUT_S
        out = pipe.read(self.rfd, deadline=time.monotonic() + wait, max_bytes=max_bytes)
        self.started = True
        return out

    def tell(self, req: dict[str, Any]) -> None:
        pipe.write(self.wfd, req)

    def kill(self) -> None:
        self.child.kill()
        for f in (self.proc.stdin, self.proc.stdout):
            if f is not None:
                f.close()


class SubprocessHost:
    """``host.EnvironmentHost`` over ``workers`` worker processes (see the module docstring)."""

    def __init__(self, spec: rljob.EnvironmentSpec, *, workers: int = 2, memory_mib: int = 2048) -> None:
        self.spec_json = spec.model_dump_json(by_alias=True)
        self.bounds = host.Bounds(timeout_s=spec.turn_timeout_seconds,
                                  max_observation_bytes=spec.max_observation_bytes)
        self.max_frame = 4 * spec.max_observation_bytes + 65536     # JSON-ish overhead over the observation bound
        # the worker's whole environment (isolation.ALLOWED aside): no secret of the pod reaches environment code
        self.env = {"PYTHONPATH": os.pathsep.join(os.path.abspath(p) for p in sys.path)}
        # a job with spec.sandbox: the pool's addresses and key (it opens sandboxes only, which run hostile code
        # anyway; never the job key), so a CodeFeedback environment runs its turns there (docs/sandboxes.md)
        self.env.update({k: os.environ[k] for k in (contract.ENV_SANDBOXES, contract.ENV_SANDBOX_KEY)
                         if os.environ.get(k)})
        self.limits = isolation.Bounds(memory_mib=memory_mib)
        self.pool = [_Worker(self.spec_json, self.env, self.limits) for _ in range(max(1, workers))]
        self.episodes: dict[int, _Episode] = {}
        self.threads = cf.ThreadPoolExecutor(max_workers=len(self.pool), thread_name_prefix="env-host")
        self.restarts = 0

    def _of(self, i: int) -> int:
        return i % len(self.pool)

    def reset(self, items: Sequence[tuple[int, types.Prompt]]) -> list[Reply_]:
        for i, p in items:
            self.episodes[i] = _Episode(prompt=p)
        return self._fan(list(items), self._reset_one)

    def step(self, items: Sequence[tuple[int, str]]) -> list[Reply_]:
        return self._fan(list(items), self._step_one)

    def close(self, ids: Sequence[int]) -> None:
        for i in ids:
            if self.episodes.pop(i, None) is not None:
                try:
                    self.pool[self._of(i)].tell({"op": "close", "id": i})
                except OSError:
                    pass

    def shutdown(self) -> None:
        self.threads.shutdown(wait=True)
        for w in self.pool:
            w.kill()

    # ------------------------------------------------------------ internals

    def _fan(self, items: list[Any], one: Any) -> list[Reply_]:
        """Items grouped by worker; each worker's run on its own thread, in order; replies in the items' order."""
        by_worker: dict[int, list[int]] = {}
        for k, (i, _) in enumerate(items):
            by_worker.setdefault(self._of(i), []).append(k)
        out: list[Reply_ | None] = [None] * len(items)

        def run(ks: list[int]) -> None:
            for k in ks:
                out[k] = one(*items[k])

        list(self.threads.map(run, by_worker.values()))
        return [r if r is not None else host.Reply(failure=host.ERROR, detail="no reply") for r in out]

    def _reset_one(self, i: int, prompt: types.Prompt) -> Reply_:
        start = time.monotonic()
        req = {"op": "reset", "id": i, "prompt": dataclasses.asdict(prompt)}
        ans, failure = self._call(i, req)
        seconds = time.monotonic() - start
        if failure is not None:
            return failure
        if not ans.get("ok"):
            return self._failed(i, ans, seconds)
        return host.judge_messages(ans.get("messages"), bounds=self.bounds, seconds=seconds, where="reset")

    def _step_one(self, i: int, text: str) -> Reply_:
        ep = self.episodes.get(i)
        if ep is None or ep.dead:
            return host.Reply(failure=host.ERROR, detail=ep.dead if ep else "unknown episode")
        start = time.monotonic()
        ans, failure = self._call(i, {"op": "step", "id": i, "text": text})
        seconds = time.monotonic() - start
        if failure is not None:
            return failure
        ep.texts.append(text)
        if not ans.get("ok"):
            return self._failed(i, ans, seconds)
        reply = host.judge_result(ans.get("result"), bounds=self.bounds, seconds=seconds)
        if reply.failure:
            ep.dead = reply.failure     # the episode ends: later steps are refused
        return reply

    def _failed(self, i: int, ans: dict[str, Any], seconds: float) -> Reply_:
        kind = host.GARBAGE if "garbage" in ans else host.ERROR
        detail = str(ans.get("garbage") or ans.get("error") or "")[:host.DETAIL_CHARS]
        self.episodes.get(i, _Episode(prompt=types.Prompt(index=0, text="", answer=""))).dead = detail or kind
        return host.Reply(failure=kind, detail=detail, seconds=seconds)

    def _call(self, i: int, req: dict[str, Any]) -> tuple[Any, Reply_ | None]:
        """The worker's answer, or (None, failure) after killing and restarting a worker that hung, flooded or
        died (its other episodes replayed)."""
        w = self._of(i)
        start = time.monotonic()
        try:
            ans = self.pool[w].call(req, timeout=self.bounds.timeout_s, max_bytes=self.max_frame)
            if isinstance(ans, dict):
                return ans, None
            failure = host.Reply(failure=host.GARBAGE, detail="the worker answered a non-map")
        except pipe.Late:
            failure = host.Reply(failure=host.TIMEOUT, detail=f"no answer within {self.bounds.timeout_s:g} s")
        except pipe.Overrun as e:
            failure = host.Reply(failure=host.FLOOD, detail=str(e))
        except (pipe.Closed, OSError, ValueError) as e:
            failure = host.Reply(failure=host.ERROR, detail=f"the worker died ({type(e).__name__})")
        failure = dataclasses.replace(failure, seconds=time.monotonic() - start)
        self._restart(w, lost=i)
        return None, failure

    def _restart(self, w: int, *, lost: int) -> None:
        """A fresh worker ``w`` holding its live episodes again (a replay that fails ends that episode and starts
        over with a fresh worker, at most ``len(live)`` times)."""
        if lost in self.episodes:
            self.episodes[lost].dead = "ended by its environment's failure"
        while True:
            self.restarts += 1
            self.pool[w].kill()
            self.pool[w] = _Worker(self.spec_json, self.env, self.limits)
            live = [(j, ep) for j, ep in self.episodes.items() if self._of(j) == w and not ep.dead]
            failed = next(((j, ep) for j, ep in live if not self._replay(j, ep)), None)
            if failed is None:
                return
            failed[1].dead = "lost in a worker restart (its replay failed)"

    def _replay(self, j: int, ep: _Episode) -> bool:
        try:
            ans = self.pool[self._of(j)].call({"op": "reset", "id": j, "prompt": dataclasses.asdict(ep.prompt)},
                                               timeout=self.bounds.timeout_s, max_bytes=self.max_frame)
            for text in ep.texts:
                ans = self.pool[self._of(j)].call({"op": "step", "id": j, "text": text},
                                                   timeout=self.bounds.timeout_s, max_bytes=self.max_frame)
        except (pipe.Late, pipe.Overrun, pipe.Closed, OSError, ValueError):
            return False
        return isinstance(ans, dict) and bool(ans.get("ok"))


Reply_ = host.Reply
