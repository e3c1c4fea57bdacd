"""wire: round trips of every message kind, field-level refusals, and fuzzing (random, truncated, bit-flipped and
type-mutated frames must only ever raise WireError)."""
from __future__ import annotations

import dataclasses
import math
import struct
from typing import Any, Callable

import hypothesis
import msgpack
import numpy as np
import pytest
from hypothesis import strategies as st

from kubeforge.runtime import types, wire
from kubeforge.runtime.wire import group as wire_group

FUZZ = hypothesis.settings(max_examples=300, deadline=None,
                           suppress_health_check=[hypothesis.HealthCheck.too_slow])


def completion(n: int = 3, *, text: str = "ab") -> types.Completion:
    return types.Completion(token_ids=list(range(5, 5 + n)), logprobs=[-0.5 * (i + 1) for i in range(n)], text=text,
                            finish_reason="stop")


def group(*, rewards: list[float] | None = None, k: int = 2) -> types.RolloutGroup:
    return types.RolloutGroup(
        prompt=types.Prompt(index=7, text="copy: ab\n", answer="ab"), prompt_token_ids=[70, 80, 90],
        completions=[completion(i + 1) for i in range(k)], policy_version=3, step=2, generator=1, rewards=rewards,
        scores={} if rewards is None else {"answer": list(rewards)})


MESSAGES: dict[str, Callable[[], wire.Message]] = {
    "hello": lambda: wire.Hello(role="generator", index=2),
    "ready": lambda: wire.Ready(role="generator", index=0, policy_version=4),
    "ack": lambda: wire.Ack(role="generator", index=1, of=wire.Kind.SYNC, version=5, ok=False, detail="boom"),
    "stop": lambda: wire.Stop(reason="done"),
    "work": lambda: wire.Work(step=3, policy_version=2, prompts=(types.Prompt(index=24, text="1+1", answer="2"),
                                                                 types.Prompt(index=25, text="ü€😀", answer=""))),
    "rollout": lambda: wire.Rollout(group=group()),
    "scored": lambda: wire.Scored(group=group(rewards=[1.0, -0.25])),
    "batch": lambda: wire.Batch(messages=(wire.Rollout(group=group(k=1)), wire.Rollout(group=group(k=3)),
                                          wire.Rollout(group=group(k=2)))),
    "batch_scored": lambda: wire.Batch(messages=(
        wire.Scored(group=group(rewards=[1.0, -0.25])),
        wire.Scored(group=dataclasses.replace(group(rewards=[0.5, 2.0]), prompt=types.Prompt(
            index=8, text="ü€😀", answer="€"))))),
    "sync": lambda: wire.Sync(version=9, step=9, host="tiny-trainer-0.tiny-trainer", port=29504, world_size=3,
                              backend="nccl", timeout_s=60),
    "env_call": lambda: wire.EnvCall(call=4, op="reset", ids=(0, 9),
                                     prompts=(types.Prompt(index=3, text="guess", answer="2"),) * 2),
    "env_step": lambda: wire.EnvCall(call=5, op="step", ids=(9,), texts=("ü€😀",)),
    "env_answer": lambda: wire.EnvAnswer(call=5, replies=(
        wire.EnvReply(messages=(("user", "higher"),), stepped=True, reward=0.5, tool_calls=1, seconds=0.01),
        wire.EnvReply(failure="env_timeout", detail="no answer within 10 s", seconds=10.0))),
}


@pytest.mark.parametrize("name", sorted(MESSAGES))
def test_round_trip(name: str) -> None:
    msg = MESSAGES[name]()
    frame = wire.encode(msg)
    assert frame[:4] == wire.MAGIC
    assert wire.decode(frame) == msg
    assert wire.decode(memoryview(frame)) == msg
    assert wire.decode(bytearray(frame)) == msg


def test_logprobs_round_trip_exactly() -> None:
    lps = [-1e-300, -123456.789, -0.1, 0.0, -math.pi]
    c = types.Completion(token_ids=[0, 1, 2**32 - 1, 5, 6], logprobs=lps, text="x")
    g = types.RolloutGroup(prompt=types.Prompt(index=0, text="", answer=""), prompt_token_ids=[],
                           completions=[c], policy_version=0)
    out = wire.decode(wire.encode(wire.Rollout(group=g)))
    assert isinstance(out, wire.Rollout)
    assert out.group.completions[0].logprobs.tolist() == lps
    assert out.group.completions[0].token_ids.tolist() == [0, 1, 2**32 - 1, 5, 6]


def test_decoded_token_arrays_are_packed_views_not_lists() -> None:
    """Token ids and logprobs arrive as typed numpy arrays (read-only views of the frame's bytes), one slice per
    completion of the group's column."""
    out = wire.decode(wire.encode(MESSAGES["scored"]()))
    assert isinstance(out, wire.Scored)
    comps = out.group.completions
    assert [c.token_ids.tolist() for c in comps] == [[5], [5, 6]]
    for c in comps:
        assert isinstance(c.token_ids, np.ndarray) and c.token_ids.dtype == types.TOKEN_DTYPE
        assert isinstance(c.logprobs, np.ndarray) and c.logprobs.dtype == types.LOGPROB_DTYPE
        assert not c.token_ids.flags.writeable and not c.token_ids.flags.owndata
    assert comps[0].token_ids.base is comps[1].token_ids.base   # both slices of one packed column
    assert out.group.prompt_token_ids.tolist() == [70, 80, 90]
    assert out.group.rewards == [1.0, -0.25] and out.group.scores == {"answer": [1.0, -0.25]}


def test_types_convert_sequences_and_refuse_bad_token_ids() -> None:
    c = types.Completion(token_ids=(1, 2), logprobs=[-1, -2], text="")
    assert c.token_ids.dtype == types.TOKEN_DTYPE and c.logprobs.dtype == types.LOGPROB_DTYPE
    assert c == types.Completion(token_ids=np.array([1, 2]), logprobs=[-1.0, -2.0], text="")
    assert c != types.Completion(token_ids=[1, 3], logprobs=[-1.0, -2.0], text="")
    for bad in ([-1], [2**32], [1.5], [[1, 2]]):
        with pytest.raises(ValueError):
            types.Completion(token_ids=bad, logprobs=[0.0] * len(bad), text="")


def frame_of(kind: wire.Kind, payload: Any, *, version: int = wire.SCHEMA_VERSION, magic: bytes = wire.MAGIC) -> bytes:
    body: bytes = msgpack.packb(payload, use_bin_type=True)
    return struct.pack("<4sHB", magic, version, int(kind)) + body


def payload_of(msg: wire.Message) -> dict[str, Any]:
    payload: dict[str, Any] = msgpack.unpackb(wire.encode(msg)[wire.HEADER.size:], raw=False)
    return payload


def expect(frame: bytes, reason: str, needle: str = "") -> None:
    with pytest.raises(wire.WireError) as e:
        wire.decode(frame)
    assert e.value.reason == reason, e.value
    assert needle in str(e.value)


def test_foreign_and_version_and_kind() -> None:
    good = wire.encode(MESSAGES["stop"]())
    expect(b"", wire.REASON_FOREIGN)
    expect(b"GET / HTTP/1.1\r\n\r\n", wire.REASON_FOREIGN, "magic")
    expect(b"\x00" * 3, wire.REASON_FOREIGN)
    expect(wire.MAGIC[:2], wire.REASON_MALFORMED, "truncated")
    expect(frame_of(wire.Kind.STOP, {"reason": ""}, version=wire.SCHEMA_VERSION + 1), wire.REASON_VERSION)
    expect(frame_of(wire.Kind.STOP, {"reason": ""}, version=0), wire.REASON_VERSION)
    expect(good[:6] + b"\x63" + good[7:], wire.REASON_MALFORMED, "unknown kind 99")
    expect(good + b"\x00", wire.REASON_MALFORMED, "msgpack")


def mutated(msg: wire.Message, edit: Callable[[dict[str, Any]], None]) -> bytes:
    p = payload_of(msg)
    edit(p)
    return frame_of(wire.kind_of(msg), p)


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def edit(p: dict[str, Any]) -> None:
        *head, last = path.split(".")
        node: Any = p
        for key in head:
            node = node[int(key)] if isinstance(node, list) else node[key]
        if isinstance(node, list):
            node[int(last)] = value
        elif value is _DELETE:
            del node[last]
        else:
            node[last] = value
    return edit


_DELETE = object()
SCORED = MESSAGES["scored"]


def raw_group(*, kind: wire.Kind = wire.Kind.SCORED, ints: tuple[int, ...] = (7, 3, 2, 1),
              lengths: tuple[int, ...] = (1, 2), prompt_ids: tuple[int, ...] = (70, 80, 90),
              token_ids: tuple[int, ...] = (5, 5, 6), logprobs: tuple[float, ...] = (-0.5, -0.5, -1.0),
              rewards: tuple[float, ...] | None = (1.0, -0.25),
              scores: dict[str, tuple[float, ...]] | None = None, prompt: tuple[str, str] = ("copy: ab\n", "ab"),
              texts: tuple[str, ...] = ("ab", "ab"), reasons: tuple[str, ...] = ("stop", "stop"),
              raw_strings: list[bytes] | None = None, reserved: tuple[int, int, int] = (0, 0, 0),
              n: int | None = None, total: int | None = None, flags: int | None = None,
              sbytes: int | None = None, sizes: list[int] | None = None, trailing: bytes = b"") -> bytes:
    """A ROLLOUT/SCORED frame built from the layout in wire/group.py's docstring (a second, independent writer), with
    any header field or section overridable to make it lie."""
    scores = {"answer": (1.0, -0.25)} if scores is None else scores
    strings = raw_strings if raw_strings is not None else [
        s.encode() for s in (*prompt, *texts, *reasons, *scores)]
    floats = [*logprobs, *(rewards or ()), *(v for vs in scores.values() for v in vs)]
    head = struct.pack("<4sHBB4Q8I", wire.MAGIC, wire.SCHEMA_VERSION, int(kind), reserved[0], *ints,
                       len(lengths) if n is None else n, len(prompt_ids), len(token_ids) if total is None else total,
                       len(scores), (0 if rewards is None else 1) if flags is None else flags, reserved[1],
                       sum(map(len, strings)) if sbytes is None else sbytes, reserved[2])
    sizes = [len(b) for b in strings] if sizes is None else sizes
    return b"".join((head, struct.pack(f"<{len(floats)}d", *floats),
                     struct.pack(f"<{len(lengths) + len(sizes)}I", *lengths, *sizes),
                     struct.pack(f"<{len(prompt_ids) + len(token_ids)}I", *prompt_ids, *token_ids),
                     *strings, trailing))


def test_the_layout_writer_in_this_test_matches_the_encoder() -> None:
    assert raw_group() == wire.encode(SCORED())
    assert wire.decode(raw_group()) == SCORED()


BIG = 2**63


@pytest.mark.parametrize("frame,needle", [
    (raw_group()[:71], "shorter than the 72-byte group header"),
    (raw_group(reserved=(1, 0, 0)), "reserved"),
    (raw_group(reserved=(0, 0, 4)), "reserved"),
    (raw_group(ints=(BIG, 3, 2, 1)), "exceeds"),
    (raw_group(ints=(7, 3, 2**64 - 1, 1)), "exceeds"),
    (raw_group(n=0), "0 completions, expected 1"),
    (raw_group(n=wire.MAX_COMPLETIONS + 1), "completions, expected 1 to"),
    (raw_group(flags=9), "unknown flags"),
    (raw_group(flags=3), "token_versions"),        # partial rollouts' flag without its segments
    (raw_group(reserved=(0, 2, 0)), "reserved"),   # segments without the flag
    (raw_group(rewards=None), "a scored group needs rewards"),
    (raw_group(total=4), "its header says"),
    (raw_group(trailing=b"\x00"), "its header says"),
    (raw_group(sbytes=1), "its header says"),
    (raw_group(lengths=(2, 2)), "lengths: they sum to 4, the header says 3"),
    (raw_group(sizes=[1, 0, 0, 0, 0, 0, 17]), "lengths sum to 18 bytes"),
    (raw_group(logprobs=(-0.5, math.nan, -1.0)), "completions.logprobs: contains a non-finite value"),
    (raw_group(logprobs=(-0.5, -math.inf, -1.0)), "completions.logprobs: contains a non-finite"),
    (raw_group(rewards=(1.0, math.inf)), "group.rewards: contains a non-finite"),
    (raw_group(scores={"a": (1.0, 0.0), "b": (math.nan, 0.0)}), "group.scores.b: contains a non-finite"),
    (raw_group(scores={"": (1.0, 0.0)}), "verifier name of 0 characters"),
    (raw_group(raw_strings=[b"p", b"a", b"x", b"y", b"stop", b"stop", b"v", b"v"],
               scores={"v": (0.0, 0.0), "w": (1.0, 1.0)}), "appears twice"),
    (raw_group(raw_strings=[b"p", b"a", b"\xff", b"y", b"stop", b"stop", b"answer"]), "string 2 is not valid UTF-8"),
    (raw_group(raw_strings=[b"p", b"a", "é".encode()[:1], "é".encode()[1:], b"stop", b"stop", b"answer"]),
     "string 2 is not valid UTF-8"),   # a character split between two strings: each is checked on its own
])
def test_group_frame_refusals(frame: bytes, needle: str) -> None:
    expect(frame, wire.REASON_MALFORMED, needle)


def test_group_frame_refusals_of_bounds() -> None:
    """The bounds, with tight limits (the real ones need frames of many MiB to cross)."""
    tight = wire_group.Limits(completions=2, tokens=3, verifiers=1, text_chars=9, name_chars=6, frame_bytes=1 << 20)

    def refused(frame: bytes, needle: str, *, scored: bool = True) -> None:
        with pytest.raises(wire_group.Invalid, match=needle):
            wire_group.decode(memoryview(frame), scored=scored, limits=tight)

    assert wire_group.decode(memoryview(raw_group()), scored=True, limits=tight) == SCORED().group
    refused(raw_group(lengths=(1, 1, 1), token_ids=(1, 2, 3), logprobs=(0.0,) * 3, rewards=(0.0,) * 3,
                      scores={"a": (0.0,) * 3}, texts=("", "", ""), reasons=("", "", "")), "3 completions")
    refused(raw_group(lengths=(0, 4), token_ids=(1, 2, 3, 4), logprobs=(0.0,) * 4), "a completion of 4 tokens exceeds 3")
    refused(raw_group(prompt_ids=(1, 2, 3, 4)), "prompt_token_ids: 4 tokens exceed 3")
    refused(raw_group(scores={"a": (0.0, 0.0), "b": (0.0, 0.0)}), "2 verifiers exceed 1")
    refused(raw_group(texts=("a" * 10, "")), "a text exceeds 9 characters")
    refused(raw_group(texts=("é" * 9, "é" * 10)), "a text exceeds 9 characters")   # 20 bytes, 10 characters
    assert wire_group.decode(memoryview(raw_group(texts=("é" * 9, ""))), scored=True, limits=tight).completions[0].text \
        == "é" * 9   # 18 bytes, 9 characters: within the bound
    refused(raw_group(prompt=("a" * 10, "")), "a text exceeds 9")
    refused(raw_group(reasons=("stop", "toolong")), "finish_reason: one exceeds 6")
    refused(raw_group(reasons=("stop", "tööööö!")), "finish_reason: one exceeds 6")
    refused(raw_group(scores={"abcdefg": (0.0, 0.0)}), "verifier name of 7 characters")


def test_a_rollout_may_carry_rewards_and_a_scored_group_must() -> None:
    rollout = raw_group(kind=wire.Kind.ROLLOUT)
    out = wire.decode(rollout)
    assert isinstance(out, wire.Rollout) and out.group.rewards == [1.0, -0.25]
    assert wire.decode(raw_group(kind=wire.Kind.ROLLOUT, rewards=None, scores={})) == MESSAGES["rollout"]()


def test_decoded_groups_are_columns_and_forward_without_completion_objects() -> None:
    """A decoded group's completions are CompletionColumns: texts and the columns without Completion objects, and
    re-encoding it (the verifier forwarding a scored group) sends the columns as they are."""
    out = wire.decode(wire.encode(wire.Rollout(group=group(k=3))))
    assert isinstance(out, wire.Rollout)
    cols = out.group.completions
    assert isinstance(cols, types.CompletionColumns)
    assert types.texts_of(cols) == ["ab", "ab", "ab"] and cols.lengths == (1, 2, 3)
    assert cols._items is None     # nothing made yet
    out.group.rewards, out.group.scores = [0.0, 1.0, 0.5], {"v": [1.0, 1.0, 1.0]}
    again = wire.encode(wire.Scored(group=out.group))
    assert cols._items is None
    assert wire.decode(again) == wire.Scored(group=dataclasses.replace(group(k=3), rewards=[0.0, 1.0, 0.5],
                                                                       scores={"v": [1.0, 1.0, 1.0]}))
    assert cols == group(k=3).completions and group(k=3).completions == cols and cols != group(k=2).completions
    assert [c.token_ids.tolist() for c in cols] == [[5], [5, 6], [5, 6, 7]] and cols[1] is cols[1]
    assert types.texts_of(group(k=2).completions) == ["ab", "ab"]


def test_non_ascii_strings_round_trip_and_stay_compact() -> None:
    g = dataclasses.replace(group(rewards=[0.5, 0.5]), prompt=types.Prompt(index=1, text="ü€😀", answer="ß"),
                            scores={"é": [1.0, 0.0]})
    g.completions = [completion(1, text="😀 ok"), completion(2, text="")]
    out = wire.decode(wire.encode(wire.Scored(group=g)))
    assert isinstance(out, wire.Scored) and out.group == g
    assert out.group.prompt.text == "ü€😀" and types.texts_of(out.group.completions) == ["😀 ok", ""]


def test_encode_refuses_groups_the_decoder_would() -> None:
    def refused(g: types.RolloutGroup, needle: str, *, scored: bool = True) -> None:
        with pytest.raises(wire.WireError, match=needle) as e:
            wire.encode(wire.Scored(group=g) if scored else wire.Rollout(group=g))
        assert e.value.reason == wire.REASON_MALFORMED

    ok = group(rewards=[1.0, 0.0])
    refused(dataclasses.replace(ok, completions=[]), "0 completions")
    refused(dataclasses.replace(ok, policy_version=-1), "policy_version")
    refused(dataclasses.replace(ok, step=True), "step")   # a bool is not an integer
    refused(dataclasses.replace(ok, rewards=[1.0]), "rewards: 1 values for 2")
    refused(dataclasses.replace(ok, rewards=[1.0, math.nan]), "rewards: contains a non-finite")
    refused(dataclasses.replace(ok, scores={"v": [1.0, math.inf]}), "scores.v: contains a non-finite")
    refused(dataclasses.replace(ok, scores={"v": [1.0]}), "scores.v: 1 values for 2")
    refused(dataclasses.replace(ok, scores={"": [1.0, 1.0]}), "0 characters")
    refused(dataclasses.replace(ok, scores={f"v{i}": [1.0, 1.0] for i in range(wire.MAX_VERIFIERS + 1)}),
            "verifiers exceed")
    refused(dataclasses.replace(ok, completions=[completion(1, text="x" * (wire.MAX_TEXT_CHARS + 1))] * 2),
            "a text exceeds")
    refused(dataclasses.replace(ok, prompt=types.Prompt(index=0, text="\ud800", answer="")), "surrogate")
    refused(dataclasses.replace(ok, completions=[types.Completion(token_ids=[1], logprobs=[math.nan], text="")] * 2),
            "logprobs: contains a non-finite")
    assert wire.decode(wire.encode(wire.Scored(group=ok))) == wire.Scored(group=ok)


def test_other_refusals() -> None:
    expect(mutated(MESSAGES["sync"](), _set("backend", "mpi")), wire.REASON_MALFORMED, "backend")
    expect(mutated(MESSAGES["sync"](), _set("port", 70000)), wire.REASON_MALFORMED, "port")
    expect(mutated(MESSAGES["ack"](), _set("of", 200)), wire.REASON_MALFORMED, "unknown kind")
    expect(mutated(MESSAGES["ack"](), _set("ok", 1)), wire.REASON_MALFORMED, "bool")
    expect(mutated(MESSAGES["work"](), _set("prompts", [{"index": 1}])), wire.REASON_MALFORMED, "prompts[0].text")
    expect(mutated(MESSAGES["stop"](), _set("reason", "x" * (wire.MAX_TEXT_CHARS + 1))), wire.REASON_MALFORMED,
           "exceed")
    expect(frame_of(wire.Kind.STOP, ["not", "a", "map"]), wire.REASON_MALFORMED, "expected a map")
    expect(frame_of(wire.Kind.STOP, {1: "int key"}), wire.REASON_MALFORMED, "msgpack")


def test_encode_refuses_what_decode_would() -> None:
    bad = types.Completion(token_ids=[1, 2], logprobs=[-1.0], text="")
    g = types.RolloutGroup(prompt=types.Prompt(index=0, text="", answer=""), prompt_token_ids=[], completions=[bad],
                           policy_version=0)
    with pytest.raises(wire.WireError, match="1 logprobs for 2 token_ids"):
        wire.encode(wire.Rollout(group=g))
    with pytest.raises(wire.WireError, match="needs rewards"):
        wire.encode(wire.Scored(group=group()))
    with pytest.raises(TypeError):
        wire.encode("not a message")  # type: ignore[arg-type]


def test_oversize_frame_refused() -> None:
    huge = wire.MAGIC + struct.pack("<HB", wire.SCHEMA_VERSION, int(wire.Kind.STOP)) + b"\x00" * wire.MAX_FRAME_BYTES
    expect(huge, wire.REASON_MALFORMED, "exceeds")


# ---------------------------------------------------------------- batches of groups


def rollouts(count: int, *, k: int = 2) -> list[wire.Message]:
    out: list[wire.Message] = []
    for i in range(count):
        g = group(k=k)
        g.prompt = types.Prompt(index=i, text=f"copy: {'é' * (i % 3)}ab\n", answer="ab")
        out.append(wire.Rollout(group=g))
    return out


def scored_groups(count: int, *, names: tuple[str, ...] = ("answer", "format")) -> list[wire.Message]:
    out: list[wire.Message] = []
    for i in range(count):
        g = group(k=1 + i % 3)
        g.rewards = [0.5 * j - i for j in range(len(g.completions))]
        g.scores = {name: [float(j + len(name)) for j in range(len(g.completions))] for name in names}
        g.prompt = types.Prompt(index=100 + i, text=f"p{i}", answer=str(i))
        out.append(wire.Scored(group=g))
    return out


def test_pack_round_trip_bounds_and_order() -> None:
    msgs = rollouts(7)
    frames = wire.pack(msgs)
    assert len(frames) == 1 and frames[0][6] == wire.Kind.BATCH
    batch = wire.decode(frames[0])
    assert isinstance(batch, wire.Batch) and list(batch.messages) == msgs
    cols = []
    for m in batch.messages:   # views of the batch's columns (8-byte aligned f64), read-only
        assert isinstance(m, wire.Rollout)
        lps = m.group.completions.logprobs   # type: ignore[attr-defined]
        assert lps.flags.aligned and not lps.flags.writeable and not m.group.prompt_token_ids.flags.writeable
        cols.append(lps.base)
    assert all(c is cols[0] for c in cols)
    # spread over peers: consecutive runs, in order
    parts = [wire.decode(f) for f in wire.pack(msgs, parts=3)]
    assert [len(p.messages) for p in parts if isinstance(p, wire.Batch)] == [3, 3]
    assert [m for p in parts for m in (p.messages if isinstance(p, wire.Batch) else [p])] == msgs
    # bounded in bytes: no batch frame over max_bytes, nothing lost
    one = len(wire.encode(wire.Batch(messages=(msgs[0],))))
    small = wire.pack(msgs, max_bytes=3 * one)
    assert len(small) > 1 and all(len(f) <= 3 * one for f in small)
    assert [m for f in small for m in _messages(f)] == msgs
    # alone, larger than max_bytes, or another kind: a plain frame of its own, order kept
    assert wire.pack(msgs[:1]) == [wire.encode(msgs[0])]
    big = wire.Rollout(group=group(k=1))
    big.group.completions[0] = completion(wire.BATCH_BYTES // 12 + 1)   # type: ignore[index]
    mixed = [msgs[0], msgs[1], wire.Stop(reason="x"), msgs[2], big, msgs[3], msgs[4]]
    frames = wire.pack(mixed)
    assert [f[6] for f in frames] == [wire.Kind.BATCH, wire.Kind.STOP, wire.Kind.ROLLOUT, wire.Kind.ROLLOUT,
                                      wire.Kind.BATCH]
    assert [m for f in frames for m in _messages(f)] == mixed
    assert wire.pack([]) == []
    # a kind, the verifier names or the presence of rewards change: a new frame
    scored = scored_groups(4)
    other = scored_groups(2, names=("answer",))
    frames = wire.pack([*msgs[:2], *scored, *other, *msgs[2:4]])
    assert [f[6] for f in frames] == [wire.Kind.BATCH] * 4
    assert [m for f in frames for m in _messages(f)] == [*msgs[:2], *scored, *other, *msgs[2:4]]


def test_pack_forwards_decoded_groups_without_making_completions() -> None:
    """The verifier re-sends decoded groups: their columns go into the next batch as they are."""
    got = _messages(wire.pack(scored_groups(5))[0])
    assert all(m.group.completions._items is None for m in got)   # type: ignore[attr-defined]
    again = _messages(wire.pack(got)[0])
    assert again == got == scored_groups(5)
    mixed = [got[0], *scored_groups(5)[1:]]   # decoded and built groups in one run
    assert _messages(wire.pack(mixed)[0]) == scored_groups(5)


def _messages(frame: bytes) -> list[wire.Message]:
    msg = wire.decode(frame)
    return list(msg.messages) if isinstance(msg, wire.Batch) else [msg]


def _layout(msgs: list[wire.Message]) -> dict[str, Any]:
    """The fields of a BATCH frame, computed independently of the encoder (the layout in wire/batch.py)."""
    gs = [m.group for m in msgs]   # type: ignore[union-attr]
    names = list(gs[0].scores)
    comps = [c for g in gs for c in g.completions]
    ptexts = [g.prompt.text.encode() for g in gs] + [g.prompt.answer.encode() for g in gs]
    strings = ptexts + [c.text.encode() for c in comps] + [c.finish_reason.encode() for c in comps] + [
        x.encode() for x in names]
    f: dict[str, Any] = {
        "item_kind": int(wire.kind_of(msgs[0])), "flags": int(gs[0].rewards is not None), "reserved": 0,
        "ints": [g.prompt.index for g in gs] + [g.policy_version for g in gs] + [g.step for g in gs]
        + [g.generator for g in gs],
        "logprobs": [x for c in comps for x in c.logprobs.tolist()],
        "rewards": [x for g in gs for x in (g.rewards or [])],
        "scores": [x for g in gs for name in names for x in g.scores[name]],
        "ns": [len(g.completions) for g in gs], "plens": [len(g.prompt_token_ids) for g in gs],
        "lengths": [len(c.token_ids) for c in comps], "sizes": [len(x) for x in strings],
        "prompt_ids": [x for g in gs for x in g.prompt_token_ids.tolist()],
        "token_ids": [x for c in comps for x in c.token_ids.tolist()], "strings": b"".join(strings)}
    f.update(k=len(gs), n=len(comps), v=len(names), p=len(f["prompt_ids"]), t=len(f["token_ids"]),
             s=len(f["strings"]))
    return f


def _write(f: dict[str, Any], *, version: int = wire.SCHEMA_VERSION) -> bytes:
    def section(fmt: str, values: list[Any]) -> bytes:
        return struct.pack(f"<{len(values)}{fmt}", *values)

    return b"".join([
        struct.pack("<4sHBB8I", wire.MAGIC, version, int(wire.Kind.BATCH), f["item_kind"], f["flags"], f["k"],
                    f["n"], f["v"], f["p"], f["t"], f["s"], f["reserved"]),
        section("Q", f["ints"]), section("d", f["logprobs"]), section("d", f["rewards"]), section("d", f["scores"]),
        section("I", f["ns"]), section("I", f["plens"]), section("I", f["lengths"]), section("I", f["sizes"]),
        section("I", f["prompt_ids"]), section("I", f["token_ids"]), f["strings"]])


def test_the_batch_writer_in_this_test_matches_the_encoder() -> None:
    for msgs in (rollouts(3), scored_groups(4)):
        frame = _write(_layout(msgs))
        assert frame == wire.pack(msgs)[0] == wire.encode(wire.Batch(messages=tuple(msgs)))
        assert _messages(frame) == msgs


def _bad(**edits: Any) -> bytes:
    """A BATCH of three scored groups (names answer, format) with some fields replaced."""
    f = _layout(scored_groups(3))
    for key, value in edits.items():
        f[key] = value(f) if callable(value) else value
    return _write(f)


def _at(key: str, i: int, value: Any) -> Callable[[dict[str, Any]], list[Any]]:
    def edit(f: dict[str, Any]) -> list[Any]:
        out = list(f[key])
        out[i] = value
        return out
    return edit


def _rollouts_without_rewards(**edits: Any) -> bytes:
    f = _layout(scored_groups(2))
    f.update(flags=0, rewards=[], item_kind=int(wire.Kind.SCORED), **edits)
    return _write(f)


BATCH_REFUSALS = {
    "truncated": (_write(_layout(rollouts(2)))[:-1], "its header says"),
    "longer": (_write(_layout(rollouts(2))) + b"\0", "its header says"),
    "header only": (_write(_layout(rollouts(2)))[:30], "shorter than"),
    "reserved": (_bad(reserved=1), "reserved"),
    "item kind": (_bad(item_kind=int(wire.Kind.STOP)), "item kind 4"),
    "nested batch": (_bad(item_kind=int(wire.Kind.BATCH)), "item kind 20"),
    "flags": (_bad(flags=3), "unknown flags"),
    "scored without rewards": (_rollouts_without_rewards(), "needs rewards"),
    "no groups": (_bad(k=0), "0 groups"),
    "too many groups": (_bad(k=wire.MAX_BATCH_GROUPS + 1), "groups, expected"),
    "fewer completions than groups": (_bad(n=2), "completions for 3 groups"),
    "too many completions": (_bad(n=wire.MAX_BATCH_COMPLETIONS + 1), "completions for 3 groups"),
    "too many verifiers": (_bad(v=wire.MAX_VERIFIERS + 1), "verifiers exceed"),
    "integer over 2^63": (_bad(ints=_at("ints", 5, 2**63)), "integer field"),
    "empty group": (_bad(ns=_at("ns", 1, 0)), "a group of 0"),
    "group over MAX_COMPLETIONS": (_bad(ns=_at("ns", 1, wire.MAX_COMPLETIONS + 1)), "a group of"),
    "completions do not sum": (_bad(ns=_at("ns", 1, 3)), "the header says"),
    "prompt over MAX_TOKENS": (_bad(plens=_at("plens", 0, wire.MAX_TOKENS + 1)), "prompt of"),
    "prompt lengths do not sum": (_bad(plens=_at("plens", 0, 2)), "prompts of 8 tokens"),
    "completion over MAX_TOKENS": (_bad(lengths=_at("lengths", 0, wire.MAX_TOKENS + 1)), "completion of"),
    "lengths do not sum": (_bad(lengths=_at("lengths", 0, 2)), "completions.lengths: they sum"),
    "string lengths do not sum": (_bad(sizes=_at("sizes", 0, 3)), "strings: lengths sum"),
    "text over MAX_TEXT_CHARS": (_bad(sizes=lambda f: [wire.MAX_TEXT_CHARS + 1, *f["sizes"][1:]],
                                      strings=lambda f: b"x" * (wire.MAX_TEXT_CHARS + 1) + f["strings"][2:],
                                      s=lambda f: f["s"] + wire.MAX_TEXT_CHARS - 1), "a text exceeds"),
    "reason over MAX_NAME_CHARS": (_bad(sizes=lambda f: [*f["sizes"][:12], 300, *f["sizes"][13:]],
                                        strings=lambda f: f["strings"][:f["s"] - 28] + b"y" * 296 + f["strings"][-28:],
                                        s=lambda f: f["s"] + 296), "finish_reason: one exceeds"),
    "empty verifier name": (_bad(sizes=lambda f: [*f["sizes"][:-2], 0, 12],
                                 strings=lambda f: f["strings"][:-12] + b"answerformat"),
                            "verifier name of 0 characters"),
    "verifier name twice": (_bad(strings=lambda f: f["strings"][:-12] + b"answeranswer",
                                 sizes=lambda f: [*f["sizes"][:-1], 6]), "appears twice"),
    "not UTF-8": (_bad(strings=lambda f: b"\xff" + f["strings"][1:]), "string 0 is not valid UTF-8"),
    "a character split between strings": (
        _bad(strings=lambda f: "é".encode() + f["strings"][2:],
             sizes=lambda f: [1, f["sizes"][1] + 1, *f["sizes"][2:]]), "string 0 is not valid UTF-8"),
    "NaN logprob": (_bad(logprobs=_at("logprobs", 3, math.nan)), "group 1: completions.logprobs"),
    "infinite reward": (_bad(rewards=_at("rewards", 5, -math.inf)), "group 2: rewards"),
    "NaN score": (_bad(scores=_at("scores", 5, math.nan)), "group 1: scores.format"),
}


@pytest.mark.parametrize("name", sorted(BATCH_REFUSALS))
def test_batch_refusals(name: str) -> None:
    frame, needle = BATCH_REFUSALS[name]
    expect(frame, wire.REASON_MALFORMED, needle)


def test_batch_version_and_size_checks() -> None:
    frame = bytearray(wire.pack(rollouts(2))[0])
    frame[4:6] = (wire.SCHEMA_VERSION + 1).to_bytes(2, "little")
    expect(bytes(frame), wire.REASON_VERSION, "schema version")
    assert _write(_layout(rollouts(2)), version=wire.SCHEMA_VERSION - 1)[4:6] != frame[4:6]
    expect(_write(_layout(rollouts(2)), version=wire.SCHEMA_VERSION - 1), wire.REASON_VERSION, "schema version")
    huge = _write(_layout(rollouts(2))) + bytes(wire.MAX_FRAME_BYTES)
    expect(huge, wire.REASON_MALFORMED, "exceeds")
    with pytest.raises(wire.WireError, match="BATCH: 0 items"):
        wire.encode(wire.Batch(messages=()))
    with pytest.raises(wire.WireError, match="ROLLOUT or all SCORED"):
        wire.encode(wire.Batch(messages=(*rollouts(1), *scored_groups(1))))
    with pytest.raises(wire.WireError, match="same verifier names"):
        wire.encode(wire.Batch(messages=(*scored_groups(1), *scored_groups(1, names=("x",)))))
    with pytest.raises(wire.WireError, match="exceeds"):   # encode refuses a batch the decoder would
        n = wire.MAX_TOKENS // 2
        lots = types.Completion(token_ids=np.zeros(n, np.uint32), logprobs=np.zeros(n), text="")
        g = types.RolloutGroup(prompt=types.Prompt(index=0, text="", answer=""), prompt_token_ids=[],
                               completions=[lots] * 6, policy_version=0)
        wire.encode(wire.Batch(messages=(wire.Rollout(group=g), wire.Rollout(group=g))))


def test_pack_names_the_group_a_sender_got_wrong() -> None:
    msgs = scored_groups(4)
    msgs[2].group.completions[0] = types.Completion(token_ids=[1], logprobs=[math.nan], text="")  # type: ignore
    with pytest.raises(wire.WireError, match=r"BATCH\[2\]: SCORED: group.completions.logprobs"):
        wire.pack(msgs)
    msgs = scored_groups(4)
    msgs[1].group.rewards = None   # type: ignore[union-attr]
    with pytest.raises(wire.WireError, match=r"BATCH\[1\]: SCORED: group.rewards"):
        wire.pack(msgs)
    msgs = rollouts(3)
    msgs[2].group.step = -1   # type: ignore[union-attr]
    with pytest.raises(wire.WireError, match=r"BATCH\[2\]: ROLLOUT: group.step"):
        wire.pack(msgs)
    msgs = rollouts(3)
    msgs[1].group.prompt = types.Prompt(index=1, text="x" * (wire.MAX_TEXT_CHARS + 1), answer="")  # type: ignore
    with pytest.raises(wire.WireError, match=r"BATCH\[1\]: ROLLOUT: group: a text exceeds"):
        wire.pack(msgs)
    msgs = rollouts(3)
    msgs[0].group.completions[1] = types.Completion(token_ids=[1], logprobs=[0.0], text="",  # type: ignore
                                                    finish_reason="r" * (wire.MAX_NAME_CHARS + 1))
    with pytest.raises(wire.WireError, match=r"BATCH\[0\]: ROLLOUT: group.completions.finish_reason"):
        wire.pack(msgs)
    msgs = scored_groups(3)
    msgs[1].group.scores["answer"][0] = math.nan   # type: ignore[union-attr]
    frames = wire.pack(msgs, check=False)   # the sender's check skipped: the receiver refuses the whole frame
    assert len(frames) == 1
    expect(frames[0], wire.REASON_MALFORMED, "group 1: scores.answer")


# ---------------------------------------------------------------- property-based


def _decode_only_wire_errors(data: bytes) -> wire.Message | None:
    """decode either returns a message that re-encodes to an equal message, or raises WireError: nothing else."""
    try:
        msg = wire.decode(data)
    except wire.WireError as e:
        assert e.reason in wire.REASONS
        assert not e.detail.startswith(wire.UNEXPECTED), e  # refused by a validator, not by the safety net
        return None
    assert wire.decode(wire.encode(msg)) == msg
    return msg


VALID_FRAMES = [wire.encode(f()) for f in MESSAGES.values()]


@FUZZ
@hypothesis.given(st.binary(max_size=512))
def test_fuzz_random_bytes(data: bytes) -> None:
    _decode_only_wire_errors(data)
    _decode_only_wire_errors(wire.MAGIC + data)
    _decode_only_wire_errors(VALID_FRAMES[0][:7] + data)


@FUZZ
@hypothesis.given(st.sampled_from(VALID_FRAMES), st.data())
def test_fuzz_truncated_frames_always_refused(frame: bytes, data: st.DataObject) -> None:
    cut = data.draw(st.integers(0, len(frame) - 1))
    with pytest.raises(wire.WireError) as e:
        wire.decode(frame[:cut])
    assert not e.value.detail.startswith(wire.UNEXPECTED)


@FUZZ
@hypothesis.given(st.sampled_from(VALID_FRAMES), st.data())
def test_fuzz_bit_flips(frame: bytes, data: st.DataObject) -> None:
    buf = bytearray(frame)
    for _ in range(data.draw(st.integers(1, 4))):
        bit = data.draw(st.integers(0, 8 * len(buf) - 1))
        buf[bit // 8] ^= 1 << (bit % 8)
    _decode_only_wire_errors(bytes(buf))


msgpack_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats() | st.text(max_size=20)
    | st.binary(max_size=40),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=12)


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix] if prefix else []
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else []
    for k, v in items:
        out.extend(_paths(v, prefix + (k,)))
    return out


MSGPACK_KINDS = sorted(k for k in MESSAGES if k not in ("rollout", "scored", "batch", "batch_scored"))


@FUZZ
@hypothesis.given(st.sampled_from(MSGPACK_KINDS), st.data(), msgpack_values)
def test_fuzz_type_mutations(name: str, data: st.DataObject, value: Any) -> None:
    msg = MESSAGES[name]()
    payload = payload_of(msg)
    path = data.draw(st.sampled_from(_paths(payload)))
    node: Any = payload
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    _decode_only_wire_errors(frame_of(wire.kind_of(msg), payload))


@FUZZ
@hypothesis.given(msgpack_values, st.sampled_from(list(wire.Kind)))
def test_fuzz_arbitrary_payloads(payload: Any, kind: wire.Kind) -> None:
    _decode_only_wire_errors(frame_of(kind, payload))


@FUZZ
@hypothesis.given(st.sampled_from(["rollout", "scored"]), st.data())
def test_fuzz_group_header_fields(name: str, data: st.DataObject) -> None:
    """Any value in any field of a group's fixed header (counts, flags, reserved, integers): refused or a message
    that re-encodes to itself; never another exception."""
    frame = bytearray(wire.encode(MESSAGES[name]()))
    fields = list(wire_group.HEAD.unpack_from(frame))
    for _ in range(data.draw(st.integers(1, 3))):
        i = data.draw(st.integers(3, len(fields) - 1))
        bits = 8 if i == 3 else 64 if i < 8 else 32
        fields[i] = data.draw(st.integers(0, 2**bits - 1) | st.integers(0, 4))
    wire_group.HEAD.pack_into(frame, 0, *fields)
    _decode_only_wire_errors(bytes(frame))


@FUZZ
@hypothesis.given(st.sampled_from(["batch", "batch_scored"]), st.data())
def test_fuzz_batch_header_fields(name: str, data: st.DataObject) -> None:
    """Any value in any field of a batch's header (item kind, flags, counts, reserved): refused or a batch that
    re-encodes to itself; never another exception."""
    frame = bytearray(wire.encode(MESSAGES[name]()))
    fields = list(wire.BATCH_HEAD.unpack_from(frame))
    for _ in range(data.draw(st.integers(1, 3))):
        i = data.draw(st.integers(3, len(fields) - 1))
        fields[i] = data.draw(st.integers(0, 2**(8 if i == 3 else 32) - 1) | st.integers(0, 4))
    wire.BATCH_HEAD.pack_into(frame, 0, *fields)
    _decode_only_wire_errors(bytes(frame))


finite = st.floats(allow_nan=False, allow_infinity=False, width=64)
completions = st.integers(0, 20).flatmap(lambda n: st.builds(
    types.Completion, token_ids=st.lists(st.integers(0, 2**32 - 1), min_size=n, max_size=n),
    logprobs=st.lists(finite, min_size=n, max_size=n), text=st.text(max_size=30), finish_reason=st.text(max_size=8)))


@FUZZ
@hypothesis.given(st.lists(completions, min_size=1, max_size=6), st.integers(0, 2**63 - 1), st.text(max_size=50),
                  st.data())
def test_round_trip_property(comps: list[types.Completion], version: int, text: str, data: st.DataObject) -> None:
    n = len(comps)
    rewards = data.draw(st.lists(finite, min_size=n, max_size=n))
    names = data.draw(st.lists(st.text(min_size=1, max_size=10), max_size=3, unique=True))
    g = types.RolloutGroup(prompt=types.Prompt(index=version, text=text, answer=text[::-1]),
                           prompt_token_ids=data.draw(st.lists(st.integers(0, 2**32 - 1), max_size=10)),
                           completions=comps, policy_version=version, step=version // 3, generator=n,
                           rewards=rewards, scores={k: list(rewards) for k in names})
    assert wire.decode(wire.encode(wire.Scored(group=g))) == wire.Scored(group=g)


@FUZZ
@hypothesis.given(st.lists(st.lists(completions, min_size=1, max_size=4), min_size=1, max_size=6), st.data())
def test_pack_round_trip_property(groups: list[list[types.Completion]], data: st.DataObject) -> None:
    """Any groups, packed in any byte bound and number of parts, come back equal and in order."""
    names = data.draw(st.lists(st.text(min_size=1, max_size=10), max_size=3, unique=True))
    msgs: list[wire.Message] = []
    for i, comps in enumerate(groups):
        n = len(comps)
        rewards = data.draw(st.lists(finite, min_size=n, max_size=n))
        msgs.append(wire.Scored(group=types.RolloutGroup(
            prompt=types.Prompt(index=i, text=data.draw(st.text(max_size=20)), answer=""),
            prompt_token_ids=data.draw(st.lists(st.integers(0, 2**32 - 1), max_size=5)), completions=comps,
            policy_version=i, step=2 * i, generator=n, rewards=rewards, scores={k: list(rewards) for k in names})))
    frames = wire.pack(msgs, parts=data.draw(st.integers(1, 3)), max_bytes=data.draw(st.integers(64, 4096)))
    assert [m for f in frames for m in _messages(f)] == msgs


def test_all_finite_fast_path_is_exact() -> None:
    """The dot-product shortcut never passes a non-finite value and never refuses huge finite ones."""
    assert wire_group.all_finite(np.zeros(0)) and wire_group.all_finite(np.array([-0.5, 0.0, -7.0]))
    assert wire_group.all_finite(np.array([1e200, -1e300, 1.0]))   # the dot overflows: rechecked, finite
    for bad in (math.nan, math.inf, -math.inf):
        for at in (0, 3, 9):
            x = np.full(10, -1e200)
            x[at] = bad
            assert not wire_group.all_finite(x)
            x[:] = -0.25
            x[at] = bad
            assert not wire_group.all_finite(x)
    big = np.full(wire_group._DOT_MAX + 1, -0.5)   # past the shortcut's size: the exact check alone
    assert wire_group.all_finite(big)
    big[-1] = math.nan
    assert not wire_group.all_finite(big)
