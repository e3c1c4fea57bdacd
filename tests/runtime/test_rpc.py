"""The environment RPC's channels: the in-memory double keeps the ZeroMQ backend's contract, case by case, so the
unit tests that run the remote host and the environment server over it test what the roles run. Both backends:
a caller connects when a responder is bound, frames go both ways by caller id, an answer to a caller that is gone
is undeliverable, a closed responder reads as dropped, ``wake`` ends a wait at once, and no call blocks."""
from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

import pytest

from kubeforge.runtime import rpc, transport

KEYS = transport.CurveKeys.from_job_key(os.urandom(32))


def nothing(reason: str) -> None:
    raise AssertionError(f"refused: {reason}")


def address(backend: str) -> str:
    return "tcp://127.0.0.1:*" if backend == "tcp" else f"mem://rpc-{os.urandom(4).hex()}"


def until(check: Callable[[], bool], *, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, "not within the bound"
        time.sleep(0.01)


def connected(caller: rpc.Caller, s: int = 0) -> bool:
    return rpc.CONNECTED in caller.events(s)


@pytest.mark.parametrize("backend", ["mem", "tcp"])
def test_a_call_and_its_answer_go_by_the_callers_id(backend: str) -> None:
    responder = rpc.bind(address(backend), auth=KEYS)
    caller = rpc.connect([responder.address], name="g", auth=KEYS)
    try:
        until(lambda: connected(caller))
        assert caller.send(0, b"call")
        got: tuple[bytes, bytes] | None = None

        def take() -> bool:
            nonlocal got
            responder.wait(0.05, nothing)
            got = responder.recv(nothing)
            return got is not None

        until(take)
        assert got is not None
        who, frame = got
        assert frame == b"call" and who.startswith(b"g-")
        assert responder.recv(nothing) is None                    # nothing else: recv does not wait
        assert responder.send(who, b"answer")
        answer: list[bytes | None] = [None]

        def read() -> bool:
            caller.wait([0], 0.05)
            answer[0] = caller.recv(0, nothing)
            return answer[0] is not None

        until(read)
        assert answer[0] == b"answer"
        assert not responder.send(b"a-caller-never-seen", b"x")  # undeliverable, not queued for nobody
    finally:
        caller.close()
        responder.close()


@pytest.mark.parametrize("backend", ["mem", "tcp"])
def test_a_closed_responder_reads_as_dropped_and_a_new_one_connects(backend: str) -> None:
    first = rpc.bind(address(backend), auth=KEYS)
    where = first.address
    caller = rpc.connect([where], auth=KEYS)
    try:
        until(lambda: connected(caller))
        first.close()
        until(lambda: rpc.DROPPED in caller.events(0))
        second = rpc.bind(where, auth=KEYS)         # a verifier restarted in place: the same address
        try:
            until(lambda: connected(caller))
        finally:
            second.close()
    finally:
        caller.close()


@pytest.mark.parametrize("backend", ["mem", "tcp"])
def test_a_send_without_a_server_refuses_at_once(backend: str) -> None:
    where = "tcp://127.0.0.1:1" if backend == "tcp" else address("mem")
    caller = rpc.connect([where], auth=KEYS)
    try:
        t0 = time.monotonic()
        assert not caller.send(0, b"call")
        caller.wait([0], 0.2)
        assert caller.recv(0, nothing) is None
        assert time.monotonic() - t0 < 5
    finally:
        caller.close()


@pytest.mark.parametrize("backend", ["mem", "tcp"])
def test_wake_ends_a_wait_from_another_thread(backend: str) -> None:
    responder = rpc.bind(address(backend), auth=KEYS)
    try:
        threading.Timer(0.2, responder.wake).start()
        t0 = time.monotonic()
        responder.wait(30.0, nothing)
        assert time.monotonic() - t0 < 10
        responder.close()
        responder.wake()                              # after close: nothing, no error
    finally:
        responder.close()


def test_addresses_of_two_kinds_are_refused() -> None:
    with pytest.raises(transport.TransportError, match="all be tcp:// or all mem://"):
        rpc.connect(["tcp://127.0.0.1:1", "mem://x"])
    with pytest.raises(transport.TransportError, match="unsupported address"):
        rpc.bind("udp://127.0.0.1:1")
    taken = rpc.bind("mem://rpc-taken")
    try:
        with pytest.raises(transport.TransportError, match="address in use"):
            rpc.bind("mem://rpc-taken")
    finally:
        taken.close()
