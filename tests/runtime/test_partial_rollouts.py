"""Partial rollouts (spec.algorithm.partialRollouts): the generator's step-driven pool and loop with in-process fakes
(a SYNC mid-batch lands between two engine steps; tokens carry both versions and the logprobs of the weights that
sampled them), the wire's token versions (round trip, refusals, old frames), and the trainer's per-token staleness
(masked, counted). The real-vLLM check is ``test_partial_rollouts_vllm.py``."""
from __future__ import annotations

import dataclasses
import struct
import uuid

import numpy as np
import pytest
import torch

from kubeforge.runtime import transport, types, wire
from kubeforge.runtime.generator import loop, partial, stepper
from kubeforge.runtime.learner import batch, staleness
from kubeforge.runtime.trainer import buffer
from kubeforge.runtime.wire import group as wire_group

PROMPTS = (types.Prompt(index=0, text="a", answer="a"), types.Prompt(index=1, text="b", answer="b"))


# ---------------------------------------------------------------- fakes


class Weights:
    def __init__(self) -> None:
        self.version = 0

    def load(self, sync: wire.Sync) -> loop.SyncResult:
        self.version = sync.version
        return loop.SyncResult(seconds=0.0, bytes=1)


class Observer:
    def __init__(self) -> None:
        self.groups: list[types.RolloutGroup] = []

    def sampled(self, *, groups: list[types.RolloutGroup], seconds: float) -> None:
        self.groups.extend(groups)

    def synced(self, **_: object) -> None: ...
    def sync_failed(self, **_: object) -> None: ...
    def skipped(self, **_: object) -> None: ...
    def unexpected(self, **_: object) -> None: ...


class FakeEngine:
    """One token per request per step; request ``i`` of a prompt runs ``2 + 3 * i`` tokens (skewed lengths); each
    token's logprob is ``-(1 + version of the weights loaded)``: the tokens tell which weights sampled them.
    ``on_step`` runs after each step (the test injects messages into the generator's inbox there)."""

    def __init__(self, weights: Weights) -> None:
        self.weights = weights
        self.running: dict[str, list[int]] = {}
        self.steps = 0
        self.on_step = lambda steps, running: None

    def encode(self, prompt: types.Prompt) -> list[int]:
        return [ord(c) for c in prompt.text]

    def add(self, request_id: str, prompt_ids: list[int], *, seed: int | None) -> None:
        i = int(request_id.rsplit("-", 1)[1])
        self.running[request_id] = [0, 2 + 3 * i]

    def step(self) -> list[stepper.Delta]:
        self.steps += 1
        out = []
        for rid, state in list(self.running.items()):
            state[0] += 1
            done = state[0] >= state[1]
            out.append(stepper.Delta(request_id=rid, token_ids=[100 + state[0]],
                                     logprobs=[-(1.0 + self.weights.version)], text="x", finished=done,
                                     finish_reason="length" if done else ""))
            if done:
                del self.running[rid]
        self.on_step(self.steps, len(self.running))
        return out

    def abort(self, request_ids: list[str]) -> None:
        for r in request_ids:
            self.running.pop(r, None)


# ---------------------------------------------------------------- the generator's pool and loop


def test_pool_switch_mid_flight_stamps_both_versions() -> None:
    weights = Weights()
    eng = FakeEngine(weights)
    pool = stepper.Pool(eng, group_size=3)
    pool.add(PROMPTS[:1], step=4, version=0, seed=1)
    out: list[types.RolloutGroup] = []
    for _ in range(3):
        out += pool.step()
    weights.version = 1
    pool.switch(1)                   # after 3 steps: completion 0 (2 tokens) is done, 1 and 2 are in flight
    while pool.busy():
        out += pool.step()
    (g,) = out
    assert g.step == 4 and g.policy_version == 1
    assert [len(c.token_ids) for c in g.completions] == [2, 5, 8]
    assert g.token_versions == (((0, 0),), ((0, 0), (3, 1)), ((0, 0), (3, 1)))
    assert types.token_versions(g, 2).tolist() == [0, 0, 0, 1, 1, 1, 1, 1]
    for i, c in enumerate(g.completions):     # each token's behaviour logprob is the one its weights gave
        assert (np.asarray(c.logprobs) == -(1.0 + types.token_versions(g, i))).all()
    assert pool.counters.switches == 1 and pool.counters.switched_completions == 2


def test_pool_without_a_switch_sends_no_versions() -> None:
    pool = stepper.Pool(FakeEngine(Weights()), group_size=2)
    pool.add(PROMPTS, step=0, version=3, seed=None)
    out: list[types.RolloutGroup] = []
    pool.switch(3)       # a switch to the same version before any token (as after a re-push) changes nothing
    while pool.busy():
        out += pool.step()
    assert [g.prompt.index for g in out] == [0, 1]
    assert all(g.token_versions is None and g.policy_version == 3 for g in out)


def test_sync_mid_batch_is_applied_between_engine_steps() -> None:
    name = uuid.uuid4().hex
    inbox = transport.open_receiver(f"mem://gen-{name}")
    control_in = transport.open_receiver(f"mem://ctl-{name}")
    ver_in = transport.open_receiver(f"mem://ver-{name}")
    to_gen = transport.open_sender([f"mem://gen-{name}"], role="trainer", index=0)
    control = transport.open_sender([f"mem://ctl-{name}"], role="generator", index=0)
    verifiers = transport.open_sender([f"mem://ver-{name}"], role="generator", index=0)
    weights, observer = Weights(), Observer()
    eng = FakeEngine(weights)

    def inject(steps: int, running: int) -> None:
        if steps == 3:      # in flight: the SYNC must not wait for the longest completion (8 steps)
            to_gen.send(wire.Sync(version=1, step=1, host="t", port=1, world_size=2))
        if running == 0 and steps > 3:
            to_gen.send(wire.Stop(reason="done"))

    eng.on_step = inject
    activity = partial.Activity()
    try:
        to_gen.send(wire.Work(step=0, policy_version=0, prompts=PROMPTS))
        partial.run(index=2, inbox=inbox, verifiers=verifiers, control=control,
                    pool=stepper.Pool(eng, group_size=3), weights=weights, observer=observer,
                    trainer_weights=("t", 1), activity=activity)
        assert eng.steps == 8                     # one batch: the SYNC came between steps 3 and 4
        assert [g.generator for g in observer.groups] == [2, 2]
        for g in observer.groups:
            assert g.policy_version == 1
            assert g.token_versions == (((0, 0),), ((0, 0), (3, 1)), ((0, 0), (3, 1)))
            assert types.token_versions(g, 1).tolist() == [0, 0, 0, 1, 1]
            assert g.completions[1].logprobs.tolist() == [-1.0] * 3 + [-2.0] * 2
        acks = []
        while (msg := control_in.recv(timeout=0.2)) is not None:
            acks.append(msg)
        assert [(type(m).__name__, getattr(m, "version", None)) for m in acks] == [("Ready", None), ("Ack", 1)]
        sent = []
        while (msg := ver_in.recv(timeout=0.2)) is not None:
            sent.append(msg)
        rollouts = [m for m in sent if isinstance(m, wire.Rollout)]
        assert [m.group.token_versions for m in rollouts] == [g.token_versions for g in observer.groups]
        assert isinstance(sent[-1], wire.Stop)
        report = activity.report()
        assert report["switches"] == 1 and report["switched_completions"] == 4 and report["completions"] == 6
    finally:
        for s in (to_gen, control, verifiers):
            s.close()
        for r in (inbox, control_in, ver_in):
            r.close()


# ---------------------------------------------------------------- wire


def _stamped(**kw: object) -> types.RolloutGroup:
    comps = [types.Completion(token_ids=[5, 6, 7], logprobs=[-0.1, -0.2, -0.3], text="abc", finish_reason="stop"),
             types.Completion(token_ids=[8], logprobs=[-0.4], text="d", finish_reason="length")]
    fields = dict(prompt=types.Prompt(index=3, text="p", answer="a"), prompt_token_ids=[1, 2], completions=comps,
                  policy_version=5, step=4, generator=1, rewards=[1.0, 0.0], scores={"answer": [1.0, 0.0]},
                  token_versions=(((0, 3), (2, 5)), ((0, 4),)))
    fields.update(kw)
    return types.RolloutGroup(**fields)  # type: ignore[arg-type]


def test_token_versions_round_trip_alone_and_packed() -> None:
    g = _stamped()
    back = wire.decode(wire.encode(wire.Scored(group=g)))
    assert isinstance(back, wire.Scored) and back.group == g
    assert back.group.token_versions == (((0, 3), (2, 5)), ((0, 4),))
    plain = dataclasses.replace(g, token_versions=None, prompt=types.Prompt(index=4, text="q", answer="a"))
    frames = wire.pack([wire.Scored(group=plain), wire.Scored(group=g), wire.Scored(group=plain)])
    msgs = [m for f in frames for m in (lambda d: d.messages if isinstance(d, wire.Batch) else [d])(wire.decode(f))]
    assert [m.group for m in msgs] == [plain, g, plain]
    with pytest.raises(wire.WireError, match="token_versions"):
        wire.encode(wire.Batch(messages=(wire.Scored(group=g), wire.Scored(group=plain))))


def test_a_group_without_versions_keeps_the_old_encoding() -> None:
    g = _stamped(token_versions=None)
    frame = wire.encode(wire.Scored(group=g))
    flags, segments = struct.unpack_from("<II", frame, 56)
    assert flags == wire_group.FLAG_REWARDS and segments == 0        # byte for byte what older senders made
    assert wire.decode(frame).group.token_versions is None  # type: ignore[union-attr]


@pytest.mark.parametrize("versions, fragment", [
    ((((1, 3),), ((0, 4),)), "starts at token 1"),          # first segment not at token 0
    ((((0, 3), (0, 4)), ((0, 4),)), "out of order"),        # token index not increasing
    ((((0, 4), (1, 3)), ((0, 4),)), "out of order"),        # version going back
    ((((0, 3), (3, 4)), ((0, 4),)), "segment at token 3"),  # beyond the completion
    ((((0, 6),), ((0, 4),)), "policy version is 5"),        # newer than the group
    ((((0, 3),),), "expected a tuple of 2"),                # one completion without segments
])
def test_bad_token_versions_are_refused_both_ways(versions: object, fragment: str) -> None:
    with pytest.raises(wire.WireError, match=fragment):
        wire.encode(wire.Scored(group=_stamped(token_versions=versions)))


def test_decoder_refuses_a_forged_versions_section() -> None:
    frame = bytearray(wire.encode(wire.Scored(group=_stamped())))
    tail = len(frame) - 3 * wire_group.SEGMENT.size
    wire_group.SEGMENT.pack_into(frame, tail + wire_group.SEGMENT.size, 0, 2, 9)   # version 9 > policy 5
    with pytest.raises(wire.WireError, match="token_versions"):
        wire.decode(bytes(frame))
    frame = bytearray(wire.encode(wire.Scored(group=_stamped())))
    struct.pack_into("<I", frame, 60, 1000)           # more segments than the frame holds
    with pytest.raises(wire.WireError):
        wire.decode(bytes(frame))


# ---------------------------------------------------------------- trainer: per-token staleness


def test_stale_tokens_beyond_the_lag_are_masked_and_counted() -> None:
    g = _stamped(token_versions=(((0, 3), (2, 5)), ((0, 4),)))   # tokens: [3, 3, 5] and [4]
    # training version 6, maxPolicyLag 1: tokens of versions < 5 are stale
    keeps = staleness.keep_masks([g], min_version=5)
    assert keeps[0] is not None and keeps[0].tolist() == [0, 0, 1]
    assert keeps[1] is not None and keeps[1].tolist() == [0]
    b = batch.collate(groups=[g], pad_id=0, scale_by_std=True, min_version=5)
    assert b.completion_mask.tolist() == [[0.0, 0.0, 1.0], [0.0, 0.0, 0.0]]
    assert torch.equal(batch.collate(groups=[g], pad_id=0, scale_by_std=True, min_version=3).completion_mask,
                       torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]]))
    fig = staleness.lag_figures([g], policy_version=6, max_policy_lag=1)
    assert fig == {"token_lag_mean": round((3 + 3 + 1 + 2) / 4, 4), "old_version_token_fraction": 0.75,
                   "masked_stale_tokens": 3}
    plain = _stamped(token_versions=None)
    assert staleness.keep_masks([plain], min_version=7) == [None, None]   # one version: the buffer decides
    assert staleness.lag_figures([plain], policy_version=6, max_policy_lag=1)["old_version_token_fraction"] == 0.0


def test_buffer_keeps_a_group_whose_newest_tokens_are_fresh() -> None:
    buf = buffer.RolloutBuffer(max_policy_lag=1, capacity=8)
    g = _stamped()                 # newest version 5, oldest 3: lag 1 and 3 at version 6
    assert buf.add(group=g, policy_version=6) is None
    assert buf.take(step=4, policy_version=6) == [g]
