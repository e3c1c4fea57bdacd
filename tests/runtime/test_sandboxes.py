"""Sandboxes from the cluster (``sandboxes``; docs/sandboxes.md): the claim/run/release protocol over real HTTP with
real sandboxed processes, its refusals, bounded claims, and what a program that hangs, floods or escapes costs.

The pool runs in-process here (the same ``Pool``/``Server`` a sandbox pod runs) and, for the sweep of escaped
processes, as ``kubeforge role sandbox`` in a process of its own (the only place a server is a child subreaper).
In real pods: ``e2e/test_sandbox_real.py``.
"""
from __future__ import annotations

import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from kubeforge.api import contract, roleenv, sandboxenv
from kubeforge.api import rljob
from kubeforge.runtime import types
from kubeforge.runtime.agents.envs import code_feedback
from kubeforge.runtime.sandboxes import client, protocol, server
from kubeforge.runtime.verifiers import code, sandbox

KEY = bytes(range(32))
GOOD = "def f(x):\n    return 2 * x\n"
TESTS = ["assert f(2) == 4", "assert f(3) == 6"]
HANG = "while True:\n    pass\n"
FAST = sandbox.Limits(timeout_s=5.0)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def served(tmp_path: pathlib.Path) -> Iterator[server.Server]:
    srv = server.Server(server.Pool(server.Settings(key=KEY, slots=2, max_run_seconds=10.0)),
                        host="127.0.0.1", port=0)
    yield srv
    srv.stop()


def pool_of(srv: server.Server, **kw: Any) -> client.Pool:
    return client.Pool([f"http://127.0.0.1:{srv.port}"], key=KEY, **kw)


def raw(srv: server.Server, path: str, body: bytes, *, token: str | None = KEY.hex(),
        method: str = "POST") -> tuple[int, dict[str, Any]]:
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    req = urllib.request.Request(f"http://127.0.0.1:{srv.port}{path}", data=body if method == "POST" else None,
                                 method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return int(resp.status), json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return int(exc.code), json.loads(exc.read() or b"{}")


def test_claim_run_release(served: server.Server) -> None:
    pool = pool_of(served)
    lease = pool.claim()
    assert served.pool.leases() == 1
    r = lease.run(GOOD, TESTS, FAST)
    assert (r.status, r.passed, r.total) == ("ok", 2, 2) and lease.open
    r = lease.run("def f(x):\n    return x\n", TESTS, FAST)       # a second run on the same lease
    assert (r.status, r.passed, r.total) == ("ok", 0, 2)
    lease.release()
    assert served.pool.leases() == 0
    assert served.pool.counts["claims:claimed"] == 1 and served.pool.counts["resets:release"] == 1
    assert served.pool.counts["runs:ok"] == 2
    assert not any(pathlib.Path(served.pool.root).iterdir())          # the lease's files went with it


def test_refusals_are_answered_counted_and_not_acted_on(served: server.Server) -> None:
    lease = pool_of(served).claim()
    run_path = f"{protocol.LEASES}{lease.lease_id}/run"
    ok_run = json.dumps({"source": GOOD, "tests": TESTS}).encode()
    cases = [
        (protocol.CLAIM, b"{}", None, 401, "unauthorized"),
        (protocol.CLAIM, b"{}", "00" * 32, 401, "unauthorized"),
        (run_path, ok_run, "ab" * 32, 401, "unauthorized"),
        (protocol.CLAIM, b"{not json", KEY.hex(), 400, "malformed"),
        (protocol.CLAIM, b"[1, 2]", KEY.hex(), 400, "malformed"),
        (protocol.CLAIM, b'{"wait": "soon"}', KEY.hex(), 400, "malformed"),
        (protocol.CLAIM, b'{"wait": -1}', KEY.hex(), 400, "malformed"),
        (run_path, b'{"source": 3, "tests": []}', KEY.hex(), 400, "malformed"),
        (run_path, json.dumps({"source": GOOD, "tests": [1]}).encode(), KEY.hex(), 400, "malformed"),
        (run_path, json.dumps({"source": GOOD, "tests": [], "limits": {"memoryMiB": 1e9}}).encode(), KEY.hex(),
         400, "malformed"),
        (run_path, json.dumps({"source": "x" * (protocol.MAX_BODY + 10), "tests": []}).encode(), KEY.hex(), 413,
         "too_large"),
        (f"{protocol.LEASES}{'0' * 32}/run", ok_run, KEY.hex(), 404, "unknown_lease"),
        (f"{protocol.LEASES}{'0' * 32}/release", b"{}", KEY.hex(), 404, "unknown_lease"),
        (f"{protocol.LEASES}../../etc/run", ok_run, KEY.hex(), 404, "not_found"),
        ("/sandbox/exec", b"{}", KEY.hex(), 404, "not_found"),
    ]
    for path, body, token, want_code, reason in cases:
        got, answer = raw(served, path, body, token=token)
        assert (got, answer.get("error")) == (want_code, reason), (path, body[:60], token)
    want: dict[str, int] = {}
    for *_, reason in cases:
        want[reason] = want.get(reason, 0) + 1
    assert dict(served.refusals) == want
    # nothing was acted on: one lease (the claim above), no run
    assert served.pool.leases() == 1 and not any(k.startswith("runs:") for k in served.pool.counts)
    r = lease.run(GOOD, TESTS, FAST)
    assert r.status == "ok" and r.passed == 2


def test_a_claim_waits_boundedly_for_a_free_slot(served: server.Server) -> None:
    pool = pool_of(served)
    a = pool.claim()
    pool.claim()                                        # both slots taken
    t0 = time.monotonic()
    with pytest.raises(client.Unavailable, match="no free sandbox"):
        pool.claim(seconds=1.0)
    assert time.monotonic() - t0 < 15
    assert served.pool.counts["claims:empty"] >= 1
    got: list[client.Lease] = []
    waiter = threading.Thread(target=lambda: got.append(pool.claim(seconds=20.0)))
    waiter.start()
    time.sleep(0.5)
    a.release()                                         # the waiting claim gets the freed slot
    waiter.join(timeout=30)
    assert got and got[0].open and served.pool.leases() == 2


def test_a_hang_is_killed_costs_its_lease_only_and_is_never_reused(served: server.Server) -> None:
    pool = pool_of(served)
    hung, other = pool.claim(), pool.claim()
    out: dict[str, sandbox.Result] = {}
    t = threading.Thread(target=lambda: out.update(hang=hung.run(HANG, TESTS, sandbox.Limits(timeout_s=2.0))))
    t0 = time.monotonic()
    t.start()
    time.sleep(0.3)
    quick = other.run(GOOD, TESTS, FAST)                 # the other lease runs while the hang spins
    t.join(timeout=60)
    assert quick.status == "ok" and quick.passed == 2
    r = out["hang"]
    assert r.status == "timeout" and r.passed == 0 and not hung.open
    assert time.monotonic() - t0 < 2.0 + sandbox.STARTUP_S + 20
    assert served.pool.counts["resets:dirty"] == 1 and served.pool.leases() == 1
    refused, answer = raw(served, f"{protocol.LEASES}{hung.lease_id}/run", json.dumps(
        {"source": GOOD, "tests": TESTS}).encode())
    assert (refused, answer["error"]) == (404, "unknown_lease")     # the dirty lease is gone, not handed back
    again = pool.claim()
    assert again.lease_id not in (hung.lease_id, other.lease_id)
    assert again.run(GOOD, TESTS, FAST).status == "ok"


def test_a_flood_is_bounded_and_costs_its_episode_only(served: server.Server) -> None:
    pool = pool_of(served)
    lease, other = pool.claim(), pool.claim()
    # output: bounded by the file-size limit (the write fails), the run ends, its files go with it
    out_flood = "import sys\nwhile True:\n    sys.stdout.write('x' * 65536)\n"
    r = lease.run(out_flood, TESTS, sandbox.Limits(timeout_s=10.0, max_file_mib=1))
    assert r.passed == 0 and r.seconds < 10.0
    assert r.status == "crashed" or "File too large" in (r.error or ""), r
    # the result channel: megabytes where one JSON line belongs: read up to a bound, the run is not believed and
    # the lease is reset, never reused
    lease = pool.claim() if not lease.open else lease
    chan_flood = ("import json, os, sys\nfd = json.loads(sys.argv[1])['result_fd']\n"
                  "os.write(fd, b'{\"passed\": 2, \"total\": 2}' + b'x' * (8 << 20))\n" + GOOD)
    r = lease.run(chan_flood, TESTS, sandbox.Limits(timeout_s=2.0))
    assert r.status in ("timeout", "crashed") and r.passed == 0 and not lease.open, r
    assert served.pool.counts["resets:dirty"] >= 1
    assert other.run(GOOD, TESTS, FAST).passed == 2          # the pod's other lease never noticed


def test_an_idle_lease_is_reclaimed(tmp_path: pathlib.Path) -> None:
    clock = Clock()
    pool = server.Pool(server.Settings(key=KEY, slots=1, idle_seconds=60.0), clock=clock)
    lease = pool.claim(0.0)
    assert lease is not None and pool.claim(0.0) is None        # the one slot is taken
    clock.now += 59
    assert pool.expire() == 0
    clock.now += 2
    assert pool.expire() == 1 and pool.leases() == 0 and pool.counts["resets:idle"] == 1
    with pytest.raises(protocol.Refused, match="unknown_lease"):
        pool.release(lease)
    assert pool.claim(0.0) is not None
    pool.close()


def test_an_unreachable_pool_costs_the_run_not_the_caller() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]                       # nobody listens there
    episode = client.Episode(client.Pool([f"http://127.0.0.1:{port}"], key=KEY, claim_seconds=1.0), FAST)
    t0 = time.monotonic()
    r = episode.run(GOOD, TESTS)
    assert r.status == "crashed" and client.UNAVAILABLE in (r.error or "") and time.monotonic() - t0 < 10
    episode.close()


def test_code_feedback_and_code_execution_run_in_the_pool(served: server.Server) -> None:
    env = code_feedback.CodeFeedback(pool=pool_of(served))
    env.reset(types.Prompt(index=0, text="write f", answer="\n".join(TESTS)))
    first = env.step("```python\ndef f(x):\n    return x\n```")
    assert not first.done and "Tests passed: 0/2" in str(first.observation)
    assert served.pool.leases() == 1                    # the episode holds its lease between turns
    second = env.step(f"```python\n{GOOD}```")
    assert second.done and second.reward == 1.0
    env.close()
    assert served.pool.leases() == 0 and served.pool.counts["claims:claimed"] == 1
    verifier = code.CodeExecution(rljob.CodeExecutionVerifier(timeout_seconds=2.0, parallelism=2),
                                  pool=pool_of(served))
    scores = verifier.score(types.Prompt(index=0, text="", answer="\n".join(TESTS)),
                            [GOOD, "def f(x):\n    return x\n", HANG])
    assert scores == [1.0, 0.0, 0.0]
    assert served.pool.leases() == 0 and served.pool.counts["claims:claimed"] == 4


def test_from_env_reads_the_contract() -> None:
    assert client.from_env({}) is None
    env = {k: str(v) for k, v in sandboxenv.client_env(
        sandboxes=[roleenv.Peer(host="sb-0.x", port_base=29500), roleenv.Peer(host="sb-1.x", port_base=29500)],
        key=KEY).items()}
    pool = client.from_env(env)
    assert pool is not None and pool.bases == [f"http://sb-{i}.x:{29500 + contract.PORT_SANDBOX}" for i in (0, 1)]
    with pytest.raises(ValueError, match=contract.ENV_SANDBOX_KEY):
        client.from_env({contract.ENV_SANDBOXES: "a:1", contract.ENV_SANDBOX_KEY: "zz"})


def _strays(marker: str) -> list[int]:
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if marker.encode() in pathlib.Path(f"/proc/{name}/cmdline").read_bytes():
                    out.append(int(name))
            except OSError:
                continue
    return out


def test_the_sandbox_process_sweeps_what_a_run_leaves_behind(tmp_path: pathlib.Path) -> None:
    """``kubeforge role sandbox`` without namespaces (no ``unshare`` on its PATH): a run that double-forks, leaves
    its session and execs a long sleep is swept when its run ends (the server is their subreaper)."""
    from kubeforge.runtime.launcher import ports

    base = ports.allocate(1, blocks=1)[0]
    nons = tmp_path / "bin"
    nons.mkdir()
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(contract.ENV_PREFIX)},
           "PATH": str(nons), "PYTHONPATH": os.pathsep.join(sys.path),
           **{k: str(v) for k, v in sandboxenv.render(index=0, job_name="t", port_base=base, bind_host="127.0.0.1",
                                                      key=KEY, slots=2, max_run_seconds=10.0,
                                                      idle_seconds=60.0).items()}}
    proc = subprocess.Popen([sys.executable, "-m", "kubeforge.cli", "role", "sandbox"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    marker = f"{os.getpid() % 1000}.{base}"
    escape = ("import os, time\n"
              "if os.fork() == 0:\n"
              "    os.setsid()\n"
              "    if os.fork() == 0:\n"
              f"        os.execv('/bin/sleep', ['sleep', '{marker}'])\n"
              "    os._exit(0)\n"
              "time.sleep(0.5)\n" + GOOD)
    try:
        ready = f"http://127.0.0.1:{base + contract.PORT_METRICS}/readyz"
        deadline = time.monotonic() + 300             # its interpreter's start on a loaded machine
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                with urllib.request.urlopen(ready, timeout=5) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                time.sleep(0.5)
        assert proc.poll() is None, proc.communicate()[1].decode()[-3000:]
        pool = client.Pool([f"http://127.0.0.1:{base + contract.PORT_SANDBOX}"], key=KEY, claim_seconds=60.0)
        lease = pool.claim()
        r = lease.run(escape, TESTS, sandbox.Limits(timeout_s=10.0))
        assert r.status == "ok" and r.passed == 2, r
        deadline = time.monotonic() + 10
        while _strays(marker) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _strays(marker), "an escaped process outlived its run"
        lease.release()
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
        for pid in _strays(marker):         # never leave a stray behind, whatever the outcome
            os.kill(pid, signal.SIGKILL)
    assert proc.returncode == 0, err.decode()[-2000:]
    assert b"strays killed" in out and b"strays killed 0" not in out, out.decode()


def _wait_ready(bases: list[int], *, seconds: float = 300.0) -> None:
    deadline = time.monotonic() + seconds           # interpreters start slowly on a loaded machine
    for base in bases:
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{base + contract.PORT_METRICS}/readyz",
                                            timeout=5) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, f"sandbox process on {base} not ready"
            time.sleep(0.5)


def test_kubeforge_run_starts_the_pool_as_processes_and_tells_the_verifiers(tmp_path: pathlib.Path) -> None:
    """``kubeforge run``'s process specs: ``spec.sandbox.replicas`` sandbox processes (no job key), the verifiers
    told their addresses and key; a CodeExecution verifier with the verifier's env scores in them, and goes on
    scoring when one of the two is killed (its claims move to the other)."""
    from kubeforge.api import load
    from kubeforge.runtime.launcher import main as launcher, rundir, supervisor

    doc = {"apiVersion": "kubeforge.dev/v1alpha1", "kind": "RLJob", "metadata": {"name": "sb"},
           "spec": {"model": {"builtin": "tiny"}, "task": {"code": {}, "seed": 0},
                    "verifiers": [{"name": "tests", "type": "CodeExecution", "codeExecution": {"timeoutSeconds": 2}}],
                    "algorithm": {"maxNewTokens": 64},
                    "sandbox": {"replicas": 2, "slots": 4, "maxRunSeconds": 10}}}
    job = load.parse(doc)
    run = rundir.create(job_name="sb", explicit=str(tmp_path / "run"))
    specs = launcher.process_specs(job=job, run=run, attempt=0)
    boxes = [s for s in specs if s.role == contract.SANDBOX]
    assert [s.name for s in boxes] == ["sandbox-0", "sandbox-1"]
    assert all(contract.ENV_JOB_KEY not in s.env and s.env[contract.ENV_SANDBOX_KEY] for s in boxes)
    (verifier,) = [s for s in specs if s.role == "verifier"]
    assert verifier.env[contract.ENV_SANDBOX_KEY] == boxes[0].env[contract.ENV_SANDBOX_KEY]
    for s in specs:
        if s.role not in ("verifier", contract.SANDBOX):
            assert contract.ENV_SANDBOX_KEY not in s.env
    group = supervisor.Group(boxes)
    group.start()
    try:
        _wait_ready([s.port_base for s in boxes])
        pool = client.from_env(verifier.env)
        assert pool is not None and len(pool.bases) == 2
        scorer = code.CodeExecution(rljob.CodeExecutionVerifier(timeout_seconds=2.0, parallelism=4), pool=pool)
        prompt = types.Prompt(index=0, text="", answer="\n".join(TESTS))
        assert scorer.score(prompt, [GOOD, GOOD, "def f(x):\n    return x\n", HANG]) == [1.0, 1.0, 0.0, 0.0]
        group.kill("sandbox-0")                                     # a sandbox pod lost
        assert scorer.score(prompt, [GOOD, GOOD, GOOD]) == [1.0, 1.0, 1.0]
        assert [e.name for e in supervisor.split_agents(group.poll())[1]] == ["sandbox-0"]   # restarted in place
    finally:
        group.stop()
    log = (run.log("sandbox-1")).read_text()
    assert "runs:ok" in log, log[-2000:]
