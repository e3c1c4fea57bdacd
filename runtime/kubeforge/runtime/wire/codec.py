"""Messages to frames and back: ``encode``, ``decode`` and ``pack``, strict both ways. Never pickle.

Neighbours: ``transport`` moves the bytes these make (ZeroMQ or in-process queues) and calls :func:`decode` on every
frame it receives; the role loops send ``messages`` through it. The payload of ROLLOUT and SCORED (the hot path: one
frame per rollout group) is ``group``'s fixed binary layout, many of them in one BATCH ``batch``'s column-wise one
(both through ``rollouts``: no msgpack, no per-completion or per-token objects either way); every other kind's
payload is one msgpack map (``payload``).

Invariants:
- ``decode`` returns a fully validated message or raises ``WireError``; it never raises anything else, whatever
  the bytes (fuzzed in tests/runtime/test_wire.py). ``WireError.reason`` is one of ``REASONS``: ``foreign``
  (not our magic), ``version`` (our magic, another schema version) or ``malformed`` (everything else).
- Every field is type-checked exactly (a bool is not an int, an int is not a float), every integer and length is
  bounded, every float is finite, ``len(logprobs) == len(token_ids)`` per completion, rewards and each verifier's
  scores have one entry per completion. Unknown or missing keys are errors naming the field path.
- Rollout groups (``group``): token ids, logprobs, rewards and scores are typed columns (u32/f64), the
  decoded arrays are read-only views of the frame (no copy), the completions a ``types.CompletionColumns``; the
  frame's length must be exactly what its header's counts say, and every count, length, float and string is checked
  before anything is made.
- Decoding memory is bounded by the frame: group frames are views plus their strings; for msgpack payloads
  ``budget.check`` prices a large payload's items from their headers before ``msgpack`` builds any object (at most
  ``budget.RATIO`` times the payload, nesting and item count capped), so a hostile 64 MiB frame cannot make a
  receiver allocate gigabytes.
"""
from __future__ import annotations

from collections.abc import Sequence

import msgpack

from kubeforge.runtime.wire import budget, frame, messages, payload, rollouts

_KINDS: dict[int, messages.Kind] = {int(k): k for k in messages.Kind}


def encode(msg: messages.Message, *, check: bool = True) -> bytes:
    """One frame for ``msg``. With ``check`` (default) the payload is validated exactly as ``decode`` would, so a
    sender's bug (a NaN logprob, mismatched lengths) raises ``WireError`` here instead of a drop at the peer."""
    kind = messages.kind_of(msg)
    if isinstance(msg, messages.Batch):
        return rollouts.batch_frame(msg.messages)
    if isinstance(msg, (messages.Rollout, messages.Scored)):
        return rollouts.encode_group(msg, check=check)
    try:
        body_map = payload.ENCODERS[kind](msg)
    except (TypeError, ValueError, OverflowError) as e:
        raise frame.WireError(frame.REASON_MALFORMED, f"{kind.name}: cannot encode ({e})") from None
    if check:
        payload.DECODERS[kind](payload.Reader(body_map, kind.name))
    packer = msgpack.Packer(autoreset=False, use_bin_type=True)
    try:
        packer.pack(body_map)
    except (TypeError, ValueError, OverflowError) as e:
        raise frame.WireError(frame.REASON_MALFORMED, f"{kind.name}: cannot encode ({e})") from None
    body = packer.getbuffer()   # no copy: the join below is the only one
    if frame.HEADER.size + len(body) > frame.MAX_FRAME_BYTES:
        raise frame.WireError(frame.REASON_MALFORMED,
                              f"{kind.name}: frame of {frame.HEADER.size + len(body)} bytes exceeds "
                              f"{frame.MAX_FRAME_BYTES}")
    return b"".join((frame.HEADER.pack(frame.MAGIC, frame.SCHEMA_VERSION, int(kind)), body))


def decode(data: bytes | bytearray | memoryview) -> messages.Message:
    """The validated message in one frame; ``WireError`` (and nothing else) for anything that is not one."""
    try:
        return _decode(data)
    except frame.WireError:
        raise
    except Exception as e:  # defence in depth: a validator bug must still read as a refused frame, not a crash
        raise frame.WireError(frame.REASON_MALFORMED, f"{frame.UNEXPECTED}: {type(e).__name__}: {e}") from None


def _decode(data: bytes | bytearray | memoryview) -> messages.Message:
    view = memoryview(data)
    if len(view) < frame.HEADER.size:
        if bytes(view[:4]) == frame.MAGIC[:len(view[:4])] and len(view) > 0:
            raise frame.WireError(frame.REASON_MALFORMED, f"truncated header ({len(view)} bytes)")
        raise frame.WireError(frame.REASON_FOREIGN, f"frame of {len(view)} bytes has no kubeforge header")
    magic, version, kind_num = frame.HEADER.unpack_from(view)
    if magic != frame.MAGIC:
        raise frame.WireError(frame.REASON_FOREIGN, f"bad magic {magic!r}")
    if version != frame.SCHEMA_VERSION:
        raise frame.WireError(frame.REASON_VERSION,
                              f"schema version {version}, this process speaks {frame.SCHEMA_VERSION}")
    if len(view) > frame.MAX_FRAME_BYTES:
        raise frame.WireError(frame.REASON_MALFORMED, f"frame of {len(view)} bytes exceeds {frame.MAX_FRAME_BYTES}")
    kind = _KINDS.get(kind_num)
    if kind is None:
        raise frame.WireError(frame.REASON_MALFORMED, f"unknown kind {kind_num}")
    if kind is messages.Kind.ROLLOUT or kind is messages.Kind.SCORED:
        return rollouts.group_in(view, kind)
    if kind is messages.Kind.BATCH:
        return rollouts.batch_in(view)
    body = view[frame.HEADER.size:]
    if len(body) > budget.WALK_ABOVE:
        try:  # what unpacking would allocate, from the headers alone: a hostile frame never gets that far
            budget.check(body)
        except budget.Refused as e:
            raise frame.WireError(frame.REASON_MALFORMED,
                                  f"{kind.name}: payload refused before decoding: {e}") from None
    try:
        body_map = msgpack.unpackb(body, raw=False, strict_map_key=True, use_list=True,
                                   max_array_len=frame.MAX_PROMPTS, max_map_len=256)
    except Exception as e:
        raise frame.WireError(frame.REASON_MALFORMED,
                              f"{kind.name}: bad msgpack payload ({type(e).__name__})") from None
    return payload.DECODERS[kind](payload.Reader(body_map, kind.name))


def pack(msgs: Sequence[messages.Message], *, parts: int = 1, max_bytes: int = rollouts.BATCH_BYTES,
         check: bool = True) -> list[bytes]:
    """The frames that carry ``msgs`` in order: consecutive groups of one kind share BATCH frames of at most
    ``max_bytes`` (cut where the verifier names or the presence of rewards change), spread over up to ``parts``
    frames (one per peer, for round robin); a group alone in its frame (one that fills ``max_bytes`` on its own, the
    last of a run, one with token versions: the BATCH layout has no column for them) or any other kind goes as its
    own plain frame. Nothing waits: it packs what it is given."""
    per = max(1, -(-len(msgs) // max(1, parts)))
    out: list[bytes] = []
    i = 0
    while i < len(msgs):
        cls = type(msgs[i])
        if (cls is not messages.Rollout and cls is not messages.Scored) or _alone(msgs[i]):
            out.append(encode(msgs[i], check=check))
            i += 1
            continue
        j = i + 1
        while j < len(msgs) and type(msgs[j]) is cls and not _alone(msgs[j]):
            j += 1
        out.extend(rollouts.pack_run(msgs[i:j], cls, per, max_bytes, check))   # type: ignore[arg-type]
        i = j
    return out


def _alone(msg: messages.Message) -> bool:
    """A group with token versions (partial rollouts) or episodes (multi-turn) travels in its own group frame."""
    g = getattr(msg, "group", None)
    return g is not None and (g.token_versions is not None or g.policy_spans is not None
                              or g.episode_stats is not None)
