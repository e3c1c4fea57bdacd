"""Calls and answers between role processes: the environment RPC, behind two small Protocols, a factory, ZeroMQ and
in-memory backends (the request/answer sibling of ``transport``'s one-way channels).

Neighbours: ``agents.hosts.remote_host.RemoteHost`` (a generator) holds a :class:`Caller` towards every verifier's
environment server; ``agents.hosts.env_server.EnvServer`` holds a :class:`Responder`. Both ends ``wire.decode`` what
they receive and judge it (a stale answer, a frame of another kind): this module moves frames and says who is
connected, nothing more. ``transport`` gives the CURVE keys, the refused-handshake count and the reconnect intervals.

```
 generator (Caller)                                   verifier (Responder)
   send(s, frame) ─▶ link s ─ DEALER ══ CURVE ══▶ ROUTER ─▶ recv() -> (caller id, frame)
   recv(s) ◀──────────────────────────────────────────────── send(caller id, frame)  False: the caller is gone
   events(s): CONNECTED / DROPPED, in order               wait(timeout): a frame came, or wake() (any thread)
   wait(links, timeout): a frame or an event on one
```

Addresses as in ``transport``: ``tcp://host:port`` is ZeroMQ (a responder may bind ``tcp://127.0.0.1:*``; ``address``
tells the port); ``mem://name`` is the in-process backend the unit tests use: the same frames, the same connection
events (a caller connects when a responder is bound under the name, drops when it closes), no sockets.

Invariants:
- Nothing here waits unbounded: ``send`` never blocks (a link that is not connected refuses at once and nothing is
  queued: ``IMMEDIATE``; a full queue refuses too), ``recv`` returns None when nothing is there; the only waits are the
  two ``wait``s, each bounded by its timeout.
- What the transport itself refuses is counted through the ``refuse`` hook the owner passes: a multi-part ZeroMQ
  message (not ours) as ``wire.REASON_MALFORMED``, a peer that failed the CURVE handshake as ``unauthenticated``.
  Frames above ``wire.MAX_FRAME_BYTES`` cut their ZeroMQ peer off (``MAXMSGSIZE``); the in-memory backend does not
  bound them (its peers are the test's own code).
- A Caller or Responder is used by one thread, except :meth:`Responder.wake`. ``close`` never blocks and is idempotent;
  the end that was handed a channel owns it and closes it.
"""
from __future__ import annotations

import collections
import os
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol, TypeVar

import zmq
from zmq.utils import monitor as zmq_monitor

from kubeforge.runtime import transport, wire

CONNECTED = "connected"
DROPPED = "dropped"


class Caller(Protocol):
    """A caller's links to its servers; a link's index is its server's place in ``addresses``."""

    @property
    def addresses(self) -> Sequence[str]: ...

    def events(self, s: int) -> list[str]:
        """Link ``s``'s connection events since the last look, oldest first (:data:`CONNECTED`, :data:`DROPPED`)."""

    def send(self, s: int, frame: bytes) -> bool:
        """Queue ``frame`` towards server ``s`` without waiting; False when it cannot be queued (nothing was)."""

    def recv(self, s: int, refuse: transport.DropHook) -> bytes | None:
        """The next frame from server ``s`` without waiting, or None; what the transport refuses is counted."""

    def wait(self, links: Iterable[int], timeout_s: float) -> None:
        """Until a frame or a connection event on one of ``links``, or ``timeout_s``."""

    def close(self) -> None: ...


class Responder(Protocol):
    """A server's end: frames from any number of callers, each answered by the caller's id."""

    @property
    def address(self) -> str: ...

    def wait(self, timeout_s: float, refuse: transport.DropHook) -> None:
        """Until a frame may be there or :meth:`wake` was called, or ``timeout_s``; counts refused handshakes."""

    def recv(self, refuse: transport.DropHook) -> tuple[bytes, bytes] | None:
        """The next (caller id, frame) without waiting, or None; what the transport refuses is counted."""

    def send(self, caller: bytes, frame: bytes) -> bool:
        """Answer ``caller`` without waiting; False when undeliverable (the caller is gone, or not reading)."""

    def wake(self) -> None:
        """End a :meth:`wait` now (any thread: the server's pool thread has answers to send)."""

    def close(self) -> None: ...


# ---------------------------------------------------------------- factory


def connect(addresses: Sequence[str], *, name: str = "host", auth: transport.CurveKeys | None = None) -> Caller:
    """Links to the servers at ``addresses`` (all ``tcp://`` or all ``mem://``), named ``name`` plus this process and
    a random suffix (a restarted caller is a new one to the servers); tcp:// uses CURVE with ``auth`` (or the process
    default set by ``transport.use_curve``)."""
    schemes = {a.split("://", 1)[0] for a in addresses}
    identity = f"{name}-{os.getpid()}-{os.urandom(4).hex()}".encode()
    if schemes == {"tcp"}:
        return ZmqCaller(addresses, identity=identity, auth=auth or transport.process_curve())
    if schemes == {"mem"}:
        return MemCaller(addresses, identity=identity)
    raise transport.TransportError(f"servers must all be tcp:// or all mem://, got {sorted(addresses)}")


def bind(address: str, *, auth: transport.CurveKeys | None = None) -> Responder:
    """A responder bound at ``address`` (``tcp://host:port`` or ``mem://name``); tcp:// admits only holders of
    ``auth`` (or the process default)."""
    if address.startswith("tcp://"):
        return ZmqResponder(address, auth=auth or transport.process_curve())
    if address.startswith("mem://"):
        return MemResponder(address)
    raise transport.TransportError(f"unsupported address {address!r}: expected tcp://host:port or mem://name")


# ---------------------------------------------------------------- ZeroMQ


class _Link:
    """One DEALER towards one server, with a monitor that tells when it connects and disconnects."""

    def __init__(self, address: str, *, identity: bytes, auth: transport.CurveKeys | None) -> None:
        self.sock: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.DEALER)
        transport.curve_client(self.sock, auth)
        for opt, val in ((zmq.ROUTING_ID, identity), (zmq.LINGER, 0), (zmq.IMMEDIATE, 1),
                         (zmq.MAXMSGSIZE, wire.MAX_FRAME_BYTES), (zmq.RECONNECT_IVL, transport.RECONNECT_IVL_MS),
                         (zmq.RECONNECT_IVL_MAX, transport.RECONNECT_IVL_MAX_MS)):
            self.sock.setsockopt(opt, val)
        self.monitor: zmq.Socket[bytes] = self.sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED
                                                                       | zmq.EVENT_DISCONNECTED)
        try:
            self.sock.connect(address)
        except zmq.ZMQError as e:
            self.close()
            raise transport.TransportError(f"cannot connect to {address}: {e}") from e

    def close(self) -> None:
        self.sock.disable_monitor()
        self.monitor.close(0)
        self.sock.close(0)


class ZmqCaller:
    """One DEALER per server (routing id: the caller's identity), each with its connection monitor."""

    def __init__(self, addresses: Sequence[str], *, identity: bytes, auth: transport.CurveKeys | None) -> None:
        self._addresses = list(addresses)
        self._links: list[_Link] = []
        try:
            for a in addresses:
                self._links.append(_Link(a, identity=identity, auth=auth))
        except BaseException:
            self.close()
            raise
        self._closed = False

    @property
    def addresses(self) -> Sequence[str]:
        return self._addresses

    def events(self, s: int) -> list[str]:
        out, monitor = [], self._links[s].monitor
        while monitor.poll(0):
            event = zmq_monitor.recv_monitor_message(monitor)["event"]
            if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                out.append(CONNECTED)
            elif event == zmq.EVENT_DISCONNECTED:
                out.append(DROPPED)
        return out

    def send(self, s: int, frame: bytes) -> bool:
        try:
            self._links[s].sock.send(frame, zmq.NOBLOCK)
        except zmq.ZMQError:      # no connection to it (IMMEDIATE), or its queue is full: nothing was queued
            return False
        return True

    def recv(self, s: int, refuse: transport.DropHook) -> bytes | None:
        sock = self._links[s].sock
        while True:
            try:
                frame = sock.recv(zmq.NOBLOCK)
            except zmq.Again:
                return None
            if not sock.getsockopt(zmq.RCVMORE):
                return frame
            while sock.getsockopt(zmq.RCVMORE):     # multi-part messages are not ours: drain the rest, count once
                sock.recv()
            refuse(wire.REASON_MALFORMED)

    def wait(self, links: Iterable[int], timeout_s: float) -> None:
        poller = zmq.Poller()
        for s in links:
            poller.register(self._links[s].sock, zmq.POLLIN)
            poller.register(self._links[s].monitor, zmq.POLLIN)
        poller.poll(int(timeout_s * 1000))

    def close(self) -> None:
        if not getattr(self, "_closed", False):
            self._closed = True
            for link in self._links:
                link.close()


class ZmqResponder:
    """A bound ROUTER (``ROUTER_MANDATORY``: an answer to a caller that is gone fails instead of vanishing) and a
    pipe that :meth:`wake` writes to from any thread."""

    def __init__(self, address: str, *, auth: transport.CurveKeys | None) -> None:
        self._sock: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.ROUTER)
        for opt, val in ((zmq.LINGER, 0), (zmq.ROUTER_MANDATORY, 1), (zmq.MAXMSGSIZE, wire.MAX_FRAME_BYTES)):
            self._sock.setsockopt(opt, val)
        self._monitor = transport.curve_server(self._sock, auth)
        try:
            self._sock.bind(address)
        except zmq.ZMQError as e:
            transport.close_curve_server(self._sock, self._monitor)
            raise transport.TransportError(f"cannot bind {address}: {e}") from e
        self._address = str(self._sock.getsockopt_string(zmq.LAST_ENDPOINT))
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._wake_lock = threading.Lock()   # a wake from the pool thread never writes to a closed (reused) fd
        self._poller = zmq.Poller()
        self._poller.register(self._sock, zmq.POLLIN)
        self._poller.register(self._wake_r, zmq.POLLIN)
        self._closed = False

    @property
    def address(self) -> str:
        return self._address

    def wait(self, timeout_s: float, refuse: transport.DropHook) -> None:
        self._poller.poll(int(timeout_s * 1000))
        transport.count_refused(self._monitor, refuse)
        try:
            while os.read(self._wake_r, 4096):
                pass
        except BlockingIOError:
            pass

    def recv(self, refuse: transport.DropHook) -> tuple[bytes, bytes] | None:
        while True:
            try:
                parts = self._sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return None
            if len(parts) == 2:      # a routing id and one frame; anything else is not ours
                return parts[0], parts[1]
            refuse(wire.REASON_MALFORMED)

    def send(self, caller: bytes, frame: bytes) -> bool:
        try:
            self._sock.send_multipart([caller, frame], zmq.NOBLOCK)
        except zmq.ZMQError:     # the caller is gone (EHOSTUNREACH) or not reading (EAGAIN)
            return False
        return True

    def wake(self) -> None:
        with self._wake_lock:
            if self._closed:
                return
            try:
                os.write(self._wake_w, b"\0")
            except BlockingIOError:  # the pipe is full: a wake is pending already
                pass

    def close(self) -> None:
        with self._wake_lock:
            if self._closed:
                return
            self._closed = True
            os.close(self._wake_r)
            os.close(self._wake_w)
        transport.close_curve_server(self._sock, self._monitor)


# ---------------------------------------------------------------- in-process (unit tests)

_BOUND: dict[str, MemResponder] = {}
_COND = threading.Condition()     # guards every in-memory end; notified on each frame, wake, bind and close


class MemResponder:
    """A responder registered under a ``mem://`` name; callers' frames arrive in one queue, answers go to theirs."""

    def __init__(self, address: str) -> None:
        with _COND:
            if address in _BOUND:
                raise transport.TransportError(f"cannot bind {address}: address in use")
            _BOUND[address] = self
            _COND.notify_all()
        self._address = address
        self.inbox: collections.deque[tuple[bytes, bytes]] = collections.deque()
        self.callers: dict[bytes, collections.deque[bytes]] = {}   # caller id -> its inbox from this responder
        self.closed = False
        self._woken = False

    @property
    def address(self) -> str:
        return self._address

    def wait(self, timeout_s: float, refuse: transport.DropHook) -> None:
        with _COND:
            _COND.wait_for(lambda: bool(self.inbox) or self._woken or self.closed, timeout_s)
            self._woken = False

    def recv(self, refuse: transport.DropHook) -> tuple[bytes, bytes] | None:
        with _COND:
            return self.inbox.popleft() if self.inbox else None

    def send(self, caller: bytes, frame: bytes) -> bool:
        with _COND:
            inbox = None if self.closed else self.callers.get(caller)
            if inbox is None:
                return False
            inbox.append(frame)
            _COND.notify_all()
            return True

    def wake(self) -> None:
        with _COND:
            self._woken = True
            _COND.notify_all()

    def close(self) -> None:
        with _COND:
            self.closed = True
            if _BOUND.get(self._address) is self:
                del _BOUND[self._address]
            _COND.notify_all()


class _MemLink:
    def __init__(self, address: str) -> None:
        self.address = address
        self.peer: MemResponder | None = None         # the responder this link is connected to
        self.inbox: collections.deque[bytes] = collections.deque()

    def changed(self) -> bool:
        """Whether :meth:`MemCaller.events` has something to say (a responder bound, or the one it had closed)."""
        now = _BOUND.get(self.address)
        return now is not self.peer


class MemCaller:
    """Links to ``mem://`` responders of this process: connected while one is bound under the name."""

    def __init__(self, addresses: Sequence[str], *, identity: bytes) -> None:
        self._addresses = list(addresses)
        self._identity = identity
        self._links = [_MemLink(a) for a in addresses]

    @property
    def addresses(self) -> Sequence[str]:
        return self._addresses

    def events(self, s: int) -> list[str]:
        link, out = self._links[s], []
        with _COND:
            now = _BOUND.get(link.address)
            if link.peer is not None and now is not link.peer:
                out.append(DROPPED)
                link.peer.callers.pop(self._identity, None)
                link.peer = None
            if now is not None and link.peer is None:
                out.append(CONNECTED)
                link.peer = now
                now.callers[self._identity] = link.inbox
        return out

    def send(self, s: int, frame: bytes) -> bool:
        peer = self._links[s].peer
        with _COND:
            if peer is None or peer.closed:
                return False
            peer.inbox.append((self._identity, frame))
            _COND.notify_all()
            return True

    def recv(self, s: int, refuse: transport.DropHook) -> bytes | None:
        with _COND:
            inbox = self._links[s].inbox
            return inbox.popleft() if inbox else None

    def wait(self, links: Iterable[int], timeout_s: float) -> None:
        mine = [self._links[s] for s in links]
        with _COND:
            _COND.wait_for(lambda: any(link.inbox or link.changed() for link in mine), timeout_s)

    def close(self) -> None:
        with _COND:
            for link in self._links:
                if link.peer is not None:
                    link.peer.callers.pop(self._identity, None)
                    link.peer = None


T = TypeVar("T")
UNEXPECTED = "unexpected"   # a valid frame of another kind than the one the end expects


def decode_as(frame: bytes, kind: type[T], refuse: Callable[[str], None]) -> T | None:
    """``frame`` decoded as a ``kind`` message, or None after ``refuse(reason)``: a frame that does not decode (its
    wire reason) or a valid frame of another kind (``UNEXPECTED``). Both ends read their frames through it."""
    try:
        msg = wire.decode(frame)
    except wire.WireError as e:
        refuse(e.reason)
        return None
    if not isinstance(msg, kind):
        refuse(UNEXPECTED)
        return None
    return msg
