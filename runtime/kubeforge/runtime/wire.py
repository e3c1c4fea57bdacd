"""The wire format of the data plane: typed messages, a versioned msgpack schema, strict validation. Never pickle.

Neighbours: ``transport`` moves the bytes this module makes (ZeroMQ or in-process queues) and calls ``decode`` on
every frame it receives; the role loops (``roles/``) build and consume the message dataclasses below; ``types``
holds the plain data (Prompt, Completion, RolloutGroup) that WORK, ROLLOUT and SCORED carry.

Frame layout (little-endian)::

    +-------+---------+------+-----------------------------+
    | magic | version | kind | payload (one msgpack map)   |
    | 4 B   | u16     | u8   | <= MAX_FRAME_BYTES in total  |
    +-------+---------+------+-----------------------------+

Message kinds and directions:

    HELLO    any sender -> receiver   first frame on every connection (transport handshake; never delivered)
    READY    role -> upstream         "I am up and listening" (role, index, policy version)
    ACK      role -> upstream         acknowledges a kind/version (e.g. a SYNC once weights are loaded)
    STOP     anyone -> peer           orderly shutdown, with a reason
    WORK     trainer 0 -> generator   step, expected policy version, prompts [index, text, answer]
    ROLLOUT  generator -> verifier    one RolloutGroup (rewards unset)
    SCORED   verifier -> trainer      one RolloutGroup with rewards and per-verifier scores
    SYNC     trainer 0 -> generator   new policy version and where to join the weight broadcast

Invariants:
- ``decode`` returns a fully validated message or raises ``WireError``; it never raises anything else, whatever
  the bytes (fuzzed in tests/runtime/test_wire.py). ``WireError.reason`` is one of ``REASONS``: ``foreign``
  (not our magic), ``version`` (our magic, another schema version) or ``malformed`` (everything else).
- Every field is type-checked exactly (a bool is not an int, an int is not a float), every integer and length is
  bounded, every float is finite, ``len(logprobs) == len(token_ids)`` per completion, rewards and each verifier's
  scores have one entry per completion. Unknown or missing keys are errors naming the field path.
- Packed arrays: token ids, logprobs, rewards and scores travel as ``{"dtype", "shape", "data"}`` maps (numpy dtype
  string such as ``"<u4"``/``"<f8"``, a 1-D shape, raw little-endian bytes), never as one msgpack item per token.
  A field accepts exactly one dtype; ``shape`` times the item size must equal ``len(data)`` (checked before any
  array is made, and ``data`` is already bounded by the frame), and the decoded arrays are read-only views of those
  bytes: no per-token objects, no copy. A group's completions travel column-wise (``lengths``, all token ids
  concatenated, all logprobs concatenated, texts, finish reasons), so a group costs a handful of msgpack items
  whatever its size; the decoder hands each ``Completion`` its slice.
- A change to any payload layout bumps ``SCHEMA_VERSION``; peers on another version are refused, never guessed.
- Decoding memory is bounded by the frame: ``wire_budget.check`` prices a large payload's items from their headers
  before ``msgpack`` builds any object (at most ``wire_budget.RATIO`` times the payload, nesting and item count
  capped), so a hostile 64 MiB frame cannot make a receiver allocate gigabytes.
"""
from __future__ import annotations

import dataclasses
import enum
import itertools
import math
import struct
from typing import Any, Callable, Union

import msgpack
import numpy as np

from kubeforge.runtime import types, wire_budget

MAGIC = b"KFW\x01"
SCHEMA_VERSION = 3   # 2: SYNC carries the weight-sync group epoch; 3: packed arrays with dtype/shape, columnar groups
HEADER = struct.Struct("<4sHB")

# Reasons a frame is refused (transport counts drops by these; metrics label them).
REASON_MALFORMED = "malformed"
REASON_FOREIGN = "foreign"
REASON_VERSION = "version"
REASONS = (REASON_MALFORMED, REASON_FOREIGN, REASON_VERSION)
# Detail prefix of a refusal that came from decode's safety net rather than a validator (tests assert it never fires).
UNEXPECTED = "unexpected error while decoding"

# Bounds. Generous for real jobs (the API caps groupSize at 1024 and promptsPerStep at 100000), tight enough that a
# hostile or corrupt frame cannot make a receiver allocate without limit.
MAX_FRAME_BYTES = 64 << 20
MAX_TEXT_CHARS = 1 << 20
MAX_NAME_CHARS = 253
MAX_TOKENS = 1 << 20
MAX_COMPLETIONS = 4096
MAX_PROMPTS = 100_000
MAX_VERIFIERS = 64
MAX_INT = (1 << 63) - 1
MAX_PORT = 65535

_U32 = types.TOKEN_DTYPE      # token ids, completion lengths
_F64 = types.LOGPROB_DTYPE    # logprobs, rewards, scores
_ARRAY_KEYS = frozenset(("dtype", "shape", "data"))


class WireError(ValueError):
    """A frame that is not a valid message of our schema. ``reason`` is one of ``REASONS``."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


class Kind(enum.IntEnum):
    HELLO = 1
    READY = 2
    ACK = 3
    STOP = 4
    WORK = 16
    ROLLOUT = 17
    SCORED = 18
    SYNC = 19


# ---------------------------------------------------------------- messages


@dataclasses.dataclass(frozen=True, kw_only=True)
class Hello:
    """First frame a transport sender puts on each connection; the receiver records it and does not deliver it."""

    role: str
    index: int


@dataclasses.dataclass(frozen=True, kw_only=True)
class Ready:
    """A role process is up and listening (sent by the role loops, e.g. generator -> trainer 0)."""

    role: str
    index: int
    policy_version: int = 0


@dataclasses.dataclass(frozen=True, kw_only=True)
class Ack:
    """Acknowledges message kind ``of`` at ``version`` (e.g. a generator has loaded the weights of SYNC v)."""

    role: str
    index: int
    of: Kind
    version: int
    ok: bool = True
    detail: str = ""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Stop:
    """Orderly shutdown of the peer."""

    reason: str = ""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Work:
    """Prompts to sample for optimizer step ``step``, expected under policy version ``policy_version``."""

    step: int
    policy_version: int
    prompts: tuple[types.Prompt, ...]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Rollout:
    """A sampled group on its way to a verifier (``group.rewards`` is None)."""

    group: types.RolloutGroup


@dataclasses.dataclass(frozen=True, kw_only=True)
class Scored:
    """A scored group on its way to trainer rank ``group.prompt.index % trainers`` (rewards set)."""

    group: types.RolloutGroup


@dataclasses.dataclass(frozen=True, kw_only=True)
class Sync:
    """Policy version ``version`` (after step ``step``) is being broadcast: join the weight-sync group.

    ``host``/``port`` is the torch.distributed store of the weight-sync group (trainer 0, ``contract.PORT_WEIGHTS``);
    ``world_size`` counts trainer 0 plus every generator worker; ``backend`` is ``gloo`` or ``nccl``."""

    version: int
    step: int
    host: str
    port: int
    world_size: int
    backend: str = "gloo"
    timeout_s: int = 120
    epoch: int = 0          # the weight-sync group's epoch: a new one each time the membership re-forms


Message = Union[Hello, Ready, Ack, Stop, Work, Rollout, Scored, Sync]

KIND_OF: dict[type, Kind] = {
    Hello: Kind.HELLO, Ready: Kind.READY, Ack: Kind.ACK, Stop: Kind.STOP,
    Work: Kind.WORK, Rollout: Kind.ROLLOUT, Scored: Kind.SCORED, Sync: Kind.SYNC,
}


def kind_of(msg: Message) -> Kind:
    """The frame kind of a message object."""
    try:
        return KIND_OF[type(msg)]
    except KeyError:
        raise TypeError(f"not a wire message: {type(msg).__name__}") from None


# ---------------------------------------------------------------- encode


def encode(msg: Message, *, check: bool = True) -> bytes:
    """One frame for ``msg``. With ``check`` (default) the payload is validated exactly as ``decode`` would, so a
    sender's bug (a NaN logprob, mismatched lengths) raises ``WireError`` here instead of a drop at the peer."""
    kind = kind_of(msg)
    try:
        payload = _ENCODERS[kind](msg)
    except (TypeError, ValueError, OverflowError) as e:
        raise WireError(REASON_MALFORMED, f"{kind.name}: cannot encode ({e})") from None
    if check:
        _DECODERS[kind](_Reader(payload, kind.name, check=True))
    packer = msgpack.Packer(autoreset=False, use_bin_type=True)
    try:
        packer.pack(payload)
    except (TypeError, ValueError, OverflowError) as e:
        raise WireError(REASON_MALFORMED, f"{kind.name}: cannot encode ({e})") from None
    body = packer.getbuffer()   # no copy: the join below is the only one
    if HEADER.size + len(body) > MAX_FRAME_BYTES:
        raise WireError(REASON_MALFORMED,
                        f"{kind.name}: frame of {HEADER.size + len(body)} bytes exceeds {MAX_FRAME_BYTES}")
    return b"".join((HEADER.pack(MAGIC, SCHEMA_VERSION, int(kind)), body))


def _packed(a: np.ndarray[Any, Any]) -> dict[str, Any]:
    """A packed array's wire form; ``data`` is a view of the array (msgpack copies it once, into the frame)."""
    return {"dtype": a.dtype.str, "shape": list(a.shape), "data": np.ascontiguousarray(a).data.cast("B")}


def _prompt_out(p: types.Prompt) -> dict[str, Any]:
    return {"index": p.index, "text": p.text, "answer": p.answer}


def _completions_out(comps: list[types.Completion]) -> dict[str, Any]:
    """The completions of one group, column-wise."""
    lengths = np.fromiter((len(c.token_ids) for c in comps), dtype=_U32, count=len(comps))
    ids = np.concatenate([types.token_array(c.token_ids) for c in comps]) if comps else np.empty(0, _U32)
    lps = np.concatenate([types.logprob_array(c.logprobs) for c in comps]) if comps else np.empty(0, _F64)
    return {"lengths": _packed(lengths), "token_ids": _packed(ids), "logprobs": _packed(lps),
            "text": [c.text for c in comps], "finish_reason": [c.finish_reason for c in comps]}


def _floats_out(values: Any) -> dict[str, Any]:
    return _packed(np.asarray(values, dtype=_F64).reshape(-1))


def _group_out(g: types.RolloutGroup) -> dict[str, Any]:
    return {
        "prompt": _prompt_out(g.prompt), "prompt_token_ids": _packed(types.token_array(g.prompt_token_ids)),
        "completions": _completions_out(g.completions), "policy_version": g.policy_version,
        "step": g.step, "generator": g.generator,
        "rewards": None if g.rewards is None else _floats_out(g.rewards),
        "scores": {k: _floats_out(v) for k, v in g.scores.items()},
    }


def _fields_out(msg: Any) -> dict[str, Any]:
    return {f.name: getattr(msg, f.name) for f in dataclasses.fields(msg)}


_ENCODERS: dict[Kind, Callable[[Any], dict[str, Any]]] = {
    Kind.HELLO: _fields_out,
    Kind.READY: _fields_out,
    Kind.ACK: lambda m: {**_fields_out(m), "of": int(m.of)},
    Kind.STOP: _fields_out,
    Kind.WORK: lambda m: {"step": m.step, "policy_version": m.policy_version,
                          "prompts": [_prompt_out(p) for p in m.prompts]},
    Kind.ROLLOUT: lambda m: {"group": _group_out(m.group)},
    Kind.SCORED: lambda m: {"group": _group_out(m.group)},
    Kind.SYNC: _fields_out,
}


# ---------------------------------------------------------------- decode


def decode(data: bytes | bytearray | memoryview) -> Message:
    """The validated message in one frame; ``WireError`` (and nothing else) for anything that is not one."""
    try:
        return _decode(data)
    except WireError:
        raise
    except Exception as e:  # defence in depth: a validator bug must still read as a refused frame, not a crash
        raise WireError(REASON_MALFORMED, f"{UNEXPECTED}: {type(e).__name__}: {e}") from None


def _decode(data: bytes | bytearray | memoryview) -> Message:
    view = memoryview(data)
    if len(view) < HEADER.size:
        if bytes(view[:4]) == MAGIC[:len(view[:4])] and len(view) > 0:
            raise WireError(REASON_MALFORMED, f"truncated header ({len(view)} bytes)")
        raise WireError(REASON_FOREIGN, f"frame of {len(view)} bytes has no kubeforge header")
    magic, version, kind_num = HEADER.unpack_from(view)
    if magic != MAGIC:
        raise WireError(REASON_FOREIGN, f"bad magic {magic!r}")
    if version != SCHEMA_VERSION:
        raise WireError(REASON_VERSION, f"schema version {version}, this process speaks {SCHEMA_VERSION}")
    if len(view) > MAX_FRAME_BYTES:
        raise WireError(REASON_MALFORMED, f"frame of {len(view)} bytes exceeds {MAX_FRAME_BYTES}")
    try:
        kind = Kind(kind_num)
    except ValueError:
        raise WireError(REASON_MALFORMED, f"unknown kind {kind_num}") from None
    body = view[HEADER.size:]
    if len(body) > wire_budget.WALK_ABOVE:
        try:  # what unpacking would allocate, from the headers alone: a hostile frame never gets that far
            wire_budget.check(body)
        except wire_budget.Refused as e:
            raise WireError(REASON_MALFORMED, f"{kind.name}: payload refused before decoding: {e}") from None
    try:
        payload = msgpack.unpackb(body, raw=False, strict_map_key=True, use_list=True,
                                  max_array_len=MAX_PROMPTS, max_map_len=256)
    except Exception as e:
        raise WireError(REASON_MALFORMED, f"{kind.name}: bad msgpack payload ({type(e).__name__})") from None
    return _DECODERS[kind](_Reader(payload, kind.name))


class _Reader:
    """Typed, bounded access to one msgpack map; every error names the field path."""

    def __init__(self, obj: Any, path: str, *, check: bool = False) -> None:
        if type(obj) is not dict:
            raise WireError(REASON_MALFORMED, f"{path}: expected a map, got {type(obj).__name__}")
        self.obj: dict[str, Any] = obj
        self.path = path
        self.seen: set[str] = set()
        self.check = check  # encode's check: packed data is a memoryview of the sender's array, not bytes

    def child(self, obj: Any, path: str) -> _Reader:
        return _Reader(obj, path, check=self.check)

    def _get(self, key: str) -> Any:
        if key not in self.obj:
            raise WireError(REASON_MALFORMED, f"{self.path}.{key}: missing")
        self.seen.add(key)
        return self.obj[key]

    def fail(self, key: str, why: str) -> WireError:
        return WireError(REASON_MALFORMED, f"{self.path}.{key}: {why}")

    def done(self) -> None:
        extra = sorted(str(k) for k in self.obj if k not in self.seen)
        if extra:
            raise WireError(REASON_MALFORMED, f"{self.path}: unknown field(s) {', '.join(extra)}")

    def integer(self, key: str, lo: int = 0, hi: int = MAX_INT) -> int:
        v = self._get(key)
        if type(v) is not int:
            raise self.fail(key, f"expected an integer, got {type(v).__name__}")
        if not lo <= v <= hi:
            raise self.fail(key, f"{v} out of range [{lo}, {hi}]")
        return v

    def flag(self, key: str) -> bool:
        v = self._get(key)
        if type(v) is not bool:
            raise self.fail(key, f"expected a bool, got {type(v).__name__}")
        return v

    def text(self, key: str, max_len: int = MAX_TEXT_CHARS) -> str:
        v = self._get(key)
        if type(v) is not str:
            raise self.fail(key, f"expected a string, got {type(v).__name__}")
        if len(v) > max_len:
            raise self.fail(key, f"{len(v)} characters exceed {max_len}")
        return v

    def sub(self, key: str) -> _Reader:
        return self.child(self._get(key), f"{self.path}.{key}")

    def items(self, key: str, max_len: int) -> list[Any]:
        v = self._get(key)
        if type(v) is not list:
            raise self.fail(key, f"expected a list, got {type(v).__name__}")
        if len(v) > max_len:
            raise self.fail(key, f"{len(v)} items exceed {max_len}")
        return v

    def array(self, key: str, dtype: np.dtype[Any], max_len: int) -> np.ndarray[Any, Any]:
        """A packed 1-D array of exactly ``dtype``: a read-only view of the frame's bytes (no per-item objects).
        ``shape`` is checked against ``len(data)`` (already bounded by the frame) before the view is made."""
        v = self._get(key)
        if type(v) is not dict:
            raise self.fail(key, f"expected a packed array map, got {type(v).__name__}")
        if v.keys() != _ARRAY_KEYS:
            raise self.fail(key, f"a packed array has exactly the keys dtype, shape, data; got {sorted(map(str, v))}")
        dt, shape, data = v["dtype"], v["shape"], v["data"]
        if dt != dtype.str:
            raise self.fail(key, f"dtype {dt!r}, expected {dtype.str!r}")
        if type(shape) is not list or len(shape) != 1 or type(shape[0]) is not int or not 0 <= shape[0] <= max_len:
            raise self.fail(key, f"shape {shape!r} is not [n] with 0 <= n <= {max_len}")
        if not (type(data) is bytes or (self.check and type(data) is memoryview)):
            raise self.fail(key, f"expected packed bytes, got {type(data).__name__}")
        if len(data) != shape[0] * dtype.itemsize:
            raise self.fail(key, f"{len(data)} bytes of data for shape {shape} of {dtype.str}")
        return np.frombuffer(data, dtype=dtype)

    def finite(self, key: str, a: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        if not np.isfinite(a).all():
            raise self.fail(key, "contains a non-finite value")
        return a

    def strings(self, key: str, n: int, max_len: int) -> list[str]:
        v = self.items(key, n)
        if len(v) != n:
            raise self.fail(key, f"{len(v)} items for {n} completions")
        for i, x in enumerate(v):
            if type(x) is not str or len(x) > max_len:
                raise self.fail(key, f"item {i} is not a string of at most {max_len} characters")
        return v


def _prompt_in(r: _Reader) -> types.Prompt:
    p = types.Prompt(index=r.integer("index"), text=r.text("text"), answer=r.text("answer"))
    r.done()
    return p


def _completions_in(r: _Reader) -> list[types.Completion]:
    """The group's completions, validated column by column; each gets its slice of the packed arrays."""
    raw_lengths = r.array("lengths", _U32, MAX_COMPLETIONS)
    lengths: list[int] = raw_lengths.tolist()   # at most MAX_COMPLETIONS small ints: cheaper in Python than numpy
    n = len(lengths)
    if not n:
        raise r.fail("lengths", "a group needs at least one completion")
    if max(lengths) > MAX_TOKENS:
        raise r.fail("lengths", f"a completion of {max(lengths)} tokens exceeds {MAX_TOKENS}")
    ends = list(itertools.accumulate(lengths))
    total = ends[-1]
    ids = r.array("token_ids", _U32, total)
    if len(ids) != total:
        raise r.fail("token_ids", f"{len(ids)} token_ids for lengths summing to {total}")
    lps = r.finite("logprobs", r.array("logprobs", _F64, total))
    if len(lps) != total:
        raise r.fail("logprobs", f"{len(lps)} logprobs for {total} token_ids")
    texts = r.strings("text", n, MAX_TEXT_CHARS)
    reasons = r.strings("finish_reason", n, MAX_NAME_CHARS)
    r.done()
    if r.check:   # encode's check: validated; the sender already holds the objects
        return []
    make = types.Completion.of_arrays
    return [make(ids[end - k:end], lps[end - k:end], text, reason)
            for k, end, text, reason in zip(lengths, ends, texts, reasons)]


def _group_in(r: _Reader, *, scored: bool) -> types.RolloutGroup:
    prompt = _prompt_in(r.sub("prompt"))
    comps = _completions_in(r.sub("completions"))
    n = len(comps) if not r.check else len(r.obj["completions"]["text"])
    g = types.RolloutGroup(
        prompt=prompt, prompt_token_ids=r.array("prompt_token_ids", _U32, MAX_TOKENS), completions=comps,
        policy_version=r.integer("policy_version"), step=r.integer("step"), generator=r.integer("generator"),
        rewards=_rewards_in(r, n, scored=scored), scores=_scores_in(r, n))
    r.done()
    return g


def _rewards_in(r: _Reader, n: int, *, scored: bool) -> list[float] | None:
    if r.obj.get("rewards", 0) is None:
        r.seen.add("rewards")
        if scored:
            raise r.fail("rewards", "a scored group needs rewards")
        return None
    return _floats_in(r, "rewards", n)


def _floats_in(r: _Reader, key: str, n: int) -> list[float]:
    out: list[float] = r.array(key, _F64, MAX_COMPLETIONS).tolist()
    if len(out) != n:
        raise r.fail(key, f"{len(out)} values for {n} completions")
    if not all(map(math.isfinite, out)):
        raise r.fail(key, "contains a non-finite value")
    return out


def _scores_in(r: _Reader, n: int) -> dict[str, list[float]]:
    m = r.sub("scores")
    if len(m.obj) > MAX_VERIFIERS:
        raise r.fail("scores", f"{len(m.obj)} verifiers exceed {MAX_VERIFIERS}")
    out: dict[str, list[float]] = {}
    for name in list(m.obj):
        if type(name) is not str or not 0 < len(name) <= MAX_NAME_CHARS:
            raise r.fail("scores", f"bad verifier name {name!r}")
        out[name] = _floats_in(m, name, n)
    return out


def _hello_in(r: _Reader) -> Hello:
    m = Hello(role=r.text("role", MAX_NAME_CHARS), index=r.integer("index"))
    r.done()
    return m


def _ready_in(r: _Reader) -> Ready:
    m = Ready(role=r.text("role", MAX_NAME_CHARS), index=r.integer("index"), policy_version=r.integer("policy_version"))
    r.done()
    return m


def _ack_in(r: _Reader) -> Ack:
    of = r.integer("of", 0, 255)
    if of not in Kind._value2member_map_:
        raise r.fail("of", f"unknown kind {of}")
    m = Ack(role=r.text("role", MAX_NAME_CHARS), index=r.integer("index"), of=Kind(of), version=r.integer("version"),
            ok=r.flag("ok"), detail=r.text("detail"))
    r.done()
    return m


def _stop_in(r: _Reader) -> Stop:
    m = Stop(reason=r.text("reason"))
    r.done()
    return m


def _work_in(r: _Reader) -> Work:
    raw = r.items("prompts", MAX_PROMPTS)
    prompts = tuple(_prompt_in(r.child(p, f"{r.path}.prompts[{i}]")) for i, p in enumerate(raw))
    m = Work(step=r.integer("step"), policy_version=r.integer("policy_version"), prompts=prompts)
    r.done()
    return m


def _group_msg_in(r: _Reader, *, scored: bool) -> Rollout | Scored:
    g = _group_in(r.sub("group"), scored=scored)
    r.done()
    return Scored(group=g) if scored else Rollout(group=g)


def _sync_in(r: _Reader) -> Sync:
    backend = r.text("backend", 16)
    if backend not in ("gloo", "nccl"):
        raise r.fail("backend", f"{backend!r} is not gloo or nccl")
    m = Sync(version=r.integer("version"), step=r.integer("step"), host=r.text("host", MAX_NAME_CHARS),
             port=r.integer("port", 1, MAX_PORT), world_size=r.integer("world_size", 1, 1 << 20), backend=backend,
             timeout_s=r.integer("timeout_s", 1, 86400), epoch=r.integer("epoch"))
    r.done()
    return m


_DECODERS: dict[Kind, Callable[[_Reader], Message]] = {
    Kind.HELLO: _hello_in,
    Kind.READY: _ready_in,
    Kind.ACK: _ack_in,
    Kind.STOP: _stop_in,
    Kind.WORK: _work_in,
    Kind.ROLLOUT: lambda r: _group_msg_in(r, scored=False),
    Kind.SCORED: lambda r: _group_msg_in(r, scored=True),
    Kind.SYNC: _sync_in,
}
