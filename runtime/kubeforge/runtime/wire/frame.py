"""One frame of the data plane: the header every frame starts with, the bounds every decoder holds, the one error.

Frame layout (little-endian)::

    +-------+---------+------+-----------------------------+
    | magic | version | kind | payload                     |
    | 4 B   | u16     | u8   | <= MAX_FRAME_BYTES in total  |
    +-------+---------+------+-----------------------------+

Neighbours: ``codec`` writes and checks the header; ``payload`` (msgpack maps), ``group`` (one rollout group) and
``batch`` (many, column-wise) lay out the payload, every one of them within the bounds below; ``transport`` counts
refused frames by ``WireError.reason``.

Invariant: a change to any payload layout bumps ``SCHEMA_VERSION``; peers on another version are refused, never
guessed.
"""
from __future__ import annotations

import struct

from kubeforge.runtime.wire import group

MAGIC = b"KFW\x01"
# 2: SYNC carries the weight-sync group epoch; 3: packed arrays with dtype/shape, columnar groups;
# 4: ROLLOUT/SCORED in group's fixed binary layout; 5: BATCH column-wise (batch)
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
# A BATCH frame holds many groups column-wise (``batch``: one header, one set of columns, checked per batch).
MAX_BATCH_GROUPS = 4096
MAX_BATCH_COMPLETIONS = 1 << 16   # bounds the Python objects decoding one batch makes per completion

GROUP_LIMITS = group.Limits(completions=MAX_COMPLETIONS, tokens=MAX_TOKENS, verifiers=MAX_VERIFIERS,
                            text_chars=MAX_TEXT_CHARS, name_chars=MAX_NAME_CHARS, frame_bytes=MAX_FRAME_BYTES)


class WireError(ValueError):
    """A frame that is not a valid message of our schema. ``reason`` is one of ``REASONS``."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail
