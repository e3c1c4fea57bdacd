"""The pool engine's loop (``generator.pool.serve``) over the in-process transport with a fake engine: each job's
WORK is sampled with its own newest adapter and answered to its own verifiers, shares follow the weights, a job's
STOP releases its slot, READY answers each trainer connection."""
from __future__ import annotations

import collections
import itertools
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence

import numpy as np
import pytest

from kubeforge.runtime import transport, types, wire
from kubeforge.runtime.generator.pool import adapters, serve


class FakeEngine:
    """Adapter slots and sampling of a pretend engine: each completion's single token is the ``lora_id`` it was
    sampled with (0: the base model), so a test can read which adapter served which job."""

    def __init__(self) -> None:
        self.loaded: set[int] = set()
        self.calls: list[tuple[str, int]] = []

    def load(self, a: adapters.Adapter) -> None:
        self.loaded.add(a.lora_id)

    def unload(self, a: adapters.Adapter) -> None:
        self.loaded.discard(a.lora_id)

    def sampler(self, job: str, group_size: int) -> serve.JobSampler:
        eng = self

        class S:
            def sample(self, prompts: Sequence[types.Prompt],
                       adapter: adapters.Adapter | None) -> list[types.RolloutGroup]:
                lid = adapter.lora_id if adapter is not None else 0
                assert adapter is None or (adapter.job == job and lid in eng.loaded)
                eng.calls.append((job, lid))
                comp = types.Completion(token_ids=np.asarray([lid], dtype=np.int64),
                                        logprobs=np.asarray([-0.5], dtype=types.LOGPROB_DTYPE), text="x",
                                        finish_reason="length")
                return [types.RolloutGroup(prompt=p, prompt_token_ids=types.token_array([1]),
                                           completions=[comp] * group_size, policy_version=0) for p in prompts]
        return S()


class FakeLoader:
    def __init__(self, job: str) -> None:
        self.job, self.path = job, ""

    def load(self, sync: wire.Sync) -> types.SyncResult:
        self.path = f"/adapters/{self.job}/v{sync.version}"
        return types.SyncResult(seconds=0.01, bytes=100)


class Observer:
    """What serve reports beside its ledger (the kubeforge_pool_* series are fed from these calls): each job's
    served completions, the versions loaded, the loads that failed and the kinds of the frames it refused."""

    def __init__(self) -> None:
        self.unexpected_kinds: list[str] = []
        self.served_completions: collections.Counter[str] = collections.Counter()
        self.synced_versions: list[int] = []
        self.sync_errors: list[BaseException] = []

    def served(self, *, job: str, seconds: float, queue_wait: float, completions: int) -> None:
        self.served_completions[job] += completions

    def synced(self, *, version: int, result: object) -> None:
        self.synced_versions.append(version)

    def sync_failed(self, *, version: int, error: BaseException) -> None:
        self.sync_errors.append(error)

    def unexpected(self, *, kind: str) -> None:
        self.unexpected_kinds.append(kind)

    def sampled(self, **kw: object) -> None: ...
    def skipped(self, **kw: object) -> None: ...


class Job:
    """One job's ends around the pool: its trainer's sender and control inbox, its verifier's inbox."""

    def __init__(self, name: str, *, engine: FakeEngine, weight: int, group_size: int = 2) -> None:
        tag = uuid.uuid4().hex[:8]
        self.name = name
        inbox = transport.open_receiver(f"mem://{tag}-{name}-pool")
        self.verifier_in = transport.open_receiver(f"mem://{tag}-{name}-verifier")
        self.control_in = transport.open_receiver(f"mem://{tag}-{name}-control")
        self.channel = serve.Channel(
            name=name, weight=weight, group_size=group_size, inbox=inbox,
            verifiers=transport.open_sender([f"mem://{tag}-{name}-verifier"], role="generator", index=0),
            control=transport.open_sender([f"mem://{tag}-{name}-control"], role="generator", index=0),
            weights=FakeLoader(name), sampler=engine.sampler(name, group_size),
            trainer_weights=("trainer-" + name, 1), max_policy_lag=None)
        self.trainer = transport.open_sender([f"mem://{tag}-{name}-pool"], role="trainer", index=0)

    def work(self, step: int, prompts: int = 2) -> None:
        self.trainer.send(wire.Work(step=step, policy_version=0, prompts=tuple(
            types.Prompt(index=i, text="p", answer="") for i in range(prompts))))

    def sync(self, version: int, *, host: str | None = None) -> None:
        self.trainer.send(wire.Sync(version=version, step=version, host=host or "trainer-" + self.name, port=1,
                                    world_size=2))

    def rollouts(self, n: int, timeout: float = 10.0) -> list[types.RolloutGroup]:
        out = []
        for _ in range(n):
            msg = self.verifier_in.recv(timeout=timeout)
            assert isinstance(msg, wire.Rollout), msg
            out.append(msg.group)
        return out

    def control(self, timeout: float = 10.0) -> wire.Message | None:
        return self.control_in.recv(timeout=timeout)


@pytest.fixture
def pool() -> Iterator[tuple[FakeEngine, adapters.Slots, list[Job], threading.Event, Observer, list[serve.Ledger]]]:
    eng = FakeEngine()
    slots = adapters.Slots(capacity=1, backend=eng)
    jobs = [Job("a", engine=eng, weight=4), Job("b", engine=eng, weight=4)]
    stop, obs, out = threading.Event(), Observer(), []
    t = threading.Thread(target=lambda: out.append(serve.serve(index=0, channels=[j.channel for j in jobs],
                                                               slots=slots, observer=obs, should_stop=stop.is_set)),
                         daemon=True)
    t.start()
    yield eng, slots, jobs, stop, obs, out
    stop.set()
    t.join(10)


def test_each_job_is_sampled_with_its_own_newest_adapter_and_answered_alone(pool) -> None:  # type: ignore[no-untyped-def]
    eng, slots, (a, b), stop, obs, _ = pool
    for j in (a, b):
        ready = j.control()
        assert isinstance(ready, wire.Ready) and ready.role == "generator"     # the trainer's HELLO answered
    a.work(1)
    assert {g.policy_version for g in a.rollouts(2)} == {0}                  # nothing pushed: the base model
    a.sync(1)
    ack = a.control()
    assert isinstance(ack, wire.Ack) and ack.of == wire.Kind.SYNC and ack.ok and ack.version == 1
    b.sync(1)
    assert isinstance(b.control(), wire.Ack)
    a.sync(2)
    assert isinstance(a.control(), wire.Ack)
    a.work(2)
    b.work(2)
    ga, gb = a.rollouts(2), b.rollouts(2)
    ids = {j: slots.current[j].lora_id for j in "ab"}
    assert {int(g.completions[0].token_ids[0]) for g in ga} == {ids["a"]}    # a's v2, never b's
    assert {int(g.completions[0].token_ids[0]) for g in gb} == {ids["b"]}
    assert {g.policy_version for g in ga} == {2} and {g.policy_version for g in gb} == {1}
    assert all(g.step == 2 and g.generator == 0 for g in ga + gb)
    assert a.verifier_in.recv(timeout=0.2) is None and b.verifier_in.recv(timeout=0.2) is None
    assert slots.stats["a"].swaps + slots.stats["b"].swaps >= 1             # one slot, two jobs: swapped
    assert sorted(obs.synced_versions) == [1, 1, 2] and obs.sync_errors == []


def test_an_engine_says_ready_at_its_start_and_samples_nothing_for_a_job_before_its_push(pool) -> None:  # type: ignore[no-untyped-def]
    """A restarted engine to a trainer that ran with its previous incarnation (docs/recovery.md): its READY goes out
    at the loop's start (the trainer pushes its current adapter at once), once; WORK of the trainer's newer version
    is skipped until that push is loaded (no lag bound here: without the rule it would be sampled with the base
    model), then sampled with the pushed adapter."""
    eng, slots, (a, b), stop, obs, out = pool
    ready = a.control()
    assert isinstance(ready, wire.Ready) and ready.policy_version == 0
    prompts = (types.Prompt(index=0, text="p", answer=""),)
    a.trainer.send(wire.Work(step=4, policy_version=3, prompts=prompts))   # the trainer is at v3
    assert a.verifier_in.recv(timeout=0.5) is None and eng.calls == []
    a.sync(3)
    ack = a.control()
    assert isinstance(ack, wire.Ack) and ack.of == wire.Kind.SYNC and ack.version == 3
    a.trainer.send(wire.Work(step=4, policy_version=3, prompts=prompts))   # re-issued behind the push
    (group,) = a.rollouts(1)
    assert group.policy_version == 3 and int(group.completions[0].token_ids[0]) == slots.current["a"].lora_id
    assert a.control(timeout=0.3) is None      # one READY: the HELLO that came with the WORK asked for none more
    stop.set()
    for _ in itertools.repeat(None, 100):
        if out:
            break
        threading.Event().wait(0.1)
    assert out[0].jobs["a"].skipped == 1


def test_a_sync_naming_another_trainers_store_is_refused(pool) -> None:  # type: ignore[no-untyped-def]
    eng, slots, (a, b), stop, obs, _ = pool
    a.control()
    a.sync(1, host="trainer-b")          # a frame on a's socket pointing at b's trainer: never joined, never acked
    assert a.control(timeout=0.5) is None
    assert obs.unexpected_kinds == ["ForgedSync"] and "a" not in slots.current


def test_stop_releases_the_slot_and_is_passed_on_and_shares_follow_work(pool) -> None:  # type: ignore[no-untyped-def]
    eng, slots, (a, b), stop, obs, out = pool
    for j in (a, b):
        j.control()
        j.sync(1)
        j.control()
    for step in range(1, 6):
        a.work(step)
    a.rollouts(10)
    a.trainer.send(wire.Stop(reason="done"))
    assert isinstance(a.verifier_in.recv(timeout=10), wire.Stop)
    b.work(1)
    b.rollouts(2)
    stop.set()
    for _ in itertools.repeat(None, 100):
        if out:
            break
        threading.Event().wait(0.1)
    ledger = out[0]
    assert ledger.jobs["a"].stopped and not ledger.jobs["b"].stopped
    assert "a" not in slots.current and ledger.jobs["a"].completions == 20 and ledger.jobs["b"].completions == 4
    assert ledger.jobs["b"].versions == [1]
    assert obs.served_completions == {"a": 20, "b": 4}     # the per-job series see what the ledger counts
    shares = ledger.shares()
    assert shares["a"] + shares["b"] == pytest.approx(1.0)
    assert isinstance(b.control(timeout=5), wire.Ack)      # still attached at the end: its trainer is told


def test_a_job_whose_verifiers_take_nothing_costs_only_itself() -> None:
    """Job a's verifier never reads (its inbox holds one frame): its batches are dropped after the send timeout and
    counted, and job b is served all along."""
    eng = FakeEngine()
    slots = adapters.Slots(capacity=2, backend=eng)
    a, b = Job("a", engine=eng, weight=4), Job("b", engine=eng, weight=4)
    tag = uuid.uuid4().hex[:8]
    stuck = transport.open_receiver(f"mem://{tag}-stuck", hwm=1)
    a.channel.verifiers = transport.open_sender([f"mem://{tag}-stuck"], role="generator", index=0)
    a.channel.send_timeout = 0.2
    stop, out = threading.Event(), []
    t = threading.Thread(target=lambda: out.append(serve.serve(index=0, channels=[a.channel, b.channel], slots=slots,
                                                               observer=Observer(), should_stop=stop.is_set)),
                         daemon=True)
    t.start()
    try:
        for step in range(1, 6):
            a.work(step)
            b.work(step)
        assert len(b.rollouts(10, timeout=20)) == 10
    finally:
        stop.set()
        t.join(10)
        stuck.close()
    assert out and out[0].jobs["a"].undelivered >= 2 and out[0].jobs["b"].undelivered == 0


class FakeRoster:
    """The jobs file as a test drives it: ``change`` is handed to the next poll; ``jobs`` opens a job's channel."""

    def __init__(self, jobs: dict[str, Job]) -> None:
        self.jobs = jobs
        self.pending: list[serve.Change] = []
        self.closed: list[str] = []
        self.lock = threading.Lock()

    def change(self, *, went: tuple[str, ...] = (), came: tuple[str, ...] = ()) -> None:
        with self.lock:
            self.pending.append(serve.Change(went=went, came=came))

    def poll(self) -> serve.Change | None:
        with self.lock:
            return self.pending.pop(0) if self.pending else None

    def close(self, ch: serve.Channel) -> None:
        self.closed.append(ch.name)

    def open(self, name: str) -> serve.Channel | None:
        return self.jobs[name].channel


def wait_for(cond: Callable[[], bool], timeout: float = 10.0) -> None:
    for _ in range(int(timeout / 0.05)):
        if cond():
            return
        threading.Event().wait(0.05)
    raise AssertionError("timed out")


def test_jobs_that_go_are_dropped_and_closed_and_jobs_that_come_are_served() -> None:
    """The set changes under a running loop (the jobs file re-read): a job that went loses its queued work and its
    adapter (unloaded from the engine) and its channel is closed; one that came is served from the next turn; a
    job that comes back (a suspended job resumed) is a new attachment: READY again, sampled with the base model
    until its trainer pushes again."""
    eng = FakeEngine()
    slots = adapters.Slots(capacity=2, backend=eng)
    a, b, c = (Job(n, engine=eng, weight=4) for n in "abc")
    roster = FakeRoster({"a": a, "b": b, "c": c})
    stop, out, obs = threading.Event(), [], Observer()
    t = threading.Thread(target=lambda: out.append(serve.serve(
        index=0, channels=[a.channel, b.channel], slots=slots, observer=obs, should_stop=stop.is_set,
        roster=roster)), daemon=True)
    t.start()
    try:
        for j in (a, b):
            assert isinstance(j.control(), wire.Ready)
            j.sync(1)
            assert isinstance(j.control(), wire.Ack)
        a.work(1)
        b.work(1)
        a.rollouts(2)
        b.rollouts(2)
        a_id = slots.current["a"].lora_id
        assert a_id in eng.loaded
        roster.change(went=("a",))
        wait_for(lambda: roster.closed == ["a"])
        assert "a" not in slots.current and a_id not in eng.loaded, "a's adapter unloaded: its slot is free"
        a.work(2)                                  # a frame on a socket no longer served: nothing comes of it
        b.work(2)
        assert {g.policy_version for g in b.rollouts(2)} == {1}
        assert a.verifier_in.recv(timeout=0.3) is None
        roster.change(came=("c",))
        c.trainer.send(wire.Work(step=1, policy_version=0, prompts=(types.Prompt(index=0, text="p", answer=""),)))
        assert isinstance(c.control(), wire.Ready)
        assert len(c.rollouts(1)) == 1
        # a resumes: a new channel for it (a fresh attachment), its trainer connects again
        a2 = Job("a", engine=eng, weight=4)
        roster.jobs["a"] = a2
        roster.change(came=("a",))
        assert isinstance(a2.control(), wire.Ready)
        a2.work(3)
        assert {g.policy_version for g in a2.rollouts(2)} == {0}, "nothing pushed since it came back"
    finally:
        stop.set()
        t.join(10)
    ledger = out[0]
    assert ledger.jobs["a"].detached == 1 and ledger.jobs["b"].detached == 0
    assert ledger.jobs["a"].completions == 8 and ledger.jobs["c"].completions == 2


def test_a_job_whose_push_was_lost_is_asked_again(pool, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """A restarted engine's READY reached the trainer but the push it asked for never came (in real pods: the
    trainer's connection to the new pod lagged behind the engine's to the trainer, and its push timed out): WORK
    ahead of the adapter held is skipped, and once no push came for ASK_AGAIN_SECONDS the job's trainer is told
    READY again, so it pushes anew; then its work is sampled with that push."""
    monkeypatch.setattr(serve, "ASK_AGAIN_SECONDS", 0.5)
    eng, slots, (a, b), stop, obs, out = pool
    assert isinstance(a.control(), wire.Ready)
    prompts = (types.Prompt(index=0, text="p", answer=""),)
    a.trainer.send(wire.Work(step=4, policy_version=3, prompts=prompts))   # skipped: no adapter v3 here
    again = a.control(timeout=10)
    assert isinstance(again, wire.Ready) and again.policy_version == 0, again
    assert isinstance(b.control(), wire.Ready) and b.control(timeout=1.0) is None, "b is not behind: asked once"
    a.sync(3)
    ack = a.control()
    while isinstance(ack, wire.Ready):     # asked on every ASK_AGAIN_SECONDS while behind, until the push came
        ack = a.control()
    assert isinstance(ack, wire.Ack) and ack.version == 3, ack
    a.trainer.send(wire.Work(step=4, policy_version=3, prompts=prompts))
    (group,) = a.rollouts(1)
    assert group.policy_version == 3
    assert a.control(timeout=1.0) is None, "asked no more once the push came"
