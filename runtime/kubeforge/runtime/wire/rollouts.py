"""ROLLOUT, SCORED and BATCH frames: rollout-group messages in and out of the ``group`` and ``batch`` layouts.

Neighbours: ``codec`` hands every group message here (``encode_group``, ``group_in``) and every run of them that
``pack`` found (``pack_run``), and BATCH frames (``batch_frame``, ``batch_in``); ``group`` is the one-group layout,
``batch`` the column-wise layout of many; ``frame`` has the header fields and the bounds.

Invariant: a group that cannot go in a batch is named by its own precise error (``_culprit`` encodes the run's
groups alone until one fails), so a sender's bug reads the same batched or not.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Union

from kubeforge.runtime.wire import batch, frame, group, messages

BATCH_HEAD = batch.HEAD
BATCH_BYTES = 1 << 20          # pack's bound on a batch frame: a group larger than that alone goes as a plain frame


_BATCH_ITEMS: dict[int, type] = {int(messages.Kind.ROLLOUT): messages.Rollout,
                                 int(messages.Kind.SCORED): messages.Scored}
_NEEDS_REWARDS = frozenset({int(messages.Kind.SCORED)})

GroupMessage = Union[messages.Rollout, messages.Scored]


def encode_group(msg: GroupMessage, *, check: bool = True) -> bytes:
    """The frame of one ROLLOUT or SCORED message, in ``group``'s layout."""
    kind = messages.kind_of(msg)
    try:
        return group.encode(frame.MAGIC, frame.SCHEMA_VERSION, int(kind), msg.group,
                            scored=kind is messages.Kind.SCORED, limits=frame.GROUP_LIMITS, check=check)
    except (TypeError, ValueError, OverflowError) as e:   # group.Invalid is a ValueError
        raise frame.WireError(frame.REASON_MALFORMED, f"{kind.name}: {e}") from None


def _gather(run: Sequence[GroupMessage], cls: type, check: bool) -> batch.Run:
    try:
        return batch.Run([m.group for m in run], scored=cls is messages.Scored, limits=frame.GROUP_LIMITS)
    except (TypeError, ValueError, OverflowError) as e:
        raise _culprit(run, check, e) from None


def _culprit(run: Sequence[GroupMessage], check: bool, e: Exception) -> frame.WireError:
    """The error of the first group that cannot go alone either (its own precise message), else the batch's."""
    for i, m in enumerate(run):
        try:
            encode_group(m, check=check)
        except frame.WireError as err:
            return frame.WireError(frame.REASON_MALFORMED, f"BATCH[{i}]: {err.detail}")
    return frame.WireError(frame.REASON_MALFORMED, f"BATCH: {e}")


def pack_run(run: Sequence[GroupMessage], cls: type, per: int, max_bytes: int, check: bool) -> list[bytes]:
    if len(run) == 1:
        return [encode_group(run[0], check=check)]
    cols = _gather(run, cls, check)
    kind = int(messages.KIND_OF[cls])
    out: list[bytes] = []

    def flush(a: int, b: int) -> None:
        if b - a == 1:
            out.append(encode_group(run[a], check=check))
        elif b > a:
            try:
                out.append(cols.frame(frame.MAGIC, frame.SCHEMA_VERSION, int(messages.Kind.BATCH), kind, a, b,
                                      max_frame=frame.MAX_FRAME_BYTES, check=check))
            except (TypeError, ValueError, OverflowError) as e:
                raise _culprit(run[a:b], check, e) from None

    k = len(run)
    if (cols.uniform and cols.total <= max_bytes and k <= per and k <= frame.MAX_BATCH_GROUPS
            and cols.comp_ends[-1] <= frame.MAX_BATCH_COMPLETIONS):   # the common case: the whole run in one frame
        flush(0, k)
        return out
    a, size, comps = 0, 0, 0
    for i, (nbytes, key, n) in enumerate(zip(cols.group_bytes(), cols.keys, cols.ns)):
        if i > a and (i - a >= per or key != cols.keys[a] or size + nbytes > max_bytes
                      or i - a >= frame.MAX_BATCH_GROUPS or comps + n > frame.MAX_BATCH_COMPLETIONS):
            flush(a, i)
            a, size, comps = i, 0, 0
        if i == a:
            size = BATCH_HEAD.size + sum(4 + 4 * len(name) for name in key[1])   # the names: at most 4 B a character
        size += nbytes
        comps += n
    flush(a, k)
    return out


def batch_frame(msgs: Sequence[messages.Message]) -> bytes:
    k = len(msgs)
    if not 0 < k <= frame.MAX_BATCH_GROUPS:
        raise frame.WireError(frame.REASON_MALFORMED, f"BATCH: {k} items, expected 1 to {frame.MAX_BATCH_GROUPS}")
    cls = type(msgs[0])
    if cls not in (messages.Rollout, messages.Scored) or any(type(m) is not cls for m in msgs):
        raise frame.WireError(frame.REASON_MALFORMED, "BATCH: items must all be ROLLOUT or all SCORED messages")
    run: Sequence[GroupMessage] = msgs   # type: ignore[assignment]
    if any(m.group.token_versions is not None or m.group.policy_spans is not None
           or m.group.episode_stats is not None for m in run):
        raise frame.WireError(frame.REASON_MALFORMED,
                              "BATCH: a group with token_versions or episodes goes in its own frame")
    cols = _gather(run, cls, True)
    if len(set(cols.keys)) != 1:
        raise frame.WireError(frame.REASON_MALFORMED,
                              "BATCH: every group needs the same verifier names, and rewards or none")
    if sum(cols.ns) > frame.MAX_BATCH_COMPLETIONS:
        raise frame.WireError(frame.REASON_MALFORMED,
                              f"BATCH: {sum(cols.ns)} completions exceed {frame.MAX_BATCH_COMPLETIONS}")
    try:
        return cols.frame(frame.MAGIC, frame.SCHEMA_VERSION, int(messages.Kind.BATCH), int(messages.KIND_OF[cls]), 0, k,
                          max_frame=frame.MAX_FRAME_BYTES)
    except (TypeError, ValueError, OverflowError) as e:
        raise _culprit(run, True, e) from None


def group_in(view: memoryview, kind: messages.Kind) -> GroupMessage:
    scored = kind is messages.Kind.SCORED
    try:
        g = group.decode(view, scored=scored, limits=frame.GROUP_LIMITS)
    except group.Invalid as e:
        raise frame.WireError(frame.REASON_MALFORMED, f"{kind.name}: {e}") from None
    return messages.Scored(group=g) if scored else messages.Rollout(group=g)


def batch_in(view: memoryview) -> messages.Batch:
    try:
        msgs = batch.decode(view, limits=frame.GROUP_LIMITS, max_groups=frame.MAX_BATCH_GROUPS,
                            max_completions=frame.MAX_BATCH_COMPLETIONS, kinds=_BATCH_ITEMS,
                            needs_rewards=_NEEDS_REWARDS)
    except group.Invalid as e:
        raise frame.WireError(frame.REASON_MALFORMED, f"BATCH: {e}") from None
    return messages.Batch(messages=tuple(msgs))
