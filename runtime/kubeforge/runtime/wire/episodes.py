"""The episodes section of a group frame (flag bit 2): multi-turn episodes' policy spans and per-episode stats.

Neighbours: ``group`` encodes and decodes the rest of the frame and calls :func:`encode` / :func:`decode` for this
section, which follows the token-versions section; its span count K travels in the group header's last u32 (a
reserved 0 in frames without flag bit 2, so every older frame decodes as before). ``types.RolloutGroup``'s
``policy_spans`` and ``episode_stats`` are what it carries.

Layout (little-endian)::

    stats   n x (u32 turns, u32 tool calls, u32 tool errors, u32 has reward 0/1, f64 environment reward)
    spans   K x (u32 completion, u32 start, u32 end)       completion after completion, in order

Checked (the decoder refuses, the encoder refuses the same): every span non-empty, ``end`` within its completion,
spans of a completion in order and non-overlapping, at most ``MAX_SPANS`` per completion; counts bounded by
``MAX_COUNT``; a reward finite, 0.0 when absent.
"""
from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from typing import Any

from kubeforge.runtime import types

STAT = struct.Struct("<4Id")
SPAN = struct.Struct("<3I")
MAX_SPANS = 256        # policy turns per completion (spec.environment.maxTurns is bounded below this)
MAX_COUNT = 100_000    # turns, tool calls, tool errors per episode


class Invalid(ValueError):
    """Raised as ``group.Invalid`` by ``group`` (this module cannot import it: ``group`` imports this one)."""


def encode(spans: Any, stats: Any, lengths: Sequence[int]) -> tuple[bytes, int]:
    """The section's bytes and its span count (checked as ``decode`` checks them)."""
    n = len(lengths)
    if type(spans) is not tuple or len(spans) != n:
        raise Invalid(f"group.policy_spans: expected a tuple of {n} span tuples")
    if type(stats) is not tuple or len(stats) != n:
        raise Invalid(f"group.episode_stats: expected a tuple of {n} EpisodeStats")
    rows = [(i, int(s), int(e)) for i, per in enumerate(spans) for s, e in per]
    _check_spans(rows, lengths)
    out = [_stat(i, st) for i, st in enumerate(stats)]
    return b"".join(out) + b"".join(SPAN.pack(*r) for r in rows), len(rows)


def _stat(i: int, st: Any) -> bytes:
    if not isinstance(st, types.EpisodeStats):
        raise Invalid(f"group.episode_stats[{i}]: expected EpisodeStats, got {type(st).__name__}")
    counts = (st.turns, st.tool_calls, st.tool_errors)
    if any(type(c) is not int or not 0 <= c <= MAX_COUNT for c in counts):
        raise Invalid(f"group.episode_stats[{i}]: counts {counts} must be integers in [0, {MAX_COUNT}]")
    r = st.env_reward
    if r is not None and not math.isfinite(r):
        raise Invalid(f"group.episode_stats[{i}].env_reward: not finite")
    return STAT.pack(*counts, r is not None, 0.0 if r is None else float(r))


def size(n: int, k: int) -> int:
    """Bytes of the section for ``n`` completions and ``k`` spans."""
    return n * STAT.size + k * SPAN.size


def decode(view: memoryview, at: int, k: int, lengths: Sequence[int]
           ) -> tuple[tuple[types.PolicySpans, ...], tuple[types.EpisodeStats, ...]]:
    n = len(lengths)
    if k > n * MAX_SPANS:
        raise Invalid(f"group.policy_spans: {k} spans exceed {MAX_SPANS} per completion")
    stats = []
    for i, (turns, calls, errors, has, reward) in enumerate(STAT.iter_unpack(view[at:at + n * STAT.size])):
        if max(turns, calls, errors) > MAX_COUNT or has > 1 or not math.isfinite(reward) or (not has and reward):
            raise Invalid(f"group.episode_stats[{i}]: out of bounds")
        stats.append(types.EpisodeStats(turns=turns, tool_calls=calls, tool_errors=errors,
                                        env_reward=reward if has else None))
    at += n * STAT.size
    rows = list(SPAN.iter_unpack(view[at:at + k * SPAN.size]))
    _check_spans(rows, lengths)
    out: list[list[tuple[int, int]]] = [[] for _ in lengths]
    for c, s, e in rows:
        out[c].append((s, e))
    return tuple(map(tuple, out)), tuple(stats)


def _check_spans(rows: Sequence[tuple[int, int, int]], lengths: Sequence[int]) -> None:
    """``rows`` = (completion, start, end) of every span, completion after completion."""
    if len(rows) > len(lengths) * MAX_SPANS:
        raise Invalid(f"group.policy_spans: {len(rows)} spans exceed {MAX_SPANS} per completion")
    last_c, last_end, per = -1, 0, 0
    for c, s, e in rows:
        if not 0 <= c < len(lengths) or c < last_c:
            raise Invalid(f"group.policy_spans: completion {c} out of order")
        if c != last_c:
            last_c, last_end, per = c, 0, 0
        per += 1
        if per > MAX_SPANS:
            raise Invalid(f"group.policy_spans[{c}]: more than {MAX_SPANS} spans")
        if not last_end <= s < e <= lengths[c]:
            raise Invalid(f"group.policy_spans[{c}]: span [{s}, {e}) empty, overlapping or past the completion's "
                          f"{lengths[c]} tokens")
        last_end = e
