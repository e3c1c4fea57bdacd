"""wire: multi-turn episodes (flag bit 2) round trip, older frames decode unchanged, malformed spans are refused."""
from __future__ import annotations

import struct

import pytest

from kubeforge.runtime import types, wire
from kubeforge.runtime.wire import episodes, group as wire_group


def multi_group(spans: tuple[types.PolicySpans, ...] = (((0, 2), (4, 5)), ((0, 3),)),
                rewards: list[float] | None = None) -> types.RolloutGroup:
    comps = [types.Completion(token_ids=[5, 6, 7, 8, 9], logprobs=[-0.5, -0.25, 0.0, 0.0, -1.0], text="a<r>b"),
             types.Completion(token_ids=[5, 6, 7], logprobs=[-0.5, -0.5, -0.5], text="abc")]
    return types.RolloutGroup(
        prompt=types.Prompt(index=3, text="guess", answer="4"), prompt_token_ids=[1, 2], completions=comps,
        policy_version=2, step=1, rewards=rewards, scores={} if rewards is None else {"environment": rewards},
        policy_spans=spans,
        episode_stats=(types.EpisodeStats(turns=2, tool_calls=1, tool_errors=0, env_reward=1.0),
                       types.EpisodeStats(turns=1)))


@pytest.mark.parametrize("kind", [wire.Rollout, wire.Scored])
def test_round_trip(kind: type) -> None:
    msg = kind(group=multi_group(rewards=[1.0, 0.0]))
    back = wire.decode(wire.encode(msg))
    assert back == msg
    assert back.group.policy_spans == (((0, 2), (4, 5)), ((0, 3),))
    assert back.group.episode_stats[1].env_reward is None
    assert back.group.episode_stats[0].env_reward == 1.0


def test_a_group_of_episodes_travels_alone_in_a_packed_send() -> None:
    plain = wire.Rollout(group=types.RolloutGroup(prompt=types.Prompt(index=1, text="x", answer="y"),
                                                  prompt_token_ids=[1], completions=[types.Completion(
                                                      token_ids=[1], logprobs=[-1.0], text="y")], policy_version=0))
    msgs = [plain, wire.Rollout(group=multi_group()), plain]
    decoded = []
    for f in wire.pack(msgs):
        m = wire.decode(f)
        decoded += list(m.messages) if isinstance(m, wire.Batch) else [m]
    assert decoded == msgs


def test_frames_without_the_flag_decode_as_before() -> None:
    g = multi_group()
    g.policy_spans = g.episode_stats = None
    frame = wire.encode(wire.Rollout(group=g))
    assert struct.unpack_from("<I", frame, 56)[0] & wire_group.FLAG_EPISODES == 0
    back = wire.decode(frame)
    assert back.group.policy_spans is None and back.group.episode_stats is None


def test_policy_mask() -> None:
    g = multi_group()
    assert types.policy_mask(g, 0).tolist() == [1, 1, 0, 0, 1]
    g.policy_spans = None
    assert types.policy_mask(g, 0) is None


@pytest.mark.parametrize("spans,needle", [
    ((((0, 2), (1, 5)), ((0, 3),)), "overlapping"),      # overlap
    ((((0, 2), (4, 6)), ((0, 3),)), "past the completion"),
    ((((2, 2),), ((0, 3),)), "empty"),
    ((((3, 4), (0, 2)), ((0, 3),)), "overlapping"),       # out of order
])
def test_the_encoder_refuses_malformed_spans(spans: tuple[types.PolicySpans, ...], needle: str) -> None:
    with pytest.raises(wire.WireError, match=needle):
        wire.encode(wire.Rollout(group=multi_group(spans=spans)))


def _span_at(frame: bytes, k: int) -> int:
    """Offset of span ``k`` (the spans end the frame)."""
    spans = struct.unpack_from("<I", frame, 68)[0]
    return len(frame) - (spans - k) * episodes.SPAN.size


@pytest.mark.parametrize("patch,needle", [
    (lambda f: f[:_span_at(f, 1)] + struct.pack("<3I", 0, 1, 5) + f[_span_at(f, 2):], "overlapping"),
    (lambda f: f[:_span_at(f, 2)] + struct.pack("<3I", 1, 0, 4), "past the completion"),
    (lambda f: f[:_span_at(f, 2)] + struct.pack("<3I", 1, 2, 2), "empty"),
    (lambda f: f[:_span_at(f, 2)] + struct.pack("<3I", 0, 4, 5), "out of order|overlapping"),
    (lambda f: f[:-4], "header says"),                                              # truncated section
    (lambda f: f[:56] + struct.pack("<I", struct.unpack_from("<I", f, 56)[0] & ~4) + f[60:], "reserved"),
])
def test_the_decoder_refuses_malformed_spans(patch: object, needle: str) -> None:
    frame = wire.encode(wire.Rollout(group=multi_group()))
    with pytest.raises(wire.WireError, match=needle) as e:
        wire.decode(patch(frame))  # type: ignore[operator]
    assert e.value.reason == "malformed"
