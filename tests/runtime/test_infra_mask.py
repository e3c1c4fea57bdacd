"""Infrastructure faults are not the policy's fault (``runtime/infra.py``; docs/agents.md "What a lost verifier
costs"): an environment server killed or silenced mid-episode costs its episodes (``env_lost``), and their groups are
neither scored nor trained on; they are counted apart from the environment's own failures and sampled again.

Real parts: the episode runner over the remote host, two environment servers on the in-memory RPC (``mem://``), the
wire (the finish reasons travel on it), the verifier role's loop with the real scorer (``reward: Environment``), and
trainer rank 1's real loop with its buffer (rank 0's parts are not needed: rank 1 re-issues its own prompts). A scripted
turn engine stands in for vLLM and a recording learner for the train step."""
from __future__ import annotations

import collections
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import pytest

from kubeforge.api import progress, rljob
from kubeforge.runtime import infra, metrics, observe, rpc, transport, types, verifiers, wire
from kubeforge.runtime.agents import runner
from kubeforge.runtime.agents.hosts import env_server, host, remote_host
from kubeforge.runtime.agents.protocol import StepResult
from kubeforge.runtime.launcher import summary
from kubeforge.runtime.models import tiny
from kubeforge.runtime.trainer import buffer
from kubeforge.runtime.trainer import loop as trainer_role
from kubeforge.runtime.verifier import loop as verifier_role

BOUNDS = host.Bounds(timeout_s=1.0, max_observation_bytes=4096)
MARGIN = 1.0
GROUP, PROMPTS, STEPS = 4, 4, 2         # rank 1 of 2 owns the odd prompts: 2 groups a step
ENV = rljob.EnvironmentSpec.model_validate({"type": "Python", "python": {"entryPoint": "x:y"}, "maxTurns": 3,
                                            "reward": "Environment"})
ALGO = rljob.AlgorithmSpec.model_validate({"groupSize": GROUP, "maxNewTokens": 4})


class TwoTurns:
    """Done at the second step with reward 1.0: every episode that runs to its end scores 1."""

    def __init__(self) -> None:
        self.turns = 0

    def reset(self, prompt: types.Prompt) -> list[dict[str, str]]:
        return [{"role": "user", "content": prompt.text}]

    def step(self, text: str) -> StepResult:
        self.turns += 1
        return StepResult(observation="again", done=self.turns == 2, reward=1.0 if self.turns == 2 else None)


class Server:
    def __init__(self, name: str) -> None:
        self.server = env_server.EnvServer(rpc.bind(f"mem://infra-{name}-{os.urandom(4).hex()}"),
                                           host.InProcessHost(TwoTurns, bounds=BOUNDS))
        self.thread = threading.Thread(target=self.server.serve, daemon=True)
        self.thread.start()

    def kill(self) -> None:
        """The pod is gone: its connections drop."""
        if self.thread.is_alive():
            self.server.close()
            self.thread.join(timeout=30)

    def silence(self) -> None:
        """A partition: calls still arrive, nothing comes back (not even BUSY)."""
        self.server.channel.send = lambda caller, frame: True    # type: ignore[method-assign]


class Engine:
    """One policy turn "x" per context; ``fault`` runs before the ``at``-th call (1-based) of the run."""

    def __init__(self, *, at: int, fault: Callable[[], None]) -> None:
        self.tokenizer = tiny.tokenizer()
        self.calls, self.at, self.fault = 0, at, fault

    def sample_turns(self, contexts: Sequence[Sequence[int]], *, max_tokens: Sequence[int], seeds: Sequence[int],
                     stop: Sequence[str]) -> list[types.Completion]:
        self.calls += 1
        if self.calls == self.at:
            self.fault()
        ids = self.tokenizer.encode("x", add_special_tokens=False)
        return [types.Completion(token_ids=types.token_array(ids), logprobs=np.full(len(ids), -0.5), text="x")
                for _ in contexts]


class Generators:
    """Trainer rank 1's sender towards the generators: each WORK is sampled at once by the real episode runner and
    its groups go to the verifier over the transport, as the generator loop sends them."""

    peers = 1

    def __init__(self, sampler: runner.EpisodeSampler, to_verifier: transport.Sender) -> None:
        self.sampler, self.to_verifier = sampler, to_verifier
        self.asked: list[tuple[int, int]] = []

    def send(self, msg: wire.Message, *, to: int | None = None, timeout: float | None = None) -> None:
        assert isinstance(msg, wire.Work)
        self.asked += [(msg.step, p.index) for p in msg.prompts]
        groups = self.sampler.sample(msg.prompts)
        for g in groups:
            g.policy_version, g.step = msg.policy_version, msg.step
        self.to_verifier.send_many([wire.Rollout(group=g) for g in groups])


class Learner:
    def __init__(self) -> None:
        self.step = self.policy_version = 0
        self.trained: list[list[types.RolloutGroup]] = []

    def train_step(self, *, groups: Sequence[types.RolloutGroup], **_: Any) -> dict[str, Any]:
        self.trained.append(list(groups))
        self.step += 1
        self.policy_version += 1
        return {"step": self.step, "policy_version": self.policy_version, "groups": len(groups)}

    def resume(self, *, directory: str) -> None:
        return None

    def save_checkpoint(self, **_: Any) -> None: ...
    def follow_sync(self) -> None: ...
    def export(self, *, directory: str) -> None: ...


class VerifierObserver:
    def __init__(self) -> None:
        self.groups: list[types.RolloutGroup] = []       # the groups it scored

    def scored(self, *, group: types.RolloutGroup, seconds: float) -> None:
        self.groups.append(group)

    def unexpected(self, *, kind: str) -> None:
        raise AssertionError(kind)

    def failed(self, *, error: BaseException) -> None:
        raise AssertionError(error)


def trained_on_infra_loss(learner: Learner) -> list[tuple[int, list[float] | None]]:
    """The check: every (prompt, rewards) trained on although an episode of it was lost to infrastructure."""
    return [(g.prompt.index, g.rewards) for step in learner.trained for g in step
            if any(r == infra.ENV_LOST for r in infra.finish_reasons(g.completions))]


def run(fault: str) -> dict[str, Any]:
    """Steps 0..1 of rank 1 with server ``a`` killed or silenced while the first batch's episodes are mid-way."""
    servers = [Server("a"), Server("b")]
    faults = {"kill": servers[0].kill, "silence": servers[0].silence}
    name = os.urandom(4).hex()
    ver_in = transport.open_receiver(f"mem://ver-{name}")
    trn = [transport.open_receiver(f"mem://trn{r}-{name}", hwm=256) for r in range(2)]
    to_ver = transport.open_sender([f"mem://ver-{name}"], role="generator", index=0)
    to_trn = transport.open_sender([f"mem://trn{r}-{name}" for r in range(2)], role="verifier", index=0)
    h = remote_host.RemoteHost(rpc.connect([s.server.address for s in servers]), bounds=BOUNDS, margin_s=MARGIN)
    engine = Engine(at=2, fault=faults[fault])       # after every episode's first step, before its second
    sampler = runner.EpisodeSampler(engine=engine, host=h, spec=ENV, algorithm=ALGO, chat_template=False, seed=0,
                                    max_context=512)
    gens = Generators(sampler, to_ver)
    scorer = verifiers.Scorer([rljob.VerifierSpec.model_validate({"name": "answer", "type": "ExactAnswer"})],
                              environment=ENV)
    vobs, stop = VerifierObserver(), threading.Event()
    vthread = threading.Thread(target=verifier_role.run, daemon=True, kwargs=dict(
        inbox=ver_in, trainers=to_trn, score=scorer.apply, observer=vobs, should_stop=stop.is_set))
    vthread.start()
    m = metrics.Metrics(role="trainer", replica=1)
    tobs = Observer(observe.TrainerObserver(m))
    learner = Learner()
    settings = trainer_role.Settings(rank=1, world=2, steps=STEPS, prompts_per_step=PROMPTS, max_policy_lag=STEPS,
                                     sync_every=1, checkpoint_every=1000, checkpoint_dir="/nonexistent",
                                     checkpoint_keep=1, deadline=60.0, reissue_after=60.0)
    loop = trainer_role.Loop(settings=settings, inbox=trn[1], generators=gens,  # type: ignore[arg-type]
                             learner=learner, observer=tobs,  # type: ignore[arg-type]
                             prompt_at=lambda k: types.Prompt(index=k, text=f"p{k}", answer="1"))
    started = time.monotonic()
    try:
        for s in range(STEPS):          # rank 0's hand-out of rank 1's share, in one batch per step
            gens.send(loop.dispatch.work(s, [loop.prompt_at(k) for k in trainer_role.prompt_indices(
                step=s, prompts_per_step=PROMPTS) if k % 2 == 1]))
        loop.run()
    finally:
        stop.set()
        vthread.join(timeout=30)
        h.shutdown()
        for srv in servers:
            srv.kill()
        for c in (to_ver, to_trn):
            c.close()
        for r in (ver_in, *trn):
            r.close()
    return {"learner": learner, "gens": gens, "observer": tobs, "verifier": vobs, "sampler": sampler, "metrics": m,
            "seconds": time.monotonic() - started, "loop": loop}


class Observer:
    """The role's real trainer observer (Prometheus), keeping the records and drops for the test too."""

    def __init__(self, inner: observe.TrainerObserver) -> None:
        self.inner = inner
        self.records: list[Any] = []
        self.drops: collections.Counter[str] = collections.Counter()

    def trained(self, *, record: Any) -> None:
        self.records.append(record)
        self.inner.trained(record=record)

    def dropped(self, *, reason: str) -> None:
        self.drops[reason] += 1
        self.inner.dropped(reason=reason)

    def unexpected(self, *, kind: str) -> None:
        raise AssertionError(kind)


def sample(m: metrics.Metrics, name: str, **labels: str) -> float:
    value = m.registry.get_sample_value(name, {"role": "trainer", "replica": "1", **labels})
    return value or 0.0


@pytest.fixture(params=["kill", "silence"])
def faulted(request: pytest.FixtureRequest) -> Iterator[dict[str, Any]]:
    yield run(request.param)


def test_a_group_lost_with_its_environment_server_is_not_trained_on_and_is_counted_apart(
        faulted: dict[str, Any]) -> None:
    learner, gens, obs, vobs = faulted["learner"], faulted["gens"], faulted["observer"], faulted["verifier"]
    sampler: runner.EpisodeSampler = faulted["sampler"]
    lost = obs.drops[infra.ENV_LOST]
    assert lost >= 1                                        # server a held half the first batch's episodes
    assert trained_on_infra_loss(learner) == []             # none of them trained on
    # every step trained one whole group per prompt of rank 1's share, each episode run to its end (reward 1)
    assert [sorted(g.prompt.index for g in step) for step in learner.trained] == [[1, 3], [5, 7]]
    assert all(g.rewards == [1.0] * GROUP for step in learner.trained for g in step)
    # sampled again at once by the buffer's drop rule (not the 60 s stall timer), once per lost group
    assert len(gens.asked) == 4 + lost and faulted["seconds"] < 30
    # never scored: the verifier observed no group with a lost episode
    assert all(infra.reason(g) is None for g in vobs.groups) and vobs.groups
    # counted apart: the infra family and the step records, not the drops nor the environment's failures
    m = faulted["metrics"]
    assert sample(m, "kubeforge_infra_masked_rollouts_total", reason=infra.ENV_LOST) == lost
    assert sample(m, "kubeforge_rollouts_dropped_total", reason=infra.ENV_LOST) == 0
    assert sum(r.infra_masked_rollouts for r in obs.records) == lost
    assert sampler.stats.failures == {} and sum(sampler.stats.lost.values()) >= 1
    assert set(sampler.stats.lost) == {infra.ENV_LOST}


def test_the_check_fails_on_the_old_behaviour_which_trains_on_a_zero(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the rule (``infra.reason`` never sees a loss, as before), the same fault is scored 0 and trained on:
    the check above finds it."""
    monkeypatch.setattr(infra, "reason", lambda group: None)
    out = run("kill")
    poisoned = trained_on_infra_loss(out["learner"])
    assert poisoned and all(r is not None and 0.0 in r for _, r in poisoned)
    assert out["observer"].drops[infra.ENV_LOST] == 0


def test_the_buffer_masks_by_finish_reason_and_re_issues_the_prompt() -> None:
    """The rule on its own: a lost episode keeps the whole group out, whatever its rewards; the environment's own
    failures do not."""
    def group(index: int, reasons: list[str]) -> types.RolloutGroup:
        comps = [types.Completion(token_ids=types.token_array([1]), logprobs=np.full(1, -0.1), text="",
                                  finish_reason=r) for r in reasons]
        return types.RolloutGroup(prompt=types.Prompt(index=index, text="", answer=""),
                                  prompt_token_ids=types.token_array([1]),
                                  completions=comps, policy_version=0, step=0, rewards=[1.0] * len(reasons))

    buf = buffer.RolloutBuffer(max_policy_lag=1, capacity=8)
    assert buf.add(group=group(0, ["stop", infra.ENV_LOST]), policy_version=0) == infra.ENV_LOST
    assert buf.add(group=group(1, ["stop", "env_error"]), policy_version=0) is None
    decoded = wire.decode(wire.encode(wire.Scored(group=group(2, [infra.ENV_LOST, "stop"]))))
    assert isinstance(decoded, wire.Scored) and infra.reason(decoded.group) == infra.ENV_LOST
    assert buf.add(group=decoded.group, policy_version=0) == infra.ENV_LOST
    assert [r.prompt.index for r in buf.drain_reissue()] == [0, 2]
    assert buf.drain_masked() == 2 and buf.drain_masked() == 0
    assert not buf.holds(step=0, index=0) and buf.holds(step=0, index=1)


def test_the_count_reaches_the_status_and_the_run_summary() -> None:
    recs = [progress.StepRecord(step=1, infra_masked_rollouts=2), progress.StepRecord(step=2, infra_masked_rollouts=1),
            progress.StepRecord(step=3)]
    report = progress.ProgressReport.of_step(recs[1], done=False)
    assert '"infraMaskedRollouts":1' in report.encode()
    decoded = progress.ProgressReport.decode(report.encode())
    assert decoded is not None and decoded.status(rljob.Progress()).infra_masked_rollouts == 1
    assert "infraMaskedRollouts" not in progress.ProgressReport.of_step(recs[2], done=False).encode()   # 0: left out
    out = summary.summarize(recs, wall_seconds=1.0, metrics_path="m.jsonl")
    assert out["infra_masked_rollouts"] == 3
