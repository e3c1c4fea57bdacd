"""The remote environment host and the verifiers' environment servers: episodes spread over the servers and stay
where they started; a caller without the job key is refused and counted; garbage frames are counted and skipped; a
server that dies or goes silent costs its episodes only (``env_lost``, bounded in time), the rest go on.

The servers run on threads of this process over an in-process host (``host.InProcessHost``: the bad-environment
cases through a real worker pool are in test_agents_host.py, parametrized ``remote``). The placement, stickiness,
busy, forgotten-episode and late-answer rules run over the in-memory channel (``rpc``, ``mem://``); what only
ZeroMQ can show stays on it: a caller without the job key (CURVE), garbage and multi-part frames, a silent server;
a lost server runs on both."""
from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator

import pytest
import zmq

from kubeforge.runtime import rpc, transport, types, wire
from kubeforge.runtime.agents.hosts import env_server, host, remote_host
from kubeforge.runtime.agents.protocol import StepResult

TIMEOUT = 1.0
MARGIN = 1.0
BOUNDS = host.Bounds(timeout_s=TIMEOUT, max_observation_bytes=4096)
KEYS = transport.CurveKeys.from_job_key(os.urandom(32))


class Counter:
    """Counts its turns; answers which server it lives in, so a test sees where each episode's state is."""

    def __init__(self, where: str) -> None:
        self.where, self.turns = where, 0

    def reset(self, prompt: types.Prompt) -> list[dict[str, str]]:
        return [{"role": "user", "content": prompt.text}]

    def step(self, text: str) -> StepResult:
        self.turns += 1
        return StepResult(observation=f"{self.where}:{self.turns}:{text}", done=False)


def address(backend: str, name: str) -> str:
    """Where a test's server binds: loopback ZeroMQ (an ephemeral port) or a fresh in-memory name."""
    return "tcp://127.0.0.1:*" if backend == "tcp" else f"mem://env-{name}-{os.urandom(4).hex()}"


class Server:
    def __init__(self, name: str, *, backend: str = "mem", keys: transport.CurveKeys | None = KEYS,
                 idle_s: float = env_server.IDLE_EPISODE_S) -> None:
        self.server = env_server.EnvServer(rpc.bind(address(backend, name), auth=keys),
                                           host.InProcessHost(lambda: Counter(name), bounds=BOUNDS), idle_s=idle_s)
        self.address = self.server.address
        self.thread = threading.Thread(target=self.server.serve, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.close()
        self.thread.join(timeout=30)
        assert not self.thread.is_alive()


def pair(backend: str) -> Iterator[list[Server]]:
    servers = [Server("a", backend=backend), Server("b", backend=backend)]
    yield servers
    for s in servers:
        if s.thread.is_alive():
            s.stop()


@pytest.fixture
def two() -> Iterator[list[Server]]:
    yield from pair("mem")


@pytest.fixture
def two_tcp() -> Iterator[list[Server]]:
    yield from pair("tcp")


@pytest.fixture(params=["mem", "tcp"])
def two_of_each(request: pytest.FixtureRequest) -> Iterator[list[Server]]:
    yield from pair(request.param)


def client(servers: list[Server], **kw: object) -> remote_host.RemoteHost:
    return remote_host.RemoteHost(rpc.connect([s.address for s in servers], auth=KEYS), bounds=BOUNDS,
                                  margin_s=MARGIN, **kw)  # type: ignore[arg-type]


def prompts(ids: range) -> list[tuple[int, types.Prompt]]:
    return [(i, types.Prompt(index=i, text=f"p{i}", answer="")) for i in ids]


def where(reply: host.Reply) -> str:
    assert reply.result is not None and not reply.failure, reply
    return reply.result.observation[0]["content"].split(":")[0]


def test_episodes_spread_over_the_servers_and_stay_where_they_started(two_of_each: list[Server]) -> None:
    two = two_of_each
    h = client(two)
    try:
        starts = h.reset(prompts(range(6)))
        assert [r.messages for r in starts] == [[{"role": "user", "content": f"p{i}"}] for i in range(6)]
        first = h.step([(i, "x") for i in range(6)])
        homes = [where(r) for r in first]
        assert sorted(homes) == ["a"] * 3 + ["b"] * 3           # spread evenly
        second = h.step([(i, "y") for i in range(6)])
        assert [where(r) for r in second] == homes               # sticky: each episode's state in one server
        assert all(r.result is not None and r.result.observation[0]["content"].split(":")[1] == "2" for r in second)
        assert [s.server.served.resets for s in two] == [3, 3]
        h.close(range(6))
        deadline = time.monotonic() + 10
        while sum(s.server.served.closes for s in two) < 6 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [s.server.served.closes for s in two] == [3, 3]
        assert all(not s.server.local for s in two)
    finally:
        h.shutdown()


def test_a_caller_without_the_job_key_is_refused_and_counted(two_tcp: list[Server]) -> None:
    two = two_tcp
    stranger = remote_host.RemoteHost(rpc.connect([two[0].address],
                                                  auth=transport.CurveKeys.from_job_key(os.urandom(32))),
                                      bounds=BOUNDS, margin_s=MARGIN)
    try:
        t0 = time.monotonic()
        replies = stranger.reset(prompts(range(2)))
        assert [r.failure for r in replies] == [host.LOST] * 2
        assert time.monotonic() - t0 < TIMEOUT + MARGIN + 10          # bounded by the silence rule
        deadline = time.monotonic() + 10
        while two[0].server.served.dropped[transport.REASON_UNAUTHENTICATED] < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert two[0].server.served.dropped[transport.REASON_UNAUTHENTICATED] >= 1
        assert two[0].server.served.resets == 0                        # nothing reached the environments
    finally:
        stranger.shutdown()


def test_garbage_frames_are_counted_and_the_server_goes_on(two_tcp: list[Server]) -> None:
    two = two_tcp
    raw: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.DEALER)
    transport.curve_client(raw, KEYS)
    raw.setsockopt(zmq.LINGER, 0)
    raw.connect(two[0].address)
    try:
        raw.send(b"not a frame")                                            # foreign
        raw.send(wire.encode(wire.Stop(reason="x")))                        # valid, but not an ENV_CALL
        raw.send_multipart([b"one", b"two"])                                # multi-part
        bad = bytearray(wire.encode(wire.EnvCall(call=1, op="step", ids=(1,), texts=("t",))))
        bad[-1] ^= 0xFF                                                     # a corrupt payload
        raw.send(bytes(bad))
        deadline = time.monotonic() + 10
        dropped = two[0].server.served.dropped
        while sum(dropped.values()) < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert dropped[wire.REASON_FOREIGN] == 1 and dropped[env_server.REASON_UNEXPECTED] == 1
        assert dropped[wire.REASON_MALFORMED] == 2, dict(dropped)
        h = client(two[:1])
        try:
            assert [r.failure for r in h.reset(prompts(range(2)))] == ["", ""]
            assert [where(r) for r in h.step([(0, "x"), (1, "y")])] == ["a", "a"]
        finally:
            h.shutdown()
    finally:
        raw.close(0)


def test_a_server_lost_mid_episode_costs_its_episodes_only(two_of_each: list[Server]) -> None:
    two = two_of_each
    h = client(two)
    try:
        h.reset(prompts(range(4)))
        homes = [where(r) for r in h.step([(i, "x") for i in range(4)])]
        two[1].stop()                                                       # verifier b's pod is gone
        t0 = time.monotonic()
        replies = h.step([(i, "y") for i in range(4)])
        assert time.monotonic() - t0 < TIMEOUT + MARGIN + 10
        for home, r in zip(homes, replies):
            if home == "b":
                assert r.failure == host.LOST, r
            else:
                assert where(r) == "a"
        assert h.lost_episodes == 2
        h.close(range(4))
        # new episodes go to the server that is left; the job goes on
        again = h.reset(prompts(range(10, 14)))
        assert [r.failure for r in again] == [""] * 4
        assert [where(r) for r in h.step([(i, "z") for i in range(10, 14)])] == ["a"] * 4
    finally:
        h.shutdown()


def test_a_silent_server_ends_the_call_with_env_lost_within_the_bound() -> None:
    """A server that takes calls and never answers (wedged, or a node gone without closing its connections)."""
    mute: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.ROUTER)
    mute.setsockopt(zmq.LINGER, 0)
    monitor = transport.curve_server(mute, KEYS)
    port = mute.bind_to_random_port("tcp://127.0.0.1")
    h = remote_host.RemoteHost(rpc.connect([f"tcp://127.0.0.1:{port}"], auth=KEYS), bounds=BOUNDS, margin_s=MARGIN)
    try:
        t0 = time.monotonic()
        replies = h.reset(prompts(range(3)))
        took = time.monotonic() - t0
        assert [r.failure for r in replies] == [host.LOST] * 3
        assert "no word" in replies[0].detail
        assert TIMEOUT + MARGIN <= took < TIMEOUT + MARGIN + 10
        assert [r.failure for r in h.step([(0, "x")])] == [host.LOST]     # its episodes stay lost
    finally:
        h.shutdown()
        if monitor is not None:
            mute.disable_monitor()
            monitor.close(0)
        mute.close(0)


def test_a_busy_server_is_not_lost() -> None:
    """A step slower than the silence bound but within the turn timeout's host rules is not lost: the server says
    BUSY every second while it works."""
    slow_bounds = host.Bounds(timeout_s=6.0, max_observation_bytes=4096)

    class Slow(Counter):
        def step(self, text: str) -> StepResult:
            time.sleep(3.0)
            return super().step(text)

    server = env_server.EnvServer(rpc.bind(address("mem", "slow")),
                                  host.InProcessHost(lambda: Slow("s"), bounds=slow_bounds))
    thread = threading.Thread(target=server.serve, daemon=True)
    thread.start()
    # silence bound 0.5 + 1.0 s: without the BUSY frames the 3 s step would read as a lost server
    h = remote_host.RemoteHost(rpc.connect([server.address]),
                               bounds=host.Bounds(timeout_s=0.5, max_observation_bytes=4096), margin_s=1.0)
    try:
        h.reset(prompts(range(1)))
        assert where(h.step([(0, "x")])[0]) == "s"
    finally:
        h.shutdown()
        server.close()
        thread.join(timeout=30)


def test_a_server_that_forgot_an_episode_answers_env_lost(two: list[Server]) -> None:
    """A verifier restarted in place (same address, new process) does not know the episodes of the old one."""
    h = client(two[:1])
    try:
        h.reset(prompts(range(1)))
        two[0].server.local.clear()                     # what a restart leaves: no state for the old episodes
        r = h.step([(0, "x")])[0]
        assert r.failure == host.LOST and "does not know" in r.detail
    finally:
        h.shutdown()


def test_idle_episodes_are_forgotten() -> None:
    s = Server("a", idle_s=0.5)
    h = client([s])
    try:
        h.reset(prompts(range(2)))
        deadline = time.monotonic() + 10
        while s.server.served.forgotten < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert s.server.served.forgotten == 2 and not s.server.local
    finally:
        h.shutdown()
        s.stop()


def test_a_late_answer_is_counted_stale_and_another_kind_unexpected() -> None:
    """A scripted server (the in-memory responder, driven by hand): before the answer to this call it sends the answer
    to another call (one given up earlier) and a valid frame of another kind; the host counts both and skips them."""
    responder = rpc.bind(address("mem", "scripted"))
    h = remote_host.RemoteHost(rpc.connect([responder.address]), bounds=BOUNDS, margin_s=MARGIN)
    sent: list[wire.Message] = []

    def serve() -> None:
        got = None
        deadline = time.monotonic() + 10
        while got is None and time.monotonic() < deadline:
            responder.wait(0.1, lambda reason: None)
            got = responder.recv(lambda reason: None)
        assert got is not None
        caller, frame = got
        call = wire.decode(frame)
        assert isinstance(call, wire.EnvCall) and call.op == "reset"
        reply = wire.EnvReply(messages=(("user", "right"),))
        sent.extend([wire.EnvAnswer(call=call.call + 7, replies=(wire.EnvReply(messages=(("user", "late"),)),)),
                     wire.Stop(reason="x"), wire.EnvAnswer(call=call.call, busy=True),
                     wire.EnvAnswer(call=call.call, replies=(reply,))])
        for m in sent:
            assert responder.send(caller, wire.encode(m))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        replies = h.reset(prompts(range(1)))
        assert [r.messages for r in replies] == [[{"role": "user", "content": "right"}]]
        assert dict(h.dropped) == {remote_host.REASON_STALE: 1, remote_host.REASON_UNEXPECTED: 1}
        assert len(sent) == 4
    finally:
        thread.join(timeout=10)
        h.shutdown()
        responder.close()


def test_every_env_call_and_answer_round_trips() -> None:
    call = wire.EnvCall(call=7, op="step", ids=(3, 4), texts=("a", "b"))
    answer = wire.EnvAnswer(call=7, replies=(
        wire.EnvReply(messages=(("user", "hi"),), stepped=True, done=True, reward=0.5, tool_calls=2, seconds=0.25),
        wire.EnvReply(failure=host.TIMEOUT, detail="no answer within 1 s", seconds=1.0)))
    for m in (call, answer, wire.EnvAnswer(call=1, busy=True),
              wire.EnvCall(call=1, op="reset", ids=(1,), prompts=(types.Prompt(index=1, text="t", answer="a"),)),
              wire.EnvCall(call=2, op="close", ids=(1, 2))):
        assert wire.decode(wire.encode(m)) == m


@pytest.mark.parametrize("bad,why", [
    (wire.EnvCall(call=1, op="step", ids=(1, 2), texts=("one",)), "texts"),
    (wire.EnvCall(call=1, op="reset", ids=(1,)), "prompts"),
    (wire.EnvCall(call=1, op="jump", ids=()), "not one of"),
    (wire.EnvAnswer(call=1, busy=True, replies=(wire.EnvReply(),)), "busy"),
    (wire.EnvAnswer(call=1, replies=(wire.EnvReply(reward=float("nan")),)), "finite"),
])
def test_malformed_env_messages_are_refused(bad: wire.Message, why: str) -> None:
    with pytest.raises(wire.WireError) as e:
        wire.encode(bad)
    assert e.value.reason == wire.REASON_MALFORMED and why in str(e.value), e.value


def test_the_verifiers_serve_built_in_and_python_environments_only() -> None:
    from pathlib import Path

    from kubeforge.api import load

    job = load.load_file(Path(__file__).resolve().parents[2] / "examples" / "tiny-multiturn.yaml")
    assert env_server.serves(job.spec)
    assert job.spec.roles.verifier.replicas == 2          # the example spreads its environments over two verifiers
    assert not env_server.serves(job.spec.model_copy(update={"environment": None}))
    assert job.spec.environment is not None
    vf = job.spec.environment.model_copy(update={"type": "Verifiers"})
    assert not env_server.serves(job.spec.model_copy(update={"environment": vf}))   # those run through the endpoint
