"""Scoring a group: cache lookups, every verifier once (batched, concurrently, time-limited), then aggregation.

Neighbours: the verifier role owns one ``Scorer`` for the process and calls ``apply`` per received group (it fills
``group.rewards``/``group.scores`` before the group goes on as ``wire.Scored``); ``pool`` runs the calls;
``score_cache`` keeps scores; ``aggregate`` turns the score matrix into rewards; the role's observer reads ``errors``,
``fallbacks``, ``cache`` and ``state()`` for metrics.

Invariants:
- One call per verifier per group, with only the distinct completions that are not cached; the cache key is a hash
  of (prompt text, reference answer, completion text) per verifier name, so a cached score is the score that call
  would have given. The cache is an LRU bounded by ``reward.cacheSize`` entries.
- A verifier that raises, overruns ``timeoutSeconds``, or returns the wrong number of scores, a non-number or an
  infinite score has no scores for that group: each of its completions gets ``fallbackScore`` (or abstains when it
  is null); the call is counted in ``errors[name]`` and each completion in ``fallbacks[name]``. A NaN score is the
  verifier saying "no score for this completion" (e.g. a regex that ran out of time): it falls back the same way
  (counted in ``fallbacks`` only). Fallbacks are never cached. The group is always scored.
- ``group.scores`` (sent to the trainer) holds each verifier's score per completion after fallback, with 0.0 for an
  abstention (the wire carries finite floats only); rewards are always finite.
"""
from __future__ import annotations

import collections
import math
from typing import Mapping, Sequence

import numpy as np

from kubeforge.api import rljob
from kubeforge.runtime import types
from kubeforge.runtime.verifiers import aggregate, base, env_reward, pool, registry, score_cache


class Scorer:
    """The configured verifiers of a job, their aggregation, a score cache, and counters."""

    def __init__(self, specs: Sequence[rljob.VerifierSpec], *, reward: rljob.RewardSpec | None = None,
                 cache_size: int | None = None, verifiers: Mapping[str, base.Verifier] | None = None,
                 environment: rljob.EnvironmentSpec | None = None) -> None:
        if not specs:
            raise ValueError("spec.verifiers: at least one verifier is required")
        self.specs = {s.name: s for s in specs}
        self.reward = reward or rljob.RewardSpec()
        self.env_reward = str(environment.reward) if environment is not None else None   # env_reward.MODES
        given = dict(verifiers or {})
        built = {s.name: given.get(s.name) or registry.build(s) for s in specs}
        self.pool = pool.Pool(built, timeouts={s.name: s.timeout_seconds for s in specs},
                              inline={s.name for s in specs if registry.is_inline(s)})
        self.aggregator = aggregate.build(self.reward, specs)
        self.cache = score_cache.ScoreCache(self.reward.cache_size if cache_size is None else cache_size)
        self.errors: collections.Counter[str] = collections.Counter()
        self.fallbacks: collections.Counter[str] = collections.Counter()
        self.timeouts: collections.Counter[str] = collections.Counter()
        self.last_error: dict[str, str] = {}

    @property
    def verifiers(self) -> dict[str, base.Verifier]:
        return self.pool.verifiers

    @property
    def cache_hits(self) -> int:
        return self.cache.hits

    @property
    def cache_misses(self) -> int:
        return self.cache.misses

    def score_matrix(self, group: types.RolloutGroup) -> np.ndarray:
        """``[completions, verifiers]`` scores after fallback (NaN = abstained), verifiers in spec order."""
        texts = types.texts_of(group.completions)   # no Completion objects for a decoded group
        keys = [score_cache.key(group.prompt, t) for t in texts]
        uniq: dict[bytes, str] = dict(zip(keys, texts))     # identical completions are scored once
        ukeys = list(uniq)
        pos = {k: i for i, k in enumerate(ukeys)}
        where = [pos[k] for k in keys]
        names = list(self.specs)
        cached: dict[str, list[float | None]] = {}
        calls: dict[str, tuple[types.Prompt, list[str]]] = {}
        all_texts = list(uniq.values())
        for name in names:
            if self.cache.size > 0:
                got = [self.cache.get(name, k) for k in ukeys]
                cached[name] = got
                miss = [t for t, g in zip(all_texts, got) if g is None]
            else:
                miss = all_texts
            if miss:
                calls[name] = (group.prompt, miss)
        outcomes = self.pool.run(calls)
        out = np.empty((len(texts), len(names)))
        for j, name in enumerate(names):
            o = outcomes.get(name)
            fresh: list[float] = []
            if o is not None:
                if o.scores is None:
                    self.errors[name] += 1
                    self.last_error[name] = o.error or ""
                    if o.timed_out:
                        self.timeouts[name] += 1
                    fresh = [math.nan] * len(calls[name][1])
                else:
                    fresh = o.scores
            have = cached.get(name)
            if have is None:
                uscores = fresh
            else:
                it = iter(fresh)
                uscores = [next(it) if g is None else g for g in have]
                for k, g, sc in zip(ukeys, have, uscores):
                    if g is None and not math.isnan(sc):
                        self.cache.put(name, k, sc)
            col = [uscores[i] for i in where]
            missing = sum(1 for sc in col if sc != sc)      # NaN
            if missing:
                self.fallbacks[name] += missing
                fb = self.specs[name].fallback_score
                if fb is not None:
                    col = [fb if sc != sc else sc for sc in col]
            out[:, j] = col
        return out

    def score_group(self, group: types.RolloutGroup) -> tuple[list[float], dict[str, list[float]]]:
        """(rewards, scores per verifier name) for every completion of the group, in order."""
        m = self.score_matrix(group)
        rewards = self.aggregator.rewards(m, step=group.step)
        wire_scores = np.nan_to_num(m, nan=0.0)
        scores = {name: [float(x) for x in wire_scores[:, j]] for j, name in enumerate(self.specs)}
        return env_reward.combine(self.env_reward, group, [float(r) for r in rewards], scores)

    def apply(self, group: types.RolloutGroup) -> types.RolloutGroup:
        """Score the group and store rewards and scores on it (returns the same group)."""
        group.rewards, group.scores = self.score_group(group)
        return group

    def state(self) -> aggregate.State:
        """Per-verifier estimated accuracy and weight of the aggregation in force."""
        return self.aggregator.state()

    def close(self) -> None:
        self.pool.close()


def score_group(specs: Sequence[rljob.VerifierSpec], group: types.RolloutGroup) -> tuple[list[float],
                                                                                       dict[str, list[float]]]:
    """One-shot scoring (builds the verifiers; a role keeps a ``Scorer`` instead, for the cache)."""
    s = Scorer(specs, cache_size=0)
    try:
        return s.score_group(group)
    finally:
        s.close()
