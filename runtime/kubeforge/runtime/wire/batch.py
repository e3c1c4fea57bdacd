"""The column-wise layout of a BATCH frame: many rollout groups under one header and one set of columns.

Neighbours: ``wire.pack`` hands runs of consecutive ROLLOUT/SCORED messages here (``Run``) and ``wire.decode``
hands BATCH frames here (``decode``); ``group`` is the one-group layout (a group sent alone) and holds the
shared finite check. ``types`` holds what comes out: ``RolloutGroup``s whose completions are
``types.CompletionColumns`` viewing the batch's columns.

Why: a group frame costs some 40 Python steps to encode and as many to validate, whatever its size; for small
groups that dwarfs moving their bytes. Here the checks (bounds, lengths, sums, finite floats, string bounds) run
once per batch over whole columns with numpy, and decoding a group is a handful of slices.

Layout (little-endian; offsets from the frame's first byte; f64 sections stay 8-byte aligned)::

    0   frame header (frame.HEADER: magic, schema version, kind BATCH)               7 B
    7   item kind (ROLLOUT or SCORED: every group of the batch)                    u8
    8   flags (bit 0: rewards present, for every group), groups k, completions N,
        verifiers V, prompt tokens P, completion tokens T, string bytes S, reserved 0     8 x u32
    40  ints            u64[4k]     prompt indexes[k], policy versions[k], steps[k], generators[k]
        logprobs        f64[T]      group after group, completion after completion
        rewards         f64[N]      only with flag bit 0
        scores          f64[V * N]  group after group: each group's V x n block, verifier after verifier
        completions     u32[k]      n of each group (each 1..MAX_COMPLETIONS, they sum to N)
        prompt lengths  u32[k]      tokens of each group's prompt (they sum to P)
        lengths         u32[N]      tokens of each completion (they sum to T)
        string lengths  u32[2k + 2N + V]  UTF-8 bytes of: k prompt texts, k answers, N texts, N finish reasons,
                                    V verifier names (shared by every group: one set of score columns)
        prompt ids      u32[P]
        token ids       u32[T]
        strings         S bytes

The frame is exactly as long as its header says, which bounds every section before any array is made; then, per
batch: k in 1..``max_groups``, N in k..``max_completions`` (so Python objects made per completion stay bounded
by the frame), every count, length and sum checked, every float finite, strings valid UTF-8 one by one within
their character bounds, verifier names non-empty and distinct, a SCORED batch with rewards. One bad field refuses
the whole frame. Decoded arrays are read-only views of the frame; an all-ASCII string section is decoded once.

Invariant: decoding what ``Run.frame`` makes gives back equal groups; ``Run`` refuses (``Invalid``) what decode
would refuse, so a sender's bug is an error at the sender.
"""
from __future__ import annotations

import bisect
import functools
import itertools
import operator
import struct
from collections.abc import Sequence
from typing import Any

import numpy as np

from kubeforge.runtime import types
from kubeforge.runtime.wire import group
from kubeforge.runtime.wire.group import Invalid, Limits

HEAD = struct.Struct("<4sHBB8I")
assert HEAD.size == 40
FLAG_REWARDS = 1
_F64 = types.LOGPROB_DTYPE
_U32 = types.TOKEN_DTYPE
_U64 = np.dtype("<u8")
_GROUP_FIXED = 32 + 4 * 4   # per group: 4 u64 ints, n, prompt length and two string lengths
_COMPLETIONS = operator.attrgetter("completions")
_PROMPT = operator.attrgetter("prompt")
_PROMPT_IDS = operator.attrgetter("prompt_token_ids")
_INT_FIELDS = tuple(map(operator.attrgetter, ("index", "policy_version", "step", "generator")))
_TOKEN_IDS = operator.attrgetter("token_ids")
_LOGPROBS = operator.attrgetter("logprobs")
_TEXT = operator.attrgetter("text")
_ANSWER = operator.attrgetter("answer")
_REASON = operator.attrgetter("finish_reason")
_REWARDS = operator.attrgetter("rewards")
_SCORES = operator.attrgetter("scores")
_DTYPE = operator.attrgetter("dtype")
_NDIM = operator.attrgetter("ndim")
_INT = {int}
_NDARRAY = {np.ndarray}
_ONE = {1}


def _sum5(a: int, b: int, c: int, d: int, e: int) -> int:
    return _GROUP_FIXED + a + b + c + d + e


# ---------------------------------------------------------------- encode


class Run:
    """Consecutive groups gathered column-wise once (their columns, strings and byte sizes), so ``wire.pack`` can
    cut them into batch frames (``frame(a, b)``) without touching a group again. Raises ``Invalid`` (naming the
    field, not the group: ``wire`` re-encodes the groups one by one to name it) for anything decode refuses."""

    def __init__(self, groups: Sequence[types.RolloutGroup], *, scored: bool, limits: Limits) -> None:
        self.groups = groups
        self.limits = limits
        k = len(groups)
        seqs = list(map(_COMPLETIONS, groups))
        ns = list(map(len, seqs))
        if min(ns) < 1 or max(ns) > limits.completions:
            raise Invalid(f"group.completions: expected 1 to {limits.completions} completions")
        prompts = list(map(_PROMPT, groups))
        if types.CompletionColumns in set(map(type, seqs)):
            ids, lps, lengths, texts, reasons, part_ends = _gather_mixed(seqs)
            strings = [*map(_TEXT, prompts), *map(_ANSWER, prompts), *texts, *reasons]
        else:   # the strings section's order: prompt texts, answers, texts, finish reasons (one list, no copies)
            flat = list(itertools.chain.from_iterable(seqs))
            ids = list(map(_TOKEN_IDS, flat))
            lps = list(map(_LOGPROBS, flat))
            lengths = list(map(len, ids))
            if list(map(len, lps)) != lengths:
                raise Invalid("group.completions: logprobs and token_ids of different lengths")
            strings = [*map(_TEXT, prompts), *map(_ANSWER, prompts), *map(_TEXT, flat), *map(_REASON, flat)]
            part_ends = list(itertools.accumulate(ns))
        if max(lengths) > limits.tokens:
            raise Invalid(f"group.completions: a completion exceeds {limits.tokens} tokens")
        self.ints = [list(map(f, prompts if j == 0 else groups)) for j, f in enumerate(_INT_FIELDS)]
        self.every = every = list(itertools.chain.from_iterable(self.ints))
        if set(map(type, every)) != _INT or min(every) < 0 or max(every) > group.MAX_U64_FIELD:
            raise Invalid(f"group: an integer field is not an integer in [0, {group.MAX_U64_FIELD}]")
        pids = list(map(_PROMPT_IDS, groups))
        if (set(map(type, pids)) != _NDARRAY or set(map(_DTYPE, pids)) != {_U32}
                or set(map(_NDIM, pids)) != _ONE):   # the types' constructors make them so: else convert
            pids = list(map(types.token_array, pids))
        self.pids = pids
        self.plens = plens = list(map(len, pids))
        if max(plens) > limits.tokens:
            raise Invalid(f"group.prompt_token_ids: a prompt exceeds {limits.tokens} tokens")
        rewards: list[Any] = list(map(_REWARDS, groups))
        scores: list[dict[str, Any]] = list(map(_SCORES, groups))
        if scored and None in rewards:
            raise Invalid("group.rewards: a scored group needs rewards")
        # what must be equal within one batch frame: rewards or not, and the verifier names
        self.keys: list[tuple[bool, tuple[str, ...]]]
        if rewards.count(None) == k and not any(scores):
            self.keys = [(False, ())] * k
        else:
            self.keys = [(r is not None, tuple(s)) for r, s in zip(rewards, scores)]
        self.rewards, self.scores = rewards, scores
        self.strings = strings
        self.joined = joined = "".join(strings)   # TypeError for a string that is not one
        chars = list(map(len, strings))
        n_all = len(lengths)
        # bounds: no text can exceed text_chars when all of them together do not
        if len(joined) > limits.text_chars and max(chars[:2 * k + n_all]) > limits.text_chars:
            raise Invalid(f"group: a text exceeds {limits.text_chars} characters")
        if max(chars[2 * k + n_all:]) > limits.name_chars:
            raise Invalid(f"group.completions.finish_reason: one exceeds {limits.name_chars} characters")
        self.ascii = joined.isascii()
        self.sizes = sz = chars if self.ascii else [len(s.encode("utf-8")) for s in strings]   # surrogates: ValueError
        self.ns, self.lengths = ns, lengths
        self.ids, self.lps, self.part_ends = ids, lps, [0, *part_ends]
        self.comp_ends = ce = [0, *itertools.accumulate(ns)]
        self.tokens = tokens = sum(lengths)
        v = len(self.keys[0][1])
        self.uniform = len(set(self.keys)) == 1
        # the bytes of the whole run as one frame (uniform keys; the names at most 4 bytes a character)
        self.total = (HEAD.size + 32 * k + 8 * (tokens + n_all * (self.keys[0][0] + v)) + 4 * (
            4 * k + 3 * n_all + v + sum(plens) + tokens) + sum(sz) + sum(4 * len(x) for x in self.keys[0][1]))

    @functools.cached_property
    def tok_ends(self) -> list[int]:
        """Where each completion's tokens end (made only when a run is cut into several frames)."""
        return [0, *itertools.accumulate(self.lengths)]

    def group_bytes(self) -> list[int]:
        """Bytes each group adds to a batch frame (the verifier names are the batch's, counted by ``wire.pack``):
        48 + 4 P + its prompt's strings + per completion 12 + 12 tokens + its strings + 8 (rewards + V)."""
        k, sz, ce, n_all = len(self.ns), self.sizes, self.comp_ends, self.comp_ends[-1]
        at = operator.itemgetter(*ce)
        tg = at(self.tok_ends)
        sg = at([0, *itertools.accumulate(map(operator.add, sz[2 * k:2 * k + n_all], sz[2 * k + n_all:]))])
        per_n = [(12 + 8 * (key[0] + len(key[1]))) * g_n for key, g_n in zip(self.keys, self.ns)]
        return list(map(_sum5, map(operator.mul, map(operator.sub, tg[1:], tg[:-1]), itertools.repeat(12)),
                        per_n, map(operator.mul, self.plens, itertools.repeat(4)),
                        map(operator.add, sz[:k], sz[k:2 * k]), map(operator.sub, sg[1:], sg[:-1])))

    def frame(self, magic: bytes, version: int, kind: int, item_kind: int, a: int, b: int, *,
              max_frame: int, check: bool = True) -> bytes:
        """The batch frame of groups ``a``..``b`` (same key: rewards or not, verifier names)."""
        has_rewards, names = self.keys[a]
        k = b - a
        ca, cb = self.comp_ends[a], self.comp_ends[b]
        pa, pb = self.part_ends[a], self.part_ends[b]
        n = cb - ca
        t = self.tokens if a == 0 and b == len(self.ns) else self.tok_ends[cb] - self.tok_ends[ca]
        ns = self.ns[a:b]
        if len(names) > self.limits.verifiers:
            raise Invalid(f"group.scores: {len(names)} verifiers exceed {self.limits.verifiers}")
        for name in names:
            if type(name) is not str or not 0 < len(name) <= self.limits.name_chars:
                raise Invalid(f"group.scores: verifier name {name!r}, expected 1 to {self.limits.name_chars} "
                              "characters")
        floats: list[Any] = []
        if has_rewards:
            for r, g_n in zip(self.rewards[a:b], ns):
                if len(r) != g_n:
                    raise Invalid(f"group.rewards: {len(r)} values for {g_n} completions")
                floats.extend(r)
        if names:
            for s, g_n in zip(self.scores[a:b], ns):
                for name in names:
                    if len(s[name]) != g_n:
                        raise Invalid(f"group.scores.{name}: {len(s[name])} values for {g_n} completions")
                    floats.extend(s[name])
        K, N = len(self.ns), self.comp_ends[-1]
        sizes = self.sizes
        names_list = list(names)
        name_bytes = [len(x.encode("utf-8")) for x in names_list]
        codec = "ascii" if self.ascii and all(map(str.isascii, names_list)) else "utf-8"
        if a == 0 and b == K:   # the whole run (the common case): its strings and ints as gathered
            blob = (self.joined + "".join(names_list)).encode(codec)
            str_sizes = [*sizes, *name_bytes]
            ints = self.every
        else:
            chosen = [*self.strings[a:b], *self.strings[K + a:K + b], *self.strings[2 * K + ca:2 * K + cb],
                      *self.strings[2 * K + N + ca:2 * K + N + cb], *names_list]
            blob = "".join(chosen).encode(codec)
            str_sizes = [*sizes[a:b], *sizes[K + a:K + b], *sizes[2 * K + ca:2 * K + cb],
                         *sizes[2 * K + N + ca:2 * K + N + cb], *name_bytes]
            ints = [v for col in self.ints for v in col[a:b]]
        p = sum(self.plens[a:b])
        nf = t + len(floats)
        try:
            head = HEAD.pack(magic, version, kind, item_kind, FLAG_REWARDS if has_rewards else 0, k, n, len(names),
                             p, t, len(blob), 0)
            u32 = struct.pack(f"<{2 * k + n + len(str_sizes)}I", *ns, *self.plens[a:b], *self.lengths[ca:cb],
                              *str_sizes)
            frame = b"".join((head, struct.pack(f"<{4 * k}Q", *ints), *self.lps[pa:pb],
                              struct.pack(f"<{len(floats)}d", *floats), u32, *self.pids[a:b], *self.ids[pa:pb], blob))
        except (struct.error, BufferError) as e:
            raise Invalid(f"group: cannot encode ({e})") from None
        want = HEAD.size + 32 * k + 8 * nf + 4 * (2 * k + n + len(str_sizes) + p + t) + len(blob)
        if len(frame) != want:   # a column of another dtype (the types' constructors prevent it): never send it
            raise Invalid(f"group: columns of {len(frame)} bytes, the layout wants {want}")
        if len(frame) > max_frame:
            raise Invalid(f"frame of {len(frame)} bytes exceeds {max_frame}")
        if check and not group.all_finite(np.frombuffer(frame, _F64, nf, HEAD.size + 32 * k)):
            raise Invalid("group: a logprob, reward or score is not finite")
        return frame


def _gather_mixed(seqs: list[Sequence[types.Completion]]) -> tuple[list[Any], list[Any], list[int], list[str],
                                                                  list[str], list[int]]:
    """Columns of groups some of which are decoded (``CompletionColumns``: their columns go on as they are)."""
    ids: list[Any] = []
    lps: list[Any] = []
    lengths: list[int] = []
    texts: list[str] = []
    reasons: list[str] = []
    part_ends: list[int] = []
    for s in seqs:
        if isinstance(s, types.CompletionColumns):
            ids.append(s.token_ids)
            lps.append(s.logprobs)
            lengths.extend(s.lengths)
            texts.extend(s.texts)
            reasons.extend(s.finish_reasons)
        else:
            comps = list(s)
            a, b = list(map(_TOKEN_IDS, comps)), list(map(_LOGPROBS, comps))
            if list(map(len, a)) != list(map(len, b)):
                raise Invalid("group.completions: logprobs and token_ids of different lengths")
            ids.extend(a)
            lps.extend(b)
            lengths.extend(map(len, a))
            texts.extend(map(_TEXT, comps))
            reasons.extend(map(_REASON, comps))
        part_ends.append(len(ids))
    return ids, lps, lengths, texts, reasons, part_ends


# ---------------------------------------------------------------- decode


def decode(view: memoryview, *, limits: Limits, max_groups: int, max_completions: int,
           kinds: dict[int, type], needs_rewards: frozenset[int]) -> list[Any]:
    """The messages of a whole BATCH frame (``view`` starts at the frame header, which ``wire`` has checked): a
    ``kinds[item kind]`` (a frozen dataclass whose one field is ``group``) per group, in order; ``Invalid`` for
    anything else."""
    size = len(view)
    if size < HEAD.size:
        raise Invalid(f"{size} bytes, shorter than the {HEAD.size}-byte batch header")
    _, _, _, item_kind, flags, k, n, nv, p, t, s, reserved = HEAD.unpack_from(view)
    if reserved:
        raise Invalid("reserved header field must be 0")
    make = kinds.get(item_kind)
    if make is None:
        raise Invalid(f"item kind {item_kind} is not ROLLOUT or SCORED")
    if flags & ~FLAG_REWARDS:
        raise Invalid(f"unknown flags {flags:#x}")
    r = flags & FLAG_REWARDS
    if item_kind in needs_rewards and not r:
        raise Invalid("rewards: a batch of scored groups needs rewards")
    if not 0 < k <= max_groups:
        raise Invalid(f"{k} groups, expected 1 to {max_groups}")
    if not k <= n <= min(max_completions, k * limits.completions):
        raise Invalid(f"{n} completions for {k} groups, expected {k} to {min(max_completions, k * limits.completions)}")
    if nv > limits.verifiers:
        raise Invalid(f"scores: {nv} verifiers exceed {limits.verifiers}")
    nf = t + n * r + nv * n
    nstr = 2 * k + 2 * n + nv
    f64_at = HEAD.size + 32 * k
    u32_at = f64_at + 8 * nf
    ids_at = u32_at + 4 * (2 * k + n + nstr)
    str_at = ids_at + 4 * (p + t)
    if str_at + s != size:
        raise Invalid(f"frame of {size} bytes, its header says {str_at + s}")
    # the counts as Python lists: the builtins' min/max/sum over them beat numpy's per-call cost at these sizes, and
    # decoding the groups needs them as lists anyway (bounded: N <= max_completions)
    ints = np.frombuffer(view, _U64, 4 * k, HEAD.size).tolist()
    if max(ints) > group.MAX_U64_FIELD:
        raise Invalid(f"an integer field (prompt.index, policy_version, step, generator) exceeds "
                      f"{group.MAX_U64_FIELD}")
    counts = np.frombuffer(view, _U32, 2 * k + n + nstr, u32_at).tolist()
    ns, plens, lengths, sizes = counts[:k], counts[k:2 * k], counts[2 * k:2 * k + n], counts[2 * k + n:]
    if min(ns) < 1 or max(ns) > limits.completions:
        raise Invalid(f"completions: a group of {min(ns)} to {max(ns)}, expected 1 to {limits.completions}")
    if sum(ns) != n:
        raise Invalid(f"completions: groups of {sum(ns)} completions, the header says {n}")
    if max(plens) > limits.tokens:
        raise Invalid(f"prompt_token_ids: a prompt of {max(plens)} tokens exceeds {limits.tokens}")
    if sum(plens) != p:
        raise Invalid(f"prompt_token_ids: prompts of {sum(plens)} tokens, the header says {p}")
    if max(lengths) > limits.tokens:
        raise Invalid(f"completions.lengths: a completion of {max(lengths)} tokens exceeds {limits.tokens}")
    tok_ends = [0, *itertools.accumulate(lengths)]
    if tok_ends[-1] != t:
        raise Invalid(f"completions.lengths: they sum to {tok_ends[-1]}, the header says {t} tokens")
    ends = [0, *itertools.accumulate(sizes)]
    if ends[-1] != s:
        raise Invalid(f"strings: lengths sum to {ends[-1]} bytes, the header says {s}")
    strings_view = view[str_at:]
    try:
        blob = str(strings_view, "ascii")   # the common case: one decode, slices made on demand
        strings: list[str] | None = None
        if max(sizes[:2 * k + n]) > limits.text_chars:   # bytes are characters
            raise Invalid(f"a text exceeds {limits.text_chars} characters")
        if max(sizes[2 * k + n:2 * k + 2 * n]) > limits.name_chars:
            raise Invalid(f"completions.finish_reason: one exceeds {limits.name_chars} characters")
        names = [blob[ends[i]:ends[i + 1]] for i in range(2 * k + 2 * n, nstr)]
    except UnicodeDecodeError:
        blob = ""
        strings = _utf8_strings(strings_view, ends)
        if max(map(len, strings[:2 * k + n])) > limits.text_chars:
            raise Invalid(f"a text exceeds {limits.text_chars} characters") from None
        if max(map(len, strings[2 * k + n:2 * k + 2 * n])) > limits.name_chars:
            raise Invalid(f"completions.finish_reason: one exceeds {limits.name_chars} characters") from None
        names = strings[2 * k + 2 * n:]
    for name in names:
        if not 0 < len(name) <= limits.name_chars:
            raise Invalid(f"scores: verifier name of {len(name)} characters, expected 1 to {limits.name_chars}")
    if len(set(names)) != len(names):
        raise Invalid("scores: a verifier name appears twice")
    f64 = np.frombuffer(view, _F64, nf, f64_at)
    if not group.all_finite(f64):
        raise Invalid(_nonfinite(f64, t, n, r, names, ns, tok_ends))
    tokens = np.frombuffer(view, _U32, p + t, ids_at)
    if tokens.flags.writeable:   # a bytearray's frame: the views stay read-only like a bytes frame's
        tokens.flags.writeable = False
        f64.flags.writeable = False
    c_lo = [0, *itertools.accumulate(ns)]
    p_lo = [0, *itertools.accumulate(plens)]
    lens = tuple(lengths)
    pids, ids, lps = tokens[:p], tokens[p:], f64[:t]
    rewards = f64[t:t + n].tolist() if r else None
    sc_at = t + n * r   # scores: per group and verifier, made from the frame (a whole-section list would double them)
    nv = len(names)
    out: list[Any] = []
    columns, new = types.CompletionColumns.of_columns, object.__new__
    prompt_cls, group_cls = types.Prompt, types.RolloutGroup
    k2, kn = 2 * k, 2 * k + n
    for i, c0, c1, p0, p1, index, version, step, generator in zip(
            range(k), c_lo, c_lo[1:], p_lo, p_lo[1:], ints[:k], ints[k:k2], ints[k2:3 * k], ints[3 * k:]):
        # per group: slices of the validated columns, nothing checked again
        t0, t1 = tok_ends[c0], tok_ends[c1]
        if strings is None:   # texts and finish reasons sliced from the one decoded string when first asked for
            text, answer = blob[ends[i]:ends[i + 1]], blob[ends[k + i]:ends[k + i + 1]]
            texts: Any = lambda lo=k2 + c0, hi=k2 + c1: [blob[ends[j]:ends[j + 1]] for j in range(lo, hi)]
            reasons: Any = lambda lo=kn + c0, hi=kn + c1: [blob[ends[j]:ends[j + 1]] for j in range(lo, hi)]
        else:
            text, answer = strings[i], strings[k + i]
            texts, reasons = strings[k2 + c0:k2 + c1], strings[kn + c0:kn + c1]
        g_scores: dict[str, list[float]] = {}
        if nv:
            at, g_n = sc_at + nv * c0, c1 - c0
            for j, name in enumerate(names):
                g_scores[name] = f64[at + j * g_n:at + (j + 1) * g_n].tolist()
        pr = new(prompt_cls)   # validated fields: skip the dataclasses' __init__ (as Prompt/RolloutGroup.decoded)
        d = pr.__dict__
        d["index"], d["text"], d["answer"] = index, text, answer
        g = new(group_cls)
        d = g.__dict__
        d["prompt"], d["prompt_token_ids"] = pr, pids[p0:p1]
        d["completions"] = columns(ids[t0:t1], lps[t0:t1], lens[c0:c1], texts, reasons)
        d["policy_version"], d["step"], d["generator"] = version, step, generator
        d["rewards"], d["scores"] = None if rewards is None else rewards[c0:c1], g_scores
        d["token_versions"] = d["policy_spans"] = d["episode_stats"] = None
        m: Any = new(make)
        m.__dict__["group"] = g
        out.append(m)
    return out


def _utf8_strings(view: memoryview, ends: list[int]) -> list[str]:
    """Each string decoded on its own (a string is valid UTF-8 on its own, not only the section as a whole)."""
    out = []
    for i in range(len(ends) - 1):
        try:
            out.append(str(view[ends[i]:ends[i + 1]], "utf-8"))
        except UnicodeDecodeError:
            raise Invalid(f"strings: string {i} is not valid UTF-8") from None
    return out


def _nonfinite(f64: Any, t: int, n: int, r: int, names: list[str], ns: list[int], tok_ends: list[int]) -> str:
    """Where the first non-finite float is: the field and the group."""
    bad = int(np.argmin(np.isfinite(f64)))
    c_ends = list(itertools.accumulate(ns))
    if bad < t:
        field, comp = "completions.logprobs", bisect.bisect_right(tok_ends, bad) - 1
    elif r and bad < t + n:
        field, comp = "rewards", bad - t
    else:
        at = bad - t - n * r
        which = bisect.bisect_right([c * len(names) for c in c_ends], at)
        lo = c_ends[which] - ns[which]
        return f"group {which}: scores.{names[(at - lo * len(names)) // ns[which]]}: contains a non-finite value"
    return f"group {bisect.bisect_right(c_ends, comp)}: {field}: contains a non-finite value"
