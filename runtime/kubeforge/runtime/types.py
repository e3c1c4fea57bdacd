"""Plain data carried between the roles: prompts out, rollout groups back, scores added, then training.

Neighbours: ``wire`` encodes/decodes these (msgpack, versioned); ``generator`` fills ``Completion``s;
``verifiers`` fill ``RolloutGroup.rewards``/``scores``; ``trainer`` consumes scored groups. No torch here.

Token ids and behaviour logprobs are packed numpy arrays, never lists of Python objects: ``token_ids`` and
``prompt_token_ids`` are always 1-D ``uint32`` (``TOKEN_DTYPE``), ``logprobs`` always 1-D ``float64``
(``LOGPROB_DTYPE``). Constructors accept any sequence and convert it (``token_ids=[1, 2]`` works); a decoded
message holds read-only views of the frame's bytes, so a 60 MiB rollout costs about 60 MiB in memory, not one
Python object per token. Equality compares array contents (``==`` between two messages means same data).

Invariants: every completion carries its behaviour logprobs (one per generated token, under the policy version the
group was sampled with), so the trainer can compute clipped importance ratios and bound staleness.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, Union

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


@dataclasses.dataclass(kw_only=True, eq=False)
class RolloutGroup:
    """``groupSize`` completions of one prompt, sampled under one policy version; scored by the verifier."""

    prompt: Prompt
    prompt_token_ids: TokenArray
    completions: list[Completion]
    policy_version: int                      # version of the weights the completions were sampled with
    step: int = 0                            # optimizer step this group was requested for
    generator: int = 0                       # replica index of the generator that sampled it
    rewards: list[float] | None = None       # one per completion, set by the verifier
    scores: dict[str, list[float]] = dataclasses.field(default_factory=dict)  # per verifier name

    def __post_init__(self) -> None:
        self.prompt_token_ids = token_array(self.prompt_token_ids)

    def __eq__(self, other: object) -> bool:
        return type(other) is RolloutGroup and _fields_equal(self, other)

    __hash__ = None  # type: ignore[assignment]
