"""A verifier's environment server: the generators' episodes step here, in this pod's pool of worker processes.

```
 generator g ─Caller─┐  rpc.Responder (PORT_ENV)   socket thread              pool thread
 generator h ─Caller─┼──▶ ZeroMQ ROUTER, CURVE ──calls──▶ queue ──▶ host.reset / host.step / host.close
                     │   decode: refused frames      │           (workers.SubprocessHost: worker processes)
                     │   counted by reason           ◀── answers ──┘ (channel.wake)
                     ◀── ENV_ANSWER; BUSY every BUSY_EVERY_S for each call that waits or runs
```

Each generator names itself (its caller id: the DEALER's routing id); its episode ids are its own, so the server
keys an episode by (caller, id) and hands the host ids of its own. Calls are served one after another in arrival order, consecutive
calls of one op merged into one host call (the host steps the episodes side by side over its workers). An
episode lives in this server until closed, or forgotten after ``idle_s`` without a call (a generator that died
never closes its episodes). A step of an episode this server does not know (it restarted, or forgot it) answers
``env_lost``.

Invariants: every frame in is ``wire.decode``d; anything else (foreign, malformed, not an ENV_CALL, a failed CURVE
handshake: ``unauthenticated``) is counted by reason (``dropped``, ``on_drop``) and the server goes on. Each
environment call is bounded by the host (``turnTimeoutSeconds``); the only answers dropped are those whose caller
is gone (``undeliverable``: ``ROUTER_MANDATORY``), whose own wait is bounded by its silence rule
(``remote_host``). A close is never answered. The channel is injected (``rpc.bind``: ZeroMQ with CURVE in the roles,
in memory in the unit tests); the server owns it from then on and closes it when ``serve`` returns.

Neighbours: ``verifier.start`` runs it on a thread when the job has a built-in or Python environment;
``remote_host.RemoteHost`` is its client; ``workers.SubprocessHost`` runs the steps.
"""
from __future__ import annotations

import collections
import dataclasses
import itertools
import queue
import threading
import time
from collections.abc import Callable, Sequence

from kubeforge.api import rljob
from kubeforge.runtime import rpc, wire
from kubeforge.runtime.agents.hosts import host as host_mod
from kubeforge.runtime.agents.envs import registry

BUSY_EVERY_S = 1.0
IDLE_EPISODE_S = 900.0
REASON_UNEXPECTED = rpc.UNEXPECTED     # a valid frame of another kind than ENV_CALL
_POLL_S = 0.2

Key = tuple[bytes, int]              # (caller's routing id, its episode id)
Pending = tuple[bytes, wire.EnvCall]


def serves(spec: rljob.RLJobSpec) -> bool:
    """Whether this job's environment runs in the verifiers' servers: a built-in or Python one (``Verifiers``
    environments run through the endpoint)."""
    return spec.environment is not None and str(spec.environment.type) in registry.KINDS


@dataclasses.dataclass
class Served:
    """What the server did (its summary line, and the tests)."""

    resets: int = 0
    steps: int = 0
    closes: int = 0
    forgotten: int = 0
    undeliverable: int = 0
    callers: set[bytes] = dataclasses.field(default_factory=set)
    dropped: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    step_seconds: float = 0.0

    def line(self) -> str:
        mean = self.step_seconds / self.steps if self.steps else 0.0
        drops = ", ".join(f"{k} {v}" for k, v in sorted(self.dropped.items())) or "none"
        return (f"environment server: {self.resets} resets, {self.steps} steps (mean {mean * 1000:.1f} ms), "
                f"{self.closes} closes, {self.forgotten} forgotten, {len(self.callers)} callers, "
                f"{self.undeliverable} undeliverable answers, dropped frames: {drops}")


class EnvServer:
    """Serves the ENV_CALLs that arrive on ``channel`` with ``host`` (see the module docstring). ``serve`` runs the
    socket loop on the calling thread until ``should_stop``; ``close`` ends it from any thread."""

    def __init__(self, channel: rpc.Responder, host: host_mod.EnvironmentHost, *,
                 on_drop: Callable[[str], None] | None = None, on_step: Callable[[float], None] | None = None,
                 idle_s: float = IDLE_EPISODE_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.host, self.on_drop, self.on_step, self.idle_s, self.clock = host, on_drop, on_step, idle_s, clock
        self.channel = channel
        self.address = channel.address
        self.served = Served()
        self.calls: queue.Queue[Pending | None] = queue.Queue()
        self.answers: queue.Queue[tuple[bytes, int, bytes]] = queue.Queue()
        self.waiting: dict[tuple[bytes, int], float] = {}    # (caller, call) -> when it was last told "busy"
        self.local: dict[Key, int] = {}                      # (caller, episode) -> the host's episode id
        self.touched: dict[int, tuple[Key, float]] = {}      # the host's id -> (key, last call)
        self.ids = itertools.count()
        self.stopped = threading.Event()
        self.done = threading.Event()                        # serve returned: sockets closed, workers gone
        self.pool = threading.Thread(target=self._pool, name="env-server-pool", daemon=True)

    # ------------------------------------------------------------ the socket thread

    def serve(self, should_stop: Callable[[], bool] = lambda: False) -> None:
        self.pool.start()
        try:
            while not (self.stopped.is_set() or should_stop()):
                self.channel.wait(_POLL_S, self._refuse)     # a call came, the pool has answers, or a busy is due
                self._take_calls()
                self._send_answers()
                self._send_busy()
        finally:
            self.stopped.set()
            self.calls.put(None)
            self.pool.join(timeout=30.0)
            self.channel.close()
            self.done.set()

    def close(self, *, wait_s: float = 0.0) -> None:
        """Stop serving; wait up to ``wait_s`` for ``serve`` to return (the worker processes shut down)."""
        self.stopped.set()
        if wait_s > 0 and self.pool.is_alive():
            self.done.wait(wait_s)

    def _refuse(self, reason: str) -> None:
        self.served.dropped[reason] += 1
        if self.on_drop is not None:
            try:
                self.on_drop(reason)
            except Exception:  # noqa: BLE001 - a metrics hook must never take the server down
                pass

    def _take_calls(self) -> None:
        while True:
            got = self.channel.recv(self._refuse)
            if got is None:
                return
            caller, frame = got
            msg = rpc.decode_as(frame, wire.EnvCall, self._refuse)
            if msg is None:
                continue
            self.served.callers.add(caller)
            if msg.op != "close":
                self.waiting[(caller, msg.call)] = self.clock()
            self.calls.put((caller, msg))

    def _send(self, caller: bytes, frame: bytes) -> None:
        if not self.channel.send(caller, frame):    # the caller is gone or not reading: its wait is bounded
            self.served.undeliverable += 1

    def _send_answers(self) -> None:
        while True:
            try:
                caller, call, frame = self.answers.get_nowait()
            except queue.Empty:
                return
            self.waiting.pop((caller, call), None)
            self._send(caller, frame)

    def _send_busy(self) -> None:
        now = self.clock()
        for (caller, call), told in list(self.waiting.items()):
            if now - told >= BUSY_EVERY_S:
                self.waiting[(caller, call)] = now
                self._send(caller, wire.encode(wire.EnvAnswer(call=call, busy=True)))

    # ------------------------------------------------------------ the pool thread

    def _pool(self) -> None:
        try:
            while not self.stopped.is_set():
                try:
                    first = self.calls.get(timeout=1.0)
                except queue.Empty:
                    self._forget_idle()
                    continue
                if first is None:
                    return
                batch = [first]
                while True:
                    try:
                        more = self.calls.get_nowait()
                    except queue.Empty:
                        break
                    if more is None:
                        self.stopped.set()
                        break
                    batch.append(more)
                for op, run in itertools.groupby(batch, key=lambda p: p[1].op):
                    self._serve_run(op, list(run))
                self._forget_idle()
        finally:
            self.host.shutdown()

    def _serve_run(self, op: str, run: list[Pending]) -> None:
        if op == "close":
            self._close([(caller, i) for caller, call in run for i in call.ids])
            return
        serve = self._reset if op == "reset" else self._step
        replies = serve([(caller, call, k) for caller, call in run for k in range(len(call.ids))])
        at = 0
        for caller, call in run:
            mine = tuple(_out(r, stepped=op == "step") for r in replies[at:at + len(call.ids)])
            at += len(call.ids)
            self.answers.put((caller, call.call, wire.encode(wire.EnvAnswer(call=call.call, replies=mine))))
        self.channel.wake()

    def _reset(self, items: Sequence[tuple[bytes, wire.EnvCall, int]]) -> list[host_mod.Reply]:
        now, todo = self.clock(), []
        for caller, call, k in items:
            key = (caller, call.ids[k])
            old = self.local.pop(key, None)
            if old is not None:
                self.host.close([old])
                self.touched.pop(old, None)
            i = next(self.ids)
            self.local[key], self.touched[i] = i, (key, now)
            todo.append((i, call.prompts[k]))
        self.served.resets += len(todo)
        return self.host.reset(todo)

    def _step(self, items: Sequence[tuple[bytes, wire.EnvCall, int]]) -> list[host_mod.Reply]:
        now = self.clock()
        out: list[host_mod.Reply | None] = [None] * len(items)
        todo: list[tuple[int, str]] = []
        where: list[int] = []
        for n, (caller, call, k) in enumerate(items):
            key = (caller, call.ids[k])
            i = self.local.get(key)
            if i is None:
                out[n] = host_mod.Reply(failure=host_mod.LOST, detail="this environment server does not know the "
                                        "episode (it restarted, or forgot it after a long silence)")
                continue
            self.touched[i] = (key, now)
            todo.append((i, call.texts[k]))
            where.append(n)
        for n, r in zip(where, self.host.step(todo) if todo else []):
            out[n] = r
            self.served.steps += 1
            self.served.step_seconds += r.seconds
            if self.on_step is not None:
                self.on_step(r.seconds)
        return [r if r is not None else host_mod.Reply(failure=host_mod.ERROR, detail="no reply") for r in out]

    def _close(self, keys: Sequence[Key]) -> None:
        ids = [i for i in (self.local.pop(k, None) for k in keys) if i is not None]
        for i in ids:
            self.touched.pop(i, None)
        self.served.closes += len(ids)
        if ids:
            self.host.close(ids)

    def _forget_idle(self) -> None:
        now = self.clock()
        stale = [key for key, at in self.touched.values() if now - at > self.idle_s]
        if stale:
            self._close(stale)
            self.served.closes -= len(stale)
            self.served.forgotten += len(stale)


def _out(r: host_mod.Reply, *, stepped: bool) -> wire.EnvReply:
    """A host reply as its wire form."""
    if r.failure:
        return wire.EnvReply(failure=r.failure, detail=r.detail[:host_mod.DETAIL_CHARS], seconds=max(0.0, r.seconds))
    if not stepped:
        return wire.EnvReply(messages=tuple((m["role"], m["content"]) for m in r.messages),
                             seconds=max(0.0, r.seconds))
    res = r.result
    assert res is not None and isinstance(res.observation, list)
    return wire.EnvReply(messages=tuple((m["role"], m["content"]) for m in res.observation), stepped=True,
                         done=res.done, reward=res.reward, tool_calls=res.tool_calls, tool_errors=res.tool_errors,
                         seconds=max(0.0, r.seconds))


def start(address: str, spec: rljob.EnvironmentSpec, *, workers: int, on_drop: Callable[[str], None] | None,
          on_step: Callable[[float], None] | None, should_stop: Callable[[], bool]) -> tuple[EnvServer, threading.Thread]:
    """A server at ``address`` (``rpc.bind``: the process's CURVE keys) over a ``workers.SubprocessHost`` of
    ``workers`` processes, serving on a daemon thread (returned) until ``should_stop`` or ``close``."""
    from kubeforge.runtime.agents.hosts import workers as workers_mod

    pool = workers_mod.SubprocessHost(spec, workers=workers)
    try:
        server = EnvServer(rpc.bind(address), pool, on_drop=on_drop, on_step=on_step)
    except BaseException:
        pool.shutdown()
        raise
    thread = threading.Thread(target=server.serve, args=(should_stop,), name="env-server", daemon=True)
    thread.start()
    return server, thread

