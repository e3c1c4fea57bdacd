"""Plain data carried between the roles: prompts out, rollout groups back, scores added, then training.

Neighbours: ``wire`` encodes/decodes these (msgpack, versioned); ``generator`` fills ``Completion``s;
``verifiers`` fill ``RolloutGroup.rewards``/``scores``; ``trainer`` consumes scored groups. No torch here.

Token ids and behaviour logprobs are packed numpy arrays, never lists of Python objects: ``token_ids`` and
``prompt_token_ids`` are always 1-D ``uint32`` (``TOKEN_DTYPE``), ``logprobs`` always 1-D ``float64``
(``LOGPROB_DTYPE``). Constructors accept any sequence and convert it (``token_ids=[1, 2]`` works); a decoded
message holds read-only views of the frame's bytes, so a 60 MiB rollout costs about 60 MiB in memory, not one
Python object per token. Equality compares array contents (``==`` between two messages means same data).

A decoded group holds its completions column-wise (``CompletionColumns``: one token-id array, one logprob array,
the lengths, the texts): a ``Sequence[Completion]`` that makes the ``Completion`` objects only when one is asked
for, so a process that only forwards or scores a group (the verifier: ``texts_of``) never makes them.

Invariants: every completion carries its behaviour logprobs (one per generated token, under the policy version the
group was sampled with), so the trainer can compute clipped importance ratios and bound staleness.
"""
from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterator, Sequence
from typing import Any, Union, overload

import numpy as np
import numpy.typing as npt

TOKEN_DTYPE = np.dtype("<u4")
LOGPROB_DTYPE = np.dtype("<f8")

TokenArray = npt.NDArray[np.uint32]
FloatArray = npt.NDArray[np.float64]
Tokens = Union[TokenArray, Sequence[int]]
Floats = Union[FloatArray, Sequence[float]]


def token_array(values: Any) -> TokenArray:
    """``values`` as a 1-D uint32 array (no copy when it already is one); ValueError for ids outside [0, 2^32)."""
    if type(values) is np.ndarray and values.dtype == TOKEN_DTYPE and values.ndim == 1:
        return values
    a = np.asarray(values)
    if a.ndim != 1:
        if a.size == 0:
            return np.empty(0, dtype=TOKEN_DTYPE)
        raise ValueError(f"token ids must be one-dimensional, got shape {a.shape}")
    if a.size and a.dtype != TOKEN_DTYPE:
        if a.dtype.kind not in "iub":
            raise ValueError(f"token ids must be integers, got {a.dtype}")
        if int(a.min()) < 0 or int(a.max()) > 0xFFFF_FFFF:
            raise ValueError("token ids must lie in [0, 2^32)")
    return a.astype(TOKEN_DTYPE, copy=False)


def logprob_array(values: Any) -> FloatArray:
    """``values`` as a 1-D float64 array (no copy when it already is one)."""
    if type(values) is np.ndarray and values.dtype == LOGPROB_DTYPE and values.ndim == 1:
        return values
    a = np.asarray(values, dtype=LOGPROB_DTYPE)
    if a.ndim != 1:
        if a.size == 0:
            return np.empty(0, dtype=LOGPROB_DTYPE)
        raise ValueError(f"logprobs must be one-dimensional, got shape {a.shape}")
    return a


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return bool(np.array_equal(a, b))
    return bool(a == b)


def _fields_equal(a: Any, b: Any) -> bool:
    return all(_same(getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(a))


@dataclasses.dataclass(frozen=True, kw_only=True)
class Prompt:
    """One task item: what the model sees and the reference answer the verifiers compare against."""

    index: int               # position in the job's prompt stream (the data cursor counts these)
    text: str                # the prompt as given to the model (chat template applied by the generator)
    answer: str              # reference answer

    @classmethod
    def decoded(cls, index: int, text: str, answer: str) -> Prompt:
        """A prompt from fields ``wire`` has validated (skips the frozen dataclass's per-field setattr)."""
        p = object.__new__(cls)
        p.__dict__.update(index=index, text=text, answer=answer)
        return p


@dataclasses.dataclass(frozen=True, kw_only=True, eq=False)
class Completion:
    """One sampled completion with its behaviour logprobs (packed arrays, see the module docstring)."""

    token_ids: TokenArray
    logprobs: FloatArray     # behaviour logprob of each token in token_ids
    text: str
    finish_reason: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "token_ids", token_array(self.token_ids))
        object.__setattr__(self, "logprobs", logprob_array(self.logprobs))

    @classmethod
    def of_arrays(cls, token_ids: TokenArray, logprobs: FloatArray, text: str, finish_reason: str) -> Completion:
        """A completion from arrays that already have the right dtype and shape (``wire``'s decoder checked them):
        skips the conversions, which dominate decoding a group of short completions."""
        c = object.__new__(cls)
        c.__dict__.update(token_ids=token_ids, logprobs=logprobs, text=text, finish_reason=finish_reason)
        return c

    def __eq__(self, other: object) -> bool:
        return type(other) is Completion and _fields_equal(self, other)

    __hash__ = None  # type: ignore[assignment]


class CompletionColumns(Sequence[Completion]):
    """A group's completions held column-wise, as ``wire`` decodes them: ``token_ids`` and ``logprobs`` are the
    group's concatenated columns (completion after completion, ``lengths`` tokens each), ``texts`` and
    ``finish_reasons`` one string per completion. Indexing or iterating makes the ``Completion`` objects (views of
    the columns) once and keeps them; ``texts`` and the columns never need them. Immutable; compares equal to any
    sequence of equal completions. The caller guarantees consistent columns (``wire`` validated them)."""

    __slots__ = ("token_ids", "logprobs", "lengths", "_texts", "_reasons", "_items")

    def __init__(self, *, token_ids: TokenArray, logprobs: FloatArray, lengths: Sequence[int],
                 texts: Sequence[str] | Any, finish_reasons: Sequence[str] | Any) -> None:
        self.token_ids = token_ids
        self.logprobs = logprobs
        self.lengths = tuple(lengths)
        # a list, or a zero-argument callable that makes it on first use (wire: slices of one decoded string)
        self._texts = texts
        self._reasons = finish_reasons
        self._items: list[Completion] | None = None

    @classmethod
    def of_columns(cls, token_ids: TokenArray, logprobs: FloatArray, lengths: tuple[int, ...], texts: Any,
                   finish_reasons: Any) -> CompletionColumns:
        """Columns ``wire`` has validated (``lengths`` already a tuple): skips the keyword call (decoding a batch
        makes one per group)."""
        c = object.__new__(cls)
        c.token_ids, c.logprobs, c.lengths, c._texts, c._reasons, c._items = (token_ids, logprobs, lengths, texts,
                                                                              finish_reasons, None)
        return c

    @property
    def texts(self) -> list[str]:
        if callable(self._texts):
            self._texts = self._texts()
        return list(self._texts) if type(self._texts) is not list else self._texts

    @property
    def finish_reasons(self) -> list[str]:
        if callable(self._reasons):
            self._reasons = self._reasons()
        return list(self._reasons) if type(self._reasons) is not list else self._reasons

    def _completions(self) -> list[Completion]:
        if self._items is None:
            ids, lps, make = self.token_ids, self.logprobs, Completion.of_arrays
            ends = itertools.accumulate(self.lengths)
            self._items = [make(ids[e - k:e], lps[e - k:e], t, r)
                           for k, e, t, r in zip(self.lengths, ends, self.texts, self.finish_reasons)]
        return self._items

    def __len__(self) -> int:
        return len(self.lengths)

    @overload
    def __getitem__(self, i: int) -> Completion: ...

    @overload
    def __getitem__(self, i: slice) -> list[Completion]: ...

    def __getitem__(self, i: int | slice) -> Completion | list[Completion]:
        return self._completions()[i]

    def __iter__(self) -> Iterator[Completion]:
        return iter(self._completions())

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or len(other) != len(self):
            return False
        return all(a == b for a, b in zip(self, other))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"CompletionColumns({len(self)} completions, {len(self.token_ids)} tokens)"


def texts_of(completions: Sequence[Completion]) -> list[str]:
    """The completions' texts, without making ``Completion`` objects of a decoded group."""
    if isinstance(completions, CompletionColumns):
        return completions.texts
    return [c.text for c in completions]


VersionSegments = tuple[tuple[int, int], ...]
"""One completion's policy versions: ``((0, v0), (k1, v1), ...)``, tokens ``[0, k1)`` sampled under ``v0``, from
``k1`` on under ``v1``, ...; indices and versions strictly increasing, the last version <= the group's
``policy_version`` (a completion that finished before a sync ends on an older one). A weight update is rare next to
a token, so a handful of pairs per completion stands for thousands of per-token stamps (``token_versions`` expands
them)."""


PolicySpans = tuple[tuple[int, int], ...]
"""One completion's policy tokens: half-open ``[start, end)`` ranges, in order, non-empty, non-overlapping, within
the completion; the tokens outside every span are environment tokens (observations, tool results)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class EpisodeStats:
    """What one multi-turn episode did: its policy turns, tool calls and failed tool calls, and the environment's
    reward (None when the environment gave none)."""

    turns: int
    tool_calls: int = 0
    tool_errors: int = 0
    env_reward: float | None = None


def policy_mask(group: RolloutGroup, i: int) -> npt.NDArray[np.uint8] | None:
    """1 on the policy tokens of completion ``i`` of ``group``, 0 on environment tokens; None: all policy tokens."""
    if group.policy_spans is None:
        return None
    out = np.zeros(len(group.completions[i].token_ids), dtype=np.uint8)
    for start, end in group.policy_spans[i]:
        out[start:end] = 1
    return out


def token_versions(group: RolloutGroup, i: int) -> npt.NDArray[np.int64]:
    """The policy version of every token of completion ``i`` of ``group`` (one int per token)."""
    n = len(group.completions[i].token_ids)
    out = np.full(n, group.policy_version, dtype=np.int64)
    if group.token_versions is not None:
        for start, version in group.token_versions[i]:
            out[start:] = version
    return out


@dataclasses.dataclass(kw_only=True, eq=False)
class RolloutGroup:
    """``groupSize`` completions of one prompt, sampled under one policy version; scored by the verifier."""

    prompt: Prompt
    prompt_token_ids: TokenArray
    completions: Sequence[Completion]        # a list, or CompletionColumns as decoded from the wire
    policy_version: int                      # version of the weights the completions were sampled with
    step: int = 0                            # optimizer step this group was requested for
    generator: int = 0                       # replica index of the generator that sampled it
    rewards: list[float] | None = None       # one per completion, set by the verifier
    scores: dict[str, list[float]] = dataclasses.field(default_factory=dict)  # per verifier name
    # partial rollouts (spec.algorithm.partialRollouts): per completion, the versions its tokens were sampled under
    # as (first token index, version) segments; None: every token under ``policy_version`` (see ``VersionSegments``)
    token_versions: tuple[VersionSegments, ...] | None = None
    # multi-turn episodes (spec.environment): per completion, the half-open [start, end) ranges of its tokens the
    # policy sampled (the rest are environment tokens: in context, masked out of the loss); None: every token is a
    # policy token (single turn). ``episode_stats``: one ``EpisodeStats`` per completion, or None.
    policy_spans: tuple[PolicySpans, ...] | None = None
    episode_stats: tuple[EpisodeStats, ...] | None = None

    def __post_init__(self) -> None:
        self.prompt_token_ids = token_array(self.prompt_token_ids)

    @classmethod
    def decoded(cls, **fields: Any) -> RolloutGroup:
        """A group from fields ``wire`` has validated and typed (every field given): skips the conversions."""
        g = object.__new__(cls)
        g.__dict__.update(fields)
        return g

    def __eq__(self, other: object) -> bool:
        return type(other) is RolloutGroup and _fields_equal(self, other)

    __hash__ = None  # type: ignore[assignment]


@dataclasses.dataclass(frozen=True, kw_only=True)
class SyncResult:
    """What one weight load cost: a generator's receive-and-load (its ACK carries it back), the slowest one's as
    trainer 0's push reports it."""

    seconds: float
    bytes: int
