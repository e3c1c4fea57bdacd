"""``RemoteHost``: environment steps in the verifiers' environment servers, what the generators use.

```
 runner ─reset/step(batch)─▶ RemoteHost ─▶ rpc.Caller ─┬─ link 0 ─ENV_CALL─▶ verifier 0's server (env_server.py)
                                                       ├─ link 1 ─ENV_CALL─▶ verifier 1's server   each: a
                                                       └─ ...     ◀─ ENV_ANSWER (or BUSY)           SubprocessHost
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
call given up) is counted by reason in ``dropped`` (and ``on_drop``) and skipped. The channel is injected
(``rpc.connect``): ZeroMQ with CURVE and the job key in the roles (``transport.process_curve``), as every socket of the
roles; in memory in the unit tests. The server judges what the environment answered (``host``); this side judges it
again against its own bounds (a server is a peer, not a trusted part).

Neighbours: ``generator.start`` builds it (``rpc.connect`` to the verifiers' PORT_ENV addresses); ``env_server`` is
the other end; ``host`` the interface and the outcome rules.
"""
from __future__ import annotations

import dataclasses
import itertools
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from kubeforge.runtime import rpc, types, wire
from kubeforge.runtime.agents.hosts import host

MARGIN_S = 5.0        # over turnTimeoutSeconds: how long a server may say nothing (it says BUSY every second)
CONNECT_GRACE_S = 1.0  # a reset waits this long for the other servers once one is connected
DOWN_S = 30.0         # a server lost is not given new episodes for this long (unless it connects again)
REASON_STALE = "stale"
REASON_UNEXPECTED = rpc.UNEXPECTED
_POLL_S = 0.1


@dataclasses.dataclass
class _Server:
    """What this host knows of one server: whether its link is connected, until when it is marked lost, and how many
    of this host's live episodes it holds."""

    address: str
    connected: bool = False
    down_until: float = 0.0
    live: int = 0


@dataclasses.dataclass
class _Call:
    """One ENV_CALL in flight to one server: which items of the batch it carries, when the server last spoke."""

    server: int
    call: int
    items: list[int]
    heard: float


class RemoteHost:
    """``host.EnvironmentHost`` over the environment servers ``channel`` links to (see the module docstring); it
    owns the channel and closes it at ``shutdown``."""

    def __init__(self, channel: rpc.Caller, *, bounds: host.Bounds, margin_s: float = MARGIN_S,
                 total_s: float = 600.0, on_drop: Callable[[str], None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not channel.addresses:
            channel.close()
            raise ValueError("a remote environment host needs at least one server")
        self.channel, self.bounds, self.on_drop, self.clock = channel, bounds, on_drop, clock
        self.silence_s, self.total_s = bounds.timeout_s + margin_s, max(total_s, bounds.timeout_s + margin_s)
        self.servers = [_Server(a) for a in channel.addresses]
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
        for s, mine in by.items():   # never answered; a server that is gone forgets idle episodes by itself
            self.channel.send(s, wire.encode(wire.EnvCall(call=next(self.calls), op="close", ids=tuple(mine))))

    def shutdown(self) -> None:
        self.channel.close()

    # ------------------------------------------------------------ internals

    def _pump(self, s: int) -> bool:
        """Apply server ``s``'s connection events; True when its connection dropped since the last look."""
        server, dropped = self.servers[s], False
        for event in self.channel.events(s):
            if event == rpc.CONNECTED:
                server.connected, server.down_until = True, 0.0
            else:
                server.connected, dropped = False, True
        return dropped

    def _usable(self, s: int, now: float) -> bool:
        self._pump(s)
        return self.servers[s].connected and now >= self.servers[s].down_until

    def _await_servers(self) -> None:
        """Wait until every server not marked down is connected: at a job's start the verifiers may still be coming
        up. Bounded: ``CONNECT_GRACE_S`` once one is there (the others get new episodes when they connect), the
        silence rule while none is."""
        until, some_at = self.clock() + self.silence_s, None
        while True:
            now = self.clock()
            usable = [self._usable(s, now) for s in range(len(self.servers))]
            if all(u or now < s.down_until for u, s in zip(usable, self.servers)) or now >= until:
                return
            if any(usable):
                some_at = now if some_at is None else some_at
                if now - some_at >= CONNECT_GRACE_S:
                    return
            time.sleep(0.02)

    def _place(self) -> int | None:
        now = self.clock()
        ok = [k for k in range(len(self.servers)) if self._usable(k, now)]
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
            self._pump(s)    # a drop before this call is not this call's
            if not self.channel.send(s, wire.encode(call)):    # no connection to it: nothing was queued
                self._lose(s, placed[s], out, "the environment server is not connected")
                continue
            flying[s] = _Call(server=s, call=call.call, items=placed[s], heard=now)
        start = now
        while flying:
            self.channel.wait(flying, _POLL_S)
            for s, c in list(flying.items()):
                if self._receive(c, out, stepped=stepped):
                    del flying[s]
                    continue
                now = self.clock()
                why = ("its connection dropped" if self._pump(s) else
                       f"no word for {self.silence_s:g} s" if now - c.heard > self.silence_s else
                       f"no answer within {self.total_s:g} s" if now - start > self.total_s else "")
                if why:
                    self._lose(s, c.items, out, f"the environment server {self.servers[s].address}: {why}")
                    del flying[s]
        return [r if r is not None else host.Reply(failure=host.ERROR, detail="no reply") for r in out]

    def _receive(self, c: _Call, out: list[host.Reply | None], *, stepped: bool) -> bool:
        """Read what server ``c.server`` sent; True once call ``c`` is answered."""
        while True:
            frame = self.channel.recv(c.server, self._refuse)
            if frame is None:
                return False
            msg = rpc.decode_as(frame, wire.EnvAnswer, self._refuse)
            if msg is None:
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
