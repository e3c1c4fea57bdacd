"""transport: real ZeroMQ sockets on 127.0.0.1 (round trip, routing, slow joiners, reconnects, backpressure,
malformed-frame fuzzing) and the in-process backend."""
from __future__ import annotations

import socket
import threading
import time
from typing import Iterator

import hypothesis
import pytest
import zmq
from hypothesis import strategies as st

from kubeforge.runtime import transport, types, wire

pytestmark = pytest.mark.timeout(120)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def stop(i: int, size: int = 0) -> wire.Stop:
    return wire.Stop(reason=f"{i}:" + "x" * size)


def seq(msg: wire.Message | None) -> int:
    assert isinstance(msg, wire.Stop), msg
    return int(msg.reason.split(":")[0])


def scored() -> wire.Scored:
    c = types.Completion(token_ids=[1, 2, 3], logprobs=[-0.1, -0.2, -0.3], text="abc", finish_reason="length")
    g = types.RolloutGroup(prompt=types.Prompt(index=5, text="copy: abc\n", answer="abc"), prompt_token_ids=[9, 8],
                           completions=[c, c], policy_version=1, step=1, rewards=[1.0, 0.0],
                           scores={"answer": [1.0, 0.0]})
    return wire.Scored(group=g)


@pytest.fixture
def rx() -> Iterator[transport.Receiver]:
    r = transport.open_receiver("tcp://127.0.0.1:*", hwm=16)
    yield r
    r.close()


def test_zmq_round_trip_and_hello(rx: transport.Receiver) -> None:
    tx = transport.open_sender([rx.address], role="verifier", index=3, ready_timeout=10)
    try:
        msgs: list[wire.Message] = [scored(), wire.Ready(role="verifier", index=3), stop(1),
                                    wire.Ack(role="generator", index=0, of=wire.Kind.SYNC, version=2)]
        for m in msgs:
            tx.send(m)
        assert [rx.recv(5) for _ in msgs] == msgs
        assert rx.recv(0.05) is None
        assert list(rx.hellos) == [wire.Hello(role="verifier", index=3)]  # recorded, never delivered
        assert dict(rx.dropped) == {}
    finally:
        tx.close()


def test_zmq_round_robin_and_routing() -> None:
    rxs = [transport.open_receiver("tcp://127.0.0.1:*") for _ in range(3)]
    tx = transport.open_sender([r.address for r in rxs], role="generator", index=0, ready_timeout=10)
    try:
        for i in range(9):
            tx.send(stop(i))
        for i in range(3):
            tx.send(stop(100 + i), to=2)
        got = [[seq(m) for m in iter(lambda r=r: r.recv(0.3), None)] for r in rxs]  # type: ignore[misc]
        assert sorted(x for g in got for x in g) == list(range(9)) + [100, 101, 102]
        assert all(len([x for x in g if x < 100]) == 3 for g in got)  # round robin: 3 each
        assert got[2][-3:] == [100, 101, 102]
        with pytest.raises(transport.TransportError, match="out of range"):
            tx.send(stop(0), to=3)
    finally:
        tx.close()
        for r in rxs:
            r.close()


def test_slow_joiner_loses_nothing() -> None:
    """Sends before the receiver exists block (nothing queued for an absent peer), then all arrive in order."""
    address = f"tcp://127.0.0.1:{free_port()}"
    tx = transport.open_sender([address], role="generator", index=0, ready_timeout=None)
    done = threading.Event()

    def send_all() -> None:
        for i in range(20):
            tx.send(stop(i), timeout=20)
        done.set()

    t = threading.Thread(target=send_all)
    t.start()
    time.sleep(0.3)
    assert not done.is_set()  # blocked: the peer has not joined
    rx = transport.open_receiver(address)
    try:
        assert [seq(rx.recv(10)) for _ in range(20)] == list(range(20))
        t.join(10)
        assert done.is_set()
        assert len(rx.hellos) == 1
    finally:
        tx.close()
        rx.close()


def test_ready_handshake_waits_for_late_peer() -> None:
    address = f"tcp://localhost:{free_port()}"  # a DNS name, resolved by ZeroMQ on each connect attempt
    holder: dict[str, transport.Receiver] = {}
    timer = threading.Timer(0.5, lambda: holder.setdefault("rx", transport.open_receiver(address.replace(
        "localhost", "127.0.0.1"))))
    timer.start()
    start = time.monotonic()
    tx = transport.open_sender([address], role="trainer", index=0, ready_timeout=10)
    try:
        assert time.monotonic() - start >= 0.4
        tx.send(stop(7))
        assert seq(holder["rx"].recv(5)) == 7
    finally:
        timer.join()
        tx.close()
        holder["rx"].close()


def test_ready_timeout_names_the_peer() -> None:
    address = "tcp://kubeforge-peer-that-never-resolves.invalid:29501"
    with pytest.raises(transport.TransportTimeout, match="kubeforge-peer-that-never-resolves"):
        transport.open_sender([address], role="generator", index=0, ready_timeout=0.5)


def test_reconnect_after_peer_restart() -> None:
    address = f"tcp://127.0.0.1:{free_port()}"
    rx = transport.open_receiver(address)
    tx = transport.open_sender([address], role="generator", index=1, ready_timeout=10)
    try:
        tx.send(stop(1))
        assert seq(rx.recv(5)) == 1
        rx.close()
        time.sleep(0.2)
        rx = transport.open_receiver(address)  # the "pod" came back on the same address
        tx.send(stop(2), timeout=10)
        assert seq(rx.recv(10)) == 2
        assert list(rx.hellos) == [wire.Hello(role="generator", index=1)]  # HELLO again on the new connection
    finally:
        tx.close()
        rx.close()


def test_zmq_backpressure_blocks_instead_of_growing() -> None:
    """With nobody reading, sends stop completing after a bounded number (HWMs + kernel buffers); the blocked
    message is not sent (TransportTimeout); after draining, everything sent arrives, in order, and sending resumes."""
    rx = transport.open_receiver("tcp://127.0.0.1:*", hwm=2)
    tx = transport.open_sender([rx.address], role="generator", index=0, hwm=2, ready_timeout=10)
    size = 256 * 1024
    try:
        sent = 0
        with pytest.raises(transport.TransportTimeout, match="queue full"):
            while sent < 10_000:
                tx.send(stop(sent, size), timeout=0.5)
                sent += 1
        assert 4 <= sent < 200, sent  # bounded: 2 + 2 frames of HWM plus what loopback TCP buffers hold
        blocked = threading.Thread(target=tx.send, args=(stop(sent, size),), kwargs={"timeout": 30})
        blocked.start()
        time.sleep(0.3)
        assert blocked.is_alive()  # a full queue blocks the sender
        got = [seq(rx.recv(10)) for _ in range(sent + 1)]
        blocked.join(10)
        assert not blocked.is_alive()
        assert got == list(range(sent + 1))
        assert rx.recv(0.2) is None
    finally:
        tx.close()
        rx.close()


# ---------------------------------------------------------------- malformed frames on a real ZeroMQ socket


@pytest.fixture(scope="module")
def raw_pair() -> Iterator[tuple[transport.Receiver, zmq.Socket[bytes], list[str]]]:
    hooked: list[str] = []
    rx = transport.open_receiver("tcp://127.0.0.1:*", on_drop=hooked.append)
    push: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 0)
    push.connect(rx.address)
    yield rx, push, hooked
    push.close(0)
    rx.close()


def test_receiver_counts_and_drops_known_bad_frames(
        raw_pair: tuple[transport.Receiver, zmq.Socket[bytes], list[str]]) -> None:
    rx, push, hooked = raw_pair
    before, n_hooked = dict(rx.dropped), len(hooked)
    good = wire.encode(scored())
    bad_version = good[:4] + (wire.SCHEMA_VERSION + 1).to_bytes(2, "little") + good[6:]
    for frame in [b"GET /metrics HTTP/1.1\r\n", good[:-3], bad_version, b"", good[:9]]:
        push.send(frame)
    push.send_multipart([good, good])  # multi-part frames are not ours either
    push.send(good)
    assert rx.recv(5) == scored()
    delta = {k: rx.dropped.get(k, 0) - before.get(k, 0) for k in wire.REASONS}
    assert delta == {"foreign": 2, "malformed": 3, "version": 1}
    assert len(hooked) - n_hooked == 6


def scored_at(i: int) -> wire.Scored:
    g = scored().group
    g.prompt = types.Prompt(index=i, text="copy: abc\n", answer="abc")
    return wire.Scored(group=g)


def test_batched_frames_and_a_bad_batch_lose_no_other_connections_data() -> None:
    hooked: list[str] = []
    rx = transport.open_receiver("tcp://127.0.0.1:*", on_drop=hooked.append)
    tx = transport.open_sender([rx.address], role="verifier", index=0, ready_timeout=10)
    push: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 0)
    push.connect(rx.address)
    try:
        bad = bytearray(wire.pack([scored_at(100), scored_at(101)])[0])
        bad[wire.BATCH_HEAD.size - 4] = 1   # the batch header's reserved field
        bad_frame = bytes(bad)
        with pytest.raises(wire.WireError, match=r"BATCH: reserved"):
            wire.decode(bad_frame)
        push.send(bad_frame)                       # one connection sends a bad batch
        good = [scored_at(i) for i in range(6)]
        tx.send_many(good)                        # another sends six groups: one BATCH frame
        got = [rx.recv(5)]
        assert rx.pending == 5                    # the rest of that frame, already unpacked
        got += [rx.recv(0) for _ in range(5)]
        assert got == good and rx.pending == 0
        assert rx.recv(0.05) is None
        assert dict(rx.dropped) == {"malformed": 1} and hooked == ["malformed"]   # the bad batch: one drop
        tx.send_many(good[:1])                    # a group alone leaves at once, as a plain frame
        assert rx.recv(5) == good[0] and rx.pending == 0
    finally:
        push.close(0)
        tx.close()
        rx.close()


def test_send_many_spreads_a_batch_over_the_peers() -> None:
    rxs = [transport.open_receiver("tcp://127.0.0.1:*") for _ in range(2)]
    tx = transport.open_sender([r.address for r in rxs], role="generator", index=0, ready_timeout=10)
    try:
        msgs = [scored_at(i) for i in range(5)]
        tx.send_many(msgs)
        got = [[r.recv(5) for _ in range(n)] for r, n in zip(rxs, (3, 2))]
        assert got == [msgs[:3], msgs[3:]]
        tx.send_many(msgs[:2], to=1)
        assert [rxs[1].recv(5), rxs[1].recv(0)] == msgs[:2] and rxs[0].recv(0.05) is None
    finally:
        tx.close()
        for r in rxs:
            r.close()


def test_mem_backend_unpacks_batches() -> None:
    rx = transport.open_receiver("mem://batches")
    tx = transport.open_sender(["mem://batches"], role="generator", index=0, ready_timeout=5)
    try:
        msgs = [scored_at(i) for i in range(4)]
        tx.send_many(msgs)
        assert [rx.recv(1) for _ in msgs] == msgs and rx.pending == 0
    finally:
        tx.close()
        rx.close()


frames_to_fuzz = st.sampled_from([wire.encode(scored()), wire.encode(stop(3)), wire.encode(
    wire.Work(step=1, policy_version=0, prompts=(types.Prompt(index=1, text="t", answer="a"),)))])


@st.composite
def damaged(draw: st.DrawFn) -> bytes:
    frame = bytearray(draw(frames_to_fuzz))
    how = draw(st.sampled_from(["flip", "truncate", "random", "splice"]))
    if how == "flip":
        for _ in range(draw(st.integers(1, 3))):
            i = draw(st.integers(0, len(frame) - 1))
            frame[i] ^= 1 << draw(st.integers(0, 7))
    elif how == "truncate":
        frame = frame[:draw(st.integers(0, len(frame) - 1))]
    elif how == "random":
        frame = bytearray(draw(st.binary(max_size=200)))
    else:
        i = draw(st.integers(0, len(frame)))
        frame[i:i] = draw(st.binary(min_size=1, max_size=16))
    return bytes(frame)


@hypothesis.settings(max_examples=60, deadline=None, suppress_health_check=list(hypothesis.HealthCheck))
@hypothesis.given(st.lists(damaged(), min_size=1, max_size=8))
def test_fuzz_zmq_receiver_keeps_delivering(
        raw_pair: tuple[transport.Receiver, zmq.Socket[bytes], list[str]], bad: list[bytes]) -> None:
    rx, push, hooked = raw_pair
    before = sum(rx.dropped.values())
    expected: list[wire.Message] = []
    for i, frame in enumerate(bad):
        push.send(frame)
        try:
            expected.append(wire.decode(frame))  # a flip can leave a valid frame: it must then be delivered
        except wire.WireError:
            pass
        push.send(wire.encode(stop(1000 + i)))
    want = expected_interleaved(bad)
    got = [rx.recv(5) for _ in want]
    assert got == want
    assert sum(rx.dropped.values()) - before == len(bad) - len(expected)


def expected_interleaved(bad: list[bytes]) -> list[wire.Message]:
    out: list[wire.Message] = []
    for i, frame in enumerate(bad):
        try:
            msg = wire.decode(frame)
            if not isinstance(msg, wire.Hello):
                out.append(msg)
        except wire.WireError:
            pass
        out.append(stop(1000 + i))
    return out


# ---------------------------------------------------------------- in-process backend


def test_mem_round_trip_backpressure_and_drops() -> None:
    rx = transport.open_receiver("mem://test-mem", hwm=3)
    tx = transport.open_sender(["mem://test-mem"], role="generator", index=0, ready_timeout=1)
    try:
        tx.send(scored())
        assert rx.recv(1) == scored()
        assert list(rx.hellos) == [wire.Hello(role="generator", index=0)]
        for i in range(3):
            tx.send(stop(i), timeout=0.1)
        with pytest.raises(transport.TransportTimeout, match="queue full"):
            tx.send(stop(3), timeout=0.1)
        assert [seq(rx.recv(1)) for _ in range(3)] == [0, 1, 2]
        assert isinstance(tx, transport.MemSender)
        tx.send_frame(b"junk")
        tx.send_frame(wire.encode(stop(9))[:-1])
        tx.send(stop(4))
        assert seq(rx.recv(1)) == 4
        assert dict(rx.dropped) == {"foreign": 1, "malformed": 1}
    finally:
        tx.close()
        rx.close()


def test_mem_unbound_peer_and_address_errors() -> None:
    with pytest.raises(transport.TransportTimeout, match="not bound"):
        transport.open_sender(["mem://nobody"], role="x", index=0, ready_timeout=0.2)
    rx = transport.open_receiver("mem://taken")
    try:
        with pytest.raises(transport.TransportError, match="in use"):
            transport.open_receiver("mem://taken")
    finally:
        rx.close()
    with pytest.raises(transport.TransportError, match="unsupported address"):
        transport.open_receiver("udp://127.0.0.1:1")
    with pytest.raises(transport.TransportError, match="tcp:// or all mem://"):
        transport.open_sender(["mem://a", "tcp://127.0.0.1:1"], role="x", index=0)
    with pytest.raises(transport.TransportError, match="at least one peer"):
        transport.open_sender([], role="x", index=0)


def test_zmq_bind_conflict(rx: transport.Receiver) -> None:
    with pytest.raises(transport.TransportError, match="cannot bind"):
        transport.open_receiver(rx.address)


def test_tcp_address() -> None:
    assert transport.tcp_address("tiny-verifier-0.tiny-verifier", 29501) == "tcp://tiny-verifier-0.tiny-verifier:29501"
    assert transport.tcp_address("::1", 5) == "tcp://[::1]:5"
