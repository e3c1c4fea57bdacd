"""Moving wire messages between role processes: two small Protocols, a factory, ZeroMQ and in-process backends.

Neighbours: ``wire`` turns messages into frames and back (every received frame goes through ``wire.decode``);
the roles (``generator/``, ``verifier/``, ``trainer/``) open one ``Receiver`` on their data port and ``Sender``s
towards their peers, chosen by address scheme through ``open_sender``/``open_receiver``; ``metrics`` counts drops
through ``on_drop``.

Addresses: ``tcp://host:port`` is ZeroMQ (the host may be a DNS name that resolves late: a pod's headless-Service
name; ZeroMQ resolves and reconnects in the background, every ``RECONNECT_IVL``); ``tcp://127.0.0.1:*`` binds an
ephemeral port (``Receiver.address`` tells which). ``mem://name`` is the in-process backend for unit tests: a
bounded queue per name, same semantics, same encoding.

Topology (one PULL per receiving process, one PUSH per (sender, peer) pair)::

    generator g ─PUSH──┐                          verifier v ─PUSH[0]──▶ trainer 0 PULL
    generator h ─PUSH──┼─▶ verifier v PULL         verifier v ─PUSH[1]──▶ trainer 1 PULL
                       │   (fair-queued)                  send(msg, to=index % trainers)
    send(msg): round robin over verifiers whose queue has room

Why nothing is silently dropped:
- Sockets use ``IMMEDIATE``: a frame is only queued on a connection whose ZeroMQ handshake has completed, never
  into a pipe towards a peer that has not joined (slow joiners) or never will.
- Every connection starts with a ``HELLO`` frame (re-sent after a reconnect), and ``open_sender`` waits, up to
  ``ready_timeout``, until every peer has completed the handshake: a missing peer is an error naming it.
- High-water marks are bounded (``SNDHWM``/``RCVHWM`` = ``hwm`` frames; the kernel's socket buffers add a few MB
  on top). When a peer's queue is full the sender blocks (polling for room) instead of queueing more or dropping:
  backpressure reaches the trainer's bounded work window. A send that cannot complete by its timeout raises ``TransportTimeout``: the caller knows it was not sent.
- Batches: ``send_many`` packs the groups it is given (all ready at once: a generator's sampled batch, the groups
  a verifier found already queued) into BATCH frames (``wire.pack``: bounded in bytes, spread over the peers); it
  never waits for more, so a group sent alone leaves at once. The receiver unpacks a BATCH and delivers its groups one
  by one, in order; a bad BATCH is refused whole, counted once.
- The only frames a receiver discards are ones ``wire.decode`` refuses (foreign, wrong version, malformed,
  multi-part): each is counted by reason in ``Receiver.dropped`` and reported to ``on_drop``; the receiver keeps
  delivering the good frames that follow. Frames queued towards a peer that dies are lost with it; the trainer's
  bounded window and staleness rules re-issue that work (a restart resumes from the checkpointed cursor).

Invariants: a Sender or Receiver is used by one thread. ``close`` never blocks (``LINGER`` 0) and is idempotent.
"""
from __future__ import annotations

import collections
import dataclasses
import hashlib
import hmac
import queue
import threading
import time
from collections import Counter
from typing import Callable, Mapping, Protocol, Sequence

import zmq
from zmq.utils import monitor as zmq_monitor
from zmq.utils import z85

from kubeforge.runtime import wire

DEFAULT_HWM = 64
DEFAULT_READY_TIMEOUT = 300.0
RECONNECT_IVL_MS = 100
RECONNECT_IVL_MAX_MS = 2000
_POLL_SLICE_S = 0.05
# Frames under this size are copied into ZeroMQ; larger ones go zero-copy. Zero-copy pays a fixed cost per message
# (a tracked frame released later by pyzmq's collector thread) that beats copying only for large frames: for the
# ~68 KB batch of 16 small groups, copying cut the sender's CPU by ~0.4 us a group (bench_transport, 2026-11-24).
_COPY_BELOW = 256 << 10
_PUMP_EVERY_S = 0.05  # how stale a peer's connected/disconnected state may be on the fast send path

DropHook = Callable[[str], None]

# A frame (or a whole connection) refused because the peer failed the CURVE handshake: it does not hold the job key.
REASON_UNAUTHENTICATED = "unauthenticated"
ZAP_DOMAIN = "kubeforge"
_HANDSHAKE_FAILED = (zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                     | zmq.EVENT_HANDSHAKE_FAILED_AUTH)


@dataclasses.dataclass(frozen=True)
class CurveKeys:
    """The job's ZeroMQ CURVE key pair (Z85), derived from the job key: every role is server and client with it, so
    only a holder of the job key completes a handshake (docs/security.md). ``domain`` is the ZAP domain a server
    socket with these keys admits clients in: only this key pair's public key is allowed there, so a process that
    serves several jobs (a GeneratorPool's engine: one socket per job, each with its job's keys and a domain of its
    own) admits on each socket that job's key alone."""

    public: bytes
    secret: bytes
    domain: str = ZAP_DOMAIN

    @classmethod
    def from_job_key(cls, job_key: bytes, *, domain: str = ZAP_DOMAIN) -> CurveKeys:
        secret = z85.encode(hmac.new(job_key, b"kubeforge/curve", hashlib.sha256).digest())
        return cls(public=zmq.curve_public(secret), secret=secret, domain=domain)


_default_auth: CurveKeys | None = None


def use_curve(keys: CurveKeys | None) -> None:
    """Make every tcp:// socket this process opens from now on use CURVE with ``keys`` (None: plain sockets).
    A role calls this once, before opening any socket, with its job's keys."""
    global _default_auth
    _default_auth = keys
    if keys is not None:
        _Authenticator.get().allow(keys.public, domain=keys.domain)


def process_curve() -> CurveKeys | None:
    """The keys :func:`use_curve` set for this process (None: plain sockets)."""
    return _default_auth


def curve_server(sock: zmq.Socket[bytes], auth: CurveKeys | None) -> zmq.Socket[bytes] | None:
    """Make ``sock`` (not yet bound) a CURVE server that admits only holders of ``auth`` (None: leave it plain);
    returns a monitor socket whose events are its failed handshakes (one per refused peer), None when plain."""
    if auth is None:
        return None
    _Authenticator.get().allow(auth.public, domain=auth.domain)   # no peer without the job key completes a handshake
    sock.setsockopt(zmq.CURVE_SERVER, 1)
    sock.setsockopt(zmq.CURVE_SECRETKEY, auth.secret)
    sock.setsockopt(zmq.CURVE_PUBLICKEY, auth.public)
    sock.setsockopt(zmq.ZAP_DOMAIN, auth.domain.encode())
    return sock.get_monitor_socket(_HANDSHAKE_FAILED)


def curve_client(sock: zmq.Socket[bytes], auth: CurveKeys | None) -> None:
    """Make ``sock`` (not yet connected) a CURVE client with the job's own key pair (the server admits only that
    one); None leaves it plain."""
    if auth is not None:
        sock.setsockopt(zmq.CURVE_SERVERKEY, auth.public)
        sock.setsockopt(zmq.CURVE_PUBLICKEY, auth.public)
        sock.setsockopt(zmq.CURVE_SECRETKEY, auth.secret)


def count_refused(monitor: zmq.Socket[bytes] | None, refuse: Callable[[str], None]) -> None:
    """Each failed handshake a ``curve_server`` monitor reported since the last look, as one ``unauthenticated``."""
    while monitor is not None and monitor.poll(0):
        zmq_monitor.recv_monitor_message(monitor)
        refuse(REASON_UNAUTHENTICATED)


def close_curve_server(sock: zmq.Socket[bytes], monitor: zmq.Socket[bytes] | None) -> None:
    """Close a socket that ``curve_server`` made a server, and its monitor (None: a plain socket), without waiting."""
    if monitor is not None:
        sock.disable_monitor()
        monitor.close(0)
    sock.close(0)


class _Authenticator:
    """The process's ZAP handler: admits a CURVE client only when its public key is the one allowed in the server
    socket's ZAP domain (the job's; one domain per job where a process serves several)."""

    _instance: _Authenticator | None = None
    _lock = threading.Lock()

    def __init__(self) -> None:
        from zmq.auth.thread import ThreadAuthenticator

        self.allowed: dict[str, set[bytes]] = {}
        self.refused = 0
        self._auth = ThreadAuthenticator(zmq.Context.instance())
        self._auth.start()

    @classmethod
    def get(cls) -> _Authenticator:
        with cls._lock:
            if cls._instance is None:
                cls._instance = cls()
            return cls._instance

    def allow(self, public: bytes, *, domain: str = ZAP_DOMAIN) -> None:
        with self._lock:
            if domain not in self.allowed:
                self.allowed[domain] = set()
                self._auth.configure_curve_callback(domain=domain, credentials_provider=self)
            self.allowed[domain].add(public)

    def callback(self, domain: str, key: bytes) -> bool:
        allowed = self.allowed.get(domain, set())
        ok = z85.encode(key) in allowed if len(key) == 32 else key in allowed
        if not ok:
            self.refused += 1
        return ok


class TransportError(RuntimeError):
    """A transport could not be opened or used (bad address, address in use, closed)."""


class TransportTimeout(TransportError, TimeoutError):
    """A send or the ready handshake did not complete in time; the message was not sent."""


class Sender(Protocol):
    """Sends messages to an ordered list of peers (index = the peer's replica index)."""

    @property
    def peers(self) -> int: ...

    def add_peer(self, address: str) -> int:
        """Connect one more peer (a generator that joined a running job); returns its index."""

    def send(self, msg: wire.Message, *, to: int | None = None, timeout: float | None = None) -> None:
        """Send to peer ``to``, or round robin over peers with room when None. Blocks while the queue is full;
        raises ``TransportTimeout`` after ``timeout`` seconds (None: the sender's default, possibly forever)."""

    def send_frame(self, frame: bytes, *, to: int | None = None, timeout: float | None = None) -> None:
        """Send one already-encoded frame (``wire.encode``/``wire.pack``), like ``send``."""

    def send_many(self, msgs: Sequence[wire.Message], *, to: int | None = None,
                  timeout: float | None = None) -> None:
        """Send ``msgs`` in as few frames as ``wire.pack`` makes (spread over the peers when ``to`` is None), each
        frame like ``send``; ``timeout`` applies per frame."""

    def close(self) -> None: ...


class Receiver(Protocol):
    """Receives validated messages from any number of senders (fair-queued)."""

    @property
    def address(self) -> str: ...

    @property
    def dropped(self) -> Mapping[str, int]:
        """Refused frames so far, by ``wire`` reason."""

    @property
    def hellos(self) -> Sequence[wire.Hello]:
        """HELLO frames seen (one per connection, again after reconnects), oldest first."""

    def recv(self, timeout: float | None = None) -> wire.Message | None:
        """The next valid message, or None after ``timeout`` seconds (None: wait forever)."""

    @property
    def pending(self) -> int:
        """Messages already received and unpacked (the rest of a BATCH): ``recv`` returns these without waiting."""

    def close(self) -> None: ...


# ---------------------------------------------------------------- factory


def tcp_address(host: str, port: int) -> str:
    """The ZeroMQ address of ``host:port`` (IPv6 literals bracketed)."""
    return f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"


def open_receiver(address: str, *, hwm: int = DEFAULT_HWM, on_drop: DropHook | None = None,
                  auth: CurveKeys | None = None) -> Receiver:
    """Bind a receiver at ``address`` (``tcp://host:port`` or ``mem://name``); tcp:// uses CURVE with ``auth`` (or
    the process default set by :func:`use_curve`)."""
    if address.startswith("tcp://"):
        return ZmqReceiver(address, hwm=hwm, on_drop=on_drop, auth=auth or _default_auth)
    if address.startswith("mem://"):
        return MemReceiver(address, hwm=hwm, on_drop=on_drop)
    raise TransportError(f"unsupported address {address!r}: expected tcp://host:port or mem://name")


def open_sender(peers: Sequence[str], *, role: str, index: int, hwm: int = DEFAULT_HWM,
                ready_timeout: float | None = DEFAULT_READY_TIMEOUT, send_timeout: float | None = None,
                auth: CurveKeys | None = None) -> Sender:
    """Connect to ``peers`` (all ``tcp://`` or all ``mem://``), waiting up to ``ready_timeout`` seconds for every
    peer's handshake (None: don't wait; sends then block until their peer is there). ``role``/``index`` name this
    process in the HELLO frames."""
    if not peers:
        raise TransportError("a sender needs at least one peer")
    schemes = {p.split("://", 1)[0] for p in peers}
    hello = wire.encode(wire.Hello(role=role, index=index))
    sender: ZmqSender | MemSender
    if schemes == {"tcp"}:
        sender = ZmqSender(peers, hello=hello, hwm=hwm, send_timeout=send_timeout, auth=auth or _default_auth)
    elif schemes == {"mem"}:
        sender = MemSender(peers, hello=hello, send_timeout=send_timeout)
    else:
        raise TransportError(f"peers must all be tcp:// or all mem://, got {sorted(peers)}")
    if ready_timeout is not None:
        try:
            sender.wait_ready(ready_timeout)
        except BaseException:
            sender.close()
            raise
    return sender


# ---------------------------------------------------------------- shared receive logic


class _Inbox:
    """Decode, count and filter frames: the part of receiving both backends share."""

    def __init__(self, on_drop: DropHook | None) -> None:
        self.dropped: Counter[str] = Counter()
        self.hellos: list[wire.Hello] = []
        self.pending: collections.deque[wire.Message] = collections.deque()   # the rest of the last BATCH
        self._on_drop = on_drop

    def refuse(self, reason: str) -> None:
        self.dropped[reason] += 1
        if self._on_drop is not None:
            try:
                self._on_drop(reason)
            except Exception:  # a metrics hook must never take the receiver down
                pass

    def accept(self, frame: bytes | memoryview) -> wire.Message | None:
        """The message to deliver, or None (refused and counted, or a HELLO recorded)."""
        try:
            msg = wire.decode(frame)
        except wire.WireError as e:
            self.refuse(e.reason)
            return None
        if isinstance(msg, wire.Hello):
            self.hellos.append(msg)
            return None
        if isinstance(msg, wire.Batch):
            self.pending.extend(msg.messages[1:])
            return msg.messages[0]
        return msg


def _deadline(timeout: float | None) -> float | None:
    return None if timeout is None else time.monotonic() + max(0.0, timeout)


def _remaining(deadline: float | None) -> float | None:
    return None if deadline is None else max(0.0, deadline - time.monotonic())


class _BoundReceiver:
    """What every receiver shares: its bound address and the inbox that counts drops and keeps HELLOs."""

    _address: str
    _inbox: _Inbox

    @property
    def address(self) -> str:
        return self._address

    @property
    def dropped(self) -> Mapping[str, int]:
        return self._inbox.dropped

    @property
    def hellos(self) -> Sequence[wire.Hello]:
        return self._inbox.hellos

    @property
    def pending(self) -> int:
        return len(self._inbox.pending)


# ---------------------------------------------------------------- ZeroMQ


class ZmqReceiver(_BoundReceiver):
    """A bound PULL socket; fair-queues frames from every connected sender."""

    def __init__(self, address: str, *, hwm: int, on_drop: DropHook | None, auth: CurveKeys | None = None) -> None:
        self._sock: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.PULL)
        self._sock.setsockopt(zmq.RCVHWM, hwm)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.MAXMSGSIZE, wire.MAX_FRAME_BYTES)  # an oversize peer is cut off, not buffered
        self._monitor = curve_server(self._sock, auth)
        try:
            self._sock.bind(address)
        except zmq.ZMQError as e:
            self._close_sockets()
            raise TransportError(f"cannot bind {address}: {e}") from e
        self._address = str(self._sock.getsockopt_string(zmq.LAST_ENDPOINT))
        self._inbox = _Inbox(on_drop)
        self._closed = False

    def recv(self, timeout: float | None = None) -> wire.Message | None:
        if self._closed:
            raise TransportError("receiver is closed")
        if self._inbox.pending:   # the rest of a BATCH
            return self._inbox.pending.popleft()
        msg = self._drain()  # fast path: a frame is already queued
        if msg is not None:
            return msg
        deadline = _deadline(timeout)
        while True:
            left = _remaining(deadline)
            wait_ms = None if left is None else int(left * 1000)
            if self._monitor is not None:   # wake up now and then to count refused handshakes
                wait_ms = 1000 if wait_ms is None else min(wait_ms, 1000)
            if not self._sock.poll(wait_ms):
                self._audit()
                if left is None or (deadline is not None and time.monotonic() < deadline):
                    continue
                return None
            msg = self._drain()
            if msg is not None:
                return msg
            if deadline is not None and time.monotonic() >= deadline:
                return None

    def _audit(self) -> None:
        """Count every failed CURVE handshake (a peer without the job key) as an ``unauthenticated`` drop."""
        count_refused(self._monitor, self._inbox.refuse)

    def _drain(self) -> wire.Message | None:
        """Read frames while any are queued (no poll per frame); the first valid message, or None when empty."""
        self._audit()
        while True:
            try:
                frame = self._sock.recv(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return None
            if frame.more:  # multi-part messages are not ours: drain the rest, count once
                while self._sock.recv(copy=False).more:
                    pass
                self._inbox.refuse(wire.REASON_MALFORMED)
                continue
            msg = self._inbox.accept(frame.buffer)
            if msg is not None:
                return msg

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._close_sockets()

    def _close_sockets(self) -> None:
        close_curve_server(self._sock, self._monitor)


class _Peer:
    """One PUSH socket towards one peer, with a monitor that tells when its ZeroMQ handshake completes."""

    def __init__(self, ctx: zmq.Context[zmq.Socket[bytes]], address: str, hwm: int,
                 auth: CurveKeys | None = None) -> None:
        self.address = address
        self.sock = ctx.socket(zmq.PUSH)
        curve_client(self.sock, auth)
        for opt, val in ((zmq.SNDHWM, hwm), (zmq.LINGER, 0), (zmq.IMMEDIATE, 1),
                         (zmq.RECONNECT_IVL, RECONNECT_IVL_MS), (zmq.RECONNECT_IVL_MAX, RECONNECT_IVL_MAX_MS)):
            self.sock.setsockopt(opt, val)
        self.monitor = self.sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED)
        try:
            self.sock.connect(address)
        except zmq.ZMQError as e:
            self.close()
            raise TransportError(f"cannot connect to {address}: {e}") from e
        self.connected = False
        self.greeted = False
        self.pumped = 0.0

    def pump(self, wait_s: float = 0.0) -> None:
        """Apply pending monitor events (connected / disconnected); wait up to ``wait_s`` for the first."""
        self.pumped = time.monotonic()
        timeout_ms = int(wait_s * 1000)
        while self.monitor.poll(timeout_ms):
            event = zmq_monitor.recv_monitor_message(self.monitor)["event"]
            if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self.connected = True
            elif event == zmq.EVENT_DISCONNECTED:
                self.connected = self.greeted = False  # the HELLO goes out again on the next connection
            timeout_ms = 0

    def close(self) -> None:
        self.sock.disable_monitor()
        self.monitor.close(0)
        self.sock.close(0)


class _SenderBase:
    """What every sender shares: encoding, and the checks before a frame goes out."""

    _closed: bool
    _send_timeout: float | None

    @property
    def peers(self) -> int:
        raise NotImplementedError

    def send(self, msg: wire.Message, *, to: int | None = None, timeout: float | None = None) -> None:
        self.send_frame(wire.encode(msg), to=to, timeout=timeout)

    def send_frame(self, frame: bytes, *, to: int | None = None, timeout: float | None = None) -> None:
        raise NotImplementedError

    def send_many(self, msgs: Sequence[wire.Message], *, to: int | None = None,
                  timeout: float | None = None) -> None:
        for frame in wire.pack(list(msgs), parts=self.peers if to is None else 1):
            self.send_frame(frame, to=to, timeout=timeout)

    def _begin_send(self, *, to: int | None, timeout: float | None) -> float | None:
        """Refuse a closed sender or a bad peer index; return the send's deadline."""
        if self._closed:
            raise TransportError("sender is closed")
        if to is not None and not 0 <= to < self.peers:
            raise TransportError(f"peer index {to} out of range [0, {self.peers})")
        return _deadline(self._send_timeout if timeout is None else timeout)


class ZmqSender(_SenderBase):
    """One PUSH socket per peer: chosen-peer routing and round robin over peers that have room."""

    def __init__(self, peers: Sequence[str], *, hello: bytes, hwm: int, send_timeout: float | None,
                 auth: CurveKeys | None = None) -> None:
        ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self._peers: list[_Peer] = []
        try:
            for address in peers:
                self._peers.append(_Peer(ctx, address, hwm, auth))
        except BaseException:
            self.close()
            raise
        self._hello = hello
        self._hwm = hwm
        self._auth = auth
        self._send_timeout = send_timeout
        self._next = 0
        self._poller = zmq.Poller()
        for p in self._peers:
            self._poller.register(p.sock, zmq.POLLOUT)
        self._closed = False

    @property
    def peers(self) -> int:
        return len(self._peers)

    def add_peer(self, address: str) -> int:
        p = _Peer(zmq.Context.instance(), address, self._hwm, self._auth)   # the same CURVE keys as the others
        self._peers.append(p)
        self._poller.register(p.sock, zmq.POLLOUT)
        return len(self._peers) - 1

    def wait_ready(self, timeout: float) -> None:
        """Block until every peer's handshake has completed and it has been sent its HELLO."""
        deadline = _deadline(timeout)
        for p in self._peers:
            while not p.connected:
                left = _remaining(deadline)
                if not left:
                    raise TransportTimeout(f"peer {p.address} not ready after {timeout:g}s")
                p.pump(min(left, _POLL_SLICE_S))
            self._send_on(p, b"", deadline)

    def send_frame(self, frame: bytes, *, to: int | None = None, timeout: float | None = None) -> None:
        """Send an already-encoded frame (fan-out without re-encoding; tests and benches send raw bytes)."""
        deadline = self._begin_send(to=to, timeout=timeout)
        if to is not None:
            self._send_on(self._peers[to], frame, deadline)
            return
        n = len(self._peers)
        for k in range(n):  # fast path: the next peer in turn has room
            p = self._peers[(self._next + k) % n]
            if time.monotonic() - p.pumped > _PUMP_EVERY_S:
                p.pump()
            if p.connected and self._try_send(p, frame):
                self._next = (self._next + k + 1) % n
                return
        while True:
            for p in self._peers:
                p.pump()
            ready = dict(self._poller.poll(self._slice_ms(deadline)))
            for k in range(n):
                p = self._peers[(self._next + k) % n]
                if ready.get(p.sock, 0) & zmq.POLLOUT and self._try_send(p, frame):
                    self._next = (self._next + k + 1) % n
                    return
            self._check(deadline, "any peer")

    def _send_on(self, p: _Peer, frame: bytes, deadline: float | None) -> None:
        """Blocking send to one peer (b"" sends only the pending HELLO)."""
        if time.monotonic() - p.pumped > _PUMP_EVERY_S:
            p.pump()
        if self._try_send(p, frame):  # fast path: room in the queue
            return
        while True:
            p.pump()
            if p.sock.poll(self._slice_ms(deadline), zmq.POLLOUT) and self._try_send(p, frame):
                return
            self._check(deadline, p.address)

    def _try_send(self, p: _Peer, frame: bytes) -> bool:
        try:
            if not p.greeted:
                p.sock.send(self._hello, zmq.NOBLOCK)
                p.greeted = True
            if frame:
                p.sock.send(frame, zmq.NOBLOCK, copy=len(frame) < _COPY_BELOW)
            return True
        except zmq.Again:
            return False

    @staticmethod
    def _slice_ms(deadline: float | None) -> int:
        left = _remaining(deadline)
        return int(1000 * (_POLL_SLICE_S if left is None else min(left, _POLL_SLICE_S)))

    @staticmethod
    def _check(deadline: float | None, who: str) -> None:
        if deadline is not None and time.monotonic() >= deadline:
            raise TransportTimeout(f"send to {who} timed out: queue full or peer gone")

    def close(self) -> None:
        if not getattr(self, "_closed", False):
            self._closed = True
            for p in self._peers:
                p.close()


# ---------------------------------------------------------------- in-process (unit tests)

_MEM: dict[str, queue.Queue[bytes]] = {}
_MEM_LOCK = threading.Lock()


class MemReceiver(_BoundReceiver):
    """A bounded in-process queue registered under a ``mem://`` name; frames are encoded bytes like on the wire."""

    def __init__(self, address: str, *, hwm: int, on_drop: DropHook | None) -> None:
        with _MEM_LOCK:
            if address in _MEM:
                raise TransportError(f"cannot bind {address}: address in use")
            self._queue: queue.Queue[bytes] = queue.Queue(maxsize=hwm)
            _MEM[address] = self._queue
        self._address = address
        self._inbox = _Inbox(on_drop)
        self._closed = False

    def recv(self, timeout: float | None = None) -> wire.Message | None:
        if self._closed:
            raise TransportError("receiver is closed")
        if self._inbox.pending:
            return self._inbox.pending.popleft()
        deadline = _deadline(timeout)
        while True:
            try:
                frame = self._queue.get(timeout=_remaining(deadline))
            except queue.Empty:
                return None
            msg = self._inbox.accept(frame)
            if msg is not None:
                return msg

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            with _MEM_LOCK:
                if _MEM.get(self._address) is self._queue:
                    del _MEM[self._address]


class MemSender(_SenderBase):
    """Sends to ``mem://`` receivers of this process; blocks while a receiver's bounded queue is full."""

    def __init__(self, peers: Sequence[str], *, hello: bytes, send_timeout: float | None) -> None:
        self._addresses = list(peers)
        self._greeted = [False] * len(peers)
        self._hello = hello
        self._send_timeout = send_timeout
        self._next = 0
        self._closed = False

    @property
    def peers(self) -> int:
        return len(self._addresses)

    def add_peer(self, address: str) -> int:
        self._addresses.append(address)
        self._greeted.append(False)
        return len(self._addresses) - 1

    def wait_ready(self, timeout: float) -> None:
        deadline = _deadline(timeout)
        for i in range(len(self._addresses)):
            self._put(i, b"", deadline)

    def send_frame(self, frame: bytes, *, to: int | None = None, timeout: float | None = None) -> None:
        deadline = self._begin_send(to=to, timeout=timeout)
        if to is None:
            to = self._next
            self._next = (self._next + 1) % len(self._addresses)
        self._put(to, frame, deadline)

    def _put(self, i: int, frame: bytes, deadline: float | None) -> None:
        address = self._addresses[i]
        while True:
            with _MEM_LOCK:
                q = _MEM.get(address)
            if q is not None:
                break
            left = _remaining(deadline)
            if left == 0.0:
                raise TransportTimeout(f"peer {address} not bound")
            time.sleep(min(_POLL_SLICE_S, left if left is not None else _POLL_SLICE_S))
        try:
            if not self._greeted[i]:
                q.put(self._hello, timeout=_remaining(deadline))
                self._greeted[i] = True
            if frame:
                q.put(frame, timeout=_remaining(deadline))
        except queue.Full:
            raise TransportTimeout(f"send to {address} timed out: queue full") from None

    def close(self) -> None:
        self._closed = True
