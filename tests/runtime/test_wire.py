"""wire: round trips of every message kind, field-level refusals, and fuzzing (random, truncated, bit-flipped and
type-mutated frames must only ever raise WireError)."""
from __future__ import annotations

import math
import struct
from typing import Any, Callable

import hypothesis
import msgpack
import numpy as np
import pytest
from hypothesis import strategies as st

from kubeforge.runtime import types, wire

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
    "sync": lambda: wire.Sync(version=9, step=9, host="tiny-trainer-0.tiny-trainer", port=29504, world_size=3,
                              backend="nccl", timeout_s=60),
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


def packed(dtype: str, values: list[Any], shape: list[int] | None = None) -> dict[str, Any]:
    data = np.asarray(values, dtype=dtype).tobytes()
    return {"dtype": dtype, "shape": [len(values)] if shape is None else shape, "data": data}


@pytest.mark.parametrize("path,value,needle", [
    ("group.completions.logprobs", packed("<f8", [-1.0, -2.0]), "2 logprobs for 3 token_ids"),
    ("group.completions.logprobs", packed("<f8", [-1.0, math.nan, -2.0]), "non-finite"),
    ("group.completions.logprobs", packed("<f4", [-1.0, -1.0, -2.0]), "dtype '<f4'"),
    ("group.completions.token_ids", [5], "packed array map"),
    ("group.completions.token_ids", {"dtype": "<u4", "shape": [1], "data": b"\x00\x01\x02"}, "bytes of data"),
    ("group.completions.token_ids", packed("<u4", [1], shape=[2**40]), "shape"),
    ("group.completions.token_ids", packed("<u4", [1, 2]), "2 token_ids for lengths summing to 3"),
    ("group.completions.token_ids", {**packed("<u4", [1, 2, 3]), "extra": 1}, "exactly the keys"),
    ("group.completions.token_ids", {"dtype": "<u4", "shape": [3], "data": [1, 2, 3]}, "packed bytes"),
    ("group.completions.lengths", packed("<u4", []), "at least one completion"),
    ("group.completions.lengths", packed("<u4", [wire.MAX_TOKENS + 1, 0]), "exceeds"),
    ("group.completions.lengths", packed("<u4", [1, 1, 1]), "2 items for 3 completions"),
    ("group.completions.text", ["a"], "1 items for 2 completions"),
    ("group.completions.finish_reason", ["stop", 3], "item 1 is not a string"),
    ("group.prompt_token_ids", packed("<i8", [1]), "dtype"),
    ("group.rewards", [1.0, 0.0], "packed array map"),
    ("group.rewards", packed("<f8", [1.0]), "1 values for 2"),
    ("group.rewards", packed("<f8", [1.0, math.inf]), "non-finite"),
    ("group.rewards", None, "needs rewards"),
    ("group.scores", {"answer": packed("<f8", [1.0])}, "1 values for 2"),
    ("group.policy_version", True, "integer"),
    ("group.policy_version", -1, "out of range"),
    ("group.step", 2**63, "out of range"),
    ("group.prompt.text", b"bytes", "string"),
    ("group.prompt.index", _DELETE, "missing"),
    ("group.prompt.extra", 1, "unknown field"),
    ("group.completions", [], "expected a map"),
    ("group", [1, 2], "expected a map"),
])
def test_scored_field_refusals(path: str, value: Any, needle: str) -> None:
    expect(mutated(SCORED(), _set(path, value)), wire.REASON_MALFORMED, needle)


def test_other_refusals() -> None:
    expect(mutated(MESSAGES["sync"](), _set("backend", "mpi")), wire.REASON_MALFORMED, "backend")
    expect(mutated(MESSAGES["sync"](), _set("port", 70000)), wire.REASON_MALFORMED, "port")
    expect(mutated(MESSAGES["ack"](), _set("of", 200)), wire.REASON_MALFORMED, "unknown kind")
    expect(mutated(MESSAGES["ack"](), _set("ok", 1)), wire.REASON_MALFORMED, "bool")
    expect(mutated(MESSAGES["work"](), _set("prompts", [{"index": 1}])), wire.REASON_MALFORMED, "prompts[0].text")
    expect(mutated(MESSAGES["rollout"](), _set("group.completions.token_ids.shape", [3, 1])), wire.REASON_MALFORMED,
           "shape")
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


@FUZZ
@hypothesis.given(st.sampled_from(sorted(MESSAGES)), st.data(), msgpack_values)
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
