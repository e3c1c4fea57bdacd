"""The wire format of the data plane: typed messages, a versioned schema, strict validation. Never pickle.

Neighbours: ``transport`` moves the bytes this module makes (ZeroMQ or in-process queues) and calls ``decode`` on
every frame it receives; the role loops (``generator/``, ``verifier/``, ``trainer/``) build and consume the message
dataclasses below; ``types`` holds the plain data (Prompt, Completion, RolloutGroup) that WORK, ROLLOUT and SCORED
carry.

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
    BATCH    generator -> verifier,   many ROLLOUT or SCORED groups column-wise in one frame (``pack``,
             verifier -> trainer      ``wire_batch``): what a sender has ready at once; the transport unpacks it
                                      (never delivered as such)

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
import struct
from collections.abc import Sequence
from typing import Any, Callable, Union

import msgpack

from kubeforge.runtime import types, wire_batch, wire_budget, wire_group

MAGIC = b"KFW\x01"
# 2: SYNC carries the weight-sync group epoch; 3: packed arrays with dtype/shape, columnar groups;
# 4: ROLLOUT/SCORED in wire_group's fixed binary layout; 5: BATCH column-wise (wire_batch)
SCHEMA_VERSION = 5
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
        return _batch_frame(msg.messages)
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

# A BATCH frame holds many groups column-wise (``wire_batch``: one header, one set of columns, checked per batch).
MAX_BATCH_GROUPS = 4096
MAX_BATCH_COMPLETIONS = 1 << 16   # bounds the Python objects decoding one batch makes per completion
BATCH_HEAD = wire_batch.HEAD
BATCH_BYTES = 1 << 20          # pack's bound on a batch frame: a group larger than that alone goes as a plain frame


_BATCH_ITEMS: dict[int, type] = {int(Kind.ROLLOUT): Rollout, int(Kind.SCORED): Scored}
_NEEDS_REWARDS = frozenset({int(Kind.SCORED)})


def pack(msgs: Sequence[Message], *, parts: int = 1, max_bytes: int = BATCH_BYTES, check: bool = True) -> list[bytes]:
    """The frames that carry ``msgs`` in order: consecutive groups of one kind share BATCH frames of at most
    ``max_bytes`` (cut where the verifier names or the presence of rewards change), spread over up to ``parts``
    frames (one per peer, for round robin); a group alone in its frame (one that fills ``max_bytes`` on its own, the
    last of a run) or any other kind goes as its own plain frame. Nothing waits: it packs what it is given."""
    per = max(1, -(-len(msgs) // max(1, parts)))
    out: list[bytes] = []
    i = 0
    while i < len(msgs):
        cls = type(msgs[i])
        if cls is not Rollout and cls is not Scored:
            out.append(encode(msgs[i], check=check))
            i += 1
            continue
        j = i + 1
        while j < len(msgs) and type(msgs[j]) is cls:
            j += 1
        out.extend(_pack_run(msgs[i:j], cls, per, max_bytes, check))   # type: ignore[arg-type]
        i = j
    return out


def _gather(run: Sequence[Rollout | Scored], cls: type, check: bool) -> wire_batch.Run:
    try:
        return wire_batch.Run([m.group for m in run], scored=cls is Scored, limits=_GROUP_LIMITS)
    except (TypeError, ValueError, OverflowError) as e:
        raise _culprit(run, check, e) from None


def _culprit(run: Sequence[Rollout | Scored], check: bool, e: Exception) -> WireError:
    """The error of the first group that cannot go alone either (its own precise message), else the batch's."""
    for i, m in enumerate(run):
        try:
            encode(m, check=check)
        except WireError as err:
            return WireError(REASON_MALFORMED, f"BATCH[{i}]: {err.detail}")
    return WireError(REASON_MALFORMED, f"BATCH: {e}")


def _pack_run(run: Sequence[Rollout | Scored], cls: type, per: int, max_bytes: int, check: bool) -> list[bytes]:
    if len(run) == 1:
        return [encode(run[0], check=check)]
    cols = _gather(run, cls, check)
    kind = int(KIND_OF[cls])
    out: list[bytes] = []

    def flush(a: int, b: int) -> None:
        if b - a == 1:
            out.append(encode(run[a], check=check))
        elif b > a:
            try:
                out.append(cols.frame(MAGIC, SCHEMA_VERSION, int(Kind.BATCH), kind, a, b, max_frame=MAX_FRAME_BYTES,
                                      check=check))
            except (TypeError, ValueError, OverflowError) as e:
                raise _culprit(run[a:b], check, e) from None

    k = len(run)
    if (cols.uniform and cols.total <= max_bytes and k <= per and k <= MAX_BATCH_GROUPS
            and cols.comp_ends[-1] <= MAX_BATCH_COMPLETIONS):   # the common case: the whole run in one frame
        flush(0, k)
        return out
    a, size, comps = 0, 0, 0
    for i, (nbytes, key, n) in enumerate(zip(cols.group_bytes(), cols.keys, cols.ns)):
        if i > a and (i - a >= per or key != cols.keys[a] or size + nbytes > max_bytes or i - a >= MAX_BATCH_GROUPS
                      or comps + n > MAX_BATCH_COMPLETIONS):
            flush(a, i)
            a, size, comps = i, 0, 0
        if i == a:
            size = BATCH_HEAD.size + sum(4 + 4 * len(name) for name in key[1])   # the names: at most 4 B a character
        size += nbytes
        comps += n
    flush(a, k)
    return out


def _batch_frame(msgs: Sequence[Message]) -> bytes:
    k = len(msgs)
    if not 0 < k <= MAX_BATCH_GROUPS:
        raise WireError(REASON_MALFORMED, f"BATCH: {k} items, expected 1 to {MAX_BATCH_GROUPS}")
    cls = type(msgs[0])
    if cls not in (Rollout, Scored) or any(type(m) is not cls for m in msgs):
        raise WireError(REASON_MALFORMED, "BATCH: items must all be ROLLOUT or all SCORED messages")
    run: Sequence[Rollout | Scored] = msgs   # type: ignore[assignment]
    cols = _gather(run, cls, True)
    if len(set(cols.keys)) != 1:
        raise WireError(REASON_MALFORMED, "BATCH: every group needs the same verifier names, and rewards or none")
    if sum(cols.ns) > MAX_BATCH_COMPLETIONS:
        raise WireError(REASON_MALFORMED, f"BATCH: {sum(cols.ns)} completions exceed {MAX_BATCH_COMPLETIONS}")
    try:
        return cols.frame(MAGIC, SCHEMA_VERSION, int(Kind.BATCH), int(KIND_OF[cls]), 0, k, max_frame=MAX_FRAME_BYTES)
    except (TypeError, ValueError, OverflowError) as e:
        raise _culprit(run, True, e) from None


def _group_in(view: memoryview, kind: Kind) -> Rollout | Scored:
    scored = kind is Kind.SCORED
    try:
        g = wire_group.decode(view, scored=scored, limits=_GROUP_LIMITS)
    except wire_group.Invalid as e:
        raise WireError(REASON_MALFORMED, f"{kind.name}: {e}") from None
    return Scored(group=g) if scored else Rollout(group=g)


def _batch_in(view: memoryview) -> Batch:
    try:
        msgs = wire_batch.decode(view, limits=_GROUP_LIMITS, max_groups=MAX_BATCH_GROUPS,
                                 max_completions=MAX_BATCH_COMPLETIONS, kinds=_BATCH_ITEMS,
                                 needs_rewards=_NEEDS_REWARDS)
    except wire_group.Invalid as e:
        raise WireError(REASON_MALFORMED, f"BATCH: {e}") from None
    return Batch(messages=tuple(msgs))
