"""Scoring a group: every configured verifier once (batched), reward = sum of weight x score, with a cache.

Neighbours: the verifier role loop owns one ``Scorer`` for the process and calls ``score_group`` per received
group (then ``apply`` fills ``group.rewards``/``group.scores`` before sending it on as ``wire.Scored``); ``metrics``
reads ``errors`` and the per-verifier scores.

Invariants:
- One call per verifier per group, with only the distinct completions that are not cached; the cache key is a hash of
  (verifier name, prompt text, reference answer, completion text), so a cached score is the score that call would
  have given. The cache is an LRU bounded by ``cache_size`` entries.
- A verifier that raises, returns the wrong number of scores or a non-finite/non-number score gives 0 to every
  completion of that group, is counted in ``errors[name]`` and is not cached; the group is still scored.
"""
from __future__ import annotations

import collections
import hashlib
import math
from typing import Mapping, Sequence

from kubeforge.api import rljob
from kubeforge.runtime import types
from kubeforge.runtime.verifiers import base, registry

DEFAULT_CACHE_SIZE = 65536


class Scorer:
    """The configured verifiers of a job, with their weights, a score cache and error counters."""

    def __init__(self, specs: Sequence[rljob.VerifierSpec], *, cache_size: int = DEFAULT_CACHE_SIZE,
                 verifiers: Mapping[str, base.Verifier] | None = None) -> None:
        if not specs:
            raise ValueError("spec.verifiers: at least one verifier is required")
        self.weights = {s.name: float(s.weight) for s in specs}
        given = dict(verifiers or {})
        self.verifiers = {s.name: given.get(s.name) or registry.build(s) for s in specs}
        self.errors: collections.Counter[str] = collections.Counter()
        self.cache_hits = 0
        self.cache_misses = 0
        self._cache: collections.OrderedDict[bytes, float] = collections.OrderedDict()
        self._cache_size = cache_size

    def score_group(self, group: types.RolloutGroup) -> tuple[list[float], dict[str, list[float]]]:
        """(rewards, scores per verifier name) for every completion of the group, in order."""
        texts = [c.text for c in group.completions]
        scores = {name: self._score_one(name, v, group.prompt, texts) for name, v in self.verifiers.items()}
        rewards = [math.fsum(self.weights[n] * scores[n][i] for n in scores) for i in range(len(texts))]
        return rewards, scores

    def apply(self, group: types.RolloutGroup) -> types.RolloutGroup:
        """Score the group and store rewards and scores on it (returns the same group)."""
        group.rewards, group.scores = self.score_group(group)
        return group

    def _score_one(self, name: str, verifier: base.Verifier, prompt: types.Prompt, texts: list[str]) -> list[float]:
        keys = [_key(name, prompt, t) for t in texts]
        known: dict[bytes, float] = {}
        todo: dict[bytes, str] = {}  # uncached, deduplicated: identical completions are scored once
        for k, t in zip(keys, texts):
            if k in known or k in todo:
                continue
            s = self._cached(k)
            if s is None:
                todo[k] = t
            else:
                known[k] = s
        if todo:
            fresh = self._call(name, verifier, prompt, list(todo.values()))
            if fresh is None:
                return [0.0] * len(texts)
            for k, s in zip(todo, fresh):
                known[k] = s
                self._store(k, s)
        return [known[k] for k in keys]

    def _call(self, name: str, verifier: base.Verifier, prompt: types.Prompt, texts: list[str]) -> list[float] | None:
        try:
            got = list(verifier.score(prompt, texts))
            if len(got) != len(texts):
                raise ValueError(f"{len(got)} scores for {len(texts)} completions")
            vals = [float(s) for s in got]
            if not all(math.isfinite(s) for s in vals):
                raise ValueError("non-finite score")
            return vals
        except Exception:
            self.errors[name] += 1
            return None

    def _cached(self, key: bytes) -> float | None:
        s = self._cache.get(key)
        if s is None:
            self.cache_misses += 1
            return None
        self._cache.move_to_end(key)
        self.cache_hits += 1
        return s

    def _store(self, key: bytes, score: float) -> None:
        if self._cache_size <= 0:
            return
        self._cache[key] = score
        if len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)


def _key(name: str, prompt: types.Prompt, text: str) -> bytes:
    h = hashlib.blake2b(digest_size=16)
    for part in (name, prompt.text, prompt.answer, text):
        b = part.encode("utf-8", "surrogatepass")
        h.update(len(b).to_bytes(8, "little"))
        h.update(b)
    return h.digest()


def score_group(specs: Sequence[rljob.VerifierSpec], group: types.RolloutGroup) -> tuple[list[float],
                                                                                       dict[str, list[float]]]:
    """One-shot scoring (builds the verifiers; a role keeps a ``Scorer`` instead, for the cache)."""
    return Scorer(specs, cache_size=0).score_group(group)
