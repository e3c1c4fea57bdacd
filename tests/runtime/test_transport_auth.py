"""ZeroMQ CURVE with the job's key: holders of the key talk; anyone else's frames are never delivered and each
refused handshake is counted as ``unauthenticated`` (docs/security.md)."""
from __future__ import annotations

import os
import time

import pytest
import zmq

from kubeforge.runtime import transport, wire

KEY = os.urandom(32)


def _wait_counted(rx: transport.Receiver, at_least: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and rx.dropped.get(transport.REASON_UNAUTHENTICATED, 0) < at_least:
        assert rx.recv(timeout=0.2) is None, "a frame from an unauthenticated peer was delivered"
    assert rx.dropped.get(transport.REASON_UNAUTHENTICATED, 0) >= at_least, dict(rx.dropped)


def _intruder(address: str, configure: object = None) -> zmq.Socket[bytes]:
    sock = zmq.Context.instance().socket(zmq.PUSH)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RECONNECT_IVL, 50)
    if callable(configure):
        configure(sock)
    sock.connect(address)
    for _ in range(5):   # queued towards the peer; a completed handshake would deliver them
        try:
            sock.send(wire.encode(wire.Stop(reason="forged")), zmq.NOBLOCK)
        except zmq.Again:
            # libzmq drops the pipe of a refused handshake, so a slow sender may find nothing to queue into; the
            # refusal itself is what the caller waits to see counted
            break
    return sock


def test_job_key_holders_talk_and_strangers_are_refused_and_counted() -> None:
    keys = transport.CurveKeys.from_job_key(KEY)
    rx = transport.open_receiver("tcp://127.0.0.1:*", auth=keys)
    tx = transport.open_sender([rx.address], role="trainer", index=0, auth=keys, ready_timeout=10)
    intruders = []
    try:
        tx.send(wire.Ready(role="trainer", index=0))
        assert rx.recv(timeout=10) == wire.Ready(role="trainer", index=0)
        # 1. a plain (NULL mechanism) peer
        intruders.append(_intruder(rx.address))
        _wait_counted(rx, 1)
        # 2. a CURVE peer that knows the server key but holds its own key pair: ZAP refuses it
        own_public, own_secret = zmq.curve_keypair()

        def knows_server(sock: zmq.Socket[bytes]) -> None:
            sock.curve_serverkey, sock.curve_publickey, sock.curve_secretkey = keys.public, own_public, own_secret
        before = rx.dropped[transport.REASON_UNAUTHENTICATED]
        intruders.append(_intruder(rx.address, knows_server))
        _wait_counted(rx, before + 1)
        # 3. a peer of another job (another job key)
        other = transport.CurveKeys.from_job_key(os.urandom(32))

        def other_job(sock: zmq.Socket[bytes]) -> None:
            sock.curve_serverkey, sock.curve_publickey, sock.curve_secretkey = other.public, other.public, other.secret
        before = rx.dropped[transport.REASON_UNAUTHENTICATED]
        intruders.append(_intruder(rx.address, other_job))
        _wait_counted(rx, before + 1)
        # the job's own traffic still flows
        tx.send(wire.Ack(role="generator", index=0, of=wire.Kind.SYNC, version=3))
        msg = rx.recv(timeout=10)
        assert isinstance(msg, wire.Ack) and msg.version == 3
    finally:
        for s in intruders:
            s.close(0)
        tx.close()
        rx.close()


def test_a_sender_without_the_key_never_becomes_ready() -> None:
    keys = transport.CurveKeys.from_job_key(KEY)
    rx = transport.open_receiver("tcp://127.0.0.1:*", auth=keys)
    try:
        with pytest.raises(transport.TransportTimeout):
            transport.open_sender([rx.address], role="generator", index=0, ready_timeout=1.0,
                                  auth=transport.CurveKeys.from_job_key(os.urandom(32)))
    finally:
        rx.close()


def test_a_peer_added_later_speaks_curve_too() -> None:
    """``add_peer`` (a generator that joins a running job) connects with the job's keys like the first peers; it
    used to connect without them, so the joiner refused every frame as unauthenticated (seen in real pods)."""
    keys = transport.CurveKeys.from_job_key(KEY)
    first = transport.open_receiver("tcp://127.0.0.1:*", auth=keys)
    joiner = transport.open_receiver("tcp://127.0.0.1:*", auth=keys)
    tx = transport.open_sender([first.address], role="trainer", index=0, auth=keys, ready_timeout=10)
    try:
        assert tx.add_peer(joiner.address) == 1
        tx.send(wire.Sync(version=4, step=4, host="h", port=1, world_size=3, epoch=1), to=1, timeout=10)
        msg = joiner.recv(timeout=10)
        assert isinstance(msg, wire.Sync) and msg.epoch == 1
        assert joiner.dropped.get(transport.REASON_UNAUTHENTICATED, 0) == 0
    finally:
        tx.close()
        first.close()
        joiner.close()
