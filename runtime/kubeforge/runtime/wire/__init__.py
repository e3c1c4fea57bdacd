"""The wire format of the data plane: typed messages, a versioned schema, strict validation. Never pickle.

Modules, one concept each:
- ``messages`` — the message dataclasses (HELLO, READY, ACK, STOP, WORK, ROLLOUT, SCORED, SYNC, BATCH, ENV_CALL,
  ENV_ANSWER), their kinds.
- ``frame``    — the frame header, the schema version, the bounds, ``WireError`` and its reasons.
- ``codec``    — ``encode``, ``decode``, ``pack``: messages to frames and back (the invariants are there).
- ``payload``  — the msgpack map of every kind but the rollout groups, and its typed, bounded reader.
- ``rollouts`` — ROLLOUT, SCORED and BATCH frames, through the two layouts below.
- ``group``    — the fixed binary layout of one rollout group (the hot path).
- ``batch``    — the column-wise layout of many groups in one BATCH frame.
- ``budget``   — prices a large msgpack payload from its headers before decoding.

Neighbours: ``transport`` moves the frames (and decodes every one it receives); the role loops build and consume the
messages; ``types`` holds the plain data the messages carry. This package's face hands on the names its callers use
(``wire.encode``, ``wire.Work``, ``wire.WireError``, ...); its own modules import each other, never the face.
"""
from __future__ import annotations

from kubeforge.runtime.wire.codec import decode, encode, pack
from kubeforge.runtime.wire.frame import (HEADER, MAGIC, MAX_BATCH_COMPLETIONS, MAX_BATCH_GROUPS, MAX_COMPLETIONS,
                                          MAX_FRAME_BYTES, MAX_INT, MAX_NAME_CHARS, MAX_PORT, MAX_PROMPTS,
                                          MAX_TEXT_CHARS, MAX_TOKENS, MAX_VERIFIERS, REASON_FOREIGN, REASON_MALFORMED,
                                          REASON_VERSION, REASONS, SCHEMA_VERSION, UNEXPECTED, WireError)
from kubeforge.runtime.wire.messages import (ALIVE, ENV_OPS, KIND_OF, Ack, Batch, EnvAnswer, EnvCall, EnvReply,
                                             Hello, Kind, Message, Ready, Rollout, Scored, Stop, Sync, Work, kind_of)
from kubeforge.runtime.wire.rollouts import BATCH_BYTES, BATCH_HEAD

__all__ = [
    "BATCH_BYTES", "BATCH_HEAD", "HEADER", "KIND_OF", "MAGIC", "MAX_BATCH_COMPLETIONS", "MAX_BATCH_GROUPS",
    "MAX_COMPLETIONS", "MAX_FRAME_BYTES", "MAX_INT", "MAX_NAME_CHARS", "MAX_PORT", "MAX_PROMPTS", "MAX_TEXT_CHARS",
    "MAX_TOKENS", "MAX_VERIFIERS", "REASONS", "REASON_FOREIGN", "REASON_MALFORMED", "REASON_VERSION",
    "SCHEMA_VERSION", "UNEXPECTED", "ALIVE", "ENV_OPS", "Ack", "Batch", "EnvAnswer", "EnvCall", "EnvReply", "Hello", "Kind", "Message", "Ready", "Rollout", "Scored", "Stop",
    "Sync", "Work", "WireError", "decode", "encode", "kind_of", "pack",
]
