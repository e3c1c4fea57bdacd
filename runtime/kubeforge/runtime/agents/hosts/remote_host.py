"""``RemoteHost``: environment steps in the verifiers' environment servers, what the generators use.

```
 runner ─reset/step(batch)─▶ RemoteHost ─┬─ DEALER ─ENV_CALL─▶ verifier 0's server (env_server.py, PORT_ENV)
                                         ├─ DEALER ─ENV_CALL─▶ verifier 1's server      each: a SubprocessHost
                                         └─ ...                 ◀─ ENV_ANSWER (or BUSY while it works)
```

A new episode goes to the reachable server with the fewest live episodes of this host (ties: the next in turn), and
stays there (its environment's state lives in one worker there). A batch is one ENV_CALL per server, sent side by
side; the answers are awaited together.

Every wait is bounded: a server that says nothing (no answer, no BUSY) for ``turnTimeoutSeconds + margin_s``, one
whose connection drops, or a call that runs past ``total_s`` (the job's progress deadline) ends that server's
episodes of the call with ``env_lost``; its other live episodes end at their next step (their state went with it)
and no new episode goes there for ``DOWN_S`` (or until it connects again). The job goes on with the other servers;
with none left, new episodes end at once with ``env_lost``, counted like every failure.

Every frame in is ``wire.decode``d: anything refused, of another kind, or answering another call (a late answer to a
call given up) is counted by reason in ``dropped`` (and ``on_drop``) and skipped. CURVE with the job key
(``transport.process_curve``), as every socket of the roles. The server judges what the environment answered
(``host``); this side judges it again against its own bounds (a server is a peer, not a trusted part).

Neighbours: ``generator.start`` builds it (the verifiers' PORT_ENV addresses); ``env_server`` is the other end;
``host`` the interface and the outcome rules.
"""
from __future__ import annotations

import dataclasses
import itertools
import os
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import zmq
from zmq.utils import monitor as zmq_monitor

from kubeforge.runtime import transport, types, wire
from kubeforge.runtime.agents.hosts import host

MARGIN_S = 5.0        # over turnTimeoutSeconds: how long a server may say nothing (it says BUSY every second)
CONNECT_GRACE_S = 1.0  # a reset waits this long for the other servers once one is connected
DOWN_S = 30.0         # a server lost is not given new episodes for this long (unless it connects again)
REASON_STALE = "stale"
REASON_UNEXPECTED = "unexpected"
_POLL_MS = 100


class _Server:
    """One DEALER towards one server, with a monitor that tells when it connects and disconnects."""

    def __init__(self, address: str, *, identity: bytes, auth: transport.CurveKeys | None) -> None:
        self.address = address
        self.sock: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.DEALER)
        transport.curve_client(self.sock, auth)
        for opt, val in ((zmq.ROUTING_ID, identity), (zmq.LINGER, 0), (zmq.IMMEDIATE, 1),
                         (zmq.MAXMSGSIZE, wire.MAX_FRAME_BYTES), (zmq.RECONNECT_IVL, transport.RECONNECT_IVL_MS),
                         (zmq.RECONNECT_IVL_MAX, transport.RECONNECT_IVL_MAX_MS)):
            self.sock.setsockopt(opt, val)
        self.monitor: zmq.Socket[bytes] = self.sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED)
        self.sock.connect(address)
        self.connected = False
        self.down_until = 0.0
        self.live = 0

    def pump(self) -> bool:
        """Apply the monitor's events; True when the connection dropped since the last look."""
        dropped = False
        while self.monitor.poll(0):
            event = zmq_monitor.recv_monitor_message(self.monitor)["event"]
            if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self.connected, self.down_until = True, 0.0
            elif event == zmq.EVENT_DISCONNECTED:
                self.connected, dropped = False, True
        return dropped

    def close(self) -> None:
        self.sock.disable_monitor()
        self.monitor.close(0)
        self.sock.close(0)


@dataclasses.dataclass
class _Call:
    """One ENV_CALL in flight to one server: which items of the batch it carries, when the server last spoke."""

    server: int
    call: int
    items: list[int]
    heard: float


class RemoteHost:
    """``host.EnvironmentHost`` over the environment servers at ``addresses`` (see the module docstring)."""

    def __init__(self, addresses: Sequence[str], *, bounds: host.Bounds, name: str = "host",
                 auth: transport.CurveKeys | None = None, margin_s: float = MARGIN_S, total_s: float = 600.0,
                 on_drop: Callable[[str], None] | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        if not addresses:
            raise ValueError("a remote environment host needs at least one server")
        self.bounds, self.on_drop, self.clock = bounds, on_drop, clock
        self.silence_s, self.total_s = bounds.timeout_s + margin_s, max(total_s, bounds.timeout_s + margin_s)
        identity = f"{name}-{os.getpid()}-{os.urandom(4).hex()}".encode()   # a restarted caller is a new one
        auth = auth or transport.process_curve()
        self.servers = [_Server(a, identity=identity, auth=auth) for a in addresses]
        self.where: dict[int, int] = {}        # episode id -> server index
        self.lost: set[int] = set()            # episodes whose server was lost
        self.dropped: Counter[str] = Counter()
        self.lost_episodes = 0
        self.calls = itertools.count(1)
        self.turn = 0

    # ------------------------------------------------------------ EnvironmentHost

    def reset(self, items: Sequence[tuple[int, types.Prompt]]) -> list[host.Reply]:
        self._await_servers()
        out: list[host.Reply | None] = [None] * len(items)
        placed: dict[int, list[int]] = {}
        for k, (i, _) in enumerate(items):
            s = self._place()
            if s is None:
                out[k] = host.Reply(failure=host.LOST, detail="no environment server reachable")
                self.lost_episodes += 1
                continue
            self.where[i] = s
            self.lost.discard(i)
            self.servers[s].live += 1
            placed.setdefault(s, []).append(k)
        calls = {s: wire.EnvCall(call=next(self.calls), op="reset", ids=tuple(items[k][0] for k in ks),
                                 prompts=tuple(items[k][1] for k in ks)) for s, ks in placed.items()}
        return self._exchange(out, calls, placed, stepped=False)

    def step(self, items: Sequence[tuple[int, str]]) -> list[host.Reply]:
        out: list[host.Reply | None] = [None] * len(items)
        placed: dict[int, list[int]] = {}
        for k, (i, _) in enumerate(items):
            s = self.where.get(i)
            if s is None:
                out[k] = host.Reply(failure=host.ERROR, detail="unknown episode")
            elif i in self.lost:
                out[k] = host.Reply(failure=host.LOST, detail=f"its environment server {self.servers[s].address} "
                                    "was lost")
                self.lost_episodes += 1
            else:
                placed.setdefault(s, []).append(k)
        calls = {s: wire.EnvCall(call=next(self.calls), op="step", ids=tuple(items[k][0] for k in ks),
                                 texts=tuple(items[k][1] for k in ks)) for s, ks in placed.items()}
        return self._exchange(out, calls, placed, stepped=True)

    def close(self, ids: Sequence[int]) -> None:
        by: dict[int, list[int]] = {}
        for i in ids:
            s = self.where.pop(i, None)
            if s is not None:
                self.servers[s].live -= 1
                if i not in self.lost:
                    by.setdefault(s, []).append(i)
            self.lost.discard(i)
        for s, mine in by.items():
            try:     # never answered; a server that is gone forgets idle episodes by itself
                self.servers[s].sock.send(wire.encode(wire.EnvCall(call=next(self.calls), op="close",
                                                                   ids=tuple(mine))), zmq.NOBLOCK)
            except zmq.ZMQError:
                pass

    def shutdown(self) -> None:
        for s in self.servers:
            s.close()

    # ------------------------------------------------------------ internals

    def _usable(self, s: _Server, now: float) -> bool:
        s.pump()
        return s.connected and now >= s.down_until

    def _await_servers(self) -> None:
        """Wait until every server not marked down is connected: at a job's start the verifiers may still be coming
        up. Bounded: ``CONNECT_GRACE_S`` once one is there (the others get new episodes when they connect), the
        silence rule while none is."""
        until, some_at = self.clock() + self.silence_s, None
        while True:
            now = self.clock()
            usable = [self._usable(s, now) for s in self.servers]
            if all(u or now < s.down_until for u, s in zip(usable, self.servers)) or now >= until:
                return
            if any(usable):
                some_at = now if some_at is None else some_at
                if now - some_at >= CONNECT_GRACE_S:
                    return
            time.sleep(0.02)

    def _place(self) -> int | None:
        now = self.clock()
        ok = [k for k, s in enumerate(self.servers) if self._usable(s, now)]
        if not ok:
            return None
        n = len(self.servers)
        best = min(ok, key=lambda k: (self.servers[k].live, (k - self.turn) % n))
        self.turn = (best + 1) % n
        return best

    def _exchange(self, out: list[host.Reply | None], calls: dict[int, wire.EnvCall], placed: dict[int, list[int]],
                  *, stepped: bool) -> list[host.Reply]:
        """Send every server its call, then await the answers, each bounded (see the module docstring)."""
        now = self.clock()
        flying: dict[int, _Call] = {}
        for s, call in calls.items():
            self.servers[s].pump()    # a drop before this call is not this call's
            try:
                self.servers[s].sock.send(wire.encode(call), zmq.NOBLOCK)
            except zmq.ZMQError:      # no connection to it (IMMEDIATE): nothing was queued
                self._lose(s, placed[s], out, "the environment server is not connected")
                continue
            flying[s] = _Call(server=s, call=call.call, items=placed[s], heard=now)
        start = now
        while flying:
            self._wait(flying)
            for s, c in list(flying.items()):
                if self._receive(c, out, stepped=stepped):
                    del flying[s]
                    continue
                now = self.clock()
                why = ("its connection dropped" if self.servers[s].pump() else
                       f"no word for {self.silence_s:g} s" if now - c.heard > self.silence_s else
                       f"no answer within {self.total_s:g} s" if now - start > self.total_s else "")
                if why:
                    self._lose(s, c.items, out, f"the environment server {self.servers[s].address}: {why}")
                    del flying[s]
        return [r if r is not None else host.Reply(failure=host.ERROR, detail="no reply") for r in out]

    def _wait(self, flying: dict[int, _Call]) -> None:
        poller = zmq.Poller()
        for s in flying:
            poller.register(self.servers[s].sock, zmq.POLLIN)
            poller.register(self.servers[s].monitor, zmq.POLLIN)
        poller.poll(_POLL_MS)

    def _receive(self, c: _Call, out: list[host.Reply | None], *, stepped: bool) -> bool:
        """Read what server ``c.server`` sent; True once call ``c`` is answered."""
        sock = self.servers[c.server].sock
        while True:
            try:
                frame = sock.recv(zmq.NOBLOCK)
            except zmq.Again:
                return False
            if sock.getsockopt(zmq.RCVMORE):
                while sock.getsockopt(zmq.RCVMORE):
                    sock.recv()
                self._refuse(wire.REASON_MALFORMED)
                continue
            try:
                msg = wire.decode(frame)
            except wire.WireError as e:
                self._refuse(e.reason)
                continue
            if not isinstance(msg, wire.EnvAnswer):
                self._refuse(REASON_UNEXPECTED)
                continue
            if msg.call != c.call:
                self._refuse(REASON_STALE)
                continue
            c.heard = self.clock()
            if msg.busy:
                continue
            if len(msg.replies) != len(c.items):
                self._refuse(wire.REASON_MALFORMED)
                self._lose(c.server, c.items, out, f"the environment server answered {len(msg.replies)} replies "
                           f"for {len(c.items)} episodes")
                return True
            for k, r in zip(c.items, msg.replies):
                out[k] = _reply_in(r, bounds=self.bounds, stepped=stepped)
            return True

    def _lose(self, s: int, items: list[int], out: list[host.Reply | None], detail: str) -> None:
        """Server ``s`` is lost: these items end ``env_lost``, its other live episodes at their next step."""
        for k in items:
            out[k] = host.Reply(failure=host.LOST, detail=detail[:host.DETAIL_CHARS])
        self.lost_episodes += len(items)
        self.lost.update(i for i, at in self.where.items() if at == s)
        self.servers[s].down_until = self.clock() + DOWN_S

    def _refuse(self, reason: str) -> None:
        self.dropped[reason] += 1
        if self.on_drop is not None:
            try:
                self.on_drop(reason)
            except Exception:  # noqa: BLE001 - a metrics hook must never end an episode
                pass


def _reply_in(r: wire.EnvReply, *, bounds: host.Bounds, stepped: bool) -> host.Reply:
    """A wire reply judged again, against this side's bounds."""
    if r.failure:
        kind = r.failure if r.failure in host.FAILURES else host.ERROR
        return host.Reply(failure=kind, detail=r.detail[:host.DETAIL_CHARS], seconds=r.seconds)
    msgs: list[dict[str, Any]] = [{"role": role, "content": content} for role, content in r.messages]
    if not stepped:
        return host.judge_messages(msgs, bounds=bounds, seconds=r.seconds, where="reset")
    if not r.stepped:
        return host.Reply(failure=host.GARBAGE, detail="the server answered a step without a step result",
                          seconds=r.seconds)
    value = {"observation": msgs, "done": r.done, "reward": r.reward, "tool_calls": r.tool_calls,
             "tool_errors": r.tool_errors}
    return host.judge_result(value, bounds=bounds, seconds=r.seconds)
