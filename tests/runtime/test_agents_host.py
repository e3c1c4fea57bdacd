"""Environment hosts: a step that raises, hangs past the timeout, returns garbage or floods megabytes ends that
episode only (counted by kind, bounded in time and bytes); the other episodes go on, also in the worker process that
was killed and restarted for it (their state replayed). ``remote``: the same cases through a verifier's environment
server (``env_server`` over a ``SubprocessHost``, in this process on a thread) and ``RemoteHost``, over the in-memory
channel (``rpc``, ``mem://``: the outcome rules need no sockets; the ZeroMQ channel's own cases are in
test_agents_remote.py)."""
from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kubeforge.api import rljob
from kubeforge.runtime import rpc, types
from kubeforge.runtime.agents.hosts import env_server, host, remote_host, workers

HERE = Path(__file__).resolve().parent
TIMEOUT = 1.0


def spec() -> rljob.EnvironmentSpec:
    return rljob.EnvironmentSpec.model_validate({"type": "Python", "python": {"entryPoint": "bad_envs:make_env"},
                                                 "turnTimeoutSeconds": TIMEOUT, "maxObservationBytes": 4096})


BOUNDS = host.Bounds(timeout_s=TIMEOUT, max_observation_bytes=4096)


class Served:
    """An environment server on a thread of this process (what a verifier pod runs), over ``pool``."""

    def __init__(self, pool: host.EnvironmentHost) -> None:
        self.server = env_server.EnvServer(rpc.bind(f"mem://env-host-{os.urandom(4).hex()}"), pool)
        self.thread = threading.Thread(target=self.server.serve, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.close()
        self.thread.join(timeout=60)
        assert not self.thread.is_alive()


def remote(pool: host.EnvironmentHost) -> tuple[remote_host.RemoteHost, Served]:
    served = Served(pool)
    return remote_host.RemoteHost(rpc.connect([served.server.address]), bounds=BOUNDS), served


@pytest.fixture(params=["in-process", "subprocess", "remote"])
def env_host(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[host.EnvironmentHost]:
    monkeypatch.syspath_prepend(str(HERE / "agents_envs"))
    sys.modules.pop("bad_envs", None)
    import bad_envs

    h: host.EnvironmentHost
    served = None
    if request.param == "in-process":
        h = host.InProcessHost(bad_envs.make_env, bounds=BOUNDS)
    elif request.param == "subprocess":
        h = workers.SubprocessHost(spec(), workers=1)    # one worker: every episode shares the one that is killed
    else:
        h, served = remote(workers.SubprocessHost(spec(), workers=1))
    yield h
    h.shutdown()
    if served is not None:
        served.stop()


def prompt(i: int) -> types.Prompt:
    return types.Prompt(index=i, text=f"p{i}", answer="")


@pytest.mark.parametrize("bad,kind", [("raise", host.ERROR), ("hang", host.TIMEOUT), ("garbage", host.GARBAGE),
                                      ("flood", host.FLOOD)])
def test_a_bad_step_costs_its_episode_only(env_host: host.EnvironmentHost, bad: str, kind: str) -> None:
    starts = env_host.reset([(0, prompt(0)), (1, prompt(1))])
    assert [r.messages for r in starts] == [[{"role": "user", "content": "echo p0"}],
                                            [{"role": "user", "content": "echo p1"}]]
    first = env_host.step([(0, "hello"), (1, "hi")])
    assert [r.failure for r in first] == ["", ""]
    t0 = time.monotonic()
    replies = env_host.step([(0, bad), (1, "again")])
    took = time.monotonic() - t0
    assert replies[0].failure == kind, replies[0]
    assert took < TIMEOUT + 35                        # bounded (a restarted worker's start included)
    good = replies[1]
    assert good.failure == "" and good.result is not None
    assert good.result.observation == [{"role": "user", "content": "turn 2: again"}]   # state kept (or replayed)
    later = env_host.step([(1, "third")])[0]
    assert later.result is not None and later.result.observation[0]["content"] == "turn 3: third"
    assert env_host.step([(0, "after")])[0].failure != ""          # the failed episode stays ended
    env_host.close([0, 1])


def test_a_printing_environment_does_not_corrupt_the_channel(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(HERE / "agents_envs"))
    h = workers.SubprocessHost(spec(), workers=2)
    try:
        h.reset([(i, prompt(i)) for i in range(4)])
        replies = h.step([(i, "print") for i in range(4)])
        assert [r.failure for r in replies] == [""] * 4 and h.restarts == 0
    finally:
        h.shutdown()


def test_flood_is_refused_unread_by_the_subprocess_host(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(HERE / "agents_envs"))
    h = workers.SubprocessHost(spec(), workers=1)
    try:
        h.reset([(0, prompt(0))])
        r = h.step([(0, "flood")])[0]
        assert r.failure == host.FLOOD and "exceeds" in r.detail and h.restarts == 1
    finally:
        h.shutdown()
