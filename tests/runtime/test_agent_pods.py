"""Agents in their own pods (``agents.pods``): the hand-out's bounds, the endpoint's per-episode credentials, and the
agent process (``kubeforge role agent``) running programs against the endpoint over real HTTP.

No vLLM: the endpoint samples with ``test_agents_endpoint.ScriptedSampler`` (the tiny tokenizer). The whole path on
the engine, through ``kubeforge run``: ``test_agent_framework.py``.
"""
from __future__ import annotations

import errno
import json
import os
import pathlib
import signal
import subprocess
import sys
import textwrap
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from kubeforge.api import agentenv, contract, roleenv
from kubeforge.runtime import infra, metrics, types
from kubeforge.runtime.agents import endpoint
from kubeforge.runtime.agents.pods import dispatch, sampler as pods_sampler, worker
from kubeforge.runtime.agents.primeintellect import sampler as vf_sampler
from kubeforge.runtime.models import tiny
from test_agents_endpoint import ScriptedSampler

ROOT = pathlib.Path(__file__).resolve().parents[2]
JOB_KEY, AGENT_KEY = bytes(range(32)), bytes(range(32, 64))


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


# ---------------------------------------------------------------- the hand-out's rules


def test_each_state_ends_by_its_own_bound() -> None:
    clock = Clock()
    d = dispatch.Dispatch(episode_seconds=30, claim_seconds=60, lease_seconds=10, clock=clock)
    for e in ("done", "failed", "silent", "slow", "unclaimed"):
        d.offer(e, {"prompt": e})
    claims = [d.claim(wait=0) for _ in range(4)]
    assert [c.episode_id for c in claims if c] == ["done", "failed", "silent", "slow"]
    assert d.done("done", exit_code=0, timed_out=False) and d.done("failed", exit_code=3, timed_out=False)
    assert not d.done("done", exit_code=0, timed_out=False)          # an episode ends once
    clock.now += 9
    assert d.beat("slow")
    clock.now += 2                                                  # "silent": no beat for 11 s > lease
    assert d.beat("slow") and not d.beat("silent")
    for _ in range(3):                                              # "slow" beats on, 35 s after its claim
        clock.now += 8
        assert d.beat("slow")
    clock.now += 8                                                  # 43 s: past its 30 s + grace
    assert not d.beat("slow") and d.pending() == 1                  # "unclaimed" waits (43 s of 60)
    clock.now += 20
    ends = d.wait(["done", "failed", "silent", "slow", "unclaimed"])
    assert ends == {"done": "stop", "failed": "env_error", "silent": infra.AGENT_LOST, "slow": "env_timeout",
                    "unclaimed": infra.AGENT_LOST}
    assert d.pending() == 0 and d.claim(wait=0) is None


def test_a_claim_waits_bounded_for_an_offer() -> None:
    d = dispatch.Dispatch(episode_seconds=5)
    started = time.monotonic()
    assert d.claim(wait=0.3) is None
    assert 0.25 <= time.monotonic() - started < 3
    threading.Timer(0.2, d.offer, args=("e1", {"prompt": "p"})).start()
    got = d.claim(wait=5)
    assert got is not None and got.episode_id == "e1" and got.task == {"prompt": "p"} and got.seconds == 5


# ---------------------------------------------------------------- credentials over HTTP


@pytest.fixture
def served() -> Iterator[tuple[endpoint.server.Endpoint, dispatch.Dispatch]]:
    """An endpoint at a generator's block: its metrics server (/readyz: ready) at the block's base, the endpoint
    at base + PORT_AGENTS, as ``agents.pods.sampler.from_engine`` binds it."""
    tok = tiny.tokenizer()
    handout = dispatch.Dispatch(episode_seconds=20, lease_seconds=60)
    for attempt in range(5):        # the block's base is a free ephemeral port; base + PORT_AGENTS may be taken
        probe = metrics.serve(metrics.Metrics(role="generator", replica=0), host="127.0.0.1", port_base=0)
        probe.set_ready()
        try:
            ep = endpoint.server.Endpoint(
                sampler=ScriptedSampler(tok), chat=endpoint.chat.ChatTemplate(tok), handout=handout,
                config=endpoint.server.EndpointConfig(port=probe.port + contract.PORT_AGENTS, key=JOB_KEY,
                                                      agent_key=AGENT_KEY, request_timeout=5, max_tokens_per_call=16))
            break
        except OSError as exc:
            probe.stop()
            if exc.errno != errno.EADDRINUSE or attempt == 4:
                raise
    yield ep, handout
    ep.close()
    probe.stop()


def _post(ep: endpoint.server.Endpoint, path: str, token: str | None, body: dict[str, Any]) -> tuple[int, Any]:
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})}
    req = urllib.request.Request(f"http://127.0.0.1:{ep.port}{path}", data=json.dumps(body).encode(),
                                 headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_an_episode_credential_opens_its_episode_only(served: Any) -> None:
    ep, handout = served
    a, b = ep.open_episode(), ep.open_episode()
    handout.offer(a, {"prompt": "pa"})
    handout.offer(b, {"prompt": "pb"})
    assert _post(ep, "/agents/claim", "0" * 64, {"wait": 0})[0] == 401           # not the agent key
    assert _post(ep, "/agents/claim", endpoint.server.episode_key(JOB_KEY, a), {"wait": 0})[0] == 401
    status, got = _post(ep, "/agents/claim", AGENT_KEY.hex(), {"wait": 1})
    assert status == 200 and got["episode"] == a and got["task"] == {"prompt": "pa"} and got["model"] == "policy"
    assert got["api_key"] == endpoint.server.episode_key(JOB_KEY, a) and AGENT_KEY.hex() not in json.dumps(got)
    base = f"http://127.0.0.1:{ep.port}"
    own = openai.OpenAI(base_url=base + got["path"], api_key=got["api_key"], max_retries=0)
    reply = own.chat.completions.create(model="policy", messages=[{"role": "user", "content": "hi"}])
    assert reply.choices[0].message.content
    into_b = openai.OpenAI(base_url=f"{base}/episodes/{b}/v1", api_key=got["api_key"], max_retries=0)
    with pytest.raises(openai.PermissionDeniedError):
        into_b.chat.completions.create(model="policy", messages=[{"role": "user", "content": "hi"}])
    anonymous = openai.OpenAI(base_url=f"{base}/episodes/{b}/v1", api_key="guess", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        anonymous.chat.completions.create(model="policy", messages=[{"role": "user", "content": "hi"}])
    # the end of another episode cannot be reported with this credential either
    assert _post(ep, f"/agents/episodes/{b}/done", got["api_key"], {"exit_code": 0})[0] == 403
    assert _post(ep, f"/agents/episodes/{a}/heartbeat", got["api_key"], {}) == (200, {"open": True})
    assert _post(ep, f"/agents/episodes/{a}/done", got["api_key"], {"exit_code": "0"})[0] == 400
    assert _post(ep, f"/agents/episodes/{a}/done", got["api_key"], {"exit_code": 0}) == (200, {"open": True})
    assert ep.refused["wrong_episode"] == 2 and ep.refused["unauthorized"] == 3
    refusals = ep.metrics.render().decode()
    assert 'kubeforge_endpoint_refusals_total{' in refusals and 'reason="wrong_episode"' in refusals
    assert ep.close_episode(a).final is not None and handout.wait([a]) == {a: "stop"}


# ---------------------------------------------------------------- the agent process against the endpoint


PROGRAM = textwrap.dedent("""
    import json, os, sys, time, urllib.request
    prompt = sys.stdin.read()
    if "crash" in prompt:
        sys.exit(3)
    if "hang" in prompt:
        time.sleep(600)
    assert not [k for k in os.environ if k.startswith("KUBEFORGE_")], "the program sees a kubeforge variable"
    req = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions", method="POST",
        data=json.dumps({"model": os.environ["OPENAI_DEFAULT_MODEL"],
                         "messages": [{"role": "user", "content": prompt}]}).encode(),
        headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"], "Content-Type": "application/json"})
    print(json.loads(urllib.request.urlopen(req, timeout=30).read())["choices"][0]["message"]["content"])
""")


def _manifest(tmp: pathlib.Path, program: list[str]) -> pathlib.Path:
    doc = {"apiVersion": "kubeforge.dev/v1alpha1", "kind": "RLJob", "metadata": {"name": "agents"},
           "spec": {"model": {"builtin": "tiny"}, "task": {"copy": {}},
                    "environment": {"type": "Agent", "reward": "Verifiers", "maxTurns": 2, "turnTimeoutSeconds": 3},
                    "agent": {"program": program, "concurrency": 3},
                    "verifiers": [{"name": "exact", "type": "ExactAnswer"}]}}
    path = tmp / "job.json"
    path.write_text(json.dumps(doc))
    return path


def _agent_process(tmp: pathlib.Path, ep: endpoint.server.Endpoint) -> subprocess.Popen[bytes]:
    program = tmp / "agent.py"
    program.write_text(PROGRAM)
    env = {k: v for k, v in os.environ.items() if not k.startswith(contract.ENV_PREFIX)}
    env.update({k: str(v) for k, v in agentenv.render(
        index=0, config_path=str(_manifest(tmp, [sys.executable, str(program)])), job_name="agents",
        generators=[roleenv.Peer(host="127.0.0.1", port_base=ep.port - contract.PORT_AGENTS)], port_base=0,
        bind_host="127.0.0.1", agent_key=AGENT_KEY).items()})
    return subprocess.Popen([sys.executable, "-m", "kubeforge.cli", "role", "agent"], env=env,
                            start_new_session=True)


def _prompts(*texts: str) -> list[types.Prompt]:
    return [types.Prompt(index=i, text=t, answer="") for i, t in enumerate(texts)]


def _sampler(ep: endpoint.server.Endpoint, handout: dispatch.Dispatch) -> vf_sampler.VerifiersSampler:
    return vf_sampler.VerifiersSampler(endpoint=ep, environment=pods_sampler.AgentPods(handout), group_size=2,
                                       fallback_prompt=lambda p: (1, 2), task_of=pods_sampler.task, label="agents")


def test_agent_process_runs_episodes_and_a_dead_one_costs_its_episodes(served: Any, tmp_path: pathlib.Path) -> None:
    ep, handout = served
    proc = _agent_process(tmp_path, ep)
    try:
        s = _sampler(ep, handout)
        groups = s.sample(_prompts("two plus two", "crash now"))
        assert [o.finish_reason for o in s.outcomes] == ["stop", "stop", "env_error", "env_error"]
        ok = groups[0]
        assert infra.reason(ok) is None and all(len(c.token_ids) > 0 for c in ok.completions)
        assert len(ok.prompt_token_ids) > 0 and all(o.recording.final is not None for o in s.outcomes[:2])
        # the agent pod dies mid-episode: its episodes end agent_lost after the lease, the group is kept out
        handout.lease_seconds = 8.0
        threading.Timer(3.0, os.killpg, args=(proc.pid, signal.SIGKILL)).start()
        started = time.monotonic()
        groups = s.sample(_prompts("hang here"))
        assert [o.finish_reason for o in s.outcomes] == [infra.AGENT_LOST] * 2
        assert infra.reason(groups[0]) == infra.AGENT_LOST and s.stats.lost[infra.AGENT_LOST] == 2
        assert time.monotonic() - started < 3.0 + handout.lease_seconds + 5
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


def test_the_worker_kills_a_program_past_its_time(served: Any, tmp_path: pathlib.Path) -> None:
    ep, _ = served
    handout = dispatch.Dispatch(episode_seconds=1.0, lease_seconds=30)
    ep.handout = handout
    stop = threading.Event()
    program = tmp_path / "agent.py"
    program.write_text(PROGRAM)
    w = worker.Worker(generators=[f"http://127.0.0.1:{ep.port}"], agent_key=AGENT_KEY,
                      program=[sys.executable, str(program)], concurrency=1, environ=dict(os.environ), stop=stop)
    t = threading.Thread(target=w.run, daemon=True)
    t.start()
    try:
        e = ep.open_episode()
        handout.offer(e, {"prompt": "hang"})
        assert handout.wait([e]) == {e: "env_timeout"}
        assert w.ends["timeout"] == 1
    finally:
        stop.set()
        t.join(timeout=30)
