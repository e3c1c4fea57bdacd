"""The binary layout of a rollout group: the payload of ROLLOUT and SCORED frames (the data plane's hot path).

Neighbours: ``rollouts`` hands ROLLOUT/SCORED payloads here (``encode``/``decode``); the other kinds stay msgpack
maps (``payload``). ``types`` holds what comes out: a ``RolloutGroup`` whose completions are
``types.CompletionColumns`` (views of the frame's bytes, no per-completion or per-token objects).

Layout (little-endian; offsets from the frame's first byte, so every f64 section is 8-byte aligned in the frame)::

    0   frame header (frame.HEADER: magic, schema version, kind)                  7 B
    7   reserved, 0                                                                u8
    8   prompt index, policy version, step, generator                               4 x u64, each <= 2^63 - 1
    40  completions n, prompt tokens P, completion tokens T, verifiers V            4 x u32
    56  flags (bit 0: rewards present, bit 1: token versions, bit 2: episodes), M, string bytes S, K    4 x u32
        (M: token-version segments, 0 without flag bit 1; before partial rollouts a reserved 0;
         K: policy spans, 0 without flag bit 2; before multi-turn episodes a reserved 0)
    72  logprobs        f64[T]      completion after completion
        rewards         f64[n]      only with flag bit 0
        scores          f64[V * n]  verifier after verifier, in the order of their names below
        lengths         u32[n]      tokens of each completion (they sum to T)
        string lengths  u32[2 + 2n + V]  UTF-8 bytes of: prompt text, answer, n texts, n finish reasons, V names
        prompt ids      u32[P]
        token ids       u32[T]      completion after completion
        strings         S bytes     the strings above, back to back
        versions        M x (u32 completion, u32 first token, u64 version)   only with flag bit 1
        episodes        n stats, K spans (``wire.episodes``)                   only with flag bit 2

Token versions (partial rollouts, ``types.RolloutGroup.token_versions``): the segments of every completion, completion
after completion; a completion's first segment starts at token 0, its token indices and versions strictly increase,
each index is below the completion's length (0 for an empty one), each version <= the group's policy version, and
every completion has at least one and at most ``MAX_SEGMENTS``. A frame without flag bit 1 (every frame before
partial rollouts) decodes as before, ``token_versions`` None.

The frame is exactly as long as its header says; everything is checked before any array is made: counts against
the bounds of ``frame`` (``MAX_COMPLETIONS``, ``MAX_TOKENS`` per completion and for the prompt, ``MAX_VERIFIERS``),
lengths against the counts, every float finite, strings valid UTF-8 within their character bounds, verifier
names non-empty and distinct, a SCORED group with rewards. The arrays of the decoded group are read-only views of
the frame (zero copy); an all-ASCII string section (the common case) is decoded once and sliced on demand.

Invariant: ``decode(encode(g)) == g``; ``encode`` refuses (``Invalid``) what ``decode`` would refuse, so a sender's
bug is an error at the sender, not a drop at the peer.
"""
from __future__ import annotations

import dataclasses
import itertools
import math
import operator
import struct
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from kubeforge.runtime import types
from kubeforge.runtime.wire import episodes

# frame header (magic, version, kind) + reserved byte + the group's fixed header: one struct, one call each way
HEAD = struct.Struct("<4sHBB4Q8I")
assert HEAD.size == 72
FLAG_REWARDS = 1
FLAG_VERSIONS = 2
FLAG_EPISODES = 4
SEGMENT = struct.Struct("<IIQ")
MAX_SEGMENTS = 256          # version segments per completion (one per weight update while it was sampled)
_F64 = types.LOGPROB_DTYPE
_U32 = types.TOKEN_DTYPE
MAX_U64_FIELD = (1 << 63) - 1
_TOKEN_IDS = operator.attrgetter("token_ids")
_LOGPROBS = operator.attrgetter("logprobs")
_TEXT = operator.attrgetter("text")
_REASON = operator.attrgetter("finish_reason")
_INT = {int}
_DOT_MAX = 4096


class Invalid(ValueError):
    """A group that does not fit the layout; ``wire`` turns it into a ``malformed`` WireError."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Limits:
    """The bounds ``frame`` imposes (passed in: ``frame`` imports this module, not the other way)."""

    completions: int
    tokens: int
    verifiers: int
    text_chars: int
    name_chars: int
    frame_bytes: int


# ---------------------------------------------------------------- encode


def encode(magic: bytes, version: int, kind: int, g: types.RolloutGroup, *, scored: bool, limits: Limits,
           check: bool = True) -> bytes:
    """The whole frame of group ``g``. Raises ``Invalid`` for a group the decoder would refuse (``check``: also
    non-finite floats, which costs one pass over the logprobs)."""
    comps = g.completions
    n = len(comps)
    if not 0 < n <= limits.completions:
        raise Invalid(f"group.completions: {n} completions, expected 1 to {limits.completions}")
    p = g.prompt
    ints = (p.index, g.policy_version, g.step, g.generator)
    if set(map(type, ints)) != _INT or min(ints) < 0 or max(ints) > MAX_U64_FIELD:   # a bool is not an int here
        for name, v in zip(("prompt.index", "policy_version", "step", "generator"), ints):
            if type(v) is not int or not 0 <= v <= MAX_U64_FIELD:
                raise Invalid(f"group.{name}: {v!r} is not an integer in [0, {MAX_U64_FIELD}]")
    prompt_ids = types.token_array(g.prompt_token_ids)
    if len(prompt_ids) > limits.tokens:
        raise Invalid(f"group.prompt_token_ids: {len(prompt_ids)} tokens exceed {limits.tokens}")
    if isinstance(comps, types.CompletionColumns):   # a decoded group going on (the verifier): columns as they are
        lengths = list(comps.lengths)
        id_parts: list[Any] = [comps.token_ids]
        lp_parts: list[Any] = [comps.logprobs]
        texts, reasons = comps.texts, comps.finish_reasons
        total = len(comps.token_ids)
    else:
        id_parts = list(map(_TOKEN_IDS, comps))
        lp_parts = list(map(_LOGPROBS, comps))
        lengths = list(map(len, id_parts))
        if list(map(len, lp_parts)) != lengths:
            i = next(i for i, (a, b) in enumerate(zip(id_parts, lp_parts)) if len(a) != len(b))
            raise Invalid(f"group.completions[{i}]: {len(lp_parts[i])} logprobs for {lengths[i]} token_ids")
        texts = list(map(_TEXT, comps))
        reasons = list(map(_REASON, comps))
        total = sum(lengths)
    if max(lengths) > limits.tokens:
        raise Invalid(f"group.completions: a completion of {max(lengths)} tokens exceeds {limits.tokens}")
    rewards = g.rewards
    if rewards is None and scored:
        raise Invalid("group.rewards: a scored group needs rewards")
    names = list(g.scores)
    if len(names) > limits.verifiers:
        raise Invalid(f"group.scores: {len(names)} verifiers exceed {limits.verifiers}")
    floats: list[Any] = []
    for key, values in ([] if rewards is None else [("rewards", rewards)]) + [(f"scores.{k}", g.scores[k])
                                                                              for k in names]:
        if len(values) != n:
            raise Invalid(f"group.{key}: {len(values)} values for {n} completions")
        floats.extend(values)
    strings = [p.text, p.answer, *texts, *reasons, *names]
    joined = "".join(strings)   # TypeError for a string that is not one
    sizes = list(map(len, strings))
    if names or max(sizes) > min(limits.text_chars, limits.name_chars):   # else every bound holds at once
        _check_strings(sizes, strings, n, limits)
    if joined.isascii():   # O(1) for a compact str: bytes = characters
        blob = joined.encode("ascii")
    else:
        parts = [s.encode("utf-8") for s in strings]   # UnicodeEncodeError (a lone surrogate) is a ValueError
        blob = b"".join(parts)
        sizes = [len(b) for b in parts]
    nf = total + len(floats)
    try:
        segments = b"" if g.token_versions is None else _encode_versions(g.token_versions, lengths,
                                                                             g.policy_version)
        multi = g.policy_spans is not None or g.episode_stats is not None
        section, spans = episodes.encode(g.policy_spans, g.episode_stats, lengths) if multi else (b"", 0)
        flags = ((FLAG_REWARDS if rewards is not None else 0) | (FLAG_VERSIONS if segments else 0)
                 | (FLAG_EPISODES if multi else 0))
        head = HEAD.pack(magic, version, kind, 0, *ints, n, len(prompt_ids), total, len(names),
                         flags, len(segments) // SEGMENT.size, len(blob), spans)
        float_bytes = struct.pack(f"<{len(floats)}d", *floats)
        u32_bytes = struct.pack(f"<{n + len(sizes)}I", *lengths, *sizes)
        frame = b"".join((head, *lp_parts, float_bytes, u32_bytes, prompt_ids.data, *id_parts, blob, segments,
                          section))
    except (struct.error, BufferError) as e:
        raise Invalid(f"group: cannot encode ({e})") from None
    except episodes.Invalid as e:
        raise Invalid(str(e)) from None
    want = (HEAD.size + 8 * nf + 4 * (n + len(sizes) + len(prompt_ids) + total) + len(blob) + len(segments)
            + len(section))
    if len(frame) != want:   # a column of another dtype (the types' constructors prevent it): never send it
        raise Invalid(f"group: columns of {len(frame) - HEAD.size} bytes, the layout wants {want - HEAD.size}")
    if len(frame) > limits.frame_bytes:
        raise Invalid(f"frame of {len(frame)} bytes exceeds {limits.frame_bytes}")
    if check:
        where = _nonfinite(np.frombuffer(frame, _F64, nf, HEAD.size), total, n, rewards is not None, names)
        if where:
            raise Invalid(f"group.{where}: contains a non-finite value")
    return frame


def _encode_versions(versions: Any, lengths: Sequence[int], policy_version: int) -> bytes:
    """The versions section of ``token_versions`` (checked as ``decode`` checks it)."""
    if type(versions) is not tuple or len(versions) != len(lengths):
        raise Invalid(f"group.token_versions: expected a tuple of {len(lengths)} segment tuples")
    rows = [(i, int(k), int(v)) for i, segs in enumerate(versions) for k, v in segs]
    _check_versions(rows, lengths, policy_version)
    return b"".join(SEGMENT.pack(*r) for r in rows)


def _check_versions(rows: Sequence[tuple[int, int, int]], lengths: Sequence[int], policy_version: int) -> None:
    """``rows`` = (completion, first token, version) of every segment, in order (see the module docstring)."""
    n = len(lengths)
    if len(rows) > n * MAX_SEGMENTS:
        raise Invalid(f"group.token_versions: {len(rows)} segments exceed {MAX_SEGMENTS} per completion")
    expect, last_k, last_v = 0, 0, -1
    for c, k, v in rows:
        if c == expect:       # the first segment of the next completion
            if k != 0:
                raise Invalid(f"group.token_versions[{c}]: the first segment starts at token {k}, not 0")
            expect += 1
        elif c != expect - 1 or k <= last_k or v <= last_v:
            raise Invalid(f"group.token_versions[{c}]: segments out of order (completion, token {k}, version {v})")
        if k >= max(lengths[c], 1) or not 0 <= v <= policy_version:
            raise Invalid(f"group.token_versions[{c}]: segment at token {k} of {lengths[c]}, version {v} (the "
                          f"group's policy version is {policy_version})")
        last_k, last_v = k, v
    if expect != n:
        raise Invalid(f"group.token_versions: {expect} of {n} completions have segments")


def _decode_versions(view: memoryview, at: int, m: int, lengths: Sequence[int],
                     policy_version: int) -> tuple[tuple[tuple[int, int], ...], ...]:
    rows = list(SEGMENT.iter_unpack(view[at:at + m * SEGMENT.size]))
    _check_versions(rows, lengths, policy_version)
    out: list[list[tuple[int, int]]] = [[] for _ in lengths]
    for c, k, v in rows:
        out[c].append((k, v))
    return tuple(map(tuple, out))


def _check_strings(chars: list[int], strings: list[str], n: int, limits: Limits) -> None:
    """Character bounds of the strings section (``chars``: their lengths)."""
    if max(chars[:2 + n]) > limits.text_chars:
        raise Invalid(f"group: a text exceeds {limits.text_chars} characters")
    if max(chars[2 + n:2 + 2 * n]) > limits.name_chars:
        raise Invalid(f"group.completions.finish_reason: one exceeds {limits.name_chars} characters")
    for i in range(2 + 2 * n, len(strings)):
        if not 0 < chars[i] <= limits.name_chars:
            raise Invalid(f"group.{_string_name(i, n)}: {chars[i]} characters, expected 1 to {limits.name_chars}")


def _string_name(i: int, n: int) -> str:
    if i < 2:
        return ("prompt.text", "prompt.answer")[i]
    if i < 2 + n:
        return f"completions[{i - 2}].text"
    if i < 2 + 2 * n:
        return f"completions[{i - 2 - n}].finish_reason"
    return f"scores (verifier name {i - 2 - 2 * n})"


def all_finite(f64: np.ndarray[Any, Any]) -> bool:
    """Every value finite. Fast path: the dot product with itself (one BLAS call, ~0.3 us for a small group, against
    ~1.2 us for ``isfinite().all()``) is finite when every value is: a NaN or an infinity makes it NaN or +inf, and a
    sum of squares cannot cancel one. A non-finite dot (or an overflow of huge finite values) is rechecked exactly.
    Small arrays only: above ``_DOT_MAX`` values the BLAS may split the dot over threads, which on a busy machine
    costs milliseconds, while ``isfinite`` costs little beside the group's other work."""
    if len(f64) <= _DOT_MAX and math.isfinite(f64.dot(f64)):
        return True
    return bool(np.isfinite(f64).all())


def _nonfinite(f64: np.ndarray[Any, Any], total: int, n: int, rewards: bool, names: Sequence[str]) -> str:
    """'' when every float is finite, else the field holding the first non-finite one."""
    if all_finite(f64):
        return ""
    bad = int(np.argmin(np.isfinite(f64)))
    if bad < total:
        return "completions.logprobs"
    bad -= total
    if rewards:
        if bad < n:
            return "rewards"
        bad -= n
    return f"scores.{names[bad // n]}"


# ---------------------------------------------------------------- decode


def decode(view: memoryview, *, scored: bool, limits: Limits) -> types.RolloutGroup:
    """The validated group in a whole frame (``view`` starts at the frame header, which ``wire`` has checked);
    ``Invalid`` for anything else."""
    size = len(view)
    if size < HEAD.size:
        raise Invalid(f"group: {size} bytes, shorter than the {HEAD.size}-byte group header")
    (_, _, _, reserved, index, version, step, generator, n, plen, total, nv, flags, reserved2, sbytes,
     spans) = HEAD.unpack_from(view)
    segments = reserved2       # token-version segments (flag bit 1); reserved before partial rollouts
    multi = bool(flags & FLAG_EPISODES)   # spans: policy spans (flag bit 2); reserved before multi-turn episodes
    if reserved or (spans and not multi) or (segments and not flags & FLAG_VERSIONS):
        raise Invalid("group: reserved header fields must be 0")
    if max(index, version, step, generator) > MAX_U64_FIELD:
        raise Invalid(f"group: an integer field (prompt.index {index}, policy_version {version}, step {step}, "
                      f"generator {generator}) exceeds {MAX_U64_FIELD}")
    if not 0 < n <= limits.completions:
        raise Invalid(f"group.completions: {n} completions, expected 1 to {limits.completions}")
    if plen > limits.tokens:
        raise Invalid(f"group.prompt_token_ids: {plen} tokens exceed {limits.tokens}")
    if nv > limits.verifiers:
        raise Invalid(f"group.scores: {nv} verifiers exceed {limits.verifiers}")
    if flags & ~(FLAG_REWARDS | FLAG_VERSIONS | FLAG_EPISODES):
        raise Invalid(f"group: unknown flags {flags:#x}")
    if segments > n * MAX_SEGMENTS or (flags & FLAG_VERSIONS and segments < n):
        raise Invalid(f"group.token_versions: {segments} segments for {n} completions, expected {n} to "
                      f"{n * MAX_SEGMENTS}")
    has_rewards = bool(flags & FLAG_REWARDS)
    if scored and not has_rewards:
        raise Invalid("group.rewards: a scored group needs rewards")
    nf = total + (n if has_rewards else 0) + nv * n
    nstr = 2 + 2 * n + nv
    u32_at = HEAD.size + 8 * nf
    ids_at = u32_at + 4 * (n + nstr)
    str_at = ids_at + 4 * (plen + total)
    episodes_at = str_at + sbytes + SEGMENT.size * segments
    want = episodes_at + (episodes.size(n, spans) if multi else 0)
    if want != size:
        raise Invalid(f"group: frame of {size} bytes, its header says {want}")
    counts = struct.unpack_from(f"<{n + nstr}I", view, u32_at)
    lengths = counts[:n]
    if sum(lengths) != total:
        raise Invalid(f"group.completions.lengths: they sum to {sum(lengths)}, the header says {total} tokens")
    if max(lengths) > limits.tokens:
        raise Invalid(f"group.completions.lengths: a completion of {max(lengths)} tokens exceeds {limits.tokens}")
    sizes = counts[n:]
    if sum(sizes) != sbytes:
        raise Invalid(f"group.strings: lengths sum to {sum(sizes)} bytes, the header says {sbytes}")
    f64 = np.frombuffer(view, _F64, nf, HEAD.size)
    names_at = 2 + 2 * n
    strings_view = view[str_at:str_at + sbytes]
    try:
        blob = str(strings_view, "ascii")   # the common case: one decode, slices made on demand
        ascii_only = True
    except UnicodeDecodeError:
        ascii_only = False
    if ascii_only and max(sizes) > min(limits.text_chars, limits.name_chars):   # else every bound holds at once
        # bytes are characters: the bounds need no string made (names: _check_names below)
        if max(sizes[:2 + n]) > limits.text_chars:
            raise Invalid(f"group: a text exceeds {limits.text_chars} characters")
        if max(sizes[2 + n:names_at]) > limits.name_chars:
            raise Invalid(f"group.completions.finish_reason: one exceeds {limits.name_chars} characters")
    if ascii_only:
        ends = list(itertools.accumulate(sizes))
        texts: Any = _slicer(blob, ends, 2, 2 + n)
        reasons: Any = _slicer(blob, ends, 2 + n, names_at)
        text, answer = blob[:ends[0]], blob[ends[0]:ends[1]]
        names = [blob[ends[i - 1]:ends[i]] for i in range(names_at, nstr)] if nv else []
    else:
        strings = _utf8_strings(strings_view, sizes)
        text, answer = strings[0], strings[1]
        texts, reasons, names = strings[2:2 + n], strings[2 + n:names_at], strings[names_at:]
        _check_chars(text, answer, texts, reasons, limits)
    if nv:
        _check_names(names, limits)
    if not all_finite(f64):
        raise Invalid(f"group.{_nonfinite(f64, total, n, has_rewards, names)}: contains a non-finite value")
    u32 = np.frombuffer(view, _U32, plen + total, ids_at)
    if u32.flags.writeable:   # a bytearray's frame: the views stay read-only like a bytes frame's
        u32.flags.writeable = False
        f64.flags.writeable = False
    cols = types.CompletionColumns(token_ids=u32[plen:], logprobs=f64[:total], lengths=lengths, texts=texts,
                                   finish_reasons=reasons)
    at = total + n if has_rewards else total
    scores = {name: f64[at + j * n:at + (j + 1) * n].tolist() for j, name in enumerate(names)} if nv else {}
    versions = _decode_versions(view, str_at + sbytes, segments, lengths, version) if segments else None
    policy_spans = stats = None
    if multi:
        try:
            policy_spans, stats = episodes.decode(view, episodes_at, spans, lengths)
        except episodes.Invalid as e:
            raise Invalid(str(e)) from None
    return types.RolloutGroup.decoded(
        prompt=types.Prompt.decoded(index, text, answer), prompt_token_ids=u32[:plen], completions=cols,
        policy_version=version, step=step, generator=generator,
        rewards=f64[total:total + n].tolist() if has_rewards else None, scores=scores, token_versions=versions,
        policy_spans=policy_spans, episode_stats=stats)


def _slicer(blob: str, ends: list[int], lo: int, hi: int) -> Callable[[], list[str]]:
    """The strings ``lo``..``hi`` of the section, sliced from ``blob`` when first asked for."""
    return lambda: [blob[ends[i - 1]:ends[i]] for i in range(lo, hi)]


def _utf8_strings(view: memoryview, sizes: Sequence[int]) -> list[str]:
    """Each string decoded on its own (a string is valid UTF-8 on its own, not only the section as a whole)."""
    out, at = [], 0
    for i, k in enumerate(sizes):
        try:
            out.append(str(view[at:at + k], "utf-8"))
        except UnicodeDecodeError:
            raise Invalid(f"group.strings: string {i} is not valid UTF-8") from None
        at += k
    return out


def _check_chars(text: str, answer: str, texts: list[str], reasons: list[str], limits: Limits) -> None:
    """Character bounds of strings decoded one by one (not all ASCII)."""
    if max(map(len, [text, answer, *texts])) > limits.text_chars:
        raise Invalid(f"group: a text exceeds {limits.text_chars} characters")
    if max(map(len, reasons)) > limits.name_chars:
        raise Invalid(f"group.completions.finish_reason: one exceeds {limits.name_chars} characters")


def _check_names(names: list[str], limits: Limits) -> None:
    for name in names:
        if not 0 < len(name) <= limits.name_chars:
            raise Invalid(f"group.scores: verifier name of {len(name)} characters, expected 1 to "
                          f"{limits.name_chars}")
    if len(set(names)) != len(names):
        raise Invalid("group.scores: a verifier name appears twice")
