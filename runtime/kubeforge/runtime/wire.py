"""The wire format of the data plane: typed messages, a versioned schema, strict validation. Never pickle.

Neighbours: ``transport`` moves the bytes this module makes (ZeroMQ or in-process queues) and calls ``decode`` on
every frame it receives; the role loops (``roles/``) build and consume the message dataclasses below; ``types``
holds the plain data (Prompt, Completion, RolloutGroup) that WORK, ROLLOUT and SCORED carry.

Frame layout (little-endian)::

    +-------+---------+------+-----------------------------+
    | magic | version | kind | payload                     |
    | 4 B   | u16     | u8   | <= MAX_FRAME_BYTES in total  |
    +-------+---------+------+-----------------------------+

The payload of ROLLOUT and SCORED (the hot path: one frame per rollout group) is the fixed binary layout of
``wire_group`` (a header of counts, then the columns: no msgpack, no per-completion or per-token objects either
way); every other kind's payload is one msgpack map.

Message kinds and directions:

    HELLO    any sender -> receiver   first frame on every connection (transport handshake; never delivered)
    READY    role -> upstream         "I am up and listening" (role, index, policy version)
    ACK      role -> upstream         acknowledges a kind/version (e.g. a SYNC once weights are loaded)
    STOP     anyone -> peer           orderly shutdown, with a reason
    WORK     trainer 0 -> generator   step, expected policy version, prompts [index, text, answer]
    ROLLOUT  generator -> verifier    one RolloutGroup (rewards unset)
    SCORED   verifier -> trainer      one RolloutGroup with rewards and per-verifier scores
    SYNC     trainer 0 -> generator   new policy version and where to join the weight broadcast
    BATCH    generator -> verifier,   several whole ROLLOUT or SCORED frames in one frame (``pack``): what a
             verifier -> trainer      sender has ready at once; the transport unpacks it (never delivered as such)

Invariants:
- ``decode`` returns a fully validated message or raises ``WireError``; it never raises anything else, whatever
  the bytes (fuzzed in tests/runtime/test_wire.py). ``WireError.reason`` is one of ``REASONS``: ``foreign``
  (not our magic), ``version`` (our magic, another schema version) or ``malformed`` (everything else).
- Every field is type-checked exactly (a bool is not an int, an int is not a float), every integer and length is
  bounded, every float is finite, ``len(logprobs) == len(token_ids)`` per completion, rewards and each verifier's
  scores have one entry per completion. Unknown or missing keys are errors naming the field path.
- Rollout groups (``wire_group``): token ids, logprobs, rewards and scores are typed columns (u32/f64), the
  decoded arrays are read-only views of the frame (no copy), the completions a ``types.CompletionColumns``; the
  frame's length must be exactly what its header's counts say, and every count, length, float and string is checked
  before anything is made.
- A change to any payload layout bumps ``SCHEMA_VERSION``; peers on another version are refused, never guessed.
- Decoding memory is bounded by the frame: group frames are views plus their strings; for msgpack payloads
  ``wire_budget.check`` prices a large payload's items from their headers
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

from kubeforge.runtime import types, wire_budget, wire_group

MAGIC = b"KFW\x01"
# 2: SYNC carries the weight-sync group epoch; 3: packed arrays with dtype/shape, columnar groups;
# 4: ROLLOUT/SCORED in wire_group's fixed binary layout
SCHEMA_VERSION = 4
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

_GROUP_LIMITS = wire_group.Limits(completions=MAX_COMPLETIONS, tokens=MAX_TOKENS, verifiers=MAX_VERIFIERS,
                                   text_chars=MAX_TEXT_CHARS, name_chars=MAX_NAME_CHARS, frame_bytes=MAX_FRAME_BYTES)


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
    BATCH = 20


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


@dataclasses.dataclass(frozen=True, kw_only=True)
class Batch:
    """Several groups in one frame (a transport detail: receivers unpack it and deliver the messages one by one)."""

    messages: tuple[Rollout | Scored, ...]


Message = Union[Hello, Ready, Ack, Stop, Work, Rollout, Scored, Sync, Batch]

_KINDS: dict[int, Kind] = {int(k): k for k in Kind}

KIND_OF: dict[type, Kind] = {
    Hello: Kind.HELLO, Ready: Kind.READY, Ack: Kind.ACK, Stop: Kind.STOP,
    Work: Kind.WORK, Rollout: Kind.ROLLOUT, Scored: Kind.SCORED, Sync: Kind.SYNC, Batch: Kind.BATCH,
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
    if isinstance(msg, Batch):
        return _batch_frame([encode(m, check=check) for m in msg.messages])
    if kind is Kind.ROLLOUT or kind is Kind.SCORED:
        try:
            return wire_group.encode(MAGIC, SCHEMA_VERSION, int(kind), msg.group,  # type: ignore[union-attr]
                                     scored=kind is Kind.SCORED, limits=_GROUP_LIMITS, check=check)
        except (TypeError, ValueError, OverflowError) as e:   # wire_group.Invalid is a ValueError
            raise WireError(REASON_MALFORMED, f"{kind.name}: {e}") from None
    try:
        payload = _ENCODERS[kind](msg)
    except (TypeError, ValueError, OverflowError) as e:
        raise WireError(REASON_MALFORMED, f"{kind.name}: cannot encode ({e})") from None
    if check:
        _DECODERS[kind](_Reader(payload, kind.name))
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


def _prompt_out(p: types.Prompt) -> dict[str, Any]:
    return {"index": p.index, "text": p.text, "answer": p.answer}


def _fields_out(msg: Any) -> dict[str, Any]:
    return {f.name: getattr(msg, f.name) for f in dataclasses.fields(msg)}


_ENCODERS: dict[Kind, Callable[[Any], dict[str, Any]]] = {
    Kind.HELLO: _fields_out,
    Kind.READY: _fields_out,
    Kind.ACK: lambda m: {**_fields_out(m), "of": int(m.of)},
    Kind.STOP: _fields_out,
    Kind.WORK: lambda m: {"step": m.step, "policy_version": m.policy_version,
                          "prompts": [_prompt_out(p) for p in m.prompts]},
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
    kind = _KINDS.get(kind_num)
    if kind is None:
        raise WireError(REASON_MALFORMED, f"unknown kind {kind_num}")
    if kind is Kind.ROLLOUT or kind is Kind.SCORED:
        return _group_in(view, kind)
    if kind is Kind.BATCH:
        return _batch_in(view)
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

    def __init__(self, obj: Any, path: str) -> None:
        if type(obj) is not dict:
            raise WireError(REASON_MALFORMED, f"{path}: expected a map, got {type(obj).__name__}")
        self.obj: dict[str, Any] = obj
        self.path = path
        self.seen: set[str] = set()

    def child(self, obj: Any, path: str) -> _Reader:
        return _Reader(obj, path)

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

def _prompt_in(r: _Reader) -> types.Prompt:
    p = types.Prompt(index=r.integer("index"), text=r.text("text"), answer=r.text("answer"))
    r.done()
    return p


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
    Kind.SYNC: _sync_in,
}


# ---------------------------------------------------------------- batches of groups

# A BATCH frame carries whole ROLLOUT/SCORED frames (each with its own header) back to back::
#
#     0   frame header (HEADER: magic, schema version, kind BATCH)                  7 B
#     7   reserved, 0                                                              u8
#     8   items k (1..MAX_BATCH_GROUPS), reserved 0                                2 x u32
#     16  item sizes   u32[k]   bytes of each item frame, before its padding
#         zero padding to a multiple of 8
#         item frames  k x (a whole ROLLOUT or SCORED frame, zero-padded to a multiple of 8: its f64 columns stay
#                      8-byte aligned)
#
# The frame is exactly as long as the sizes say, every padding byte is 0, each item is decoded and checked like a
# frame of its own (same schema version, a group kind only: no nesting), and one bad item refuses the whole batch
# (one drop, counted once). Decoded groups are views of the batch frame, like a lone group's of its frame.
BATCH_HEAD = struct.Struct("<4sHBBII")
MAX_BATCH_GROUPS = 4096
BATCH_BYTES = 1 << 20          # pack's bound on a batch frame
BATCH_ALONE_BYTES = 16 << 10   # a group frame this large or larger goes alone: its per-frame cost is small beside its bytes
_GROUP_KINDS = (int(Kind.ROLLOUT), int(Kind.SCORED))
_ZEROS = bytes(8)


def pack(msgs: list[Message], *, parts: int = 1, max_bytes: int = BATCH_BYTES, check: bool = True) -> list[bytes]:
    """The frames that carry ``msgs`` in order: consecutive small groups share BATCH frames of at most
    ``max_bytes``, spread over up to ``parts`` frames (one per peer, for round robin); a message alone in its
    frame, a large group, or any other kind goes as its own plain frame. Nothing waits: it packs what it is given."""
    frames = [encode(m, check=check) for m in msgs]
    per = max(1, -(-len(frames) // max(1, parts)))
    out: list[bytes] = []
    cur: list[bytes] = []
    size = BATCH_HEAD.size + 8

    def flush() -> None:
        if len(cur) == 1:
            out.append(cur[0])
        elif cur:
            out.append(_batch_frame(cur))
        cur.clear()

    for f in frames:
        if len(f) >= BATCH_ALONE_BYTES or f[6] not in _GROUP_KINDS:
            flush()
            out.append(f)
            continue
        cost = len(f) + 4 + 7
        if cur and (len(cur) >= per or size + cost > max_bytes or len(cur) >= MAX_BATCH_GROUPS):
            flush()
            size = BATCH_HEAD.size + 8
        cur.append(f)
        size += cost
    flush()
    return out


def _batch_frame(frames: list[bytes]) -> bytes:
    k = len(frames)
    if not 0 < k <= MAX_BATCH_GROUPS:
        raise WireError(REASON_MALFORMED, f"BATCH: {k} items, expected 1 to {MAX_BATCH_GROUPS}")
    sizes = list(map(len, frames))
    head = BATCH_HEAD.pack(MAGIC, SCHEMA_VERSION, int(Kind.BATCH), 0, k, 0) + struct.pack(f"<{k}I", *sizes)
    parts = [head, _ZEROS[:-len(head) % 8]]
    for i, f in enumerate(frames):
        if f[6] not in _GROUP_KINDS:
            raise WireError(REASON_MALFORMED, f"BATCH[{i}]: only ROLLOUT and SCORED frames can be batched")
        parts.append(f)
        parts.append(_ZEROS[:-len(f) % 8])
    frame = b"".join(parts)
    if len(frame) > MAX_FRAME_BYTES:
        raise WireError(REASON_MALFORMED, f"BATCH: frame of {len(frame)} bytes exceeds {MAX_FRAME_BYTES}")
    return frame


def _group_in(view: memoryview, kind: Kind) -> Rollout | Scored:
    scored = kind is Kind.SCORED
    try:
        g = wire_group.decode(view, scored=scored, limits=_GROUP_LIMITS)
    except wire_group.Invalid as e:
        raise WireError(REASON_MALFORMED, f"{kind.name}: {e}") from None
    return Scored(group=g) if scored else Rollout(group=g)


def _batch_in(view: memoryview) -> Batch:
    size = len(view)
    if size < BATCH_HEAD.size:
        raise WireError(REASON_MALFORMED, f"BATCH: {size} bytes, shorter than its {BATCH_HEAD.size}-byte header")
    _, _, _, reserved, k, reserved2 = BATCH_HEAD.unpack_from(view)
    if reserved or reserved2:
        raise WireError(REASON_MALFORMED, "BATCH: reserved header fields must be 0")
    if not 0 < k <= MAX_BATCH_GROUPS:
        raise WireError(REASON_MALFORMED, f"BATCH: {k} items, expected 1 to {MAX_BATCH_GROUPS}")
    at = BATCH_HEAD.size + 4 * k
    pad = -at % 8
    if at + pad > size:
        raise WireError(REASON_MALFORMED, f"BATCH: {size} bytes, its header says at least {at + pad}")
    sizes = struct.unpack_from(f"<{k}I", view, BATCH_HEAD.size)
    want = at + pad + sum(s + (-s % 8) for s in sizes)
    if want != size:
        raise WireError(REASON_MALFORMED, f"BATCH: frame of {size} bytes, its item sizes say {want}")
    if view[at:at + pad] != _ZEROS[:pad]:
        raise WireError(REASON_MALFORMED, "BATCH: padding must be 0")
    at += pad
    msgs: list[Rollout | Scored] = []
    for i, s in enumerate(sizes):
        item = view[at:at + s]
        at += s
        pad = -s % 8
        if view[at:at + pad] != _ZEROS[:pad]:
            raise WireError(REASON_MALFORMED, f"BATCH[{i}]: padding must be 0")
        at += pad
        if s < HEADER.size:
            raise WireError(REASON_MALFORMED, f"BATCH[{i}]: {s} bytes, no frame header")
        magic, version, kind_num = HEADER.unpack_from(item)
        if magic != MAGIC or version != SCHEMA_VERSION or kind_num not in _GROUP_KINDS:
            raise WireError(REASON_MALFORMED, f"BATCH[{i}]: not a ROLLOUT or SCORED frame of schema "
                            f"{SCHEMA_VERSION} (magic {bytes(magic)!r}, version {version}, kind {kind_num})")
        try:
            msgs.append(_group_in(item, _KINDS[kind_num]))
        except WireError as e:
            raise WireError(REASON_MALFORMED, f"BATCH[{i}]: {e.detail}") from None
    return Batch(messages=tuple(msgs))
