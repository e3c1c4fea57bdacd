"""Recovery in seconds, the unit parts (docs/recovery.md): a generator that joins a running job samples nothing
before it holds the trainer's weights; trainer 0 judges silence by the generators' beats; its pusher leaves a
silent generator out of the weight-sync group and renumbers the rest. The generator's real loop and trainer 0's real
``Pusher`` and ``Liveness`` over the in-process transport; only the broadcast is a double (as test_push_fence)."""
from __future__ import annotations

import dataclasses
import threading
import time
import uuid
from collections.abc import Sequence
from typing import Any

import pytest

import test_push_fence as push_fence_test
from kubeforge.runtime import transport, types, weightsync, wire
from kubeforge.runtime.generator import join
from kubeforge.runtime.generator import loop as generator_role
from kubeforge.runtime.trainer import buffer, liveness, membership
from kubeforge.runtime.trainer import pusher as trainer_push


class Weights:
    def __init__(self) -> None:
        self.loaded: list[int] = []

    def load(self, sync: wire.Sync) -> generator_role.SyncResult:
        self.loaded.append(sync.version)
        return generator_role.SyncResult(seconds=0.01, bytes=8)


class Sampler:
    def sample(self, prompts: Sequence[types.Prompt]) -> list[types.RolloutGroup]:
        return [types.RolloutGroup(prompt=p, prompt_token_ids=[1], completions=[
            types.Completion(token_ids=[2], logprobs=[-1.0], text="")], policy_version=0) for p in prompts]


class Observer:
    def __init__(self) -> None:
        self.sampled_versions: list[int] = []
        self.skipped_versions: list[int] = []

    def sampled(self, *, groups: Sequence[types.RolloutGroup], seconds: float) -> None:
        self.sampled_versions += [g.policy_version for g in groups]

    def synced(self, **_: object) -> None: ...
    def sync_failed(self, **_: object) -> None: ...

    def skipped(self, *, work: wire.Work, version: int) -> None:
        self.skipped_versions.append(work.policy_version)

    def unexpected(self, **_: object) -> None: ...


def work(step: int, version: int) -> wire.Work:
    return wire.Work(step=step, policy_version=version,
                     prompts=(types.Prompt(index=step, text="a", answer="a"),))


def sync(version: int) -> wire.Sync:
    return wire.Sync(version=version, step=version, host="mem", port=1, world_size=2)


def serve(frames: Sequence[wire.Message], *, max_policy_lag: int | None = None) -> tuple[Observer, Weights, float]:
    """The generator's real loop on ``frames`` then STOP; what it sampled, skipped and loaded, and the seconds from
    its READY to holding the trainer's weights."""
    name = uuid.uuid4().hex
    rx = {k: transport.open_receiver(f"mem://{k}-{name}") for k in ("gen", "ctl", "ver")}
    own = [transport.open_sender([f"mem://{k}-{name}"], role="generator", index=0) for k in ("ctl", "ver")]
    trainer = transport.open_sender([f"mem://gen-{name}"], role="trainer", index=0)
    for f in (*frames, wire.Stop(reason="done")):
        trainer.send(f)
    observer, weights = Observer(), Weights()
    current: list[float] = []
    joining = join.Joining(on_current=lambda version, seconds: current.append(seconds))
    generator_role.run(index=0, inbox=rx["gen"], control=own[0], verifiers=own[1], sampler=Sampler(),
                       weights=weights, observer=observer, max_policy_lag=max_policy_lag, joining=joining)
    for s in (*own, trainer):
        s.close()
    for r in rx.values():
        r.close()
    return observer, weights, current[0] if current else -1.0


def test_a_generator_joining_a_running_job_samples_nothing_before_the_trainers_push() -> None:
    # restarted at version 0 while the trainer is at 7: WORK handed out before its READY was seen comes first
    observer, weights, seconds = serve([work(7, 7), work(8, 7), sync(7), work(8, 7), work(9, 8)], max_policy_lag=3)
    assert observer.skipped_versions == [7, 7]          # never sampled with the base model, though lag 3 allowed v7
    assert weights.loaded == [7] and observer.sampled_versions == [7, 7]
    assert 0 <= seconds < 5


def test_a_first_attempts_generator_is_current_at_once_and_never_waits_for_a_push() -> None:
    # weightSync.everySteps 2: WORK of version 1 comes before any push; the base model is version 0 on both sides
    observer, weights, _ = serve([work(0, 0), work(1, 0), work(2, 1), sync(2), work(3, 2)], max_policy_lag=2)
    assert observer.skipped_versions == [] and observer.sampled_versions == [0, 0, 0, 2]


def test_liveness_judges_only_generators_that_beat() -> None:
    now = [100.0]
    ear = liveness.Liveness(after=lambda: 2.0, clock=lambda: now[0])
    ear.heard(wire.Ack(role="generator", index=0, of=wire.Kind.READY, version=3, ok=True, detail=wire.ALIVE))
    ear.heard(wire.Ready(role="generator", index=1))                    # an older build: never beats
    ear.heard(wire.Ack(role="verifier", index=2, of=wire.Kind.READY, version=0, ok=True, detail=wire.ALIVE))
    now[0] = 101.9
    assert ear.silent([0, 1, 2]) == set()
    now[0] = 102.1
    assert ear.silent([0, 1, 2]) == {0} and abs(ear.quiet_for(0) - 2.1) < 1e-9
    ear.heard(wire.Ack(role="generator", index=0, of=wire.Kind.SYNC, version=4))    # any message is a sign of life
    assert ear.silent([0, 1]) == set()
    off = liveness.Liveness(after=lambda: 0.0, clock=lambda: now[0])
    off.heard(wire.Ack(role="generator", index=0, of=wire.Kind.READY, version=3, ok=True, detail=wire.ALIVE))
    now[0] = 1e6
    assert off.silent([0]) == set()


def test_alive_beats_reach_trainer_0_on_their_own_socket_and_stop() -> None:
    name = uuid.uuid4().hex
    ctl = transport.open_receiver(f"mem://ctl-{name}")
    beats = join.AliveBeats(index=3, every=0.05, version=lambda: 9, open_control=lambda timeout: transport.open_sender(
        [f"mem://ctl-{name}"], role="generator", index=3, ready_timeout=timeout)).start()
    time.sleep(0.4)
    beats.stop()
    got = []
    while (msg := ctl.recv(timeout=0.1)) is not None:
        got.append(msg)
    ctl.close()
    assert len(got) >= 3 and beats.sent == len(got)
    assert all(isinstance(m, wire.Ack) and m.of == wire.Kind.READY and m.ok and m.detail == wire.ALIVE
               and (m.index, m.version) == (3, 9) for m in got)


class Sender(push_fence_test.Sender):
    """The fence test's broadcast double (notices and ACKs real, tensors nowhere); ``reset`` records world sizes."""

    def __init__(self) -> None:
        self.worlds: list[int] = []

    def reset(self, *, world_size: int | None = None) -> int:
        self.worlds.append(int(world_size or 0))
        self.epoch += 1
        return self.epoch


def test_the_pusher_leaves_out_a_silent_generator_and_renumbers_the_live_ones() -> None:
    name = uuid.uuid4().hex
    inboxes = [transport.open_receiver(f"mem://gen{i}-{name}") for i in range(3)]
    ctl = transport.open_receiver(f"mem://ctl-{name}")
    acks = transport.open_sender([f"mem://ctl-{name}"], role="generator", index=0)
    to_gen = transport.open_sender([f"mem://gen{i}-{name}" for i in range(3)], role="trainer", index=0)
    double: Any = Sender()
    p = trainer_push.Pusher(generators=to_gen, control=ctl, sender=double, tensors=lambda: [], host="mem", port=1,
                            world_size=3 * 2 + 1, backend="gloo", timeout_s=5)     # 3 generators of TP 2
    try:
        assert p.reform(left_out=frozenset({0})) == 1 and double.worlds == [1 + 2 * 2]

        def answer() -> None:        # generators 1 and 2 ack; generator 0 is gone and must not be waited for
            for i in (1, 2):
                msg = inboxes[i].recv(timeout=5)
                assert isinstance(msg, wire.Sync)
                acks.send(wire.Ack(role="generator", index=i, of=wire.Kind.SYNC, version=msg.version,
                                   detail='{"seconds": 0.02, "bytes": 8}'))
                seen.append((i, msg.rank_base, msg.world_size))

        seen: list[tuple[int, int, int]] = []
        t = threading.Thread(target=answer)
        t.start()
        started = time.monotonic()
        assert p.push(version=4, step=4).seconds == 0.02
        t.join(5)
        assert time.monotonic() - started < 5
        assert seen == [(1, 1, 5), (2, 3, 5)]                # ranks 1-2 and 3-4 of a group of 5
        assert inboxes[0].recv(timeout=0.1) is None          # nothing went to the silent one
        p.reform(left_out=frozenset())
        assert double.worlds[-1] == 7 and p.targets == [0, 1, 2]
        # generator 0's beats stopped before trainer 0 left it out: the push stops waiting for its ACK at once
        p.gone = lambda generators: {0} & set(generators)
        started = time.monotonic()
        with pytest.raises(weightsync.WeightSyncError, match=r"generators \[0\] silent"):
            p.push(version=5, step=5)
        assert time.monotonic() - started < 5             # not the 30 s ACK timeout
    finally:
        for s in (acks, to_gen):
            s.close()
        for r in (*inboxes, ctl):
            r.close()


def alive(i: int) -> wire.Ack:
    return wire.Ack(role="generator", index=i, of=wire.Kind.READY, version=3, ok=True, detail=wire.ALIVE)


def sync_ack(i: int, version: int) -> wire.Ack:
    return wire.Ack(role="generator", index=i, of=wire.Kind.SYNC, version=version,
                    detail='{"seconds": 0.02, "bytes": 8}')


def test_a_push_reads_what_waits_before_it_judges_a_generator_silent() -> None:
    """The overlapped push joins its flight after a train step longer than the silence: the ACKs that came
    meanwhile wait unread, and both generators are alive. A generator that said nothing is still silent."""
    name = uuid.uuid4().hex
    inboxes = [transport.open_receiver(f"mem://gen{i}-{name}") for i in range(2)]
    ctl = transport.open_receiver(f"mem://ctl-{name}")
    acks = [transport.open_sender([f"mem://ctl-{name}"], role="generator", index=i) for i in range(2)]
    to_gen = transport.open_sender([f"mem://gen{i}-{name}" for i in range(2)], role="trainer", index=0)
    now = [100.0]
    ear = liveness.Liveness(after=lambda: 2.0, clock=lambda: now[0])
    double: Any = Sender()
    p = trainer_push.Pusher(generators=to_gen, control=ctl, sender=double, tensors=lambda: [], host="mem", port=1,
                            world_size=3, backend="gloo", timeout_s=5)
    p.gone, p.on_other = ear.silent, ear.heard
    try:
        for i in range(2):
            ear.heard(alive(i))
        p.start(version=4, step=4)
        for i in range(2):
            assert isinstance(inboxes[i].recv(timeout=5), wire.Sync)
            acks[i].send(sync_ack(i, 4))
        time.sleep(0.2)                    # both ACKs wait in the control inbox
        now[0] = 110.0                     # the train step: 10 s, the silence 2 s
        result = p.finish()
        assert result is not None and result.seconds == 0.02
        for i in range(2):                 # the drain before the next push hears both (trainer.pushes)
            ear.heard(alive(i))
        p.start(version=5, step=5)
        acks[0].send(alive(0))
        acks[0].send(sync_ack(0, 5))
        time.sleep(0.2)
        now[0] = 120.0
        started = time.monotonic()
        with pytest.raises(weightsync.WeightSyncError, match=r"generators \[1\] silent"):
            p.finish()
        assert time.monotonic() - started < 5                # not the 30 s ACK timeout
    finally:
        for snd in (*acks, to_gen):
            snd.close()
        for r in (*inboxes, ctl):
            r.close()


@dataclasses.dataclass
class Deadlines:
    answer_within: float = 30.0
    start_deadline: float = 60.0
    peer_silence: float = 2.0


@dataclasses.dataclass
class Peers:
    peers: int


@dataclasses.dataclass
class Learner:
    step: int = 3
    policy_version: int = 3


class Reformer:
    """The weight pusher as the membership sees it: re-forms, and takes the ACKs of its push in flight."""

    def __init__(self) -> None:
        self.took: list[tuple[int, int]] = []

    def reform(self, *, members: int | None = None, left_out: frozenset[int] = frozenset()) -> int:
        return 1

    def acked(self, msg: wire.Ack) -> None:
        self.took.append((msg.index, msg.version))


def heard_membership(ctl: transport.Receiver, pusher: Reformer, *, generators: int,
                     now: list[float]) -> membership.Membership:
    """Trainer 0's real membership of ``generators`` over the in-process transport, its ear on the clock ``now``
    (a 2 s silence)."""
    peers: Any = Peers(generators)
    m = membership.Membership(
        settings=Deadlines(), generators=peers, control=ctl, pusher=pusher, learner=Learner(),
        rollouts=buffer.RolloutBuffer(max_policy_lag=1, capacity=8), observer=Observer(),
        generator_address=lambda i: None, push=lambda **kw: None, send_work=lambda g, w: None,
        work=lambda step, prompts: work(step, 3))
    m.liveness = liveness.Liveness(after=lambda: 2.0, clock=lambda: now[0])
    return m


def test_a_hand_off_hears_the_beats_waiting_before_it_judges_a_generator_quiet() -> None:
    """A train step (or a send to a dead peer running out its bound) longer than the silence: generator 1's beat
    and ACK wait unread, generator 0 said nothing. Generator 1 is not quiet (a hand-off to it goes out), generator 0
    is. The waiting ACK reaches the push in flight at once, and once only."""
    name = uuid.uuid4().hex
    ctl = transport.open_receiver(f"mem://ctl-{name}")
    gen1 = transport.open_sender([f"mem://ctl-{name}"], role="generator", index=1)
    pusher = Reformer()
    now = [100.0]
    m = heard_membership(ctl, pusher, generators=2, now=now)
    try:
        for i in range(2):
            m.on_control(alive(i))
        now[0] = 105.0
        gen1.send(alive(1))
        gen1.send(sync_ack(1, 3))
        time.sleep(0.2)                    # both wait in the control inbox
        assert not m.quiet(1) and m.quiet(0)
        assert pusher.took == [(1, 3)]
        m.drain()
        assert pusher.took == [(1, 3)] and not m.quiet(1)
    finally:
        gen1.close()
        ctl.close()


def test_a_sync_carries_its_receivers_rank_on_the_wire() -> None:
    decoded = wire.decode(wire.encode(dataclasses.replace(sync(3), rank_base=5)))
    assert isinstance(decoded, wire.Sync) and decoded.rank_base == 5


def test_trainer_0_reports_its_silent_generators_with_when_each_was_last_heard() -> None:
    """What the operator acts on (docs/recovery.md): the members silent for the peer silence, the one kept in when
    none answers too, each with the wall clock it was last heard; a starting or left member is not silent."""
    name = uuid.uuid4().hex
    ctl = transport.open_receiver(f"mem://ctl-{name}")
    now = [100.0]
    m = heard_membership(ctl, Reformer(), generators=3, now=now)
    try:
        for i in range(3):
            m.on_control(alive(i))
        now[0] = 101.0
        m.on_control(alive(2))
        now[0] = 102.5
        assert m.liveness.since([0, 1, 2], wall=lambda: 1000.0) == {0: 997.5, 1: 997.5}
        m.starting[1] = now[0]                  # generator 1 is loading its engine again: not silent
        assert m.silent_now().keys() == {0}
        now[0] = 103.5
        assert m.silent_now().keys() == {0, 2}, "every silent member, whether or not one is kept in"
    finally:
        ctl.close()


def test_the_pod_reporter_patches_a_change_of_silence_at_once_and_carries_it_on_every_step() -> None:
    from kubeforge.api import contract, progress
    from kubeforge.runtime.trainer import report

    class Pod:
        def __init__(self) -> None:
            self.patches: list[progress.ProgressReport | None] = []

        def annotations(self) -> dict[str, str]:
            return {}

        def patch_annotations(self, annotations: Any) -> None:
            self.patches.append(progress.ProgressReport.decode(annotations[contract.ANNOTATION_PROGRESS]))

    pod = Pod()
    r = report.PodAnnotationReporter(pod="tiny-trainer-0", namespace="ns", api=pod)
    r.silent({0: 5.0})                          # before any step: no report to carry it
    assert pod.patches == []
    r.step(progress.StepRecord(step=6, trainer_epoch=2))
    r.silent({0: 5.0})                          # no change: no patch
    r.silent({0: 5.0, 1: 7.0})
    r.step(progress.StepRecord(step=7, trainer_epoch=2))
    r.silent({})
    got = [(p.step, p.trainer_epoch, p.silent_generators) for p in pod.patches if p is not None]
    assert got == [(6, 2, {0: 5.0}), (6, 2, {0: 5.0, 1: 7.0}), (7, 2, {0: 5.0, 1: 7.0}), (7, 2, {})]
